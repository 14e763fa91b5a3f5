package http1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/proxy/alarm"
	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/proxy/scope"
	"github.com/sluicegw/sluice/proxy/socket"
)

// maxDiscard is how much of a body the handler left unread the server reads and drops to
// keep the connection (net/http's figure); past it the connection closes.
const maxDiscard = 256 << 10

var longAgo = time.Unix(1, 0)

// conn is one client connection served here.
type conn struct {
	srv    *Server
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	remote string

	resp response // reused: the handler must not keep its ResponseWriter (net/http's rule)
	// head is the request being read: the handler gets a copy with the request's context
	// (WithContext), and it is cleared once the request is done.
	head http.Request

	rd, wd deadline // the connection's read and write deadlines, kept by alarms

	// The watch for the client going away, armed when a request's body has been read.
	wmu       sync.Mutex
	watch     *alarm.Alarm
	watchDone chan struct{}
	armed     bool
	reqDone   bool
	polled    bool         // the watch waits in the server's Watcher (token), not in a goroutine
	token     uint64       // the Watcher's registration
	sc        net.Conn     // the connection as socket.Wrap made it (the Watcher takes it)
	watchFn   func()       // watchConn as a func, made at the connection's first watch
	req       *scope.Scope // the request's context: cancelled with ErrClientGone
	aborting  atomic.Bool

	state atomic.Int32 // connNew, connIdle or connBusy (Server.add, Server.track)
	born  time.Time    // when it was accepted: a new one Shutdown spares for newConnGrace
}

// A connection's states, for Shutdown: one between requests is closed at once; a new one
// (accepted, its first request not yet read) after newConnGrace; a busy one not.
const (
	connBusy int32 = iota
	connIdle
	connNew
)

// newConnGrace is how long Shutdown leaves a new connection to send its first request, as
// net/http's server does: a client that just connected is sending it (a load balancer's
// connection opened ahead of a request included), and closing the connection under it
// loses that request, where a kept-alive connection's client knows the server may close it.
const newConnGrace = 5 * time.Second

func (c *conn) serve() {
	s := c.srv
	handed := false
	sc := socket.Wrap(c.nc) // raw reads and writes for the request path; the rest is nc's
	c.sc = sc
	c.rd.set, c.wd.set = c.nc.SetReadDeadline, c.nc.SetWriteDeadline
	c.br, c.bw = getReader(sc), getWriter(sc)
	c.remote = c.nc.RemoteAddr().String()
	c.watchDone = make(chan struct{}, 1)
	defer func() {
		s.untrack(c)
		if c.watch != nil {
			c.watch.Stop()
		}
		c.rd.stop()
		c.wd.stop()
		if !handed {
			_ = c.nc.Close()
			putReader(c.br)
		}
		putWriter(c.bw)
		s.connsWG.Done()
	}()
	parent := s.BaseContext
	if parent == nil {
		parent = context.Background()
	}
	// The connection's scope, in which each request's is made (listed there: no map, channel
	// or closure a request).
	base := scope.New(parent, nil, time.Time{}, nil)
	defer base.Cancel(context.Canceled)
	for first := true; ; first = false {
		wait := s.IdleTimeout
		if first || wait == 0 {
			wait = s.ReadHeaderTimeout
		}
		c.rd.after(wait)
		if _, err := c.br.Peek(1); err != nil {
			return // closed, idle too long, or the server closed it
		}
		if !s.track(c, false) && !first {
			return // the server is shutting down: it closed this idle connection, or would
		}
		// A new connection's first request is served even so (Shutdown spares it for
		// newConnGrace): its answer says Connection: close.
		c.rd.after(s.ReadHeaderTimeout)
		ok, n, err := c.readHead()
		switch {
		case err != nil:
			return
		case !ok:
			s.untrack(c)
			handed = true
			c.rd.stop() // net/http's server sets its own deadlines on the connection
			c.wd.stop()
			s.hand(c.nc, c.br)
			return
		}
		_, _ = c.br.Discard(n)
		_ = c.rd.Set(time.Time{})
		if !c.serveRequest(base) {
			return
		}
		if !s.track(c, true) {
			return
		}
	}
}

// readHead reads ahead (without consuming) the next request's head and parses it into
// c.head: true and the head's length when this server serves it; false when the fallback
// must (the head is unusual, too large for the buffer, or not one net/http would accept);
// an error when the connection failed first (cut off, or too slow: closed without an
// answer, as net/http does).
func (c *conn) readHead() (bool, int, error) {
	head, err := httphead.Peek(c.br)
	if head == nil {
		return false, 0, err
	}
	return parseRequest(&c.head, head), len(head), nil
}

// serveRequest runs the handler on the request read into c.head and finishes its answer;
// false when the connection must close.
func (c *conn) serveRequest(base *scope.Scope) (keep bool) {
	ctx := scope.New(base, nil, time.Time{}, nil)
	defer ctx.Cancel(context.Canceled)
	c.head.RemoteAddr = c.remote
	var b *body // a new one each request: a transport may still read the last one
	if c.head.ContentLength > 0 {
		b = &body{c: c, lr: httphead.Body{R: c.br, N: c.head.ContentLength}}
		c.head.Body = b
	}
	req := c.head.WithContext(ctx)
	c.head = http.Request{} // what the request holds is not kept while the connection idles
	c.resp.reset(c, req)
	c.wmu.Lock()
	c.req, c.reqDone, c.armed = ctx, false, false
	c.wmu.Unlock()
	if b == nil {
		c.arm()
	}
	ok := c.run(req)
	c.disarm()
	if !ok {
		if b != nil {
			_ = b.Close()
		}
		return false
	}
	keep = c.resp.finish(b != nil && b.left() > maxDiscard)
	// The handler's write deadline bounded the flush above; the next request sets its own
	// (net/http clears it after each request too).
	_ = c.wd.Set(time.Time{})
	if b != nil && !b.drain(c.srv.ReadHeaderTimeout) {
		keep = false
	}
	return keep
}

// run calls the handler; false when it panicked (the connection closes, as net/http does,
// with the panic logged unless it is http.ErrAbortHandler).
func (c *conn) run(req *http.Request) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			ok = false
			if r != http.ErrAbortHandler {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.srv.logf("http1: panic serving %s: %v\n%s", c.remote, r, buf)
			}
		}
	}()
	c.srv.Handler.ServeHTTP(&c.resp, req)
	return true
}

// arm starts the watch for the client going away, WatchAfter from now.
func (c *conn) arm() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.reqDone || c.armed {
		return
	}
	c.armed = true
	if c.watch == nil {
		// The first watch of the connection: its funcs are made now, not for every connection
		// (most requests end before WatchAfter).
		c.watchFn = c.watchConn
		c.watch = alarm.After(c.srv.WatchAfter, c.watchFired)
	} else {
		c.watch.Reset(c.srv.WatchAfter)
	}
}

// watchFired runs when the watch's alarm comes due, in a goroutine of its own: the connection
// goes to the server's Watcher, which runs watchConn only when the client sends a byte or
// goes (a held stream keeps no goroutine for it), or, where there is none or the request
// ended meanwhile (disarm then waits for watchConn), watchConn runs here.
func (c *conn) watchFired() {
	if w := c.srv.watching(); w != nil && c.br.Buffered() == 0 {
		c.wmu.Lock()
		if c.armed {
			if tok, ok := w.Add(c.sc, c.watchFn); ok {
				c.polled, c.token = true, tok
				c.wmu.Unlock()
				return
			}
		}
		c.wmu.Unlock()
	}
	c.watchConn()
}

// disarm ends the watch: stops it before it started, takes it back from the Watcher before it
// ran, or ends its read.
func (c *conn) disarm() {
	c.wmu.Lock()
	armed, polled, tok := c.armed, c.polled, c.token
	c.armed, c.reqDone, c.polled = false, true, false
	c.wmu.Unlock()
	switch {
	case !armed:
		return
	case polled:
		if c.srv.watcher.Remove(tok) {
			return // watchConn will not run
		}
	case c.watch.Stop():
		return
	}
	c.aborting.Store(true)
	_ = c.rd.Set(longAgo)
	<-c.watchDone
	c.aborting.Store(false)
	_ = c.rd.Set(time.Time{})
}

// watchConn waits for the connection's next byte: a byte (the next request) ends the watch;
// the connection's end cancels the request with ErrClientGone.
func (c *conn) watchConn() {
	defer func() { c.watchDone <- struct{}{} }()
	_, err := c.br.Peek(1)
	if err == nil || c.aborting.Load() || isTimeout(err) {
		return
	}
	c.wmu.Lock()
	req := c.req
	c.wmu.Unlock()
	req.Cancel(ErrClientGone)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// body is a request body of known length read from the connection.
type body struct {
	mu     sync.Mutex
	c      *conn
	lr     httphead.Body
	closed bool
	armed  bool
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.lr.Read(p)
	if err == io.EOF && !b.armed {
		b.armed = true
		b.c.arm() // read to its end: the watch for the client going away may start
	}
	return n, err
}

// Close marks the body closed: a later Read fails; the server drops what is left.
func (b *body) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// Arrived reports whether the rest of the body is in the connection's buffer already, so
// that no read of it waits for the client: a handler need not bound its reading (the
// gateway's body time-out), which would cost it a deadline set and lifted. Call it before
// the body is read to its end: from then on the client-gone watch may read the connection.
func (b *body) Arrived() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.closed && b.lr.N <= int64(b.c.br.Buffered())
}

func (b *body) left() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lr.N
}

// drain reads and drops what the handler left of the body, within d; false when the
// connection cannot be kept (too much left, or the read failed).
func (b *body) drain(d time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	switch {
	case b.lr.N == 0:
		return true
	case b.lr.Err != nil || b.lr.N > maxDiscard:
		return false
	}
	b.c.rd.after(d)
	_, err := io.CopyN(io.Discard, b.c.br, b.lr.N)
	_ = b.c.rd.Set(time.Time{})
	b.lr.N = 0
	return err == nil
}
