package proxy

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// limitListener bounds the API listener's open connections, in all and per client address,
// so that clients holding connections (slow bodies, slow readers, idle keep-alives) cannot
// take the file descriptors the admin listener and the upstream connections need, nor one
// client take all of them. A connection over a bound is closed as soon as it is accepted.
// The bounds are read from the config serving at each accept, so a reload changes them.
type limitListener struct {
	net.Listener
	bounds func() (total, perClient int, trusted trust)

	mu       sync.Mutex
	open     int
	byClient map[netip.Addr]int

	rejectedTotal, rejectedClient atomic.Int64
}

func newLimitListener(ln net.Listener, bounds func() (int, int, trust)) *limitListener {
	return &limitListener{Listener: ln, bounds: bounds, byClient: map[netip.Addr]int{}}
}

// Accept returns the next connection within the bounds.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := peerAddr(c.RemoteAddr().String())
		total, perClient, trusted := l.bounds()
		l.mu.Lock()
		switch {
		case total > 0 && l.open >= total:
			l.mu.Unlock()
			l.rejectedTotal.Add(1)
			_ = c.Close()
			continue
		case perClient > 0 && l.byClient[addr] >= perClient && !trusted.contains(addr):
			l.mu.Unlock()
			l.rejectedClient.Add(1)
			_ = c.Close()
			continue
		}
		l.open++
		l.byClient[addr]++
		l.mu.Unlock()
		return &limitConn{Conn: c, l: l, addr: addr}, nil
	}
}

// Open is the number of connections open now.
func (l *limitListener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

func (l *limitListener) release(addr netip.Addr) {
	l.mu.Lock()
	l.open--
	if n := l.byClient[addr] - 1; n > 0 {
		l.byClient[addr] = n
	} else {
		delete(l.byClient, addr)
	}
	l.mu.Unlock()
}

// limitConn gives its slot back once, when closed.
type limitConn struct {
	net.Conn
	l    *limitListener
	addr netip.Addr
	once sync.Once
}

// Unwrap gives the connection under the bound (socket.Wrap finds the TCP socket through it).
func (c *limitConn) Unwrap() net.Conn { return c.Conn }

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.addr) })
	return err
}

// connectionMetrics reports the API listener's open connections and the connections its
// bounds refused.
func (s *Server) connectionMetrics(m metric.Meter) (metric.Registration, error) {
	open, err := m.Int64ObservableGauge("sluice.connections.open", metric.WithDescription("Connections open on the API listener"))
	if err != nil {
		return nil, err
	}
	rejected, err := m.Int64ObservableCounter("sluice.connections.rejected",
		metric.WithDescription("Connections the API listener closed at once, by bound (total: limits.max_connections, client: limits.max_connections_per_client)"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		l := s.apiLn.Load()
		if l == nil {
			return nil
		}
		o.ObserveInt64(open, int64(l.Open()))
		o.ObserveInt64(rejected, l.rejectedTotal.Load(), metric.WithAttributes(attribute.String("bound", "total")))
		o.ObserveInt64(rejected, l.rejectedClient.Load(), metric.WithAttributes(attribute.String("bound", "client")))
		return nil
	}, open, rejected)
}
