package admin

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// typeViews are the admin endpoints older than GET /admin/policies: each lists the views
// (policy.Viewer) of the serving generation's policies of one type, in route order, as
// {"<key>": [entry, ...]}, each entry in the shape the endpoint always had.
var typeViews = []struct {
	path, typ, key string
	entry          func(p Policy, view any) any
}{
	{"GET /admin/breakers", "guard", "routes", func(_ Policy, v any) any { return v }},
	{"GET /admin/ratelimits", "ratelimit", "limiters", func(p Policy, v any) any { return placedView{p.Route, p.Name, v} }},
	{"GET /admin/concurrency", "concurrency", "limiters", func(p Policy, v any) any {
		return struct {
			Route string `json:"route"`
			Name  string `json:"name"`
			State any    `json:"state"`
		}{p.Route, p.Name, v}
	}},
}

// typeView serves one of typeViews.
func (a *api) typeView(typ, key string, entry func(Policy, any) any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		out := []any{}
		for _, p := range a.gw.Policies() {
			if v, ok := p.Plugin.(policy.Viewer); ok && p.Type == typ {
				out = append(out, entry(p, v.AdminView()))
			}
		}
		WriteJSON(w, http.StatusOK, map[string]any{key: out})
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

// policyEntry is one policy as GET /admin/policies shows it: where it serves, what it is,
// which contracts it implements, and its own view.
type policyEntry struct {
	Route     string   `json:"route"`
	Type      string   `json:"type"`
	Name      string   `json:"name"`
	Contracts []string `json:"contracts"`
	View      any      `json:"view,omitempty"`
}

// policyRoutes adds the routes' and the policies' endpoints:
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
// The views and the reset are the policies' own (policy.Viewer, policy.Resetter): the admin
// API knows the policies by type name only.
func (a *api) policyRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/policies", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		typ := r.URL.Query().Get("type")
		ps := a.gw.Policies()
		out := make([]policyEntry, 0, len(ps))
		for _, p := range ps {
			if typ != "" && p.Type != typ {
				continue
			}
			e := policyEntry{Route: p.Route, Type: p.Type, Name: p.Name, Contracts: p.Contracts}
			if v, ok := p.Plugin.(policy.Viewer); ok {
				e.View = v.AdminView()
			}
			out = append(out, e)
		}
		WriteJSON(w, http.StatusOK, map[string]any{"policies": out})
	}))
	for _, tv := range typeViews {
		mux.Handle(tv.path, a.authorized(a.typeView(tv.typ, tv.key, tv.entry)))
	}
	mux.Handle("POST /admin/breakers/reset", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		tenant, route := r.URL.Query().Get("tenant"), r.URL.Query().Get("route")
		found, n := route == "", 0
		for _, p := range a.gw.Policies() {
			rs, ok := p.Plugin.(policy.Resetter)
			if !ok || p.Type != "guard" || (route != "" && p.Route != route) {
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
		a.log.Info("breakers reset from the admin API", "tenant", tenant, "route", route, "breakers", n)
		WriteJSON(w, http.StatusOK, map[string]int{"reset": n})
	}))
	mux.Handle("GET /admin/routes", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
		out := a.gw.Routes()
		if out == nil {
			out = []RouteState{}
		}
		WriteJSON(w, http.StatusOK, map[string]any{"routes": out})
	}))
	mux.Handle("PUT /admin/routes/{route}/weights", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		rtr := a.gw.Router(r.PathValue("route"))
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
		a.log.Info("split weights changed from the admin API", "route", r.PathValue("route"), "weights", weights)
		WriteJSON(w, http.StatusOK, map[string]any{"weights": rtr.Weights()})
	}))
}
