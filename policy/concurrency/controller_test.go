package concurrency

import (
	"math"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

type ctlHarness struct {
	c   *controller
	now time.Time
	src LoadSource
}

func newHarness(p Params) *ctlHarness {
	p = p.WithDefaults()
	now := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	return &ctlHarness{c: newController(p, now), now: now}
}

// window feeds one full window of n outcomes (n = the current limit when 0), with the
// in-flight count at inflight (the limit when 0), and closes it.
func (h *ctlHarness) window(t *testing.T, n, inflight int, o policy.Outcome) {
	t.Helper()
	if n == 0 {
		n = max(h.c.current(), h.c.p.MinSamples)
	}
	if inflight == 0 {
		inflight = h.c.current()
	}
	h.c.noteInflight(inflight)
	for range n {
		h.c.observe(o)
	}
	h.now = h.now.Add(h.c.p.SampleWindow.D())
	if !h.c.maybeUpdate(h.now, h.src) {
		t.Fatal("window did not close")
	}
}

func out(ttft, tpot time.Duration) policy.Outcome {
	return policy.Outcome{Status: 200, Cluster: "c", TTFT: ttft, TPOT: tpot}
}

func TestControllerRisesUnderHeadroom(t *testing.T) {
	h := newHarness(Params{MinLimit: 2, MaxLimit: 64, InitialLimit: 4})
	prev := h.c.limit
	for i := range 200 {
		h.window(t, 0, 0, out(100*time.Millisecond, 20*time.Millisecond))
		if h.c.limit < prev {
			t.Fatalf("window %d: limit fell %g → %g under stable latency", i, prev, h.c.limit)
		}
		prev = h.c.limit
	}
	if got := h.c.current(); got != 64 {
		t.Fatalf("limit = %d after 200 stable windows, want max 64", got)
	}
}

func TestControllerAppLimitedDoesNotRise(t *testing.T) {
	h := newHarness(Params{InitialLimit: 32, MaxLimit: 64})
	for range 50 {
		h.window(t, 20, 3, out(100*time.Millisecond, 20*time.Millisecond))
	}
	if got := h.c.current(); got != 32 {
		t.Fatalf("limit = %d, want 32 (windows used 3 of 32 slots)", got)
	}
}

func TestControllerFallsUnderLatencyGrowth(t *testing.T) {
	tests := []struct {
		name       string
		ttft, tpot func(i int) time.Duration
	}{
		{"ttft grows", func(i int) time.Duration { return time.Duration(100+50*i) * time.Millisecond },
			func(int) time.Duration { return 20 * time.Millisecond }},
		{"tpot grows", func(int) time.Duration { return 100 * time.Millisecond },
			func(i int) time.Duration { return time.Duration(20+10*i) * time.Millisecond }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(Params{MinLimit: 5, MaxLimit: 200, InitialLimit: 100})
			h.window(t, 0, 0, out(tc.ttft(0), tc.tpot(0)))
			prev := h.c.limit
			for i := 1; i < 60; i++ {
				h.window(t, 0, 0, out(tc.ttft(i), tc.tpot(i)))
				if i > 2 && h.c.limit >= prev && h.c.limit > 5 {
					t.Fatalf("window %d: limit %g → %g did not fall", i, prev, h.c.limit)
				}
				prev = h.c.limit
			}
			if got := h.c.current(); got != 5 {
				t.Fatalf("limit = %d, want min 5", got)
			}
		})
	}
}

func TestControllerDropsLowerLimit(t *testing.T) {
	h := newHarness(Params{InitialLimit: 100, MaxLimit: 200, Smoothing: 1})
	h.window(t, 0, 0, out(100*time.Millisecond, 20*time.Millisecond))
	base := h.c.limit
	h.c.noteInflight(h.c.current())
	for range 15 {
		h.c.observe(out(100*time.Millisecond, 20*time.Millisecond))
	}
	for range 5 {
		h.c.observe(policy.Outcome{Status: 502, ErrorClass: "upstream_5xx", Cluster: "c"})
	}
	h.c.observe(policy.Outcome{Status: 499, ErrorClass: "client_cancel"}) // ignored
	h.now = h.now.Add(time.Second)
	h.c.maybeUpdate(h.now, nil)
	if want := base * 0.75; math.Abs(h.c.limit-want) > 1e-9 {
		t.Fatalf("limit = %g, want %g (5 drops of 20: gradient 0.75)", h.c.limit, want)
	}
}

// TestControllerStep checks one update exactly: bounds, smoothing, gradient clamps, target.
func TestControllerStep(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name   string
		p      Params
		sample time.Duration // second window's TTFT (first is 100ms)
		want   float64
	}{
		// baseline 100ms, ref 150ms; sample 300ms: gradient 0.5; limit 100.
		{"smoothing 1", Params{Smoothing: 1}, 300 * ms, 50},
		{"smoothing 0.2", Params{Smoothing: 0.2}, 300 * ms, 90},
		{"gradient clamped at min", Params{Smoothing: 1}, 3000 * ms, 50},
		{"min_gradient 0.8", Params{Smoothing: 1, MinGradient: 0.8}, 3000 * ms, 80},
		{"within tolerance: headroom", Params{Smoothing: 1, Headroom: 3}, 140 * ms, 103},
		{"sqrt headroom", Params{Smoothing: 1}, 100 * ms, 110},
		{"max_gradient 2, faster sample", Params{Smoothing: 1, MaxGradient: 2, Headroom: 1, MaxLimit: 1000}, 100 * ms, 151},
		{"bounded by max", Params{Smoothing: 1, MaxLimit: 105}, 100 * ms, 105},
		{"bounded by min", Params{Smoothing: 1, MinLimit: 60}, 3000 * ms, 60},
		{"target below ref", Params{Smoothing: 1, TargetTTFT: policy.Duration(120 * ms)}, 240 * ms, 50},
		{"tolerance 0", Params{Smoothing: 1, Tolerance: 1e-9}, 125 * ms, 80},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			p.InitialLimit = 100
			if p.MaxLimit == 0 {
				p.MaxLimit = 500
			}
			h := newHarness(p)
			h.c.limit = 100
			h.c.baseTTFT.push(h.now, 100*ms)
			h.window(t, 20, 100, out(tc.sample, 0))
			if math.Abs(h.c.limit-tc.want) > 1e-6 {
				t.Fatalf("limit = %g, want %g (gradient %g)", h.c.limit, tc.want, h.c.gradient)
			}
		})
	}
}

func TestControllerBaselineFollowsAfterMinRTT(t *testing.T) {
	h := newHarness(Params{MinRTT: policy.Duration(10 * time.Second), MinLimit: 4, InitialLimit: 50})
	h.window(t, 0, 0, out(100*time.Millisecond, 0))
	for range 60 { // the server got slower for good: the limit falls to min, then after min_rtt the baseline follows
		h.window(t, 0, 0, out(400*time.Millisecond, 0))
	}
	if got := h.c.baseTTFT.base; got != 400*time.Millisecond {
		t.Fatalf("baseline = %s, want 400ms", got)
	}
	low := h.c.limit
	for range 30 {
		h.window(t, 0, 0, out(400*time.Millisecond, 0))
	}
	if h.c.limit <= low {
		t.Fatalf("limit %g did not recover (was %g)", h.c.limit, low)
	}
}

func TestControllerGPUPressure(t *testing.T) {
	stable := out(100*time.Millisecond, 20*time.Millisecond)
	tests := []struct {
		name    string
		loads   []([3]float64) // waiting, kv, fresh(1/0) per window after the first
		falls   bool
		grad    float64 // pressure gradient of the last window
		reason  string
		nilSrc  bool
		kvHigh  float64
		cluster string
	}{
		{name: "kv above kv_high", loads: [][3]float64{{0, 0.98, 1}}, falls: true, grad: 0.6, reason: "kv_cache:c"},
		{name: "kv just above", loads: [][3]float64{{0, 0.9001, 1}}, falls: true, grad: 0.95, reason: "kv_cache:c"},
		{name: "kv below", loads: [][3]float64{{0, 0.85, 1}}, grad: 1},
		{name: "kv stale", loads: [][3]float64{{0, 0.99, 0}}, grad: 1},
		{name: "queue growing", loads: [][3]float64{{1, 0.5, 1}, {7, 0.5, 1}}, falls: true, grad: 0.25, reason: "queue_growing:c"},
		{name: "queue steady", loads: [][3]float64{{3, 0.5, 1}, {3, 0.5, 1}}, grad: 1},
		{name: "queue shrinking", loads: [][3]float64{{5, 0.5, 1}, {2, 0.5, 1}}, grad: 1},
		{name: "no source", nilSrc: true, loads: [][3]float64{{0, 0, 0}}, grad: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(Params{InitialLimit: 100, MaxLimit: 500, Smoothing: 1})
			var cur [3]float64
			if !tc.nilSrc {
				h.src = LoadFunc(func(cluster string) (float64, float64, bool) {
					if cluster != "c" {
						t.Errorf("load read for cluster %q", cluster)
					}
					return cur[0], cur[1], cur[2] == 1
				})
			}
			h.window(t, 0, 0, stable) // first window: no load yet (zero, stale)
			var before float64
			for _, ld := range tc.loads {
				cur = ld
				before = h.c.limit
				h.window(t, 100, 100, stable)
			}
			if fell := h.c.limit < before; fell != tc.falls {
				t.Fatalf("limit %g → %g, falls = %v, want %v", before, h.c.limit, fell, tc.falls)
			}
			want := math.Max(tc.grad, 0.5)
			if math.Abs(h.c.pressGradient-want) > 1e-9 || h.c.pressure != tc.reason {
				t.Fatalf("pressure %g %q, want %g %q", h.c.pressGradient, h.c.pressure, want, tc.reason)
			}
			if tc.falls && math.Abs(h.c.limit-before*want) > 1e-6 {
				t.Fatalf("limit %g, want %g × %g (no headroom under pressure)", h.c.limit, before, want)
			}
		})
	}
}

func TestMinWindow(t *testing.T) {
	w := minWindow{span: 10 * time.Second}
	t0 := time.Unix(0, 0)
	steps := []struct {
		at   int
		v    time.Duration
		want time.Duration
	}{{0, 5, 5}, {1, 7, 5}, {2, 3, 3}, {5, 9, 3}, {12, 8, 3}, {13, 10, 8}, {30, 11, 11}}
	for _, s := range steps {
		w.push(t0.Add(time.Duration(s.at)*time.Second), s.v)
		if got := w.min(); got != s.want {
			t.Fatalf("at %ds: min = %d, want %d", s.at, got, s.want)
		}
	}
}
