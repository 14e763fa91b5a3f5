package proxy

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
)

// The models Sluice can serve come from its clusters: each asks its endpoints for their
// models (GET /v1/models, with the active health checks, see upstream.Cluster.Models). They
// answer GET /v1/models (the union over routes and clusters, as model pickers expect), fill
// in the model of a request that names none, and give the guard the context window the
// server advertises.

// discoveryTimeout bounds the wait for clusters never asked for their models when a client
// lists them (health checks off): whatever answers in time is listed.
const discoveryTimeout = 2 * time.Second

// apiPaths are the paths a listed model must be servable on (one of them).
var apiPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}

// routeClusters are the clusters a route serves from first: its own and its splits' (the
// fallbacks serve only what the first could not).
func (st *state) routeClusters(rt *config.CompiledRoute, yield func(cluster, model string) bool) {
	if rt.Cluster != "" && !yield(rt.Cluster, rt.Model) {
		return
	}
	for _, sp := range st.routers[rt.Index].Spec().Splits {
		m := sp.Model
		if m == "" {
			m = rt.Model
		}
		if !yield(sp.Cluster, m) {
			return
		}
	}
}

// contextWindow is the smallest context window the route's first clusters advertise for the
// model they would be sent (the route's or split's rewrite, else model), 0 when none does.
// It allocates nothing.
func (st *state) contextWindow(rt *config.CompiledRoute, model string) int {
	n := 0
	st.routeClusters(rt, func(cluster, rewrite string) bool {
		cl := st.clusters[cluster]
		if cl == nil {
			return true
		}
		m := model
		if rewrite != "" {
			m = rewrite
		}
		if w := cl.MaxModelLen(m); w > 0 && (n == 0 || w < n) {
			n = w
		}
		return true
	})
	return n
}

// defaultModel is the model of a request that names none, when the route it would take
// serves exactly one (vLLM serves its default model): the route's model rewrite, else the
// one model its clusters advertise; without a route for no model, the one route of the path
// that names an exact model. "" when there is no single one; the models seen are returned
// for the error message.
func (st *state) defaultModel(ctx context.Context, urlPath string, h http.Header) (string, []string) {
	if rt := st.snap.Route(urlPath, "", h); rt != nil {
		if rt.Model != "" {
			return rt.Model, nil
		}
		var seen []string
		st.routeClusters(rt, func(cluster, _ string) bool {
			if cl := st.clusters[cluster]; cl != nil {
				if !cl.Discovered() {
					dctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
					_ = cl.RefreshModels(dctx)
					cancel()
				}
				for _, m := range cl.Models() {
					if !slices.Contains(seen, m.ID) {
						seen = append(seen, m.ID)
					}
				}
			}
			return true
		})
		if len(seen) == 1 {
			return seen[0], nil
		}
		return "", seen
	}
	var exact []string
	for _, rt := range st.snap.Routes {
		if m := rt.Match.Model; m != "" && !isGlob(m) && rt.Matches(urlPath, m, h) && !slices.Contains(exact, m) {
			exact = append(exact, m)
		}
	}
	if len(exact) == 1 {
		return exact[0], nil
	}
	return "", exact
}

func isGlob(m string) bool { return strings.ContainsAny(m, "*?[\\") }

// missingModel is the 400 for a request without a model that no route can name one for.
func missingModel(seen []string) *policy.Failure {
	msg := "Missing required parameter: 'model'."
	if len(seen) > 1 {
		if len(seen) > 8 {
			seen = append(seen[:8:8], "…")
		}
		msg += " This route serves several models (" + strings.Join(seen, ", ") + "): name one."
	}
	f := policy.Fail(policy.ClassMissingField, msg)
	f.Param = "model"
	return f
}

// fillModel puts the default model into a request that names none (body and parse), or
// returns the 400.
func (h *Handler) fillModel(ctx context.Context, st *state, r *http.Request, req *openai.Request) *policy.Failure {
	m, seen := st.defaultModel(ctx, r.URL.Path, r.Header)
	if m == "" {
		return missingModel(seen)
	}
	body, err := openai.SetField(req.Body, "model", strconv.AppendQuote(nil, m))
	if err != nil {
		return policy.Failf(policy.ClassInvalidJSON, err, err.Error())
	}
	req.Body, req.Model = body, m
	return nil
}

// listModels is every model a client can be served, in config order: what the clusters of
// routes advertise when a route matches that model, then the exact model names routes match
// (aliases, e.g. a route for "gpt-4o" rewritten to a local model) not advertised as such.
// Clusters never asked are asked first, within discoveryTimeout.
func (st *state) listModels(ctx context.Context, h http.Header, created int64) []json.RawMessage {
	var clusters []*clusterState
	seenCl := map[string]bool{}
	for _, rt := range st.snap.Routes {
		names := append([]string{rt.Cluster}, st.routers[rt.Index].Clusters()...)
		for _, n := range names {
			if cl := st.clusters[n]; cl != nil && !seenCl[n] {
				seenCl[n] = true
				clusters = append(clusters, cl)
			}
		}
	}
	dctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	var wg sync.WaitGroup
	for _, cl := range clusters {
		if !cl.Discovered() {
			wg.Go(func() { _ = cl.RefreshModels(dctx) })
		}
	}
	wg.Wait()
	cancel()

	servable := func(id string) bool {
		for _, p := range apiPaths {
			if st.snap.Route(p, id, h) != nil {
				return true
			}
		}
		return false
	}
	var out []json.RawMessage
	listed := map[string]bool{}
	for _, cl := range clusters {
		for _, m := range cl.Models() {
			if !listed[m.ID] && servable(m.ID) {
				listed[m.ID] = true
				out = append(out, m.Raw)
			}
		}
	}
	for _, rt := range st.snap.Routes {
		m := rt.Match.Model
		if m == "" || isGlob(m) || listed[m] {
			continue
		}
		listed[m] = true
		alias := map[string]any{"id": m, "object": "model", "created": created, "owned_by": "sluice"}
		if rt.Model != "" {
			alias["root"] = rt.Model
		}
		if w := st.contextWindow(rt, m); w > 0 {
			alias["max_model_len"] = w
		}
		b, _ := json.Marshal(alias)
		out = append(out, b)
	}
	return out
}

// serveModels answers GET /v1/models (the list) and GET /v1/models/{id} (one model). A model
// not in the list is not answered here when a route can pass the request on (handled false:
// its server may know the model, and answers in its own words); without one it is 404
// model_not_found.
func (h *Handler) serveModels(ctx context.Context, ex *exchange, st *state, routed bool) (res result, handled bool) {
	models := st.listModels(ctx, ex.r.Header, h.srv.created.Unix())
	if id, ok := strings.CutPrefix(ex.r.URL.Path, "/v1/models/"); ok {
		for _, raw := range models {
			var m struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(raw, &m) == nil && m.ID == id {
				return writeOwn(ex, raw), true
			}
		}
		if routed {
			return result{}, false
		}
		f := policy.Fail(policy.ClassModelNotFound, "The model '"+id+"' does not exist or is not served here.")
		f.Param = "model"
		return failed(f), true
	}
	b := []byte(`{"object":"list","data":[`)
	for i, raw := range models {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, raw...)
	}
	return writeOwn(ex, append(b, "]}"...)), true
}

// writeOwn sends Sluice's own 200 JSON answer.
func writeOwn(ex *exchange, body []byte) result {
	hd := ex.w.Header()
	for k, vs := range ex.policyHeader {
		hd[k] = vs
	}
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	ex.w.WriteHeader(http.StatusOK)
	ex.committed = true
	_, _ = ex.w.Write(body)
	return result{status: http.StatusOK}
}

// otherModel is the metric label of a model neither the config nor a model server knows.
const otherModel = "other"

// knownModels are the model names the config gives: what routes match exactly and every
// rewrite (routes, splits, fallback steps, mirrors).
func knownModels(c *config.Config) map[string]bool {
	m := map[string]bool{}
	add := func(s string) {
		if s != "" && !isGlob(s) {
			m[s] = true
		}
	}
	for _, r := range c.Routes {
		add(r.Match.Model)
		add(r.Model)
		for _, sp := range r.Splits {
			add(sp.Model)
		}
		for _, st := range r.Fallback {
			add(st.Model)
		}
		if r.Mirror != nil {
			add(r.Mirror.Model)
		}
	}
	return m
}

// modelLabel bounds a model name that labels metrics: a name the config or a model server
// knows (its /v1/models, or a successful answer for it) stands, anything else (a name only a
// client gave) is "other", so that no client can grow the metric series. It allocates
// nothing.
func (st *state) modelLabel(served *servedModels, m string) string {
	if m == "" || st.models[m] || served.has(m) {
		return m
	}
	for _, cl := range st.clusters {
		if cl.HasModel(m) {
			return m
		}
	}
	return otherModel
}

// maxServedModels bounds the names learnt from successful answers.
const maxServedModels = 256

// servedModels are the model names model servers answered successfully, for clusters whose
// lists are not discovered (health checks off, or no /v1/models). Bounded: past
// maxServedModels a new name is not learnt. It lives across reloads. Every request looks
// names up in it and few learn one: the set is read without a lock (an immutable map
// swapped whole), and a name learnt copies it.
type servedModels struct {
	names atomic.Pointer[map[string]struct{}]
	mu    sync.Mutex // orders the learners
}

func (s *servedModels) has(m string) bool {
	p := s.names.Load()
	if p == nil {
		return false
	}
	_, ok := (*p)[m]
	return ok
}

func (s *servedModels) learn(m string) {
	if m == "" || len(m) > 256 || s.has(m) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var old map[string]struct{}
	if p := s.names.Load(); p != nil {
		old = *p
	}
	if _, ok := old[m]; ok || len(old) >= maxServedModels {
		return
	}
	names := maps.Clone(old)
	if names == nil {
		names = map[string]struct{}{}
	}
	names[m] = struct{}{}
	s.names.Store(&names)
}
