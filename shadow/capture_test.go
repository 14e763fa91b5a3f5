package shadow

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// TestCaptureBudget: captures share their route's capture_total; a capture reserves it in
// grabs (so the relay does not touch the shared counter per event), takes exactly what it
// needs when a grab does not fit, ends truncated when not even that fits, and gives all of it
// back on release.
func TestCaptureBudget(t *testing.T) {
	event := bytes.Repeat([]byte("x"), 1000)
	t.Run("room for grabs", func(t *testing.T) {
		var budget atomic.Int64
		c := capture{limit: 1 << 20, budget: &budget, total: 256 << 20}
		for range 10 {
			c.add(event)
		}
		if len(c.buf) != 10000 || c.truncated || budget.Load() != captureGrab {
			t.Fatalf("kept %d (truncated %v), budget %d: want 10000 kept in one grab of %d", len(c.buf), c.truncated, budget.Load(), captureGrab)
		}
		for range 100 {
			c.add(event)
		}
		if len(c.buf) != 110000 || budget.Load() != 2*captureGrab {
			t.Fatalf("kept %d, budget %d: want 110000 in two grabs", len(c.buf), budget.Load())
		}
		c.release()
		if budget.Load() != 0 || c.buf != nil {
			t.Fatalf("after release: budget %d", budget.Load())
		}
	})
	t.Run("a grab does not fit", func(t *testing.T) {
		var budget atomic.Int64
		a := capture{limit: 1 << 20, budget: &budget, total: 2500}
		b := capture{limit: 1 << 20, budget: &budget, total: 2500}
		a.add(event)
		b.add(event)
		if budget.Load() != 2000 || a.truncated || b.truncated {
			t.Fatalf("budget %d: want exactly the 2000 bytes kept", budget.Load())
		}
		a.add(event) // 3000 > 2500: a ends at its last whole event
		if !a.truncated || len(a.buf) != 1000 || budget.Load() != 2000 {
			t.Fatalf("a: kept %d, truncated %v, budget %d", len(a.buf), a.truncated, budget.Load())
		}
		a.add([]byte("y")) // a cut capture takes nothing more
		if len(a.buf) != 1000 {
			t.Fatalf("a cut capture grew to %d", len(a.buf))
		}
		a.release()
		b.add(event) // a's release made room
		if b.truncated || len(b.buf) != 2000 {
			t.Fatalf("b after a's release: kept %d, truncated %v", len(b.buf), b.truncated)
		}
		b.release()
		if budget.Load() != 0 {
			t.Fatalf("budget %d after both released", budget.Load())
		}
	})
	t.Run("the capture's own limit", func(t *testing.T) {
		var budget atomic.Int64
		c := capture{limit: 1500, budget: &budget, total: 256 << 20}
		c.add(event)
		c.add(event)
		if len(c.buf) != 1500 || !c.truncated || budget.Load() != 1500 {
			t.Fatalf("kept %d, truncated %v, budget %d: a grab never passes the limit", len(c.buf), c.truncated, budget.Load())
		}
		c.release()
	})
}
