//go:build linux

package socket

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// maxIO bounds one raw read or write: a larger one is split, so that no single system call
// the runtime cannot preempt copies more than this.
const maxIO = 256 << 10

// Conn is a TCP connection whose Read and Write are raw system calls; everything else is the
// connection's own. It is safe for concurrent use as net.Conn is: reads are serialised with
// reads, writes with writes.
type Conn struct {
	net.Conn
	rd, wr op

	// Idle's peek, set up once (a closure per call would be an allocation per request);
	// under rd.mu.
	peekFn func(fd uintptr)
	idle   bool
}

// op is one direction's system call in progress, with the raw connection's callback for it.
type op struct {
	rc    syscall.RawConn
	mu    sync.Mutex
	p     []byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
	waits int // calls that found the socket not ready (EAGAIN): tests read it
}

// Wrap returns c with raw reads and writes when c is (or wraps, through Unwrap() net.Conn)
// a TCP or Unix stream connection, else c itself.
func Wrap(c net.Conn) net.Conn {
	if _, ok := c.(*Conn); ok {
		return c
	}
	rc := rawConn(c)
	if rc == nil {
		return c
	}
	sc := &Conn{Conn: c}
	sc.rd.rc, sc.wr.rc = rc, rc
	sc.rd.fn, sc.wr.fn = sc.rd.read, sc.wr.write
	sc.peekFn = sc.peek
	return sc
}

// Idle reports whether c, a connection nothing is reading, is still open with nothing to
// read: false when the peer closed or reset it, or sent bytes nobody asked for (one
// non-blocking peek at the socket, MSG_PEEK|MSG_DONTWAIT; nothing is consumed). A connection
// that is not a socket reports true: its state shows when it is used. Without an allocation
// for a Conn (Wrap's); a connection Wrap did not wrap costs the lookup of its socket.
func Idle(c net.Conn) bool {
	sc, ok := c.(*Conn)
	if !ok {
		if sc, ok = Wrap(c).(*Conn); !ok {
			return true
		}
	}
	sc.rd.mu.Lock()
	defer sc.rd.mu.Unlock()
	sc.idle = false
	return sc.rd.rc.Control(sc.peekFn) == nil && sc.idle
}

// peek is Idle's raw-connection callback.
func (c *Conn) peek(fd uintptr) {
	var b [1]byte
	for {
		_, e := sysPeek(fd, b[:])
		if e == syscall.EINTR {
			continue
		}
		// EAGAIN: open, nothing to read. Else the peer closed it (0 bytes), bytes are
		// waiting, or it failed (a reset).
		c.idle = e == syscall.EAGAIN
		return
	}
}

// Unwrap gives the connection under the raw calls.
func (c *Conn) Unwrap() net.Conn { return c.Conn }

// rawConn finds the raw connection under c: c's own for a TCP connection, else what c wraps.
func rawConn(c net.Conn) syscall.RawConn {
	for range 8 { // wrappers nest a few deep at most
		switch v := c.(type) {
		case *net.TCPConn:
			return syscallConn(v)
		case *net.UnixConn:
			return syscallConn(v)
		case interface{ Unwrap() net.Conn }:
			c = v.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

func syscallConn(c syscall.Conn) syscall.RawConn {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// Read reads what the socket has, waiting on the poller until it has something, up to the
// connection's read deadline. Its errors are net.Conn's: io.EOF at the end, else
// *net.OpError around the system call's error, os.ErrDeadlineExceeded or net.ErrClosed.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := c.rd.do(p, c.rd.rc.Read)
	if err != nil {
		return n, c.opError("read", err)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, waiting on the poller for room when the socket's buffer is full, up
// to the connection's write deadline. Its errors are Read's (but io.EOF).
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := c.wr.do(p, c.wr.rc.Write)
	if err != nil {
		return n, c.opError("write", err)
	}
	return n, nil
}

// do runs one read or write of p through the raw connection's Read or Write (run).
func (o *op) do(p []byte, run func(func(uintptr) bool) error) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.p, o.n, o.errno = p, 0, 0
	err := run(o.fn)
	n := o.n
	o.p = nil
	if err == nil && o.errno != 0 {
		err = o.errno // named by opError
	}
	return n, err
}

// opError wraps err as net.Conn would: the raw connection's own "raw-read"/"raw-write"
// wrapping is replaced by name's.
func (c *Conn) opError(name string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		err = os.NewSyscallError(name, errno)
	}
	return &net.OpError{Op: name, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// read is the raw connection's read callback: one read of what the socket has; false (wait
// for data) on EAGAIN.
func (o *op) read(fd uintptr) bool {
	p := o.p
	if len(p) > maxIO {
		p = p[:maxIO]
	}
	for {
		m, e := sysRead(fd, p)
		switch e {
		case 0:
			o.n = m // 0: the peer closed its side
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			o.waits++
			return false
		default:
			o.errno = e
			return true
		}
	}
}

// write is the raw connection's write callback: it writes what is left and reports whether
// the write is over (done or failed); false waits for room.
func (o *op) write(fd uintptr) bool {
	for o.n < len(o.p) {
		chunk := o.p[o.n:]
		if len(chunk) > maxIO {
			chunk = chunk[:maxIO]
		}
		m, e := sysWrite(fd, chunk)
		switch e {
		case 0:
			if m == 0 {
				o.errno = syscall.EIO // a socket never takes nothing of a non-empty write
				return true
			}
			o.n += m
		case syscall.EINTR:
		case syscall.EAGAIN:
			o.waits++
			return false
		default:
			o.errno = e
			return true
		}
	}
	return true
}
