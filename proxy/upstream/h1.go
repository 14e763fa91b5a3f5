package upstream

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/proxy/scope"
	"github.com/sluicegw/sluice/proxy/socket"
)

// h1 is the upstream client of plain-HTTP endpoints: HTTP/1.1 over pooled keep-alive
// connections, with the request written and the answer read on the caller's own goroutine.
// net/http's Transport runs a read loop and a write loop goroutine per connection and hands
// every request, answer and body read between them and the caller; for a gateway whose
// requests are small and whose answers are streamed event by event, those hand-offs are most
// of its CPU per request. h1 has none: a request is one buffered write and the answer is
// parsed from the connection's reader as the relay reads it. Cancellation unblocks the
// connection (a scope.Hook in the answer's body: the attempt's Scope runs the connection's
// interrupt as it ends; on a standard cancellable context, context.AfterFunc, which costs a
// goroutine only when it fires).
//
// It serves what the gateway sends: http:// URLs, bodies that are absent or replayable
// (GetBody), no Expect or Upgrade. Anything else (https, HTTP/2, a pass-through body that
// must stream while the answer is read) goes to the fallback, net/http's Transport.
type h1 struct {
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	fallback    *http.Transport
	maxIdle     int           // idle connections kept per host
	idleTimeout time.Duration // an idle connection older than this is closed, not reused
	off         bool          // every request goes to the fallback (clusters[].http_client: net/http)

	mu       sync.Mutex
	idle     map[string]*idleConns // by host:port
	closed   bool
	sweeping *time.Timer // armed while connections are idle: closes those past idleTimeout
}

// An idle connection holds no buffers: they go back to these pools when it goes idle and
// come from them when it is taken again. After a burst the pool keeps up to maxIdle
// connections per endpoint for idleTimeout; their 12 KiB of buffers each would be held as
// long (256 connections: 3 MiB), where the pools give them back at the next collections.
var (
	connReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 8<<10) }}
	connWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

// sweepEvery is the least time between two sweeps of the idle pool.
const sweepEvery = time.Second

// maxInformational bounds the 1xx answers read before the final one (net/http's bound).
const maxInformational = 5

// errTooManyInformational: a server that answers 1xx after 1xx without an answer.
var errTooManyInformational = errors.New("upstream: too many 1xx informational responses")

// errHeaderTooLarge: a server whose answer's headers exceed MaxResponseHeaderBytes.
var errHeaderTooLarge = fmt.Errorf("upstream: response headers exceed %d bytes", MaxResponseHeaderBytes)

// longAgo is a deadline in the past: setting it unblocks a connection's reads and writes.
var longAgo = time.Unix(1, 0)

// h1Conn is one pooled connection.
type h1Conn struct {
	c     net.Conn
	lim   limitedReader // the connection as br reads it: bounded while headers are read
	br    *bufio.Reader
	bw    *bufio.Writer
	host  string
	used  time.Time // when it last went idle
	reuse bool      // it served a request before this one

	// The request's context ended (interrupt ran): the connection's deadline is spent. Reset
	// by each exchange; a connection whose watch may have run is never reused.
	cancelled atomic.Bool
	interrupt func() // made once a connection: sets cancelled and unblocks its reads and writes
}

// limitedReader reads from r, at most n bytes while n >= 0 (n < 0: unbounded).
type limitedReader struct {
	r     io.Reader
	n     int64
	total int64 // bytes read, ever
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		n, err := l.r.Read(p)
		l.total += int64(n)
		return n, err
	}
	if l.n == 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	l.total += int64(n)
	return n, err
}

func newH1(dial func(ctx context.Context, network, addr string) (net.Conn, error), fallback *http.Transport, maxIdle int) *h1 {
	if maxIdle <= 0 {
		maxIdle = http.DefaultMaxIdleConnsPerHost
	}
	return &h1{dial: dial, fallback: fallback, maxIdle: maxIdle, idleTimeout: 90 * time.Second, idle: map[string]*idleConns{}}
}

// handles reports whether h1 sends req itself.
func handles(req *http.Request) bool {
	if req.URL.Scheme != "http" || req.URL.User != nil {
		return false
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	if _, ok := req.Header["Expect"]; ok {
		return false
	}
	_, up := req.Header["Upgrade"]
	return !up && req.Method != http.MethodConnect
}

// RoundTrip sends req and returns the answer, whose body reads from the connection.
func (t *h1) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.off || !handles(req) {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	host := dialAddr(req.URL)
	for try := 0; ; try++ {
		c, err := t.get(ctx, host)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		resp, retry, err := t.exchange(ctx, c, req)
		if err == nil {
			return resp, nil
		}
		// A kept-alive connection that failed before any byte of an answer, for a request
		// that may go again (its write failed, so the server never had it whole; or it is
		// idempotent): once more on a new connection, as net/http's Transport does.
		if !retry || try > 0 || ctx.Err() != nil {
			closeBody(req)
			return nil, err
		}
		if req.GetBody != nil {
			b, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			req = shallowWithBody(req, b)
		}
	}
}

// dialAddr is the host:port to dial for u (an http URL), which also keys the idle pool: the
// URL's own Host when it names a port (no new string each request), else with port 80; an
// IPv6 zone is unescaped ("%25" in a URL is "%" to the resolver).
func dialAddr(u *url.URL) string {
	if port := u.Port(); port != "" && strings.IndexByte(u.Host, '%') < 0 {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), cmp.Or(u.Port(), "80"))
}

// exchange writes req on c and reads the answer's head. retry reports that c was a reused
// connection that failed before any byte of an answer arrived and that req may go again.
func (t *h1) exchange(ctx context.Context, c *h1Conn, req *http.Request) (*http.Response, bool, error) {
	b := &h1Body{t: t, c: c}
	c.cancelled.Store(false)
	b.watch.Watch(ctx, c.interrupt)
	fail := func(err error) (*http.Response, bool, error) {
		b.watch.Stop()
		_ = c.c.Close()
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return nil, false, err
	}
	before := c.lim.total
	werr := writeRequest(c.bw, req)
	c.releaseWriter() // an answer streamed for minutes does not hold the request's buffer
	if errors.Is(werr, errInvalidHeader) {
		// Nothing went out that a server should read (the connection is closed with it), and
		// another connection would refuse it as well.
		return fail(werr)
	} else if werr != nil {
		// A server (or a proxy in front of it) may answer before it has read the whole body
		// (413, 400) and close: that answer is the request's, as net/http's Transport gives
		// it. Nothing else is waited for: the answer is read only if it is already there.
		var early *http.Response
		if isReset(werr) && ctx.Err() == nil {
			_ = c.c.SetReadDeadline(time.Now().Add(earlyAnswerWait))
			b.recancel() // a cancel that came meanwhile still unblocks the read at once
			if r, err := readHead(c, req); err == nil && !(c.reuse && r.StatusCode == http.StatusRequestTimeout) {
				early = r
			}
		}
		if early == nil {
			if c.reuse && ctx.Err() == nil {
				b.watch.Stop()
				_ = c.c.Close()
				return nil, true, werr
			}
			return fail(werr)
		}
		_ = c.c.SetReadDeadline(time.Time{}) // the body reads as any answer's
		b.recancel()
		early.Close = true // the connection is done with
		return t.answer(b, c, req, early, fail)
	}
	resp, err := readHead(c, req)
	if err != nil {
		// A kept-alive connection that ended before any byte of an answer: the server may
		// have closed it as the request went out (nothing ran), or taken the request and
		// died. Only a request that may run twice goes again (net/http's rule): a POST to a
		// model server is not sent twice behind the retry policy's back.
		nothing := c.lim.total == before
		if c.reuse && ctx.Err() == nil && nothing && replayable(req) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)) {
			b.watch.Stop()
			_ = c.c.Close()
			return nil, true, fmt.Errorf("upstream: server closed idle connection: %w", err)
		}
		return fail(err)
	}
	return t.answer(b, c, req, resp, fail)
}

// recancel puts the cancel's past deadline back on the connection if the request was
// cancelled: a deadline set after the cancel fired must not outlive it.
func (b *h1Body) recancel() {
	if b.c.cancelled.Load() {
		_ = b.c.c.SetDeadline(longAgo)
	}
}

// earlyAnswerWait bounds reading an answer the server sent before it read the whole request.
const earlyAnswerWait = 250 * time.Millisecond

// readHead reads the head of the answer to req on c, skipping 1xx answers (at most
// maxInformational), each head within MaxResponseHeaderBytes.
func readHead(c *h1Conn, req *http.Request) (*http.Response, error) {
	c.lim.n = MaxResponseHeaderBytes
	for n := 0; ; n++ {
		r, err := readResponse(c.br, req)
		if err != nil {
			return nil, err
		}
		if r.StatusCode >= 200 || r.StatusCode == http.StatusSwitchingProtocols {
			return r, nil
		}
		if n+1 >= maxInformational {
			return nil, errTooManyInformational
		}
		c.lim.n = MaxResponseHeaderBytes
	}
}

// answer hands resp's body to the caller through the connection's h1Body.
func (t *h1) answer(b *h1Body, c *h1Conn, req *http.Request, resp *http.Response, fail func(error) (*http.Response, bool, error)) (*http.Response, bool, error) {
	c.lim.n = -1
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body.Close()
		return fail(errors.New("upstream: unexpected 101 Switching Protocols"))
	}
	b.rc, b.keep = resp.Body, !resp.Close && !req.Close
	resp.Body = b
	if resp.ContentLength == 0 && !chunked(resp) {
		// No body to read (HEAD, 204, 304, Content-Length: 0): the connection is free now.
		b.done()
	}
	return resp, false, nil
}

func chunked(r *http.Response) bool {
	return len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked"
}

// h1Body is an answer's body: it reads from the connection, and gives the connection back
// to the pool when read to its end (or closes it when left unread or broken).
type h1Body struct {
	rc     io.ReadCloser
	t      *h1
	c      *h1Conn
	watch  scope.Hook // the request's context, interrupting the connection when it ends
	keep   bool
	eof    bool
	closed bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errors.New("upstream: read on a closed body")
	}
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.done()
	case err != nil:
		b.abandon()
	}
	return n, err
}

// done: the body was read to its end; the connection goes back to the pool when it may.
func (b *h1Body) done() {
	if b.eof || b.closed {
		return
	}
	b.eof = true
	if b.watch.Stop() && b.keep && !b.c.cancelled.Load() {
		b.t.put(b.c)
		return
	}
	_ = b.c.c.Close()
}

// abandon closes the connection: the body is left unread or broke.
func (b *h1Body) abandon() {
	if b.eof || b.closed {
		return
	}
	b.closed = true
	b.watch.Stop()
	_ = b.c.c.Close()
}

func (b *h1Body) Close() error {
	if !b.eof {
		b.abandon()
	}
	b.closed = true
	return nil
}

// get takes an idle connection to host, or dials one.
func (t *h1) get(ctx context.Context, host string) (*h1Conn, error) {
	now := time.Now()
	for {
		t.mu.Lock()
		p := t.idle[host]
		if p == nil || len(p.l) == 0 {
			t.mu.Unlock()
			break
		}
		c := p.l[len(p.l)-1]
		p.l[len(p.l)-1] = nil
		p.l = p.l[:len(p.l)-1]
		t.mu.Unlock()
		// The peek and the close are system calls: outside the pool's lock.
		if now.Sub(c.used) < t.idleTimeout && socket.Idle(c.c) {
			c.reuse = true
			c.buffers()
			return c, nil
		}
		// Too old, or the server closed it while it was idle (uvicorn's keep-alive time-out
		// is 5 s): net/http's Transport sees that with its read loop, this pool with a peek.
		_ = c.c.Close()
	}
	nc, err := t.dial(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	// Raw reads and writes for the exchange (the rest is nc's), and Idle's peek without an
	// allocation when the connection is reused.
	sc := socket.Wrap(nc)
	c := &h1Conn{c: sc, host: host}
	c.interrupt = func() { // on the cancelling goroutine for a Scope: must not block
		c.cancelled.Store(true)
		_ = c.c.SetDeadline(longAgo)
	}
	c.lim = limitedReader{r: sc, n: -1}
	c.buffers()
	return c, nil
}

// buffers gives c its reader and writer for an exchange.
func (c *h1Conn) buffers() {
	c.br = connReaders.Get().(*bufio.Reader)
	c.br.Reset(&c.lim)
	c.bw = connWriters.Get().(*bufio.Writer)
	c.bw.Reset(c.c)
}

// release gives c's buffers back: it is idle, and nothing reads or writes it until buffers.
// An answer's body read to its end reads no more (h1Body.eof), so the reader is free.
func (c *h1Conn) release() {
	c.br.Reset(nil)
	connReaders.Put(c.br)
	c.br = nil
	c.releaseWriter()
}

// releaseWriter gives c's writer back once the request is written (or failed to be).
func (c *h1Conn) releaseWriter() {
	if c.bw != nil {
		c.bw.Reset(nil)
		connWriters.Put(c.bw)
		c.bw = nil
	}
}

// idleConns are a host's idle connections, most recently used last: held by pointer, so
// that taking one or giving one back writes the list, not the map.
type idleConns struct{ l []*h1Conn }

// put returns a connection to the pool (closing it when the pool is full or closed).
func (t *h1) put(c *h1Conn) {
	if c.br.Buffered() > 0 {
		_ = c.c.Close() // bytes past the answer: the server is confused
		return
	}
	_ = c.c.SetDeadline(time.Time{})
	c.used = time.Now()
	c.release()
	if !t.keep(c) {
		_ = c.c.Close() // a system call: outside the pool's lock, as in get
	}
}

// keep lists c as idle, unless the pool is closed or holds maxIdle for its host already.
func (t *h1) keep(c *h1Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.idle[c.host]
	if t.closed || (p != nil && len(p.l) >= t.maxIdle) {
		return false
	}
	if p == nil {
		p = new(idleConns)
		t.idle[c.host] = p
	}
	p.l = append(p.l, c)
	if t.sweeping == nil {
		t.sweeping = time.AfterFunc(t.idleTimeout, t.sweep)
	}
	return true
}

// sweep closes the idle connections past idleTimeout. get takes the most recently used, so
// after a burst the rest would otherwise stay open (in CLOSE_WAIT once the server closed
// its side) until traffic drains the pool down to them. It runs again while any stay idle:
// when the oldest of them expires, at most once per sweepEvery.
func (t *h1) sweep() {
	now := time.Now()
	var expired []*h1Conn
	t.mu.Lock()
	next := time.Duration(-1)
	for host, p := range t.idle {
		l := p.l
		n := 0 // l is oldest first: the expired ones are a prefix
		for n < len(l) && now.Sub(l[n].used) >= t.idleTimeout {
			n++
		}
		expired = append(expired, l[:n]...)
		clear(l[:n])
		switch l = l[n:]; {
		case len(l) == 0:
			delete(t.idle, host)
		default:
			p.l = l
			if wait := t.idleTimeout - now.Sub(l[0].used); next < 0 || wait < next {
				next = wait
			}
		}
	}
	t.sweeping = nil
	if next >= 0 && !t.closed {
		t.sweeping = time.AfterFunc(max(next, sweepEvery), t.sweep)
	}
	t.mu.Unlock()
	for _, c := range expired {
		_ = c.c.Close()
	}
}

// close closes the idle connections (the fallback's too), and every connection that goes idle
// from now on: the answers still being read when the last cluster using the client closed
// do not leave their connections in a pool nothing takes from again.
func (t *h1) close() {
	t.mu.Lock()
	t.closed = true
	if t.sweeping != nil {
		t.sweeping.Stop()
		t.sweeping = nil
	}
	t.mu.Unlock()
	t.CloseIdleConnections()
}

// CloseIdleConnections closes the idle connections (the fallback's too).
func (t *h1) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string]*idleConns{}
	t.mu.Unlock()
	for _, p := range idle {
		for _, c := range p.l {
			_ = c.c.Close()
		}
	}
	t.fallback.CloseIdleConnections()
}

// appendURI appends u's request target: its opaque form when it has one, else
// u.RequestURI() without making the string.
func appendURI(b []byte, u *url.URL) []byte {
	if u.Opaque != "" {
		return append(b, u.Opaque...)
	}
	if p := u.EscapedPath(); p != "" {
		b = append(b, p...)
	} else {
		b = append(b, '/')
	}
	if u.ForceQuery || u.RawQuery != "" {
		b = append(b, '?')
		b = append(b, u.RawQuery...)
	}
	return b
}

// writeRequest writes req as HTTP/1.1: the request line, Host, the headers, Content-Length,
// and the body.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	// The head is appended to the writer's free buffer and written once (one copy, where a
	// WriteString a piece was two dozen calls); a head larger than the buffer grows it.
	b := w.AvailableBuffer()
	b = append(b, method...)
	b = append(b, ' ')
	b = appendURI(b, req.URL)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	for k, vs := range req.Header {
		// Names and values that would break the request's framing are refused here, in the
		// one pass that writes them: nothing of the head has gone out yet, and the caller
		// closes the connection.
		if !httphead.ValidName(k) {
			return fmt.Errorf("%w name %q", errInvalidHeader, k)
		}
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection":
			continue
		}
		for _, v := range vs {
			if !httphead.ValidValue(v) {
				return fmt.Errorf("%w value for %q", errInvalidHeader, k)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		b = append(b, "User-Agent: sluice\r\n"...)
	}
	if req.Close {
		b = append(b, "Connection: close\r\n"...)
	}
	var body io.ReadCloser
	if req.Body != nil && req.Body != http.NoBody {
		body = req.Body
	}
	switch {
	case body != nil && req.ContentLength > 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, req.ContentLength, 10)
		b = append(b, "\r\n"...)
	case body != nil || req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch:
		if body != nil && req.ContentLength < 0 {
			return errors.New("upstream: a body of unknown length") // not handled here (see handles)
		}
		b = append(b, "Content-Length: 0\r\n"...)
	}
	b = append(b, "\r\n"...)
	if _, err := w.Write(b); err != nil {
		return err
	}
	if body != nil {
		n, err := io.Copy(w, body)
		body.Close()
		if err != nil {
			return fmt.Errorf("upstream: writing the request body: %w", err)
		}
		if n != req.ContentLength {
			return fmt.Errorf("upstream: request body of %d bytes, Content-Length %d", n, req.ContentLength)
		}
	}
	return w.Flush()
}

// errInvalidHeader: a request header whose name or value would break the request's framing.
var errInvalidHeader = errors.New("upstream: invalid header")

// replayable reports whether req may be sent again after it may have reached the server:
// an idempotent method, or a request that says it is idempotent (Idempotency-Key), as
// net/http's Transport decides.
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// shallowWithBody is req with another body (a retry's).
func shallowWithBody(req *http.Request, body io.ReadCloser) *http.Request {
	r := *req
	r.Body = body
	return &r
}
