package upstream

import (
	"bytes"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

// holdPicks picks n times, beginning every request and ending none (n requests in flight
// at the end), and returns the picks per endpoint index.
func holdPicks(t *testing.T, c *Cluster, n int, h Hint) []int {
	t.Helper()
	got := make([]int, len(c.Endpoints()))
	var held []*Endpoint
	for range n {
		e, err := c.PickFor(nil, h)
		if err != nil {
			t.Fatal(err)
		}
		e.Begin()
		held = append(held, e)
		got[index(c, e)]++
	}
	for _, e := range held {
		e.End()
	}
	return got
}

// TestFlaggedWeight: a flagged endpoint keeps FlaggedWeight of its weight under both
// strategies: with requests held in flight it gets about that share of what an unflagged
// one gets, never none; unflagged, stale or with FlaggedWeight 1 the split is even.
func TestFlaggedWeight(t *testing.T) {
	const n = 220
	tests := []struct {
		name     string
		strategy string
		weight   float64 // Picking.FlaggedWeight; 0: the default
		flags    Flags
		stale    bool
		hint     Hint
		share    float64 // expected share of picks on endpoint 0
	}{
		{"least in-flight, unflagged", StrategyLeastInFlight, 0, 0, false, Hint{}, 0.5},
		{"least in-flight, leak, default weight", StrategyLeastInFlight, 0, FlagKVLeak, false, Hint{}, 0.1 / 1.1},
		{"least in-flight, stall, 0.25", StrategyLeastInFlight, 0.25, FlagStall, false, Hint{}, 0.25 / 1.25},
		{"least in-flight, flagged, weight 1", StrategyLeastInFlight, 1, FlagStall, false, Hint{}, 0.5},
		{"least in-flight, stale flags", StrategyLeastInFlight, 0, FlagKVLeak, true, Hint{}, 0.5},
		{"load-aware, unflagged", StrategyLoadAware, 0, 0, false, Hint{}, 0.5},
		{"load-aware, both flags, default weight", StrategyLoadAware, 0, FlagKVLeak | FlagStall, false, Hint{}, 0.1 / 1.1},
		{"load-aware, stall, 0.5", StrategyLoadAware, 0.5, FlagStall, false, Hint{}, 0.5 / 1.5},
		{"load-aware, stale flags", StrategyLoadAware, 0, FlagStall, true, Hint{}, 0.5},
		{"load-aware, prefix hint, flagged", StrategyLoadAware, 0, FlagKVLeak, false, Hint{PrefixHash: 0xfeed}, 0.1 / 1.1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			src := newFakeLoad(clk)
			c := newTestCluster(t, Options{Endpoints: specs(2), Clock: clk, Load: src,
				Picking: Picking{Strategy: tt.strategy, FlaggedWeight: tt.weight, DisableAffinity: tt.hint.PrefixHash == 0}})
			eps := c.Endpoints()
			src.Set(eps[0].String(), Load{Flags: tt.flags})
			src.Set(eps[1].String(), Load{})
			if tt.stale {
				clk.Advance(src.maxAge + time.Second)
			}
			got := holdPicks(t, c, n, tt.hint)
			if want := tt.share * n; math.Abs(float64(got[0])-want) > 3 {
				t.Errorf("picks %v: endpoint 0 got %d, want %.0f±3 (share %.3f)", got, got[0], want, tt.share)
			}
			if got[0] == 0 {
				t.Errorf("flagged endpoint never picked: %v", got)
			}
			st := c.Snapshot()
			wantW := 1.0
			if tt.flags != 0 && !tt.stale {
				wantW = c.opts.Picking.FlaggedWeight
			}
			if st[0].EffectiveWeight != wantW || st[1].EffectiveWeight != 1 || st[1].Flags != nil {
				t.Errorf("snapshot weights %v / %v, flags %v / %v", st[0].EffectiveWeight, st[1].EffectiveWeight, st[0].Flags, st[1].Flags)
			}
			if want := tt.flags.Names(); !tt.stale && strings.Join(st[0].Flags, ",") != strings.Join(want, ",") {
				t.Errorf("snapshot flags %v, want %v", st[0].Flags, want)
			}
		})
	}
}

// TestFlaggedNotPickedWhenIdle: with nothing in flight a flagged endpoint loses every pick
// to an unflagged one (its weight is lower), and it is still picked when it is the only
// endpoint left.
func TestFlaggedNotPickedWhenIdle(t *testing.T) {
	for _, strategy := range []string{StrategyLeastInFlight, StrategyLoadAware} {
		clk := newFakeClock()
		src := newFakeLoad(clk)
		c := newTestCluster(t, Options{Endpoints: specs(2), Clock: clk, Load: src, Picking: Picking{Strategy: strategy}})
		eps := c.Endpoints()
		src.Set(eps[0].String(), Load{Flags: FlagKVLeak})
		src.Set(eps[1].String(), Load{})
		for range 50 {
			if got := mustPick(t, c, nil); got != 1 {
				t.Fatalf("%s: picked the flagged endpoint while idle", strategy)
			}
		}
		if got := mustPick(t, c, eps[1]); got != 0 {
			t.Fatalf("%s: excluding the other endpoint picked %d, want the flagged one", strategy, got)
		}
	}
}

// TestFlaggedAffinityAbandoned: the prefix's endpoint, when flagged, scores at its lowered
// weight, so its requests go elsewhere.
func TestFlaggedAffinityAbandoned(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	c := newTestCluster(t, Options{Endpoints: specs(4), Clock: clk, Load: src})
	for _, e := range c.Endpoints() {
		src.Set(e.String(), Load{})
	}
	h := Hint{PrefixHash: 0xabcdef}
	home := mustPickFor(t, c, nil, h)
	src.Set(c.Endpoints()[home].String(), Load{Flags: FlagStall})
	if got := mustPickFor(t, c, nil, h); got == home {
		t.Fatal("the flagged affinity endpoint kept its prefix while the others are idle")
	}
	if p := c.PickStats(); p.AffinityAbandoned != 1 || p.AffinityKept != 1 {
		t.Errorf("pick stats %+v", p)
	}
}

func flagCluster(t *testing.T, n int, od Outlier, hc HealthCheck) (*Cluster, *fakeLoad, *fakeClock, *bytes.Buffer) {
	t.Helper()
	clk := newFakeClock()
	src := newFakeLoad(clk)
	var logs bytes.Buffer
	c := newTestCluster(t, Options{Endpoints: specs(n), Clock: clk, Load: src, Outlier: od, HealthCheck: hc,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for _, e := range c.Endpoints() {
		src.Set(e.String(), Load{})
	}
	return c, src, clk, &logs
}

// TestEjectFlagged: with Outlier.EjectFlagged a flagged endpoint is ejected on the pick that
// reads its flags, for BaseEjection × multiplier like a failing one, again when it returns
// still flagged, and not once the flag is gone.
func TestEjectFlagged(t *testing.T) {
	c, src, clk, logs := flagCluster(t, 3, Outlier{EjectFlagged: true, BaseEjection: 10 * time.Second}, HealthCheck{})
	eps := c.Endpoints()
	src.Set(eps[0].String(), Load{KVCacheUsage: 0.4, Flags: FlagKVLeak})
	for range 60 {
		if got := mustPick(t, c, nil); got == 0 {
			t.Fatal("picked the ejected endpoint")
		}
	}
	st := c.Snapshot()[0]
	if !st.Ejected || st.EjectionReason != "kv_leak" || st.TimesEjected != 1 || st.EjectedUntil.Sub(clk.Now()) != 10*time.Second {
		t.Fatalf("after the flag: %+v", st)
	}
	if !strings.Contains(logs.String(), "upstream: endpoint ejected") || !strings.Contains(logs.String(), "reason=kv_leak") {
		t.Errorf("log:\n%s", logs)
	}

	// Back after 10s, still flagged: ejected again, for longer.
	clk.Advance(10 * time.Second)
	src.Set(eps[0].String(), Load{Flags: FlagKVLeak | FlagStall})
	mustPick(t, c, nil)
	st = c.Snapshot()[0]
	if !st.Ejected || st.EjectionReason != "kv_leak,stall" || st.TimesEjected != 2 || st.EjectedUntil.Sub(clk.Now()) != 20*time.Second {
		t.Fatalf("re-ejection: %+v", st)
	}

	// The flag clears: back in service when the ejection ends, and picked.
	clk.Advance(20 * time.Second)
	src.Set(eps[0].String(), Load{})
	got := holdPicks(t, c, 30, Hint{})
	if got[0] != 10 {
		t.Errorf("picks after the flag cleared %v, want an even split", got)
	}
	if st := c.Snapshot()[0]; st.Ejected || st.TimesEjected != 2 || st.EjectionReason != "" {
		t.Errorf("after clearing: %+v", st)
	}
}

// TestEjectFlaggedLimits: flag ejection honours MaxEjectionPercent and never ejects the
// last available endpoint (unhealthy ones are not available); without EjectFlagged nothing
// is ejected; a skipped ejection is logged once.
func TestEjectFlaggedLimits(t *testing.T) {
	tests := []struct {
		name      string
		n         int
		od        Outlier
		flagged   []int
		unhealthy []int
		ejected   []bool
		skipLog   string
	}{
		{"off", 3, Outlier{}, []int{0}, nil, []bool{false, false, false}, ""},
		{"one of three", 3, Outlier{EjectFlagged: true}, []int{0}, nil, []bool{true, false, false}, ""},
		{"percent: one of two", 2, Outlier{EjectFlagged: true}, []int{0, 1}, nil, []bool{true, false}, "ejection of a flagged endpoint skipped"},
		{"percent: two of four", 4, Outlier{EjectFlagged: true}, []int{0, 1, 2}, nil, []bool{true, true, false, false}, "max ejection percent reached"},
		{"percent 100: not the last", 2, Outlier{EjectFlagged: true, MaxEjectionPercent: 100}, []int{0, 1}, nil, []bool{true, false}, "the last available endpoint"},
		{"single endpoint", 1, Outlier{EjectFlagged: true, MaxEjectionPercent: 100}, []int{0}, nil, []bool{false}, "the last available endpoint"},
		{"the others unhealthy", 3, Outlier{EjectFlagged: true, MaxEjectionPercent: 100}, []int{0}, []int{1, 2}, []bool{false, false, false}, "the last available endpoint"},
		{"with failure ejection on", 3, Outlier{EjectFlagged: true, ConsecutiveFailures: 5}, []int{2}, nil, []bool{false, false, true}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, src, _, logs := flagCluster(t, tt.n, tt.od, HealthCheck{Interval: time.Hour})
			eps := c.Endpoints()
			for _, i := range tt.unhealthy {
				eps[i].st.healthy.Store(false)
			}
			for _, i := range tt.flagged {
				src.Set(eps[i].String(), Load{Flags: FlagStall})
			}
			for range 20 {
				if _, err := c.Pick(nil); err != nil {
					t.Fatal(err)
				}
				src.Set(eps[0].String(), map[bool]Load{true: {Flags: FlagStall}, false: {}}[contains(tt.flagged, 0)])
			}
			for i, st := range c.Snapshot() {
				if st.Ejected != tt.ejected[i] {
					t.Errorf("endpoint %d ejected = %v, want %v", i, st.Ejected, tt.ejected[i])
				}
			}
			if n := strings.Count(logs.String(), "ejection of a flagged endpoint skipped"); (tt.skipLog != "") != (n == 1) || n > 1 {
				t.Errorf("skip logged %d times:\n%s", n, logs)
			}
			if tt.skipLog != "" && !strings.Contains(logs.String(), tt.skipLog) {
				t.Errorf("log lacks %q:\n%s", tt.skipLog, logs)
			}
		})
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestPickForFlaggedDoesNotAllocate guards the hot path with flags read.
func TestPickForFlaggedDoesNotAllocate(t *testing.T) {
	for _, strategy := range []string{StrategyLeastInFlight, StrategyLoadAware} {
		clk := newFakeClock()
		src := newFakeLoad(clk)
		c := newTestCluster(t, Options{Endpoints: specs(16), Clock: clk, Load: src, Picking: Picking{Strategy: strategy, LoadCache: -1},
			Outlier: Outlier{EjectFlagged: true}})
		for i, e := range c.Endpoints() {
			src.Set(e.String(), Load{Waiting: float64(i % 3), Flags: Flags(i % 4)})
		}
		allocs := testing.AllocsPerRun(1000, func() {
			e, _ := c.Pick(nil)
			e.Begin()
			e.End()
		})
		if allocs != 0 {
			t.Errorf("%s: Pick with flags allocates %.1f times", strategy, allocs)
		}
	}
}
