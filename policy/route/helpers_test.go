package route

import (
	"context"
	"net/http"
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

// req is a chat request with the given session header (""  : none).
func req(session string) *policy.Request {
	r := &policy.Request{
		Request: &openai.Request{Kind: openai.KindChat, Model: "llama-3-70b"},
		Header:  http.Header{},
	}
	if session != "" {
		r.Header.Set("X-Session-ID", session)
		r.Session = session
	}
	return r
}

func mustNew(t testing.TB, s Spec, primary, model string) *Router {
	t.Helper()
	rt, err := New(s, primary, model, newClock())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return rt
}

// splitOf plans r and returns the first candidate's split name.
func splitOf(rt *Router, r *policy.Request) string {
	return rt.Plan(context.Background(), r)[0].Split
}

func f64(v float64) *float64 { return &v }
