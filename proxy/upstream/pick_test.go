package upstream

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func TestPickLeastInFlight(t *testing.T) {
	tests := []struct {
		name     string
		weights  []int
		inFlight []int
		exclude  int // -1 for none
		want     int
	}{
		{"least in flight", []int{1, 1, 1}, []int{2, 0, 1}, -1, 1},
		{"least in flight last", []int{1, 1, 1}, []int{3, 2, 1}, -1, 2},
		{"exclude least", []int{1, 1, 1}, []int{2, 0, 1}, 1, 2},
		{"exclude only idle still picks least of others", []int{1, 1}, []int{5, 0}, 1, 0},
		{"higher weight takes more load", []int{1, 3}, []int{0, 0}, -1, 1},
		{"equal normalised load goes to higher weight", []int{1, 3}, []int{0, 2}, -1, 1},
		{"weighted load beyond share", []int{1, 3}, []int{0, 3}, -1, 0},
		{"weight 4 vs 1 at 4:0", []int{4, 1}, []int{4, 0}, -1, 1},
		{"weight 4 vs 1 at 3:0", []int{4, 1}, []int{3, 0}, -1, 0},
		{"idle picks the highest weight", []int{2, 5, 3}, []int{0, 0, 0}, -1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := specs(len(tt.weights))
			for i, w := range tt.weights {
				sp[i].Weight = w
			}
			c := newTestCluster(t, Options{Endpoints: sp, Clock: newFakeClock()})
			eps := c.Endpoints()
			for i, n := range tt.inFlight {
				for range n {
					eps[i].Begin()
				}
			}
			var ex *Endpoint
			if tt.exclude >= 0 {
				ex = eps[tt.exclude]
			}
			if got := mustPick(t, c, ex); got != tt.want {
				t.Errorf("Pick = endpoint %d, want %d", got, tt.want)
			}
		})
	}
}

func TestPickExcludeOnlyAvailable(t *testing.T) {
	clk := newFakeClock()
	c := newTestCluster(t, Options{
		Endpoints: specs(3), Clock: clk,
		Outlier: Outlier{ConsecutiveFailures: 1, MaxEjectionPercent: 100},
	})
	eps := c.Endpoints()
	fail(eps[1], 1)
	fail(eps[2], 1)
	// Endpoint 0 is the only available one: excluding it still returns it (the others are
	// merely ejected, and an available endpoint beats panic mode).
	if got := mustPick(t, c, eps[0]); got != 0 {
		t.Fatalf("Pick(exclude 0) = %d, want 0", got)
	}
}

func TestPickRoundRobinAmongTies(t *testing.T) {
	c := newTestCluster(t, Options{Endpoints: specs(3), Clock: newFakeClock()})
	counts := make([]int, 3)
	prev := -1
	for range 30 {
		got := mustPick(t, c, nil)
		if got == prev {
			t.Fatalf("the same endpoint %d was picked twice in a row among idle ties", got)
		}
		prev = got
		counts[got]++
	}
	for i, n := range counts {
		if n != 10 {
			t.Errorf("endpoint %d picked %d times of 30, want 10 (counts %v)", i, n, counts)
		}
	}
}

func TestPickTiesSpreadEvenlyAroundBusyEndpoints(t *testing.T) {
	// Ties separated by busy endpoints must still share evenly (a rotating scan start would
	// favour the tie after the gap).
	c := newTestCluster(t, Options{Endpoints: specs(4), Clock: newFakeClock()})
	eps := c.Endpoints()
	eps[1].Begin()
	eps[2].Begin()
	counts := make([]int, 4)
	for range 100 {
		counts[mustPick(t, c, nil)]++
	}
	if counts[0] != 50 || counts[3] != 50 {
		t.Fatalf("counts = %v, want 50 each on endpoints 0 and 3", counts)
	}
}

func TestPickAllEjectedPanicMode(t *testing.T) {
	clk := newFakeClock()
	c := newTestCluster(t, Options{
		Endpoints: specs(3), Clock: clk,
		Outlier: Outlier{ConsecutiveFailures: 1, BaseEjection: 10 * time.Second, MaxEjectionPercent: 100},
	})
	eps := c.Endpoints()
	// Eject 1 at t0 (until t0+10s), 0 at t0+2s (until +12s), 2 at t0+4s (until +14s).
	fail(eps[1], 1)
	clk.Advance(2 * time.Second)
	fail(eps[0], 1)
	clk.Advance(2 * time.Second)
	fail(eps[2], 1)
	for i, e := range eps {
		if e.Available(clk.Now()) {
			t.Fatalf("endpoint %d available, want all ejected", i)
		}
	}
	tests := []struct {
		name    string
		exclude int
		want    int
	}{
		{"soonest ejection end", -1, 1},
		{"soonest other than excluded", 1, 0},
		{"excluding a later one changes nothing", 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ex *Endpoint
			if tt.exclude >= 0 {
				ex = eps[tt.exclude]
			}
			if got := mustPick(t, c, ex); got != tt.want {
				t.Errorf("Pick = %d, want %d", got, tt.want)
			}
		})
	}
	// A single-endpoint cluster whose endpoint is ejected and excluded still gets it.
	one := newTestCluster(t, Options{
		Endpoints: specs(1), Clock: clk,
		Outlier: Outlier{ConsecutiveFailures: 1, MaxEjectionPercent: 100},
	})
	fail(one.Endpoints()[0], 1)
	if got := mustPick(t, one, one.Endpoints()[0]); got != 0 {
		t.Fatalf("single ejected endpoint: Pick = %d, want 0", got)
	}
}

func TestPickNoneHealthy(t *testing.T) {
	clk := newFakeClock()
	c := newTestCluster(t, Options{
		Endpoints: specs(3), Clock: clk,
		HealthCheck: HealthCheck{Interval: time.Hour, UnhealthyThreshold: 1},
		Outlier:     Outlier{ConsecutiveFailures: 1, MaxEjectionPercent: 100},
	})
	eps := c.Endpoints()
	down := errors.New("down")
	c.recordCheck(eps[0], down)
	c.recordCheck(eps[1], down)
	// 2 is healthy but ejected: panic mode returns it rather than failing.
	fail(eps[2], 1)
	if got := mustPick(t, c, nil); got != 2 {
		t.Fatalf("Pick = %d, want the healthy ejected endpoint 2", got)
	}
	if got := mustPick(t, c, eps[2]); got != 2 {
		t.Fatalf("Pick(exclude 2) = %d, want 2 (the only healthy one)", got)
	}
	c.recordCheck(eps[2], down)
	for _, ex := range []*Endpoint{nil, eps[0]} {
		if e, err := c.Pick(ex); !errors.Is(err, ErrNoHealthyEndpoint) || e != nil {
			t.Fatalf("Pick = %v, %v; want nil, ErrNoHealthyEndpoint", e, err)
		}
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	c := newTestCluster(t, Options{Endpoints: specs(64), Clock: newFakeClock()})
	eps := c.Endpoints()
	for i, e := range eps {
		for range i % 3 {
			e.Begin()
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		e, _ := c.Pick(eps[0])
		e.Begin()
		e.End()
	})
	if allocs != 0 {
		t.Fatalf("Pick+Begin+End allocates %.1f times per call, want 0", allocs)
	}
}

func TestAcquireReleaseIdempotent(t *testing.T) {
	c := newTestCluster(t, Options{Endpoints: specs(1)})
	e := c.Endpoints()[0]
	r1 := e.Acquire()
	r2 := e.Acquire()
	if got := e.InFlight(); got != 2 {
		t.Fatalf("InFlight = %d, want 2", got)
	}
	r1()
	r1()
	if got := e.InFlight(); got != 1 {
		t.Fatalf("InFlight after double release = %d, want 1", got)
	}
	r2()
	if got := e.InFlight(); got != 0 {
		t.Fatalf("InFlight = %d, want 0", got)
	}
	if got := c.Snapshot()[0].Requests; got != 2 {
		t.Fatalf("Requests = %d, want 2", got)
	}
}

// TestConcurrentUse exercises Pick, Begin/End, Report and Snapshot together (run with -race).
func TestConcurrentUse(t *testing.T) {
	clk := newFakeClock()
	c := newTestCluster(t, Options{
		Endpoints: specs(8), Clock: clk,
		Outlier: Outlier{ConsecutiveFailures: 3, BaseEjection: time.Second},
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last *Endpoint
			for i := range 2000 {
				e, err := c.Pick(last)
				if err != nil {
					t.Errorf("Pick: %v", err)
					return
				}
				e.Begin()
				e.Report((i+g)%4 != 0)
				e.End()
				last = e
				if i%500 == 0 {
					clk.Advance(300 * time.Millisecond)
					_ = c.Snapshot()
				}
			}
		}()
	}
	wg.Wait()
	var total int64
	for _, s := range c.Snapshot() {
		if s.InFlight != 0 {
			t.Errorf("%s: InFlight = %d after all ended", s.URL, s.InFlight)
		}
		total += s.Requests
	}
	if total != 8*2000 {
		t.Errorf("total requests = %d, want %d", total, 8*2000)
	}
}
