package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/route"
)

// typeViews are the admin endpoints older than GET /admin/policies: each lists the views
// (policy.Viewer) of the serving generation's policies of one type, in route order, as
// {"<key>": [entry, ...]}, each entry in the shape the endpoint always had.
var typeViews = []struct {
	path, typ, key string
	entry          func(bp *builtPolicy, view any) any
}{
	{"GET /admin/breakers", "guard", "routes", func(_ *builtPolicy, v any) any { return v }},
	{"GET /admin/ratelimits", "ratelimit", "limiters", func(bp *builtPolicy, v any) any { return placedView{bp.route, bp.name, v} }},
	{"GET /admin/concurrency", "concurrency", "limiters", func(bp *builtPolicy, v any) any {
		return struct {
			Route string `json:"route"`
			Name  string `json:"name"`
			State any    `json:"state"`
		}{bp.route, bp.name, v}
	}},
}

// typeView serves one of typeViews.
func (s *Server) typeView(typ, key string, entry func(*builtPolicy, any) any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		out := []any{}
		for _, bp := range s.state.Load().policies {
			if v, ok := bp.impl.(policy.Viewer); ok && bp.typ == typ {
				out = append(out, entry(bp, v.AdminView()))
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{key: out})
	}
}

// placedView is a view (a JSON object) with the policy's route and name added before its own
// fields: {"route": R, "name": N, ...}.
type placedView struct {
	route, name string
	view        any
}

func (p placedView) MarshalJSON() ([]byte, error) {
	head, err := json.Marshal(struct {
		Route string `json:"route"`
		Name  string `json:"name"`
	}{p.route, p.name})
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(p.view)
	if err != nil {
		return nil, fmt.Errorf("view of policy %s: %w", p.name, err)
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("view of policy %s is not a JSON object", p.name)
	}
	if string(body) == "{}" {
		return head, nil
	}
	return append(append(head[:len(head)-1], ','), body[1:]...), nil
}

// policyRoutes adds the policies' admin endpoints:
//
//	GET  /admin/routes                  every route's splits, weights, retry budget and cluster breakers
//	PUT  /admin/routes/{route}/weights  {"split": weight, ...}: change split weights at runtime
//
//	GET  /admin/policies        every policy with its contracts and own view (?type=T: of one type)
//	GET  /admin/breakers        every guard's view: breakers (state, counts) and degradation level
//	GET  /admin/ratelimits      every rate limiter's view: counters and buckets
//	GET  /admin/concurrency     every concurrency limiter's view: limit, baselines, gradient, queue
//	POST /admin/breakers/reset  reset the breakers of ?tenant=T (all tenants without it), on ?route=R (all routes without it)
//
// The views and the reset are the policies' own (policy.Viewer, policy.Resetter): the gateway
// knows the policies by type name only.
func (s *Server) policyRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/policies", s.authorized(s.pluginsView))
	for _, tv := range typeViews {
		mux.Handle(tv.path, s.authorized(s.typeView(tv.typ, tv.key, tv.entry)))
	}
	mux.Handle("POST /admin/breakers/reset", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		tenant, route := r.URL.Query().Get("tenant"), r.URL.Query().Get("route")
		found, n := route == "", 0
		for _, bp := range s.state.Load().policies {
			rs, ok := bp.impl.(policy.Resetter)
			if !ok || bp.typ != "guard" || (route != "" && bp.route != route) {
				continue
			}
			found = true
			n += rs.ResetTenant(tenant)
		}
		if !found {
			openai.WriteError(w, openai.NewError(http.StatusNotFound, "invalid_request_error", "unknown_route",
				"no guard on route "+route))
			return
		}
		s.log.Info("breakers reset from the admin API", "tenant", tenant, "route", route, "breakers", n)
		writeJSON(w, http.StatusOK, map[string]int{"reset": n})
	}))
	mux.Handle("GET /admin/routes", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		st := s.state.Load()
		type entry struct {
			Route string       `json:"route"`
			State route.Status `json:"state"`
		}
		out := []entry{}
		for i, r := range st.snap.Routes {
			out = append(out, entry{r.Name, st.routers[i].Snapshot()})
		}
		writeJSON(w, http.StatusOK, map[string]any{"routes": out})
	}))
	mux.Handle("PUT /admin/routes/{route}/weights", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		rtr := s.state.Load().router(r.PathValue("route"))
		if rtr == nil {
			openai.WriteError(w, openai.NewError(http.StatusNotFound, "invalid_request_error", "unknown_route", "no route "+r.PathValue("route")))
			return
		}
		var weights map[string]int
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&weights); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_json", "body must be {\"split\": weight, ...}: "+err.Error()))
			return
		}
		if err := rtr.SetWeights(weights); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_weights", err.Error()))
			return
		}
		s.log.Info("split weights changed from the admin API", "route", r.PathValue("route"), "weights", weights)
		writeJSON(w, http.StatusOK, map[string]any{"weights": rtr.Weights()})
	}))
}

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
