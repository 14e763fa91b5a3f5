package upstream

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

func TestWithConnectTimeoutBoundsTheDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tests := []struct {
		name         string
		ctx          context.Context
		wantDeadline bool
	}{
		{"cluster time-out only", context.Background(), false},
		{"zero leaves the context alone", WithConnectTimeout(context.Background(), 0), false},
		{"route time-out", WithConnectTimeout(context.Background(), 50*time.Millisecond), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var remaining time.Duration
			var had bool
			// The dialer's own time-out is an hour, so a deadline under a second can only be the request's.
			d := &net.Dialer{Timeout: time.Hour, ControlContext: func(ctx context.Context, _, _ string, _ syscall.RawConn) error {
				var dl time.Time
				dl, had = ctx.Deadline()
				remaining = time.Until(dl)
				return nil
			}}
			c, err := dialContext(d)(tt.ctx, "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			if !had {
				t.Fatal("the dial had no deadline at all")
			}
			if got := remaining < time.Second; got != tt.wantDeadline {
				t.Fatalf("deadline in %v: route time-out applied = %v, want %v", remaining, got, tt.wantDeadline)
			}
		})
	}
}
