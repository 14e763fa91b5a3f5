package server

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// Status is the control plane's state, as GET /admin/xds shows it.
type Status struct {
	// Version is the snapshot every node is sent; FileVersion the file's (they differ while
	// the control plane's progression holds weights of its own: Version is then
	// FileVersion+"+pN").
	Version     string   `json:"version"`
	FileVersion string   `json:"file_version"`
	Config      string   `json:"config"`
	RouteConfig string   `json:"route_config"`
	Nodes       []string `json:"nodes"`
	// Progression is the weight progression run from the fleet's verdicts.
	Progression ProgressionStatus `json:"progression"`
}

// ProgressionStatus is the state of the control plane's weight progression.
type ProgressionStatus struct {
	// On: a shared shadow store is configured (Store, its password masked) and the routes
	// with a mirror.progression are stepped by the fleet's verdicts; Instance names the
	// control plane in the store's verdicts.
	On       bool                `json:"on"`
	Store    string              `json:"store,omitempty"`
	Instance string              `json:"instance,omitempty"`
	Writer   *shadow.WriterStats `json:"writer,omitempty"`
	// Role is RoleLeader (this control plane judges and steps the weights: it holds the
	// store's progression lock, or the store is a SQLite file) or RoleFollower (another
	// leads: this one serves the weights the leader's steps recorded in the store, and
	// judges nothing); "" until the store has opened. LeaderSince is when it took the lead;
	// LeaderError why the lock could not be tried last.
	Role        string     `json:"role,omitempty"`
	LeaderSince *time.Time `json:"leader_since,omitempty"`
	LeaderError string     `json:"leader_error,omitempty"`
	// Interval is how often the fleet's verdicts are judged (the file's shadow.interval).
	Interval config.Duration `json:"interval"`
	Routes   []RouteProgress `json:"routes"`
}

// Status returns the control plane's state.
func (s *Server) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Version: s.version, FileVersion: s.fileVersion, Config: s.opts.ConfigPath, RouteConfig: s.opts.RouteConfig,
		Nodes: s.nodesLocked(), Progression: ProgressionStatus{Interval: config.Duration(s.file.Shadow.JudgeInterval()), Routes: s.progressStatus()}}
	if s.storeURL != "" {
		st.Progression.On, st.Progression.Store, st.Progression.Instance = true, shadow.RedactDSN(s.storeURL), Instance
		if w := s.writer.Load(); w != nil {
			ws := w.Stats()
			st.Progression.Writer = &ws
		}
		st.Progression.Role, st.Progression.LeaderError = s.role, s.leadErr
		if !s.leaderSince.IsZero() {
			t := s.leaderSince
			st.Progression.LeaderSince = &t
		}
	}
	return st
}

// AdminHandler serves the control plane's status for an admin listener on listen:
//
//	GET /admin/xds  Status as JSON
//	GET /metrics    Prometheus metrics (metrics.go)
//	GET /healthz    200 while the process serves
//
// As a replica's admin API: with the variable SLUICE_ADMIN_TOKEN set, /admin/xds and
// /metrics want it as a bearer token; without it, only a loopback listener answers them.
func (s *Server) AdminHandler(listen string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	auth := authorized(config.IsLoopback(listen))
	mux.Handle("GET /admin/xds", auth(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Status())
	})))
	mux.Handle("GET /metrics", auth(s.metrics))
	return mux
}

// authorized wraps a handler of the admin listener: with SLUICE_ADMIN_TOKEN set it wants
// that bearer token; without it, only a loopback listener answers.
func authorized(loopback bool) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			token := os.Getenv(config.DefaultAdminTokenEnv)
			if token != "" || !loopback {
				got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
				if !ok || token == "" || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
					w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-xds"`)
					openai.WriteError(w, openai.NewError(http.StatusUnauthorized, "authentication_error", "invalid_admin_token",
						"admin API: missing or wrong bearer token (set via "+config.DefaultAdminTokenEnv+")"))
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	}
}
