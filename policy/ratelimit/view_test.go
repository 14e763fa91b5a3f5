package ratelimit

import (
	"encoding/json"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/metricstest"
)

// The limiter offers the gateway its admin view and its metrics.
var (
	_ policy.Viewer          = (*Limiter)(nil)
	_ policy.MetricsReporter = (*Limiter)(nil)
)

// TestViewAndMetrics: the limiter's view is its counters and its keys' buckets, encoded as
// GET /admin/ratelimits shows them ({"stats", "keys"}); its metrics carry every rejection
// reason (0 included) and the global service's failures.
func TestViewAndMetrics(t *testing.T) {
	l := newLimiter(t, Params{RequestsPerMinute: 1}, newClock())
	if d := admit(t, l, chat("a", "chat", 10, 10)); d.Reject != nil {
		t.Fatalf("first request rejected: %v", d.Reject)
	}
	if d := admit(t, l, chat("a", "chat", 10, 10)); d.Reject == nil {
		t.Fatal("second request admitted, want a rejection")
	}

	m := metricstest.Collect(t, l)
	want := map[string]float64{"sluice_ratelimit_global_failures_total": 0}
	for _, r := range reasons {
		want[metricstest.Key("sluice_ratelimit_rejections_total", [2]string{"reason", r})] = 0
	}
	want[metricstest.Key("sluice_ratelimit_rejections_total", [2]string{"reason", ReasonRequests})] = 1
	metricstest.Expect(t, m, want)

	v, ok := l.AdminView().(View)
	if !ok || v.Stats.Admitted != 1 || v.Stats.Rejected[ReasonRequests] != 1 || len(v.Keys) != 1 || v.Keys[0].Key != "a" {
		t.Fatalf("AdminView = %#v", l.AdminView())
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil || len(fields) != 2 || fields["stats"] == nil || fields["keys"] == nil {
		t.Errorf("the view encodes as %s, want {\"stats\", \"keys\"}", b)
	}
}
