package route

import (
	"testing"

	"github.com/sluicegw/sluice/policy"
)

func TestConditionOf(t *testing.T) {
	contracts := []Contract{{Status: 400, Code: "unknown_parameter"}, {Code: "model_not_found"}, {Status: 422}}
	for _, tc := range []struct {
		class  policy.Class
		status int
		code   string
		want   string
	}{
		{"", 200, "", ""},
		{policy.ClassConnect, 0, "", policy.CondConnect},
		{policy.ClassEmptyResponse, 502, "", policy.CondConnect},
		{policy.ClassTTFTTimeout, 504, "", policy.CondTTFTTimeout},
		{policy.ClassNoEndpoint, 503, "", policy.CondNoEndpoint},
		{policy.ClassUpstream5xx, 503, "", policy.Cond5xx},
		{policy.ClassUpstream429, 429, "", policy.Cond429},
		{policy.ClassUpstream4xx, 400, "", ""},
		{policy.ClassStreamCut, 502, "", policy.CondStreamCut},
		{policy.ClassIdleTimeout, 504, "", policy.CondStreamCut},
		{policy.ClassClientCancel, 499, "", ""},
		{policy.ClassTimeout, 504, "", ""},
		{policy.CondBreakerOpen, 503, "", policy.CondBreakerOpen},
		{policy.CondOverload, 503, "", policy.CondOverload},
		{"", 503, "", policy.Cond5xx},
		{"", 429, "", policy.Cond429},
		// Contract mismatches, whatever the class.
		{policy.ClassUpstream4xx, 400, "unknown_parameter", policy.CondContract},
		{policy.ClassUpstream4xx, 400, "other", ""},
		{policy.ClassUpstream4xx, 404, "model_not_found", policy.CondContract},
		{policy.ClassUpstream4xx, 422, "anything", policy.CondContract},
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
