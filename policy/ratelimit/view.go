package ratelimit

import (
	"maps"
	"slices"

	"github.com/sluicegw/sluice/policy"
)

// View is the limiter's admin view: its counters and its keys' buckets (GET /admin/ratelimits
// lists every limiter's with its route and name).
type View struct {
	Stats Stats      `json:"stats"`
	Keys  []KeyState `json:"keys"`
}

// AdminView is the limiter's View (a policy.Viewer). Its keys are bounded by max_keys.
func (l *Limiter) AdminView() any { return View{Stats: l.Stats(), Keys: l.Snapshot()} }

// ReportMetrics exports the counters (a policy.MetricsReporter): rejections by reason (every
// reason, 0 included) and the failed calls to the global service. The gateway adds the route
// and the policy's name.
func (l *Limiter) ReportMetrics(emit func(policy.Sample)) {
	s := l.Stats()
	for _, reason := range slices.Sorted(maps.Keys(s.Rejected)) {
		emit(policy.Sample{Name: "sluice_ratelimit_rejections_total", Help: "Requests the rate limiter rejected, by reason",
			Kind: policy.Counter, Value: float64(s.Rejected[reason]), Labels: [][2]string{{"reason", reason}}})
	}
	emit(policy.Sample{Name: "sluice_ratelimit_global_failures_total",
		Help: "Calls to the global rate limit service that failed (admitted: fail open)",
		Kind: policy.Counter, Value: float64(s.GlobalFailures)})
}
