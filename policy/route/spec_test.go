package route

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/policy"
)

// routeCfg embeds Spec as config.Route does.
type routeCfg struct {
	Name    string `yaml:"name" json:"name"`
	Cluster string `yaml:"cluster" json:"cluster"`
	Spec    `yaml:",inline"`
}

const routeYAML = `
name: chat
cluster: llama-primary
splits:
  - {cluster: llama-primary, weight: 95}
  - {cluster: llama-candidate, weight: 5, gray_flag: v2, model: llama-3-70b-v2}
  - {name: primary-8b, cluster: llama-primary, weight: 0, model: llama-3-8b}
sticky: [header:X-Session-ID, body:user]
gray_flag_header: x-canary
fallback:
  - cluster: small-fallback
    model: llama-3-8b
    on: [5xx, 429, ttft_timeout, breaker_open]
    timeouts: {ttft: 200ms, idle: 1.5, total: 1m}
retry: {attempts: 2, per_try_timeout: 5s, backoff_base: 10ms, backoff_max: 1s, budget: 0.1, min_retries_per_second: 0, honor_retry_after: false, max_retry_after: 3s}
breaker: {window: 30s, buckets: 6, min_requests: 50, failure_ratio: 0.25, open_for: 10s, half_open_probes: 5}
resume: true
contract_mismatch: [{status: 400, code: unknown_parameter}, {code: model_not_found}]
`

func wantSpec() Spec {
	no := false
	return Spec{
		Splits: []Split{
			{Cluster: "llama-primary", Weight: 95},
			{Cluster: "llama-candidate", Weight: 5, GrayFlag: "v2", Model: "llama-3-70b-v2"},
			{Name: "primary-8b", Cluster: "llama-primary", Model: "llama-3-8b"},
		},
		Sticky:         []string{"header:X-Session-ID", "body:user"},
		GrayFlagHeader: "x-canary",
		Fallback: []Step{{
			Cluster: "small-fallback", Model: "llama-3-8b",
			On:       []string{"5xx", "429", "ttft_timeout", "breaker_open"},
			Timeouts: StepTimeouts{TTFT: Duration(200 * time.Millisecond), Idle: Duration(1500 * time.Millisecond), Total: Duration(time.Minute)},
		}},
		Retry: Retry{
			Attempts: 2, PerTryTimeout: Duration(5 * time.Second), BackoffBase: Duration(10 * time.Millisecond),
			BackoffMax: Duration(time.Second), Budget: f64(0.1), MinRetriesPerSecond: f64(0),
			HonorRetryAfter: &no, MaxRetryAfter: Duration(3 * time.Second),
		},
		Breaker: Breaker{
			Window: Duration(30 * time.Second), Buckets: 6, MinRequests: 50, FailureRatio: 0.25,
			OpenFor: Duration(10 * time.Second), HalfOpenProbes: 5,
		},
		Resume:           true,
		ContractMismatch: []Contract{{Status: 400, Code: "unknown_parameter"}, {Code: "model_not_found"}},
	}
}

func TestDecodeYAML(t *testing.T) {
	var rc routeCfg
	dec := yaml.NewDecoder(strings.NewReader(routeYAML))
	dec.KnownFields(true)
	if err := dec.Decode(&rc); err != nil {
		t.Fatal(err)
	}
	if rc.Name != "chat" || rc.Cluster != "llama-primary" {
		t.Errorf("route keys: %+v", rc)
	}
	if !reflect.DeepEqual(rc.Spec, wantSpec()) {
		t.Errorf("decoded\n%+v\nwant\n%+v", rc.Spec, wantSpec())
	}
	if err := rc.Spec.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if _, err := New(rc.Spec, rc.Cluster, "", nil); err != nil {
		t.Errorf("New: %v", err)
	}
}

func TestDecodeJSONRoundTrip(t *testing.T) {
	// JSON as xDS or the admin API would give it, numbers of seconds included.
	in := `{"name":"chat","cluster":"llama-primary",
	  "splits":[{"cluster":"llama-primary","weight":95},{"cluster":"llama-candidate","weight":5,"gray_flag":"v2","model":"llama-3-70b-v2"},{"name":"primary-8b","cluster":"llama-primary","weight":0,"model":"llama-3-8b"}],
	  "sticky":["header:X-Session-ID","body:user"],"gray_flag_header":"x-canary",
	  "fallback":[{"cluster":"small-fallback","model":"llama-3-8b","on":["5xx","429","ttft_timeout","breaker_open"],"timeouts":{"ttft":"200ms","idle":1.5,"total":"1m"}}],
	  "retry":{"attempts":2,"per_try_timeout":"5s","backoff_base":"10ms","backoff_max":1,"budget":0.1,"min_retries_per_second":0,"honor_retry_after":false,"max_retry_after":"3s"},
	  "breaker":{"window":"30s","buckets":6,"min_requests":50,"failure_ratio":0.25,"open_for":"10s","half_open_probes":5},
	  "resume":true,"contract_mismatch":[{"status":400,"code":"unknown_parameter"},{"code":"model_not_found"}]}`
	var rc routeCfg
	dec := json.NewDecoder(strings.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rc); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rc.Spec, wantSpec()) {
		t.Errorf("decoded\n%+v\nwant\n%+v", rc.Spec, wantSpec())
	}
	// Marshal and decode again: the same Spec.
	b, err := json.Marshal(rc)
	if err != nil {
		t.Fatal(err)
	}
	var again routeCfg
	if err := json.Unmarshal(b, &again); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	if !reflect.DeepEqual(again.Spec, wantSpec()) {
		t.Errorf("round trip\n%+v\nwant\n%+v\n%s", again.Spec, wantSpec(), b)
	}
	// And YAML marshalling reads back too.
	y, err := yaml.Marshal(rc)
	if err != nil {
		t.Fatal(err)
	}
	var fromYAML routeCfg
	if err := yaml.Unmarshal(y, &fromYAML); err != nil {
		t.Fatalf("%v in\n%s", err, y)
	}
	if !reflect.DeepEqual(fromYAML.Spec, wantSpec()) {
		t.Errorf("YAML round trip\n%+v\n%s", fromYAML.Spec, y)
	}
}

func TestDurationErrors(t *testing.T) {
	for _, in := range []string{`"soon"`, `true`, `"NaN"`, `1e300`} {
		var d Duration
		if err := json.Unmarshal([]byte(in), &d); err == nil {
			t.Errorf("JSON %s: accepted as %v", in, d.D())
		}
	}
	var s struct {
		D Duration `yaml:"d"`
	}
	if err := yaml.Unmarshal([]byte("d: [1s]"), &s); err == nil {
		t.Error("YAML sequence accepted as a duration")
	}
	if err := yaml.Unmarshal([]byte("d: soon"), &s); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("YAML bad duration: %v", err)
	}
	if err := yaml.Unmarshal([]byte("d: 0.25"), &s); err != nil || s.D.D() != 250*time.Millisecond {
		t.Errorf("YAML 0.25: %v %v", s.D.D(), err)
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	neg := Duration(-time.Second)
	s := Spec{
		Splits: []Split{
			{Cluster: "a", Weight: -1},
			{Cluster: "", Weight: 0},
			{Cluster: "a", Weight: 0, GrayFlag: "x"},
			{Cluster: "b", GrayFlag: "x"},
		},
		Sticky:         []string{"cookie:sid", "header:", "key"},
		GrayFlagHeader: "x gray",
		Fallback: []Step{
			{Cluster: "", On: []string{"5xx", "eventually"}},
			{Cluster: "c", Timeouts: StepTimeouts{TTFT: neg, Idle: neg, Total: neg}},
		},
		Retry: Retry{
			Attempts: -1, PerTryTimeout: neg, BackoffBase: Duration(time.Second), BackoffMax: Duration(time.Millisecond),
			Budget: f64(1.5), MinRetriesPerSecond: f64(-1), MaxRetryAfter: neg,
		},
		Breaker: Breaker{
			Window: neg, Buckets: -1, MinRequests: -2, FailureRatio: 2, OpenFor: neg, HalfOpenProbes: -3,
		},
		ContractMismatch: []Contract{{}, {Status: 200}},
	}
	err := s.Validate()
	var p Problems
	if !errors.As(err, &p) {
		t.Fatalf("Validate = %v, want Problems", err)
	}
	want := []string{
		"splits[0].weight: -1 is negative",
		"splits[1].cluster: required",
		`splits[2].name: "a" is also splits[0]'s name`,
		`splits[3].gray_flag: "x" is also splits[2]'s gray flag`,
		`sticky[0]: unknown source "cookie:sid"`,
		`sticky[1]: "header:": "" is not a valid header name`,
		`gray_flag_header: "x gray" is not a valid header name`,
		"fallback[0].cluster: required",
		`fallback[0].on[1]: unknown condition "eventually"`,
		"fallback[1].timeouts.ttft: -1s is negative",
		"fallback[1].timeouts.idle: -1s is negative",
		"fallback[1].timeouts.total: -1s is negative",
		"retry.attempts: -1 is out of range",
		"retry.per_try_timeout: -1s is negative",
		"retry.max_retry_after: -1s is negative",
		"retry.backoff_max: 1ms is below backoff_base 1s",
		"retry.budget: 1.5 is out of range [0, 1]",
		"retry.min_retries_per_second: -1 is negative",
		"breaker.window: -1s is negative",
		"breaker.open_for: -1s is negative",
		"breaker.buckets: -1 is negative",
		"breaker.min_requests: -2 is negative",
		"breaker.failure_ratio: 2 is out of range",
		"breaker.half_open_probes: -3 is negative",
		"contract_mismatch[0]: give a status, a code or both",
		"contract_mismatch[1].status: 200 is not an error status",
	}
	for _, w := range want {
		if !slices.ContainsFunc(p, func(s string) bool { return strings.HasPrefix(s, w) }) {
			t.Errorf("missing problem %q", w)
		}
	}
	if len(p) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(p), len(want), err)
	}
	if !strings.Contains(err.Error(), "26 problems") {
		t.Errorf("error text: %s", err)
	}
	// New refuses it with the same list.
	if _, err := New(s, "a", "", nil); !errors.As(err, &p) {
		t.Errorf("New accepted an invalid spec: %v", err)
	}
}

func TestValidateSmallCases(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		want string // "" : valid
	}{
		{"empty", Spec{}, ""},
		{"all zero weights", Spec{Splits: []Split{{Cluster: "a"}, {Cluster: "b"}}}, "splits: no split has a weight > 0 or a gray flag"},
		{"gray only", Spec{Splits: []Split{{Cluster: "a", GrayFlag: "v2"}}}, ""},
		{"two splits of a cluster with names", Spec{Splits: []Split{{Cluster: "a", Weight: 1}, {Name: "a-8b", Cluster: "a", Weight: 1}}}, ""},
		{"sticky none mixed", Spec{Sticky: []string{"none", "key"}}, `sticky: "none" cannot be combined`},
		{"every condition", Spec{Fallback: []Step{{Cluster: "b", On: Conditions}}}, ""},
		{"attempts too many", Spec{Retry: Retry{Attempts: 11}}, "retry.attempts: 11 is out of range [1, 10]"},
		{"budget NaN", Spec{Retry: Retry{Budget: f64(nan())}}, "retry.budget"},
		{"budget 0 ok", Spec{Retry: Retry{Budget: f64(0)}}, ""},
		{"backoff max defaults above base", Spec{Retry: Retry{BackoffBase: Duration(time.Second)}}, ""},
		{"tiny buckets", Spec{Breaker: Breaker{Window: Duration(time.Millisecond), Buckets: 10}}, "breaker.buckets: 10 buckets of a 1ms window"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

func nan() float64 { var z float64; return z / z }

func TestConditionsKnowEveryCond(t *testing.T) {
	for _, c := range policy.DefaultOn {
		if !slices.Contains(Conditions, c) {
			t.Errorf("DefaultOn's %q is not in Conditions", c)
		}
	}
	if !slices.Contains(Conditions, policy.CondContract) || !slices.Contains(Conditions, policy.CondStreamCut) {
		t.Error("Conditions lacks contract or stream_cut")
	}
}

func TestSpecClusters(t *testing.T) {
	s := wantSpec()
	if got := s.Clusters(); !slices.Equal(got, []string{"llama-primary", "llama-candidate", "small-fallback"}) {
		t.Errorf("Clusters() = %v", got)
	}
}
