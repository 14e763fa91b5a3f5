package proxy

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// adminHandler serves the admin listener:
//
//	GET /healthz          liveness: 200 while the process serves
//	GET /readyz           readiness: 200 once listening with a config, 503 while draining
//	                      or while a cluster of admin.ready_clusters has no healthy endpoint
//	GET /metrics          Prometheus exposition (OTel instruments, GenAI semconv), behind
//	                      the metrics token when admin.metrics_token_env is set
//	GET /admin/config     the effective config as JSON, secrets redacted
//	GET /admin/endpoints  every cluster's endpoints: health, ejection, in-flight
//	POST /admin/reload    re-read the config file (same as SIGHUP)
//	GET /debug/pprof/     Go profiles (CPU, heap, goroutines), behind the same token
//
// /admin/* needs "Authorization: Bearer <token>" (token from admin.token_env) whenever a token
// is set, and a token must be set when the admin listener is not on loopback.
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if why := s.notReady(); why != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: " + why + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", s.scrapeAuthorized(s.tel.Handler()))
	mux.Handle("GET /admin/config", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Config())
	}))
	mux.Handle("GET /admin/endpoints", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		st := s.state.Load()
		out := map[string][]upstream.EndpointStatus{}
		for name, cl := range st.clusters {
			out[name] = cl.Snapshot()
		}
		writeJSON(w, http.StatusOK, out)
	}))
	mux.Handle("POST /admin/reload", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
		if err := s.Reload(); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_config", err.Error()))
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"version": s.Config().Version})
	}))
	s.policyRoutes(mux)
	s.signalRoutes(mux)
	s.chaosRoutes(mux)
	s.shadowRoutes(mux)
	if s.opts.XDSStatus != nil {
		mux.Handle("GET /admin/xds", s.authorized(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, s.opts.XDSStatus())
		}))
	}
	mux.Handle("GET /debug/pprof/", s.authorized(pprof.Index))
	mux.Handle("GET /debug/pprof/cmdline", s.authorized(pprof.Cmdline))
	mux.Handle("GET /debug/pprof/profile", s.authorized(pprof.Profile))
	mux.Handle("GET /debug/pprof/symbol", s.authorized(pprof.Symbol))
	mux.Handle("GET /debug/pprof/trace", s.authorized(pprof.Trace))
	return mux
}

// notReady says why /readyz is 503 ("" when ready): no config yet, draining, or a cluster
// of admin.ready_clusters without a healthy endpoint.
func (s *Server) notReady() string {
	switch {
	case s.draining.Load():
		return "draining"
	case !s.ready.Load():
		return "no config yet"
	}
	st := s.state.Load()
	for _, name := range st.snap.Config.Admin.ReadyClusters {
		if cl := st.clusters[name]; cl != nil && !cl.Ready() {
			return "cluster " + name + " has no healthy endpoint"
		}
	}
	return ""
}

// scrapeAuthorized requires the metrics token (or the admin token) on /metrics when
// admin.metrics_token_env is set.
func (s *Server) scrapeAuthorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := s.Config()
		if c.Admin.MetricsTokenEnv == "" {
			next.ServeHTTP(w, r)
			return
		}
		if got, ok := bearer(r); ok && tokenIs(got, c.Admin.MetricsTokenEnv, c.Admin.TokenEnv) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-metrics"`)
		openai.WriteError(w, openai.NewError(http.StatusUnauthorized, "authentication_error", "invalid_metrics_token",
			"/metrics: missing or wrong bearer token (set via "+c.Admin.MetricsTokenEnv+")"))
	})
}

// authorized requires the admin bearer token when one is configured.
func (s *Server) authorized(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := s.Config()
		if os.Getenv(c.Admin.TokenEnv) == "" && config.IsLoopback(c.Admin.Listen) {
			next(w, r)
			return
		}
		if got, ok := bearer(r); !ok || !tokenIs(got, c.Admin.TokenEnv) {
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

// tokenIs reports whether got equals the non-empty token held by one of the environment
// variables envs, compared in constant time.
func tokenIs(got string, envs ...string) bool {
	for _, env := range envs {
		if token := os.Getenv(env); token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
