package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
)

// startTestServer runs a gateway on a YAML config until the test ends.
func startTestServer(t *testing.T, yaml string) *Server {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	srv, err := New(Options{Config: cfg, Logger: slog.New(slog.DiscardHandler)})
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
	return srv
}

func post(t *testing.T, hc *http.Client, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBatchedAnswersGiveBackTheirBuffers: the merged request of a batch holds answer buffers
// like any request; they are given back when it is answered, so batched traffic never uses up
// limits.max_buffered_total.
func TestBatchedAnswersGiveBackTheirBuffers(t *testing.T) {
	var noID atomic.Int64 // merged requests that reached the server without an X-Request-Id
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Request-Id") == "" {
			noID.Add(1)
		}
		b, _ := io.ReadAll(r.Body)
		n := strings.Count(string(b), `"in-`)
		w.Header().Set("Content-Type", "application/json")
		var out strings.Builder
		out.WriteString(`{"object":"list","model":"m","data":[`)
		for i := range n {
			if i > 0 {
				out.WriteByte(',')
			}
			fmt.Fprintf(&out, `{"object":"embedding","index":%d,"embedding":[0.1,0.2,0.3]}`, i)
		}
		out.WriteString(`],"usage":{"prompt_tokens":1,"total_tokens":1}}`)
		_, _ = io.WriteString(w, out.String())
	}))
	defer up.Close()
	srv := startTestServer(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: a, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: embed
    cluster: a
    policies:
      - {type: batch, params: {min_window: 1ms, max_window: 2ms}}
`, up.URL))
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _ := post(t, hc, "http://"+srv.Addr()+"/v1/embeddings", fmt.Sprintf(`{"model":"m","input":"in-%d"}`, i))
			if st != http.StatusOK {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d batched requests failed", n)
	}
	if n := noID.Load(); n != 0 {
		t.Errorf("%d merged requests reached the model server without an X-Request-Id", n)
	}
	waitFor(t, "the answer buffers all given back", func() bool { return srv.buffers.used.Load() == 0 })
}

// TestRetriedAnswerGivesBackItsBuffer: a buffered answer that is retried (a 5xx) gives its
// room back before the next attempt: a request retried many times holds one answer's room.
func TestRetriedAnswerGivesBackItsBuffer(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", fmt.Sprint(1<<20))
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, strings.Repeat(" ", 1<<20))
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	defer up.Close()
	defer close(release)
	srv := startTestServer(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: a, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: chat
    cluster: a
    retry: {attempts: 2, budget: 1, min_retries_per_second: 10, backoff_base: 1ms, backoff_max: 2ms}
`, up.URL))
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	done := make(chan int, 1)
	go func() {
		st, _ := post(t, hc, "http://"+srv.Addr()+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		done <- st
	}()
	waitFor(t, "the retry sent", func() bool { return calls.Load() == 2 })
	if n := srv.buffers.used.Load(); n != 0 {
		t.Errorf("during the retry the first attempt's answer still holds %d bytes of the answer buffers", n)
	}
	release <- struct{}{}
	if st := <-done; st != http.StatusOK {
		t.Errorf("status %d", st)
	}
	waitFor(t, "the answer buffers all given back", func() bool { return srv.buffers.used.Load() == 0 })
}

// TestPipelinedRequestsNeverReadAreDropped: a client that pipelines requests on one
// connection and never reads the answers holds it no longer than the write time-out: every
// write the server does for a request is bounded, the final flush after the handler returns
// and preflights (which Sluice answers itself) included.
func TestPipelinedRequestsNeverReadAreDropped(t *testing.T) {
	srv := startTestServer(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
timeouts: {write: 500ms}
clusters:
  - {name: a, endpoints: [{url: "http://127.0.0.1:1"}], health_check: {disabled: true}}
routes:
  - {name: r, cluster: a}
`)
	for _, tc := range []struct{ name, req string }{
		{"unknown path", "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"preflight", "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://a.example\r\nAccess-Control-Request-Method: POST\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
			}}
			c, err := d.Dial("tcp", srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			waitFor(t, "the connection accepted", func() bool { return srv.apiLn.Load().Open() == 1 })
			// Write requests (never reading an answer) until the server stops taking them.
			batch := []byte(strings.Repeat(tc.req, 64))
			stop := time.Now().Add(10 * time.Second)
			go func() {
				for time.Now().Before(stop) {
					_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
					if _, err := c.Write(batch); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
						return // the server closed the connection
					}
				}
			}()
			start := time.Now()
			for srv.apiLn.Load().Open() != 0 {
				if time.Now().After(stop) {
					t.Fatalf("the connection still open after %v (write time-out 500ms)", time.Since(start).Round(time.Millisecond))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestWriteTimeoutBelowASecond: a write time-out under a second bounds a write, not the
// stream: a client that reads gets a stream whose events come every 100ms whole, with
// timeouts.write 500ms.
func TestWriteTimeoutBelowASecond(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 20 {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	srv := startTestServer(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
timeouts: {write: 500ms}
clusters:
  - {name: a, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - {name: r, cluster: a}
`, up.URL))
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	st, body := post(t, hc, "http://"+srv.Addr()+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if st != http.StatusOK || !strings.Contains(body, "t19 ") || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Contains(body, "error") {
		t.Fatalf("status %d, the stream cut:\n%s", st, body)
	}
}

// TestConnectionsPerClientOnlyWhenClientsAreKnown: limits.max_connections_per_client applies
// by default only with trusted_proxies: without them the peer may be a load balancer or a
// sidecar carrying every client, which a per-address bound would cut off. A value set applies
// always (clients connect directly); -1 turns it off.
func TestConnectionsPerClientOnlyWhenClientsAreKnown(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       int
	}{
		{"default, no trusted proxies", "", 0},
		{"default, trusted proxies", "trusted_proxies: [10.0.0.0/8]\n", config.DefaultMaxConnectionsPerClient},
		{"set, no trusted proxies", "limits: {max_connections_per_client: 8}\n", 8},
		{"set, trusted proxies", "trusted_proxies: [10.0.0.0/8]\nlimits: {max_connections_per_client: 8}\n", 8},
		{"off", "trusted_proxies: [10.0.0.0/8]\nlimits: {max_connections_per_client: -1}\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startTestServer(t, tc.yaml+"listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n  - {name: a, endpoints: [{url: \"http://127.0.0.1:1\"}], health_check: {disabled: true}}\nroutes:\n  - {name: r, cluster: a}\n")
			if _, per, _ := srv.connectionBounds(); per != tc.want {
				t.Errorf("per-client bound %d, want %d", per, tc.want)
			}
		})
	}
	if _, err := config.Parse([]byte("limits: {max_connections_per_client: -2}\nclusters:\n  - {name: a, endpoints: [{url: \"http://127.0.0.1:1\"}]}\nroutes:\n  - {name: r, cluster: a}\n")); err == nil ||
		!strings.Contains(err.Error(), "limits.max_connections_per_client") {
		t.Errorf("-2 accepted: %v", err)
	}

	// The listener: without trusted proxies, a load balancer's 600 connections all stay open.
	srv := startTestServer(t, "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n  - {name: a, endpoints: [{url: \"http://127.0.0.1:1\"}], health_check: {disabled: true}}\nroutes:\n  - {name: r, cluster: a}\n")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range config.DefaultMaxConnectionsPerClient + 88 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	waitFor(t, "every connection accepted", func() bool { return srv.apiLn.Load().Open() == len(conns) })
	if n := srv.apiLn.Load().rejectedClient.Load(); n != 0 {
		t.Errorf("%d connections of the one peer refused without trusted proxies", n)
	}
}
