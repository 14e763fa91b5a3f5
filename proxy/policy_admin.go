package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicegw/sluice/policy/concurrency"
	"github.com/sluicegw/sluice/policy/guard"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/ratelimit"
	"github.com/sluicegw/sluice/policy/route"
)

// plugin is one of the serving generation's policies of type T, with its route and name.
type plugin[T any] struct {
	route, name string
	p           T
}

// pluginsOf returns the generation's policies that are (or offer) T, in route order: the
// admin API's views and the policy metrics read them.
func pluginsOf[T any](st *state) []plugin[T] {
	var out []plugin[T]
	for _, bp := range st.policies {
		if p, ok := bp.impl.(T); ok {
			out = append(out, plugin[T]{bp.route, bp.name, p})
		}
	}
	return out
}

func (st *state) guards() []*guard.Guard {
	var out []*guard.Guard
	for _, g := range pluginsOf[*guard.Guard](st) {
		out = append(out, g.p)
	}
	return out
}

type namedLimiter struct {
	route, name string
	*ratelimit.Limiter
}

type namedConcurrency struct {
	route, name string
	*concurrency.Limiter
}

func (st *state) concurrencyLimiters() []namedConcurrency {
	var out []namedConcurrency
	for _, c := range pluginsOf[*concurrency.Limiter](st) {
		out = append(out, namedConcurrency{c.route, c.name, c.p})
	}
	return out
}

func (st *state) limiters() []namedLimiter {
	var out []namedLimiter
	for _, l := range pluginsOf[*ratelimit.Limiter](st) {
		out = append(out, namedLimiter{l.route, l.name, l.p})
	}
	return out
}

// policyRoutes adds the policies' admin endpoints:
//
//	GET  /admin/routes                  every route's splits, weights, retry budget and cluster breakers
//	PUT  /admin/routes/{route}/weights  {"split": weight, ...}: change split weights at runtime
//
//	GET  /admin/breakers        every guard's breakers (state, counts) and degradation level
//	POST /admin/breakers/reset  reset the breakers of ?tenant=T (all tenants without it), on ?route=R (all routes without it)
//	GET  /admin/ratelimits      every rate limiter's counters and buckets
//	GET  /admin/policies        every policy with its contracts and own view (?type=T: of one type)
func (s *Server) policyRoutes(mux *http.ServeMux) {
	mux.Handle("GET /admin/policies", s.authorized(s.pluginsView))
	mux.Handle("GET /admin/breakers", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		out := []guard.Snapshot{}
		for _, g := range s.state.Load().guards() {
			out = append(out, g.Snapshot())
		}
		writeJSON(w, http.StatusOK, map[string]any{"routes": out})
	}))
	mux.Handle("POST /admin/breakers/reset", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		tenant, route := r.URL.Query().Get("tenant"), r.URL.Query().Get("route")
		found, n := route == "", 0
		for _, g := range s.state.Load().guards() {
			if route != "" && g.Snapshot().Route != route {
				continue
			}
			found = true
			n += g.Reset(tenant)
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
	mux.Handle("GET /admin/concurrency", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		type entry struct {
			Route    string               `json:"route"`
			Name     string               `json:"name"`
			Snapshot concurrency.Snapshot `json:"state"`
		}
		out := []entry{}
		for _, c := range s.state.Load().concurrencyLimiters() {
			out = append(out, entry{c.route, c.name, c.Snapshot()})
		}
		writeJSON(w, http.StatusOK, map[string]any{"limiters": out})
	}))
	mux.Handle("GET /admin/ratelimits", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		type entry struct {
			Route string               `json:"route"`
			Name  string               `json:"name"`
			Stats ratelimit.Stats      `json:"stats"`
			Keys  []ratelimit.KeyState `json:"keys"`
		}
		out := []entry{}
		for _, l := range s.state.Load().limiters() {
			out = append(out, entry{l.route, l.name, l.Stats(), l.Snapshot()})
		}
		writeJSON(w, http.StatusOK, map[string]any{"limiters": out})
	}))
}

// policyMetrics exports the policies' counters, read from the generation serving at scrape time.
func (s *Server) policyMetrics(m metric.Meter) (metric.Registration, error) {
	rejected, err := m.Int64ObservableCounter("sluice.guard.rejections", metric.WithDescription("Requests the prompt guard rejected, by code"))
	if err != nil {
		return nil, err
	}
	level, err := m.Int64ObservableGauge("sluice.guard.level", metric.WithDescription("Staged degradation level of the route (0 normal, 1 degraded, 2 shedding)"))
	if err != nil {
		return nil, err
	}
	trips, err := m.Int64ObservableCounter("sluice.guard.breaker.trips", metric.WithDescription("Times a tenant breaker of the route opened"))
	if err != nil {
		return nil, err
	}
	exact, err := m.Int64ObservableCounter("sluice.guard.exact_counts", metric.WithDescription("Prompts counted exactly with the tokenizer (near a limit)"))
	if err != nil {
		return nil, err
	}
	rl, err := m.Int64ObservableCounter("sluice.ratelimit.rejections", metric.WithDescription("Requests the rate limiter rejected, by reason"))
	if err != nil {
		return nil, err
	}
	glob, err := m.Int64ObservableCounter("sluice.ratelimit.global_failures", metric.WithDescription("Calls to the global rate limit service that failed (admitted: fail open)"))
	if err != nil {
		return nil, err
	}
	climit, err := m.Int64ObservableGauge("sluice.concurrency.limit", metric.WithDescription("Adaptive concurrency limit of the route"))
	if err != nil {
		return nil, err
	}
	cinflight, err := m.Int64ObservableGauge("sluice.concurrency.in_flight", metric.WithDescription("Requests holding a concurrency slot"))
	if err != nil {
		return nil, err
	}
	cqueue, err := m.Int64ObservableGauge("sluice.concurrency.queue_length", metric.WithDescription("Requests waiting for a concurrency slot"))
	if err != nil {
		return nil, err
	}
	crej, err := m.Int64ObservableCounter("sluice.concurrency.rejections", metric.WithDescription("Requests the concurrency limiter rejected, by reason"))
	if err != nil {
		return nil, err
	}
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
	tenantsOpen, err := m.Int64ObservableGauge("sluice.guard.breakers.open",
		metric.WithDescription("Tenant breakers of the route's guard that are open now"))
	if err != nil {
		return nil, err
	}
	runaways, err := m.Int64ObservableCounter("sluice.guard.runaways",
		metric.WithDescription("Admitted requests whose answer fell into a loop, counted against the tenant's breaker"))
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
		for _, c := range st.concurrencyLimiters() {
			cs := c.Stats()
			route := attribute.String("route", c.route)
			o.ObserveInt64(climit, int64(cs.Limit), metric.WithAttributes(route))
			o.ObserveInt64(cinflight, int64(cs.InFlight), metric.WithAttributes(route))
			o.ObserveInt64(cqueue, int64(cs.Queued), metric.WithAttributes(route))
			for _, reason := range sortedKeys(cs.Rejected) {
				o.ObserveInt64(crej, int64(cs.Rejected[reason]), metric.WithAttributes(route, attribute.String("reason", reason)))
			}
		}
		for _, g := range st.guards() {
			gs := g.Stats()
			snap := g.Snapshot()
			route := attribute.String("route", snap.Route)
			var open int64
			for _, b := range snap.Breakers {
				if b.State == "open" {
					open++
				}
			}
			o.ObserveInt64(tenantsOpen, open, metric.WithAttributes(route))
			o.ObserveInt64(level, int64(gs.Level), metric.WithAttributes(route))
			o.ObserveInt64(trips, int64(gs.Trips), metric.WithAttributes(route))
			o.ObserveInt64(exact, int64(gs.ExactCounts), metric.WithAttributes(route))
			o.ObserveInt64(runaways, int64(gs.Runaways), metric.WithAttributes(route))
			for _, code := range sortedKeys(gs.Rejected) {
				o.ObserveInt64(rejected, int64(gs.Rejected[code]), metric.WithAttributes(route, attribute.String("code", string(code))))
			}
		}
		for _, l := range st.limiters() {
			ls := l.Stats()
			route := attribute.String("route", l.route)
			o.ObserveInt64(glob, int64(ls.GlobalFailures), metric.WithAttributes(route))
			for _, reason := range sortedKeys(ls.Rejected) {
				o.ObserveInt64(rl, int64(ls.Rejected[reason]), metric.WithAttributes(route, attribute.String("reason", reason)))
			}
		}
		return nil
	}, rejected, level, trips, exact, rl, glob, climit, cinflight, cqueue, crej, exhausted, breaker, tenantsOpen, runaways)
}

// breakerStates are the values of sluice_route_breaker_state by gobreaker state name.
var breakerStates = map[string]int64{"closed": 0, "half-open": 1, "open": 2}

func sortedKeys[K ~string](m map[K]uint64) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// waitCollector exports each adaptive concurrency limiter's admission waits as a Prometheus
// histogram, sluice_concurrency_wait_seconds{route}, read at scrape time.
type waitCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newWaitCollector(s *Server) *waitCollector {
	return &waitCollector{s: s, desc: prometheus.NewDesc("sluice_concurrency_wait_seconds",
		"Time admitted requests waited for a concurrency slot", []string{"route"}, nil)}
}

func (c *waitCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *waitCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.s.state.Load().concurrencyLimiters() {
		w := l.Stats().Wait
		buckets := make(map[float64]uint64, len(concurrency.WaitBuckets))
		var cum uint64
		for i, bound := range concurrency.WaitBuckets {
			if i < len(w.Counts) {
				cum += w.Counts[i]
			}
			buckets[bound.Seconds()] = cum
		}
		m, err := prometheus.NewConstHistogram(c.desc, w.Count, w.Sum.Seconds(), buckets, l.route)
		if err == nil {
			ch <- m
		}
	}
}
