// Package http1 is the gateway's own HTTP/1.1 server for plain (not TLS) connections: it
// reads a request and runs the handler on the connection's goroutine, watches the connection
// for the client going away only once a request has run a while, and hands to net/http
// every connection it does not serve itself.
//
// It serves the common case: an HTTP/1.1 request with a Host, a body of known length (or
// none), no Expect, no Upgrade, no Transfer-Encoding, its head within the read buffer.
// Anything else (h2c's preface, HTTP/1.0, chunked request bodies, 100-continue, heads too
// large or malformed) is left unread and the connection, from that request on, goes to the
// Fallback net/http server, which answers it as it always has: the exact errors (400, 431),
// h2c with prior knowledge, the limits. What this server does itself is what net/http's does
// for the same request: the same parsing (http.ReadRequest), keep-alive, a Date header,
// Content-Length for an answer the handler ended within 2 KiB, chunked encoding otherwise,
// Content-Type sniffing, discarding an unread body up to 256 KiB, the header and idle
// time-outs, a graceful Shutdown.
//
// Where it differs: net/http starts a goroutine per request that reads the connection to
// see the client leave; this server starts that watch only when the request has run for
// WatchAfter (after its body was read), so that the many short requests pay for no
// goroutine, no extra read and no deadline changes; a client that leaves is seen at most
// WatchAfter late (plus alarm.Grain: the watch is an alarm, which arms no runtime timer).
package http1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/proxy/socket"
)

// ErrClientGone is the cause of a request's context when the client closed its connection.
var ErrClientGone = errors.New("http1: the client closed the connection")

// bufSize is the read buffer of a connection: a request head must fit in it to be served
// here (the fallback serves larger ones, up to its MaxHeaderBytes).
const bufSize = 4 << 10

// Server serves HTTP/1.1 connections. Its fields are set before Serve and not changed.
type Server struct {
	Handler http.Handler
	// Fallback serves the connections handed to it (its Handler, normally the same). Its
	// Serve runs on a listener of this server's; Shutdown and Close shut it down too.
	Fallback *http.Server
	// BaseContext is the parent of every request's context (context.Background if nil).
	BaseContext context.Context
	// ReadHeaderTimeout bounds reading a request's head; IdleTimeout waiting for the next
	// request on a kept-alive connection (ReadHeaderTimeout when zero). Zero: no bound.
	ReadHeaderTimeout, IdleTimeout time.Duration
	// WatchAfter is how long a request runs (after its body was read) before the server
	// watches its connection for the client going away (up to alarm.Grain later); zero
	// watches at once.
	WatchAfter time.Duration
	Log        *slog.Logger

	mu       sync.Mutex
	conns    map[*conn]struct{} // the connections served (each says itself whether it is idle)
	connsMax int                // the most conns held since the map was last made (it never shrinks)
	lns      []net.Listener
	closed   atomic.Bool
	handoff  *chanListener
	fbDone   chan struct{}
	fbOnce   sync.Once
	connsWG  sync.WaitGroup

	// watcher tells the client-gone watches of many connections when their clients send or
	// go (socket.Watcher: one goroutine for all), made at the first watch; nil where it
	// cannot be (not Linux), and each watch is then a goroutine blocked in a read.
	watcherOnce sync.Once
	watcher     *socket.Watcher
	dateMu      sync.Mutex
	dateSec     int64
	dateText    []byte
}

// Serve accepts connections on ln and serves each on its own goroutine until Shutdown or
// Close; it then returns http.ErrServerClosed.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	if s.conns == nil {
		s.conns = map[*conn]struct{}{}
	}
	s.lns = append(s.lns, ln)
	s.startFallback(ln.Addr())
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closed.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors and the like: wait a little, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.logf("http1: accept error: %v; retrying in %v", err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		c := &conn{srv: s, nc: nc}
		s.connsWG.Add(1) // before the connection is tracked: Shutdown waits for what it tracks
		if !s.add(c) {
			s.connsWG.Done()
			_ = nc.Close()
			return http.ErrServerClosed
		}
		go c.serve()
	}
}

// startFallback runs the fallback server on the hand-off listener, once. s.mu is held.
func (s *Server) startFallback(addr net.Addr) {
	if s.handoff != nil {
		return
	}
	s.handoff = newChanListener(addr)
	s.fbDone = make(chan struct{})
	go func() {
		defer close(s.fbDone)
		defer s.handoff.shut() // a fallback that stopped takes no more connections: they close
		if err := s.Fallback.Serve(s.handoff); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.logf("http1: fallback server stopped: %v", err)
		}
	}()
}

// add tracks the new connection c (new until its first request); false once the server is
// closed.
func (s *Server) add(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	c.born = time.Now()
	c.state.Store(connNew)
	s.conns[c] = struct{}{}
	s.connsMax = max(s.connsMax, len(s.conns))
	return true
}

// track says whether c is idle (between requests) or serving one; false once the server is
// closed. No lock, nor map write, a request: c holds its state, and the store comes before
// the load of closed, as stop's store comes before closeIdle's loads, so that either c sees
// the server closed or closeIdle sees c idle.
func (s *Server) track(c *conn, idle bool) bool {
	if idle {
		c.state.Store(connIdle)
	} else {
		c.state.Store(connBusy)
	}
	return !s.closed.Load()
}

// untrack forgets c. A Go map keeps the table of its largest size: after a burst of
// thousands of connections the map is made anew once it holds an eighth of its peak (one
// copy of what is left, paid for by the deletes since the peak).
func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	if s.connsMax >= minConnsShrink && len(s.conns) <= s.connsMax/8 {
		m := make(map[*conn]struct{}, len(s.conns))
		for c := range s.conns {
			m[c] = struct{}{}
		}
		s.conns, s.connsMax = m, len(m)
	}
}

// watching returns the server's Watcher, made at the first call (nil: none, or closed).
func (s *Server) watching() *socket.Watcher {
	s.watcherOnce.Do(func() {
		if s.closed.Load() {
			return
		}
		if w, err := socket.NewWatcher(); err == nil {
			s.watcher = w
		}
	})
	return s.watcher
}

// closeWatcher stops the Watcher, if one was made; a later watching makes none.
func (s *Server) closeWatcher() {
	s.watcherOnce.Do(func() {}) // none from now on
	if s.watcher != nil {
		s.watcher.Close()
	}
}

// minConnsShrink is the least peak of connections after which the map is made anew.
const minConnsShrink = 1024

// Shutdown stops accepting, closes idle connections, lets the requests in flight end (their
// connections close after their answers) and waits for them until ctx ends; the fallback
// server shuts down the same way, in parallel. A new connection (its first request not yet
// read) has newConnGrace to send it, and it is served, as net/http's server does.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	var fbErr error
	fb := make(chan struct{})
	go func() {
		defer close(fb)
		fbErr = s.Fallback.Shutdown(ctx)
	}()
	done := make(chan struct{})
	go func() {
		s.connsWG.Wait()
		s.closeWatcher() // no watch is left (even when ctx ended first)
		close(done)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s.closeIdle()
		select {
		case <-done:
			<-fb
			return fbErr
		case <-ctx.Done():
			<-fb
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close closes the listeners and every connection at once, and the fallback server's.
func (s *Server) Close() error {
	s.stop()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.nc.Close()
	}
	s.mu.Unlock()
	s.closeWatcher()
	return s.Fallback.Close()
}

func (s *Server) stop() {
	s.mu.Lock()
	s.closed.Store(true)
	lns := s.lns
	s.lns = nil
	s.mu.Unlock()
	for _, ln := range lns {
		_ = ln.Close()
	}
	s.fbOnce.Do(func() {
		if s.handoff != nil {
			s.handoff.shut()
		}
	})
}

// closeIdle closes the connections between requests, and the new ones that have sent no
// request for newConnGrace.
func (s *Server) closeIdle() {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		switch c.state.Load() {
		case connIdle:
		case connNew:
			if now.Sub(c.born) < newConnGrace {
				continue
			}
		default:
			continue
		}
		_ = c.nc.Close()
		delete(s.conns, c)
	}
}

// hand gives nc (its unread bytes in br) to the fallback server.
func (s *Server) hand(nc net.Conn, br *bufio.Reader) {
	rc := net.Conn(nc)
	if br.Buffered() > 0 {
		rc = &replayConn{Conn: nc, br: br}
	} else {
		putReader(br)
	}
	if !s.handoff.push(rc) {
		_ = nc.Close()
	}
}

// date is the Date header's value now, formatted once a second.
func (s *Server) date(now time.Time) []byte {
	sec := now.Unix()
	s.dateMu.Lock()
	defer s.dateMu.Unlock()
	if sec != s.dateSec || s.dateText == nil {
		s.dateSec = sec
		s.dateText = now.UTC().AppendFormat(make([]byte, 0, len(http.TimeFormat)), http.TimeFormat)
	}
	return s.dateText
}

func (s *Server) logf(format string, args ...any) {
	if s.Log != nil {
		s.Log.Debug(fmt.Sprintf(format, args...))
	}
}
