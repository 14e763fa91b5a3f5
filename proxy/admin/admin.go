// Package admin serves the gateway's admin listener: health and readiness, the Prometheus
// scrape, the effective config and reloads, endpoints, routes and their weights, the
// policies' own views and resets, the chaos API, the shadow report and export, the load
// signals, the xDS client's state and Go's profiles.
//
// The handlers read a running gateway through the small Gateway interface (each call reads
// the generation serving at that moment) and never hold its state. /admin/* and
// /debug/pprof/* need "Authorization: Bearer <token>" (the token read from admin.token_env)
// whenever a token is set, and a token must be set when the admin listener is not on
// loopback; /metrics needs the metrics token when admin.metrics_token_env is set. Every error
// is OpenAI's error shape.
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/shadow"
)

// Gateway is what the admin API reads and changes on a running gateway.
type Gateway interface {
	// Config is the effective config (the serving generation's).
	Config() *config.Config
	// NotReady says why the gateway is not ready ("" when it is).
	NotReady() string
	// Reload re-reads the config file and applies it (as SIGHUP does).
	Reload() error
	// Endpoints are every cluster's endpoints with their health, ejection and load.
	Endpoints() map[string][]upstream.EndpointStatus
	// Routes are every route's state (splits, weights, budgets, breakers), in config order.
	Routes() []RouteState
	// Router is the route's weights, nil when there is no such route.
	Router(name string) Router
	// Policies are the serving generation's policies, route by route.
	Policies() []Policy
	// ShadowReport is the shadow report (judged first with judge).
	ShadowReport(ctx context.Context, judge bool) (shadow.Report, error)
	// ShadowStore is the shadow store, nil when no route mirrors.
	ShadowStore() *shadow.Store
	// Signals are the endpoints' scraped load signals, state checks and local GPUs.
	Signals(ctx context.Context) any
}

// RouteState is one route's state for GET /admin/routes.
type RouteState struct {
	Route string       `json:"route"`
	State route.Status `json:"state"`
}

// Router changes a route's split weights at runtime.
type Router interface {
	SetWeights(map[string]int) error
	Weights() map[string]int
}

// Policy is one of the serving generation's policies: where it serves, what it is, and
// which contracts the gateway found it implements.
type Policy struct {
	Route, Type, Name string
	Contracts         []string
	Plugin            policy.Plugin
}

// Options are the admin API's parts.
type Options struct {
	Gateway Gateway
	Metrics http.Handler  // GET /metrics
	Chaos   *fault.Engine // the fault-injection API; nil: none
	XDS     func() any    // GET /admin/xds, the xDS client's state; nil: not served
	Log     *slog.Logger
}

// api serves the admin listener.
type api struct {
	gw    Gateway
	chaos *fault.Engine
	log   *slog.Logger
}

// Handler returns the admin listener's handler:
//
//	GET /healthz          liveness: 200 while the process serves
//	GET /readyz           readiness: 200 once listening with a config, 503 while draining
//	                      or while a cluster of admin.ready_clusters has no healthy endpoint
//	GET /metrics          Prometheus exposition (OTel instruments, GenAI semconv), behind
//	                      the metrics token when admin.metrics_token_env is set
//	GET /admin/config     the effective config as JSON, secrets redacted
//	GET /admin/endpoints  every cluster's endpoints: health, ejection, in-flight
//	POST /admin/reload    re-read the config file (same as SIGHUP)
//	GET /admin/gpu        the load signals, state checks and local GPUs
//	GET /admin/xds        the xDS client's state (under xDS)
//	GET /debug/pprof/     Go profiles (CPU, heap, goroutines), behind the admin token
//
// and the routes' and policies' (policies.go), chaos (chaos.go) and shadow (shadow.go)
// endpoints.
func Handler(o Options) http.Handler {
	a := &api{gw: o.Gateway, chaos: o.Chaos, log: o.Log}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if why := a.gw.NotReady(); why != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: " + why + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	if o.Metrics != nil {
		mux.Handle("GET /metrics", a.scrapeAuthorized(o.Metrics))
	}
	mux.Handle("GET /admin/config", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, a.gw.Config())
	}))
	mux.Handle("GET /admin/endpoints", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, a.gw.Endpoints())
	}))
	mux.Handle("POST /admin/reload", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
		if err := a.gw.Reload(); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_config", err.Error()))
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"version": a.gw.Config().Version})
	}))
	mux.Handle("GET /admin/gpu", a.authorized(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), signalsTimeout)
		defer cancel()
		WriteJSON(w, http.StatusOK, a.gw.Signals(ctx))
	}))
	if o.XDS != nil {
		mux.Handle("GET /admin/xds", a.authorized(func(w http.ResponseWriter, _ *http.Request) {
			WriteJSON(w, http.StatusOK, o.XDS())
		}))
	}
	a.policyRoutes(mux)
	if a.chaos != nil {
		a.chaosRoutes(mux)
	}
	a.shadowRoutes(mux)
	mux.Handle("GET /debug/pprof/", a.authorized(pprof.Index))
	mux.Handle("GET /debug/pprof/cmdline", a.authorized(pprof.Cmdline))
	mux.Handle("GET /debug/pprof/profile", a.authorized(pprof.Profile))
	mux.Handle("GET /debug/pprof/symbol", a.authorized(pprof.Symbol))
	mux.Handle("GET /debug/pprof/trace", a.authorized(pprof.Trace))
	return mux
}

// signalsTimeout bounds reading the local GPUs for GET /admin/gpu.
const signalsTimeout = 5 * time.Second

// scrapeAuthorized requires the metrics token (or the admin token) on /metrics when
// admin.metrics_token_env is set.
func (a *api) scrapeAuthorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := a.gw.Config()
		if c.Admin.MetricsTokenEnv == "" {
			next.ServeHTTP(w, r)
			return
		}
		if got, ok := bearer(r); ok && TokenIs(got, c.Admin.MetricsTokenEnv, c.Admin.TokenEnv) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-metrics"`)
		openai.WriteError(w, openai.NewError(http.StatusUnauthorized, "authentication_error", "invalid_metrics_token",
			"/metrics: missing or wrong bearer token (set via "+c.Admin.MetricsTokenEnv+")"))
	})
}

// authorized requires the admin bearer token when one is configured.
func (a *api) authorized(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := a.gw.Config()
		if os.Getenv(c.Admin.TokenEnv) == "" && config.IsLoopback(c.Admin.Listen) {
			next(w, r)
			return
		}
		if got, ok := bearer(r); !ok || !TokenIs(got, c.Admin.TokenEnv) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
			openai.WriteError(w, openai.NewError(http.StatusUnauthorized, "authentication_error", "invalid_admin_token",
				"admin API: missing or wrong bearer token (set via "+c.Admin.TokenEnv+")"))
			return
		}
		next(w, r)
	})
}

// bearer is the request's bearer token, if it sent one.
func bearer(r *http.Request) (string, bool) {
	return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// TokenIs reports whether got equals the non-empty token held by one of the environment
// variables envs, compared in constant time.
func TokenIs(got string, envs ...string) bool {
	for _, env := range envs {
		if token := os.Getenv(env); token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return true
		}
	}
	return false
}

// WriteJSON writes v as indented JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// decode decodes an admin API body strictly (at most limit bytes), answering 400 (413 past
// the limit) itself when it cannot.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
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
