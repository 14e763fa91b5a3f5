package proxy

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// shadowRoutes registers the shadow report and export:
//
//	GET  /admin/shadow          the report as an HTML page
//	GET  /admin/shadow.json     the same as data
//	POST /admin/shadow/judge    judge every mirrored route now (then the report)
//	GET  /admin/shadow/export   stored pairs, redacted, as JSONL (?route=R&limit=N)
func (s *Server) shadowRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/shadow.json", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		rep, err := s.ShadowReport(r.Context(), false)
		if err != nil {
			openai.WriteError(w, openai.NewError(http.StatusInternalServerError, "server_error", "shadow_report", err.Error()))
			return
		}
		writeJSON(w, http.StatusOK, rep)
	}))
	mux.Handle("POST /admin/shadow/judge", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		rep, err := s.ShadowReport(r.Context(), true)
		if err != nil {
			openai.WriteError(w, openai.NewError(http.StatusInternalServerError, "server_error", "shadow_report", err.Error()))
			return
		}
		writeJSON(w, http.StatusOK, rep)
	}))
	mux.Handle("GET /admin/shadow", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		rep, err := s.ShadowReport(r.Context(), false)
		if err != nil {
			openai.WriteError(w, openai.NewError(http.StatusInternalServerError, "server_error", "shadow_report", err.Error()))
			return
		}
		var b bytes.Buffer
		if err := rep.WriteHTML(&b); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusInternalServerError, "server_error", "shadow_report", err.Error()))
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(b.Bytes())
	}))
	mux.Handle("GET /admin/shadow/export", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		st := s.shadow.store.Load()
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

// ShadowReport is the shadow report of every mirrored route (what /admin/shadow.json
// serves). With judge, every route is judged first (as the interval would). With a shared
// store a route's samples are those its latest verdict judged (the fleet's), and the report
// says what the store's writer holds and dropped.
func (s *Server) ShadowReport(ctx context.Context, judge bool) (shadow.Report, error) {
	if judge {
		s.shadow.judgeAll(ctx, time.Now())
	}
	st := s.state.Load()
	c := st.snap.Config
	var ins []shadow.RouteInput
	shared := s.shadow.writer.Load() != nil
	for _, mr := range s.shadow.list() {
		m := mr.cfg.Load()
		in := mr.input()
		pairs, replicas := mr.Accumulator().Counts()
		var scope string
		var sources []shadow.Source
		if shared {
			scope = shadow.ScopeInstance // not judged yet: this gateway's own
			if jd := mr.basis.Load(); jd != nil {
				in, pairs, replicas, scope, sources = jd.in, jd.pairs, jd.replicas, jd.scope, jd.sources
			}
		}
		ri := shadow.RouteInput{
			Route: mr.Name(), CandidateCluster: m.Cluster, CandidateID: mr.Identity(), Input: &in, Pairs: pairs, Replicas: replicas,
			Config: c.Shadow.Verdict, Window: c.Shadow.Window,
			Mirror: mr.Stats(), PrimaryCluster: referenceCluster(st, mr.Name(), &config.Mirror{Cluster: m.Cluster}),
			BaselineCluster: m.Baseline, Scope: scope, Sources: sources,
		}
		mr.mu.Lock()
		ri.Verdict, ri.VerdictTime, ri.Action = mr.verdict, mr.judged, mr.action
		mr.mu.Unlock()
		ins = append(ins, ri)
	}
	store := s.shadow.store.Load()
	status := s.shadow.storeStatus()
	if !shared {
		rep, err := shadow.BuildReport(ctx, store, ins)
		rep.Store = status
		return rep, err
	}
	// A shared store may be down: the report then goes without its history rather than
	// wait for it or fail.
	if store != nil && status.Writer.Connected {
		rctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
		rep, err := shadow.BuildReport(rctx, store, ins)
		cancel()
		if err == nil {
			rep.Store = status
			return rep, nil
		}
		status.Error = "history not read: " + err.Error()
	}
	rep, err := shadow.BuildReport(ctx, nil, ins)
	rep.Store = status
	return rep, err
}
