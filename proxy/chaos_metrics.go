package proxy

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// chaosMetrics exports the injections by kind and side, and how many the client survived.
func (s *Server) chaosMetrics(m metric.Meter) (metric.Registration, error) {
	injected, err := m.Int64ObservableCounter("sluice.chaos.injected", metric.WithDescription("Faults injected, by kind and side"))
	if err != nil {
		return nil, err
	}
	survived, err := m.Int64ObservableCounter("sluice.chaos.survived", metric.WithDescription("Upstream faults after which the client still got a complete answer"))
	if err != nil {
		return nil, err
	}
	clientErrs, err := m.Int64ObservableCounter("sluice.chaos.client_errors", metric.WithDescription("Faults after which the client saw an error"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, k := range s.chaos.Stats().Kinds {
			at := metric.WithAttributes(attribute.String("kind", string(k.Kind)), attribute.String("side", string(k.Side)))
			o.ObserveInt64(injected, int64(k.Injected), at)
			o.ObserveInt64(survived, int64(k.Survived), at)
			o.ObserveInt64(clientErrs, int64(k.ClientErrors), at)
		}
		return nil
	}, injected, survived, clientErrs)
}
