package ratelimit

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// chatN is chat with n choices.
func chatN(tenant string, prompt, maxTokens, n int) *policy.Request {
	r := chat(tenant, "chat", prompt, maxTokens)
	r.N = n
	return r
}

// responses is a Responses API request (MaxTokens is max_output_tokens).
func responses(tenant string, prompt, maxOutput int) *policy.Request {
	return &policy.Request{
		Request: &openai.Request{Kind: openai.KindResponses, Model: "llama-3-8b", PromptTokens: prompt, MaxTokens: maxOutput, N: 1},
		Tenant:  tenant,
		Route:   "chat",
	}
}

const tooLargeTail = ". The input or output tokens must be reduced in order to run successfully."

// TestTooLarge: a request whose charge is above what one request may take (the per-minute limit,
// or the bucket when burst > 1) is answered 429 "Request too large" at once, without touching
// any bucket: the same key's next ordinary request and other tenants are admitted at once.
func TestTooLarge(t *testing.T) {
	tests := []struct {
		name    string
		p       Params
		req     *policy.Request
		wantMsg string
	}{
		{name: "n × max_tokens (the probe)", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100},
			req:     chatN("a", 10, 4096, 200000000),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 30000, Requested 819200000010" + tooLargeTail},
		{name: "one token above the limit", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100},
			req:     chat("a", "chat", 29000, 1001),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 30000, Requested 30001" + tooLargeTail},
		{name: "anonymous, no model", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100},
			req: func() *policy.Request {
				r := chat("", "chat", 50000, 1)
				r.Model = ""
				return r
			}(),
			wantMsg: "Request too large on tokens per min (TPM): Limit 30000, Requested 50001" + tooLargeTail},
		{name: "Responses API max_output_tokens", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100, MaxTokensCap: -1},
			req:     responses("a", 100, 40000),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 30000, Requested 40100" + tooLargeTail},
		{name: "overflowing n × max_tokens saturates", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100, MaxTokensCap: -1},
			req:     chatN("a", 10, 1<<32, 1<<32),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 30000, Requested 9223372036854775807" + tooLargeTail},
		{name: "burst 2: above the bucket", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100, Burst: 2},
			req:     chat("a", "chat", 60000, 1),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 30000 (bucket 60000), Requested 60001" + tooLargeTail},
		{name: "override limit", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100, Overrides: map[string]Limits{"a": {TokensPerMinute: 1000}}},
			req:     chat("a", "chat", 1000, 1),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 1000, Requested 1001" + tooLargeTail},
		{name: "per global: others share the bucket", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100, Per: PerGlobal},
			req:     chatN("a", 10, 4096, 200000000),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 30000, Requested 819200000010" + tooLargeTail},
		{name: "max_wait does not wait for it", p: Params{TokensPerMinute: 30000, RequestsPerMinute: 100, MaxWait: policy.Duration(time.Hour)},
			req:     chatN("a", 10, 4096, 200000000),
			wantMsg: "Request too large for llama-3-8b on tokens per min (TPM) for tenant a: Limit 30000, Requested 819200000010" + tooLargeTail},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			l := newLimiter(t, tc.p, clock)
			l.sleep = func(context.Context, time.Duration) error { t.Error("slept"); return nil }
			key := tc.req.Tenant
			if tc.p.Per == PerGlobal {
				key = ""
			}
			limit := l.Params().TokensPerMinute
			if o, ok := tc.p.Overrides[key]; ok {
				limit = o.TokensPerMinute
			}
			capTokens := float64(capacity(limit, l.Params().Burst))

			start := time.Now()
			d := admit(t, l, tc.req)
			if el := time.Since(start); el > time.Second {
				t.Errorf("Admit took %v", el)
			}
			e := d.Reject
			if e == nil {
				t.Fatal("admitted")
			}
			if e.Status != 429 || e.Type != "tokens" || e.Code != "rate_limit_exceeded" || e.Message != tc.wantMsg {
				t.Errorf("reject = %d %s %s %q\nwant message %q", e.Status, e.Type, e.Code, e.Message, tc.wantMsg)
			}
			if e.RetryAfter != 0 {
				t.Errorf("RetryAfter = %v: waiting never helps", e.RetryAfter)
			}
			w := httptest.NewRecorder()
			for k, v := range d.Header {
				w.Header()[k] = v
			}
			openai.WriteError(w, e.OpenAI())
			if got := w.Header().Get("Retry-After"); got != "" {
				t.Errorf("Retry-After = %q", got)
			}
			if got := w.Header().Get("X-Should-Retry"); got != "false" {
				t.Errorf("X-Should-Retry = %q, want false (the SDKs would retry a 429)", got)
			}
			if d.Done != nil {
				t.Error("a rejected request has a Done")
			}
			if got := d.Header.Get(HeaderRemainingTokens); got != strconv.Itoa(int(capTokens)) {
				t.Errorf("remaining tokens = %q, want %v (nothing charged)", got, capTokens)
			}
			if got, want := d.Header.Get(HeaderRemainingRequests), strconv.Itoa(capacity(100, l.Params().Burst)); got != want {
				t.Errorf("remaining requests = %q, want %s (nothing charged)", got, want)
			}
			if got := tokens(t, l, key); got != capTokens {
				t.Errorf("tokens = %v, want %v (bucket untouched)", got, capTokens)
			}
			st := l.Stats()
			if st.Rejected["too_large"] != 1 || st.Rejected[ReasonTokens] != 0 || st.Admitted != 0 {
				t.Errorf("stats = %+v", st)
			}

			// The same key's next ordinary request, and another tenant's, go through at once.
			d = admit(t, l, chat(tc.req.Tenant, "chat", 100, 100))
			if d.Reject != nil || d.Header.Get(HeaderRemainingTokens) != strconv.Itoa(int(capTokens)-200) {
				t.Fatalf("next request of the same key: %v %v", d.Reject, d.Header)
			}
			d.Done(policy.Outcome{Status: 200, InputTokens: 100, OutputTokens: 100})
			if d := admit(t, l, chat("b", "chat", 100, 100)); d.Reject != nil {
				t.Fatalf("another tenant: %v", d.Reject)
			}
		})
	}
}

// TestTooLargeBoundary: the largest charge allowed is admitted (when the bucket is full); one
// token more is refused.
func TestTooLargeBoundary(t *testing.T) {
	tests := []struct {
		name    string
		p       Params
		largest int
	}{
		{"burst 1: the per-minute limit", Params{TokensPerMinute: 30000}, 30000},
		{"burst 0.1: still the per-minute limit (the rest is debt)", Params{TokensPerMinute: 30000, Burst: 0.1}, 30000},
		{"burst 3: the bucket", Params{TokensPerMinute: 30000, Burst: 3}, 90000},
		{"fractional limit", Params{TokensPerMinute: 100.5}, 101},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, tc.p, newClock())
			if d := admit(t, l, chat("a", "chat", tc.largest, 1)); d.Reject == nil || d.Reject.RetryAfter != 0 {
				t.Errorf("largest+1: %+v, want too large", d.Reject)
			}
			if d := admit(t, l, chat("a", "chat", tc.largest-1, 1)); d.Reject != nil {
				t.Errorf("largest: %v", d.Reject)
			}
		})
	}
}

// TestLargeChargeIsO1 measures the cost of a huge charge: refused or borrowed, it is one
// bucket operation, whatever its size: a handful of allocations, no goroutine, no big buffer.
func TestLargeChargeIsO1(t *testing.T) {
	ctx := context.Background()
	ordinary := func(l *Limiter, clock *fakeClock, r *policy.Request) func() {
		return func() {
			d, err := l.Admit(ctx, r)
			if err != nil || d.Reject != nil {
				panic("rejected: " + d.Reject.Message)
			}
			d.Done(policy.Outcome{Status: 200, InputTokens: r.PromptTokens, OutputTokens: r.MaxTokens * r.N})
			clock.Advance(2 * time.Minute) // full again
		}
	}
	clock := newClock()
	l := newLimiter(t, Params{TokensPerMinute: 30000, RequestsPerMinute: 1e6}, clock)
	base := testing.AllocsPerRun(50, ordinary(l, clock, chat("a", "chat", 100, 100)))
	t.Logf("ordinary request: %v allocs", base)

	t.Run("refused", func(t *testing.T) {
		huge := chatN("a", 10, 4096, 200000000)
		var before, after runtime.MemStats
		g := runtime.NumGoroutine()
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		d := admit(t, l, huge)
		el := time.Since(start)
		runtime.ReadMemStats(&after)
		if d.Reject == nil {
			t.Fatalf("a charge of 819200000010 tokens against 30000 TPM was admitted (in %v, %d bytes allocated)", el, after.TotalAlloc-before.TotalAlloc)
		}
		if el > time.Second {
			t.Errorf("took %v", el)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
			t.Errorf("allocated %d bytes", n)
		}
		if n := runtime.NumGoroutine(); n > g {
			t.Errorf("goroutines %d -> %d", g, n)
		}
		allocs := testing.AllocsPerRun(100, func() {
			if d, _ := l.Admit(ctx, huge); d.Reject == nil {
				panic("admitted")
			}
		})
		t.Logf("refused huge charge: %v allocs", allocs)
		if allocs > 16 {
			t.Errorf("a refused huge charge: %v allocs, want a small constant", allocs)
		}
	})

	t.Run("borrowed", func(t *testing.T) {
		// burst 0.0001: a bucket of 1000 and a per-minute limit of 10M; a charge of 10M
		// takes the bucket and borrows 9999000 (ten thousand buckets' worth).
		clock := newClock()
		l := newLimiter(t, Params{TokensPerMinute: 1e7, RequestsPerMinute: 1e6, Burst: 0.0001}, clock)
		big := chat("a", "chat", 1e7-100, 100)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		d := admit(t, l, big)
		runtime.ReadMemStats(&after)
		if d.Reject != nil {
			t.Fatalf("rejected: %v", d.Reject)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
			t.Errorf("allocated %d bytes", n)
		}
		d.Done(policy.Outcome{Status: 200, InputTokens: 1e7 - 100, OutputTokens: 100})
		clock.Advance(2 * time.Minute)
		allocs := testing.AllocsPerRun(50, ordinary(l, clock, big))
		t.Logf("borrowed charge of 10000 buckets: %v allocs", allocs)
		if allocs > max(base, 16) {
			t.Errorf("a borrowed charge of 10000 buckets: %v allocs, ordinary request %v", allocs, base)
		}
	})
}

// TestChargeSaturates: the up-front charge never overflows, whatever n, max_tokens, the
// prompt estimate or the params.
func TestChargeSaturates(t *testing.T) {
	const maxInt = math.MaxInt
	tests := []struct {
		name   string
		p      Params
		req    *policy.Request
		prompt int
		total  int
	}{
		{name: "ordinary", p: Params{TokensPerMinute: 1}, req: chatN("a", 100, 50, 2), prompt: 100, total: 200},
		{name: "n × cap", p: Params{TokensPerMinute: 1}, req: chatN("a", 10, 4096, 200000000), prompt: 10, total: 10 + 4096*200000000},
		{name: "2^31 × 2^31, no cap", p: Params{TokensPerMinute: 1, MaxTokensCap: -1}, req: chatN("a", 10, 1<<31, 1<<31), prompt: 10, total: 10 + 1<<62},
		{name: "2^32 × 2^32 wraps to 0", p: Params{TokensPerMinute: 1, MaxTokensCap: -1}, req: chatN("a", 10, 1<<32, 1<<32), prompt: 10, total: maxInt},
		{name: "2^62 prompt + 2^62 completion", p: Params{TokensPerMinute: 1, MaxTokensCap: -1}, req: chatN("a", 1<<62, 1<<31, 1<<31), prompt: 1 << 62, total: maxInt},
		{name: "max int prompt", p: Params{TokensPerMinute: 1}, req: chat("a", "chat", maxInt, 1), prompt: maxInt, total: maxInt},
		{name: "max int max_tokens × n, no cap", p: Params{TokensPerMinute: 1, MaxTokensCap: -1}, req: chatN("a", 1, maxInt, 3), prompt: 1, total: maxInt},
		{name: "huge default_max_tokens", p: Params{TokensPerMinute: 1, MaxTokensCap: -1, DefaultMaxTokens: maxInt}, req: chatN("a", 1, 0, 2), prompt: 1, total: maxInt},
		{name: "negative n counts as 1", p: Params{TokensPerMinute: 1}, req: chatN("a", 1, 10, -5), prompt: 1, total: 11},
		{name: "negative max_tokens takes the default", p: Params{TokensPerMinute: 1}, req: chat("a", "chat", 1, -7), prompt: 1, total: 257},
		{name: "negative prompt counts as 0", p: Params{TokensPerMinute: 1}, req: chat("a", "chat", -9, 10), prompt: 0, total: 10},
		{name: "Responses API: prompt + max_output_tokens", p: Params{TokensPerMinute: 1}, req: responses("a", 100, 500), prompt: 100, total: 600},
		{name: "Responses API: default and cap apply", p: Params{TokensPerMinute: 1}, req: responses("a", 100, 0), prompt: 100, total: 356},
		{name: "Responses API: capped", p: Params{TokensPerMinute: 1}, req: responses("a", 100, 1<<40), prompt: 100, total: 4196},
		{name: "embeddings: prompt only", p: Params{TokensPerMinute: 1}, req: &policy.Request{Request: &openai.Request{Kind: openai.KindEmbedding, PromptTokens: maxInt, N: 1 << 40}}, prompt: maxInt, total: maxInt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, tc.p, newClock())
			prompt, total := l.charge(tc.req)
			if prompt != tc.prompt || total != tc.total {
				t.Errorf("charge = %d, %d; want %d, %d", prompt, total, tc.prompt, tc.total)
			}
		})
	}
}

// TestResponsesAPICharged: a Responses request is charged its max_output_tokens up front and
// reconciled like chat.
func TestResponsesAPICharged(t *testing.T) {
	l := newLimiter(t, Params{TokensPerMinute: 60000}, newClock())
	d := admit(t, l, responses("a", 100, 500))
	if d.Reject != nil || d.Done == nil {
		t.Fatalf("decision = %+v", d)
	}
	if got := 60000 - tokens(t, l, "a"); got != 600 {
		t.Errorf("charged %v up front, want 600", got)
	}
	d.Done(policy.Outcome{Status: 200, InputTokens: 100, OutputTokens: 40})
	if got := 60000 - tokens(t, l, "a"); got != 140 {
		t.Errorf("after Done, used %v, want 140", got)
	}
	if st := l.Stats(); st.RefundedTokens != 460 {
		t.Errorf("stats = %+v", st)
	}
}

// TestSettlementSaturates: usage counts that overflow when added are charged as the largest
// charge, not wrapped into a refund, and the headers stay well formed afterwards.
func TestSettlementSaturates(t *testing.T) {
	clock := newClock()
	l := newLimiter(t, Params{TokensPerMinute: 60000, MaxWait: policy.Duration(time.Second)}, clock)
	d := admit(t, l, chat("a", "chat", 100, 100))
	d.Done(policy.Outcome{Status: 200, InputTokens: math.MaxInt, OutputTokens: math.MaxInt})
	st := l.Stats()
	// A usage report beyond maxSettledBuckets buckets is not believed: the debt is bounded
	// (minutes, not for ever).
	if st.RefundedTokens != 0 || st.ExtraTokens != maxSettledBuckets*60000 {
		t.Errorf("stats = %+v, want extra %d (the bound)", st, maxSettledBuckets*60000)
	}
	if got := tokens(t, l, "a"); got < -maxSettledBuckets*60000 || got > 0 {
		t.Errorf("tokens = %v, want in debt by at most %d", got, maxSettledBuckets*60000)
	}
	d = admit(t, l, chat("a", "chat", 1, 1))
	if d.Reject == nil || d.Reject.RetryAfter <= 0 {
		t.Fatalf("after the debt: %+v", d.Reject)
	}
	reset, err := time.ParseDuration(d.Header.Get(HeaderResetTokens))
	if err != nil || reset <= 0 {
		t.Errorf("reset = %q (%v)", d.Header.Get(HeaderResetTokens), err)
	}
	w := httptest.NewRecorder()
	openai.WriteError(w, d.Reject.OpenAI())
	if n, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64); err != nil || n <= 0 {
		t.Errorf("Retry-After = %q", w.Header().Get("Retry-After"))
	}
	if d.Header.Get(HeaderRemainingTokens) != "0" {
		t.Errorf("remaining = %q", d.Header.Get(HeaderRemainingTokens))
	}
	// Another tenant is not affected.
	if d := admit(t, l, chat("b", "chat", 1, 1)); d.Reject != nil {
		t.Errorf("another tenant: %v", d.Reject)
	}
}

// TestConcurrentNeverOverdraws: many goroutines charging one bucket at a standing clock, with
// charges below, above the bucket (debt, burst < 1) and too large. Rejections give back what
// they took, so the admitted total never exceeds the bucket, except for one borrowed charge
// admitted alone on a full bucket, and the bucket's level accounts for exactly what was admitted.
func TestConcurrentNeverOverdraws(t *testing.T) {
	for _, burst := range []float64{1, 0.1} {
		t.Run("burst "+strconv.FormatFloat(burst, 'f', -1, 64), func(t *testing.T) {
			clock := newClock()
			l := newLimiter(t, Params{TokensPerMinute: 10000, RequestsPerMinute: 1e6, Burst: burst, Per: PerGlobal}, clock)
			capTokens := float64(capacity(10000, burst))
			var admittedSum, admittedN, bigN atomic.Int64
			var wg sync.WaitGroup
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for i := 0; i < 300; i++ {
						var r *policy.Request
						switch rng.IntN(10) {
						case 0:
							r = chatN(strconv.Itoa(w), 10, 4096, 1+rng.IntN(1e9)) // too large
						case 1:
							r = chat(strconv.Itoa(w), "chat", 500+rng.IntN(5000), 1)
						default:
							r = chat(strconv.Itoa(w), "chat", 1+rng.IntN(300), 1)
						}
						d, err := l.Admit(context.Background(), r)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Reject == nil {
							c := int64(r.PromptTokens + 1)
							admittedSum.Add(c)
							admittedN.Add(1)
							if float64(c) > capTokens {
								bigN.Add(1)
							}
						}
						_ = d.Header.Get(HeaderRemainingTokens)
						if i%50 == 0 {
							_ = l.Snapshot()
						}
					}
				}()
			}
			wg.Wait()
			sum := float64(admittedSum.Load())
			if bigN.Load() > 0 && (bigN.Load() != 1 || admittedN.Load() != 1) {
				t.Errorf("a charge above the bucket was admitted with others: %d big of %d", bigN.Load(), admittedN.Load())
			}
			if bigN.Load() == 0 && sum > capTokens {
				t.Errorf("admitted %v tokens from a bucket of %v at a standing clock", sum, capTokens)
			}
			if got := tokens(t, l, ""); got != capTokens-sum {
				t.Errorf("tokens = %v, want %v - %v (every rejection given back)", got, capTokens, sum)
			}
			st := l.Stats()
			if st.Admitted != uint64(admittedN.Load()) {
				t.Errorf("stats = %+v", st)
			}
		})
	}
}

// TestTooLargeSkipsGlobal: a request too large for the local bucket never reaches the global
// service.
func TestTooLargeSkipsGlobal(t *testing.T) {
	rls, addr, _ := startRLS(t)
	l := newLimiter(t, Params{TokensPerMinute: 1000, Global: &Global{Address: addr, Timeout: policy.Duration(5 * time.Second), Hits: HitsTokens}}, newClock())
	if d := admit(t, l, chatN("a", 10, 4096, 200000000)); d.Reject == nil {
		t.Fatal("admitted")
	}
	if rls.lastRequest() != nil || l.Stats().GlobalCalls != 0 {
		t.Errorf("the global service was asked: %v", rls.lastRequest())
	}
	if d := admit(t, l, chat("a", "chat", 100, 100)); d.Reject != nil {
		t.Fatal(d.Reject)
	}
	if got := rls.lastRequest().GetHitsAddend(); got != 200 {
		t.Errorf("hits = %d, want 200", got)
	}
}
