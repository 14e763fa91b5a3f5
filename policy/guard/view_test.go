package guard

import (
	"encoding/json"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/metricstest"
)

// The guard offers the gateway its admin view, its metrics and a tenant reset.
var (
	_ policy.Viewer          = (*Guard)(nil)
	_ policy.MetricsReporter = (*Guard)(nil)
	_ policy.Resetter        = (*Guard)(nil)
)

// TestViewMetricsAndReset: the guard's view is its Snapshot; its metrics carry every
// rejection code (0 included), the level, trips, the breakers open now, exact counts and
// runaways; a tenant reset closes the tenant's breaker, which the metrics then show.
func TestViewMetricsAndReset(t *testing.T) {
	g := newGuard(t, breakerParams(), newClock())
	for range 2 {
		admit(t, g, deep(t, "a")) // two explosions open a's breaker
	}
	wantReject(t, admit(t, g, chat(t, "a", 0, "hi")), 503, CodeBreakerOpen)
	admitOK(t, g, chat(t, "b", 0, "hi"), ok200)
	runaway := admit(t, g, chat(t, "c", 0, "hi"))
	runaway.Done(policy.Outcome{Status: 200, Flags: []policy.Class{policy.ClassRunaway}})

	m := metricstest.Collect(t, g)
	want := map[string]float64{
		"sluice_guard_level":               0,
		"sluice_guard_breaker_trips_total": 1,
		"sluice_guard_breakers_open":       1,
		"sluice_guard_exact_counts_total":  0,
		"sluice_guard_runaways_total":      1,
	}
	for _, code := range codesArr {
		want[metricstest.Key("sluice_guard_rejections_total", [2]string{"code", string(code)})] = 0
	}
	want[metricstest.Key("sluice_guard_rejections_total", [2]string{"code", string(CodePromptTooDeep)})] = 2
	want[metricstest.Key("sluice_guard_rejections_total", [2]string{"code", string(CodeBreakerOpen)})] = 1
	metricstest.Expect(t, m, want)
	if s := m["sluice_guard_level"]; s.Kind != policy.Gauge {
		t.Errorf("sluice_guard_level is kind %d, want a gauge", s.Kind)
	}

	view, ok := g.AdminView().(Snapshot)
	if !ok || view.Route != "chat" || len(view.Breakers) != 3 || breakerOf(g, "a").State != "open" {
		t.Fatalf("AdminView = %#v", g.AdminView())
	}
	if _, err := json.Marshal(view); err != nil {
		t.Fatalf("the view does not encode: %v", err)
	}

	if n := g.ResetTenant("a"); n != 1 {
		t.Fatalf("ResetTenant(a) dropped %d, want 1", n)
	}
	if s := metricstest.Collect(t, g)["sluice_guard_breakers_open"]; s.Value != 0 {
		t.Errorf("sluice_guard_breakers_open after the reset = %v, want 0", s.Value)
	}
	admitOK(t, g, chat(t, "a", 0, "hi"), ok200)
}
