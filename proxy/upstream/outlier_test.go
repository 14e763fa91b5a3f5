package upstream

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func outlierCluster(t *testing.T, n int, od Outlier) (*Cluster, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	return newTestCluster(t, Options{Endpoints: specs(n), Clock: clk, Outlier: od}), clk
}

func TestEjectAfterConsecutiveFailures(t *testing.T) {
	tests := []struct {
		name        string
		reports     string // F failure, S success
		wantEjected bool
	}{
		{"below threshold", "FF", false},
		{"at threshold", "FFF", true},
		{"success resets the count", "FFSFF", false},
		{"success then threshold", "FFSFFF", true},
		{"successes only", "SSSSS", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clk := outlierCluster(t, 4, Outlier{ConsecutiveFailures: 3})
			e := c.Endpoints()[0]
			for _, r := range tt.reports {
				e.Report(r == 'S')
			}
			if got := !e.Available(clk.Now()); got != tt.wantEjected {
				t.Fatalf("ejected = %v, want %v", got, tt.wantEjected)
			}
			if tt.wantEjected {
				for range 20 {
					if got := mustPick(t, c, nil); got == 0 {
						t.Fatal("Pick returned the ejected endpoint while others are available")
					}
				}
			}
			s := c.Snapshot()[0]
			if s.Ejected != tt.wantEjected {
				t.Fatalf("Snapshot.Ejected = %v, want %v", s.Ejected, tt.wantEjected)
			}
			wantFailures := int64(strings.Count(tt.reports, "F"))
			if s.Failures != wantFailures {
				t.Fatalf("Snapshot.Failures = %d, want %d", s.Failures, wantFailures)
			}
		})
	}
}

func TestEjectionTimeGrowsAndIsCapped(t *testing.T) {
	c, clk := outlierCluster(t, 2, Outlier{
		ConsecutiveFailures: 2, BaseEjection: 10 * time.Second, MaxEjection: 35 * time.Second,
	})
	e := c.Endpoints()[0]
	want := []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second, 35 * time.Second, 35 * time.Second}
	for i, d := range want {
		fail(e, 2)
		s := c.Snapshot()[0]
		if !s.Ejected {
			t.Fatalf("ejection %d: not ejected", i+1)
		}
		if got := s.EjectedUntil.Sub(clk.Now()); got != d {
			t.Fatalf("ejection %d lasts %v, want %v", i+1, got, d)
		}
		if s.TimesEjected != int64(i+1) {
			t.Fatalf("TimesEjected = %d, want %d", s.TimesEjected, i+1)
		}
		clk.Advance(d - time.Nanosecond)
		if e.Available(clk.Now()) {
			t.Fatalf("ejection %d: available 1ns before it ends", i+1)
		}
		clk.Advance(time.Nanosecond)
		if !e.Available(clk.Now()) {
			t.Fatalf("ejection %d: not available when it ends", i+1)
		}
		if c.Snapshot()[0].Ejected {
			t.Fatalf("ejection %d: Snapshot still says ejected", i+1)
		}
	}
}

func TestEjectionMultiplierDecays(t *testing.T) {
	c, clk := outlierCluster(t, 2, Outlier{
		ConsecutiveFailures: 1, BaseEjection: 10 * time.Second, MaxEjection: time.Minute,
		DecayInterval: 10 * time.Second,
	})
	e := c.Endpoints()[0]
	ejectFor := func() time.Duration {
		t.Helper()
		fail(e, 1)
		s := c.Snapshot()[0]
		if !s.Ejected {
			t.Fatal("not ejected")
		}
		d := s.EjectedUntil.Sub(clk.Now())
		clk.Advance(d) // ejection over
		return d
	}
	steps := []struct {
		inService time.Duration // time back in service before the next failure
		want      time.Duration
	}{
		{0, 10 * time.Second},                // m=1
		{0, 20 * time.Second},                // m=2
		{9 * time.Second, 30 * time.Second},  // no full interval: m=3
		{10 * time.Second, 30 * time.Second}, // one interval: 3-1+1 = 3
		{25 * time.Second, 20 * time.Second}, // two intervals: 3-2+1 = 2
		{time.Hour, 10 * time.Second},        // fully decayed: 0+1
	}
	for i, st := range steps {
		clk.Advance(st.inService)
		if got := ejectFor(); got != st.want {
			t.Fatalf("step %d: ejected for %v, want %v", i, got, st.want)
		}
	}
	if got := c.Snapshot()[0].TimesEjected; got != int64(len(steps)) {
		t.Fatalf("TimesEjected = %d, want %d (it never decays)", got, len(steps))
	}
}

func TestMaxEjectionPercent(t *testing.T) {
	tests := []struct {
		endpoints, percent, wantEjected int
	}{
		{1, 50, 0}, // Envoy's rule: 100% > 50%, a lone endpoint is not ejected
		{1, 100, 1},
		{2, 50, 1},
		{3, 50, 1},
		{4, 50, 2},
		{5, 50, 2},
		{10, 10, 1},
		{10, 0, 5}, // 0 means the default, 50
		{4, 100, 4},
		{4, 20, 0}, // 25% > 20%: Envoy does not eject at all (always_eject_one_host off)
	}
	for _, tt := range tests {
		t.Run("", func(t *testing.T) {
			c, clk := outlierCluster(t, tt.endpoints, Outlier{ConsecutiveFailures: 2, MaxEjectionPercent: tt.percent})
			for _, e := range c.Endpoints() {
				fail(e, 2)
			}
			ejected := 0
			for _, e := range c.Endpoints() {
				if !e.Available(clk.Now()) {
					ejected++
				}
			}
			if ejected != tt.wantEjected {
				t.Fatalf("%d endpoints at %d%%: %d ejected, want %d", tt.endpoints, tt.percent, ejected, tt.wantEjected)
			}
		})
	}
}

func TestEjectionBlockedResetsCount(t *testing.T) {
	c, clk := outlierCluster(t, 2, Outlier{ConsecutiveFailures: 3})
	a, b := c.Endpoints()[0], c.Endpoints()[1]
	fail(a, 3) // ejected (1 of 2 = 50%)
	fail(b, 3) // blocked: 2 of 2 > 50%
	if b.Available(clk.Now()) != true {
		t.Fatal("b ejected beyond MaxEjectionPercent")
	}
	if got := c.Snapshot()[1].ConsecutiveFailures; got != 0 {
		t.Fatalf("consecutive failures after a blocked ejection = %d, want 0 (reset as Envoy does)", got)
	}
	clk.Advance(DefaultBaseEjection) // a returns
	fail(b, 2)
	if !b.Available(clk.Now()) {
		t.Fatal("b ejected after 2 failures; the blocked run should not count")
	}
	fail(b, 1)
	if b.Available(clk.Now()) {
		t.Fatal("b not ejected after a fresh run of 3 failures")
	}
}

func TestFailuresWhileEjectedDoNotCount(t *testing.T) {
	c, clk := outlierCluster(t, 2, Outlier{ConsecutiveFailures: 3, BaseEjection: 10 * time.Second})
	e := c.Endpoints()[0]
	fail(e, 3)
	fail(e, 5) // requests that were in flight when it was ejected
	s := c.Snapshot()[0]
	if s.ConsecutiveFailures != 0 || s.TimesEjected != 1 || s.Failures != 8 {
		t.Fatalf("snapshot = %+v; want 0 consecutive, 1 ejection, 8 failures", s)
	}
	clk.Advance(10 * time.Second)
	fail(e, 2)
	if !e.Available(clk.Now()) {
		t.Fatal("re-ejected after 2 failures on return")
	}
}

func TestOutlierDisabled(t *testing.T) {
	c, clk := outlierCluster(t, 2, Outlier{})
	e := c.Endpoints()[0]
	fail(e, 100)
	if !e.Available(clk.Now()) {
		t.Fatal("ejected with outlier detection disabled")
	}
	if got := c.Snapshot()[0].ConsecutiveFailures; got != 100 {
		t.Fatalf("ConsecutiveFailures = %d, want 100", got)
	}
}

func TestEjectionIsLogged(t *testing.T) {
	var buf bytes.Buffer
	c := newTestCluster(t, Options{
		Name: "llama", Endpoints: specs(2), Clock: newFakeClock(),
		Outlier: Outlier{ConsecutiveFailures: 1},
		Logger:  slog.New(slog.NewTextHandler(&buf, nil)),
	})
	fail(c.Endpoints()[0], 1)
	out := buf.String()
	for _, want := range []string{"endpoint ejected", "cluster=llama", "endpoint=http://10.0.0.1:8000", "for=30s"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
}
