package guard

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy/clocktest"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeClock = clocktest.Clock

func newClock() *fakeClock { return clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

func newGuard(t testing.TB, p Params, clk policy.Clock) *Guard {
	t.Helper()
	g, err := New(p, policy.Env{Route: "chat", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// chatBody builds a chat body with one user message per content string.
func chatBody(model string, maxTokens int, contents ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := map[string]any{"model": model}
	var ms []msg
	for _, c := range contents {
		ms = append(ms, msg{"user", c})
	}
	body["messages"] = ms
	if maxTokens > 0 {
		body["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(body)
	return string(b)
}

func request(t testing.TB, kind openai.Kind, tenant, body string) *policy.Request {
	t.Helper()
	r, err := openai.ParseRequest(kind, []byte(body))
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	return &policy.Request{Request: r, Route: "chat", Tenant: tenant}
}

func chat(t testing.TB, tenant string, maxTokens int, contents ...string) *policy.Request {
	return request(t, openai.KindChat, tenant, chatBody("m", maxTokens, contents...))
}

// words returns n distinct-ish English-like words.
func words(n, seed int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "word%d", seed*1000003+i)
	}
	return b.String()
}

// prose returns text of about n tokens (ordinary English words).
func prose(n int) string {
	base := strings.Fields("the quick brown fox jumps over the lazy dog while a curious cat watches from the old wooden fence and the sun sets slowly behind distant blue hills")
	var b strings.Builder
	x := uint32(2463534242)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b.WriteString(base[x%uint32(len(base))])
	}
	return b.String()
}

// baselineOf returns the p95 and the size of a sender's surge baseline on the route "chat"
// (0, 0 when it has none): the tenant's, "client:" + address for a known client's, "" for
// the anonymous clients' shared one.
func baselineOf(g *Guard, who string, now time.Time) (p95, n int) {
	s := sender{tenant: who}
	if c, ok := strings.CutPrefix(who, "client:"); ok {
		s = sender{client: c}
	}
	if b := g.baseline(baseKey{"chat", s}, now, false); b != nil {
		return b.p95(now)
	}
	return 0, 0
}

func exactOf(t testing.TB, r *policy.Request) int {
	t.Helper()
	tk, err := encoder("cl100k_base")
	if err != nil {
		t.Fatal(err)
	}
	var pt promptText
	extractText(r.Kind, r.Body, &pt)
	return exactCount(tk, &pt, r.Messages)
}

var ok200 = policy.Outcome{Status: 200}

func admit(t testing.TB, g *Guard, r *policy.Request) policy.Decision {
	t.Helper()
	d, err := g.Admit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// admitOK admits r, fails the test on a rejection, and settles it with o.
func admitOK(t testing.TB, g *Guard, r *policy.Request, o policy.Outcome) {
	t.Helper()
	d := admit(t, g, r)
	if d.Reject != nil {
		t.Fatalf("rejected: %v", d.Reject)
	}
	d.Done(o)
}

func wantReject(t testing.TB, d policy.Decision, status int, code policy.Class, msgParts ...string) {
	t.Helper()
	if d.Reject == nil {
		t.Fatalf("admitted, want %d %s", status, code)
	}
	if d.Reject.Status != status || d.Reject.Class != code || d.Reject.Code != string(code) {
		t.Fatalf("got %d %s (%s), want %d %s", d.Reject.Status, d.Reject.Code, d.Reject.Message, status, code)
	}
	for _, p := range msgParts {
		if !strings.Contains(d.Reject.Message, p) {
			t.Errorf("message %q does not contain %q", d.Reject.Message, p)
		}
	}
}
