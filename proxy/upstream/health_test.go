package upstream

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestHealthThresholds(t *testing.T) {
	tests := []struct {
		name    string
		results string // S success, F failure
		want    string // healthy after each result: h or u
	}{
		{"starts healthy, single failure tolerated", "FS", "hh"},
		{"unhealthy after 3 failures", "FFF", "hhu"},
		{"failures must be consecutive", "FFSFF", "hhhhh"},
		{"healthy again after 2 successes", "FFFSS", "hhuuh"},
		{"success run must be consecutive", "FFFSFSS", "hhuuuuh"},
		{"stays unhealthy on more failures", "FFFFFF", "hhuuuu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCluster(t, Options{
				Endpoints: specs(1), Clock: newFakeClock(),
				HealthCheck: HealthCheck{Interval: time.Hour}, // defaults: 3 down, 2 up
			})
			e := c.Endpoints()[0]
			if !e.Healthy() {
				t.Fatal("endpoint does not start healthy")
			}
			var got strings.Builder
			for _, r := range tt.results {
				var err error
				if r == 'F' {
					err = errors.New("status 503")
				}
				c.recordCheck(e, err)
				if e.Healthy() {
					got.WriteByte('h')
				} else {
					got.WriteByte('u')
				}
			}
			if got.String() != tt.want {
				t.Fatalf("health after each check = %s, want %s", got.String(), tt.want)
			}
		})
	}
}

// toggleServer serves the health path with a status that the test switches.
type toggleServer struct {
	*httptest.Server
	status atomic.Int32
	hits   atomic.Int64
	mu     sync.Mutex
	paths  map[string]bool
}

func newToggleServer(t *testing.T) *toggleServer {
	s := &toggleServer{paths: map[string]bool{}}
	s.status.Store(http.StatusOK)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		s.mu.Lock()
		s.paths[r.URL.RequestURI()] = true
		s.mu.Unlock()
		w.WriteHeader(int(s.status.Load()))
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(s.Close)
	return s
}

func TestActiveHealthCheck(t *testing.T) {
	srv := newToggleServer(t)
	var logs bytes.Buffer
	var logMu sync.Mutex
	c := newTestCluster(t, Options{
		Endpoints: []EndpointSpec{{URL: srv.URL + "/v1"}},
		HealthCheck: HealthCheck{
			Path: "/healthz?full=1", Interval: 5 * time.Millisecond, Timeout: time.Second,
			UnhealthyThreshold: 2, HealthyThreshold: 2,
		},
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil)),
	})
	c.Start(t.Context())
	e := c.Endpoints()[0]

	waitFor(t, "first checks", func() bool { return srv.hits.Load() >= 2 })
	if !e.Healthy() {
		t.Fatal("unhealthy while the server answers 200")
	}
	srv.status.Store(http.StatusServiceUnavailable)
	waitFor(t, "unhealthy", func() bool { return !e.Healthy() })
	if _, err := c.Pick(nil); !errors.Is(err, ErrNoHealthyEndpoint) {
		t.Fatalf("Pick error = %v, want ErrNoHealthyEndpoint", err)
	}
	if s := c.Snapshot()[0]; s.Healthy || !strings.Contains(s.LastHealthError, "503") || s.LastHealthCheck.IsZero() {
		t.Fatalf("snapshot = %+v, want unhealthy with a 503 error", s)
	}
	srv.status.Store(http.StatusNoContent) // any 2xx
	waitFor(t, "healthy again", func() bool { return e.Healthy() })
	if _, err := c.Pick(nil); err != nil {
		t.Fatalf("Pick after recovery: %v", err)
	}

	srv.mu.Lock()
	paths := srv.paths
	srv.mu.Unlock()
	if len(paths) != 1 || !paths["/healthz?full=1"] {
		t.Fatalf("health checks requested %v, want only /healthz?full=1 (on the host, not under /v1)", paths)
	}
	c.Close()
	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	for _, want := range []string{"endpoint unhealthy", "endpoint healthy"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestHealthCheckTimeoutAndConnectError(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	// A listener that was closed: connection refused.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	c := newTestCluster(t, Options{
		Endpoints: []EndpointSpec{{URL: slow.URL}, {URL: deadURL}},
		HealthCheck: HealthCheck{
			Interval: 5 * time.Millisecond, Timeout: 20 * time.Millisecond, UnhealthyThreshold: 2,
		},
	})
	c.Start(t.Context())
	waitFor(t, "both unhealthy", func() bool {
		return !c.Endpoints()[0].Healthy() && !c.Endpoints()[1].Healthy()
	})
	if _, err := c.Pick(nil); !errors.Is(err, ErrNoHealthyEndpoint) {
		t.Fatalf("Pick error = %v, want ErrNoHealthyEndpoint", err)
	}
}

func TestHealthCheckStopsWithContext(t *testing.T) {
	srv := newToggleServer(t)
	c := newTestCluster(t, Options{
		Endpoints:   []EndpointSpec{{URL: srv.URL}},
		HealthCheck: HealthCheck{Interval: 2 * time.Millisecond},
	})
	ctx, cancel := context.WithCancel(t.Context())
	c.Start(ctx)
	c.Start(ctx) // second Start is a no-op
	waitFor(t, "a check", func() bool { return srv.hits.Load() > 0 })
	cancel()
	c.wg.Wait() // the checkers end with the context, before Close
	// A check sent just before the cancel may still reach the server after it: let it land,
	// then no new check may come (the interval is 2ms, so 20ms would show ten).
	time.Sleep(20 * time.Millisecond)
	n := srv.hits.Load()
	time.Sleep(20 * time.Millisecond)
	if got := srv.hits.Load(); got != n {
		t.Fatalf("%d checks after the context ended", got-n)
	}
	c.Close()
	c.Close() // safe twice
}

func TestHealthCheckDisabled(t *testing.T) {
	srv := newToggleServer(t)
	c := newTestCluster(t, Options{Endpoints: []EndpointSpec{{URL: srv.URL}}})
	c.Start(t.Context())
	time.Sleep(20 * time.Millisecond)
	if n := srv.hits.Load(); n != 0 {
		t.Fatalf("%d health checks with Interval 0", n)
	}
	if !c.Endpoints()[0].Healthy() {
		t.Fatal("unhealthy with checks disabled")
	}
}

func TestStartAfterCloseDoesNothing(t *testing.T) {
	srv := newToggleServer(t)
	c := newTestCluster(t, Options{
		Endpoints:   []EndpointSpec{{URL: srv.URL}},
		HealthCheck: HealthCheck{Interval: time.Millisecond},
	})
	c.Close()
	c.Start(t.Context())
	time.Sleep(20 * time.Millisecond)
	if n := srv.hits.Load(); n != 0 {
		t.Fatalf("%d health checks after Close", n)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestHealthPathFallback: with no configured path, a server without /health (it answers 404
// there, as Ollama does) is checked on /v1/models instead and stays healthy; a server whose
// /health answers 503 is unhealthy (a failing path is not a missing one); a configured
// path is the only one asked. The cluster's credential goes with each check.
func TestHealthPathFallback(t *testing.T) {
	type server struct {
		health int // status of /health (0: 200)
		models int // status of /v1/models (0: 200)
	}
	for _, tc := range []struct {
		name    string
		path    string
		srv     server
		healthy bool
		asked   []string // paths asked, in first-asked order
	}{
		{"vLLM: /health exists", "", server{}, true, []string{"/health"}},
		{"no /health: /v1/models", "", server{health: 404}, true, []string{"/health", "/v1/models"}},
		{"405 is missing too", "", server{health: 405}, true, []string{"/health", "/v1/models"}},
		{"/health failing is not missing", "", server{health: 503}, false, []string{"/health"}},
		{"neither exists", "", server{health: 404, models: 404}, false, []string{"/health", "/v1/models"}},
		{"configured path only", "/health", server{health: 404}, false, []string{"/health"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var asked []string
			auth := map[string]string{}
			perPath := map[string]int{}
			hits := atomic.Int64{}
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				mu.Lock()
				if !slices.Contains(asked, r.URL.Path) {
					asked = append(asked, r.URL.Path)
				}
				auth[r.URL.Path] = r.Header.Get("Authorization")
				perPath[r.URL.Path]++
				mu.Unlock()
				st := 0
				switch r.URL.Path {
				case "/health":
					st = tc.srv.health
				case "/v1/models":
					st = tc.srv.models
				}
				if st != 0 {
					w.WriteHeader(st)
				}
			}))
			t.Cleanup(ts.Close)
			c := newTestCluster(t, Options{
				Endpoints: []EndpointSpec{{URL: ts.URL}},
				HealthCheck: HealthCheck{Path: tc.path, Interval: 2 * time.Millisecond, Timeout: time.Second,
					UnhealthyThreshold: 2},
				Authorization: "Bearer k",
			})
			c.Start(t.Context())
			waitFor(t, "ten checks", func() bool { return hits.Load() >= 10 })
			c.Close()
			if got := c.Endpoints()[0].Healthy(); got != tc.healthy {
				t.Errorf("healthy %v, want %v (%+v)", got, tc.healthy, c.Snapshot()[0])
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(asked, tc.asked) {
				t.Errorf("paths asked %v, want %v", asked, tc.asked)
			}
			for p, a := range auth {
				if a != "Bearer k" {
					t.Errorf("%s asked with Authorization %q, want the cluster's credential", p, a)
				}
			}
			if tc.healthy && len(tc.asked) == 2 {
				// The path found is remembered: /health is not asked again on every check.
				if perPath["/health"] != 1 || perPath["/v1/models"] < 9 {
					t.Errorf("requests by path %v: the found path is not remembered", perPath)
				}
			}
		})
	}
}
