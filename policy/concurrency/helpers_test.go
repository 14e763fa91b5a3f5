package concurrency

import (
	"context"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a manual clock whose AfterFunc timers fire on Advance (in the caller's
// goroutine, in deadline order). Its base time is far in the future so that a real context
// deadline set from it never fires during a test.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    int
	timers map[int]fakeTimer
}

type fakeTimer struct {
	at time.Time
	f  func()
}

func newClock() *fakeClock {
	return &fakeClock{now: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), timers: map[int]fakeTimer{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	id := c.seq
	c.timers[id] = fakeTimer{c.now.Add(d), f}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.timers[id]
		delete(c.timers, id)
		return ok
	}
}

func (c *fakeClock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []fakeTimer
	for id, t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
			delete(c.timers, id)
		}
	}
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		t.f()
	}
}

func newLimiter(t testing.TB, p Params, clk policy.Clock) *Limiter {
	t.Helper()
	l, err := New(p, policy.Env{Route: "chat", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func ptr[T any](v T) *T { return &v }

func req(tenant string) *policy.Request { return &policy.Request{Tenant: tenant, Route: "chat"} }

func admitNow(t testing.TB, l *Limiter, r *policy.Request) policy.Decision {
	t.Helper()
	d, err := l.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func wantReject(t testing.TB, l *Limiter, d policy.Decision, reason string) {
	t.Helper()
	if d.Reject == nil {
		t.Fatalf("admitted, want 429 %s", reason)
	}
	if d.Reject.Status != 429 || d.Reject.Class != CodeConcurrencyLimit || d.Reject.RetryAfter < time.Second {
		t.Fatalf("got %d %s retry %s, want 429 %s with Retry-After", d.Reject.Status, d.Reject.Code, d.Reject.RetryAfter, CodeConcurrencyLimit)
	}
	if d.Done != nil {
		t.Error("a rejection has a Done")
	}
	if got := l.Stats().Rejected[reason]; got == 0 {
		t.Errorf("Stats().Rejected[%s] = 0", reason)
	}
}

// waitQueued waits until l has n waiters (the waiting goroutines have enqueued).
func waitQueued(t testing.TB, l *Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", l.Stats().Queued, n)
		}
		runtime.Gosched()
		time.Sleep(100 * time.Microsecond)
	}
}

var ok200 = policy.Outcome{Status: 200, Cluster: "c", TTFT: 100 * time.Millisecond, TPOT: 20 * time.Millisecond}

// result of a background Admit.
type result struct {
	name string
	d    policy.Decision
	err  error
}

// holdAndQueue admits one request, which holds l's one slot, and queues a second behind it:
// it returns the holder's decision and where the waiter's result comes.
func holdAndQueue(t testing.TB, l *Limiter) (holder policy.Decision, waiter <-chan result) {
	t.Helper()
	holder = admitNow(t, l, req("x"))
	results := make(chan result, 1)
	admitAsync(context.Background(), l, "w", req("a"), results)
	waitQueued(t, l, 1)
	return holder, results
}

func admitAsync(ctx context.Context, l *Limiter, name string, r *policy.Request, out chan<- result) {
	go func() {
		d, err := l.Admit(ctx, r)
		out <- result{name, d, err}
	}()
}
