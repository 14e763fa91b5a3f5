package route

import (
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// waitState polls the cluster's breaker until it reports want (bounded).
func waitState(t *testing.T, b *Breakers, cluster, want string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for b.State(cluster) != want {
		if time.Now().After(deadline) {
			t.Fatalf("breaker %s: %s, want %s", cluster, b.State(cluster), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func attempt(t *testing.T, b *Breakers, cluster string, failed, excluded bool) bool {
	t.Helper()
	done, ok := b.Allow(cluster)
	if ok {
		done.End(failed, excluded)
	}
	return ok
}

func TestBreakerLifecycle(t *testing.T) {
	const openFor = 60 * time.Millisecond
	b := NewBreakers(Breaker{Window: Duration(10 * time.Second), MinRequests: 10, FailureRatio: 0.5, OpenFor: Duration(openFor), HalfOpenProbes: 2}, "a", "b")

	// Below the minimum volume nothing opens, even at 100% failures.
	for range 9 {
		if !attempt(t, b, "a", true, false) {
			t.Fatal("refused below min_requests")
		}
	}
	if st := b.State("a"); st != "closed" {
		t.Fatalf("after 9 failures (min 10): %s", st)
	}
	// The tenth counted request reaches the volume with 100% > 50% failures: open.
	attempt(t, b, "a", true, false)
	if st := b.State("a"); st != "open" {
		t.Fatalf("after 10 failures: %s, want open", st)
	}
	if _, ok := b.Allow("a"); ok {
		t.Fatal("open breaker allowed an attempt")
	}
	if ra := b.RetryAfter("a"); ra <= 0 || ra > openFor {
		t.Errorf("RetryAfter %v, want in (0, %v]", ra, openFor)
	}
	// Another cluster is unaffected.
	if !attempt(t, b, "b", false, false) || b.State("b") != "closed" {
		t.Error("cluster b affected by a's breaker")
	}

	// After open_for: half-open, two probes, a third is refused while they run.
	waitState(t, b, "a", "half-open")
	d1, ok1 := b.Allow("a")
	d2, ok2 := b.Allow("a")
	_, ok3 := b.Allow("a")
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("half-open probes: %v %v %v, want true true false", ok1, ok2, ok3)
	}
	d1.End(false, false)
	d2.End(false, false)
	if st := b.State("a"); st != "closed" {
		t.Fatalf("after 2 successful probes: %s, want closed", st)
	}

	// Open again; a failing probe reopens.
	for range 10 {
		attempt(t, b, "a", true, false)
	}
	waitState(t, b, "a", "half-open")
	attempt(t, b, "a", true, false)
	if st := b.State("a"); st != "open" {
		t.Fatalf("after a failed probe: %s, want open", st)
	}
	snap := b.Snapshot()
	if len(snap) != 2 || snap[0].Cluster != "a" || snap[0].Trips != 3 || snap[0].OpenedAt.IsZero() || snap[0].State != "open" {
		t.Errorf("snapshot %+v", snap)
	}
}

func TestBreakerRatio(t *testing.T) {
	b := NewBreakers(Breaker{MinRequests: 10, FailureRatio: 0.5, OpenFor: Duration(time.Hour)})
	// 40% failures, spread out: stays closed, however many.
	for i := range 100 {
		attempt(t, b, "x", i%5 == 1 || i%5 == 3, false)
	}
	if st := b.State("x"); st != "closed" {
		t.Fatalf("40%% failures: %s", st)
	}
	// Failures push the ratio past 50%.
	for range 30 {
		attempt(t, b, "x", true, false)
	}
	if st := b.State("x"); st != "open" {
		t.Fatalf("%s, want open past a 50%% failure ratio", st)
	}
}

func TestBreakerExcludedDoNotCount(t *testing.T) {
	b := NewBreakers(Breaker{MinRequests: 5, FailureRatio: 0.5, OpenFor: Duration(time.Hour), HalfOpenProbes: 1})
	for range 100 {
		attempt(t, b, "x", true, true) // excluded wins over failed
	}
	if st := b.State("x"); st != "closed" {
		t.Fatalf("after 100 excluded outcomes: %s", st)
	}
	if s := b.Snapshot()[0]; s.Exclusions != 100 || s.Failures != 0 {
		t.Errorf("counts %+v", s)
	}
	// Verdicts of the request path's classes.
	for _, tc := range []struct {
		class            policy.Class
		status           int
		failed, excluded bool
	}{
		{"", 200, false, false},
		{"", 503, true, false},
		{"", 404, false, true},
		{policy.ClassConnect, 502, true, false},
		{policy.ClassUpstream5xx, 500, true, false},
		{policy.ClassTTFTTimeout, 504, true, false},
		{policy.ClassStreamCut, 502, true, false},
		{policy.ClassIdleTimeout, 504, true, false},
		{policy.ClassEmptyResponse, 502, true, false},
		{policy.ClassClientCancel, 499, false, true},
		{policy.ClassUpstream4xx, 400, false, true},
		{policy.ClassUpstream429, 429, false, true},
		{policy.ClassTimeout, 504, false, true},
		{policy.ClassShutdown, 503, false, true},
		{"weird", 418, false, true},
		{"weird", 502, true, false},
	} {
		f, e := Verdict(tc.class, tc.status, "", nil)
		if f != tc.failed || e != tc.excluded {
			t.Errorf("Verdict(%q, %d) = %v, %v; want %v, %v", tc.class, tc.status, f, e, tc.failed, tc.excluded)
		}
	}
	// A contract mismatch counts against the cluster.
	if f, e := Verdict(policy.ClassUpstream4xx, 400, "unsupported_parameter", []Contract{{Status: 400, Code: "unsupported_parameter"}}); !f || e {
		t.Errorf("contract mismatch verdict %v %v, want failed", f, e)
	}
}

func TestBreakerRollingWindow(t *testing.T) {
	const window = 200 * time.Millisecond
	b := NewBreakers(Breaker{Window: Duration(window), Buckets: 4, MinRequests: 4, FailureRatio: 0.5, OpenFor: Duration(time.Hour)})
	for range 3 {
		attempt(t, b, "x", true, false)
	}
	time.Sleep(window + 2*window/4)
	// The three old failures left the window: one more failure is below the volume.
	attempt(t, b, "x", true, false)
	if st := b.State("x"); st != "closed" {
		t.Fatalf("failures outside the window still counted: %s", st)
	}
}

func TestBreakerDisabled(t *testing.T) {
	b := NewBreakers(Breaker{Disabled: true, MinRequests: 1}, "a")
	for range 100 {
		if !attempt(t, b, "a", true, false) {
			t.Fatal("disabled breaker refused")
		}
	}
	if st := b.State("a"); st != "disabled" {
		t.Errorf("state %s", st)
	}
	var nilB *Breakers
	if _, ok := nilB.Allow("a"); !ok {
		t.Error("nil Breakers refused")
	}
}
