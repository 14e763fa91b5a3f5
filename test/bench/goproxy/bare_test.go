package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// seen is what the upstream recorded of one request.
type seen struct {
	userAgent, keepAlive, connection, body string
}

// upstreamServer answers every request with its body, once with a Content-Length and once
// (?stream) chunked, and records what each request carried.
func upstreamServer(t *testing.T) (*httptest.Server, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.UserAgent(), r.Header.Get("Keep-Alive"), r.Header.Get("Connection"), string(b)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Has("stream") {
			w.(http.Flusher).Flush() // no Content-Length: chunked
		}
		_, _ = w.Write([]byte(`{"echo":` + string(b) + `}`))
	}))
	t.Cleanup(srv.Close)
	return srv, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

// post sends body to url with a hop-by-hop header a proxy must drop and no User-Agent, and
// returns the status and the answer's body.
func post(t *testing.T, c *http.Client, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Keep-Alive", "timeout=5")
	req.Header.Set("User-Agent", "") // none: the upstream sees the forwarding client's own
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// fasthttp keeps goroutines of its own that no API stops: the server's date ticker (for
// the process's life), and cleaners that sleep 10 s between passes (the worker pool's, the
// client's connections', the dialer's address cache). Any other goroutine is a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	)
}

func TestBareProxies(t *testing.T) {
	cases := []struct {
		name string
		// start serves the bare proxy to target on ln and returns how to stop it.
		start func(t *testing.T, target string, ln net.Listener) (stop func())
		// userAgent is what the upstream must see: the own proxy's requests must go through
		// Sluice's own HTTP/1.1 client ("sluice"), not net/http's Transport ("Go-http-client"),
		// or the benchmark would measure the wrong machinery.
		userAgent string
	}{
		{name: "own machinery", userAgent: "sluice", start: func(t *testing.T, target string, ln net.Listener) func() {
			h, closeFn, err := ownProxy(target)
			if err != nil {
				t.Fatal(err)
			}
			srv := ownServer(h)
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			return func() {
				_ = srv.Close()
				if err := <-done; !errors.Is(err, http.ErrServerClosed) {
					t.Errorf("Serve: %v", err)
				}
				closeFn()
			}
		}},
		{name: "fasthttp", userAgent: "fasthttp", start: func(t *testing.T, target string, ln net.Listener) func() {
			h, closeFn, err := fastProxy(target)
			if err != nil {
				t.Fatal(err)
			}
			srv := fastServer(h)
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			return func() {
				if err := srv.Shutdown(); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
				if err := <-done; err != nil {
					t.Errorf("Serve: %v", err)
				}
				closeFn()
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up, requests := upstreamServer(t)
			ln := listen(t)
			stop := tc.start(t, up.URL, ln)
			defer stop()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			base := "http://" + ln.Addr().String() + "/v1/chat/completions"
			for i, path := range []string{base, base, base + "?stream"} {
				body := `{"model":"m","n":` + string(rune('0'+i)) + `}`
				status, got := post(t, c, path, body)
				if status != http.StatusOK || got != `{"echo":`+body+`}` {
					t.Errorf("request %d: %d %q, want 200 with the echo of %q", i, status, got, body)
				}
			}
			got := requests()
			if len(got) != 3 {
				t.Fatalf("upstream saw %d requests, want 3", len(got))
			}
			for i, r := range got {
				if r.keepAlive != "" || strings.EqualFold(r.connection, "keep-alive") {
					t.Errorf("request %d: hop-by-hop headers forwarded: Keep-Alive %q, Connection %q", i, r.keepAlive, r.connection)
				}
				if r.userAgent != tc.userAgent {
					t.Errorf("request %d: upstream saw User-Agent %q, want %q", i, r.userAgent, tc.userAgent)
				}
			}
		})
	}
}

func TestFastProxyRefusesOtherTargets(t *testing.T) {
	for _, target := range []string{"https://127.0.0.1:1", "127.0.0.1:1", "http://"} {
		if _, _, err := fastProxy(target); err == nil {
			t.Errorf("fastProxy(%q): no error", target)
		}
	}
}
