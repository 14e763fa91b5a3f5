package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/guard"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/ratelimit"
)

// BenchmarkGuardAndRateLimit measures what the admission chain of a route adds to one
// request on the estimator path, in the gateway's order: ratelimit.Admit, guard.Admit, then
// their Decision.Done with the request's Outcome. Both are built through policy.Build as the
// gateway builds them: the guard with its defaults (depth 64, surge 3 × p95 after 100
// prompts, the model's known context window, breakers), the limiter with requests and tokens
// per minute far above what the loop spends. The body is parsed once, outside the loop.
//
//	go test -run '^$' -bench GuardAndRateLimit -benchmem ./policy/
//
// The targets: under 10 µs for a 1,000-token prompt, under 100 µs for 32,000.
func BenchmarkGuardAndRateLimit(b *testing.B) {
	for _, tokens := range []int{1000, 32000} {
		name := fmt.Sprintf("prompt=%dk", tokens/1000)
		b.Run(name, func(b *testing.B) {
			c := newChain(b, tokens)
			r := c.request("tenant-a")
			ctx := context.Background()
			c.warm(ctx, r)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				c.once(ctx, b, r)
			}
			b.StopTimer()
			c.check(b)
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			c := newChain(b, tokens)
			ctx := context.Background()
			c.warm(ctx, c.request("tenant-a"))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// One policy.Request per goroutine (the guard tracks admitted requests by
				// pointer), all of one tenant: the worst case for shared buckets and breakers.
				r := c.request("tenant-a")
				for pb.Next() {
					c.once(ctx, b, r)
				}
			})
			b.StopTimer()
			c.check(b)
		})
	}
}

type chain struct {
	rl     policy.Admitter
	g      policy.Admitter
	parsed *openai.Request
	out    policy.Outcome
}

func newChain(b *testing.B, tokens int) *chain {
	b.Helper()
	env := policy.Env{Route: "chat"}
	rl, err := policy.Build(policy.Spec{Type: "ratelimit", Params: map[string]any{
		"requests_per_minute": 1e12, "tokens_per_minute": 1e15,
	}}, env)
	if err != nil {
		b.Fatal(err)
	}
	g, err := policy.Build(policy.Spec{Type: "guard"}, env)
	if err != nil {
		b.Fatal(err)
	}
	body := chatBody(b, tokens)
	req, err := openai.ParseRequest(openai.KindChat, body)
	if err != nil {
		b.Fatal(err)
	}
	if req.PromptTokens < tokens || req.PromptTokens > tokens*11/10 {
		b.Fatalf("prompt estimate %d, want about %d", req.PromptTokens, tokens)
	}
	return &chain{
		rl: rl.(policy.Admitter), g: g.(policy.Admitter), parsed: req,
		out: policy.Outcome{Status: 200, InputTokens: req.PromptTokens, OutputTokens: 180},
	}
}

func (c *chain) request(tenant string) *policy.Request {
	return &policy.Request{Request: c.parsed, Route: "chat", Tenant: tenant, ID: "bench"}
}

// once is one request through the chain, as proxy/handler.go runs it.
func (c *chain) once(ctx context.Context, b *testing.B, r *policy.Request) {
	d1, err := c.rl.Admit(ctx, r)
	if err != nil || d1.Reject != nil {
		b.Fatalf("ratelimit rejected: %v %v", err, d1.Reject)
	}
	d2, err := c.g.Admit(ctx, r)
	if err != nil || d2.Reject != nil {
		b.Fatalf("guard rejected: %v %v", err, d2.Reject)
	}
	d1.Done(c.out)
	d2.Done(c.out)
}

// warm fills the guard's surge baseline past its warm-up, so that the surge signal (and its
// p95) is on in the loop, as on a route that has served for a while.
func (c *chain) warm(ctx context.Context, r *policy.Request) {
	for range 200 {
		d1, _ := c.rl.Admit(ctx, r)
		d2, _ := c.g.Admit(ctx, r)
		if d1.Done != nil {
			d1.Done(c.out)
		}
		if d2.Done != nil {
			d2.Done(c.out)
		}
	}
}

func (c *chain) check(b *testing.B) {
	b.Helper()
	b.ReportMetric(float64(c.parsed.PromptTokens), "prompt-tokens")
	gs := c.g.(*guard.Guard).Stats()
	if gs.ExactCounts != 0 {
		b.Fatalf("%d exact counts: not the estimator path", gs.ExactCounts)
	}
	if gs.InFlight != 0 {
		b.Fatalf("guard: %d requests still in flight after settling", gs.InFlight)
	}
	for code, n := range gs.Rejected {
		if n != 0 {
			b.Fatalf("guard rejected %d requests with %s", n, code)
		}
	}
	ls := c.rl.(*ratelimit.Limiter).Stats()
	for reason, n := range ls.Rejected {
		if n != 0 {
			b.Fatalf("ratelimit rejected %d requests (%s)", n, reason)
		}
	}
}

// chatBody builds a realistic chat request of about tokens prompt tokens (the gateway's
// estimate): a system prompt, a tool declaration, alternating user and assistant turns with
// prose, code and a tool call whose result is a JSON document (nested 5 deep: the default
// guard's limit, which a deeper one would fail), and a final question.
func chatBody(b *testing.B, tokens int) []byte {
	b.Helper()
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type toolCall struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	type msg struct {
		Role       string     `json:"role"`
		Content    string     `json:"content,omitempty"`
		ToolCalls  []toolCall `json:"tool_calls,omitempty"`
		ToolCallID string     `json:"tool_call_id,omitempty"`
	}
	tools := json.RawMessage(`[{"type":"function","function":{"name":"search_orders","description":"Search a customer's orders by date range and status.","parameters":{"type":"object","properties":{"customer_id":{"type":"string"},"status":{"type":"string","enum":["open","shipped","returned"]},"since":{"type":"string","format":"date"}},"required":["customer_id"]}}}]`)
	msgs := []msg{{Role: "system", Content: "You are a support assistant for an online hardware store. Answer briefly, cite order numbers, and never invent tracking data. " + prose(0, 60)}}
	encode := func(ms []msg) []byte {
		body, err := json.Marshal(map[string]any{
			"model": "gpt-4o", "messages": ms, "tools": tools, "max_tokens": 256, "temperature": 0.2, "stream": true,
			"stream_options": map[string]bool{"include_usage": true},
		})
		if err != nil {
			b.Fatal(err)
		}
		return body
	}
	estimate := func(body []byte) int {
		r, err := openai.ParseRequest(openai.KindChat, body)
		if err != nil {
			b.Fatal(err)
		}
		return r.PromptTokens
	}
	final := msg{Role: "user", Content: "Given all of the above, which of my orders can still be returned, and by when?"}
	for turn := 0; ; turn++ {
		var next []msg
		switch turn % 3 {
		case 0:
			next = []msg{
				{Role: "user", Content: prose(turn, 90)},
				{Role: "assistant", Content: prose(turn+7, 70) + "\n\n```go\nfunc total(items []Item) (sum int) {\n\tfor _, it := range items {\n\t\tsum += it.Qty * it.Cents\n\t}\n\treturn sum\n}\n```"},
			}
		case 1:
			id := fmt.Sprintf("call_%04d", turn)
			next = []msg{
				{Role: "assistant", ToolCalls: []toolCall{{ID: id, Type: "function", Function: fn{Name: "search_orders",
					Arguments: fmt.Sprintf(`{"customer_id":"C-%05d","status":"shipped","since":"2025-0%d-01"}`, 31000+turn, 1+turn%9)}}}},
				{Role: "tool", ToolCallID: id, Content: fmt.Sprintf(`[{"id":"A-%d","items":[{"sku":"HX-220","qty":2,"cents":1999},{"sku":"PL-9","qty":1,"cents":45900}],"status":"shipped","carrier":{"name":"DHL","tracking":"JD0146000%05d"}},{"id":"A-%d","items":[{"sku":"CB-1","qty":4,"cents":350}],"status":"shipped"}]`, 90000+turn, turn, 90001+turn)},
			}
		default:
			next = []msg{
				{Role: "user", Content: prose(turn+3, 40)},
				{Role: "assistant", Content: prose(turn+5, 120)},
			}
		}
		grown := append(append([]msg{}, msgs...), next...)
		if estimate(encode(append(grown, final))) > tokens {
			// Pad the last turn's text to land just past the target.
			for n := 1; ; n++ {
				body := encode(append(append(append([]msg{}, msgs...), msg{Role: "user", Content: prose(turn+11, n)}), final))
				if estimate(body) >= tokens {
					return body
				}
			}
		}
		msgs = grown
	}
}

var vocabulary = strings.Fields(`the order shipped yesterday from our warehouse in Rotterdam and should arrive within three
business days although the carrier reported a delay at the regional hub because of weather customers may return unused
items within thirty days of delivery provided the original packaging is intact refunds are issued to the original payment
method after inspection which usually takes two to five days replacement parts for power tools are listed separately
warranty claims require the serial number printed on the label under the battery compartment please include photos of
any visible damage when you open a ticket and mention whether the device was used outdoors`)

// prose is n words of support-desk English, varied by seed.
func prose(seed, n int) string {
	var sb strings.Builder
	x := uint32(seed*2654435761 + 1)
	for i := range n {
		if i > 0 {
			if i%17 == 0 {
				sb.WriteString(". ")
			} else {
				sb.WriteByte(' ')
			}
		}
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		sb.WriteString(vocabulary[x%uint32(len(vocabulary))])
	}
	return sb.String()
}
