package e2e

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/sim"
)

// TestReadyClusters: with admin.ready_clusters, /readyz is 503 until the model server has
// passed a health check (a sidecar's vLLM loading its weights), 200 while it is healthy, 503
// again once it fails its checks, and says why.
func TestReadyClusters(t *testing.T) {
	model := sim.New(sim.Config{})
	t.Cleanup(model.Close)
	var healthy, listed atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path == "/v1/models" && listed.CompareAndSwap(false, true) {
			// The first model list is slow: the gateway's /v1/models, asked as /readyz
			// turns 200, waits for the fetch in flight rather than answer an empty list.
			time.Sleep(300 * time.Millisecond)
		}
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	g := startGateway(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, ready_clusters: [local]}
clusters:
  - name: local
    endpoints: [{url: `+up.URL+`}]
    health_check: {path: /health, interval: 50ms, timeout: 1s, unhealthy_threshold: 2, healthy_threshold: 1}
routes:
  - {name: all, cluster: local}
`)
	hc := newHTTPClient(t)
	readyz := func() (int, string) {
		resp, body := do(t, hc, http.MethodGet, "http://"+g.admin+"/readyz", "")
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	// Wait for the given status, for at most 5 s (the checks run every 50 ms).
	await := func(want int) string {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			code, body := readyz()
			if code == want {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz = %d %q, want %d", code, body, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Several checks have failed by now; it never was ready.
	time.Sleep(200 * time.Millisecond)
	if code, body := readyz(); code != http.StatusServiceUnavailable || body != "not ready: cluster local has no healthy endpoint" {
		t.Fatalf("/readyz while the model server loads = %d %q", code, body)
	}
	healthy.Store(true)
	if body := await(http.StatusOK); body != "ready" {
		t.Errorf("/readyz body %q", body)
	}
	if resp, body := do(t, hc, http.MethodGet, "http://"+g.addr+"/v1/models", ""); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"sim-llama"`) {
		t.Errorf("/v1/models as /readyz turned 200: %d %s", resp.StatusCode, body)
	}
	healthy.Store(false)
	await(http.StatusServiceUnavailable)
}

// TestReadyClustersBeforeAnyCheck: an endpoint is healthy until proven otherwise for
// picking, but not ready before a check has passed.
func TestReadyClustersBeforeAnyCheck(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "loading", http.StatusServiceUnavailable)
	}))
	t.Cleanup(up.Close)
	g := startGateway(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, ready_clusters: [local]}
clusters:
  - name: local
    endpoints: [{url: `+up.URL+`}]
    health_check: {path: /health, interval: 1h, timeout: 1s, unhealthy_threshold: 100}
routes:
  - {name: all, cluster: local}
`)
	// The first check has failed (unhealthy_threshold 100 keeps it "healthy" for picking).
	time.Sleep(100 * time.Millisecond)
	resp, body := do(t, newHTTPClient(t), http.MethodGet, "http://"+g.admin+"/readyz", "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d %s before any check passed", resp.StatusCode, body)
	}
}

// TestMetricsToken: with admin.metrics_token_env, /metrics needs that bearer token (or the
// admin token), answers 401 in OpenAI's error shape otherwise, and the probes stay open.
func TestMetricsToken(t *testing.T) {
	t.Setenv("SLUICE_METRICS_TOKEN", "scrape-1")
	t.Setenv("SLUICE_ADMIN_TOKEN", "admin-1")
	s := startSim(t, sim.Config{})
	g := startGateway(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, metrics_token_env: SLUICE_METRICS_TOKEN}
clusters:
  - {name: main, endpoints: [{url: `+s.URL+`}]}
routes:
  - {name: all, cluster: main}
`)
	hc := newHTTPClient(t)
	for _, tt := range []struct {
		path, auth string
		status     int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "Bearer wrong", http.StatusUnauthorized},
		{"/metrics", "scrape-1", http.StatusUnauthorized},
		{"/metrics", "Bearer scrape-1", http.StatusOK},
		{"/metrics", "Bearer admin-1", http.StatusOK},
		{"/admin/config", "Bearer scrape-1", http.StatusUnauthorized}, // a scrape token grants nothing else
		{"/admin/config", "Bearer admin-1", http.StatusOK},
		{"/healthz", "", http.StatusOK},
		{"/readyz", "", http.StatusOK},
	} {
		var hdr []string
		if tt.auth != "" {
			hdr = []string{"Authorization", tt.auth}
		}
		resp, body := do(t, hc, http.MethodGet, "http://"+g.admin+tt.path, "", hdr...)
		if resp.StatusCode != tt.status {
			t.Errorf("%s with %q: %d, want %d", tt.path, tt.auth, resp.StatusCode, tt.status)
		}
		if tt.path == "/metrics" && tt.status == http.StatusUnauthorized && !strings.Contains(string(body), `"code":"invalid_metrics_token"`) {
			t.Errorf("%s with %q: body %s", tt.path, tt.auth, body)
		}
		if tt.path == "/metrics" && tt.status == http.StatusOK && !strings.Contains(string(body), "# TYPE") {
			t.Errorf("%s with %q: not an exposition: %.200s", tt.path, tt.auth, body)
		}
	}
}
