package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// TestLimitsHoldOverAMinute drives a greedy client (it sends until rejected, every 10ms of
// simulated time) for two minutes and checks what was admitted against the limits: the first
// minute may also spend the full bucket, the second (steady state) only the per-minute limit.
func TestLimitsHoldOverAMinute(t *testing.T) {
	tests := []struct {
		name       string
		p          Params
		prompt     int
		maxTokens  int
		realOutput func(r *rand.Rand, maxTokens int) int // output tokens actually used
	}{
		{name: "requests only", p: Params{RequestsPerMinute: 600}, prompt: 100, maxTokens: 50},
		{name: "tokens only", p: Params{TokensPerMinute: 60000}, prompt: 100, maxTokens: 50},
		{name: "both, tokens bind", p: Params{RequestsPerMinute: 1000, TokensPerMinute: 30000}, prompt: 200, maxTokens: 100},
		{name: "both, requests bind", p: Params{RequestsPerMinute: 120, TokensPerMinute: 300000}, prompt: 200, maxTokens: 100},
		{name: "small burst", p: Params{TokensPerMinute: 60000, Burst: 0.05}, prompt: 300, maxTokens: 200},
		{name: "reconciled, usage below the estimate", p: Params{TokensPerMinute: 60000}, prompt: 100, maxTokens: 400,
			realOutput: func(r *rand.Rand, m int) int { return r.IntN(m / 2) }},
		{name: "reconciled, usage above the estimate", p: Params{TokensPerMinute: 60000, MaxTokensCap: 50}, prompt: 100, maxTokens: 400,
			realOutput: func(r *rand.Rand, m int) int { return 50 + r.IntN(m-50) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			l := newLimiter(t, tc.p, clock)
			rng := rand.New(rand.NewPCG(1, 2))
			var reqs, toks [2]float64
			for step := 0; step < 2*6000; step++ {
				minute := step / 6000
				for i := 0; i < 1000; i++ {
					d := admit(t, l, chat("a", "chat", tc.prompt, tc.maxTokens))
					if d.Reject != nil {
						break
					}
					out := tc.maxTokens
					if tc.realOutput != nil {
						out = tc.realOutput(rng, tc.maxTokens)
					}
					reqs[minute]++
					toks[minute] += float64(tc.prompt + out)
					if d.Done != nil {
						d.Done(policy.Outcome{Status: 200, InputTokens: tc.prompt, OutputTokens: out})
					}
				}
				clock.Advance(10 * time.Millisecond)
			}
			p := l.Params()
			within := func(what string, got, want float64) {
				t.Helper()
				if math.Abs(got-want) > 0.05*want {
					t.Errorf("%s: admitted %.0f, want %.0f ±5%%", what, got, want)
				}
			}
			atMost := func(what string, got, want float64) {
				t.Helper()
				if got > want*1.05 {
					t.Errorf("%s: admitted %.0f, want at most %.0f +5%%", what, got, want)
				}
			}
			// Which limit binds: the one that admits fewer requests.
			rpm, tpm := p.RequestsPerMinute, p.TokensPerMinute
			perReq := toks[1] / max(reqs[1], 1)
			reqBinds := rpm > 0 && (tpm == 0 || rpm*perReq < tpm)
			if rpm > 0 {
				atMost("requests, minute 1", reqs[0], rpm+math.Ceil(rpm*p.Burst))
				atMost("requests, minute 2", reqs[1], rpm)
				if reqBinds {
					within("requests, minute 1", reqs[0], rpm+math.Ceil(rpm*p.Burst))
					within("requests, minute 2", reqs[1], rpm)
				}
			}
			if tpm > 0 {
				atMost("tokens, minute 1", toks[0], tpm+math.Ceil(tpm*p.Burst))
				atMost("tokens, minute 2", toks[1], tpm)
				if !reqBinds {
					within("tokens, minute 1", toks[0], tpm+math.Ceil(tpm*p.Burst))
					within("tokens, minute 2", toks[1], tpm)
				}
			}
			t.Logf("admitted per minute: requests %v, tokens %v", reqs, toks)
		})
	}
}

func TestFormatReset(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{-time.Second, "0s"},
		{300 * time.Microsecond, "1ms"},
		{12 * time.Millisecond, "12ms"},
		{250 * time.Millisecond, "250ms"},
		{time.Second, "1s"},
		{time.Second + 100*time.Microsecond, "1.001s"},
		{8640 * time.Millisecond, "8.64s"},
		{6 * time.Minute, "6m0s"},
		{2*time.Minute + 30*time.Second, "2m30s"},
	}
	for _, tc := range tests {
		if got := formatReset(tc.d); got != tc.want {
			t.Errorf("formatReset(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestHeaders(t *testing.T) {
	clock := newClock()
	// OpenAI's documented example: 60 RPM, 150000 TPM.
	l := newLimiter(t, Params{RequestsPerMinute: 60, TokensPerMinute: 150000}, clock)
	type step struct {
		advance time.Duration
		prompt  int
		max     int
		reject  bool
		want    map[string]string
	}
	steps := []step{
		{prompt: 10, max: 6, want: map[string]string{ // charge 16: 16/2500 s = 6.4ms
			HeaderLimitRequests: "60", HeaderRemainingRequests: "59", HeaderResetRequests: "1s",
			HeaderLimitTokens: "150000", HeaderRemainingTokens: "149984", HeaderResetTokens: "7ms",
		}},
		{prompt: 149000, max: 984, want: map[string]string{ // takes every token left
			HeaderRemainingRequests: "58", HeaderResetRequests: "2s",
			HeaderRemainingTokens: "0", HeaderResetTokens: "1m0s",
		}},
		{prompt: 2500, max: 0, reject: true, want: map[string]string{ // 2756 tokens: rejected, nothing charged
			HeaderLimitRequests: "60", HeaderRemainingRequests: "58", HeaderResetRequests: "2s",
			HeaderLimitTokens: "150000", HeaderRemainingTokens: "0", HeaderResetTokens: "1m0s",
		}},
		{advance: 500 * time.Millisecond, prompt: 1000, max: 250, want: map[string]string{ // 1250 tokens refilled, 1250 spent
			HeaderRemainingRequests: "57", HeaderResetRequests: "2.5s",
			HeaderRemainingTokens: "0", HeaderResetTokens: "1m0s",
		}},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		d := admit(t, l, chat("a", "chat", s.prompt, s.max))
		if (d.Reject != nil) != s.reject {
			t.Fatalf("step %d: reject = %v, want %v", i, d.Reject, s.reject)
		}
		for k, v := range s.want {
			if got := d.Header.Get(k); got != v {
				t.Errorf("step %d: %s = %q, want %q", i, k, got, v)
			}
		}
		if len(d.Header) != 6 {
			t.Errorf("step %d: %d headers, want 6: %v", i, len(d.Header), d.Header)
		}
		if d.Done != nil {
			d.Done(policy.Outcome{Status: 200, InputTokens: s.prompt, OutputTokens: s.max})
		}
	}

	// Only the configured limits get headers.
	l2 := newLimiter(t, Params{RequestsPerMinute: 10}, clock)
	d := admit(t, l2, chat("a", "chat", 10, 10))
	if d.Header.Get(HeaderLimitRequests) != "10" || d.Header.Get(HeaderLimitTokens) != "" || len(d.Header) != 3 {
		t.Errorf("requests-only headers: %v", d.Header)
	}
}

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		name      string
		p         Params
		fill      int // requests admitted first
		prompt    int
		maxTokens int
		wantRetry time.Duration
		wantType  string
		wantHdr   string // Retry-After as written
	}{
		{name: "requests, 60 rpm", p: Params{RequestsPerMinute: 60}, fill: 60, prompt: 1, wantRetry: time.Second, wantType: "requests", wantHdr: "1"},
		{name: "requests, 1 rpm", p: Params{RequestsPerMinute: 1}, fill: 1, prompt: 1, wantRetry: time.Minute, wantType: "requests", wantHdr: "60"},
		{name: "requests, 7 rpm rounds up", p: Params{RequestsPerMinute: 7}, fill: 7, prompt: 1, wantRetry: 60 * time.Second / 7, wantType: "requests", wantHdr: "9"},
		// 6000 TPM = 100/s; 10 requests of 600 drain it; 250 more need 2.5s.
		{name: "tokens", p: Params{TokensPerMinute: 6000}, fill: 10, prompt: 300, maxTokens: 300, wantRetry: 2500 * time.Millisecond, wantType: "tokens", wantHdr: "3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			l := newLimiter(t, tc.p, clock)
			for i := 0; i < tc.fill; i++ {
				if d := admit(t, l, chat("a", "chat", tc.prompt, tc.maxTokens)); d.Reject != nil {
					t.Fatalf("request %d rejected: %v", i, d.Reject)
				}
			}
			r := chat("a", "chat", 150, 100)
			if tc.wantType == "requests" {
				r = chat("a", "chat", tc.prompt, tc.maxTokens)
			}
			d := admit(t, l, r)
			if d.Reject == nil {
				t.Fatal("not rejected")
			}
			e := d.Reject
			if e.Status != 429 || e.Type != tc.wantType || e.Code != "rate_limit_exceeded" {
				t.Errorf("reject = %d %s %s", e.Status, e.Type, e.Code)
			}
			if diff := e.RetryAfter - tc.wantRetry; diff < -time.Microsecond || diff > time.Microsecond {
				t.Errorf("RetryAfter = %v, want %v", e.RetryAfter, tc.wantRetry)
			}
			w := httptest.NewRecorder()
			openai.WriteError(w, e.OpenAI())
			if got := w.Header().Get("Retry-After"); got != tc.wantHdr {
				t.Errorf("Retry-After = %q, want %q", got, tc.wantHdr)
			}
			if d.Done != nil {
				t.Error("a rejected request has a Done")
			}
			// After the wait, the same request goes through.
			clock.Advance(e.RetryAfter)
			if d := admit(t, l, r); d.Reject != nil {
				t.Errorf("after Retry-After: %v", d.Reject)
			}
			st := l.Stats()
			if st.Rejected[tc.wantType] != 1 || st.Admitted != uint64(tc.fill+1) {
				t.Errorf("stats = %+v", st)
			}
		})
	}
}

// TestLargerThanBucketBorrows: with burst < 1, a charge above the bucket (but within the
// per-minute limit) waits for a full bucket, takes it and borrows the rest: one O(1) charge
// that puts the bucket into debt, which later requests wait out.
func TestLargerThanBucketBorrows(t *testing.T) {
	clock := newClock()
	// 6000 TPM = 100 tokens/s; burst 0.1: a bucket of 600; requests of 1500 tokens.
	l := newLimiter(t, Params{TokensPerMinute: 6000, Burst: 0.1}, clock)
	d := admit(t, l, chat("a", "chat", 1000, 500))
	if d.Reject != nil {
		t.Fatalf("a request larger than the bucket is refused when the bucket is full: %v", d.Reject)
	}
	// 600 now, 900 borrowed: the bucket is at -900 and full again in (600+900)/100 s.
	if got := tokens(t, l, "a"); got != -900 {
		t.Errorf("tokens = %v, want -900", got)
	}
	if got := d.Header.Get(HeaderRemainingTokens); got != "0" {
		t.Errorf("remaining = %q, want 0 (clamped)", got)
	}
	if got := d.Header.Get(HeaderResetTokens); got != "15s" {
		t.Errorf("reset = %q, want 15s", got)
	}
	// A small request now waits out the debt: 100 tokens need 10 s.
	d2 := admit(t, l, chat("a", "chat", 50, 50))
	if d2.Reject == nil || d2.Reject.RetryAfter != 10*time.Second || d2.Reject.Type != "tokens" {
		t.Fatalf("small request after the debt: %+v", d2.Reject)
	}
	// Another large one waits for a full bucket (15 s), then is admitted.
	clock.Advance(10 * time.Second)
	d3 := admit(t, l, chat("a", "chat", 1000, 500))
	if d3.Reject == nil || d3.Reject.RetryAfter != 5*time.Second {
		t.Fatalf("large request before the bucket is full: %+v", d3.Reject)
	}
	if got := tokens(t, l, "a"); got != 100 {
		t.Errorf("after a rejected large charge, tokens = %v, want 100 (all given back)", got)
	}
	clock.Advance(d3.Reject.RetryAfter)
	if d := admit(t, l, chat("a", "chat", 1000, 500)); d.Reject != nil {
		t.Fatalf("large request with a full bucket: %v", d.Reject)
	}
	// Over a long run the rate still holds: each 1500-token request waits for a full bucket,
	// so one goes every 15 s (1500 tokens at 100/s): 40 in 10 minutes.
	clock.Advance(15 * time.Second)
	var admitted int
	for i := 0; i < 60000; i++ {
		if d := admit(t, l, chat("a", "chat", 1000, 500)); d.Reject == nil {
			admitted += 1500
		}
		clock.Advance(10 * time.Millisecond)
	}
	if admitted != 60000 {
		t.Errorf("admitted %d tokens in 10 min at 6000 TPM, want 60000", admitted)
	}

	// Settlement of a borrowed charge: refunds and extra charges reconcile against the debt.
	for _, tc := range []struct {
		name      string
		used      int
		wantLevel float64
	}{
		{"usage lower: refunded into the debt", 1100, 600 - 1100},
		{"usage higher: more debt", 2000, 600 - 2000},
		{"nothing counted: the prompt only", 0, 600 - 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			l := newLimiter(t, Params{TokensPerMinute: 6000, Burst: 0.1}, clock)
			d := admit(t, l, chat("a", "chat", 1000, 500))
			if d.Reject != nil {
				t.Fatal(d.Reject)
			}
			d.Done(policy.Outcome{Status: 200, InputTokens: min(tc.used, 1000), OutputTokens: max(tc.used-1000, 0)})
			if got := tokens(t, l, "a"); got != tc.wantLevel {
				t.Errorf("tokens = %v, want %v", got, tc.wantLevel)
			}
		})
	}
}

func TestReconcile(t *testing.T) {
	const tpm = 60000
	tests := []struct {
		name       string
		prompt     int
		maxTokens  int
		n          int
		outcome    policy.Outcome
		wantCharge int // up front
		wantUsed   int // after Done
	}{
		{name: "default max_tokens, usage lower (streaming)", prompt: 100, outcome: policy.Outcome{Status: 200, InputTokens: 100, OutputTokens: 20},
			wantCharge: 356, wantUsed: 120},
		{name: "usage higher than max_tokens estimate", prompt: 100, maxTokens: 50, outcome: policy.Outcome{Status: 200, InputTokens: 120, OutputTokens: 900},
			wantCharge: 150, wantUsed: 1020},
		{name: "max_tokens capped, usage higher", prompt: 100, maxTokens: 100000, outcome: policy.Outcome{Status: 200, InputTokens: 100, OutputTokens: 5000},
			wantCharge: 4196, wantUsed: 5100},
		{name: "n multiplies the completion", prompt: 100, maxTokens: 10, n: 3, outcome: policy.Outcome{Status: 200, InputTokens: 100, OutputTokens: 30},
			wantCharge: 130, wantUsed: 130},
		{name: "failed with no tokens refunds the output part", prompt: 100, maxTokens: 500, outcome: policy.Outcome{Status: 502, ErrorClass: "5xx"},
			wantCharge: 600, wantUsed: 100},
		{name: "client gone mid-stream pays what streamed", prompt: 100, maxTokens: 500, outcome: policy.Outcome{Status: 499, InputTokens: 100, OutputTokens: 42},
			wantCharge: 600, wantUsed: 142},
		{name: "usage larger than the bucket goes into debt", prompt: 100, maxTokens: 10, outcome: policy.Outcome{Status: 200, InputTokens: 100, OutputTokens: 70000},
			wantCharge: 110, wantUsed: 70100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			l := newLimiter(t, Params{TokensPerMinute: tpm}, clock)
			r := chat("a", "chat", tc.prompt, tc.maxTokens)
			if tc.n > 0 {
				r.N = tc.n
			}
			d := admit(t, l, r)
			if d.Reject != nil || d.Done == nil {
				t.Fatalf("decision = %+v", d)
			}
			if got := tpm - tokens(t, l, "a"); got != float64(tc.wantCharge) {
				t.Errorf("charged %v up front, want %d", got, tc.wantCharge)
			}
			d.Done(tc.outcome)
			if got := tpm - tokens(t, l, "a"); got != float64(tc.wantUsed) {
				t.Errorf("after Done, used %v, want %d", got, tc.wantUsed)
			}
			d.Done(tc.outcome) // a second call changes nothing
			if got := tpm - tokens(t, l, "a"); got != float64(tc.wantUsed) {
				t.Errorf("after a second Done, used %v, want %d", got, tc.wantUsed)
			}
			st := l.Stats()
			if diff := tc.wantUsed - tc.wantCharge; (diff < 0 && st.RefundedTokens != uint64(-diff)) || (diff > 0 && st.ExtraTokens != uint64(diff)) {
				t.Errorf("stats = %+v", st)
			}
		})
	}

	t.Run("refund never overfills the bucket", func(t *testing.T) {
		clock := newClock()
		l := newLimiter(t, Params{TokensPerMinute: 600}, clock)
		d := admit(t, l, chat("a", "chat", 100, 500))
		clock.Advance(time.Hour)
		d.Done(policy.Outcome{Status: 200, InputTokens: 10, OutputTokens: 0})
		if got := tokens(t, l, "a"); got != 600 {
			t.Errorf("tokens = %v, want 600", got)
		}
		// Still exactly one bucket: 600 admitted now, then rejected.
		if d := admit(t, l, chat("a", "chat", 300, 300)); d.Reject != nil {
			t.Fatal(d.Reject)
		}
		if d := admit(t, l, chat("a", "chat", 1, 1)); d.Reject == nil {
			t.Error("bucket overfilled by a refund")
		}
	})

	t.Run("embeddings charge the input only", func(t *testing.T) {
		l := newLimiter(t, Params{TokensPerMinute: tpm}, newClock())
		r := &policy.Request{Request: &openai.Request{Kind: openai.KindEmbedding, PromptTokens: 500, N: 1}, Tenant: "a"}
		admit(t, l, r)
		if got := tpm - tokens(t, l, "a"); got != 500 {
			t.Errorf("charged %v, want 500", got)
		}
	})

	t.Run("no body charges the request only", func(t *testing.T) {
		l := newLimiter(t, Params{RequestsPerMinute: 10, TokensPerMinute: tpm}, newClock())
		d := admit(t, l, &policy.Request{Tenant: "a"})
		if d.Reject != nil || d.Done != nil || d.Header.Get(HeaderRemainingRequests) != "9" || d.Header.Get(HeaderRemainingTokens) != "60000" {
			t.Errorf("decision = %+v", d)
		}
	})
}

func TestKeying(t *testing.T) {
	type req struct {
		tenant, route string
		reject        bool
	}
	tests := []struct {
		name string
		p    Params
		reqs []req
	}{
		{name: "per tenant: A exhausted, B unaffected", p: Params{RequestsPerMinute: 2},
			reqs: []req{{"A", "chat", false}, {"A", "chat", false}, {"A", "chat", true}, {"B", "chat", false}, {"B", "other", false}, {"B", "chat", true}, {"A", "other", true}}},
		{name: "anonymous requests share one bucket", p: Params{RequestsPerMinute: 1},
			reqs: []req{{"", "chat", false}, {"", "chat", true}, {"A", "chat", false}}},
		{name: "per route: routes apart, tenants together", p: Params{RequestsPerMinute: 2, Per: PerRoute},
			reqs: []req{{"A", "chat", false}, {"B", "chat", false}, {"C", "chat", true}, {"A", "embed", false}, {"A", "embed", false}, {"B", "embed", true}}},
		{name: "per route: the env route when the request has none", p: Params{RequestsPerMinute: 1, Per: PerRoute},
			reqs: []req{{"A", "", false}, {"A", "chat", true}}},
		{name: "global: one bucket", p: Params{RequestsPerMinute: 3, Per: PerGlobal},
			reqs: []req{{"A", "chat", false}, {"B", "embed", false}, {"", "x", false}, {"C", "y", true}}},
		{name: "overrides per tenant", p: Params{RequestsPerMinute: 1, Overrides: map[string]Limits{"big": {RequestsPerMinute: 3}}},
			reqs: []req{{"small", "chat", false}, {"small", "chat", true}, {"big", "chat", false}, {"big", "chat", false}, {"big", "chat", false}, {"big", "chat", true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, tc.p, newClock())
			for i, r := range tc.reqs {
				d := admit(t, l, chat(r.tenant, r.route, 10, 10))
				if (d.Reject != nil) != r.reject {
					t.Errorf("request %d (%s on %s): reject = %v, want %v", i, r.tenant, r.route, d.Reject, r.reject)
				}
			}
		})
	}
}

func TestTokenIsolation(t *testing.T) {
	clock := newClock()
	l := newLimiter(t, Params{TokensPerMinute: 1000, RequestsPerMinute: 100}, clock)
	for i := 0; ; i++ {
		if d := admit(t, l, chat("A", "chat", 100, 100)); d.Reject != nil {
			if i != 5 || d.Reject.Type != "tokens" {
				t.Fatalf("A rejected after %d requests (%v), want 5 (tokens)", i, d.Reject)
			}
			break
		}
	}
	d := admit(t, l, chat("B", "chat", 100, 100))
	if d.Reject != nil || d.Header.Get(HeaderRemainingTokens) != "800" || d.Header.Get(HeaderRemainingRequests) != "99" {
		t.Errorf("B: %v %v", d.Reject, d.Header)
	}
}

func TestRequireAuth(t *testing.T) {
	kr, err := KeyringOf(Tenant{Name: "team-a", Keys: []string{"sk-team-a-secret"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Params{RequireAuth: true, RequestsPerMinute: 1}, kr, policy.Env{Clock: newClock()})
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(k, v string) http.Header { h := http.Header{}; h.Set(k, v); return h }
	tests := []struct {
		name    string
		tenant  string
		header  http.Header
		status  int
		message string
	}{
		{name: "tenant set by the handler", tenant: "team-b", status: 0},
		{name: "no key", header: http.Header{}, status: 401, message: "didn't provide"},
		{name: "unknown key", header: hdr("Authorization", "Bearer sk-wrong-key"), status: 401, message: "Incorrect API key"},
		{name: "known key identified by the keyring", header: hdr("Authorization", "Bearer sk-team-a-secret"), status: 0},
		{name: "same tenant again: its bucket is used", header: hdr("x-api-key", "sk-team-a-secret"), status: 429},
	}
	for _, tc := range tests {
		r := chat(tc.tenant, "chat", 10, 10)
		r.Header = tc.header
		d := admit(t, l, r)
		switch {
		case tc.status == 0 && d.Reject != nil:
			t.Errorf("%s: rejected %v", tc.name, d.Reject)
		case tc.status != 0 && (d.Reject == nil || d.Reject.Status != tc.status):
			t.Errorf("%s: decision %+v, want %d", tc.name, d.Reject, tc.status)
		case tc.status == 401:
			e := d.Reject
			if e.Code != "invalid_api_key" || e.Type != "invalid_request_error" || !strings.Contains(e.Message, tc.message) || strings.Contains(e.Message, "sk-") {
				t.Errorf("%s: %+v", tc.name, e)
			}
			if d.Header != nil || d.Done != nil {
				t.Errorf("%s: a 401 has headers or Done", tc.name)
			}
		}
	}
	if got := l.Stats().Rejected[ReasonAuth]; got != 2 {
		t.Errorf("rejected unauthenticated = %d, want 2", got)
	}
}

func TestMaxWait(t *testing.T) {
	clock := newClock()
	l := newLimiter(t, Params{RequestsPerMinute: 60, MaxWait: policy.Duration(2 * time.Second)}, clock)
	var slept []time.Duration
	var sleepErr error
	l.sleep = func(ctx context.Context, d time.Duration) error { // the clock stays: requests queue up
		slept = append(slept, d)
		return sleepErr
	}
	for i := 0; i < 60; i++ {
		admit(t, l, chat("a", "chat", 1, 1))
	}
	// The next two wait 1s and 2s (within max_wait) and are admitted; a third would wait 3s:
	// 429 at once, with nothing kept.
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		if d := admit(t, l, chat("a", "chat", 1, 1)); d.Reject != nil || len(slept) != i+1 || slept[i] != want {
			t.Fatalf("queued request %d: reject %v, slept %v", i, d.Reject, slept)
		}
	}
	d := admit(t, l, chat("a", "chat", 1, 1))
	if d.Reject == nil || d.Reject.RetryAfter != 3*time.Second || len(slept) != 2 {
		t.Fatalf("beyond max_wait: %+v, slept %v", d.Reject, slept)
	}

	// A context that ends while waiting: its error, and the reservation given back.
	clock.Advance(time.Second) // the next waits 2s
	sleepErr = context.Canceled
	d, err := l.Admit(context.Background(), chat("a", "chat", 1, 1))
	if !errors.Is(err, context.Canceled) || d.Reject != nil || len(slept) != 3 || slept[2] != 2*time.Second {
		t.Fatalf("canceled wait: %v %+v, slept %v", err, d, slept)
	}
	sleepErr = nil
	if d := admit(t, l, chat("a", "chat", 1, 1)); d.Reject != nil || slept[3] != 2*time.Second {
		t.Errorf("after a canceled wait, the next one waits %v, want 2s (nothing kept)", slept[3])
	}

	// A deadline shorter than the wait: 429 at once, no sleep.
	clock.Advance(2 * time.Second) // the queue is served; the next waits 1s
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	n := len(slept)
	d, err = l.Admit(ctx, chat("a", "chat", 1, 1))
	if err != nil || d.Reject == nil || d.Reject.RetryAfter != time.Second || len(slept) != n {
		t.Errorf("short deadline: %v %+v, slept %v", err, d.Reject, slept[n:])
	}
	if got := l.Stats().Rejected[ReasonCanceled]; got != 1 {
		t.Errorf("canceled = %d", got)
	}
}

func TestEviction(t *testing.T) {
	clock := newClock()
	l := newLimiter(t, Params{RequestsPerMinute: 60, MaxKeys: 2}, clock)
	admit(t, l, chat("a", "chat", 1, 1))
	clock.Advance(time.Second)
	admit(t, l, chat("b", "chat", 1, 1))
	clock.Advance(500 * time.Millisecond) // a is full again (idle), b is not
	admit(t, l, chat("c", "chat", 1, 1))
	keys := func() (ks []string) {
		for _, s := range l.Snapshot() {
			ks = append(ks, s.Key)
		}
		return ks
	}
	if got := strings.Join(keys(), ","); got != "b,c" {
		t.Errorf("keys = %s, want b,c (the idle one evicted)", got)
	}
	// None idle: the least recently used goes.
	admit(t, l, chat("c", "chat", 1, 1))
	admit(t, l, chat("d", "chat", 1, 1))
	if got := strings.Join(keys(), ","); got != "c,d" {
		t.Errorf("keys = %s, want c,d (LRU b evicted)", got)
	}
	if l.Stats().Keys != 2 {
		t.Errorf("stats keys = %d", l.Stats().Keys)
	}
}

func TestSnapshot(t *testing.T) {
	clock := newClock()
	l := newLimiter(t, Params{RequestsPerMinute: 60, TokensPerMinute: 600}, clock)
	admit(t, l, chat("a", "chat", 100, 200))
	s := l.Snapshot()
	if len(s) != 1 || s[0].Key != "a" || s[0].Requests.Remaining != 59 || s[0].Tokens.Remaining != 300 ||
		s[0].Tokens.Capacity != 600 || s[0].Tokens.Reset != "30s" || s[0].Requests.LimitPerMinute != 60 {
		b, _ := json.Marshal(s)
		t.Errorf("snapshot = %s", b)
	}
}

func TestParamsValidate(t *testing.T) {
	if err := (Params{TokensPerMinute: 1000}).Validate(); err != nil {
		t.Errorf("valid params: %v", err)
	}
	bad := Params{
		RequestsPerMinute: -1,
		TokensPerMinute:   -2,
		Per:               "user",
		Burst:             -1,
		DefaultMaxTokens:  -3,
		MaxTokensCap:      -4,
		MaxWait:           policy.Duration(-time.Second),
		MaxKeys:           -5,
		Overrides:         map[string]Limits{"": {}, "x": {RequestsPerMinute: -6, TokensPerMinute: -7}},
		Global: &Global{
			Timeout:     policy.Duration(-time.Millisecond),
			Hits:        "bytes",
			Descriptors: [][]GlobalEntry{{}, {{Key: "", From: "user"}, {Key: "k"}, {Key: "k", Value: "v", From: FromModel}}},
		},
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"requests_per_minute: -1", "tokens_per_minute: -2", `per: "user"`, "burst: -1", "default_max_tokens: -3",
		"max_tokens_cap: -4", "max_wait: -1s", "max_keys: -5", "overrides: only with per: tenant", "overrides: empty tenant name",
		"overrides.x.requests_per_minute: -6", "overrides.x.tokens_per_minute: -7", "global.address: required",
		"global.timeout: -1ms", `global.hits: "bytes"`, "global.descriptors[0]: no entries", "global.descriptors[1][0].key: required",
		`global.descriptors[1][0].from: "user"`, "global.descriptors[1][1]: set value or from", "global.descriptors[1][2]: set value or from, not both",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if err := (Params{}).Validate(); err == nil || !strings.Contains(err.Error(), "nothing to enforce") {
		t.Errorf("empty params: %v", err)
	}
	if _, err := New(bad, nil, policy.Env{}); err == nil {
		t.Error("New accepted bad params")
	}
}

func TestRegistry(t *testing.T) {
	found := false
	for _, typ := range policy.Types() {
		found = found || typ == "ratelimit"
	}
	if !found {
		t.Fatalf("ratelimit not registered: %v", policy.Types())
	}
	tests := []struct {
		name    string
		params  map[string]any
		wantErr string
	}{
		{name: "ok", params: map[string]any{"tokens_per_minute": 200000, "per": "tenant", "burst": 0.5, "max_wait": "250ms", "require_auth": true}},
		{name: "global", params: map[string]any{"requests_per_minute": 10, "global": map[string]any{"address": "127.0.0.1:1", "timeout": 0.05,
			"descriptors": []any{[]any{map[string]any{"key": "tenant", "from": "tenant"}}}}}},
		{name: "unknown field", params: map[string]any{"tokens_per_minute": 1, "tokens_per_hour": 2}, wantErr: `unknown field "tokens_per_hour"`},
		{name: "unknown nested field", params: map[string]any{"global": map[string]any{"address": "x", "port": 1}}, wantErr: `unknown field "port"`},
		{name: "wrong type", params: map[string]any{"tokens_per_minute": "lots"}, wantErr: "tokens_per_minute"},
		{name: "bad duration", params: map[string]any{"requests_per_minute": 1, "max_wait": "soon"}, wantErr: "invalid duration"},
		{name: "invalid", params: map[string]any{"per": "user"}, wantErr: "nothing to enforce"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Build(policy.Spec{Type: "ratelimit", Params: tc.params}, policy.Env{Route: "chat"})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			l, ok := p.(*Limiter)
			if !ok {
				t.Fatalf("built %T", p)
			}
			defer l.Close()
			var _ policy.Admitter = l
			if tc.name == "ok" {
				got := l.Params()
				if got.Burst != 0.5 || got.MaxWait.D() != 250*time.Millisecond || got.DefaultMaxTokens != 256 || got.MaxTokensCap != 4096 || got.MaxKeys != 10000 {
					t.Errorf("params = %+v", got)
				}
			}
			if tc.name == "global" {
				g := l.Params().Global
				if g.Timeout.D() != 50*time.Millisecond || g.Domain != "sluice" || g.Hits != "requests" {
					t.Errorf("global = %+v", g)
				}
			}
		})
	}
}

// TestConcurrent runs Admit, Done, Snapshot and Stats together (for -race), with eviction,
// and checks that the counts add up.
func TestConcurrent(t *testing.T) {
	clock := newClock()
	l := newLimiter(t, Params{RequestsPerMinute: 50, TokensPerMinute: 5000, MaxKeys: 3}, clock)
	var wg sync.WaitGroup
	const workers, each = 8, 200
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				d, err := l.Admit(context.Background(), chat(strconv.Itoa((w+i)%5), "chat", 50, 50))
				if err != nil {
					t.Error(err)
					return
				}
				if d.Done != nil {
					d.Done(policy.Outcome{Status: 200, InputTokens: 50, OutputTokens: 10})
				}
				if i%50 == 0 {
					_ = l.Snapshot()
					clock.Advance(time.Second)
				}
			}
		}()
	}
	wg.Wait()
	st := l.Stats()
	var rejected uint64
	for _, n := range st.Rejected {
		rejected += n
	}
	if st.Admitted+rejected != workers*each || st.Keys > 3 {
		t.Errorf("stats = %+v", st)
	}
}
