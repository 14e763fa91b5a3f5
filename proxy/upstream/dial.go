package upstream

import (
	"context"
	"net"
	"time"
)

type connectTimeoutKey struct{}

// WithConnectTimeout returns a context whose requests dial new connections with this connect
// time-out instead of the cluster's (a route's own connect time-out). A connection dialled for
// one request may later serve others: the time-out only bounds the dial.
func WithConnectTimeout(ctx context.Context, d time.Duration) context.Context {
	if d <= 0 {
		return ctx
	}
	return context.WithValue(ctx, connectTimeoutKey{}, d)
}

// dialContext dials with the cluster's connect time-out, or the request's when it set one.
func dialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if t, ok := ctx.Value(connectTimeoutKey{}).(time.Duration); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, t)
			defer cancel()
		}
		return d.DialContext(ctx, network, addr)
	}
}
