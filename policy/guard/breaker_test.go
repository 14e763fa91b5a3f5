package guard

import (
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Breaker tests use short real durations: gobreaker reads time.Now itself. Waits are
// bounded polls, never timing assertions.

func breakerParams() Params {
	return Params{
		MaxDepth: 2,
		Breaker: BreakerParams{Window: policy.Duration(10 * time.Second), MinRequests: 2, FailureRatio: 0.5,
			OpenFor: policy.Duration(200 * time.Millisecond), HalfOpenProbes: 2},
	}
}

func deep(t testing.TB, tenant string) *policy.Request { return chat(t, tenant, 0, nested(5)) }

// poll calls f until it returns true, for at most 5 s.
func poll(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if f() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func breakerOf(g *Guard, tenant string) BreakerInfo {
	for _, b := range g.Snapshot().Breakers {
		if b.Tenant == tenant {
			return b
		}
	}
	return BreakerInfo{}
}

func TestBreakerIsolatesTenant(t *testing.T) {
	g := newGuard(t, breakerParams(), newClock())
	// Tenant a explodes twice: its breaker opens.
	for range 2 {
		wantReject(t, admit(t, g, deep(t, "a")), 400, CodePromptTooDeep)
	}
	if st := breakerOf(g, "a").State; st != "open" {
		t.Fatalf("a's breaker is %s, want open", st)
	}
	// a's normal requests get 503 with Retry-After; b is untouched.
	d := admit(t, g, chat(t, "a", 0, "hello"))
	wantReject(t, d, 503, CodeBreakerOpen, "open")
	if d.Reject.RetryAfter <= 0 || d.Reject.RetryAfter > 200*time.Millisecond {
		t.Fatalf("Retry-After %s, want in (0, 200ms]", d.Reject.RetryAfter)
	}
	for range 5 {
		admitOK(t, g, chat(t, "b", 0, "hello"), ok200)
	}
	snap := g.Snapshot()
	if len(snap.Breakers) != 2 || snap.Breakers[0].Tenant != "a" || snap.Breakers[1].State != "closed" ||
		snap.Breakers[0].Trips != 1 || snap.Breakers[0].OpenedAt.IsZero() || snap.Breakers[0].RetryAfter <= 0 || snap.Route != "chat" {
		t.Fatalf("snapshot %+v", snap)
	}
	if s := g.Stats(); s.Rejected[CodeBreakerOpen] != 1 || s.Trips != 1 {
		t.Fatalf("stats %+v", s)
	}

	// After the open period: half-open lets two probes through, not a third.
	var probe1 policy.Decision
	poll(t, "a's breaker to let a probe through", func() bool {
		probe1 = admit(t, g, chat(t, "a", 0, "hello"))
		return probe1.Reject == nil
	})
	probe2 := admit(t, g, chat(t, "a", 0, "hello"))
	if probe2.Reject != nil {
		t.Fatalf("second probe rejected: %v", probe2.Reject)
	}
	wantReject(t, admit(t, g, chat(t, "a", 0, "hello")), 503, CodeBreakerOpen, "half-open")
	// Both probes succeed: it closes by itself.
	probe1.Done(ok200)
	probe2.Done(ok200)
	if st := breakerOf(g, "a").State; st != "closed" {
		t.Fatalf("a's breaker is %s after successful probes, want closed", st)
	}
	admitOK(t, g, chat(t, "a", 0, "hello"), ok200)
}

func TestBreakerHalfOpenExplosionReopens(t *testing.T) {
	g := newGuard(t, breakerParams(), newClock())
	for range 2 {
		admit(t, g, deep(t, "a"))
	}
	poll(t, "half-open", func() bool { return breakerOf(g, "a").State == "half-open" })
	wantReject(t, admit(t, g, deep(t, "a")), 400, CodePromptTooDeep)
	if st := breakerOf(g, "a").State; st != "open" {
		t.Fatalf("state %s after an explosion while half-open, want open", st)
	}
	if tr := breakerOf(g, "a").Trips; tr != 2 {
		t.Fatalf("trips %d, want 2", tr)
	}
}

func TestBreakerExcludedOutcomes(t *testing.T) {
	g := newGuard(t, breakerParams(), newClock())
	wantReject(t, admit(t, g, deep(t, "a")), 400, CodePromptTooDeep)
	for _, o := range []policy.Outcome{
		{Status: 499, ErrorClass: "client_cancel"},
		{Status: 400, ErrorClass: "upstream_4xx"},
		{Status: 502, ErrorClass: "upstream_5xx"},
		{Status: 504, ErrorClass: "ttft_timeout"},
		{Status: 200, ErrorClass: "stream_cut"},
	} {
		admitOK(t, g, chat(t, "a", 0, "hi"), o)
	}
	b := breakerOf(g, "a")
	if b.State != "closed" || b.Failures != 1 || b.Successes != 0 || b.Excluded != 5 {
		t.Fatalf("breaker %+v, want closed with 1 failure, 5 excluded", b)
	}
	// One success and one more explosion: 2 counted, half failures: it trips.
	admitOK(t, g, chat(t, "a", 0, "hi"), ok200)
	if st := breakerOf(g, "a").State; st != "closed" {
		t.Fatalf("state %s", st)
	}
	admit(t, g, deep(t, "a"))
	if st := breakerOf(g, "a").State; st != "open" {
		t.Fatalf("state %s, want open", st)
	}
}

func TestBreakerResetAndBound(t *testing.T) {
	p := breakerParams()
	p.Breaker.MaxBreakers = 3
	p.Breaker.OpenFor = policy.Duration(time.Hour)
	clk := newClock()
	g := newGuard(t, p, clk)
	for range 2 {
		admit(t, g, deep(t, "a"))
		admit(t, g, deep(t, "b"))
	}
	if breakerOf(g, "a").State != "open" || breakerOf(g, "b").State != "open" {
		t.Fatal("breakers not open")
	}
	// Full set: the least recently used closed breaker goes, open ones stay.
	for _, tenant := range []string{"c", "d", "e"} {
		clk.Advance(time.Second)
		admitOK(t, g, chat(t, tenant, 0, "hi"), ok200)
	}
	snap := g.Snapshot()
	if len(snap.Breakers) != 3 || breakerOf(g, "a").State != "open" || breakerOf(g, "b").State != "open" || breakerOf(g, "e").Tenant != "e" {
		t.Fatalf("after eviction: %+v", snap.Breakers)
	}
	if n := g.ResetTenant("a"); n != 1 {
		t.Fatalf("Reset(a) dropped %d", n)
	}
	admitOK(t, g, chat(t, "a", 0, "hi"), ok200)
	wantReject(t, admit(t, g, chat(t, "b", 0, "hi")), 503, CodeBreakerOpen)
	if n := g.ResetTenant(""); n != 3 {
		t.Fatalf("Reset(all) dropped %d", n)
	}
	admitOK(t, g, chat(t, "b", 0, "hi"), ok200)
}

func TestBreakerDisabled(t *testing.T) {
	p := breakerParams()
	p.Disable = []string{SignalBreaker}
	g := newGuard(t, p, newClock())
	for range 10 {
		admit(t, g, deep(t, "a"))
	}
	admitOK(t, g, chat(t, "a", 0, "hi"), ok200)
	if n := len(g.Snapshot().Breakers); n != 0 {
		t.Fatalf("%d breakers with breakers disabled", n)
	}
}

// TestBreakerAnonymous is the scenario and the modes of breaker.anonymous: client A
// sends five too-deep prompts (the default breaker trips at 5 with half of them explosions),
// then A and an unrelated client B each send a normal one. Behind a load balancer or a mesh
// sidecar every client has the same peer address: keyed by it, A's breaker cut B off too.
func TestBreakerAnonymous(t *testing.T) {
	type who struct {
		tenant, client string
		known          bool
	}
	lbA, lbB := who{"", "10.0.0.1", false}, who{"", "10.0.0.1", false} // one peer address, ClientKnown false
	knownA, knownB := who{"", "203.0.113.1", true}, who{"", "203.0.113.2", true}
	directA, directB := who{"", "203.0.113.1", false}, who{"", "203.0.113.2", false}
	tests := []struct {
		name       string
		mode       string
		a, b       who
		aCut, bCut bool // gets 503 tenant_breaker_open afterwards
	}{
		{"behind a load balancer: no breaker", "", lbA, lbB, false, false},
		{"known clients: each its own", "", knownA, knownB, true, false},
		{"auto: unknown clients get none", AnonymousAuto, directA, directB, false, false},
		{"client: direct clients each their own", AnonymousClient, directA, directB, true, false},
		{"client: behind a load balancer, the operator's choice", AnonymousClient, lbA, lbB, true, true},
		{"off: known clients get none", AnonymousOff, knownA, knownB, false, false},
		{"off: tenants keep theirs", AnonymousOff, who{"team-a", "10.0.0.1", false}, who{"team-b", "10.0.0.1", false}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuard(t, Params{Breaker: BreakerParams{Anonymous: tt.mode}}, newClock())
			send := func(w who, r *policy.Request) policy.Decision {
				return admit(t, g, from(r, w.tenant, w.client, w.known))
			}
			for range 5 {
				wantReject(t, send(tt.a, chat(t, "", 0, nested(65))), 400, CodePromptTooDeep)
			}
			for _, c := range []struct {
				w   who
				cut bool
			}{{tt.b, tt.bCut}, {tt.a, tt.aCut}} {
				d := send(c.w, chat(t, "", 0, "hello"))
				if c.cut {
					wantReject(t, d, 503, CodeBreakerOpen)
					continue
				}
				if d.Reject != nil {
					t.Fatalf("%+v: rejected %v", c.w, d.Reject)
				}
				d.Done(ok200)
			}
			// Without a breaker each bad request is still refused, on its own.
			if !tt.aCut {
				wantReject(t, send(tt.a, chat(t, "", 0, nested(65))), 400, CodePromptTooDeep)
			}
			if n := len(g.Snapshot().Breakers); (n > 0) != (tt.aCut || tt.bCut) {
				t.Errorf("%d breakers", n)
			}
		})
	}
}

// TestBreakerCountsRunaways: an answer that fell into a loop, cut (ErrorClass) or only
// flagged (Flags), counts against the tenant's breaker as an explosion does, and feeds no
// baseline; other flags do not.
func TestBreakerCountsRunaways(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    policy.Outcome
		trip bool
	}{
		{"cut", policy.Outcome{Status: 200, ErrorClass: policy.ClassRunaway}, true},
		{"flagged", policy.Outcome{Status: 200, Flags: []policy.Class{policy.ClassRunaway}}, true},
		{"flagged among others", policy.Outcome{Status: 200, Flags: []policy.Class{"low_confidence", policy.ClassRunaway}}, true},
		{"another flag", policy.Outcome{Status: 200, Flags: []policy.Class{"low_confidence"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, breakerParams(), newClock())
			admitOK(t, g, chat(t, "a", 0, "hello"), tc.o)
			if b := breakerOf(g, "a"); tc.trip && (b.State != "closed" || b.Failures != 1 || b.Successes != 0) {
				t.Fatalf("breaker %+v after one runaway answer, want closed with 1 failure", b)
			}
			admitOK(t, g, chat(t, "a", 0, "hello"), tc.o)
			b := breakerOf(g, "a")
			if tc.trip {
				if b.State != "open" || b.Trips != 1 {
					t.Fatalf("breaker %+v after two runaway answers, want open", b)
				}
				wantReject(t, admit(t, g, chat(t, "a", 0, "hello")), 503, CodeBreakerOpen, "open")
				if s := g.Stats(); s.Runaways != 2 || s.Trips != 1 {
					t.Fatalf("stats %+v", s)
				}
				if _, n := baselineOf(g, "a", g.clock.Now()); n != 0 {
					t.Fatalf("a runaway answer fed the baseline: %d prompts", n)
				}
			} else if b.State != "closed" || b.Failures != 0 || b.Successes != 2 {
				t.Fatalf("breaker %+v, want closed with 2 successes", b)
			}
			// Another tenant is untouched.
			admitOK(t, g, chat(t, "b", 0, "hello"), ok200)
		})
	}
}
