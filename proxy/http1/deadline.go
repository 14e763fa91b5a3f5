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

	mu     sync.Mutex
	a      *alarm.Alarm
	at     time.Time // zero: none
	onConn bool      // the connection carries a past deadline (the alarm's, or an abort)
	done   bool      // the connection is closed or handed over: its own deadlines from now on
}

// Set sets the deadline to t (zero: none).
func (d *deadline) Set(t time.Time) error {
	var wait time.Duration
	if !t.IsZero() {
		wait = time.Until(t)
	}
	return d.put(t, wait)
}

// after sets the deadline wait from now; none when wait is zero.
func (d *deadline) after(wait time.Duration) {
	if wait <= 0 {
		_ = d.put(time.Time{}, 0)
		return
	}
	_ = d.put(time.Now().Add(wait), wait)
}

// put sets the deadline to t, which is wait from now.
func (d *deadline) put(t time.Time, wait time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return d.set(t)
	}
	d.at = t
	if t.IsZero() || wait <= 0 {
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
		d.a = alarm.After(wait, d.expire)
	} else {
		d.a.Reset(wait)
	}
	return nil
}

func (d *deadline) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done || d.onConn || d.at.IsZero() || time.Now().Before(d.at) {
		return // lifted, moved, closed or handed over since the alarm was armed
	}
	d.onConn = true
	_ = d.set(longAgo)
}

// stop ends the alarm for good: the connection closes, or goes to net/http's server,
// which sets its own deadlines (each request's read starts with one).
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.done = true
	if d.a != nil {
		d.a.Stop()
	}
}
