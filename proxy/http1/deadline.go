package http1

import (
	"sync"
	"time"

	"github.com/sluicegw/sluice/proxy/alarm"
)

// deadline is one direction's deadline on a connection, kept by an alarm that puts a past
// deadline on the connection when it comes due, up to alarm.Grain late. Setting the
// connection's own deadline to a future time arms a runtime timer, and the runtime wakes a
// thread to watch each new timer (see package alarm): a request sets and lifts three of them
// (the head's, the body's, the answer's write).
//
// A time already past goes on the connection at once (an abort), as does zero after the
// alarm fired; a stale firing (the deadline was moved or lifted since) does nothing.
type deadline struct {
	set func(time.Time) error // the connection's SetReadDeadline or SetWriteDeadline

	mu       sync.Mutex
	a        *alarm.Alarm
	at       time.Time // zero: none
	onConn   bool      // the connection carries a past deadline (the alarm's, or an abort)
	detached bool      // handed over: the connection's own deadline from now on
}

// Set sets the deadline to t (zero: none).
func (d *deadline) Set(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.detached {
		return d.set(t)
	}
	d.at = t
	if t.IsZero() || !time.Now().Before(t) {
		if d.a != nil {
			d.a.Stop()
		}
		if t.IsZero() && !d.onConn {
			return nil
		}
		d.onConn = !t.IsZero()
		return d.set(t)
	}
	if d.onConn {
		d.onConn = false
		if err := d.set(time.Time{}); err != nil {
			return err
		}
	}
	if d.a == nil {
		d.a = alarm.After(time.Until(t), d.expire)
	} else {
		d.a.Reset(time.Until(t))
	}
	return nil
}

// after sets the deadline d from now; none when d is zero.
func (d *deadline) after(wait time.Duration) {
	if wait <= 0 {
		_ = d.Set(time.Time{})
		return
	}
	_ = d.Set(time.Now().Add(wait))
}

func (d *deadline) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.detached || d.onConn || d.at.IsZero() || time.Now().Before(d.at) {
		return // lifted, moved or handed over since the alarm was armed
	}
	d.onConn = true
	_ = d.set(longAgo)
}

// detach ends the alarm and puts the deadline on the connection itself: the connection
// goes to another server (or closes), which keeps its deadlines its own way.
func (d *deadline) detach() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.detached {
		return
	}
	d.detached = true
	if d.a != nil {
		d.a.Stop()
	}
	if !d.onConn && !d.at.IsZero() {
		_ = d.set(d.at)
	}
}
