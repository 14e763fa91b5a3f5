package ratelimit

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy/clocktest"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a policy.Clock the test moves by hand.
type fakeClock = clocktest.Clock

func newClock() *fakeClock { return clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) }

// chat is a chat request of the tenant on the route with a prompt estimate and max_tokens
// (0: absent).
func chat(tenant, route string, prompt, maxTokens int) *policy.Request {
	return &policy.Request{
		Request: &openai.Request{Kind: openai.KindChat, Model: "llama-3-8b", PromptTokens: prompt, MaxTokens: maxTokens, N: 1},
		Tenant:  tenant,
		Route:   route,
	}
}

func newLimiter(t testing.TB, p Params, clock policy.Clock) *Limiter {
	t.Helper()
	l, err := New(p, nil, policy.Env{Route: "chat", Clock: clock})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func admit(t testing.TB, l *Limiter, r *policy.Request) policy.Decision {
	t.Helper()
	d, err := l.Admit(context.Background(), r)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return d
}

// tokens returns the key's token bucket level (floored) at the clock's now.
func tokens(t testing.TB, l *Limiter, key string) float64 {
	t.Helper()
	for _, ks := range l.Snapshot() {
		if ks.Key == key && ks.Tokens != nil {
			return ks.Tokens.Remaining
		}
	}
	t.Fatalf("no token bucket for key %q", key)
	return 0
}
