package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
)

// chaosRoutes adds the fault-injection admin API (behind the admin token):
//
//	GET    /admin/faults      the faults in force, with how often each was planned and fired
//	PUT    /admin/faults      replace them: [{kind, side, percent, ...}, ...] (validated whole)
//	POST   /admin/faults      add one: {kind, ...}
//	DELETE /admin/faults      kill switch: clear every fault (streams in flight stop at their next event)
//	GET    /admin/faults/log  the recent injections: request id, fault, and what happened next
func (s *Server) chaosRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/faults", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"enabled": s.chaos.Enabled(), "faults": s.chaos.List(), "stats": s.chaos.Stats()})
	}))
	mux.Handle("PUT /admin/faults", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		var specs []fault.Spec
		if !decodeAdmin(w, r, &specs) {
			return
		}
		if err := s.chaos.Set(specs); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_faults", err.Error()))
			return
		}
		s.log.Warn("chaos faults replaced from the admin API", "faults", len(specs))
		writeJSON(w, http.StatusOK, map[string]any{"faults": s.chaos.List()})
	}))
	mux.Handle("POST /admin/faults", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		var spec fault.Spec
		if !decodeAdmin(w, r, &spec) {
			return
		}
		id, err := s.chaos.Add(spec)
		if err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_fault", err.Error()))
			return
		}
		s.log.Warn("chaos fault added from the admin API", "id", id, "kind", spec.Kind, "side", spec.Side)
		writeJSON(w, http.StatusCreated, map[string]string{"id": id})
	}))
	mux.Handle("DELETE /admin/faults", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		s.chaos.Clear()
		s.log.Warn("chaos kill switch: every fault cleared")
		writeJSON(w, http.StatusOK, map[string]any{"faults": s.chaos.List()})
	}))
	mux.Handle("GET /admin/faults/log", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"log": s.chaos.Log(), "report": s.chaos.Report()})
	}))
}

// decodeAdmin decodes an admin API body strictly, answering 400 itself when it cannot.
func decodeAdmin(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			openai.WriteError(w, openai.NewError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", err.Error()))
			return false
		}
		openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_json", err.Error()))
		return false
	}
	return true
}

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
