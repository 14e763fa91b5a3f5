package guard

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// from sets who sends r: tenant ("" anonymous), client address, whether it names one client.
func from(r *policy.Request, tenant, client string, known bool) *policy.Request {
	r.Tenant, r.Client, r.ClientKnown = tenant, client, known
	return r
}

// TestSurgePoisoning is the scenario: 120 "hi" prompts from one sender, then a
// 356-token prompt from another, with the default params (also those of `sluice serve
// --upstream`). The second sender was refused (413 prompt_surge, limit 27 tokens) for the
// surge window, by a baseline anyone could drag down.
func TestSurgePoisoning(t *testing.T) {
	tests := []struct {
		name             string
		flooder, other   [2]string // tenant, client
		flooderK, otherK bool      // ClientKnown
		sameBaseline     bool      // the two share a baseline (then the floor protects it)
	}{
		{name: "anonymous behind a load balancer", flooder: [2]string{"", "10.0.0.1"}, other: [2]string{"", "10.0.0.1"}, sameBaseline: true},
		{name: "anonymous, known clients", flooder: [2]string{"", "203.0.113.1"}, other: [2]string{"", "203.0.113.2"}, flooderK: true, otherK: true},
		{name: "two tenants", flooder: [2]string{"team-a", "10.0.0.1"}, other: [2]string{"team-b", "10.0.0.1"}},
		{name: "a tenant and an anonymous client", flooder: [2]string{"team-a", "10.0.0.1"}, other: [2]string{"", "10.0.0.1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			g, err := Default(policy.Env{Route: "chat", Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			for range 120 {
				admitOK(t, g, from(chat(t, "", 0, "hi"), tt.flooder[0], tt.flooder[1], tt.flooderK), ok200)
				clk.Advance(100 * time.Millisecond)
			}
			r := from(chat(t, "", 0, prose(268)), tt.other[0], tt.other[1], tt.otherK)
			if r.PromptTokens < 330 || r.PromptTokens > 390 {
				t.Fatalf("the prompt is %d tokens, want about 356", r.PromptTokens)
			}
			admitOK(t, g, r, ok200)
			// Its own baseline: the flooder's when they share one (the floor holds the limit
			// up), else one the flood never touched.
			flooder := senderOf(from(&policy.Request{}, tt.flooder[0], tt.flooder[1], tt.flooderK))
			other := senderOf(r)
			if (flooder == other) != tt.sameBaseline {
				t.Fatalf("flooder %+v, other %+v: shared %v, want %v", flooder, other, flooder == other, tt.sameBaseline)
			}
			// And again for the whole window.
			for range 10 {
				clk.Advance(30 * time.Second)
				admitOK(t, g, from(chat(t, "", 0, prose(268)), tt.other[0], tt.other[1], tt.otherK), ok200)
			}
		})
	}
}

// TestSurgePerSender: each tenant, and each known client, is measured against its own
// baseline; anonymous clients that cannot be told apart share one.
func TestSurgePerSender(t *testing.T) {
	type sender struct {
		tenant, client string
		known          bool
	}
	a, b := sender{"team-a", "10.0.0.1", false}, sender{"team-b", "10.0.0.1", false}
	c1, c2 := sender{"", "203.0.113.1", true}, sender{"", "203.0.113.2", true}
	lb1, lb2 := sender{"", "10.0.0.9", false}, sender{"", "10.0.0.9", false}
	tests := []struct {
		name      string
		fed, sent sender
		reject    bool
	}{
		{"the tenant itself", a, a, true},
		{"another tenant", a, b, false},
		{"the known client itself", c1, c1, true},
		{"another known client", c1, c2, false},
		{"a tenant's baseline is not a client's", a, c1, false},
		{"a client's baseline is not the shared one", c1, lb1, false},
		{"anonymous clients behind one address share one", lb1, lb2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			g := newGuard(t, Params{SurgeMinRequests: 20, SurgeFloorTokens: 1, Disable: []string{SignalBreaker}}, clk)
			for range 20 {
				admitOK(t, g, from(chat(t, "", 0, prose(100)), tt.fed.tenant, tt.fed.client, tt.fed.known), ok200)
			}
			d := admit(t, g, from(chat(t, "", 0, prose(2000)), tt.sent.tenant, tt.sent.client, tt.sent.known))
			if !tt.reject {
				if d.Reject != nil {
					t.Fatalf("rejected: %v", d.Reject)
				}
				return
			}
			who := map[bool]string{true: "this tenant's", false: "this client's"}[tt.sent.tenant != ""]
			if !tt.sent.known && tt.sent.tenant == "" {
				who = "anonymous clients'"
			}
			wantReject(t, d, 413, CodeSurge, who+" recent prompts")
		})
	}
}

// TestSurgeFloor: a prompt of surge_floor_tokens or fewer is never a surge, however small
// the baseline's prompts; above the floor the signal still applies.
func TestSurgeFloor(t *testing.T) {
	tests := []struct {
		name   string
		floor  int // 0: the default
		tokens int // the prompt's, about
		reject bool
	}{
		{"below the floor", 1000, 800, false},
		{"above the floor", 1000, 1400, true},
		{"default: a RAG-sized prompt", 0, 12000, false},
		{"default: an agent-sized prompt", 0, 30000, false},
		{"default: past the floor", 0, 40000, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			g := newGuard(t, Params{SurgeFloorTokens: tt.floor}, clk)
			floor := g.Params().SurgeFloorTokens
			for range 200 {
				admitOK(t, g, chat(t, "a", 0, "hi"), ok200) // p95 about 9 tokens: 3× is 27
			}
			r := chat(t, "a", 0, prose(tt.tokens))
			d := admit(t, g, r)
			if !tt.reject {
				if d.Reject != nil {
					t.Fatalf("%d tokens rejected: %v", r.PromptTokens, d.Reject)
				}
				return
			}
			wantReject(t, d, 413, CodeSurge, fmt.Sprintf("the surge limit is %d", floor), fmt.Sprintf("never below %d", floor))
		})
	}
}

// TestSurgeBaselinesBounded: the baselines are bounded whatever clients send: at most
// surge_max_baselines (the least recently used dropped, its sender warming up again), and
// none for requests that did not succeed.
func TestSurgeBaselinesBounded(t *testing.T) {
	clk := newClock()
	g := newGuard(t, Params{SurgeMaxBaselines: 3, SurgeMinRequests: 5, SurgeFloorTokens: 1}, clk)
	client := func(i int) *policy.Request {
		return from(chat(t, "", 0, prose(100)), "", fmt.Sprintf("203.0.113.%d", i), true)
	}
	for i := range 10 {
		for range 5 {
			admitOK(t, g, client(i), ok200)
		}
		clk.Advance(time.Second)
	}
	if n := len(g.bases); n != 3 {
		t.Fatalf("%d baselines, want 3", n)
	}
	for i := range 10 {
		_, n := baselineOf(g, fmt.Sprintf("client:203.0.113.%d", i), clk.Now())
		if want := map[bool]int{true: 5, false: 0}[i >= 7]; n != want {
			t.Errorf("client %d: baseline of %d prompts, want %d (the 3 most recent kept)", i, n, want)
		}
	}
	// Requests that are refused, fail or are cancelled create none.
	for i := 100; i < 120; i++ {
		wantReject(t, admit(t, g, from(chat(t, "", 0, nested(100)), "", fmt.Sprintf("198.51.100.%d", i), true)), 400, CodePromptTooDeep)
		admitOK(t, g, from(chat(t, "", 0, "x"), "", fmt.Sprintf("192.0.2.%d", i), true), policy.Outcome{Status: 502, ErrorClass: "upstream_5xx"})
	}
	if n := len(g.bases); n != 3 {
		t.Fatalf("%d baselines after refused and failed requests, want 3", n)
	}

	// The default bound.
	g = newGuard(t, Params{}, clk)
	for i := range 1500 {
		admitOK(t, g, from(chat(t, "", 0, "hi"), "", fmt.Sprintf("10.%d.%d.1", i/256, i%256), true), ok200)
	}
	if n := len(g.bases); n != 1000 {
		t.Fatalf("%d baselines, want the default bound of 1000", n)
	}
}

// TestSurgeTicketAfterEviction: the settle of an admission feeds the baseline the admission
// found, unless that baseline was dropped meanwhile (the set full): then the sender's
// baseline is looked up again (made anew), not the dropped one fed where nothing reads it.
func TestSurgeTicketAfterEviction(t *testing.T) {
	clk := newClock()
	g := newGuard(t, Params{SurgeMaxBaselines: 1, SurgeMinRequests: 5, SurgeFloorTokens: 1}, clk)
	a := func() *policy.Request { return from(chat(t, "", 0, prose(100)), "", "203.0.113.1", true) }
	b := from(chat(t, "", 0, prose(100)), "", "203.0.113.2", true)
	admitOK(t, g, a(), ok200) // a's baseline, one prompt
	clk.Advance(time.Second)
	held := admit(t, g, a()) // finds a's baseline
	clk.Advance(time.Second)
	admitOK(t, g, b, ok200) // the set holds one: a's is dropped for b's
	if _, n := baselineOf(g, "client:203.0.113.1", clk.Now()); n != 0 {
		t.Fatalf("a's baseline still there with %d prompts", n)
	}
	held.Done(ok200)
	if _, n := baselineOf(g, "client:203.0.113.1", clk.Now()); n != 1 {
		t.Errorf("a's baseline after the held admission settled: %d prompts, want 1 (made anew)", n)
	}
	// Without an eviction, the settle feeds the baseline the admission found.
	held = admit(t, g, a())
	held.Done(ok200)
	if _, n := baselineOf(g, "client:203.0.113.1", clk.Now()); n != 2 {
		t.Errorf("a's baseline: %d prompts, want 2", n)
	}
}
