package route

import (
	"testing"

	"github.com/sluicegw/sluice/policy"
)

func TestConditionOf(t *testing.T) {
	contracts := []Contract{{Status: 400, Code: "unknown_parameter"}, {Code: "model_not_found"}, {Status: 422}}
	for _, tc := range []struct {
		class  string
		status int
		code   string
		want   string
	}{
		{"", 200, "", ""},
		{ClassConnect, 0, "", policy.CondConnect},
		{ClassEmptyResponse, 502, "", policy.CondConnect},
		{ClassTTFTTimeout, 504, "", policy.CondTTFTTimeout},
		{ClassNoEndpoint, 503, "", policy.CondNoEndpoint},
		{ClassUpstream5xx, 503, "", policy.Cond5xx},
		{ClassUpstream429, 429, "", policy.Cond429},
		{ClassUpstream4xx, 400, "", ""},
		{ClassStreamCut, 502, "", policy.CondStreamCut},
		{ClassIdleTimeout, 504, "", policy.CondStreamCut},
		{ClassClientCancel, 499, "", ""},
		{ClassTimeout, 504, "", ""},
		{policy.CondBreakerOpen, 503, "", policy.CondBreakerOpen},
		{policy.CondOverload, 503, "", policy.CondOverload},
		{"", 503, "", policy.Cond5xx},
		{"", 429, "", policy.Cond429},
		// Contract mismatches, whatever the class.
		{ClassUpstream4xx, 400, "unknown_parameter", policy.CondContract},
		{ClassUpstream4xx, 400, "other", ""},
		{ClassUpstream4xx, 404, "model_not_found", policy.CondContract},
		{ClassUpstream4xx, 422, "anything", policy.CondContract},
		{"", 200, "model_not_found", ""}, // a success is never a mismatch
	} {
		if got := ConditionOf(tc.class, tc.status, tc.code, contracts); got != tc.want {
			t.Errorf("ConditionOf(%q, %d, %q) = %q, want %q", tc.class, tc.status, tc.code, got, tc.want)
		}
	}
}

func TestMoves(t *testing.T) {
	def := policy.Candidate{Cluster: "a"}
	for _, c := range policy.DefaultOn {
		if !Moves(def, c) {
			t.Errorf("default On does not move on %q", c)
		}
	}
	for _, c := range []string{policy.CondStreamCut, ""} {
		if Moves(def, c) {
			t.Errorf("default On moves on %q", c)
		}
	}
	custom := policy.Candidate{Cluster: "a", On: []string{policy.Cond5xx}}
	if !Moves(custom, policy.Cond5xx) || Moves(custom, policy.CondConnect) {
		t.Error("custom On")
	}
	none := policy.Candidate{Cluster: "a", On: []string{}}
	if Moves(none, policy.Cond5xx) {
		t.Error("an empty non-nil On moves on nothing")
	}
}
