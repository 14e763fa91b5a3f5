package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawServer accepts connections on 127.0.0.1 and runs serve on each until the test ends.
func rawServer(t *testing.T, serve func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// echoServer answers each request with its body.
func echoServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// countingH1 is an h1 client whose dials are counted.
func countingH1(t *testing.T) (*h1, *atomic.Int64) {
	t.Helper()
	var dials atomic.Int64
	d := &net.Dialer{Timeout: 2 * time.Second}
	fb := &http.Transport{DialContext: d.DialContext}
	h := newH1(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}, fb, 4)
	t.Cleanup(h.CloseIdleConnections)
	return h, &dials
}

func newReq(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, r)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestH1KeepAlive: answers with a length, chunked and empty reuse one connection; the request
// arrives whole (method, path and query, Host, headers, body).
func TestH1KeepAlive(t *testing.T) {
	var got []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, fmt.Sprintf("%s %s %s %s %s", r.Method, r.URL.RequestURI(), r.Host, r.Header.Get("X-A"), b))
		mu.Unlock()
		switch r.URL.Path {
		case "/chunked":
			w.Write([]byte("one,"))
			w.(http.Flusher).Flush()
			w.Write([]byte("two"))
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Write([]byte("body"))
		}
	}))
	defer srv.Close()
	h, dials := countingH1(t)
	for i, tc := range []struct{ path, want string }{{"/len?q=1", "body"}, {"/chunked", "one,two"}, {"/empty", ""}, {"/len", "body"}} {
		req := newReq(t, context.Background(), srv.URL+tc.path, fmt.Sprintf(`{"n":%d}`, i))
		req.Header.Set("X-A", "a")
		resp, err := h.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if b := readAll(t, resp); b != tc.want {
			t.Errorf("%s: body %q, want %q", tc.path, b, tc.want)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials for 4 sequential requests, want 1 (keep-alive)", n)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	want := []string{"POST /len?q=1 " + host + ` a {"n":0}`, "POST /chunked " + host + ` a {"n":1}`, "POST /empty " + host + ` a {"n":2}`, "POST /len " + host + ` a {"n":3}`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("server saw %q, want %q", got, want)
	}
}

// TestH1StaleConnection: a kept-alive connection the server closed while it was idle is
// detected when the next request is written or its answer read; the request goes again once
// on a new connection, body and all.
func TestH1StaleConnection(t *testing.T) {
	var bodies []string
	var mu sync.Mutex
	addr := rawServer(t, func(c net.Conn) {
		// One answer per connection, keep-alive announced, then the server closes it.
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(20 * time.Millisecond)
	})
	h, dials := countingH1(t)
	for i := range 3 {
		resp, err := h.RoundTrip(newReq(t, context.Background(), "http://"+addr+"/", fmt.Sprintf("b%d", i)))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if b := readAll(t, resp); b != "ok" {
			t.Fatalf("request %d: %q", i, b)
		}
		time.Sleep(50 * time.Millisecond) // the server has closed the idle connection by now
	}
	if n := dials.Load(); n < 3 {
		t.Errorf("%d dials, want a new connection for each request", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(bodies) != "[b0 b1 b2]" {
		t.Errorf("server got bodies %q, want each request once", bodies)
	}
}

// TestH1ResendsOnlyWhatMayRunTwice: a kept-alive connection whose server takes the next
// request whole and then closes without a word (it died with the request in hand): a POST
// is not sent again (the model server may have run it; the retry policy decides, with its
// budget), an idempotent request or one with an Idempotency-Key is, once, on a new
// connection, as net/http's Transport does.
func TestH1ResendsOnlyWhatMayRunTwice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		header string // a header set on the request, "" for none
		resent bool
	}{
		{"POST", http.MethodPost, "", false},
		{"POST with an Idempotency-Key", http.MethodPost, "Idempotency-Key", true},
		{"POST with an X-Idempotency-Key", http.MethodPost, "X-Idempotency-Key", true},
		{"GET", http.MethodGet, "", true},
	} {
		var mu sync.Mutex
		var seen []string
		var conns atomic.Int64
		addr := rawServer(t, func(c net.Conn) {
			first := conns.Add(1) == 1
			br := bufio.NewReader(c)
			for n := 0; ; n++ {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				b, _ := io.ReadAll(req.Body)
				mu.Lock()
				seen = append(seen, req.Method+" "+string(b))
				mu.Unlock()
				if first && n == 1 {
					return // the second request on the first connection: taken, never answered
				}
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		h, dials := countingH1(t)
		send := func(method, body string) (string, error) {
			req := newReq(t, context.Background(), "http://"+addr+"/", body)
			req.Method = method
			if tc.header != "" {
				req.Header.Set(tc.header, "k1")
			}
			resp, err := h.RoundTrip(req)
			if err != nil {
				return "", err
			}
			return readAll(t, resp), nil
		}
		if b, err := send(tc.method, "one"); err != nil || b != "ok" {
			t.Fatalf("%s: first request: %q, %v", tc.name, b, err)
		}
		b, err := send(tc.method, "two")
		mu.Lock()
		got := fmt.Sprint(seen)
		mu.Unlock()
		if tc.resent {
			if err != nil || b != "ok" {
				t.Errorf("%s: second request: %q, %v; want it sent again and answered", tc.name, b, err)
			}
			if want := fmt.Sprintf("[%[1]s one %[1]s two %[1]s two]", tc.method); got != want || dials.Load() != 2 {
				t.Errorf("%s: server saw %s over %d connections, want %s over 2", tc.name, got, dials.Load(), want)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: second request answered %q; the server never answered it", tc.name, b)
		}
		if want := fmt.Sprintf("[%[1]s one %[1]s two]", tc.method); got != want || dials.Load() != 1 {
			t.Errorf("%s: server saw %s over %d connections, want %s over 1 (not sent again)", tc.name, got, dials.Load(), want)
		}
	}
}

// TestH1IdleConnectionChecked: a pooled connection is looked at before it is used: one the
// server closed while it was idle is not written on, and one on which the server sent bytes
// nobody asked for (a stray answer) is dropped, never read as the next request's answer.
func TestH1IdleConnectionChecked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after string // what the server does once it answered the first request on a connection
	}{
		{"closed while idle", "close"},
		{"stray bytes while idle", "stray"},
	} {
		var mu sync.Mutex
		var seen int
		addr := rawServer(t, func(c net.Conn) {
			br := bufio.NewReader(c)
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.ReadAll(req.Body)
			mu.Lock()
			seen++
			mu.Unlock()
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			if tc.after == "stray" {
				time.Sleep(10 * time.Millisecond)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
				_, _ = br.ReadByte() // holds the connection open until the client closes it
			}
		})
		h, dials := countingH1(t)
		for i := range 2 {
			resp, err := h.RoundTrip(newReq(t, context.Background(), "http://"+addr+"/", "x"))
			if err != nil {
				t.Fatalf("%s: request %d: %v", tc.name, i, err)
			}
			if b := readAll(t, resp); b != "ok" {
				t.Errorf("%s: request %d answered %q, want the server's own answer", tc.name, i, b)
			}
			time.Sleep(50 * time.Millisecond) // the close or the stray bytes have arrived
		}
		mu.Lock()
		n := seen
		mu.Unlock()
		if n != 2 || dials.Load() != 2 {
			t.Errorf("%s: server saw %d requests over %d connections, want 2 over 2", tc.name, n, dials.Load())
		}
	}
}

// TestH1UnreadBodyClosesConnection: an answer left unread does not return its connection to
// the pool (its rest would be read as the next answer).
func TestH1UnreadBodyClosesConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("x"), 64<<10))
	}))
	defer srv.Close()
	h, dials := countingH1(t)
	for range 2 {
		resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, ""))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 10)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2: a half-read connection is not reused", n)
	}
}

// TestH1CancelUnblocksRead: cancelling the request's context ends a body read that waits on
// a server sending nothing, at once, and the connection is not reused.
func TestH1CancelUnblocksRead(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: 1\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	h, _ := countingH1(t)
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := h.RoundTrip(newReq(t, ctx, srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(buf)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a read after cancel succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not unblock the body read")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.idle {
		if len(p.l) > 0 {
			t.Error("a cancelled connection went back to the pool")
		}
	}
}

// TestH1CancelBeforeAnswer: a context cancelled while the server has not answered returns
// the context's error.
func TestH1CancelBeforeAnswer(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	h, _ := countingH1(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := h.RoundTrip(newReq(t, ctx, srv.URL, "x"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want the context's deadline", err)
	}
}

// TestH1HostileAnswers: what a broken server sends is an error, bounded: a flood of 1xx,
// headers past MaxResponseHeaderBytes, a malformed status line, a body shorter than its
// length.
func TestH1HostileAnswers(t *testing.T) {
	cases := []struct {
		name, answer string
		want         error
		bodyErr      bool
	}{
		{"1xx flood", strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", 50), errTooManyInformational, false},
		{"huge headers", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", MaxResponseHeaderBytes+10) + "\r\n\r\n", errHeaderTooLarge, false},
		{"malformed", "HTTTP/9 what\r\n\r\n", nil, false},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", nil, true},
		{"switching protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := rawServer(t, func(c net.Conn) {
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				io.WriteString(c, tc.answer)
			})
			h, _ := countingH1(t)
			resp, err := h.RoundTrip(newReq(t, context.Background(), "http://"+addr+"/", "x"))
			if tc.bodyErr {
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if _, err := io.ReadAll(resp.Body); err == nil {
					t.Error("a short body read without error")
				}
				return
			}
			if err == nil {
				resp.Body.Close()
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestH1RefusesBrokenHeaders: a header name or value that would break the request's framing
// is refused as the request is written: the server gets no request, the connection it would
// have gone on is closed and the request is not tried on another (it would be refused there
// too); the next good request gets a new connection.
func TestH1RefusesBrokenHeaders(t *testing.T) {
	for _, tc := range []struct {
		name, key, value string
		reused           bool
	}{
		{"value with CRLF", "X-Evil", "a\r\nX-Injected: 1", false},
		{"value with CRLF, kept-alive connection", "X-Evil", "a\r\nX-Injected: 1", true},
		{"name with a space", "X Evil", "1", true},
		{"name with a colon", "X-Evil:", "1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
			defer srv.Close()
			h, dials := countingH1(t)
			if tc.reused {
				resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, "x"))
				if err != nil {
					t.Fatal(err)
				}
				readAll(t, resp)
			}
			hits0, dials0 := hits.Load(), dials.Load()
			req := newReq(t, context.Background(), srv.URL, "x")
			req.Header[tc.key] = []string{tc.value}
			if _, err := h.RoundTrip(req); !errors.Is(err, errInvalidHeader) {
				t.Fatalf("err = %v, want errInvalidHeader", err)
			}
			if hits.Load() != hits0 {
				t.Error("the server got the request")
			}
			// On the kept-alive connection, no dial; without one, its own dial only.
			refused := dials.Load() - dials0
			if want := int64(1); tc.reused && refused != 0 || refused > want {
				t.Errorf("%d dials for the refused request: it was tried again", refused)
			}
			resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, "x"))
			if err != nil {
				t.Fatalf("the next request: %v", err)
			}
			readAll(t, resp)
			if want := dials0 + refused + 1; dials.Load() != want {
				t.Errorf("%d dials after the next request, want %d (the refused request's connection closed)", dials.Load(), want)
			}
		})
	}
}

// TestH1FallsBack: what h1 does not send itself (a streaming body of unknown length) goes
// through net/http's Transport, which sends it chunked.
func TestH1FallsBack(t *testing.T) {
	te := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		te <- fmt.Sprint(r.TransferEncoding)
	}))
	defer srv.Close()
	h, dials := countingH1(t)
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("streamed"))
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, pr)
	resp, err := h.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := <-te; got != "[chunked]" {
		t.Errorf("transfer encoding %s, want chunked", got)
	}
	if dials.Load() != 0 {
		t.Error("h1 dialled for a request it does not send")
	}
}

// TestH1Concurrent: concurrent requests each get their own answer (run with -race).
func TestH1Concurrent(t *testing.T) {
	srv := echoServer(t)
	h, dials := countingH1(t)
	var wg sync.WaitGroup
	var bad atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				want := fmt.Sprintf("g%d-%d", g, i)
				resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, want))
				if err != nil {
					bad.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != want {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Errorf("%d of 200 requests failed or got another's answer", bad.Load())
	}
	if n := dials.Load(); n > 8+4 {
		t.Errorf("%d dials for 8 concurrent clients", n)
	}
}

// FuzzH1Answer: whatever a server sends, RoundTrip and the body read return (no panic, no
// hang), and a read never yields more than the server sent.
func FuzzH1Answer(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 200 OK\r\n\r\nclose-delimited"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"))
	f.Fuzz(func(t *testing.T, answer []byte) {
		h := newH1(func(ctx context.Context, network, addr string) (net.Conn, error) {
			a, b := net.Pipe()
			go func() {
				defer b.Close()
				_ = b.SetDeadline(time.Now().Add(2 * time.Second))
				br := bufio.NewReader(b)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				_, _ = b.Write(answer)
			}()
			return a, nil
		}, &http.Transport{}, 2)
		defer h.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://fuzz.test/", strings.NewReader("x"))
		resp, err := h.RoundTrip(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, int64(len(answer))+1))
		if len(b) > len(answer) {
			t.Fatalf("read %d bytes of a %d-byte answer", len(b), len(answer))
		}
	})
}

// TestH1EarlyAnswer: a server (or a proxy in front of it, as nginx with client_max_body_size)
// that answers before it has read the whole body and closes the connection: the client gets
// that answer, as net/http's Transport gives it, not a write error; both on a new connection
// and on a reused one.
func TestH1EarlyAnswer(t *testing.T) {
	const answer = `{"error":{"message":"request body too large","type":"invalid_request_error","code":"too_large"}}`
	addr := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.ContentLength < 1<<20 {
				_, _ = io.Copy(io.Discard, req.Body)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				continue
			}
			// Refuse at the headers, read a little more (a lingering close, as servers do
			// so that the answer is not lost to a reset), and close.
			fmt.Fprintf(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(answer), answer)
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			_, _ = io.CopyN(io.Discard, br, 64<<10)
			_ = c.(*net.TCPConn).CloseWrite()
			time.Sleep(100 * time.Millisecond)
			return
		}
	})
	h, _ := countingH1(t)
	big := strings.Repeat("x", 16<<20)
	for _, warm := range []bool{false, true} {
		if warm { // a kept-alive connection first
			resp, err := h.RoundTrip(newReq(t, context.Background(), "http://"+addr+"/", "small"))
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := h.RoundTrip(newReq(t, ctx, "http://"+addr+"/v1/chat/completions", big))
		if err != nil {
			cancel()
			t.Fatalf("warm %v: %v, want the server's 413", warm, err)
		}
		if b := readAll(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge || b != answer {
			t.Errorf("warm %v: %d %q", warm, resp.StatusCode, b)
		}
		cancel()
	}
}

// TestH1ClosedKeepsNoConnection: an answer still being read when the client is closed (the
// last cluster using it went) does not put its connection back in the pool: nothing would
// ever take it again, and the model server would hold it open.
func TestH1ClosedKeepsNoConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("body"))
	}))
	defer srv.Close()
	h, _ := countingH1(t)
	resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, `{}`))
	if err != nil {
		t.Fatal(err)
	}
	h.close()
	if b := readAll(t, resp); b != "body" {
		t.Fatalf("body %q, want %q", b, "body")
	}
	h.mu.Lock()
	n := len(idleOf(h, strings.TrimPrefix(srv.URL, "http://")))
	h.mu.Unlock()
	if n != 0 {
		t.Errorf("%d idle connections kept after close, want 0", n)
	}
}

// TestH1IdleHoldsNoBuffers: a connection in the idle pool holds no reader or writer (a
// burst's hundreds of idle connections would hold 12 KiB each for the idle time-out), and
// the next request on it gets them back and is answered whole.
func TestH1IdleHoldsNoBuffers(t *testing.T) {
	srv := echoServer(t)
	h, dials := countingH1(t)
	host := strings.TrimPrefix(srv.URL, "http://")
	for i := range 3 {
		want := fmt.Sprintf("request %d", i)
		resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, want))
		if err != nil {
			t.Fatal(err)
		}
		if b := readAll(t, resp); b != want {
			t.Fatalf("answer %q, want %q", b, want)
		}
		h.mu.Lock()
		for _, c := range idleOf(h, host) {
			if c.br != nil || c.bw != nil {
				t.Errorf("request %d: an idle connection holds its buffers", i)
			}
		}
		n := len(idleOf(h, host))
		h.mu.Unlock()
		if n != 1 {
			t.Fatalf("request %d: %d idle connections, want 1", i, n)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials for 3 sequential requests, want 1", n)
	}
}

// TestH1StreamHoldsNoWriter: while an answer streams (a model's minutes of tokens), its
// connection holds its reader but not the writer its request went out with.
func TestH1StreamHoldsNoWriter(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Write([]byte("first,"))
		w.(http.Flusher).Flush()
		<-release
		w.Write([]byte("last"))
	}))
	defer srv.Close()
	defer close(release)
	h, _ := countingH1(t)
	resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, strings.Repeat("x", 10<<10)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first," {
		t.Fatalf("read %q, %v", buf, err)
	}
	c := resp.Body.(*h1Body).c
	if c.bw != nil || c.br == nil {
		t.Errorf("mid-answer: writer held %v, reader held %v; want the reader alone", c.bw != nil, c.br != nil)
	}
}

// TestH1SweepsIdle: the idle connections a burst left are closed once past the idle time-out
// with no request after them (get takes the most recent, so the rest would stay open, in
// CLOSE_WAIT once the server gave up on them, until traffic drained the pool down to them);
// the server sees each closed. A connection used again in the meantime stays.
func TestH1SweepsIdle(t *testing.T) {
	var open atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/hold" {
			time.Sleep(50 * time.Millisecond) // the burst's requests overlap: one connection each
		}
		w.Write([]byte("ok"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	defer srv.Close()
	d := &net.Dialer{Timeout: 2 * time.Second}
	h := newH1(d.DialContext, &http.Transport{DialContext: d.DialContext}, 16)
	defer h.close()
	h.idleTimeout = 300 * time.Millisecond
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL+"/hold", "x"))
			if err != nil {
				t.Error(err)
				return
			}
			readAll(t, resp)
		}()
	}
	wg.Wait()
	if n := open.Load(); n != 6 {
		t.Fatalf("%d connections open after the burst, want 6 (one a request)", n)
	}
	// One connection stays in use until the others expired.
	deadline := time.Now().Add(5 * time.Second)
	for open.Load() > 1 && time.Now().Before(deadline) {
		resp, err := h.RoundTrip(newReq(t, context.Background(), srv.URL, "x"))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		time.Sleep(50 * time.Millisecond)
	}
	if n := open.Load(); n != 1 {
		t.Fatalf("%d connections open %v after the burst, want 1 (the one in use)", n, 5*time.Second)
	}
	deadline = time.Now().Add(5 * time.Second)
	for open.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := open.Load(); n != 0 {
		t.Errorf("%d connections open with no traffic past the idle time-out, want 0", n)
	}
	h.mu.Lock()
	n := len(idleOf(h, strings.TrimPrefix(srv.URL, "http://")))
	h.mu.Unlock()
	if n != 0 {
		t.Errorf("%d connections left in the idle pool, want 0", n)
	}
}

func TestDialAddr(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"http://127.0.0.1:8000/v1", "127.0.0.1:8000"},
		{"http://vllm.internal:8000", "vllm.internal:8000"},
		{"http://vllm.internal/v1", "vllm.internal:80"},
		{"http://vllm.internal:/v1", "vllm.internal:80"},
		{"http://[::1]:8080/", "[::1]:8080"},
		{"http://[::1]/", "[::1]:80"},
		{"http://[fe80::1%25eth0]:8080/", "[fe80::1%eth0]:8080"},
		{"http://[fe80::1%25eth0]/", "[fe80::1%eth0]:80"},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if got := dialAddr(u); got != tc.want {
			t.Errorf("dialAddr(%s) = %q, want %q", tc.url, got, tc.want)
		}
	}
}

// TestAppendURI: the request target appended is the URL's RequestURI (its opaque form when it
// has one), made without the string.
func TestAppendURI(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    *url.URL
	}{
		{"path", &url.URL{Scheme: "http", Host: "h", Path: "/v1/chat/completions"}},
		{"empty path", &url.URL{Scheme: "http", Host: "h"}},
		{"escaped path", &url.URL{Scheme: "http", Host: "h", Path: "/v1/models/org/name", RawPath: "/v1/models/org%2Fname"}},
		{"a raw path that is not the path's", &url.URL{Scheme: "http", Host: "h", Path: "/v1/a b", RawPath: "/v1/x"}},
		{"query", &url.URL{Scheme: "http", Host: "h", Path: "/v1/models", RawQuery: "a=1&b=%20"}},
		{"forced empty query", &url.URL{Scheme: "http", Host: "h", Path: "/v1/models", ForceQuery: true}},
		{"query without path", &url.URL{Scheme: "http", Host: "h", RawQuery: "x"}},
		{"opaque", &url.URL{Scheme: "http", Opaque: "/raw/target", RawQuery: "q=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := appendURI([]byte("GET "), tc.u)
			want := tc.u.RequestURI()
			if tc.u.Opaque != "" {
				want = tc.u.Opaque
			}
			if string(b) != "GET "+want {
				t.Errorf("appended %q, want %q", b, "GET "+want)
			}
		})
	}
}

// idleOf is h's idle connections to host (h.mu held).
func idleOf(h *h1, host string) []*h1Conn {
	if p := h.idle[host]; p != nil {
		return p.l
	}
	return nil
}
