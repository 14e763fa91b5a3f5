package concurrency

import (
	"maps"
	"slices"

	"github.com/sluicegw/sluice/policy"
)

// AdminView is the limiter's Snapshot (a policy.Viewer; GET /admin/concurrency lists every
// limiter's with its route and name).
func (l *Limiter) AdminView() any { return l.Snapshot() }

// waitBounds are WaitBuckets in seconds, the wait histogram's upper bounds.
var waitBounds = func() []float64 {
	out := make([]float64, len(WaitBuckets))
	for i, b := range WaitBuckets {
		out[i] = b.Seconds()
	}
	return out
}()

// ReportMetrics exports the limit, the slots held, the queue, the rejections by reason (every
// reason, 0 included) and the admission waits (a policy.MetricsReporter). The gateway adds
// the route and the policy's name.
func (l *Limiter) ReportMetrics(emit func(policy.Sample)) {
	s := l.Stats()
	emit(policy.Sample{Name: "sluice_concurrency_limit", Help: "Adaptive concurrency limit of the route",
		Kind: policy.Gauge, Value: float64(s.Limit)})
	emit(policy.Sample{Name: "sluice_concurrency_in_flight", Help: "Requests holding a concurrency slot",
		Kind: policy.Gauge, Value: float64(s.InFlight)})
	emit(policy.Sample{Name: "sluice_concurrency_queue_length", Help: "Requests waiting for a concurrency slot",
		Kind: policy.Gauge, Value: float64(s.Queued)})
	for _, reason := range slices.Sorted(maps.Keys(s.Rejected)) {
		emit(policy.Sample{Name: "sluice_concurrency_rejections_total", Help: "Requests the concurrency limiter rejected, by reason",
			Kind: policy.Counter, Value: float64(s.Rejected[reason]), Labels: [][2]string{{"reason", reason}}})
	}
	emit(policy.Sample{Name: "sluice_concurrency_wait_seconds", Help: "Time admitted requests waited for a concurrency slot",
		Kind: policy.Histogram, Bounds: waitBounds, Counts: s.Wait.Counts, Count: s.Wait.Count, Sum: s.Wait.Sum.Seconds()})
}
