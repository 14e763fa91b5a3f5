package guard

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// The corpora (testdata/ordinary, testdata/explosions): one request body a file, its kind in
// its name (*.chat.json, *.responses.json).
//
// ordinary: what agents and people send: tool results that are real-looking API responses
// (Kubernetes objects and lists, GitHub issues, an OpenAPI document, AWS, Stripe, GraphQL
// introspection, Elasticsearch, Terraform plans, an AWS event with JSON text in JSON text, a
// Babel AST), code in several languages, pasted JSON, markdown, logs, math, RAG context,
// images, long multi-turn agent conversations with tool calls; chat and Responses bodies.
//
// explosions: nesting built to blow up templates and parsers: deep JSON in prose, in fences,
// in tool-call arguments and tool results, as the whole content, in JSON text in JSON text,
// bracket bombs (closed, unclosed, broken), repeated nested structures, one deep message in
// an ordinary conversation; chat and Responses bodies.

type corpusRequest struct {
	name string
	kind openai.Kind
	body []byte
}

func loadCorpus(t testing.TB, dir string) []corpusRequest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []corpusRequest
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c := corpusRequest{name: filepath.Base(f), body: b}
		switch {
		case strings.HasSuffix(f, ".chat.json"):
			c.kind = openai.KindChat
		case strings.HasSuffix(f, ".responses.json"):
			c.kind = openai.KindResponses
		default:
			t.Fatalf("%s: kind not in the name", f)
		}
		out = append(out, c)
	}
	return out
}

// req parses c as sent by tenant ("" anonymous) from client (ClientKnown when known).
func (c corpusRequest) req(t testing.TB, tenant, client string, known bool) *policy.Request {
	t.Helper()
	r := request(t, c.kind, tenant, string(c.body))
	r.Client, r.ClientKnown = client, known
	return r
}

// senders are the kinds of sender a route sees: tenants, a known anonymous client, and the
// anonymous clients behind one load balancer.
var senders = []struct {
	tenant, client string
	known          bool
}{
	{"agents", "10.0.0.1", false}, {"chat", "10.0.0.1", false},
	{"", "203.0.113.7", true}, {"", "10.0.0.1", false},
}

// warmUp runs realistic traffic through g for each sender, 6 minutes of it (more than the
// surge window, so that every baseline is warm and full): the ordinary corpus in turn, and
// short chat turns (the most common request, which pulls a baseline's p95 down).
func warmUp(t *testing.T, g *Guard, clk *fakeClock, ordinary []corpusRequest) {
	t.Helper()
	short := []string{"hi", "thanks!", "What's the capital of Australia?", "Rewrite this sentence to sound friendlier: send me the report.",
		"explain kubernetes readiness probes in two sentences", prose(150)}
	for i := range 360 {
		for _, s := range senders {
			var r *policy.Request
			if i%3 == 0 {
				r = ordinary[(i/3)%len(ordinary)].req(t, s.tenant, s.client, s.known)
			} else {
				r = chat(t, s.tenant, 256, short[i%len(short)])
				r.Client, r.ClientKnown = s.client, s.known
			}
			admitOK(t, g, r, ok200)
		}
		clk.Advance(time.Second)
	}
	for _, s := range senders {
		k := baseKey{"chat", senderOf(&policy.Request{Tenant: s.tenant, Client: s.client, ClientKnown: s.known})}
		if b := g.baseline(k, clk.Now(), false); b == nil {
			t.Fatalf("%+v has no baseline after the warm-up", k)
		} else if _, n := b.p95(clk.Now()); n < g.p.SurgeMinRequests {
			t.Fatalf("%+v's baseline holds %d prompts after the warm-up: surge is not on", k, n)
		}
	}
}

// TestOrdinaryCorpus: the default guard refuses none of the ordinary corpus, fresh and after
// a realistic warm-up (surge on for every sender).
func TestOrdinaryCorpus(t *testing.T) {
	ordinary := loadCorpus(t, "ordinary")
	if len(ordinary) < 30 {
		t.Fatalf("%d ordinary requests, want at least 30", len(ordinary))
	}
	responses, deepest := 0, 0
	for _, c := range ordinary {
		if c.kind == openai.KindResponses {
			responses++
		}
		deepest = max(deepest, c.req(t, "a", "", false).Depth)
	}
	if responses < 3 {
		t.Fatalf("%d Responses bodies, want some", responses)
	}
	t.Logf("%d requests, the deepest %d", len(ordinary), deepest)

	clk := newClock()
	g, err := Default(policy.Env{Route: "chat", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		for _, c := range ordinary {
			for _, s := range senders {
				d := admit(t, g, c.req(t, s.tenant, s.client, s.known))
				if d.Reject != nil {
					t.Errorf("%s: %s from %+v: %d %s: %s", when, c.name, s, d.Reject.Status, d.Reject.Code, d.Reject.Message)
					continue
				}
				d.Done(ok200)
			}
		}
	}
	check("fresh")
	warmUp(t, g, clk, ordinary)
	check("after the warm-up")
}

// TestExplosionCorpus: the default guard refuses every explosion as too deep, fresh and after
// a warm-up, whoever sends it.
func TestExplosionCorpus(t *testing.T) {
	explosions := loadCorpus(t, "explosions")
	if len(explosions) < 15 {
		t.Fatalf("%d explosions, want at least 15", len(explosions))
	}
	clk := newClock()
	g, err := Default(policy.Env{Route: "chat", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		for i, c := range explosions {
			for _, s := range senders {
				// One explosion each sender that has a breaker: to see the signal, not the breaker.
				tenant, client := s.tenant, s.client
				if tenant != "" {
					tenant = fmt.Sprintf("%s-%d", tenant, i)
				} else if s.known {
					client = fmt.Sprintf("198.51.100.%d", i)
				}
				r := c.req(t, tenant, client, s.known)
				d := admit(t, g, r)
				if d.Reject == nil {
					d.Done(ok200)
					t.Errorf("%s: %s (depth %d) from %+v admitted", when, c.name, r.Depth, s)
					continue
				}
				if d.Reject.Class != CodePromptTooDeep || !strings.Contains(d.Reject.Message, fmt.Sprintf("nested %d levels deep, the route's limit is 64", r.Depth)) {
					t.Errorf("%s: %s from %+v: %d %s: %s", when, c.name, s, d.Reject.Status, d.Reject.Code, d.Reject.Message)
				}
			}
		}
	}
	check("fresh")
	warmUp(t, g, clk, loadCorpus(t, "ordinary"))
	check("after the warm-up")
}
