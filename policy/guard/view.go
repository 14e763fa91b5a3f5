package guard

import (
	"maps"
	"slices"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicegw/sluice/policy"
)

// AdminView is the guard's view (a policy.Viewer): its Snapshot, which GET /admin/breakers
// lists for every guard and GET /admin/policies shows as the guard's view.
func (g *Guard) AdminView() any { return g.Snapshot() }

// ReportMetrics exports the counters and gauges (a policy.MetricsReporter): rejections by
// code (every code, 0 included), the degradation level, breaker trips and the breakers open
// now, exact counts and runaways. The gateway adds the route and the policy's name.
func (g *Guard) ReportMetrics(emit func(policy.Sample)) {
	s := g.Stats()
	for _, code := range slices.Sorted(maps.Keys(s.Rejected)) {
		emit(policy.Sample{Name: "sluice_guard_rejections_total", Help: "Requests the prompt guard rejected, by code",
			Kind: policy.Counter, Value: float64(s.Rejected[code]), Labels: [][2]string{{"code", string(code)}}})
	}
	emit(policy.Sample{Name: "sluice_guard_level", Help: "Staged degradation level of the route (0 normal, 1 degraded, 2 shedding)",
		Kind: policy.Gauge, Value: float64(s.Level)})
	emit(policy.Sample{Name: "sluice_guard_breaker_trips_total", Help: "Times a tenant breaker of the route opened",
		Kind: policy.Counter, Value: float64(s.Trips)})
	emit(policy.Sample{Name: "sluice_guard_breakers_open", Help: "Tenant breakers of the route's guard that are open now",
		Kind: policy.Gauge, Value: float64(g.openBreakers())})
	emit(policy.Sample{Name: "sluice_guard_exact_counts_total", Help: "Prompts counted exactly with the tokenizer (near a limit)",
		Kind: policy.Counter, Value: float64(s.ExactCounts)})
	emit(policy.Sample{Name: "sluice_guard_runaways_total", Help: "Admitted requests whose answer fell into a loop, counted against the tenant's breaker",
		Kind: policy.Counter, Value: float64(s.Runaways)})
}

// openBreakers counts the tenant breakers that are open now.
func (g *Guard) openBreakers() int {
	n := 0
	for _, b := range g.breakers.list() {
		if b.cb.State() == gobreaker.StateOpen {
			n++
		}
	}
	return n
}
