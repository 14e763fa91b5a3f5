package telemetry

import (
	"net/http"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/propagation"
)

// TestHeaderCarrierLikeOtel: the carrier reads and writes what propagation.HeaderCarrier
// does, for the trace context's keys (which it maps without canonicalizing) and any other.
func TestHeaderCarrierLikeOtel(t *testing.T) {
	for _, key := range []string{"traceparent", "tracestate", "baggage", "Traceparent", "x-other-key", "X-Other-Key"} {
		h1, h2 := http.Header{}, http.Header{}
		headerCarrier(h1).Set(key, "v-"+key)
		propagation.HeaderCarrier(h2).Set(key, "v-"+key)
		for _, get := range []string{"traceparent", "tracestate", "baggage", "x-other-key"} {
			if a, b := headerCarrier(h1).Get(get), propagation.HeaderCarrier(h2).Get(get); a != b {
				t.Errorf("set %q, get %q: %q, otel's carrier %q", key, get, a, b)
			}
		}
		a, b := headerCarrier(h1).Keys(), propagation.HeaderCarrier(h2).Keys()
		slices.Sort(a)
		slices.Sort(b)
		if !slices.Equal(a, b) {
			t.Errorf("set %q: keys %v, otel's carrier %v", key, a, b)
		}
	}
}
