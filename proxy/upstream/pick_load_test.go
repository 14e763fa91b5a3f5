package upstream

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeLoad is a LoadSource: a signal per endpoint URL with the time it was taken, fresh for
// maxAge by clock (as package gpu's scraper with its staleness limit).
type fakeLoad struct {
	clock  Clock
	maxAge time.Duration

	gets atomic.Int64 // calls to Get

	mu   sync.RWMutex
	sigs map[string]fakeSignal
}

type fakeSignal struct {
	l  Load
	at time.Time
}

func newFakeLoad(clock Clock) *fakeLoad {
	return &fakeLoad{clock: clock, maxAge: 2 * time.Second, sigs: map[string]fakeSignal{}}
}

// Set records a signal taken now. On a fake clock it then moves the clock past the
// cluster's signal cache (DefaultLoadCache), so that the next pick asks for it.
func (f *fakeLoad) Set(url string, l Load) {
	f.mu.Lock()
	f.sigs[url] = fakeSignal{l: l, at: f.clock.Now()}
	f.mu.Unlock()
	if fc, ok := f.clock.(*fakeClock); ok {
		fc.Advance(DefaultLoadCache)
	}
}

func (f *fakeLoad) Get(url string) (Load, bool) {
	f.gets.Add(1)
	f.mu.RLock()
	s, ok := f.sigs[url]
	f.mu.RUnlock()
	if !ok || f.clock.Now().Sub(s.at) > f.maxAge {
		return Load{}, false
	}
	return s.l, true
}

// stale marks a signal whose scrape is too old: it is stored but Get reports it stale.
const stale = -1.0

func mustPickFor(t testing.TB, c *Cluster, exclude *Endpoint, h Hint) int {
	t.Helper()
	e, err := c.PickFor(exclude, h)
	if err != nil {
		t.Fatalf("PickFor: %v", err)
	}
	return index(c, e)
}

func TestPickForLoadAware(t *testing.T) {
	tests := []struct {
		name     string
		picking  Picking
		weights  []int
		inFlight []int
		waiting  []float64 // stale (-1): signal present but too old; NaN: a bad value
		kv       []float64
		exclude  int // -1 for none
		want     int
		reason   string
	}{
		{name: "shortest queue", inFlight: []int{0, 0, 0}, waiting: []float64{5, 0, 3}, kv: []float64{0, 0, 0},
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "lowest KV use", inFlight: []int{0, 0, 0}, waiting: []float64{0, 0, 0}, kv: []float64{0.9, 0.2, 0.5},
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "queue beats idle-looking in-flight", inFlight: []int{0, 2, 0}, waiting: []float64{6, 0, 5}, kv: []float64{0, 0, 0},
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "in-flight decides between equal signals", inFlight: []int{2, 0, 1}, waiting: []float64{1, 1, 1}, kv: []float64{.5, .5, .5},
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "all terms", inFlight: []int{3, 0, 0}, waiting: []float64{0, 2, 0}, kv: []float64{0, 0, 0.9},
			// scores: 4+0, 1+2, 1+3.6
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "exclude the best", inFlight: []int{0, 0, 0}, waiting: []float64{5, 0, 3}, kv: []float64{0, 0, 0},
			exclude: 1, want: 2, reason: "load_aware"},
		{name: "stale idle signal is ignored", inFlight: []int{0, 0, 0}, waiting: []float64{stale, 4, 6}, kv: []float64{0, 0, 0},
			// endpoint 0 is taken at the mean queue, 5: scores 6, 5, 7
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "endpoint without signal is not shunned", inFlight: []int{0, 2, 2}, waiting: []float64{stale, 4, 4}, kv: []float64{0, 0, 0},
			// 1+4 against 3+4
			exclude: -1, want: 0, reason: "load_aware"},
		{name: "NaN is no signal", inFlight: []int{0, 0, 0}, waiting: []float64{math.NaN(), 4, 6}, kv: []float64{0, 0, 0},
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "no fresh signal: least in-flight", inFlight: []int{2, 0, 1}, waiting: []float64{stale, stale, stale}, kv: []float64{0, 0, 0},
			exclude: -1, want: 1, reason: "no_signals"},
		{name: "KV weight only", picking: Picking{KVWeight: 1}, inFlight: []int{0, 5, 0}, waiting: []float64{0, 9, 3}, kv: []float64{0.5, 0.1, 0.3},
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "endpoint weight scales in-flight", weights: []int{1, 3, 1}, inFlight: []int{1, 3, 1}, waiting: []float64{0, 0, 0}, kv: []float64{0, 0, 0},
			// 2, 4/3, 2
			exclude: -1, want: 1, reason: "load_aware"},
		{name: "least_inflight strategy ignores the source", picking: Picking{Strategy: StrategyLeastInFlight},
			inFlight: []int{0, 1, 1}, waiting: []float64{9, 0, 0}, kv: []float64{1, 0, 0},
			exclude: -1, want: 0, reason: "least_inflight"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			src := newFakeLoad(clk)
			sp := specs(len(tt.inFlight))
			for i := range sp {
				if tt.weights != nil {
					sp[i].Weight = tt.weights[i]
				}
			}
			c := newTestCluster(t, Options{Endpoints: sp, Clock: clk, Load: src, Picking: tt.picking})
			eps := c.Endpoints()
			for i, e := range eps {
				for range tt.inFlight[i] {
					e.Begin()
				}
				if tt.waiting[i] == stale {
					src.Set(e.String(), Load{}) // idle, but scraped 3s ago
				}
			}
			clk.Advance(3 * time.Second)
			for i, e := range eps {
				if tt.waiting[i] != stale {
					src.Set(e.String(), Load{Waiting: tt.waiting[i], KVCacheUsage: tt.kv[i]})
				}
			}
			var ex *Endpoint
			if tt.exclude >= 0 {
				ex = eps[tt.exclude]
			}
			before := c.PickStats()
			if got := mustPickFor(t, c, ex, Hint{}); got != tt.want {
				t.Errorf("PickFor = endpoint %d, want %d", got, tt.want)
			}
			if got := reasonOf(before, c.PickStats()); got != tt.reason {
				t.Errorf("reason = %s, want %s", got, tt.reason)
			}
		})
	}
}

// reasonOf names the one counter that moved between two PickStats.
func reasonOf(before, after PickStats) string {
	d := []struct {
		name string
		n    int64
	}{
		{"least_inflight", after.LeastInFlight - before.LeastInFlight},
		{"load_aware", after.LoadAware - before.LoadAware},
		{"no_signals", after.NoSignals - before.NoSignals},
		{"affinity_kept", after.AffinityKept - before.AffinityKept},
		{"affinity_abandoned", after.AffinityAbandoned - before.AffinityAbandoned},
		{"panic", after.Panic - before.Panic},
	}
	var moved []string
	for _, x := range d {
		if x.n != 0 {
			moved = append(moved, fmt.Sprintf("%s(%d)", x.name, x.n))
		}
	}
	if len(moved) == 1 && strings.HasSuffix(moved[0], "(1)") {
		return strings.TrimSuffix(moved[0], "(1)")
	}
	return strings.Join(moved, ",")
}

// TestPickForSignalGoesStale: a signal is used while fresh and dropped once the source
// reports it stale.
func TestPickForSignalGoesStale(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	c := newTestCluster(t, Options{Endpoints: specs(2), Clock: clk, Load: src})
	eps := c.Endpoints()
	src.Set(eps[0].String(), Load{Waiting: 10})
	src.Set(eps[1].String(), Load{Waiting: 0})
	eps[1].Begin()
	eps[1].Begin() // 1 has two in flight, 0 none
	if got := mustPickFor(t, c, nil, Hint{}); got != 1 {
		t.Fatalf("fresh: PickFor = %d, want 1 (queue 0 beats queue 10)", got)
	}
	clk.Advance(2500 * time.Millisecond) // both signals stale
	if got := mustPickFor(t, c, nil, Hint{}); got != 0 {
		t.Fatalf("stale: PickFor = %d, want 0 (least in flight)", got)
	}
	if s := c.PickStats(); s.LoadAware != 1 || s.NoSignals != 1 {
		t.Fatalf("PickStats = %+v, want one load_aware and one no_signals", s)
	}
}

func TestPickForIdleTiesShareEvenly(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	c := newTestCluster(t, Options{Endpoints: specs(4), Clock: clk, Load: src})
	eps := c.Endpoints()
	for _, e := range eps[:2] {
		src.Set(e.String(), Load{}) // 0 and 1 fresh and idle, 2 and 3 without signals
	}
	counts := make([]int, 4)
	const n = 8000
	for range n {
		counts[mustPickFor(t, c, nil, Hint{})]++
	}
	for i, k := range counts {
		if k < n/4*8/10 || k > n/4*12/10 {
			t.Errorf("endpoint %d picked %d of %d times, want about %d (counts %v)", i, k, n, n/4, counts)
		}
	}
}

func TestPickForAffinity(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	c := newTestCluster(t, Options{Endpoints: specs(4), Clock: clk, Load: src})
	eps := c.Endpoints()
	for _, e := range eps {
		src.Set(e.String(), Load{Waiting: 1, KVCacheUsage: 0.25})
	}
	h := Hint{PrefixHash: 0x1234_5678_9abc_def0}
	home := mustPickFor(t, c, nil, h)

	t.Run("kept while not overloaded", func(t *testing.T) {
		// Sequential requests sharing the prefix all land on the affinity endpoint, even
		// though the others are just as idle.
		for i := range 50 {
			e, _ := c.PickFor(nil, h)
			if got := index(c, e); got != home {
				t.Fatalf("request %d: PickFor = %d, want the affinity endpoint %d", i, got, home)
			}
			e.Begin()
			e.End()
		}
	})
	t.Run("concurrent requests stay until AffinityMaxLoad", func(t *testing.T) {
		// Held requests: the affinity endpoint takes 1 + AffinityMaxLoad of them (score up to
		// best+2) before the next goes elsewhere.
		var held []*Endpoint
		defer func() {
			for _, e := range held {
				e.End()
			}
		}()
		for i := range 6 {
			e, _ := c.PickFor(nil, h)
			e.Begin()
			held = append(held, e)
			if want := i < 3; (index(c, e) == home) != want {
				t.Fatalf("held request %d went to %d (affinity endpoint %d), want on affinity endpoint = %v",
					i, index(c, e), home, want)
			}
		}
	})
	t.Run("moves when the affinity endpoint's queue grows", func(t *testing.T) {
		src.Set(eps[home].String(), Load{Waiting: 4, KVCacheUsage: 0.25}) // 3 above the others
		before := c.PickStats()
		if got := mustPickFor(t, c, nil, h); got == home {
			t.Fatalf("PickFor = the overloaded affinity endpoint %d", got)
		}
		if r := reasonOf(before, c.PickStats()); r != "affinity_abandoned" {
			t.Fatalf("reason = %s, want affinity_abandoned", r)
		}
		src.Set(eps[home].String(), Load{Waiting: 3, KVCacheUsage: 0.25}) // 2 above: within the limit
		if got := mustPickFor(t, c, nil, h); got != home {
			t.Fatalf("PickFor = %d, want the affinity endpoint %d back", got, home)
		}
	})
	t.Run("high KV use counts as load", func(t *testing.T) {
		src.Set(eps[home].String(), Load{Waiting: 1, KVCacheUsage: 1}) // +3 from KV
		if got := mustPickFor(t, c, nil, h); got == home {
			t.Fatalf("PickFor = the affinity endpoint %d at full KV cache", got)
		}
		src.Set(eps[home].String(), Load{Waiting: 1, KVCacheUsage: 0.25})
	})
	t.Run("short prefix gets no affinity", func(t *testing.T) {
		before := c.PickStats()
		mustPickFor(t, c, nil, Hint{PrefixHash: h.PrefixHash, PrefixLen: 100})
		if r := reasonOf(before, c.PickStats()); r != "load_aware" {
			t.Fatalf("reason = %s, want load_aware", r)
		}
	})
	t.Run("stale affinity endpoint is judged at the mean", func(t *testing.T) {
		clk.Advance(3 * time.Second)
		for i, e := range eps {
			if i != home {
				src.Set(e.String(), Load{Waiting: 5})
			}
		}
		// home has no fresh signal: taken at the others' mean (5), so not overloaded.
		if got := mustPickFor(t, c, nil, h); got != home {
			t.Fatalf("PickFor = %d, want the affinity endpoint %d", got, home)
		}
	})
}

func TestPickForAffinitySpreadsPrefixes(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
	}{
		{"equal weights", []int{1, 1, 1, 1}},
		{"weighted", []int{1, 3, 2, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := specs(len(tt.weights))
			total := 0
			for i, w := range tt.weights {
				sp[i].Weight = w
				total += w
			}
			c := newTestCluster(t, Options{Endpoints: sp, Clock: newFakeClock()})
			counts := make([]int, len(sp))
			rng := rand.New(rand.NewPCG(1, 2))
			const n = 20000
			for range n {
				counts[mustPickFor(t, c, nil, Hint{PrefixHash: rng.Uint64() | 1})]++
			}
			for i, k := range counts {
				want := float64(n) * float64(tt.weights[i]) / float64(total)
				if math.Abs(float64(k)-want) > 0.05*want+50 {
					t.Errorf("endpoint %d (weight %d) got %d prefixes, want about %.0f (counts %v)", i, tt.weights[i], k, want, counts)
				}
			}
		})
	}
}

// affinityOf returns the URL of the affinity endpoint of each prefix on an idle cluster.
func affinityOf(t *testing.T, sp []EndpointSpec, prefixes []uint64) []string {
	t.Helper()
	c := newTestCluster(t, Options{Endpoints: sp, Clock: newFakeClock()})
	out := make([]string, len(prefixes))
	for i, p := range prefixes {
		e, err := c.PickFor(nil, Hint{PrefixHash: p})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = e.String()
	}
	return out
}

func TestPickForRendezvousStable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	prefixes := make([]uint64, 20000)
	for i := range prefixes {
		prefixes[i] = rng.Uint64() | 1
	}
	for _, weighted := range []bool{false, true} {
		t.Run(fmt.Sprintf("weighted=%v", weighted), func(t *testing.T) {
			sp := specs(9)
			if weighted {
				for i := range sp {
					sp[i].Weight = 1 + i%3
				}
			}
			before := affinityOf(t, sp[:8], prefixes)
			after := affinityOf(t, sp, prefixes) // endpoint 8 added
			added := sp[8].URL
			moved := 0
			for i := range prefixes {
				if before[i] != after[i] {
					moved++
					if after[i] != added {
						t.Fatalf("prefix %d moved from %s to %s, not to the added endpoint", i, before[i], after[i])
					}
				}
			}
			total := 0
			for _, s := range sp {
				total += max(s.Weight, 1)
			}
			want := float64(len(prefixes)) * float64(max(sp[8].Weight, 1)) / float64(total)
			if math.Abs(float64(moved)-want) > 0.1*want {
				t.Fatalf("%d of %d prefixes moved, want about %.0f (the added endpoint's share)", moved, len(prefixes), want)
			}
			// Removing an endpoint moves only the prefixes it held.
			removed := append(append([]EndpointSpec(nil), sp[:3]...), sp[4:]...)
			after = affinityOf(t, removed, prefixes)
			full := affinityOf(t, sp, prefixes)
			for i := range prefixes {
				if full[i] != after[i] && full[i] != sp[3].URL {
					t.Fatalf("prefix %d moved from %s to %s though %s was removed", i, full[i], after[i], sp[3].URL)
				}
			}
		})
	}
}

func TestPickForAffinityExclude(t *testing.T) {
	clk := newFakeClock()
	sp := specs(5)
	c := newTestCluster(t, Options{Endpoints: sp, Clock: clk})
	eps := c.Endpoints()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		h := Hint{PrefixHash: rng.Uint64() | 1}
		home := mustPickFor(t, c, nil, h)
		next := mustPickFor(t, c, eps[home], h)
		if next == home {
			t.Fatalf("PickFor(exclude %d) returned the excluded endpoint", home)
		}
		if again := mustPickFor(t, c, eps[home], h); again != next {
			t.Fatalf("retries of one prefix disagree: %d then %d", next, again)
		}
		// The retry goes where the prefix would live without the excluded endpoint.
		rest := append(append([]EndpointSpec(nil), sp[:home]...), sp[home+1:]...)
		if want := affinityOf(t, rest, []uint64{h.PrefixHash})[0]; eps[next].String() != want {
			t.Fatalf("retry went to %s, want the prefix's next endpoint %s", eps[next], want)
		}
	}
	// Only the excluded endpoint available: it is returned.
	one := newTestCluster(t, Options{Endpoints: specs(1), Clock: clk})
	if got := mustPickFor(t, one, one.Endpoints()[0], Hint{PrefixHash: 7}); got != 0 {
		t.Fatalf("single endpoint excluded: PickFor = %d, want 0", got)
	}
}

func TestPickForAffinityDisabled(t *testing.T) {
	c := newTestCluster(t, Options{Endpoints: specs(3), Clock: newFakeClock(), Picking: Picking{DisableAffinity: true}})
	for range 10 {
		mustPickFor(t, c, nil, Hint{PrefixHash: 42})
	}
	if s := c.PickStats(); s.LeastInFlight != 10 {
		t.Fatalf("PickStats = %+v, want 10 least_inflight", s)
	}
}

func TestPickForPanicAndEjection(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	c := newTestCluster(t, Options{
		Endpoints: specs(3), Clock: clk, Load: src,
		Outlier: Outlier{ConsecutiveFailures: 1, BaseEjection: 10 * time.Second, MaxEjectionPercent: 100},
	})
	eps := c.Endpoints()
	for _, e := range eps {
		src.Set(e.String(), Load{})
	}
	h := Hint{PrefixHash: 99}
	home := mustPickFor(t, c, nil, h)
	fail(eps[home], 1) // ejected: affinity moves to an available endpoint
	if got := mustPickFor(t, c, nil, h); got == home {
		t.Fatalf("PickFor = the ejected affinity endpoint %d", got)
	}
	for i, e := range eps {
		if i != home {
			clk.Advance(time.Second)
			fail(e, 1)
		}
	}
	// All ejected: panic mode, the soonest to return (home, ejected first).
	before := c.PickStats()
	if got := mustPickFor(t, c, nil, h); got != home {
		t.Fatalf("panic: PickFor = %d, want %d", got, home)
	}
	if r := reasonOf(before, c.PickStats()); r != "panic" {
		t.Fatalf("reason = %s, want panic", r)
	}
}

func TestPickStatsInSnapshot(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	c := newTestCluster(t, Options{Endpoints: specs(3), Clock: clk, Load: src})
	for range 5 {
		mustPickFor(t, c, nil, Hint{}) // no signals
	}
	for _, e := range c.Endpoints() {
		src.Set(e.String(), Load{})
	}
	for range 4 {
		mustPickFor(t, c, nil, Hint{})
	}
	for range 3 {
		mustPickFor(t, c, nil, Hint{PrefixHash: 5})
	}
	want := PickStats{NoSignals: 5, LoadAware: 4, AffinityKept: 3}
	if got := c.PickStats(); got != want {
		t.Fatalf("PickStats = %+v, want %+v", got, want)
	}
	var sum PickStats
	for _, s := range c.Snapshot() {
		sum.Add(s.Picks)
	}
	if sum != want {
		t.Fatalf("sum of Snapshot picks = %+v, want %+v", sum, want)
	}
	// Counts live with the endpoint state and survive a reload.
	next := newTestCluster(t, Options{Endpoints: specs(3), Clock: clk})
	next.Inherit(c)
	if got := next.PickStats(); got != want {
		t.Fatalf("after Inherit: PickStats = %+v, want %+v", got, want)
	}
}

func TestPickForDoesNotAllocate(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	sp := specs(64)
	for i := range sp {
		sp[i].Weight = 1 + i%2 // weighted rendezvous too
	}
	c := newTestCluster(t, Options{Endpoints: sp, Clock: clk, Load: src})
	eps := c.Endpoints()
	for i, e := range eps {
		if i%5 != 0 {
			src.Set(e.String(), Load{Waiting: float64(i % 7), KVCacheUsage: float64(i%10) / 10})
		}
	}
	for _, h := range []Hint{{}, {PrefixHash: 0xfeed}} {
		allocs := testing.AllocsPerRun(1000, func() {
			e, _ := c.PickFor(eps[0], h)
			e.Begin()
			e.End()
		})
		if allocs != 0 {
			t.Fatalf("PickFor(%+v)+Begin+End allocates %.1f times per call, want 0", h, allocs)
		}
	}
}

// TestConcurrentPickFor exercises PickFor with signals changing underneath (run with -race).
func TestConcurrentPickFor(t *testing.T) {
	clk := newFakeClock()
	src := newFakeLoad(clk)
	c := newTestCluster(t, Options{
		Endpoints: specs(8), Clock: clk, Load: src,
		Outlier: Outlier{ConsecutiveFailures: 3, BaseEjection: time.Second},
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var last *Endpoint
			for i := range 2000 {
				e, err := c.PickFor(last, Hint{PrefixHash: uint64(i%5 + 1)})
				if err != nil {
					t.Errorf("PickFor: %v", err)
					return
				}
				e.Begin()
				if i%7 == 0 {
					src.Set(e.String(), Load{Waiting: float64(e.InFlight()), KVCacheUsage: 0.5})
				}
				e.Report((i+g)%4 != 0)
				e.End()
				last = e
				if i%500 == 0 {
					clk.Advance(300 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	var total PickStats
	for _, s := range c.Snapshot() {
		if s.InFlight != 0 {
			t.Errorf("%s: InFlight = %d after all ended", s.URL, s.InFlight)
		}
		total.Add(s.Picks)
	}
	if n := total.LoadAware + total.NoSignals + total.AffinityKept + total.AffinityAbandoned + total.Panic + total.LeastInFlight; n != 8*2000 {
		t.Errorf("picks counted = %d, want %d", n, 8*2000)
	}
}

func TestPickForSignalCache(t *testing.T) {
	for _, cache := range []time.Duration{0, 50 * time.Millisecond, -1} {
		t.Run(fmt.Sprint(cache), func(t *testing.T) {
			clk := newFakeClock()
			src := newFakeLoad(clk)
			c := newTestCluster(t, Options{Endpoints: specs(4), Clock: clk, Load: src, Picking: Picking{LoadCache: cache}})
			eps := c.Endpoints()
			for i, e := range eps {
				src.Set(e.String(), Load{Waiting: float64(min(i, 1))}) // endpoint 0 idlest
			}
			ttl := c.opts.Picking.LoadCache
			for range 10 {
				if got := mustPickFor(t, c, nil, Hint{}); got != 0 {
					t.Fatalf("PickFor = %d, want 0", got)
				}
			}
			want := int64(4)
			if ttl < 0 {
				want = 40 // no cache: every pick asks for every endpoint
			}
			if got := src.gets.Load(); got != want {
				t.Fatalf("Get called %d times for 10 picks of 4 endpoints, want %d", got, want)
			}
			// A change is seen once the cache time has passed, not before.
			src.mu.Lock()
			src.sigs[eps[0].String()] = fakeSignal{l: Load{Waiting: 9}, at: clk.Now()}
			src.mu.Unlock()
			if ttl > 0 {
				clk.Advance(ttl / 2)
				if got := mustPickFor(t, c, nil, Hint{}); got != 0 {
					t.Fatalf("within the cache time: PickFor = %d, want 0 (the cached signal)", got)
				}
				clk.Advance(ttl)
			}
			if got := mustPickFor(t, c, nil, Hint{}); got == 0 {
				t.Fatal("PickFor = 0 after its queue grew to 9")
			}
		})
	}
}
