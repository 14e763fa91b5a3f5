package http1

import (
	"bufio"
	"net"
	"sync"
)

// chanListener is the fallback server's listener: it accepts the connections handed to it.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	shut func()
}

func newChanListener(addr net.Addr) *chanListener {
	l := &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
	var once sync.Once
	l.shut = func() { once.Do(func() { close(l.done) }) }
	return l
}

// push hands c to the fallback server; false once it is closed.
func (l *chanListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error   { l.shut(); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// replayConn is a handed-off connection whose first bytes were already read into br.
type replayConn struct {
	net.Conn
	mu sync.Mutex
	br *bufio.Reader // nil once drained
}

func (c *replayConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if br := c.br; br != nil {
		if br.Buffered() > 0 {
			n, err := br.Read(p) // from the buffer only: no read of the connection
			c.mu.Unlock()
			return n, err
		}
		putReader(br)
		c.br = nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

// Unwrap gives the connection under the replay (for net/http's type checks it does not
// need; for callers that look for a limit or a TCP connection under it).
func (c *replayConn) Unwrap() net.Conn { return c.Conn }

var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, bufSize) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, bufSize) }}
)

func getReader(c net.Conn) *bufio.Reader {
	br := readers.Get().(*bufio.Reader)
	br.Reset(c)
	return br
}

func putReader(br *bufio.Reader) {
	br.Reset(nil)
	readers.Put(br)
}

func getWriter(c net.Conn) *bufio.Writer {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c)
	return bw
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writers.Put(bw)
}
