package e2e

import (
	"net/http"
	"sync"
	"testing"
)

// TestPathPreserved: the request path reaches the upstream as the client escaped it (a model
// id with a slash is one path segment: /v1/models/org%2Fmodel), with its query.
func TestPathPreserved(t *testing.T) {
	var (
		mu   sync.Mutex
		uris []string
	)
	rec := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		uris = append(uris, r.RequestURI)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"org/model","object":"model","created":1,"owned_by":"x"}`))
	})
	// An endpoint with a path prefix: the request path is appended to it.
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n", "", rec.URL+"/prefix%2Fx/"))
	hc := newHTTPClient(t)
	tests := []struct{ path, want string }{
		{"/v1/models/org%2Fmodel", "/prefix%2Fx/v1/models/org%2Fmodel"},
		{"/v1/models/plain?x=1&y=%2F", "/prefix%2Fx/v1/models/plain?x=1&y=%2F"},
		{"/v1/models/a%20b", "/prefix%2Fx/v1/models/a%20b"},
	}
	for _, tt := range tests {
		resp, b := do(t, hc, "GET", "http://"+g.addr+tt.path, "")
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tt.path, resp.StatusCode, b)
		}
		mu.Lock()
		got := uris[len(uris)-1]
		mu.Unlock()
		if got != tt.want {
			t.Errorf("client path %s reached the upstream as %s, want %s", tt.path, got, tt.want)
		}
	}

	// The official client escapes a model id with a slash the same way.
	client := newClient(t, g.addr)
	m, err := client.Models.Get(testCtx(t), "org/model")
	if err != nil || m.ID != "org/model" {
		t.Fatalf("Models.Get: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := uris[len(uris)-1]; got != "/prefix%2Fx/v1/models/org%2Fmodel" {
		t.Errorf("openai-go Models.Get reached the upstream as %s", got)
	}
}
