package guard

import (
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

func TestDegradeLevel1(t *testing.T) {
	clk := newClock()
	p := breakerParams()
	p.Breaker.OpenFor = policy.Duration(time.Hour)
	p.MaxPromptTokens = 2000
	p.Degrade = DegradeParams{TripsPerMinute: 1, Level1MaxTokens: 512, LongContextCluster: "long-ctx",
		CoolDown: policy.Duration(2 * time.Minute)}
	g := newGuard(t, p, clk)
	huge := chat(t, "c", 100, prose(8000)) // far over 2000 tokens
	wantReject(t, admit(t, g, huge), 413, CodePromptTooLarge)
	d := admit(t, g, chat(t, "c", 4000, "hi"))
	if d.Reject != nil || d.CapMaxTokens != 0 || d.Reroute != "" {
		t.Fatalf("level 0 decision %+v", d)
	}
	d.Done(ok200)

	// Two breakers trip within a minute: more than 1 → level 1.
	for _, tenant := range []string{"a", "b"} {
		for range 2 {
			admit(t, g, deep(t, tenant))
		}
	}
	if l := g.Level(); l != 1 {
		t.Fatalf("level %d after 2 trips, want 1", l)
	}
	// Level 1: max_tokens capped (also when absent), oversized prompts rerouted.
	for _, mt := range []int{4000, 0} {
		d = admit(t, g, chat(t, "c", mt, "hi"))
		if d.Reject != nil || d.CapMaxTokens != 512 || d.Reroute != "" {
			t.Fatalf("level 1 decision for max_tokens %d: %+v", mt, d)
		}
		d.Done(ok200)
	}
	d = admit(t, g, chat(t, "c", 100, "hi"))
	if d.CapMaxTokens != 0 {
		t.Fatalf("max_tokens below the cap was capped: %+v", d)
	}
	d.Done(ok200)
	d = admit(t, g, huge)
	if d.Reject != nil || d.Reroute != "long-ctx" {
		t.Fatalf("oversized prompt at level 1: %+v", d)
	}
	d.Done(ok200)
	// Shape signals still reject; the rerouted prompt counted as an explosion for c.
	wantReject(t, admit(t, g, deep(t, "d")), 400, CodePromptTooDeep)
	if s := g.Stats(); s.Rerouted != 1 || s.Capped != 2 {
		t.Fatalf("stats %+v", s)
	}
	if b := breakerOf(g, "c"); b.Failures != 2 { // the first rejection and the reroute
		t.Fatalf("c's breaker %+v, want the reroute counted as a failure", b)
	}

	// Hysteresis: the trips leave the minute, the level holds for cool_down, then drops.
	clk.Advance(61 * time.Second)
	if l := g.Level(); l != 1 {
		t.Fatalf("level %d right after the trips expired, want 1", l)
	}
	clk.Advance(time.Minute)
	if l := g.Level(); l != 1 {
		t.Fatalf("level %d 1m into the cool-down, want 1", l)
	}
	clk.Advance(time.Minute + time.Second)
	if l := g.Level(); l != 0 {
		t.Fatalf("level %d after the cool-down, want 0", l)
	}
	wantReject(t, admit(t, g, huge), 413, CodePromptTooLarge)
}

func TestDegradeLevel1SurgeFactor(t *testing.T) {
	clk := newClock()
	p := Params{SurgeMinRequests: 10, SurgeFloorTokens: 1, MaxDepth: 2,
		Breaker: BreakerParams{MinRequests: 1, OpenFor: policy.Duration(time.Hour)},
		Degrade: DegradeParams{TripsPerMinute: 1, Level1SurgeFactor: 1.5}}
	g := newGuard(t, p, clk)
	feed(t, g, 10, 300, ok200)
	p95, _ := baselineOf(g, "feeder", clk.Now())
	mid := chat(t, "feeder", 0, prose(750)) // about 2 × p95 (exact): under 3×, over 1.5×
	if e := exactOf(t, mid); e < 3*p95/2+10 || e > 3*p95-10 {
		t.Fatalf("mid prompt %d tokens, p95 %d", e, p95)
	}
	admitOK(t, g, mid, policy.Outcome{Status: 400})
	admit(t, g, deep(t, "a"))
	admit(t, g, deep(t, "b"))
	if l := g.Level(); l != 1 {
		t.Fatalf("level %d", l)
	}
	wantReject(t, admit(t, g, mid), 413, CodeSurge, "1.5 ×")
}

func TestDegradeLevel2Shedding(t *testing.T) {
	clk := newClock()
	p := Params{Degrade: DegradeParams{SaturationInflight: 2, ShedBelowPriority: 1, CoolDown: policy.Duration(time.Minute)}}
	g := newGuard(t, p, clk)
	g.SetPriorities(map[string]int{"gold": 5})
	var held []policy.Decision
	for range 3 {
		d := admit(t, g, chat(t, "free", 0, "hi"))
		if d.Reject != nil {
			t.Fatalf("rejected before saturation: %v", d.Reject)
		}
		held = append(held, d)
	}
	if l := g.Level(); l != 2 {
		t.Fatalf("level %d with 3 in flight over 2, want 2", l)
	}
	// The lowest priority is shed first; gold passes.
	wantReject(t, admit(t, g, chat(t, "free", 0, "hi")), 503, CodeLoadShed, "priority below 1", "priority is 0")
	wantReject(t, admit(t, g, chat(t, "", 0, "hi")), 503, CodeLoadShed)
	gold := admit(t, g, chat(t, "gold", 0, "hi"))
	if gold.Reject != nil {
		t.Fatalf("gold shed: %v", gold.Reject)
	}
	gold.Done(ok200)
	if b := breakerOf(g, "free"); b.Failures != 0 {
		t.Fatalf("shedding counted as an explosion: %+v", b)
	}
	// Load goes away: level 2 holds for cool_down, then steps to 1, then 0.
	for _, d := range held {
		d.Done(ok200)
	}
	if l := g.Level(); l != 2 {
		t.Fatalf("level %d right after the load went, want 2", l)
	}
	clk.Advance(time.Minute)
	if l := g.Level(); l != 1 {
		t.Fatalf("level %d after one cool-down, want 1", l)
	}
	clk.Advance(30 * time.Second)
	if l := g.Level(); l != 1 {
		t.Fatalf("level %d half-way through the second cool-down, want 1", l)
	}
	admitOK(t, g, chat(t, "free", 0, "hi"), ok200) // level 1: not shed
	clk.Advance(30 * time.Second)
	if l := g.Level(); l != 0 {
		t.Fatalf("level %d after two cool-downs, want 0", l)
	}
	if s := g.Stats(); s.Rejected[CodeLoadShed] != 2 || s.InFlight != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestLevelWithoutDegrade(t *testing.T) {
	g := newGuard(t, Params{}, newClock())
	var held []policy.Decision
	for range 100 {
		held = append(held, admit(t, g, chat(t, "a", 0, "hi")))
	}
	if l := g.Level(); l != 0 {
		t.Fatalf("level %d without degrade config", l)
	}
	for _, d := range held {
		d.Done(ok200)
	}
}
