package admin

import (
	"bytes"
	"net/http"
	"strconv"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/shadow"
)

// shadowRoutes registers the shadow report and export:
//
//	GET  /admin/shadow          the report as an HTML page
//	GET  /admin/shadow.json     the same as data
//	POST /admin/shadow/judge    judge every mirrored route now (then the report)
//	GET  /admin/shadow/export   stored pairs, redacted, as JSONL (?route=R&limit=N)
func (a *api) shadowRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/shadow.json", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		rep, ok := a.shadowReport(w, r, false)
		if !ok {
			return
		}
		WriteJSON(w, http.StatusOK, rep)
	}))
	mux.Handle("POST /admin/shadow/judge", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		rep, ok := a.shadowReport(w, r, true)
		if !ok {
			return
		}
		WriteJSON(w, http.StatusOK, rep)
	}))
	mux.Handle("GET /admin/shadow", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		rep, ok := a.shadowReport(w, r, false)
		if !ok {
			return
		}
		var b bytes.Buffer
		if err := rep.WriteHTML(&b); err != nil {
			reportFailed(w, err)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(b.Bytes())
	}))
	mux.Handle("GET /admin/shadow/export", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		st := a.gw.ShadowStore()
		if st == nil {
			openai.WriteError(w, openai.NewError(http.StatusNotFound, "invalid_request_error", "no_shadow_store", "no route mirrors, so there is no shadow store"))
			return
		}
		limit := 1000
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > shadow.MaxQueryLimit {
				openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_limit",
					"limit must be a number within 1.."+strconv.Itoa(shadow.MaxQueryLimit)))
				return
			}
			limit = n
		}
		route := r.URL.Query().Get("route")
		var pairs []shadow.PairRecord
		routes := []string{route}
		if route == "" {
			var err error
			if routes, err = st.Routes(r.Context()); err != nil {
				openai.WriteError(w, openai.NewError(http.StatusInternalServerError, "server_error", "shadow_store", err.Error()))
				return
			}
		}
		for _, rt := range routes {
			ps, err := st.Pairs(r.Context(), rt, limit)
			if err != nil {
				openai.WriteError(w, openai.NewError(http.StatusInternalServerError, "server_error", "shadow_store", err.Error()))
				return
			}
			pairs = append(pairs, ps...)
		}
		shadow.SortOldestFirst(pairs)
		w.Header().Set("Content-Type", "application/x-ndjson")
		_ = shadow.ExportJSONL(r.Context(), w, pairs)
	}))
}

// shadowReport is the gateway's shadow report (judged first with judge); when there is none
// it answers 500 itself.
func (a *api) shadowReport(w http.ResponseWriter, r *http.Request, judge bool) (shadow.Report, bool) {
	rep, err := a.gw.ShadowReport(r.Context(), judge)
	if err != nil {
		reportFailed(w, err)
		return shadow.Report{}, false
	}
	return rep, true
}

func reportFailed(w http.ResponseWriter, err error) {
	openai.WriteError(w, openai.NewError(http.StatusInternalServerError, "server_error", "shadow_report", err.Error()))
}
