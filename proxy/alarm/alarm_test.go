package alarm

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ran is a function for an alarm and the times it ran.
type ran struct {
	n  atomic.Int32
	ch chan time.Time
}

func newRan() *ran { return &ran{ch: make(chan time.Time, 16)} }

func (r *ran) f() {
	r.n.Add(1)
	r.ch <- time.Now()
}

// wait returns when the alarm ran next, failing the test after limit.
func (r *ran) wait(t *testing.T, limit time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-r.ch:
		return at
	case <-time.After(limit):
		t.Fatalf("the alarm did not run within %v", limit)
		return time.Time{}
	}
}

func TestAfterRunsAtItsDeadline(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) {
			w := New(5 * time.Millisecond)
			r := newRan()
			start := time.Now()
			w.After(d, r.f)
			if at := r.wait(t, 5*time.Second); at.Sub(start) < d {
				t.Errorf("ran after %v, before its deadline %v", at.Sub(start), d)
			}
			if n := r.n.Load(); n != 1 {
				t.Errorf("ran %d times", n)
			}
		})
	}
}

func TestStop(t *testing.T) {
	w := New(time.Millisecond)
	r := newRan()
	a := w.After(30*time.Millisecond, r.f)
	if !a.Stop() {
		t.Fatal("Stop of an armed alarm: false")
	}
	if a.Stop() {
		t.Error("second Stop: true")
	}
	time.Sleep(100 * time.Millisecond)
	if n := r.n.Load(); n != 0 {
		t.Fatalf("a stopped alarm ran %d times", n)
	}
	if a.Reset(time.Millisecond) {
		t.Error("Reset of a stopped alarm: true")
	}
	r.wait(t, 5*time.Second)
	if a.Stop() {
		t.Error("Stop after it ran: true")
	}
}

func TestResetMovesTheDeadline(t *testing.T) {
	w := New(time.Millisecond)
	r := newRan()
	start := time.Now()
	a := w.After(20*time.Millisecond, r.f)
	if !a.Reset(150 * time.Millisecond) {
		t.Fatal("Reset of an armed alarm: false")
	}
	if at := r.wait(t, 5*time.Second); at.Sub(start) < 150*time.Millisecond {
		t.Fatalf("ran after %v: at the old deadline", at.Sub(start))
	}
	// Run again after it ran.
	if a.Reset(0) {
		t.Error("Reset after it ran: true")
	}
	r.wait(t, 5*time.Second)
	if n := r.n.Load(); n != 2 {
		t.Errorf("ran %d times, want 2", n)
	}
}

// ResetFrom counts from the time it is given, not from when it is called: the deadline is
// the one Reset would have set at that clock read.
func TestResetFrom(t *testing.T) {
	w := New(time.Millisecond)
	r := newRan()
	a := w.After(time.Hour, r.f)
	read := time.Now()
	time.Sleep(30 * time.Millisecond) // the caller's clock read is 30 ms old
	if !a.ResetFrom(read, time.Hour) {
		t.Fatal("ResetFrom of an armed alarm: false")
	}
	if got, want := a.when.Load(), int64(read.Sub(w.base))+1+int64(time.Hour); got != want {
		t.Fatalf("deadline %d, want %d (%v off)", got, want, time.Duration(got-want))
	}
	// And it runs then.
	a.ResetFrom(time.Now(), 20*time.Millisecond)
	r.wait(t, 5*time.Second)
	if a.ResetFrom(time.Now(), time.Hour) {
		t.Error("ResetFrom after it ran: true")
	}
	a.Stop()
}

// An alarm due before the wheel's timer pulls the timer forward; one moved earlier too.
func TestEarlierAlarmMovesTheWheel(t *testing.T) {
	w := New(5 * time.Millisecond)
	far := w.After(time.Hour, func() { t.Error("the far alarm ran") })
	defer far.Stop()
	r := newRan()
	w.After(10*time.Millisecond, r.f)
	r.wait(t, 5*time.Second)

	a := w.After(time.Hour, r.f)
	a.Reset(10 * time.Millisecond)
	r.wait(t, 5*time.Second)
}

// Alarms armed and stopped while the wheel's timer is far away are swept out as they come,
// not kept until it fires.
func TestStoppedAlarmsDoNotPileUp(t *testing.T) {
	w := New(5 * time.Millisecond)
	far := w.After(time.Hour, func() {})
	defer far.Stop()
	for range 10000 {
		w.After(time.Hour, func() {}).Stop()
	}
	one := w.After(time.Hour, func() {})
	for range 10000 {
		one.Stop()
		one.Reset(time.Hour)
	}
	w.mu.Lock()
	n := len(w.list)
	w.mu.Unlock()
	if n > 2*minCompact {
		t.Fatalf("%d alarms listed, 2 armed", n)
	}
}

// Stopped alarms do not keep what their functions hold until the wheel's far timer fires:
// after a burst of streams ends, their connections and requests are garbage at once.
func TestStoppedAlarmsLetGo(t *testing.T) {
	w := New(5 * time.Millisecond)
	far := w.After(time.Hour, func() {})
	defer far.Stop()
	const n = 1000
	var freed atomic.Int32
	alarms := make([]*Alarm, n)
	for i := range alarms {
		held := new([1 << 10]byte)
		runtime.AddCleanup(held, func(struct{}) { freed.Add(1) }, struct{}{})
		alarms[i] = w.After(time.Hour, func() { held[0]++ })
	}
	for _, a := range alarms {
		a.Stop()
	}
	clear(alarms)
	want := int32(n - 2*minCompact) // the last sweep may leave a few stopped ones listed
	for i := 0; i < 100 && freed.Load() < want; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := freed.Load(); got < want {
		t.Fatalf("%d of %d stopped alarms' referents freed", got, n)
	}
}

// TestRearmListedTakesNoLock: an alarm stopped since the last sweep (still listed) and armed
// again for a deadline the wheel's timer is early enough for takes no lock: requests re-arm
// the alarms the last ones stopped, and under a backlog a lock for each is a convoy.
func TestRearmListedTakesNoLock(t *testing.T) {
	w := New(5 * time.Millisecond)
	far := w.After(time.Hour, func() {}) // the wheel's timer an hour away
	defer far.Stop()
	r := newRan()
	a := w.After(time.Hour, r.f)
	a.Stop()
	w.mu.Lock()
	done := make(chan bool)
	go func() {
		ok := !a.Reset(2 * time.Hour) // was stopped
		ok = a.Stop() && ok
		done <- !a.Reset(2*time.Hour) && ok
	}()
	select {
	case ok := <-done:
		w.mu.Unlock()
		if !ok {
			t.Fatal("Reset or Stop reported the wrong state")
		}
	case <-time.After(2 * time.Second):
		w.mu.Unlock()
		<-done
		t.Fatal("re-arming a listed alarm waited for the wheel's lock")
	}
	// Still armed, and run when due: moved earlier, it takes the lock and moves the timer.
	a.Reset(time.Millisecond)
	r.wait(t, 5*time.Second)
}

// Many goroutines moving, stopping and re-arming their alarms while the wheel sweeps: every
// alarm armed last runs, once, and none runs while stopped.
func TestConcurrentUse(t *testing.T) {
	w := New(time.Millisecond)
	const goroutines, rounds = 8, 150
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := newRan()
			a := w.After(time.Hour, r.f)
			for i := range rounds {
				switch i % 3 {
				case 0: // moved, then run
					a.Reset(time.Hour)
					a.Reset(time.Duration(i%4) * time.Millisecond)
					r.wait(t, 5*time.Second)
				case 1: // stopped before it is due
					a.Reset(50 * time.Millisecond)
					if !a.Stop() {
						t.Errorf("goroutine %d round %d: Stop of an armed alarm: false", g, i)
					}
				case 2: // run at once
					a.Reset(0)
					r.wait(t, 5*time.Second)
				}
			}
			a.Stop()
			if want := int32(rounds / 3 * 2); r.n.Load() != want {
				t.Errorf("goroutine %d: ran %d times, want %d", g, r.n.Load(), want)
			}
		})
	}
	wg.Wait()
}

func TestDefaultWheel(t *testing.T) {
	r := newRan()
	After(time.Millisecond, r.f)
	r.wait(t, 5*time.Second)
}

func BenchmarkResetArmed(b *testing.B) {
	w := New(Grain)
	a := w.After(time.Hour, func() {})
	defer a.Stop()
	b.ReportAllocs()
	for b.Loop() {
		a.Reset(time.Hour)
	}
}

// BenchmarkArmStop is the client-gone watch's cost on a request: armed, then stopped.
func BenchmarkArmStop(b *testing.B) {
	b.Run("alarm", func(b *testing.B) {
		w := New(Grain)
		a := w.After(time.Hour, func() {})
		b.ReportAllocs()
		for b.Loop() {
			a.Reset(20 * time.Millisecond)
			a.Stop()
		}
	})
	b.Run("time.Timer", func(b *testing.B) {
		tm := time.AfterFunc(time.Hour, func() {})
		b.ReportAllocs()
		for b.Loop() {
			tm.Reset(20 * time.Millisecond)
			tm.Stop()
		}
	})
}

// TestStartInCallersMemory: Start arms an Alarm the caller holds, as After does, without an
// allocation of its own.
func TestStartInCallersMemory(t *testing.T) {
	w := New(5 * time.Millisecond)
	var holder struct{ a Alarm }
	r := newRan()
	w.Start(&holder.a, 10*time.Millisecond, r.f)
	r.wait(t, 5*time.Second)
	var idle struct{ a Alarm }
	f := func() {}
	if n := testing.AllocsPerRun(100, func() {
		w.Start(&idle.a, time.Hour, f)
		idle.a.Stop()
	}); n != 0 {
		t.Errorf("%.0f allocations to start and stop an Alarm held by the caller", n)
	}
}

// firer counts its Fire calls.
type firer struct{ ran chan struct{} }

func (f *firer) Fire() { f.ran <- struct{}{} }

// TestStartFirer: an alarm started with a Firer runs its Fire at the deadline, after a
// Start with a function on the same Alarm and before one; starting it with a pointer the
// caller holds allocates nothing (a method value would, each time).
func TestStartFirer(t *testing.T) {
	w := New(time.Millisecond)
	var holder struct{ a Alarm }
	fr := &firer{ran: make(chan struct{}, 1)}
	r := newRan()
	w.Start(&holder.a, time.Hour, r.f)
	w.StartFirer(&holder.a, 5*time.Millisecond, fr)
	select {
	case <-fr.ran:
	case <-time.After(5 * time.Second):
		t.Fatal("the Firer did not run")
	}
	w.Start(&holder.a, 5*time.Millisecond, r.f)
	r.wait(t, 5*time.Second)
	select {
	case <-fr.ran:
		t.Error("the Firer ran after a Start with a function replaced it")
	default:
	}
	if n := testing.AllocsPerRun(100, func() {
		w.StartFirer(&holder.a, time.Hour, fr)
		holder.a.Stop()
	}); n != 0 {
		t.Errorf("%.0f allocations to start and stop an Alarm with a Firer", n)
	}
}
