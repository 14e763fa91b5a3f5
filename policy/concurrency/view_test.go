package concurrency

import (
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/metricstest"
)

// The limiter offers the gateway its admin view and its metrics.
var (
	_ policy.Viewer          = (*Limiter)(nil)
	_ policy.MetricsReporter = (*Limiter)(nil)
)

// TestViewAndMetrics: the limiter's view is its Snapshot; its metrics carry the limit, the
// slots held, the queue, every rejection reason (0 included) and the admission waits as a
// histogram in seconds over WaitBuckets.
func TestViewAndMetrics(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, static(1, 1), clk)
	holder, results := holdAndQueue(t, l)
	wantReject(t, l, admitNow(t, l, req("late")), ReasonQueueFull)

	m := metricstest.Collect(t, l)
	want := map[string]float64{
		"sluice_concurrency_limit":        1,
		"sluice_concurrency_in_flight":    1,
		"sluice_concurrency_queue_length": 1,
	}
	for _, r := range reasons {
		want[metricstest.Key("sluice_concurrency_rejections_total", [2]string{"reason", r})] = 0
	}
	want[metricstest.Key("sluice_concurrency_rejections_total", [2]string{"reason", ReasonQueueFull})] = 1
	metricstest.Expect(t, m, want, "sluice_concurrency_wait_seconds")
	if v, ok := l.AdminView().(Snapshot); !ok || v.Route != "chat" || v.Limit != 1 || v.Queued != 1 || len(v.Waiters) != 1 {
		t.Fatalf("AdminView = %#v", l.AdminView())
	}

	clk.Advance(300 * time.Millisecond)
	holder.Done(ok200)
	r := <-results
	r.d.Done(ok200)
	h, ok := metricstest.Collect(t, l)["sluice_concurrency_wait_seconds"]
	if !ok || h.Kind != policy.Histogram || h.Count != 2 || h.Sum != 0.3 || len(h.Bounds) != len(WaitBuckets) ||
		h.Bounds[0] != 0 || h.Bounds[len(h.Bounds)-1] != 10 {
		t.Fatalf("wait histogram %+v", h)
	}
	// One wait of 0 (the first bucket), one of 300ms (≤ 500ms, the eighth).
	if len(h.Counts) != len(WaitBuckets)+1 || h.Counts[0] != 1 || h.Counts[7] != 1 || h.Bounds[7] != 0.5 {
		t.Errorf("wait buckets %v over %v", h.Counts, h.Bounds)
	}
}
