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
			b := NewBudgets(BudgetRule{tc.ratio, tc.floor}, BudgetRule{1, 3}, []string{"a"}, clock)
			step := time.Second / time.Duration(tc.rps)
			var requests, retries int
			perSecond := map[int64]int{}
			// A backend failing every request for 60 s; every request wants to retry (and would
			// retry again, up to 3 times, if allowed).
			for range 60 * tc.rps {
				b.RecordRequest()
				b.RecordSend("a")
				requests++
				for range 3 {
					if !b.TryRetry("a") {
						break
					}
					retries++
					perSecond[clock.Now().Unix()]++
				}
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
			if got := b.Exhausted(KindRetry); got == 0 {
				t.Error("refused retries were not counted")
			}
		})
	}
}

// TestBudgetFallbacksNotStarvedByRetries is the case of a primary failing 30% of requests
// with a healthy fallback: every failed request moves on, whatever the retries spent, and
// the retry budget is not spent by fallbacks.
func TestBudgetFallbacksNotStarvedByRetries(t *testing.T) {
	clock := newClock()
	b := NewBudgets(BudgetRule{Ratio: DefaultBudget, MinPerSecond: DefaultMinRetriesPerSecond},
		BudgetRule{Ratio: DefaultFallbackBudget, MinPerSecond: DefaultMinFallbacksPerSecond},
		[]string{"primary", "fallback"}, clock)
	const rps = 200
	refused := 0
	for i := range 60 * rps {
		b.RecordRequest()
		b.RecordSend("primary")
		if i%10 < 3 { // 30% fail on the primary
			if !b.TryFallback("fallback") {
				refused++
			}
		}
		clock.Advance(time.Second / rps)
	}
	if refused != 0 {
		t.Errorf("%d fallbacks refused with the default fallback budget, want 0", refused)
	}
	st := b.Status()
	for _, c := range st.Clusters {
		if c.Retries != 0 {
			t.Errorf("cluster %s: %d retries spent by fallbacks", c.Cluster, c.Retries)
		}
	}
	// The retry budget of the primary is intact: 20% of its sends in the window (9 to 10
	// buckets of it).
	n := 0
	for b.TryRetry("primary") {
		if n++; n > 10*rps*10 {
			break
		}
	}
	if lo, hi := int(0.2*9*rps), int(0.2*10*rps); n < lo || n > hi {
		t.Errorf("retries allowed on the primary after the fallbacks: %d, want %d to %d", n, lo, hi)
	}
	if b.Exhausted(KindFallback) != 0 || b.Exhausted(KindRetry) != 1 {
		t.Errorf("exhausted: fallback %d, retry %d; want 0 and 1", b.Exhausted(KindFallback), b.Exhausted(KindRetry))
	}
}

// TestBudgetPerCluster: a cluster's retries are measured against its own sends; a storm on
// one cluster does not spend another's budget.
func TestBudgetPerCluster(t *testing.T) {
	clock := newClock()
	b := NewBudgets(BudgetRule{Ratio: 0.5}, BudgetRule{Ratio: 0.1}, []string{"a", "b"}, clock)
	for range 100 {
		b.RecordRequest()
		b.RecordSend("a")
	}
	for range 10 {
		b.RecordSend("b")
	}
	grant := func(f func(string) bool, c string) (n int) {
		for f(c) {
			if n++; n > 1000 {
				break
			}
		}
		return n
	}
	if n := grant(b.TryRetry, "a"); n != 50 {
		t.Errorf("retries on a: %d, want 50 (half of its 100 sends)", n)
	}
	if n := grant(b.TryRetry, "b"); n != 5 {
		t.Errorf("retries on b: %d, want 5 (half of its 10 sends): a's storm spent it", n)
	}
	// Fallback budgets are per target cluster, measured against the route's requests.
	if n := grant(b.TryFallback, "b"); n != 10 {
		t.Errorf("fallbacks into b: %d, want 10 (10%% of 100 requests)", n)
	}
	if n := grant(b.TryFallback, "c"); n != 10 {
		t.Errorf("fallbacks into c (not configured at first): %d, want its own 10", n)
	}
	// A fallback counts as a send to its cluster: it funds retries there.
	if st := b.Status(); st.Clusters[1].Sent != 20 {
		t.Errorf("sends to b: %+v, want 20 (10 direct, 10 fallbacks)", st.Clusters[1])
	}
}

func TestBudgetWindowSlides(t *testing.T) {
	clock := newClock()
	b := NewBudgets(BudgetRule{Ratio: 0.2}, BudgetRule{Ratio: 0.2}, []string{"a"}, clock) // no floors
	if b.TryRetry("a") || b.TryFallback("a") {
		t.Fatal("no requests, no floor: an attempt was allowed")
	}
	for range 10 {
		b.RecordRequest()
		b.RecordSend("a")
	}
	// 20% of 10 = 2 retries, and 2 fallbacks.
	granted := 0
	for range 5 {
		if b.TryRetry("a") {
			granted++
		}
	}
	if granted != 2 {
		t.Fatalf("with 10 requests and budget 0.2, want exactly 2 retries: %+v", b.Status())
	}
	// After the window the old requests and retries are forgotten.
	clock.Advance(BudgetWindow + time.Second)
	if st := b.Status(); st.Requests != 0 || st.Clusters[0].Retries != 0 || st.Clusters[0].Sent != 0 {
		t.Errorf("after the window: %+v", st)
	}
	if b.TryRetry("a") {
		t.Error("old requests still fund retries after the window")
	}
}

func TestBudgetFloor(t *testing.T) {
	clock := newClock()
	b := NewBudgets(BudgetRule{0.2, 3}, BudgetRule{0, 2}, nil, clock) // 30 retries, 20 fallbacks per 10 s window even with no traffic
	n := 0
	for b.TryRetry("a") {
		if n++; n > 1000 {
			break
		}
	}
	if n != 30 {
		t.Errorf("floor allowed %d retries in a window, want 30", n)
	}
	n = 0
	for b.TryFallback("a") {
		if n++; n > 1000 {
			break
		}
	}
	if n != 20 {
		t.Errorf("floor allowed %d fallbacks in a window, want 20", n)
	}
	st := b.Status()
	if st.Clusters[0].RetriesAllowed != 30 || st.Retry.MinPerSecond != 3 || st.Exhausted[KindRetry] != 1 || st.Exhausted[KindFallback] != 1 {
		t.Errorf("status %+v", st)
	}
}

func TestBudgetConcurrentCannotOverdraw(t *testing.T) {
	b := NewBudgets(BudgetRule{Ratio: 0.1}, BudgetRule{Ratio: 0.1}, []string{"a"}, newClock())
	for range 1000 {
		b.RecordRequest()
		b.RecordSend("a")
	}
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if b.TryRetry("a") {
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

func TestBudgetLogDue(t *testing.T) {
	clock := newClock()
	b := NewBudgets(BudgetRule{}, BudgetRule{}, []string{"a"}, clock)
	if _, due := b.LogDue(KindRetry, 10*time.Second); due {
		t.Fatal("nothing refused: no log due")
	}
	for range 3 {
		b.TryRetry("a")
	}
	if n, due := b.LogDue(KindRetry, 10*time.Second); !due || n != 3 {
		t.Fatalf("first refusals: due %v n %d, want a log of 3", due, n)
	}
	b.TryRetry("a")
	if _, due := b.LogDue(KindRetry, 10*time.Second); due {
		t.Error("a second log within the interval")
	}
	if _, due := b.LogDue(KindFallback, 10*time.Second); due {
		t.Error("a fallback log with no fallback refused")
	}
	clock.Advance(11 * time.Second)
	b.TryRetry("a")
	if n, due := b.LogDue(KindRetry, 10*time.Second); !due || n != 2 {
		t.Errorf("after the interval: due %v n %d, want a log of the 2 since", due, n)
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
