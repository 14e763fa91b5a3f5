//go:build linux

package socket

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// pair is a connected loopback TCP pair.
func pair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

type wrapper struct{ net.Conn }

func (w wrapper) Unwrap() net.Conn { return w.Conn }

type opaque struct{ net.Conn }

func TestWrapFindsTheSocket(t *testing.T) {
	c, _ := pair(t)
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	dir := t.TempDir()
	uln, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer uln.Close()
	go func() {
		if c, err := uln.Accept(); err == nil {
			c.Close()
		}
	}()
	uc, err := net.Dial("unix", uln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	wrapped := Wrap(c)
	for _, tc := range []struct {
		name string
		in   net.Conn
		raw  bool
	}{
		{"a TCP connection", c, true},
		{"a Unix connection", uc, true},
		{"a wrapper that unwraps", wrapper{c}, true},
		{"two wrappers", wrapper{wrapper{c}}, true},
		{"a wrapper that does not unwrap", opaque{c}, false},
		{"a pipe", p1, false},
		{"already wrapped", wrapped, true},
	} {
		got := Wrap(tc.in)
		sc, raw := got.(*Conn)
		if raw != tc.raw {
			t.Errorf("%s: Wrap gave %T, raw %v; want raw %v", tc.name, got, raw, tc.raw)
			continue
		}
		if !raw && got != tc.in {
			t.Errorf("%s: Wrap did not return the connection itself", tc.name)
		}
		if raw && tc.in != wrapped && sc.Unwrap() != tc.in {
			t.Errorf("%s: Unwrap gave %T, want the connection given", tc.name, sc.Unwrap())
		}
	}
	if Wrap(wrapped) != wrapped {
		t.Error("Wrap of a wrapped connection wrapped it again")
	}
}

// TestTransferBothWays: megabytes both ways at once through small socket buffers (so that
// writes find them full and wait, and reads find nothing and wait), every byte as sent.
func TestTransferBothWays(t *testing.T) {
	c, s := pair(t)
	for _, tc := range []*net.TCPConn{c, s} {
		_ = tc.SetWriteBuffer(32 << 10)
		_ = tc.SetReadBuffer(32 << 10)
	}
	a, b := Wrap(c), Wrap(s)
	const size = 4 << 20
	send := func(w net.Conn, seed uint64, errs chan<- error) [32]byte {
		r := rand.New(rand.NewPCG(seed, 1))
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		go func() {
			for off := 0; off < size; {
				n := min(size-off, 1+r.IntN(300<<10)) // some writes larger than maxIO
				m, err := w.Write(data[off : off+n])
				if err != nil || m != n {
					errs <- errors.Join(err, errors.New("short write"))
					return
				}
				off += n
			}
			errs <- nil
		}()
		return sha256.Sum256(data)
	}
	recv := func(r net.Conn, seed uint64, got chan<- [32]byte) {
		rr := rand.New(rand.NewPCG(seed, 2))
		h := sha256.New()
		buf := make([]byte, 64<<10)
		total := 0
		for total < size {
			n, err := r.Read(buf[:1+rr.IntN(len(buf))])
			h.Write(buf[:n])
			total += n
			if err != nil {
				break
			}
		}
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		got <- sum
	}
	_ = a.SetDeadline(time.Now().Add(30 * time.Second))
	_ = b.SetDeadline(time.Now().Add(30 * time.Second))
	errs := make(chan error, 2)
	gotAB, gotBA := make(chan [32]byte, 1), make(chan [32]byte, 1)
	go recv(b, 1, gotAB)
	go recv(a, 2, gotBA)
	wantAB := send(a, 3, errs)
	wantBA := send(b, 4, errs)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	if got := <-gotAB; got != wantAB {
		t.Error("a → b: the bytes read are not the bytes written")
	}
	if got := <-gotBA; got != wantBA {
		t.Error("b → a: the bytes read are not the bytes written")
	}
	for _, sc := range []*Conn{a.(*Conn), b.(*Conn)} {
		sc.rd.mu.Lock()
		sc.wr.mu.Lock()
		rw, ww := sc.rd.waits, sc.wr.waits
		sc.wr.mu.Unlock()
		sc.rd.mu.Unlock()
		if rw == 0 || ww == 0 {
			t.Errorf("reads waited %d times, writes %d: want both to have found the socket not ready", rw, ww)
		}
	}
}

// TestWritesDoNotInterleave: each Write of concurrent writers arrives whole, as net.Conn's.
func TestWritesDoNotInterleave(t *testing.T) {
	c, s := pair(t)
	_ = c.SetWriteBuffer(4 << 10)
	w := Wrap(c)
	const writers, each, block = 4, 50, 16 << 10
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			b := bytes.Repeat([]byte{byte('a' + i)}, block)
			for range each {
				if _, err := w.Write(b); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		})
	}
	_ = s.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, block)
	for n := range writers * each {
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatalf("block %d: %v", n, err)
		}
		if bytes.Count(buf, buf[:1]) != block {
			t.Fatalf("block %d mixes two writes", n)
		}
	}
	wg.Wait()
}

// errorShape is what a caller looks at in a connection's error.
type errorShape struct {
	text             string
	timeout, closed  bool
	eof              bool
	reset, brokePipe bool
}

func shapeOf(err error) errorShape {
	var ne net.Error
	return errorShape{
		text:      errText(err),
		timeout:   errors.As(err, &ne) && ne.Timeout() && errors.Is(err, os.ErrDeadlineExceeded),
		closed:    errors.Is(err, net.ErrClosed),
		eof:       err == io.EOF,
		reset:     errors.Is(err, syscall.ECONNRESET),
		brokePipe: errors.Is(err, syscall.EPIPE),
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return addrs.ReplaceAllString(err.Error(), "ADDR")
}

var addrs = regexp.MustCompile(`127\.0\.0\.1:\d+`)

// TestErrorsAreNetConns: in each situation Conn's error reads as net.Conn's own, text
// included, on the same connection.
func TestErrorsAreNetConns(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup makes the situation on the pair (c is the side under test); do is the call.
		setup func(c, peer *net.TCPConn)
		do    func(c net.Conn) error
	}{
		{"read past the deadline", func(c, _ *net.TCPConn) { _ = c.SetReadDeadline(time.Now().Add(-time.Second)) },
			func(c net.Conn) error { _, err := c.Read(make([]byte, 8)); return err }},
		{"read until the deadline", func(c, _ *net.TCPConn) { _ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)) },
			func(c net.Conn) error { _, err := c.Read(make([]byte, 8)); return err }},
		{"write past the deadline", func(c, _ *net.TCPConn) { _ = c.SetWriteDeadline(time.Now().Add(-time.Second)) },
			func(c net.Conn) error { _, err := c.Write([]byte("x")); return err }},
		{"read at the end", func(_, peer *net.TCPConn) { _ = peer.CloseWrite() },
			func(c net.Conn) error { _, err := c.Read(make([]byte, 8)); return err }},
		{"read after close", func(c, _ *net.TCPConn) { c.Close() },
			func(c net.Conn) error { _, err := c.Read(make([]byte, 8)); return err }},
		{"write after close", func(c, _ *net.TCPConn) { c.Close() },
			func(c net.Conn) error { _, err := c.Write([]byte("x")); return err }},
	} {
		var shapes [2]errorShape
		for i, raw := range []bool{false, true} {
			c, peer := pair(t)
			tc.setup(c, peer)
			var conn net.Conn = c
			if raw {
				conn = Wrap(c)
			}
			shapes[i] = shapeOf(tc.do(conn))
		}
		if shapes[0] != shapes[1] {
			t.Errorf("%s:\n net.Conn: %+v\n raw:      %+v", tc.name, shapes[0], shapes[1])
		}
		if shapes[1].text == "<nil>" {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// TestReset: a peer that reset the connection fails a read with ECONNRESET and a write with
// ECONNRESET or EPIPE, named as net.Conn names them.
func TestReset(t *testing.T) {
	c, peer := pair(t)
	w := Wrap(c)
	_ = peer.SetLinger(0)
	peer.Close()
	_ = w.SetDeadline(time.Now().Add(10 * time.Second))
	_, rerr := w.Read(make([]byte, 8))
	if !errors.Is(rerr, syscall.ECONNRESET) || !strings.HasPrefix(errText(rerr), "read tcp ADDR->ADDR: ") || !strings.HasSuffix(rerr.Error(), ": connection reset by peer") {
		t.Errorf("read after a reset: %v", rerr)
	}
	var werr error
	for range 100 { // the first write after a reset may be taken before the kernel knows
		if _, werr = w.Write([]byte("hello")); werr != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !(errors.Is(werr, syscall.ECONNRESET) || errors.Is(werr, syscall.EPIPE)) || !strings.HasPrefix(errText(werr), "write tcp ADDR->ADDR: ") {
		t.Errorf("write after a reset: %v", werr)
	}
}

// TestWriteRaisesNoSIGPIPE: a write to a connection whose peer is gone fails with EPIPE (or
// ECONNRESET) and raises no SIGPIPE: a program that asked for SIGPIPE (signal.Notify) would
// otherwise get one for every client that went away mid-answer.
func TestWriteRaisesNoSIGPIPE(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector's build writes with write(2)")
	}
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGPIPE)
	defer signal.Stop(sig)
	c, peer := pair(t)
	w := Wrap(c)
	_ = peer.SetLinger(0)
	peer.Close()
	var werr error
	for range 100 {
		if _, werr = w.Write([]byte("hello")); werr != nil && errors.Is(werr, syscall.EPIPE) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(werr, syscall.EPIPE) {
		t.Fatalf("writes after a reset: %v, want EPIPE in the end", werr)
	}
	select {
	case s := <-sig:
		t.Errorf("a write raised %v", s)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestWriteWaitsForRoom: a write larger than the socket's buffers to a peer that reads
// nothing waits on the poller until its deadline and reports what it wrote, as net.Conn's.
func TestWriteWaitsForRoom(t *testing.T) {
	c, _ := pair(t)
	_ = c.SetWriteBuffer(4 << 10)
	w := Wrap(c)
	_ = w.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	start := time.Now()
	n, err := w.Write(make([]byte, 64<<20))
	if !shapeOf(err).timeout {
		t.Fatalf("write to a peer that reads nothing: %v, want the write deadline", err)
	}
	if n <= 0 || n >= 64<<20 {
		t.Errorf("wrote %d bytes before the deadline, want some but not all", n)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Errorf("the write gave up after %v, before its deadline", el)
	}
}

// TestIdle: a peek tells an open connection with nothing to read from one the peer closed or
// reset, or one with bytes waiting; nothing is consumed.
func TestIdle(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(c, peer *net.TCPConn)
		want bool
	}{
		{"open, nothing to read", func(_, _ *net.TCPConn) {}, true},
		{"the peer closed it", func(_, peer *net.TCPConn) { peer.Close() }, false},
		{"the peer closed its side only", func(_, peer *net.TCPConn) { _ = peer.CloseWrite() }, false},
		{"the peer reset it", func(_, peer *net.TCPConn) { _ = peer.SetLinger(0); peer.Close() }, false},
		{"bytes waiting", func(_, peer *net.TCPConn) { _, _ = peer.Write([]byte("HTTP/1.1 200 OK\r\n")) }, false},
		{"closed here", func(c, _ *net.TCPConn) { c.Close() }, false},
	} {
		for _, wrapped := range []bool{false, true} {
			c, peer := pair(t)
			tc.make(c, peer)
			time.Sleep(20 * time.Millisecond) // what the peer did has arrived
			var conn net.Conn = c
			if wrapped {
				conn = Wrap(c)
			}
			if got := Idle(conn); got != tc.want {
				t.Errorf("%s (wrapped %v): Idle = %v, want %v", tc.name, wrapped, got, tc.want)
			}
			if tc.name == "bytes waiting" {
				_ = conn.SetReadDeadline(time.Now().Add(time.Second))
				b := make([]byte, 64)
				if n, _ := conn.Read(b); string(b[:n]) != "HTTP/1.1 200 OK\r\n" {
					t.Errorf("after the peek the connection read %q: the peek consumed bytes", b[:n])
				}
			}
		}
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if !Idle(p1) {
		t.Error("Idle of a pipe (no socket to peek at) = false, want true")
	}
}

// TestIdleAllocatesNothing: the pool peeks at a connection before each reuse (once a
// request): on a wrapped connection the peek costs no allocation.
func TestIdleAllocatesNothing(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector's system calls allocate")
	}
	c, _ := pair(t)
	w := Wrap(c)
	if n := testing.AllocsPerRun(100, func() {
		if !Idle(w) {
			t.Fatal("an open connection with nothing to read is not idle")
		}
	}); n != 0 {
		t.Errorf("Idle of a wrapped connection: %v allocations, want none", n)
	}
}

// BenchmarkIdleCalls measures the system calls the gateway makes on an idle socket that nginx
// does not (docs/performance.md): a read that finds nothing (EAGAIN: Go reads before it
// waits on the poller) and Idle's peek at a pooled connection.
func BenchmarkIdleCalls(b *testing.B) {
	client, _ := pair(b)
	c := Wrap(client).(*Conn)
	var fd uintptr
	if err := c.rd.rc.Control(func(f uintptr) { fd = f }); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	b.Run("read-nothing", func(b *testing.B) {
		for b.Loop() {
			if _, e := sysRead(fd, buf); e != syscall.EAGAIN {
				b.Fatalf("read on an idle socket: %v, want EAGAIN", e)
			}
		}
	})
	b.Run("read(2)-nothing", func(b *testing.B) { // what sysRead was: the file layer first
		for b.Loop() {
			if _, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf))); e != syscall.EAGAIN {
				b.Fatalf("read on an idle socket: %v, want EAGAIN", e)
			}
		}
	})
	b.Run("peek", func(b *testing.B) {
		for b.Loop() {
			if !Idle(c) {
				b.Fatal("an idle connection is not Idle")
			}
		}
	})
}

// BenchmarkWriteRead is a loopback write of 400 bytes (an answer's size) and its read on the
// other side: sysWrite and sysRead (send and recv), against write(2) and read(2).
func BenchmarkWriteRead(b *testing.B) {
	client, server := pair(b)
	fdOf := func(c *net.TCPConn) uintptr {
		var fd uintptr
		rc, err := c.SyscallConn()
		if err == nil {
			err = rc.Control(func(f uintptr) { fd = f })
		}
		if err != nil {
			b.Fatal(err)
		}
		return fd
	}
	w, r := fdOf(client), fdOf(server)
	msg, buf := make([]byte, 400), make([]byte, 4096)
	raw := func(call, fd uintptr, p []byte) (int, syscall.Errno) {
		n, _, e := syscall.RawSyscall(call, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		return int(n), e
	}
	for _, tc := range []struct {
		name        string
		write, read func(uintptr, []byte) (int, syscall.Errno)
	}{
		{"send+recv", sysWrite, sysRead},
		{"write(2)+read(2)", func(fd uintptr, p []byte) (int, syscall.Errno) { return raw(syscall.SYS_WRITE, fd, p) },
			func(fd uintptr, p []byte) (int, syscall.Errno) { return raw(syscall.SYS_READ, fd, p) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if n, e := tc.write(w, msg); e != 0 || n != len(msg) {
					b.Fatalf("write: %d, %v", n, e)
				}
				for got := 0; got < len(msg); { // the loopback delivers it before the write returns
					n, e := tc.read(r, buf)
					if e != 0 {
						b.Fatalf("read: %v", e)
					}
					got += n
				}
			}
		})
	}
}
