package proxy

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicegw/sluice/policy/route"
)

// routeMetrics exports the routes' own state (retry budgets, cluster breakers), read from
// the generation serving at scrape time. The policies' metrics are theirs
// (policy.MetricsReporter, pluginCollector).
func (s *Server) routeMetrics(m metric.Meter) (metric.Registration, error) {
	exhausted, err := m.Int64ObservableCounter("sluice.retry_budget.exhausted",
		metric.WithDescription("Extra attempts a retry or fallback budget refused, by route and kind (retry: same cluster, fallback: another cluster)"))
	if err != nil {
		return nil, err
	}
	breaker, err := m.Int64ObservableGauge("sluice.route.breaker.state",
		metric.WithDescription("State of a route's circuit breaker for one cluster: 0 closed, 1 half-open, 2 open"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.state.Load()
		for i, rtr := range st.routers {
			ra := attribute.String("route", st.snap.Routes[i].Name)
			for _, kind := range []string{route.KindRetry, route.KindFallback} {
				o.ObserveInt64(exhausted, rtr.Budgets().Exhausted(kind), metric.WithAttributes(ra, attribute.String("kind", kind)))
			}
			// One series per cluster the route may send to (its breakers are created for
			// the configured clusters only): bounded by the config.
			for _, b := range rtr.Breakers().Snapshot() {
				state, ok := breakerStates[b.State]
				if !ok {
					continue // disabled
				}
				o.ObserveInt64(breaker, state, metric.WithAttributes(ra, attribute.String("cluster", b.Cluster)))
			}
		}
		return nil
	}, exhausted, breaker)
}

// breakerStates are the values of sluice_route_breaker_state by gobreaker state name.
var breakerStates = map[string]int64{"closed": 0, "half-open": 1, "open": 2}
