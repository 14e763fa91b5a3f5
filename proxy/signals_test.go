package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/gpu"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/test/sim"
)

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func adminGet(t *testing.T, srv *Server, path string, v any) string {
	t.Helper()
	resp, err := http.Get("http://" + srv.AdminAddr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v: %s", path, resp.StatusCode, err, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return string(b)
}

// TestFlaggedEndpointShown: a model server whose KV cache leaks is flagged by the gateway's
// scraper and shown everywhere an operator looks: /admin/gpu (the check, why), the cluster's
// endpoints at /admin/endpoints (the flags, the lowered weight), /metrics
// (sluice_endpoint_flagged and sluice_endpoint_flags_total per endpoint and check) and the
// log, entering and leaving; when the leak is freed the flag clears.
func TestFlaggedEndpointShown(t *testing.T) {
	leaky := sim.New(sim.Config{ITL: time.Millisecond, KVTokens: 10000})
	clean := sim.New(sim.Config{ITL: time.Millisecond, KVTokens: 10000})
	var urls []string
	for _, s := range []*sim.Server{leaky, clean} {
		ts := httptest.NewServer(s)
		t.Cleanup(func() { ts.Close(); s.Close() })
		urls = append(urls, ts.URL)
	}
	cfg, err := config.Parse(fmt.Appendf(nil, `
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
load_signals:
  interval: 10ms
  disable_nvml: true
  checks: {kv_leak: {for: 50ms}}
clusters:
  - name: main
    endpoints: [{url: %[1]q, metrics: %[1]q}, {url: %[2]q, metrics: %[2]q}]
    health_check: {disabled: true}
routes:
  - {name: chat, cluster: main}
`, urls[0], urls[1]))
	if err != nil {
		t.Fatal(err)
	}
	// The metrics URLs above are the servers' roots: point them at /metrics.
	for i := range cfg.Clusters[0].Endpoints {
		cfg.Clusters[0].Endpoints[i].Metrics += "/metrics"
	}
	logs := &lockedBuffer{}
	srv, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(logs, nil))})
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

	leaky.SetKVLeak(6000)
	waitFor(t, "the leak flagged", func() bool {
		l, ok := srv.scraper.Get(urls[0])
		return ok && l.Flags.Has(gpu.FlagKVLeak)
	})

	var snap gpu.Snapshot
	adminGet(t, srv, "/admin/gpu", &snap)
	var leakCheck *gpu.CheckStatus
	for _, e := range snap.Endpoints {
		for i, c := range e.Checks {
			if e.Endpoint == urls[0] && c.Check == "kv_leak" {
				leakCheck = &e.Checks[i]
			}
			if e.Endpoint == urls[1] && c.Flagged {
				t.Errorf("clean endpoint flagged: %+v", c)
			}
		}
	}
	if leakCheck == nil || !leakCheck.Flagged || leakCheck.TimesFlagged != 1 || !strings.Contains(leakCheck.Detail, "KV cache 60% used") {
		t.Fatalf("/admin/gpu: %+v", snap.Endpoints)
	}
	var eps map[string][]upstream.EndpointStatus
	adminGet(t, srv, "/admin/endpoints", &eps)
	if st := eps["main"]; len(st) != 2 || strings.Join(st[0].Flags, ",") != "kv_leak" || st[0].EffectiveWeight != 0.1 ||
		st[1].Flags != nil || st[1].EffectiveWeight != 1 {
		t.Fatalf("/admin/endpoints: %+v", st)
	}
	m := adminGet(t, srv, "/metrics", nil)
	for _, want := range []string{
		fmt.Sprintf(`sluice_endpoint_flagged{check="kv_leak",endpoint=%q} 1`, urls[0]),
		fmt.Sprintf(`sluice_endpoint_flagged{check="stall",endpoint=%q} 0`, urls[0]),
		fmt.Sprintf(`sluice_endpoint_flagged{check="kv_leak",endpoint=%q} 0`, urls[1]),
		fmt.Sprintf(`sluice_endpoint_flags_total{check="kv_leak",endpoint=%q} 1`, urls[0]),
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(logs.String(), `msg="gpu: endpoint flagged" endpoint=`+urls[0]+` check=kv_leak`) {
		t.Errorf("no log line on flagging:\n%s", logs)
	}

	leaky.SetKVLeak(0)
	waitFor(t, "the flag cleared", func() bool {
		l, ok := srv.scraper.Get(urls[0])
		return ok && l.Flags == 0
	})
	if m := adminGet(t, srv, "/metrics", nil); !strings.Contains(m, fmt.Sprintf(`sluice_endpoint_flagged{check="kv_leak",endpoint=%q} 0`, urls[0])) {
		t.Error("gauge not back to 0")
	}
	if !strings.Contains(logs.String(), `msg="gpu: endpoint flag cleared" endpoint=`+urls[0]+` check=kv_leak`) {
		t.Errorf("no log line on clearing:\n%s", logs)
	}
}
