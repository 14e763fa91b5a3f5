package admin

import (
	"net/http"

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
func (a *api) chaosRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/faults", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]any{"enabled": a.chaos.Enabled(), "faults": a.chaos.List(), "stats": a.chaos.Stats()})
	}))
	mux.Handle("PUT /admin/faults", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		var specs []fault.Spec
		if !decode(w, r, 1<<20, &specs) {
			return
		}
		if err := a.chaos.Set(specs); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_faults", err.Error()))
			return
		}
		a.log.Warn("chaos faults replaced from the admin API", "faults", len(specs))
		WriteJSON(w, http.StatusOK, map[string]any{"faults": a.chaos.List()})
	}))
	mux.Handle("POST /admin/faults", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		var spec fault.Spec
		if !decode(w, r, 1<<20, &spec) {
			return
		}
		id, err := a.chaos.Add(spec)
		if err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_fault", err.Error()))
			return
		}
		a.log.Warn("chaos fault added from the admin API", "id", id, "kind", spec.Kind, "side", spec.Side)
		WriteJSON(w, http.StatusCreated, map[string]string{"id": id})
	}))
	mux.Handle("DELETE /admin/faults", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
		a.chaos.Clear()
		a.log.Warn("chaos kill switch: every fault cleared")
		WriteJSON(w, http.StatusOK, map[string]any{"faults": a.chaos.List()})
	}))
	mux.Handle("GET /admin/faults/log", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]any{"log": a.chaos.Log(), "report": a.chaos.Report()})
	}))
}
