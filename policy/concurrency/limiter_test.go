package concurrency

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

func static(limit, queue int) Params {
	return Params{Adaptive: ptr(false), MaxLimit: limit, MinLimit: 1, MaxQueue: queue, MaxWait: policy.Duration(time.Minute)}
}

func TestAdmitUnderLimitAndDoneReleases(t *testing.T) {
	l := newLimiter(t, static(2, 4), newClock())
	a, b := admitNow(t, l, req("t")), admitNow(t, l, req("t"))
	if a.Reject != nil || b.Reject != nil || a.Done == nil {
		t.Fatal("not admitted under the limit")
	}
	if s := l.Stats(); s.InFlight != 2 || s.Limit != 2 {
		t.Fatalf("stats %+v", s)
	}
	a.Done(ok200)
	a.Done(ok200) // settles once
	if s := l.Stats(); s.InFlight != 1 {
		t.Fatalf("in flight = %d after Done (twice), want 1", s.InFlight)
	}
	b.Done(ok200)
	if s := l.Stats(); s.InFlight != 0 || s.Admitted != 2 || s.Wait.Count != 2 || s.Wait.Counts[0] != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestQueueOrderPriorityThenDeadline(t *testing.T) {
	clk := newClock()
	p := static(1, 10)
	p.TrustPriorityHeader = true
	l := newLimiter(t, p, clk)
	l.SetPriorities(map[string]int{"gold": 10, "silver": 5})
	holder := admitNow(t, l, req("x"))

	now := clk.Now()
	type w struct {
		name     string
		tenant   string
		header   string
		deadline time.Duration // 0: max_wait (1m)
	}
	ws := []w{
		{"bronze-late", "bronze", "", 0},
		{"silver", "silver", "", 0},
		{"bronze-early", "bronze", "", 20 * time.Second},
		{"gold", "gold", "", 0},
		{"bronze-header-7", "bronze", "7", 0},
		{"bronze-late-2", "bronze", "", 0},
		{"bronze-mid", "bronze", "", 40 * time.Second},
	}
	want := []string{"gold", "bronze-header-7", "silver", "bronze-early", "bronze-mid", "bronze-late", "bronze-late-2"}
	results := make(chan result, len(ws))
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for i, x := range ws {
		ctx := context.Background()
		if x.deadline > 0 {
			c, cancel := context.WithDeadline(ctx, now.Add(x.deadline))
			ctx, cancels = c, append(cancels, cancel)
		}
		r := req(x.tenant)
		if x.header != "" {
			r.Header = http.Header{PriorityHeader: {x.header}}
		}
		admitAsync(ctx, l, x.name, r, results)
		waitQueued(t, l, i+1) // arrival order is the order above
	}
	snap := l.Snapshot()
	for i, sw := range snap.Waiters {
		if wantT := ws[indexOf(ws, want[i], func(x w) string { return x.name })].tenant; sw.Tenant != wantT {
			t.Errorf("snapshot waiter %d tenant %q, want %q", i, sw.Tenant, wantT)
		}
	}
	var got []string
	next := holder
	for range ws {
		next.Done(ok200)
		r := <-results
		if r.err != nil || r.d.Reject != nil {
			t.Fatalf("%s: %v %v", r.name, r.err, r.d.Reject)
		}
		got = append(got, r.name)
		next = r.d
	}
	next.Done(ok200)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("served %v, want %v", got, want)
	}
	if clk.Timers() != 0 {
		t.Fatalf("%d timers left", clk.Timers())
	}
}

func indexOf[T any](xs []T, name string, key func(T) string) int {
	for i, x := range xs {
		if key(x) == name {
			return i
		}
	}
	return -1
}

func TestHeaderPriorityIgnoredUnlessTrusted(t *testing.T) {
	l := newLimiter(t, static(1, 10), newClock())
	r := req("a")
	r.Header = http.Header{PriorityHeader: {"100"}}
	if got := l.priority(r); got != 0 {
		t.Fatalf("priority = %d from an untrusted header", got)
	}
	l.SetPriorities(map[string]int{"a": 3})
	if got := l.priority(r); got != 3 {
		t.Fatalf("priority = %d, want tenant's 3", got)
	}
}

// settleAfter admits a request, holds it for d on clk and settles it (teaching the hold time).
func settleAfter(t *testing.T, l *Limiter, clk *fakeClock, d time.Duration) {
	t.Helper()
	x := admitNow(t, l, req("x"))
	clk.Advance(d)
	x.Done(ok200)
}

func TestHopelessDeadlineRejectedAtOnce(t *testing.T) {
	tests := []struct {
		name     string
		hold     time.Duration
		maxWait  time.Duration
		ctxDL    time.Duration // 0: none
		queued   int           // waiters ahead
		rejected bool
	}{
		{"no hold time known: waits", 0, time.Second, 0, 0, false},
		{"max_wait shorter than a slot", 10 * time.Second, time.Second, 0, 0, true},
		{"ctx deadline shorter than a slot", 10 * time.Second, time.Minute, time.Second, 0, true},
		{"deadline already past", 0, time.Minute, -time.Second, 0, true},
		{"plausible", time.Second, 5 * time.Second, 0, 0, false},
		{"plausible alone, hopeless behind 5", time.Second, 5 * time.Second, 0, 5, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			p := static(1, 10)
			p.MaxWait = policy.Duration(tc.maxWait)
			l := newLimiter(t, p, clk)
			if tc.hold > 0 {
				settleAfter(t, l, clk, tc.hold)
			}
			holder := admitNow(t, l, req("x"))
			results := make(chan result, tc.queued+1)
			ctxAhead, cancelAhead := context.WithCancel(context.Background())
			defer cancelAhead()
			for i := range tc.queued {
				admitAsync(ctxAhead, l, "ahead", req("x"), results)
				waitQueued(t, l, i+1)
			}
			ctx := context.Background()
			if tc.ctxDL != 0 {
				c, cancel := context.WithDeadline(ctx, clk.Now().Add(tc.ctxDL))
				defer cancel()
				ctx = c
			}
			if tc.rejected {
				d, err := l.Admit(ctx, req("y"))
				if err != nil {
					t.Fatal(err)
				}
				wantReject(t, l, d, ReasonDeadline)
			} else {
				admitAsync(ctx, l, "y", req("y"), results)
				waitQueued(t, l, tc.queued+1)
			}
			cancelAhead()
			for range tc.queued {
				if r := <-results; !errors.Is(r.err, context.Canceled) {
					t.Fatalf("ahead: %v", r.err)
				}
			}
			holder.Done(ok200)
			if !tc.rejected {
				r := <-results
				if r.err != nil || r.d.Reject != nil {
					t.Fatalf("y: %v %v", r.err, r.d.Reject)
				}
				r.d.Done(ok200)
			}
		})
	}
}

func TestFullQueueRejectedAtOnce(t *testing.T) {
	for _, q := range []int{-1, 1, 3} {
		l := newLimiter(t, static(1, q), newClock())
		holder := admitNow(t, l, req("x"))
		results := make(chan result, 3)
		ctx, cancel := context.WithCancel(context.Background())
		for i := range max(q, 0) {
			admitAsync(ctx, l, "w", req("x"), results)
			waitQueued(t, l, i+1)
		}
		wantReject(t, l, admitNow(t, l, req("late")), ReasonQueueFull)
		cancel()
		for range max(q, 0) {
			<-results
		}
		holder.Done(ok200)
		if s := l.Stats(); s.InFlight != 0 || s.Queued != 0 {
			t.Fatalf("max_queue %d: stats %+v", q, s)
		}
	}
}

func TestCancelRemovesWaiter(t *testing.T) {
	l := newLimiter(t, static(1, 10), newClock())
	holder := admitNow(t, l, req("x"))
	results := make(chan result, 2)
	ctx, cancel := context.WithCancel(context.Background())
	admitAsync(ctx, l, "gone", req("a"), results)
	waitQueued(t, l, 1)
	admitAsync(context.Background(), l, "next", req("b"), results)
	waitQueued(t, l, 2)
	cancel()
	if r := <-results; r.name != "gone" || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %s %v, want gone canceled", r.name, r.err)
	}
	if s := l.Stats(); s.Queued != 1 || s.Cancelled != 1 {
		t.Fatalf("stats %+v", s)
	}
	holder.Done(ok200)
	r := <-results
	if r.name != "next" || r.d.Reject != nil {
		t.Fatalf("got %s %v", r.name, r.d.Reject)
	}
	r.d.Done(ok200)
	if s := l.Stats(); s.InFlight != 0 || s.Queued != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMaxWaitTimesOut(t *testing.T) {
	clk := newClock()
	p := static(1, 10)
	p.MaxWait = policy.Duration(2 * time.Second)
	l := newLimiter(t, p, clk)
	holder, results := holdAndQueue(t, l)
	clk.Advance(time.Second)
	select {
	case r := <-results:
		t.Fatalf("returned before max_wait: %+v", r)
	default:
	}
	clk.Advance(time.Second)
	r := <-results
	wantReject(t, l, r.d, ReasonQueueTimeout)
	holder.Done(ok200)
	if s := l.Stats(); s.InFlight != 0 || s.Queued != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestWaitHistogramAndHoldTime(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, static(1, 10), clk)
	holder, results := holdAndQueue(t, l)
	clk.Advance(300 * time.Millisecond)
	holder.Done(ok200)
	r := <-results
	clk.Advance(time.Second)
	r.d.Done(ok200)
	s := l.Stats()
	if s.Wait.Count != 2 || s.Wait.Sum != 300*time.Millisecond || s.Wait.Counts[0] != 1 || s.Wait.Counts[7] != 1 || s.QueuedTotal != 1 {
		t.Fatalf("wait %+v queued %d", s.Wait, s.QueuedTotal)
	}
	if snap := l.Snapshot(); snap.HoldTime.D() != 300*time.Millisecond+70*time.Millisecond {
		t.Fatalf("hold = %s, want EWMA 370ms", snap.HoldTime.D())
	}
}

// TestAdaptiveLimiterFallsAndAdmitsWaiters drives the limiter end to end: a latency rise
// lowers the limit, then recovery raises it and queued requests get in.
func TestAdaptiveLimiterFallsAndRises(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, Params{MinLimit: 2, MaxLimit: 8, InitialLimit: 8, Smoothing: 1, MinSamples: 8, SampleWindow: policy.Duration(time.Second)}, clk)
	wave := func(ttft time.Duration) {
		var ds []policy.Decision
		for range l.Stats().Limit {
			ds = append(ds, admitNow(t, l, req("x")))
		}
		clk.Advance(time.Second / 8)
		for i, d := range ds {
			if d.Reject != nil {
				t.Fatalf("rejected: %v", d.Reject)
			}
			if i == len(ds)-1 {
				clk.Advance(time.Second)
			}
			d.Done(out(ttft, 10*time.Millisecond))
		}
	}
	wave(100 * time.Millisecond)
	wave(100 * time.Millisecond)
	for range 4 {
		wave(600 * time.Millisecond)
	}
	if got := l.Stats().Limit; got != 2 {
		t.Fatalf("limit = %d after slow waves, want 2", got)
	}
	snap := l.Snapshot()
	if snap.BaselineTTFT.D() != 100*time.Millisecond || snap.SampleTTFT.D() != 600*time.Millisecond || snap.Gradient != 0.5 {
		t.Fatalf("snapshot %+v", snap)
	}
	if _, err := json.Marshal(snap); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		wave(100 * time.Millisecond)
	}
	if got := l.Stats().Limit; got != 8 {
		t.Fatalf("limit = %d after recovery, want 8", got)
	}
}

func TestLimiterLoadSource(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, Params{MinLimit: 1, MaxLimit: 16, InitialLimit: 16, Smoothing: 1, MinSamples: 16}, clk)
	l.SetLoadSource(LoadFunc(func(string) (float64, float64, bool) { return 0, 1, true }))
	var ds []policy.Decision
	for range 16 {
		ds = append(ds, admitNow(t, l, req("x")))
	}
	clk.Advance(time.Second)
	for _, d := range ds {
		d.Done(ok200)
	}
	if s := l.Snapshot(); s.Limit != 8 || s.Pressure != "kv_cache:c" {
		t.Fatalf("limit %d pressure %q, want 8 kv_cache:c", s.Limit, s.Pressure)
	}
}

func TestParamsValidate(t *testing.T) {
	tests := []struct {
		name string
		p    Params
		errs []string
	}{
		{"defaults", Params{}, nil},
		{"design example", Params{Adaptive: ptr(true), Max: 256}, nil},
		{"everything wrong", Params{
			MinLimit: -1, MaxLimit: -2, InitialLimit: -3, SampleWindow: -1, MinSamples: -1, Percentile: 1.5,
			MinRTT: -1, Tolerance: -1, TargetTTFT: -1, TargetTPOT: -1, MinGradient: 1, MaxGradient: 3,
			Smoothing: 2, Headroom: -1, KVHigh: 2, MaxQueue: -2, MaxWait: -1,
		}, []string{"min_limit", "max_limit", "initial_limit", "sample_window", "min_samples", "percentile",
			"min_rtt", "tolerance", "target_ttft", "target_tpot", "min_gradient", "max_gradient", "smoothing",
			"headroom", "kv_high", "max_queue", "max_wait"}},
		{"min above max", Params{MinLimit: 10, MaxLimit: 5}, []string{"min_limit (10) must not exceed max_limit (5)"}},
		{"max and max_limit", Params{Max: 10, MaxLimit: 20}, []string{"not both"}},
		{"min_rtt below window", Params{MinRTT: policy.Duration(time.Second), SampleWindow: policy.Duration(2 * time.Second)}, []string{"min_rtt"}},
		{"max_gradient below 1", Params{MaxGradient: 0.9}, []string{"max_gradient"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("valid, want errors")
			}
			for _, e := range tc.errs {
				if !strings.Contains(err.Error(), e) {
					t.Errorf("error %q does not mention %q", err, e)
				}
			}
			if n := len(strings.Split(err.Error(), "\n")); n < len(tc.errs) {
				t.Errorf("%d problems reported, want at least %d", n, len(tc.errs))
			}
		})
	}
	d := Defaults()
	if !*d.Adaptive || d.MinLimit != 4 || d.MaxLimit != 256 || d.InitialLimit != 16 || d.MaxQueue != 128 ||
		d.MaxWait.D() != 5*time.Second || d.KVHigh != 0.9 || d.Smoothing != 0.2 || d.Percentile != 0.9 {
		t.Fatalf("defaults %+v", d)
	}
	if got := (Params{Max: 64}).WithDefaults().MaxLimit; got != 64 {
		t.Fatalf("max alias: max_limit = %d", got)
	}
}

func TestRegistryBuilds(t *testing.T) {
	p, err := policy.Build(policy.Spec{Type: "concurrency", Params: map[string]any{"adaptive": true, "max": 64, "max_wait": "2s", "kv_high": 0.8}},
		policy.Env{Route: "chat", Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	l, ok := p.(*Limiter)
	if !ok {
		t.Fatalf("built %T", p)
	}
	if _, ok := p.(policy.Admitter); !ok {
		t.Fatal("not an Admitter")
	}
	if got := l.Params(); got.MaxLimit != 64 || got.MaxWait.D() != 2*time.Second || got.KVHigh != 0.8 {
		t.Fatalf("params %+v", got)
	}
	if s := l.Snapshot(); s.Route != "chat" || s.Limit != 16 {
		t.Fatalf("snapshot %+v", s)
	}
	if _, err := policy.Build(policy.Spec{Type: "concurrency", Params: map[string]any{"maxx": 1}}, policy.Env{}); err == nil {
		t.Fatal("unknown param accepted")
	}
	if _, err := policy.Build(policy.Spec{Type: "concurrency", Params: map[string]any{"min_limit": -1, "smoothing": 3}}, policy.Env{}); err == nil ||
		!strings.Contains(err.Error(), "min_limit") || !strings.Contains(err.Error(), "smoothing") {
		t.Fatalf("err = %v", err)
	}
}
