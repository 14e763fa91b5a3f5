package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// seen is what the upstream recorded of one request.
type seen struct {
	userAgent, keepAlive, named, body string
}

// upstreamServer answers every request with its body, with a Content-Length or (?stream)
// chunked, or (?cut) cut short: 10 bytes short of its Content-Length, or without the last
// chunk; each answer carries hop-by-hop headers a
// proxy must drop (Keep-Alive, and X-Up named by Connection). It records what each request
// carried.
func upstreamServer(t *testing.T) (*httptest.Server, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.UserAgent(), r.Header.Get("Keep-Alive"), r.Header.Get("X-Hop"), string(b)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Keep-Alive", "timeout=9")
		w.Header().Set("Connection", "X-Up")
		w.Header().Set("X-Up", "1")
		answer := `{"echo":` + string(b) + `}`
		switch q := r.URL.Query(); {
		case q.Has("cut") && q.Has("stream"):
			w.(http.Flusher).Flush()
			_, _ = w.Write([]byte(answer))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // no last chunk
		case q.Has("stream"):
			w.(http.Flusher).Flush() // no Content-Length: chunked
		case q.Has("cut"):
			w.Header().Set("Content-Length", strconv.Itoa(len(answer)+10))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte(answer))
			panic(http.ErrAbortHandler) // the connection closes 10 bytes short
		}
		_, _ = w.Write([]byte(answer))
	}))
	t.Cleanup(srv.Close)
	return srv, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

// post sends body to url with hop-by-hop headers a proxy must drop (Keep-Alive, and X-Hop
// named by Connection) and no User-Agent, and returns the answer, its body read whole (err:
// the reading's failure).
func post(t *testing.T, c *http.Client, url, body string) (resp *http.Response, got string, err error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Keep-Alive", "timeout=5")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "1")
	req.Header.Set("User-Agent", "") // none: the upstream sees the forwarding client's own
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// closeRequest sends one request with Connection: close on a new connection and reads until
// the server closes it (within 5 s).
func closeRequest(addr string) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	const req = "POST /v1/chat/completions HTTP/1.1\r\nHost: bare\r\nConnection: close\r\n" +
		"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	if _, err := io.WriteString(c, req); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// serving runs serve in a goroutine and returns what stops it: shut, then the end of serve
// (which must return want), then release.
func serving(t *testing.T, serve, shut func() error, want error, release func()) (stop func()) {
	done := make(chan error, 1)
	go func() { done <- serve() }()
	return func() {
		if err := shut(); err != nil {
			t.Errorf("shutting down: %v", err)
		}
		if err := <-done; !errors.Is(err, want) {
			t.Errorf("serve ended with %v, want %v", err, want)
		}
		release()
	}
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
			return serving(t, func() error { return srv.Serve(ln) }, srv.Close, http.ErrServerClosed, closeFn)
		}},
		{name: "fasthttp", userAgent: "fasthttp", start: func(t *testing.T, target string, ln net.Listener) func() {
			h, closeFn, err := fastProxy(target)
			if err != nil {
				t.Fatal(err)
			}
			srv := fastServer(h)
			return serving(t, func() error { return srv.Serve(ln) }, srv.Shutdown, nil, closeFn)
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
				resp, got, err := post(t, c, path, body)
				if err != nil || resp.StatusCode != http.StatusOK || got != `{"echo":`+body+`}` {
					t.Errorf("request %d: %d %q (%v), want 200 with the echo of %q", i, resp.StatusCode, got, err, body)
				}
				if ka, up := resp.Header.Get("Keep-Alive"), resp.Header.Get("X-Up"); ka != "" || up != "" {
					t.Errorf("request %d: the answer's hop-by-hop headers came through: Keep-Alive %q, X-Up %q", i, ka, up)
				}
			}
			// A client that says Connection: close gets the answer, then the end of the
			// connection (a kept-alive one would make the read wait out its deadline).
			if got, err := closeRequest(ln.Addr().String()); err != nil || !strings.HasPrefix(got, "HTTP/1.1 200") {
				t.Errorf("Connection: close: %q, %v; want a 200 and the connection closed", got, err)
			}
			// An answer the upstream cut short must reach the client cut, not complete.
			for _, q := range []string{"?cut", "?cut&stream"} {
				if resp, got, err := post(t, c, base+q, `{}`); err == nil && resp.StatusCode == http.StatusOK {
					t.Errorf("%s: a cut answer came through whole: %q", q, got)
				}
			}
			got := requests()
			if len(got) != 6 {
				t.Fatalf("upstream saw %d requests, want 6", len(got))
			}
			for i, r := range got {
				if r.keepAlive != "" || r.named != "" {
					t.Errorf("request %d: hop-by-hop headers forwarded: Keep-Alive %q, X-Hop %q", i, r.keepAlive, r.named)
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

// A body over the own proxy's bound is refused whole (413), not sent cut.
func TestOwnProxyRefusesLargeBodies(t *testing.T) {
	up, requests := upstreamServer(t)
	h, closeFn, err := ownProxy(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(strings.Repeat("x", maxBody+1)))
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", rec.Code)
	}
	if n := len(requests()); n != 0 {
		t.Errorf("the upstream saw %d requests, want none", n)
	}
}
