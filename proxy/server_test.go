package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/heapfloor"
	"github.com/sluicegw/sluice/proxy/procs"
)

// countingUpstream counts health checks and metrics scrapes.
type countingUpstream struct {
	*httptest.Server
	health, scrapes atomic.Int64
}

func newCountingUpstream(t *testing.T) *countingUpstream {
	t.Helper()
	u := &countingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			u.health.Add(1)
		case "/metrics":
			u.scrapes.Add(1)
			fmt.Fprintln(w, "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1")
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func countingConfig(t *testing.T, version string, u *countingUpstream) *config.Config {
	t.Helper()
	cfg, err := config.Parse(fmt.Appendf(nil, `# %s
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
load_signals: {interval: 10ms, disable_nvml: true}
clusters:
  - name: main
    endpoints: [{url: %q, metrics: %q}]
    health_check: {interval: 10ms}
routes:
  - {name: chat, cluster: main}
`, version, u.URL, u.URL+"/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestCheckHasNoSideEffects: checking a config (what the xDS client does before it ACKs one)
// starts no health check against its endpoints and leaves the load-signal scraper on the
// serving config's endpoints.
func TestCheckHasNoSideEffects(t *testing.T) {
	serving, checked := newCountingUpstream(t), newCountingUpstream(t)
	srv, err := New(Options{Config: countingConfig(t, "serving", serving), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	waitFor(t, "the serving endpoint's first health check and scrape", func() bool {
		return serving.health.Load() > 0 && serving.scrapes.Load() > 0
	})
	if err := srv.Check(countingConfig(t, "checked", checked)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	h0, s0 := serving.health.Load(), serving.scrapes.Load()
	waitFor(t, "more checks and scrapes of the serving endpoint after Check", func() bool {
		return serving.health.Load() >= h0+5 && serving.scrapes.Load() >= s0+5
	})
	if h, sc := checked.health.Load(), checked.scrapes.Load(); h != 0 || sc != 0 {
		t.Errorf("the checked config's endpoint got %d health checks and %d scrapes, want none", h, sc)
	}
	if _, ok := srv.scraper.Get(serving.URL); !ok {
		t.Error("after Check the scraper no longer holds the serving endpoint's load")
	}
}

// waitFor polls cond every 5ms for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServerHoldsTheProcessorController: a started server holds the process's processor
// controller (procs: adaptive, the default) and the collector's heap floor (heap_floor, but
// not at the runtime's own 4MiB) until it shuts down; procs: fixed holds no controller.
func TestServerHoldsTheProcessorController(t *testing.T) {
	floor := 1
	if os.Getenv("GOGC") != "" {
		floor = 0 // an operator's GOGC is kept
	}
	for _, tc := range []struct {
		procs, heapFloor string
		held, floors     int
	}{{"", "", 1, floor}, {"adaptive", "64MiB", 1, floor}, {"fixed", "4MiB", 0, 0}} {
		t.Run("procs="+tc.procs, func(t *testing.T) {
			extra := ""
			if tc.heapFloor != "" {
				extra = "heap_floor: " + tc.heapFloor + "\n"
			}
			cfg, err := config.Parse([]byte("listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nprocs: \"" + tc.procs + "\"\n" + extra +
				"clusters: [{name: main, endpoints: [{url: \"http://127.0.0.1:1\"}], health_check: {disabled: true}}]\n" +
				"routes: [{name: all, cluster: main}]\n"))
			if err != nil {
				t.Fatal(err)
			}
			srv, err := New(Options{Config: cfg, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			before, floorsBefore := procs.Held(), heapfloor.Held()
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			if got := procs.Held() - before; got != tc.held {
				t.Errorf("a started server holds %d controllers, want %d", got, tc.held)
			}
			if got := heapfloor.Held() - floorsBefore; got != tc.floors {
				t.Errorf("a started server holds %d heap floors, want %d", got, tc.floors)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if got := procs.Held(); got != before {
				t.Errorf("%d holders after shutdown, want %d", got, before)
			}
			if got := heapfloor.Held(); got != floorsBefore {
				t.Errorf("%d heap floors after shutdown, want %d", got, floorsBefore)
			}
		})
	}
}
