package scope

import (
	"context"
	"errors"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/proxy/alarm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	errA = errors.New("cause a")
	errB = errors.New("cause b")
)

// ended waits (bounded) for ctx to end and fails the test if it does not.
func ended(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the context did not end within 2s")
	}
}

// live fails the test if ctx has ended.
func alive(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := ctx.Err(); err != nil {
		t.Fatalf("the context ended: %v", err)
	}
	select {
	case <-ctx.Done():
		t.Fatal("Done is closed while Err is nil")
	default:
	}
}

// TestLikeTheStandardLibrary ends a Scope and the standard library's equivalent the same way
// and compares what each says: Err, the cause (scope.Cause against context.Cause), Done and
// Deadline.
func TestLikeTheStandardLibrary(t *testing.T) {
	far := time.Now().Add(time.Hour)
	type pair struct {
		std, own context.Context
		// end ends both the same way.
		end func()
	}
	cases := []struct {
		name  string
		make  func(t *testing.T) pair
		ends  bool
		err   error
		cause error
		dl    bool
	}{
		{"cancel with a cause", func(t *testing.T) pair {
			std, cancel := context.WithCancelCause(context.Background())
			own := New(context.Background(), nil, time.Time{}, nil)
			return pair{std, own, func() { cancel(errA); own.Cancel(errA) }}
		}, true, context.Canceled, errA, false},
		{"cancel without a cause", func(t *testing.T) pair {
			std, cancel := context.WithCancelCause(context.Background())
			own := New(context.Background(), nil, time.Time{}, nil)
			return pair{std, own, func() { cancel(nil); own.Cancel(nil) }}
		}, true, context.Canceled, context.Canceled, false},
		{"own deadline", func(t *testing.T) pair {
			std, cancel := context.WithTimeoutCause(context.Background(), 10*time.Millisecond, errA)
			t.Cleanup(cancel)
			own := New(context.Background(), nil, time.Now().Add(10*time.Millisecond), errA)
			t.Cleanup(func() { own.Cancel(nil) })
			return pair{std, own, func() {}}
		}, true, context.DeadlineExceeded, errA, true},
		{"own deadline without a cause", func(t *testing.T) pair {
			std, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			t.Cleanup(cancel)
			own := New(context.Background(), nil, time.Now().Add(5*time.Millisecond), nil)
			t.Cleanup(func() { own.Cancel(nil) })
			return pair{std, own, func() {}}
		}, true, context.DeadlineExceeded, context.DeadlineExceeded, true},
		{"deadline passed already", func(t *testing.T) pair {
			std, cancel := context.WithDeadlineCause(context.Background(), time.Now().Add(-time.Second), errA)
			t.Cleanup(cancel)
			own := New(context.Background(), nil, time.Now().Add(-time.Second), errA)
			return pair{std, own, func() {}}
		}, true, context.DeadlineExceeded, errA, true},
		{"cancel before the deadline", func(t *testing.T) pair {
			std, cancel := context.WithDeadlineCause(context.Background(), far, errA)
			own := New(context.Background(), nil, far, errA)
			return pair{std, own, func() { cancel(); own.Cancel(nil) }}
		}, true, context.Canceled, context.Canceled, true},
		{"a foreign parent cancelled", func(t *testing.T) pair {
			p, cancel := context.WithCancelCause(context.Background())
			std, c2 := context.WithCancel(p)
			t.Cleanup(c2)
			own := New(p, nil, time.Time{}, nil)
			return pair{std, own, func() { cancel(errB) }}
		}, true, context.Canceled, errB, false},
		{"a foreign parent cancelled before", func(t *testing.T) pair {
			p, cancel := context.WithCancelCause(context.Background())
			cancel(errB)
			std, c2 := context.WithCancel(p)
			t.Cleanup(c2)
			own := New(p, nil, time.Time{}, nil)
			return pair{std, own, func() {}}
		}, true, context.Canceled, errB, false},
		{"a foreign parent's earlier deadline", func(t *testing.T) pair {
			p, cancel := context.WithTimeoutCause(context.Background(), 10*time.Millisecond, errB)
			t.Cleanup(cancel)
			std, c2 := context.WithDeadlineCause(p, far, errA)
			t.Cleanup(c2)
			own := New(p, nil, far, errA)
			t.Cleanup(func() { own.Cancel(nil) })
			return pair{std, own, func() {}}
		}, true, context.DeadlineExceeded, errB, true},
		{"a Scope parent cancelled", func(t *testing.T) pair {
			sp, scancel := context.WithCancelCause(context.Background())
			std, c2 := context.WithCancelCause(sp)
			t.Cleanup(func() { c2(nil) })
			p := New(context.Background(), nil, time.Time{}, nil)
			own := New(p, nil, time.Time{}, nil)
			return pair{std, own, func() { scancel(errB); p.Cancel(errB) }}
		}, true, context.Canceled, errB, false},
		{"a Scope parent's deadline", func(t *testing.T) pair {
			sp, scancel := context.WithTimeoutCause(context.Background(), 10*time.Millisecond, errB)
			t.Cleanup(scancel)
			std, c2 := context.WithDeadlineCause(sp, far, errA)
			t.Cleanup(c2)
			p := New(context.Background(), nil, time.Now().Add(10*time.Millisecond), errB)
			t.Cleanup(func() { p.Cancel(nil) })
			own := New(p, nil, far, errA)
			return pair{std, own, func() {}}
		}, true, context.DeadlineExceeded, errB, true},
		{"a Scope parent ended before", func(t *testing.T) pair {
			sp, scancel := context.WithCancelCause(context.Background())
			scancel(errB)
			std, c2 := context.WithCancel(sp)
			t.Cleanup(c2)
			p := New(context.Background(), nil, time.Time{}, nil)
			p.Cancel(errB)
			own := New(p, nil, time.Time{}, nil)
			return pair{std, own, func() {}}
		}, true, context.Canceled, errB, false},
		{"a grandparent Scope cancelled", func(t *testing.T) pair {
			gp, gcancel := context.WithCancelCause(context.Background())
			sp, c1 := context.WithCancel(gp)
			t.Cleanup(c1)
			std, c2 := context.WithCancel(sp)
			t.Cleanup(c2)
			g := New(context.Background(), nil, time.Time{}, nil)
			p := New(g, nil, time.Time{}, nil)
			t.Cleanup(func() { p.Cancel(nil) })
			own := New(p, nil, time.Time{}, nil)
			return pair{std, own, func() { gcancel(errA); g.Cancel(errA) }}
		}, true, context.Canceled, errA, false},
		{"a kid cancelled leaves its parent", func(t *testing.T) pair {
			sp, scancel := context.WithCancel(context.Background())
			t.Cleanup(scancel)
			_, c2 := context.WithCancel(sp)
			p := New(context.Background(), nil, time.Time{}, nil)
			t.Cleanup(func() { p.Cancel(nil) })
			kid := New(p, nil, time.Time{}, nil)
			kid.Cancel(nil)
			return pair{sp, p, func() { c2() }}
		}, false, nil, nil, false},
		{"a Scope made from a Scope by values alone", func(t *testing.T) pair {
			sp, scancel := context.WithCancelCause(context.Background())
			std, c2 := context.WithCancel(context.WithValue(sp, errA, 1))
			t.Cleanup(c2)
			p := New(context.Background(), nil, time.Time{}, nil)
			own := New(context.WithValue(p, errA, 1), nil, time.Time{}, nil)
			if own.parent != p {
				t.Error("a Scope made in a Scope through a value is not listed in it")
			}
			return pair{std, own, func() { scancel(errB); p.Cancel(errB) }}
		}, true, context.Canceled, errB, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.make(t)
			for _, c := range []context.Context{p.std, p.own} {
				dl, ok := c.Deadline()
				if ok != tc.dl {
					t.Errorf("%T Deadline %v, %v; want a deadline: %v", c, dl, ok, tc.dl)
				}
			}
			sd, _ := p.std.Deadline()
			od, _ := p.own.Deadline()
			if tc.dl && sd.Sub(od).Abs() > time.Second {
				t.Errorf("deadlines %v and %v differ", sd, od)
			}
			p.end()
			if !tc.ends {
				alive(t, p.std)
				alive(t, p.own)
				return
			}
			ended(t, p.std)
			ended(t, p.own)
			for _, c := range []struct {
				name string
				got  error
				want error
			}{
				{"std Err", p.std.Err(), tc.err},
				{"own Err", p.own.Err(), tc.err},
				{"std Cause", context.Cause(p.std), tc.cause},
				{"own Cause", Cause(p.own), tc.cause},
				{"own context.Cause", context.Cause(p.own), tc.err}, // the documented difference
			} {
				if c.got != c.want {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
				}
			}
		})
	}
}

func TestValues(t *testing.T) {
	type k string
	base := context.WithValue(context.Background(), k("a"), "1")
	values := context.WithValue(base, k("b"), "2")
	s := New(base, values, time.Time{}, nil)
	defer s.Cancel(nil)
	if s.Value(k("a")) != "1" || s.Value(k("b")) != "2" || s.Value(k("c")) != nil {
		t.Errorf("values a=%v b=%v c=%v, want 1, 2 and none", s.Value(k("a")), s.Value(k("b")), s.Value(k("c")))
	}
	if s.Value(key{}) != s {
		t.Error("a Scope does not serve itself under its key")
	}
	// A context.Cause through the Scope must not read a live enclosing context's (nil)
	// cause once the Scope has ended.
	p, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	s2 := New(p, nil, time.Time{}, nil)
	s2.Cancel(errA)
	if got := context.Cause(context.WithValue(s2, k("x"), 1)); got != context.Canceled {
		t.Errorf("context.Cause through a Scope = %v, want context.Canceled", got)
	}
	if got := Cause(context.WithValue(s2, k("x"), 1)); got != errA {
		t.Errorf("Cause through a value = %v, want %v", got, errA)
	}
	if got := Cause(p); got != nil {
		t.Errorf("Cause of a live context = %v, want nil", got)
	}
}

// created is the number of goroutines this process has started.
func created() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestStandardChildren: contexts the standard library makes from a Scope end with it, with
// no goroutine started to watch it, and context.AfterFunc runs its function once.
func TestStandardChildren(t *testing.T) {
	s := New(context.Background(), nil, time.Time{}, nil)
	g0 := created()
	c1, cancel1 := context.WithCancel(s)
	defer cancel1()
	c2, cancel2 := context.WithTimeout(s, time.Hour)
	defer cancel2()
	ran := make(chan struct{}, 2)
	context.AfterFunc(s, func() { ran <- struct{}{} })
	stopped := context.AfterFunc(s, func() { ran <- struct{}{} })
	if !stopped() {
		t.Error("stop before the end reports that it did not stop the function")
	}
	if n := created() - g0; n != 0 {
		t.Errorf("%d goroutines started to watch a Scope", n)
	}
	alive(t, c1)
	s.Cancel(errA)
	ended(t, c1)
	ended(t, c2)
	if c1.Err() != context.Canceled || c2.Err() != context.Canceled {
		t.Errorf("children ended with %v and %v, want context.Canceled", c1.Err(), c2.Err())
	}
	select {
	case <-ran:
	case <-time.After(2 * time.Second):
		t.Fatal("context.AfterFunc did not run")
	}
	select {
	case <-ran:
		t.Fatal("a stopped AfterFunc ran")
	case <-time.After(20 * time.Millisecond):
	}
	// On an ended Scope: the standard library's children end at once.
	c3, cancel3 := context.WithCancel(s)
	defer cancel3()
	ended(t, c3)
}

func TestAfterFunc(t *testing.T) {
	s := New(context.Background(), nil, time.Time{}, nil)
	var order []int
	s.AfterFunc(func() { order = append(order, 1) })
	stop := s.AfterFunc(func() { order = append(order, 2) })
	s.AfterFunc(func() { order = append(order, 3) })
	if !stop() || stop() {
		t.Error("stop: want true once, then false")
	}
	s.Cancel(nil)
	// Run on the ending goroutine, before Cancel returns, newest first.
	if len(order) != 2 || order[0] != 3 || order[1] != 1 {
		t.Errorf("ran %v, want [3 1]", order)
	}
	// After the end: at once, in a goroutine of its own.
	done := make(chan struct{})
	stop = s.AfterFunc(func() { close(done) })
	<-done
	if stop() {
		t.Error("stop after the function ran reports true")
	}
}

// TestHook: a Hook watches a Scope without allocating, runs its function on the ending
// goroutine, and is stopped like AfterFunc's; on a standard context it is context.AfterFunc;
// on an ended Scope it runs at once in a goroutine of its own.
func TestHook(t *testing.T) {
	s := New(context.Background(), nil, time.Time{}, nil)
	var h Hook
	ran := 0
	f := func() { ran++ }
	if n := testing.AllocsPerRun(100, func() {
		h.Watch(s, f)
		if !h.Stop() || h.Stop() {
			t.Fatal("Stop: want true once, then false")
		}
	}); n != 0 {
		t.Errorf("%.0f allocations to watch a Scope with a Hook", n)
	}
	h.Watch(s, f)
	s.Cancel(errA)
	if ran != 1 {
		t.Fatalf("ran %d times at the end, want once", ran)
	}
	if h.Stop() {
		t.Error("Stop after the function ran reports true")
	}
	done := make(chan struct{})
	h.Watch(s, func() { close(done) })
	ended(t, channelContext(done))

	p, cancel := context.WithCancel(context.Background())
	var h2 Hook
	done2 := make(chan struct{})
	h2.Watch(p, func() { close(done2) })
	cancel()
	ended(t, channelContext(done2))
	if h2.Stop() {
		t.Error("Stop after the function ran reports true (standard context)")
	}
	var idle Hook
	if idle.Stop() {
		t.Error("Stop of a Hook that never watched reports true")
	}
}

// channelContext ends when c is closed (for ended).
func channelContext(c chan struct{}) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-c; cancel() }()
	return ctx
}

// TestListsStayEmpty: a long-lived Scope (a connection's) in which many short ones are made
// and ended keeps nothing of them.
func TestListsStayEmpty(t *testing.T) {
	conn := New(context.Background(), nil, time.Time{}, nil)
	defer conn.Cancel(nil)
	for i := range 1000 {
		req := New(conn, nil, time.Now().Add(time.Hour), errA)
		att := New(req, nil, time.Time{}, nil)
		stop := att.AfterFunc(func() {})
		if i%2 == 0 {
			stop()
		}
		att.Cancel(nil)
		req.Cancel(nil)
	}
	conn.mu.Lock()
	defer conn.mu.Unlock()
	if conn.first != nil {
		t.Error("ended Scopes are still listed in their parent")
	}
}

func TestDeadlineRunsOnTheAlarm(t *testing.T) {
	start := time.Now()
	s := New(context.Background(), nil, start.Add(30*time.Millisecond), errA)
	ended(t, s)
	late := time.Since(start) - 30*time.Millisecond
	if late < 0 || late > alarm.Grain+time.Second {
		t.Errorf("ended %v after its deadline", late)
	}
	if Cause(s) != errA || s.Err() != context.DeadlineExceeded {
		t.Errorf("ended with %v (%v), want %v (%v)", s.Err(), Cause(s), context.DeadlineExceeded, errA)
	}
}

// TestInitInCallersMemory: a Scope made with Init in a struct of the caller's ends at its
// deadline and with its parent as one made with New, and making one with a deadline in a
// Scope allocates nothing of its own (New: the Scope alone; its alarm's function is the
// Scope itself, not a method value).
func TestInitInCallersMemory(t *testing.T) {
	parent := New(context.Background(), nil, time.Time{}, nil)
	defer parent.Cancel(nil)
	var held struct {
		n int
		s Scope
	}
	held.s.Init(parent, nil, time.Now().Add(20*time.Millisecond), errA)
	ended(t, &held.s)
	if Cause(&held.s) != errA || held.s.Err() != context.DeadlineExceeded {
		t.Errorf("ended with %v (%v), want %v (%v)", held.s.Err(), Cause(&held.s), context.DeadlineExceeded, errA)
	}
	var kid struct{ s Scope }
	kid.s.Init(parent, nil, time.Now().Add(time.Hour), errA)
	parent.Cancel(errB)
	ended(t, &kid.s)
	if Cause(&kid.s) != errB {
		t.Errorf("a kid's cause %v, want its parent's %v", Cause(&kid.s), errB)
	}

	live := New(context.Background(), nil, time.Time{}, nil)
	defer live.Cancel(nil)
	deadline := time.Now().Add(time.Hour)
	if n := testing.AllocsPerRun(100, func() {
		var s Scope
		s.Init(live, nil, deadline, errA)
		s.Cancel(nil)
	}); n != 1 { // the Scope itself escapes (its alarm and its parent list it): 1, nothing more
		t.Errorf("%.0f allocations to make and end a Scope with a deadline in a Scope, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		New(live, nil, deadline, errA).Cancel(nil)
	}); n != 1 {
		t.Errorf("%.0f allocations for New with a deadline in a Scope, want 1", n)
	}
}

// TestConcurrentEnds ends parents, kids and AfterFunc registrations from several goroutines
// at once (run with -race): every kid ends exactly once, with its parent's cause or its own.
func TestConcurrentEnds(t *testing.T) {
	for round := range 200 {
		p := New(context.Background(), nil, time.Time{}, nil)
		var kids []*Scope
		var cancels []context.CancelFunc
		var mu sync.Mutex
		fired := 0
		for range 8 {
			k := New(p, nil, time.Time{}, nil)
			kids = append(kids, k)
			k.AfterFunc(func() { mu.Lock(); fired++; mu.Unlock() })
			_, cancel := context.WithCancel(k) // a standard child too
			cancels = append(cancels, cancel)
		}
		stop := p.AfterFunc(func() {})
		var wg sync.WaitGroup
		for i, k := range kids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					k.Cancel(errB)
				}
				_ = k.Done()
				_ = Cause(k)
			}()
		}
		wg.Add(2)
		go func() { defer wg.Done(); p.Cancel(errA) }()
		go func() { defer wg.Done(); stop() }() // racing the end
		wg.Wait()
		for i, k := range kids {
			ended(t, k)
			if c := Cause(k); c != errA && c != errB {
				t.Fatalf("round %d: kid %d ended with %v", round, i, c)
			}
		}
		mu.Lock()
		if fired != len(kids) {
			t.Fatalf("round %d: %d AfterFunc functions ran, want %d", round, fired, len(kids))
		}
		mu.Unlock()
		for _, cancel := range cancels {
			cancel()
		}
	}
}

// BenchmarkStdlibChain is a request's four contexts as the standard library nests them: the
// server's request context, the total time-out, the attempt, the upstream connection's watch.
func BenchmarkStdlibChain(b *testing.B) {
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	b.ReportAllocs()
	for b.Loop() {
		req, cancelReq := context.WithCancelCause(base)
		total, cancelTotal := context.WithTimeoutCause(req, time.Minute, errA)
		att, cancelAtt := context.WithCancelCause(total)
		stop := context.AfterFunc(att, func() {})
		stop()
		cancelAtt(nil)
		cancelTotal()
		cancelReq(context.Canceled)
	}
}

// BenchmarkScopeChain is the same four as Scopes, the first in a connection's Scope.
func BenchmarkScopeChain(b *testing.B) {
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	conn := New(base, nil, time.Time{}, nil)
	defer conn.Cancel(nil)
	f := func() {}
	var h Hook
	b.ReportAllocs()
	for b.Loop() {
		req := New(conn, nil, time.Time{}, nil)
		total := New(req, nil, time.Now().Add(time.Minute), errA)
		att := New(total, nil, time.Time{}, nil)
		h.Watch(att, f)
		h.Stop()
		att.Cancel(nil)
		total.Cancel(nil)
		req.Cancel(context.Canceled)
	}
}

// TestCauseIsTheContexts: Cause answers for the context it is given: nil while that lives
// (a context.WithoutCancel of an ended Scope), a standard child's own cause when it ended on
// its own before the Scope, the Scope's when the child ended with it.
func TestCauseIsTheContexts(t *testing.T) {
	s := New(context.Background(), nil, time.Time{}, nil)
	own, cancelOwn := context.WithCancelCause(s)
	with, cancelWith := context.WithCancelCause(s)
	defer cancelWith(nil)
	cancelOwn(errB)
	s.Cancel(errA)
	ended(t, with)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"without cancel", context.WithoutCancel(s), nil},
		{"a child that ended first", own, errB},
		{"a child that ended with the Scope", with, errA},
		{"a value of the Scope", context.WithValue(s, errB, 1), errA},
		{"the Scope", s, errA},
	} {
		if got := Cause(tc.ctx); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestThroughValues: a Scope, or a Hook, made in a context that adds only values to a Scope
// is listed in that Scope: it ends with it, without a goroutine watching.
func TestThroughValues(t *testing.T) {
	p := New(context.Background(), nil, time.Time{}, nil)
	v := context.WithValue(p, errA, 1)
	g0 := created()
	kid := New(v, nil, time.Time{}, nil)
	var h Hook
	ran := make(chan struct{})
	h.Watch(v, func() { close(ran) })
	if n := created() - g0; n != 0 {
		t.Errorf("%d goroutines started to watch a Scope through a value", n)
	}
	if kid.parent != p || h.s != p {
		t.Error("not listed in the Scope under the value")
	}
	p.Cancel(errB)
	ended(t, kid)
	select {
	case <-ran:
	default:
		t.Error("the Hook did not run as the Scope ended")
	}
}

// TestHookWatchedAgainWhileEnding: a Hook whose Stop reported false (the end has taken it)
// may watch another Scope at once; the first Scope's end still runs everything else it
// listed, and never the Hook's new function (run with -race).
func TestHookWatchedAgainWhileEnding(t *testing.T) {
	for range 200 {
		a := New(context.Background(), nil, time.Time{}, nil)
		b := New(context.Background(), nil, time.Time{}, nil)
		var mu sync.Mutex
		ranA, ranB := 0, 0
		a.AfterFunc(func() { mu.Lock(); ranA++; mu.Unlock() }) // listed before the Hook: runs after it
		var h Hook
		release := make(chan struct{})
		h.Watch(a, func() { <-release })
		done := make(chan struct{})
		go func() { a.Cancel(nil); close(done) }()
		for h.Stop() { // until the end has taken the Hook's node (its function now blocks)
			h.Watch(a, func() { <-release })
		}
		h.Watch(b, func() { mu.Lock(); ranB++; mu.Unlock() })
		close(release)
		<-done
		mu.Lock()
		if ranA != 1 || ranB != 0 {
			t.Fatalf("a's own function ran %d times, b's Hook %d times before b ended; want 1 and 0", ranA, ranB)
		}
		mu.Unlock()
		b.Cancel(nil)
		if ranB != 1 {
			t.Fatalf("b's Hook ran %d times at b's end, want 1", ranB)
		}
	}
}
