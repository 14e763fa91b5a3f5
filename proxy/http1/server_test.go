package http1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/proxy/scope"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testServer runs a Server on 127.0.0.1 whose own handler answers "own" and whose fallback
// answers "fallback", both after calling h when set.
type testServer struct {
	s    *Server
	addr string
	own  atomic.Int64
	fb   atomic.Int64
}

func startServer(t *testing.T, h http.HandlerFunc, tweak func(*Server)) *testServer {
	t.Helper()
	ts := &testServer{}
	wrap := func(who string, n *atomic.Int64) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.Header().Set("X-Served-By", who)
			if h != nil {
				h(w, r)
				return
			}
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, who)
		})
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	fb := &http.Server{Handler: wrap("fallback", &ts.fb), ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 64 << 10, Protocols: &protos,
		ErrorLog: log.New(io.Discard, "", 0)}
	ts.s = &Server{Handler: wrap("own", &ts.own), Fallback: fb, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, WatchAfter: time.Millisecond}
	if tweak != nil {
		tweak(ts.s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- ts.s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := ts.s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return ts
}

// raw sends req on a new connection and returns everything the server sent until it closed
// the connection (or 2 s passed).
func raw(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

func TestServesOrHandsOff(t *testing.T) {
	ts := startServer(t, nil, nil)
	const body = `{"a":1}`
	for _, tc := range []struct {
		name, req string
		want      []string // in the answer, in order
		by        string   // who served: own or fallback ("" when net/http refused it)
	}{
		{"POST with a body", "POST /v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 7\r\nConnection: close\r\n\r\n" + body,
			[]string{"HTTP/1.1 200 OK\r\n", "Content-Length: 3\r\n", "Date: ", "Connection: close\r\n", "\r\nown"}, "own"},
		{"GET, LF-only lines", "GET / HTTP/1.1\nHost: h\nConnection: close\n\n", []string{"HTTP/1.1 200 OK\r\n", "own"}, "own"},
		{"HTTP/1.0", "GET / HTTP/1.0\r\n\r\n", []string{"HTTP/1.0 200 OK", "fallback"}, "fallback"},
		{"chunked body", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n7\r\n" + body + "\r\n0\r\n\r\n",
			[]string{"200 OK", "fallback"}, "fallback"},
		{"Expect", "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 7\r\nConnection: close\r\n\r\n" + body,
			[]string{"200 OK", "fallback"}, "fallback"},
		{"Upgrade", "GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: close\r\n\r\n", []string{"fallback"}, "fallback"},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", []string{"HTTP/1.1 400 Bad Request", "missing required Host header"}, ""},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", []string{"HTTP/1.1 400 Bad Request"}, ""},
		{"malformed request line", "GET /\r\nHost: h\r\n\r\n", []string{"HTTP/1.1 400 Bad Request"}, ""},
		{"bad header name", "GET / HTTP/1.1\r\nHost: h\r\nBad Name: x\r\n\r\n", []string{"HTTP/1.1 400 Bad Request"}, ""},
		{"head over the buffer", "GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("a", 6000) + "\r\nConnection: close\r\n\r\n",
			[]string{"200 OK", "fallback"}, "fallback"},
		{"head over the fallback's limit", "GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("a", 80000) + "\r\n\r\n",
			[]string{"431 Request Header Fields Too Large"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			own, fb := ts.own.Load(), ts.fb.Load()
			got := raw(t, ts.addr, tc.req)
			at := 0
			for _, w := range tc.want {
				i := strings.Index(got[at:], w)
				if i < 0 {
					t.Fatalf("answer lacks %q after byte %d:\n%q", w, at, got)
				}
				at += i + len(w)
			}
			dOwn, dFb := ts.own.Load()-own, ts.fb.Load()-fb
			switch {
			case tc.by == "own" && (dOwn != 1 || dFb != 0), tc.by == "fallback" && (dOwn != 0 || dFb != 1), tc.by == "" && dOwn+dFb != 0:
				t.Fatalf("served by own %d, fallback %d; want %q", dOwn, dFb, tc.by)
			}
		})
	}
}

// TestH2C: a client speaking HTTP/2 with prior knowledge is served by the fallback.
func TestH2C(t *testing.T) {
	ts := startServer(t, nil, nil)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post("http://"+ts.addr+"/", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(b) != "fallback" {
		t.Fatalf("%s %q", resp.Proto, b)
	}
}

// TestKeepAliveThenHandOff: a connection serves requests until one it does not serve, and
// the fallback serves the rest of that connection, bytes already read included.
func TestKeepAliveThenHandOff(t *testing.T) {
	ts := startServer(t, nil, nil)
	reqs := "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n" +
		"POST /2 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi" +
		"POST /3 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n" +
		"GET /4 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
	got := raw(t, ts.addr, reqs) // pipelined: all in one write
	if n := strings.Count(got, "HTTP/1.1 200 OK"); n != 4 {
		t.Fatalf("%d answers, want 4:\n%s", n, got)
	}
	if ts.own.Load() != 2 || ts.fb.Load() != 2 {
		t.Fatalf("own served %d, fallback %d; want 2 and 2", ts.own.Load(), ts.fb.Load())
	}
	if i, j := strings.Index(got, "own"), strings.LastIndex(got, "fallback"); i < 0 || j < i {
		t.Fatalf("answers out of order:\n%s", got)
	}
}

func TestFraming(t *testing.T) {
	big := strings.Repeat("x", 5000)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small":
			_, _ = io.WriteString(w, "hello")
		case "/big":
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, big)
		case "/flush":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "data: 2\n\n")
		case "/length":
			w.Header().Set("Content-Length", "3")
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "abc")
			if _, err := io.WriteString(w, "d"); !errors.Is(err, http.ErrContentLength) {
				panic(fmt.Sprintf("write past Content-Length: %v", err))
			}
		case "/short":
			w.Header().Set("Content-Length", "10")
			_, _ = io.WriteString(w, "abc")
		case "/nocontent":
			w.WriteHeader(http.StatusNoContent)
			if _, err := io.WriteString(w, "x"); !errors.Is(err, http.ErrBodyNotAllowed) {
				panic("body allowed on 204")
			}
		case "/header-after":
			w.WriteHeader(http.StatusCreated)
			w.Header().Set("X-Late", "1") // after WriteHeader: not sent, as with net/http
			_, _ = io.WriteString(w, "late")
		case "/newline":
			w.Header().Set("X-Split", "a\r\nInjected: yes")
			_, _ = io.WriteString(w, "ok")
		case "/panic":
			panic(http.ErrAbortHandler)
		}
	}, nil)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		path, method string
		status       int
		body         string
		clen         int64
		te           []string
		header       map[string]string
	}{
		{"/small", "GET", 200, "hello", 5, nil, map[string]string{"Content-Type": "text/plain; charset=utf-8"}},
		{"/big", "GET", 200, big, -1, []string{"chunked"}, nil},
		{"/flush", "GET", 200, "data: 1\n\ndata: 2\n\n", -1, []string{"chunked"}, map[string]string{"Content-Type": "text/event-stream"}},
		{"/length", "GET", 200, "abc", 3, nil, nil},
		{"/small", "HEAD", 200, "", 5, nil, nil},
		{"/nocontent", "GET", 204, "", 0, nil, nil},
		{"/header-after", "GET", 201, "late", 4, nil, map[string]string{"X-Late": ""}},
		{"/newline", "GET", 200, "ok", 2, nil, map[string]string{"X-Split": "a  Injected: yes", "Injected": ""}},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, "http://"+ts.addr+tc.path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || string(b) != tc.body || resp.ContentLength != tc.clen ||
				fmt.Sprint(resp.TransferEncoding) != fmt.Sprint(tc.te) {
				t.Fatalf("status %d, body %.40q, length %d, TE %v; want %d, %.40q, %d, %v",
					resp.StatusCode, b, resp.ContentLength, resp.TransferEncoding, tc.status, tc.body, tc.clen, tc.te)
			}
			if resp.Header.Get("X-Served-By") != "own" || resp.Header.Get("Date") == "" {
				t.Fatalf("header %v", resp.Header)
			}
			for k, v := range tc.header {
				if got := resp.Header.Get(k); got != v {
					t.Fatalf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
	// An answer shorter than its Content-Length, and a handler that panics: the connection
	// closes (the client sees the cut), and the next request is served on a new one.
	for _, path := range []string{"/short", "/panic"} {
		resp, err := client.Get("http://" + ts.addr + path)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Fatalf("%s: no error from a cut answer", path)
		}
		resp, err = client.Get("http://" + ts.addr + "/small")
		if err != nil {
			t.Fatalf("after %s: %v", path, err)
		}
		resp.Body.Close()
	}
}

// TestUnreadBody: a body the handler left unread is dropped and the connection kept; past
// 256 KiB the answer says Connection: close and the connection closes.
func TestUnreadBody(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ignored your body")
	}, nil)
	for _, tc := range []struct {
		size  int
		close bool
	}{{1000, false}, {maxDiscard + 1, true}} {
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			_, _ = fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s", tc.size, strings.Repeat("b", tc.size))
			_, _ = io.WriteString(c, "GET /again HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		}()
		b, _ := io.ReadAll(c)
		c.Close()
		got := string(b)
		if n := strings.Count(got, "HTTP/1.1 200 OK"); n != map[bool]int{false: 2, true: 1}[tc.close] {
			t.Fatalf("size %d: %d answers:\n%.300s", tc.size, n, got)
		}
		if tc.close && !strings.Contains(got, "Connection: close") {
			t.Fatalf("size %d: no Connection: close:\n%.300s", tc.size, got)
		}
	}
}

// TestClientGone: a client that closes its connection while its request runs cancels the
// request's context with ErrClientGone; a request that ends before WatchAfter never starts
// the watch.
func TestClientGone(t *testing.T) {
	started, cause := make(chan struct{}), make(chan error, 1)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/quick" {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // the watch starts once the body is read, as net/http's
		close(started)
		untilCancelled(r, cause)
	}, func(s *Server) { s.WatchAfter = 20 * time.Millisecond })
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, "GET /quick HTTP/1.1\r\nHost: h\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, _ = io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi")
	<-started
	c.Close()
	wantClientGone(t, cause)
}

// untilCancelled is a handler's wait for its request's end: the request's cause on cause.
func untilCancelled(r *http.Request, cause chan<- error) {
	select {
	case <-r.Context().Done():
		cause <- scope.Cause(r.Context()) // a Scope: context.Cause gives its Err
	case <-time.After(5 * time.Second):
		cause <- errors.New("never cancelled")
	}
}

// wantClientGone waits for the handler's cause and wants ErrClientGone.
func wantClientGone(t *testing.T, cause <-chan error) {
	t.Helper()
	select {
	case err := <-cause:
		if !errors.Is(err, ErrClientGone) {
			t.Fatalf("cause %v, want ErrClientGone", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not end")
	}
}

// TestWatchHoldsNoGoroutine: on Linux a long request's client-gone watch waits in the
// server's Watcher, not in a goroutine blocked in a read of its own (a held stream's second
// goroutine), and still cancels the request when the client goes.
func TestWatchHoldsNoGoroutine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the Watcher is Linux's")
	}
	started, cause := make(chan struct{}), make(chan error, 1)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		untilCancelled(r, cause)
	}, func(s *Server) { s.WatchAfter = time.Millisecond })
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
	<-started
	// The watch has started once it waits in the Watcher (or, without it, in watchConn).
	deadline := time.Now().Add(5 * time.Second)
	for !polled(ts.s) && time.Now().Before(deadline) {
		buf := make([]byte, 1<<20)
		if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "(*conn).watchConn") {
			t.Fatalf("a goroutine waits in watchConn while the client is connected:\n%s", stacks)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !polled(ts.s) {
		t.Fatal("the watch never waited in the Watcher")
	}
	c.Close()
	wantClientGone(t, cause)
}

// polled reports whether a connection of s has its watch in the Watcher.
func polled(s *Server) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.wmu.Lock()
		p := c.polled
		c.wmu.Unlock()
		if p {
			return true
		}
	}
	return false
}

// TestWatchKeepsPipelined: the watch of a long request reads the next pipelined request's
// first bytes; that request is served whole, and the long one is not cancelled.
func TestWatchKeepsPipelined(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-time.After(100 * time.Millisecond):
			case <-r.Context().Done():
				http.Error(w, "cancelled", http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "done "+r.URL.Path)
	}, nil)
	got := raw(t, ts.addr, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
	if !strings.Contains(got, "done /slow") || !strings.Contains(got, "done /next") {
		t.Fatalf("answers:\n%s", got)
	}
}

// TestShutdown: idle connections close at once, a request in flight finishes with
// Connection: close, and Shutdown returns when it has.
func TestShutdown(t *testing.T) {
	release, inside := make(chan struct{}), make(chan struct{})
	var protos http.Protocols
	protos.SetHTTP1(true)
	s := &Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				close(inside)
				<-release
			}
			_, _ = io.WriteString(w, "bye")
		}),
		Fallback:          &http.Server{Protocols: &protos, ReadHeaderTimeout: time.Second},
		ReadHeaderTimeout: time.Second, WatchAfter: time.Millisecond,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_, _ = io.WriteString(idle, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	ibr := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(ibr, nil); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	busy, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, _ = io.WriteString(busy, "GET /hold HTTP/1.1\r\nHost: h\r\n\r\n")
	<-inside
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	_ = idle.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := ibr.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("idle connection not closed: %v", err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	_ = busy.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, _ := io.ReadAll(busy)
	if !bytes.Contains(b, []byte("Connection: close")) || !bytes.HasSuffix(b, []byte("bye")) {
		t.Fatalf("in-flight answer:\n%s", b)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
}

// TestShutdownServesANewConnection: a connection accepted before Shutdown whose first request
// comes after it is served (with Connection: close), not closed under the client: the
// request may already be on its way. Shutdown waits for it.
func TestShutdownServesANewConnection(t *testing.T) {
	ts := startServer(t, nil, nil) // its cleanup shuts it down again: nothing left to do
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		ts.s.mu.Lock()
		n := len(ts.s.conns)
		ts.s.mu.Unlock()
		if n == 1 {
			break // accepted and tracked
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection was not accepted")
		}
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- ts.s.Shutdown(ctx)
	}()
	time.Sleep(120 * time.Millisecond) // Shutdown's first closeIdle and two more ticks
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	b, err := io.ReadAll(c)
	if err != nil || !bytes.HasPrefix(b, []byte("HTTP/1.1 200 OK\r\n")) || !bytes.Contains(b, []byte("Connection: close")) || !bytes.HasSuffix(b, []byte("own")) {
		t.Fatalf("a request on a new connection during Shutdown: %v\n%s", err, b)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestIdleTimeout: a kept-alive connection idle past IdleTimeout is closed.
func TestIdleTimeout(t *testing.T) {
	ts := startServer(t, nil, func(s *Server) { s.IdleTimeout = 50 * time.Millisecond })
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	start := time.Now()
	if _, err := br.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("connection not closed when idle: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("closed after %v", d)
	}
}

// TestSlowHead: a head that does not arrive within ReadHeaderTimeout closes the
// connection without an answer, as net/http does.
func TestSlowHead(t *testing.T) {
	ts := startServer(t, nil, func(s *Server) { s.ReadHeaderTimeout = 50 * time.Millisecond })
	got := raw(t, ts.addr, "GET / HTTP/1.1\r\nHost: h\r\n")
	if got != "" {
		t.Fatalf("answered %q", got)
	}
}

// TestBodyAfterHandler: a body still held after its handler returned (a transport's
// goroutine writing it upstream) reads ErrBodyReadAfterClose, never the next request's body.
func TestBodyAfterHandler(t *testing.T) {
	kept := make(chan io.Reader, 1)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/keep" {
			kept <- r.Body
		} else {
			_, _ = io.Copy(io.Discard, r.Body)
		}
		_, _ = io.WriteString(w, "ok")
	}, nil)
	got := raw(t, ts.addr, "POST /keep HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nfirst"+
		"POST /next HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecond")
	if n := strings.Count(got, "200 OK"); n != 2 {
		t.Fatalf("%d answers:\n%s", n, got)
	}
	b := <-kept
	if n, err := b.Read(make([]byte, 16)); n != 0 || !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Fatalf("stale body read %d bytes, %v", n, err)
	}
}

// TestReviewedDifferences: what a review found this server doing otherwise than net/http.
func TestReviewedDifferences(t *testing.T) {
	html := "<html><body>" + strings.Repeat("x", 4000) + "</body></html>"
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/deadline":
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		case "/html":
			_, _ = io.WriteString(w, html) // over 2 KiB in one write: still sniffed
			return
		case "/keepalive":
			w.Header().Set("Connection", "keep-alive")
		}
		_, _ = io.WriteString(w, "hello")
	}, nil)
	// A handler's write deadline does not outlive its request on a kept-alive connection.
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i, path := range []string{"/deadline", "/plain"} {
		if i == 1 {
			time.Sleep(100 * time.Millisecond) // past the first request's deadline
		}
		_, _ = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: h\r\n\r\n", path)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, tc := range []struct{ req, want, not string }{
		{"GET /html HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "Content-Type: text/html; charset=utf-8\r\n", ""},
		{"HEAD /plain HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "Content-Type: text/plain; charset=utf-8\r\n", ""},
		{"GET /keepalive HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "Connection: close\r\n", "keep-alive"},
		{"GET /keepalive HTTP/1.1\r\nHost: h\r\n\r\nGET /plain HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "Connection: keep-alive\r\n", ""},
	} {
		got := raw(t, ts.addr, tc.req)
		if !strings.Contains(got, tc.want) || (tc.not != "" && strings.Contains(got, tc.not)) {
			t.Fatalf("%q: answer\n%.400s\nwant %q, not %q", tc.req, got, tc.want, tc.not)
		}
	}
	// Identical duplicate Content-Lengths read as one, as net/http reads them.
	req := parsed([]byte("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"))
	if req == nil || fmt.Sprint(req.Header["Content-Length"]) != "[3]" {
		t.Fatalf("request %+v", req)
	}
}

// TestChunkedWriteAllocates: relaying a stream event through the server (a chunk and its
// flush) allocates nothing.
func TestChunkedWriteAllocates(t *testing.T) {
	c := &conn{srv: &Server{}, bw: bufio.NewWriterSize(io.Discard, bufSize)}
	r := &response{c: c, req: &http.Request{Method: http.MethodPost}, header: http.Header{}, clen: -1}
	r.WriteHeader(http.StatusOK)
	r.Flush() // the head, chunked
	if !r.chunked {
		t.Fatal("not chunked")
	}
	ev := []byte("data: {\"choices\":[{\"delta\":{\"content\":\" blue\"}}]}\n\n")
	if n := testing.AllocsPerRun(200, func() {
		if _, err := r.Write(ev); err != nil {
			t.Fatal(err)
		}
		r.Flush()
	}); n != 0 {
		t.Fatalf("%.1f allocations an event", n)
	}
}

// TestHandedOffOutlivesTheHeadTimeout: a connection handed to net/http's server (here a
// chunked upload, as a client streaming its request sends) is net/http's from then on: the
// own server's head time-out, an alarm, must not cut its slow body later.
func TestHandedOffOutlivesTheHeadTimeout(t *testing.T) {
	ts := startServer(t, nil, func(s *Server) { s.ReadHeaderTimeout = 100 * time.Millisecond })
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{`{"model":`, `"m","messages":`, `[{"role":"user",`, `"content":"hi"}]}`} {
		time.Sleep(80 * time.Millisecond) // 320 ms in all, past the 100 ms head time-out
		if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(part), part); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := io.WriteString(c, "0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to the slow chunked upload: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "fallback" {
		t.Fatalf("status %d, body %q; want 200 from the fallback", resp.StatusCode, b)
	}
}

// TestKeptRequestOutlivesTheNext: a handler may keep its request after it returns (a mirrored
// copy, a log written later); the connection reads its next request into its own, so what was
// kept is not overwritten by a pipelined request behind it, nor by a keep-alive one after it.
func TestKeptRequestOutlivesTheNext(t *testing.T) {
	var mu sync.Mutex
	var kept []*http.Request
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		kept = append(kept, r)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}, nil)
	got := raw(t, ts.addr, "POST /v1/chat/completions?a=1 HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 203.0.113.7\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"+
		"GET /v1/models HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
	if strings.Count(got, "HTTP/1.1 200") != 2 {
		t.Fatalf("answers:\n%s", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kept) != 2 {
		t.Fatalf("%d requests kept", len(kept))
	}
	first, second := kept[0], kept[1]
	if first.Method != http.MethodPost || first.URL.Path != "/v1/chat/completions" || first.URL.RawQuery != "a=1" ||
		first.Header.Get("X-Forwarded-For") != "203.0.113.7" || first.ContentLength != 2 || first.RemoteAddr == "" || first.Context() == nil {
		t.Errorf("the first request changed after the second: %s %v %v, length %d, from %q", first.Method, first.URL, first.Header, first.ContentLength, first.RemoteAddr)
	}
	if second.Method != http.MethodGet || second.URL.Path != "/v1/models" || second.Header.Get("X-Forwarded-For") != "" ||
		second.ContentLength != 0 || second.Body != http.NoBody || !second.Close {
		t.Errorf("the second request carries the first's: %s %v %v, length %d, body %T", second.Method, second.URL, second.Header, second.ContentLength, second.Body)
	}
}

// TestConnsMapShrinks: after a burst of thousands of connections, the map that tracks them
// is made anew once few are left (a Go map keeps its largest table: 9,000 streams left 1 MiB
// behind), and the connections still open stay tracked with their state.
func TestConnsMapShrinks(t *testing.T) {
	s := &Server{conns: map[*conn]struct{}{}}
	cs := make([]*conn, 3000)
	for i := range cs {
		cs[i] = &conn{}
		if !s.add(cs[i]) || !s.track(cs[i], i%2 == 0) {
			t.Fatal("add or track refused on an open server")
		}
	}
	for _, c := range cs[10:] {
		s.untrack(c)
	}
	if len(s.conns) != 10 || s.connsMax > 3000/8 {
		t.Errorf("%d connections tracked, the map made for a peak of %d; want 10, and a peak of at most %d", len(s.conns), s.connsMax, 3000/8)
	}
	for i, c := range cs[:10] {
		if _, ok := s.conns[c]; !ok || (c.state.Load() == connIdle) != (i%2 == 0) {
			t.Errorf("connection %d: tracked %v, state %d; want tracked, idle %v", i, ok, c.state.Load(), i%2 == 0)
		}
	}
}

// TestHeaderMapPerRequest: the answer's header map is the connection's, emptied for each
// request: a request on a kept-alive connection starts with no header of the one before,
// including after one that set more headers than a small map holds (then made anew), and
// the map is not made again for each request.
func TestHeaderMapPerRequest(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	var maps []uintptr
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		maps = append(maps, reflect.ValueOf(w.Header()).Pointer())
		mu.Unlock()
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		var before []string
		for k := range w.Header() {
			if k != "X-Served-By" {
				before = append(before, k)
			}
		}
		mu.Lock()
		seen = append(seen, strings.Join(before, ","))
		mu.Unlock()
		for i := range n {
			w.Header().Set("X-Set-"+strconv.Itoa(i), r.URL.Path)
		}
		_, _ = io.WriteString(w, "ok")
	}, nil)
	var reqs strings.Builder
	for i, n := range []int{2, 0, 12, 1, 3, 3} {
		fmt.Fprintf(&reqs, "GET /%d?n=%d HTTP/1.1\r\nHost: h\r\n\r\n", i, n)
	}
	reqs.WriteString("GET /last HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
	got := raw(t, ts.addr, reqs.String())
	if n := strings.Count(got, "HTTP/1.1 200 OK"); n != 7 {
		t.Fatalf("%d answers, want 7:\n%s", n, got)
	}
	for i, s := range seen {
		if s != "" {
			t.Errorf("request %d started with the headers %s", i, s)
		}
	}
	// Each answer has its own headers only: /1 none of /0's, /3 none of /2's twelve.
	answers := strings.Split(got, "HTTP/1.1 200 OK")[1:]
	for i, want := range []int{2, 0, 12, 1, 3, 3, 0} {
		if n := strings.Count(answers[i], "X-Set-"); n != want {
			t.Errorf("answer %d has %d X-Set- headers, want %d:\n%s", i, n, want, answers[i])
		}
	}
	// One map for the first two requests (2 and 0 headers); a new one after the twelve.
	if maps[0] != maps[1] || maps[2] != maps[1] || maps[3] == maps[2] || maps[4] != maps[3] {
		t.Errorf("header maps %x: want the first three alike, a new one for the fourth, kept for the fifth", maps)
	}
}

// TestTrackAndCloseIdle: a connection says itself whether it is idle (no map write a
// request); closeIdle closes and forgets the idle ones only, and once the server stopped,
// track refuses: a connection that goes idle after closeIdle looked sees the server closed.
func TestTrackAndCloseIdle(t *testing.T) {
	s := &Server{conns: map[*conn]struct{}{}}
	var cs []*conn
	var peers []net.Conn
	for i := range 4 {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		c := &conn{nc: a}
		if !s.add(c) || !s.track(c, i%2 == 0) {
			t.Fatal("refused on an open server")
		}
		cs, peers = append(cs, c), append(peers, b)
	}
	// Two new connections (no request read yet): one just accepted, one accepted longer
	// than newConnGrace ago.
	fresh, stale := &conn{}, &conn{}
	var freshPeer, stalePeer net.Conn
	for _, n := range []struct {
		c    *conn
		peer *net.Conn
	}{{fresh, &freshPeer}, {stale, &stalePeer}} {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		n.c.nc, *n.peer = a, b
		if !s.add(n.c) {
			t.Fatal("refused on an open server")
		}
	}
	stale.born = time.Now().Add(-newConnGrace - time.Second)
	s.stop()
	s.closeIdle()
	for name, n := range map[string]struct {
		c      *conn
		peer   net.Conn
		closed bool
	}{"new": {fresh, freshPeer, false}, "new for longer than the grace": {stale, stalePeer, true}} {
		_ = n.peer.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := n.peer.Read(make([]byte, 1))
		_, tracked := s.conns[n.c]
		if closed := errors.Is(err, io.EOF); closed != n.closed || tracked == n.closed {
			t.Errorf("%s connection: closed %v (%v), still tracked %v; want closed %v", name, closed, err, tracked, n.closed)
		}
	}
	for i, c := range cs {
		_ = peers[i].SetReadDeadline(time.Now().Add(200 * time.Millisecond)) // an open pipe times out
		_, err := peers[i].Read(make([]byte, 1))
		closed := errors.Is(err, io.EOF)
		_, tracked := s.conns[c]
		if idle := i%2 == 0; closed != idle || tracked == idle {
			t.Errorf("connection %d (idle %v): closed %v (%v), still tracked %v", i, idle, closed, err, tracked)
		}
	}
	if s.track(cs[1], true) || s.track(cs[1], false) {
		t.Error("track accepted a connection's state after the server stopped")
	}
	if s.add(&conn{}) {
		t.Error("add accepted a connection after the server stopped")
	}
}

// TestBodyArrived: a body that came with its head is in the connection's buffer whole
// (Arrived: its reading waits for nobody); one whose rest comes later is not. Arrived is
// asked before the body's end is read (after it, the client-gone watch reads the connection).
func TestBodyArrived(t *testing.T) {
	type seen struct{ before, after bool }
	got := make(chan seen, 2)
	checked := make(chan struct{}, 2) // the handler looked: the rest of a body may come
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		a := r.Body.(interface{ Arrived() bool })
		var s seen
		s.before = a.Arrived()
		checked <- struct{}{}
		b := make([]byte, 5)
		_, _ = io.ReadFull(r.Body, b) // the whole body, not its end (EOF) yet
		s.after = a.Arrived()         // nothing left: true however it came
		_, _ = io.Copy(io.Discard, r.Body)
		got <- s
	}, nil)
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
	<-checked
	if s := <-got; !s.before || !s.after {
		t.Errorf("a body with its head: arrived %v before reading, %v after; want both", s.before, s.after)
	}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first answer: %v", err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	_, _ = io.WriteString(c, "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhe")
	<-checked
	_, _ = io.WriteString(c, "llo")
	if s := <-got; s.before || !s.after {
		t.Errorf("a body whose rest came later: arrived %v before reading, %v after; want false, true", s.before, s.after)
	}
}
