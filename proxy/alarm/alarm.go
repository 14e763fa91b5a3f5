// Package alarm runs functions at deadlines kept by one runtime timer shared by all of them,
// a little late (up to the wheel's grain) where a time.Timer is on time.
//
// It exists for the timers every request arms and almost always stops or moves: the
// client-gone watch of the HTTP/1.1 server and the TTFT and idle watchdog of an attempt.
// Each time a goroutine arms a runtime timer that becomes the earliest of its processor,
// the Go runtime makes sure a thread is waiting in the network poller for it: with the
// processors idle between requests that is a futex wake-up of a thread that spins, finds
// nothing and sleeps again, once or twice a request. An alarm that is moved or stopped costs
// atomic operations and a clock read; starting one takes a mutex; the shared timer moves
// only when an alarm is due more than a grain before it fires.
package alarm

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Grain is how late the default wheel may run an alarm.
const Grain = 5 * time.Millisecond

var std = New(Grain)

// After arms an alarm of the default wheel that runs f in its own goroutine d from now
// (at most Grain later), as time.AfterFunc.
func After(d time.Duration, f func()) *Alarm { return std.After(d, f) }

// A Wheel keeps alarms and runs each due one at most grain after its deadline (the Go
// scheduler's own delays aside). The zero Wheel is not usable: New makes one.
type Wheel struct {
	grain int64
	base  time.Time // the origin of the deadlines, read with its monotonic clock

	next atomic.Int64 // when the timer fires (since base); 0 while it is not armed

	// armed counts the armed alarms, listed the list's length: a Stop that leaves fewer than
	// a quarter of the list armed sweeps it, so that stopped alarms (and what their functions
	// hold: a connection, a request) are not kept until a far timer fires.
	armed, listed atomic.Int64

	mu        sync.Mutex
	t         *time.Timer
	list      []*Alarm // every armed alarm, and alarms stopped since the last sweep
	compactAt int      // the list's length at which an arming sweeps out stopped alarms
	due       []*Alarm // scratch of fire
}

// New returns a Wheel that runs alarms at most grain late (at least a microsecond).
func New(grain time.Duration) *Wheel {
	return &Wheel{grain: int64(max(grain, time.Microsecond)), base: time.Now(), compactAt: minCompact}
}

// minCompact is the smallest list length at which an arming sweeps the list.
const minCompact = 64

// now is the time since base, at least 1 (0 marks an alarm that is not armed).
func (w *Wheel) now() int64 { return int64(time.Since(w.base)) + 1 }

// An Alarm runs its function once each time it comes due; Reset arms it again. Its methods
// may be called from any goroutine.
type Alarm struct {
	w      *Wheel
	f      func()
	fr     Firer        // runs in f's place when set
	when   atomic.Int64 // the deadline (since the wheel's base); 0 while not armed
	listed atomic.Bool  // in w.list; written under w.mu, read by reset without it
}

// After arms an alarm that runs f in its own goroutine d from now.
func (w *Wheel) After(d time.Duration, f func()) *Alarm {
	a := &Alarm{}
	w.Start(a, d, f)
	return a
}

// Start is After for an Alarm in the caller's memory (its zero value, in a struct of the
// caller's: no allocation of its own).
func (w *Wheel) Start(a *Alarm, d time.Duration, f func()) {
	a.w, a.f, a.fr = w, f, nil
	a.Reset(d)
}

// Start is Wheel.Start on the default wheel.
func Start(a *Alarm, d time.Duration, f func()) { std.Start(a, d, f) }

// A Firer is what an alarm started with StartFirer runs: its Fire, in its own goroutine.
type Firer interface{ Fire() }

// StartFirer is Start with fr.Fire in place of a function: a pointer to a struct the caller
// has made already goes in an interface without an allocation, where a method value
// (s.expire) is one of its own each time.
func (w *Wheel) StartFirer(a *Alarm, d time.Duration, fr Firer) {
	a.w, a.f, a.fr = w, nil, fr
	a.Reset(d)
}

// StartFirer is Wheel.StartFirer on the default wheel.
func StartFirer(a *Alarm, d time.Duration, fr Firer) { std.StartFirer(a, d, fr) }

// Reset arms a to run d from now, whether it was armed, stopped or had run; it reports
// whether it was armed (as time.Timer's Reset).
func (a *Alarm) Reset(d time.Duration) bool {
	return a.reset(a.w.now(), d)
}

// ResetFrom is Reset for a caller that has just read the clock: it arms a to run d after
// now, which must carry time.Now's monotonic reading (the relay reads the clock for every
// event already; this spares the alarm a second read).
func (a *Alarm) ResetFrom(now time.Time, d time.Duration) bool {
	return a.reset(int64(now.Sub(a.w.base))+1, d)
}

func (a *Alarm) reset(now int64, d time.Duration) bool {
	w := a.w
	when := now + int64(max(d, 0))
	old := a.when.Swap(when)
	if old == 0 {
		w.armed.Add(1)
	}
	// Listed (armed already, or stopped since the last sweep), and the wheel's timer fires
	// no later than a grain after the new deadline: nothing to do, without the wheel's lock
	// (every request arms a few alarms the last request stopped; under a backlog a lock
	// taken for each is a convoy). Otherwise the wheel must list it or fire earlier, or is
	// sweeping (next is 0 from the sweep's start: it may have read the old deadline).
	//
	// The deadline is stored before next and listed are loaded, and a sweep stores next 0
	// before it reads deadlines and marks an alarm unlisted before it reads its deadline
	// again (sweep): either the sweep sees this deadline, or this sees the wheel sweeping or
	// the alarm unlisted and takes the lock.
	if next := w.next.Load(); next == 0 || next > when+w.grain || (old == 0 && !a.listed.Load()) {
		w.arm(a)
	}
	return old != 0
}

// Stop disarms a; it reports whether a was armed (false: it had run, was running, or was
// stopped), as time.Timer's Stop.
func (a *Alarm) Stop() bool {
	if a.when.Swap(0) == 0 {
		return false
	}
	w := a.w
	if n, l := w.armed.Add(-1), w.listed.Load(); l > minCompact && n < l/4 {
		w.mu.Lock()
		if n, l := w.armed.Load(), int64(len(w.list)); l > minCompact && n < l/4 {
			w.compact()
		}
		w.mu.Unlock()
	}
	return true
}

// arm lists a and moves the wheel's timer to a's deadline when it would fire later than a
// grain after it.
func (w *Wheel) arm(a *Alarm) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !a.listed.Load() {
		if len(w.list) >= w.compactAt {
			w.compact()
		}
		a.listed.Store(true)
		w.list = append(w.list, a)
		w.listed.Store(int64(len(w.list)))
	}
	when := a.when.Load()
	if when == 0 {
		return // stopped again meanwhile
	}
	if next := w.next.Load(); next == 0 || next > when+w.grain {
		w.schedule(when)
	}
}

// compact drops the stopped alarms from the list: alarms armed and stopped between two
// firings of a far timer would otherwise pile up. w.mu held.
func (w *Wheel) compact() { w.sweep(0) }

// sweep drops the stopped alarms from the list, moves those due at now (none when now is 0:
// deadlines are at least 1) to w.due, and returns the earliest deadline left (0: none).
// w.mu held.
func (w *Wheel) sweep(now int64) (earliest int64) {
	keep := w.list[:0]
	for _, a := range w.list {
		when := a.when.Load()
		if when != 0 && when <= now {
			if a.when.CompareAndSwap(when, 0) {
				w.armed.Add(-1)
				a.listed.Store(false)
				w.due = append(w.due, a)
				continue
			}
			when = a.when.Load() // moved or stopped meanwhile
		}
		if when == 0 {
			// Stopped: unlisted, unless a reset that saw it listed (and so did not lock)
			// armed it meanwhile, which the second read sees.
			a.listed.Store(false)
			if when = a.when.Load(); when == 0 {
				continue
			}
			a.listed.Store(true)
		}
		keep = append(keep, a)
		if earliest == 0 || when < earliest {
			earliest = when
		}
	}
	clear(w.list[len(keep):])
	w.list = keep
	w.listed.Store(int64(len(keep)))
	w.compactAt = max(minCompact, 2*len(keep))
	return earliest
}

// schedule sets the wheel's timer to fire at when, or a grain from now if that is later
// (which bounds the sweeps to one a grain). w.mu held.
func (w *Wheel) schedule(when int64) {
	at := max(when, w.now()+w.grain)
	w.next.Store(at)
	d := time.Duration(at - w.now())
	if w.t == nil {
		w.t = time.AfterFunc(d, w.fire)
		return
	}
	w.t.Reset(d)
}

// fire runs the due alarms, drops the stopped ones and sets the timer for the earliest
// deadline left, if any.
func (w *Wheel) fire() {
	w.mu.Lock()
	w.next.Store(0) // an alarm moved from now on takes the lock, after this sweep
	if earliest := w.sweep(w.now()); earliest != 0 {
		w.schedule(earliest)
	}
	var due []*Alarm
	if len(w.due) > 0 {
		due = slices.Clone(w.due) // started outside the lock: arming waits for no goroutine start
		clear(w.due)
		w.due = w.due[:0]
	}
	w.mu.Unlock()
	for _, a := range due {
		if a.fr != nil {
			go a.fr.Fire()
		} else {
			go a.f()
		}
	}
}
