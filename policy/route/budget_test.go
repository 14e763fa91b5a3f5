package route

import (
	"math"
	"sync"
	"testing"
	"time"
)

func TestBudgetPreventsRetryStorm(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ratio     float64
		floor     float64
		rps       int // client requests per second
		wantShare float64
	}{
		{"100rps budget 0.2", 0.2, 3, 100, 0.2},
		{"1000rps budget 0.1", 0.1, 3, 1000, 0.1},
		{"100rps budget 0", 0, 3, 100, 0.03}, // only the floor: 3/s of 100/s
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			b := NewBudget(tc.ratio, tc.floor, clock)
			step := time.Second / time.Duration(tc.rps)
			var requests, retries int
			perSecond := map[int64]int{}
			// A backend failing every request for 60 s; every request wants to retry (and would
			// retry again, up to 3 times, if allowed).
			for i := range 60 * tc.rps {
				b.RecordRequest()
				requests++
				for range 3 {
					if !b.TryRetry() {
						break
					}
					retries++
					perSecond[clock.Now().Unix()]++
				}
				_ = i
				clock.Advance(step)
			}
			share := float64(retries) / float64(requests)
			// Over the run: at most the budget (or the floor, when more) plus one window of
			// slack for the first window.
			window := tc.floor * BudgetWindow.Seconds()
			max := math.Max(tc.ratio*float64(requests), tc.floor*60) + window
			if float64(retries) > max+1 {
				t.Errorf("%d retries for %d requests, want at most %.0f", retries, requests, max)
			}
			if share < tc.wantShare*0.85 {
				t.Errorf("retry share %.3f, want about %.3f: the budget is too stingy", share, tc.wantShare)
			}
			t.Logf("%d requests, %d retries (%.3f)", requests, retries, share)
			// In steady state (after the first window) no second sees a storm: about
			// ratio × rps a second, or the floor's window allowance at once.
			limit := math.Max(1.5*tc.ratio*float64(tc.rps), window)
			for s, n := range perSecond {
				if float64(n) > limit && s > clock.Now().Unix()-50 {
					t.Errorf("second %d: %d retries, want at most %.0f", s, n, limit)
				}
			}
		})
	}
}

func TestBudgetWindowSlides(t *testing.T) {
	clock := newClock()
	b := NewBudget(0.2, 0, clock) // no floor
	if b.AllowRetry() {
		t.Fatal("no requests, no floor: a retry was allowed")
	}
	for range 10 {
		b.RecordRequest()
	}
	// 20% of 10 = 2 retries.
	granted := 0
	for range 5 {
		if b.TryRetry() {
			granted++
		}
	}
	if granted != 2 {
		t.Fatalf("with 10 requests and budget 0.2, want exactly 2 retries: %+v", b.Status())
	}
	if b.AllowRetry() {
		t.Error("AllowRetry true with the budget spent")
	}
	// AllowRetry records nothing.
	b2 := NewBudget(1, 0, clock)
	b2.RecordRequest()
	for range 5 {
		if !b2.AllowRetry() {
			t.Fatal("AllowRetry spent the budget")
		}
	}
	b2.RecordRetry()
	if b2.AllowRetry() {
		t.Error("RecordRetry did not count")
	}
	// After the window the old requests and retries are forgotten.
	clock.Advance(BudgetWindow + time.Second)
	if st := b.Status(); st.Requests != 0 || st.Retries != 0 {
		t.Errorf("after the window: %+v", st)
	}
	if b.AllowRetry() {
		t.Error("old requests still fund retries after the window")
	}
}

func TestBudgetFloor(t *testing.T) {
	clock := newClock()
	b := NewBudget(0.2, 3, clock) // 30 retries per 10 s window even with no traffic
	n := 0
	for b.TryRetry() {
		n++
		if n > 1000 {
			break
		}
	}
	if n != 30 {
		t.Errorf("floor allowed %d retries in a window, want 30", n)
	}
	st := b.Status()
	if st.Allowed != 30 || st.MinPerS != 3 {
		t.Errorf("status %+v", st)
	}
}

func TestBudgetConcurrentCannotOverdraw(t *testing.T) {
	b := NewBudget(0.1, 0, newClock())
	for range 1000 {
		b.RecordRequest()
	}
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if b.TryRetry() {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if granted != 100 {
		t.Errorf("granted %d retries, want exactly 100 (10%% of 1000)", granted)
	}
}

func TestBackoff(t *testing.T) {
	rt := mustNew(t, Spec{Retry: Retry{Attempts: 3, BackoffBase: Duration(10 * time.Millisecond), BackoffMax: Duration(100 * time.Millisecond)}}, "c", "")
	for _, tc := range []struct {
		attempt int
		lo, hi  time.Duration
	}{
		{0, 10 * time.Millisecond, 20 * time.Millisecond},
		{1, 10 * time.Millisecond, 20 * time.Millisecond},
		{2, 10 * time.Millisecond, 40 * time.Millisecond},
		{3, 10 * time.Millisecond, 80 * time.Millisecond},
		{4, 10 * time.Millisecond, 100 * time.Millisecond},
		{60, 10 * time.Millisecond, 100 * time.Millisecond},
		{1 << 30, 10 * time.Millisecond, 100 * time.Millisecond},
	} {
		seen := map[time.Duration]bool{}
		var sum time.Duration
		const n = 2000
		for range n {
			d, ok := rt.Backoff(tc.attempt, 0)
			if !ok || d < tc.lo || d > tc.hi {
				t.Fatalf("attempt %d: backoff %v (ok %v), want in [%v, %v]", tc.attempt, d, ok, tc.lo, tc.hi)
			}
			seen[d] = true
			sum += d
		}
		if len(seen) < 100 {
			t.Errorf("attempt %d: only %d distinct back-offs: no jitter", tc.attempt, len(seen))
		}
		mean, mid := sum/n, (tc.lo+tc.hi)/2
		if d := mean - mid; d > (tc.hi-tc.lo)/10 || d < -(tc.hi-tc.lo)/10 {
			t.Errorf("attempt %d: mean back-off %v, want about %v (uniform)", tc.attempt, mean, mid)
		}
	}
}

func TestBackoffRetryAfter(t *testing.T) {
	rt := mustNew(t, Spec{}, "c", "") // defaults: 25ms..250ms, max_retry_after 2s, honoured
	if d, ok := rt.Backoff(1, 1500*time.Millisecond); !ok || d != 1500*time.Millisecond {
		t.Errorf("Retry-After 1.5s: %v %v, want 1.5s", d, ok)
	}
	if d, ok := rt.Backoff(1, time.Millisecond); !ok || d < DefaultBackoffBase {
		t.Errorf("a short Retry-After must not shorten the back-off: %v %v", d, ok)
	}
	if _, ok := rt.Backoff(1, 3*time.Second); ok {
		t.Error("Retry-After 3s beyond max_retry_after 2s: want ok=false (move on)")
	}
	no := false
	rt = mustNew(t, Spec{Retry: Retry{HonorRetryAfter: &no}}, "c", "")
	if d, ok := rt.Backoff(1, 10*time.Second); !ok || d > DefaultBackoffMax {
		t.Errorf("honor_retry_after false: %v %v, want the plain back-off", d, ok)
	}
	rt = mustNew(t, Spec{Retry: Retry{MaxRetryAfter: Duration(5 * time.Second)}}, "c", "")
	if d, ok := rt.Backoff(1, 3*time.Second); !ok || d != 3*time.Second {
		t.Errorf("max_retry_after 5s, Retry-After 3s: %v %v", d, ok)
	}
	if rt.Attempts() != 1 || rt.PerTryTimeout() != 0 {
		t.Errorf("defaults: attempts %d per-try %v", rt.Attempts(), rt.PerTryTimeout())
	}
}
