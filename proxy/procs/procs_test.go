package procs

import (
	"math"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// steps is a run of n samples of one use.
type steps struct {
	use float64
	n   int
}

func TestDecider(t *testing.T) {
	p := Params{Every: time.Millisecond, Burst: 0.9, Up: 0.6, Down: 0.5, Short: 4, Window: 40}
	for _, tc := range []struct {
		name           string
		start, ceiling int
		run            []steps
		want           []int // the processors after each run of steps
		changes        int
	}{
		{"idle two fall to one after a window", 2, 2, []steps{{0.05, 39}, {0.05, 1}}, []int{2, 1}, 1},
		{"a moderate load stays on one: no taking turns", 2, 2,
			[]steps{{0.46, 40}, {0.40, 400}}, []int{1, 1}, 1},
		{"a burst on one rises at once", 2, 2, []steps{{0.1, 40}, {0.95, 1}}, []int{1, 2}, 2},
		{"a sustained 65% on one rises within the short mean", 1, 2,
			[]steps{{0.4, 10}, {0.65, 3}, {0.65, 1}}, []int{1, 1, 2}, 1},
		{"two busy above the fall threshold stay two", 2, 2, []steps{{0.55, 400}}, []int{2}, 0},
		{"a dip of a quarter window does not fall", 2, 2,
			[]steps{{0.8, 30}, {0.1, 10}, {0.8, 30}}, []int{2, 2, 2}, 0},
		{"saturation doubles toward the ceiling", 1, 8,
			[]steps{{1.0, 1}, {2.0, 1}, {4.0, 1}, {7.9, 1}}, []int{2, 4, 7, 8}, 4},
		{"the fall goes to what the mean needs", 8, 8, []steps{{1.2, 40}}, []int{3}, 1},
		{"nothing above the ceiling", 2, 2, []steps{{5, 10}}, []int{2}, 0},
		{"nothing below one", 1, 2, []steps{{0, 400}}, []int{1}, 0},
		{"NaN and negative uses read as idle", 2, 2, []steps{{math.NaN(), 20}, {-3, 20}}, []int{2, 1}, 1},
		{"a start above the ceiling is the ceiling", 4, 2, []steps{{1.5, 1}}, []int{2}, 0},
		{"a noisy load near the fall threshold does not take turns", 2, 2,
			[]steps{{0.3, 40}, {0.65, 1}, {0.25, 1}, {0.65, 1}, {0.25, 1}}, []int{1, 1, 1, 1, 1}, 1},
		{"a load after an idle sample rises with its first sample over Up", 1, 2,
			[]steps{{0.01, 10}, {0.65, 1}}, []int{1, 2}, 1},
		{"a light load after an idle sample stays on one", 1, 2,
			[]steps{{0.01, 10}, {0.5, 1}, {0.01, 1}, {0.55, 3}}, []int{1, 1, 1, 1}, 0},
		{"the short mean over a wrapped ring", 2, 2,
			[]steps{{0.1, 40}, {0.1, 45}, {0.65, 3}, {0.65, 1}}, []int{1, 1, 1, 2}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecider(p, tc.start, tc.ceiling)
			changes := 0
			for i, st := range tc.run {
				for range st.n {
					if _, ch := d.Observe(st.use); ch {
						changes++
					}
				}
				if d.Procs() != tc.want[i] {
					t.Fatalf("after step %d (%v × %d): %d processors, want %d", i, st.use, st.n, d.Procs(), tc.want[i])
				}
			}
			if changes != tc.changes {
				t.Fatalf("%d changes, want %d", changes, tc.changes)
			}
		})
	}
}

func TestDeciderCeilingFalls(t *testing.T) {
	d := NewDecider(Defaults, 4, 4)
	d.SetCeiling(2)
	if d.Procs() != 2 {
		t.Fatalf("%d processors under a ceiling of 2", d.Procs())
	}
	if _, ch := d.Observe(1.9); ch || d.Procs() != 2 {
		t.Fatalf("rose past the ceiling: %d", d.Procs())
	}
	d.SetCeiling(0)
	if d.Procs() != 1 {
		t.Fatalf("a ceiling of 0 is one processor, got %d", d.Procs())
	}
}

// fakeRuntime records the processors a Controller sets; cpu is a clock of CPU time that runs
// at load CPUs (capped at the processors set) of wall time.
type fakeRuntime struct {
	mu       sync.Mutex
	procs    int
	ceiling  int
	sets     []int
	defaults int
	load     float64
	cpu      time.Duration
	at       time.Time
}

func (f *fakeRuntime) Current() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs
}

func (f *fakeRuntime) Default() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.defaults++
	f.procs = f.ceiling
	return f.ceiling
}

func (f *fakeRuntime) Set(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procs = n
	f.sets = append(f.sets, n)
}

func (f *fakeRuntime) setsSoFar() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.sets...)
}

func (f *fakeRuntime) setLoad(l float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.load = l
}

func (f *fakeRuntime) clock() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if !f.at.IsZero() {
		f.cpu += time.Duration(float64(now.Sub(f.at)) * min(f.load, float64(f.procs)))
	}
	f.at = now
	return f.cpu, true
}

// waitProcs waits (bounded) until the fake runtime runs n processors.
func waitProcs(t *testing.T, f *fakeRuntime, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.Current() != n {
		if time.Now().After(deadline) {
			t.Fatalf("processors %d after 5 s, want %d (set: %v)", f.Current(), n, f.setsSoFar())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestControllerFollowsTheLoad(t *testing.T) {
	f := &fakeRuntime{procs: 2, ceiling: 2}
	p := Params{Every: 2 * time.Millisecond, Burst: 0.9, Up: 0.6, Down: 0.5, Short: 2, Window: 5}
	release := acquire(nil, p, f, f.clock, false)
	if !Running() || Held() != 1 {
		t.Fatalf("running %v, held %d after one acquire", Running(), Held())
	}
	waitProcs(t, f, 1) // idle: one processor
	f.setLoad(1.8)     // the load saturates one
	waitProcs(t, f, 2)
	f.mu.Lock()
	defaults := f.defaults
	f.mu.Unlock()
	if defaults == 0 {
		t.Fatal("rose without reading the runtime's ceiling again")
	}
	f.setLoad(0)
	waitProcs(t, f, 1)
	release()
	release() // a second call does nothing
	if Running() || Held() != 0 {
		t.Fatalf("running %v, held %d after release", Running(), Held())
	}
	if f.Current() != 2 {
		t.Fatalf("processors %d after the last release, want the runtime's 2", f.Current())
	}
	if f.setsSoFar()[len(f.setsSoFar())-1] != 1 {
		t.Fatalf("sets %v: the last one should be the fall to 1, the release the runtime's own", f.setsSoFar())
	}
}

func TestAcquireHolders(t *testing.T) {
	f := &fakeRuntime{procs: 2, ceiling: 2}
	a := acquire(nil, Defaults, f, f.clock, false)
	b := acquire(nil, Defaults, f, f.clock, false)
	if !Running() || Held() != 2 {
		t.Fatalf("running %v, held %d after two acquires", Running(), Held())
	}
	a()
	if !Running() {
		t.Fatal("stopped with a holder left")
	}
	b()
	if Running() {
		t.Fatal("still running after the last release")
	}
}

func TestAcquireDoesNotRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		procs int
		cpu   func() (time.Duration, bool)
		fixed bool
	}{
		{"GOMAXPROCS set by the operator", 2, func() (time.Duration, bool) { return 0, true }, true},
		{"one processor", 1, func() (time.Duration, bool) { return 0, true }, false},
		{"no CPU time on this system", 2, func() (time.Duration, bool) { return 0, false }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeRuntime{procs: tc.procs, ceiling: tc.procs}
			release := acquire(nil, Defaults, f, tc.cpu, tc.fixed)
			if Running() || Held() != 1 {
				t.Fatalf("running %v, held %d", Running(), Held())
			}
			release()
			if sets := f.setsSoFar(); len(sets) != 0 || Held() != 0 {
				t.Fatalf("processors set %v, held %d", sets, Held())
			}
		})
	}
}

func TestProcessCPU(t *testing.T) {
	before, ok := processCPU()
	if !ok {
		t.Skip("no CPU time on this system")
	}
	// Spin until the clock shows 10 ms of CPU (bounded: a clock that does not move fails).
	start := time.Now()
	for x := 0; ; x++ {
		_ = x * x
		if x%100000 == 0 {
			if now, _ := processCPU(); now-before >= 10*time.Millisecond {
				break
			}
			if time.Since(start) > 5*time.Second {
				now, _ := processCPU()
				t.Fatalf("5 s of spinning read as %v of CPU time", now-before)
			}
		}
	}
}

// quietOnOne starts a Controller on a fake runtime of two processors with no load and
// waits until it runs one and is quiet: its last sample found it idle, the next is an hour
// away (Idle), and only Begin's kicks start a sample sooner (a Probe of 2 ms).
func quietOnOne(t *testing.T) *fakeRuntime {
	t.Helper()
	f := &fakeRuntime{procs: 2, ceiling: 2}
	p := Params{Every: 2 * time.Millisecond, Idle: time.Hour, Probe: 2 * time.Millisecond,
		Burst: 0.75, Up: 0.4, Down: 1.0 / 3, Short: 4, Window: 3}
	t.Cleanup(acquire(nil, p, f, f.clock, false))
	waitProcs(t, f, 1)
	deadline := time.Now().Add(5 * time.Second)
	for !quiet.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the Controller on one processor with no load is not quiet after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	return f
}

// TestBurstProbe: on one processor with regular samples far apart, requests piling up
// (Begin) make the Controller take a short sample at once and rise within it.
func TestBurstProbe(t *testing.T) {
	f := quietOnOne(t)
	// Not quiet from here: the first request would start a probe (TestBurstFromQuiet), and
	// this one is about requests piling up. The next regular sample is an hour away.
	quiet.Store(false)
	f.setLoad(1.5)
	deadline := time.Now().Add(5 * time.Second)
	for f.Current() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("processors %d 5 s into a burst of requests (set: %v)", f.Current(), f.setsSoFar())
		}
		for range kickEvery {
			Begin()
		}
		for range kickEvery {
			End()
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := inflight.Load(); n != 0 {
		t.Fatalf("%d requests in flight after as many Ends as Begins", n)
	}
}

// TestBurstFromQuiet: on one processor, sampling every Idle after an idle sample, the first
// request starts a short sample at once: a load that came all at once rises within a probe,
// not at the next regular sample (an hour away here), and without requests piling up first.
func TestBurstFromQuiet(t *testing.T) {
	f := quietOnOne(t)
	f.setLoad(1.5)
	Begin() // one request: no multiple of 16 in flight
	defer End()
	waitProcs(t, f, 2)
	if quiet.Load() {
		t.Error("quiet on two processors")
	}
}

// TestBurstJump: on one processor, requests arriving together rise at once, before any
// sample could show the processor busy (the fake CPU stays idle: no sample would); requests
// in flight that only crept up since the last sample (long streams, one by one) do not.
func TestBurstJump(t *testing.T) {
	for _, tc := range []struct {
		name     string
		before   int // in flight, then samples taken
		after    int // more in flight after those samples
		wantRise bool
	}{
		{"a burst from idle", 0, Defaults.Jump, true},
		{"a burst on top of long streams", 40, Defaults.Jump + kickEvery, true},
		{"long streams creeping up", 60, 4, false},
		{"fewer than a jump", 0, Defaults.Jump - kickEvery, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeRuntime{procs: 2, ceiling: 2}
			// Idle an hour: on one processor with no load the regular samples stop, and the
			// probe (started by the kick at 16 in flight) is the one sample that sees the
			// requests in flight, 200 ms on: the burst's Begins need not come within
			// microseconds of each other (a loaded machine under -race), and the creeping
			// case waits for that sample.
			p := Params{Every: 10 * time.Millisecond, Idle: time.Hour, Probe: 200 * time.Millisecond, Jump: Defaults.Jump,
				Burst: 0.75, Up: 0.4, Down: 1.0 / 3, Short: 4, Window: 3}
			release := acquire(nil, p, f, f.clock, false)
			defer release()
			defer func() { inflight.Store(0) }()
			waitProcs(t, f, 1)
			time.Sleep(3 * p.Every) // a kick this soon after the last sample starts no probe
			for range tc.before {
				Begin()
			}
			time.Sleep(300 * time.Millisecond) // the probe's sample sees them
			for range tc.after {
				Begin()
			}
			if !tc.wantRise {
				time.Sleep(20 * time.Millisecond)
				if got := f.Current(); got != 1 {
					t.Fatalf("processors %d (set: %v), want 1: %d in flight grew by %d", got, f.setsSoFar(), tc.before+tc.after, tc.after)
				}
				return
			}
			waitProcs(t, f, 2)
		})
	}
}

// TestBeginWithoutController: Begin and End keep their count with no Controller and never
// block, whatever the count.
func TestBeginWithoutController(t *testing.T) {
	for range 10 * kickEvery {
		Begin()
	}
	for range 10 * kickEvery {
		End()
	}
	if n := inflight.Load(); n != 0 {
		t.Fatalf("%d in flight", n)
	}
}

// TestControllerCeilingFalls: the container shrinks while the Controller runs one processor;
// the next rise reads the runtime's ceiling again and stays under it.
func TestControllerCeilingFalls(t *testing.T) {
	f := &fakeRuntime{procs: 4, ceiling: 4}
	p := Params{Every: 2 * time.Millisecond, Burst: 0.75, Up: 0.4, Down: 1.0 / 3, Short: 2, Window: 5}
	release := acquire(nil, p, f, f.clock, false)
	defer release()
	waitProcs(t, f, 1)
	f.mu.Lock()
	f.ceiling = 2
	f.mu.Unlock()
	f.setLoad(8) // wants every processor there is
	waitProcs(t, f, 2)
	time.Sleep(30 * time.Millisecond)
	for _, n := range f.setsSoFar() {
		if n > 2 {
			t.Fatalf("set %d over a ceiling of 2 (sets %v)", n, f.setsSoFar())
		}
	}
	if f.Current() != 2 {
		t.Fatalf("processors %d under a ceiling of 2 at full load", f.Current())
	}
}
