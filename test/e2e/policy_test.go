package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

// Policy end-to-end tests: the prompt guard (policy/guard) and the rate limits
// (policy/ratelimit) as a user meets them, through the gateway to the simulator.

const (
	keyA = "sk-e2e-team-a-0123456789"
	keyB = "sk-e2e-team-b-0123456789"
)

// withTenants sets the tenants' keys in the environment (t.Setenv: not parallel) and returns
// the config's tenants section.
func withTenants(t *testing.T) string {
	t.Helper()
	t.Setenv("SLUICE_E2E_KEYS_A", keyA)
	t.Setenv("SLUICE_E2E_KEYS_B", "sk-e2e-team-b-unused, "+keyB)
	return "tenants:\n  - {name: team-a, keys_env: SLUICE_E2E_KEYS_A}\n  - {name: team-b, keys_env: SLUICE_E2E_KEYS_B, priority: 1}\n"
}

// explosion is a chat prompt of about 6,000 tokens: far over a 2,000-token limit, so the
// estimate decides (no exact count).
var explosion = strings.Repeat("Summarise every clause of the attached contract, including the annexes. ", 600)

func userChat(content string, maxTokens int64) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    "sim-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)},
	}
	if maxTokens > 0 {
		p.MaxTokens = openai.Int(maxTokens)
	}
	return p
}

// apiErrOf asserts that err is the client's *openai.Error with the given status and code.
func apiErrOf(t *testing.T, err error, status int, code string) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !asAPIError(err, &e) {
		t.Fatalf("got %v, want an API error %d %s", err, status, code)
	}
	if e.StatusCode != status || e.Code != code {
		t.Fatalf("got %d %q (%s), want %d %q", e.StatusCode, e.Code, e.Message, status, code)
	}
	return e
}

// streamTTFT streams a short chat and returns the time to its first content chunk, as the
// client sees it.
func streamTTFT(ctx context.Context, c openai.Client, i int) (time.Duration, error) {
	start := time.Now()
	st := c.Chat.Completions.NewStreaming(ctx, userChat(fmt.Sprint("status of order ", i), 6))
	defer st.Close()
	var ttft time.Duration
	for st.Next() {
		if ch := st.Current(); ttft == 0 && len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			ttft = time.Since(start)
		}
	}
	if err := st.Err(); err != nil {
		return 0, err
	}
	if ttft == 0 {
		return 0, errors.New("stream without content")
	}
	return ttft, nil
}

func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(math.Ceil(0.99*float64(len(s))))-1]
}

// breakerStates reads /admin/breakers: tenant -> state for route.
func breakerStates(t *testing.T, hc *http.Client, admin, route string) map[string]string {
	t.Helper()
	resp, body := do(t, hc, http.MethodGet, "http://"+admin+"/admin/breakers", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/breakers: %d %s", resp.StatusCode, body)
	}
	var out struct {
		Routes []struct {
			Route    string `json:"route"`
			Level    int    `json:"level"`
			Breakers []struct {
				Route, Tenant, State string
				Failures             uint32
			} `json:"breakers"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("/admin/breakers: %v: %s", err, body)
	}
	m := map[string]string{}
	for _, r := range out.Routes {
		if r.Route != route {
			continue
		}
		for _, b := range r.Breakers {
			m[b.Tenant] = b.State
		}
	}
	return m
}

// TestPolicyTenantIsolation: one tenant sends a burst of exploding prompts while another
// streams normal traffic. The first is cut off by its breaker within min_requests+1 requests
// and recovers by itself after the open period; the second keeps a 100% success rate and its
// p99 TTFT.
func TestPolicyTenantIsolation(t *testing.T) {
	tenants := withTenants(t)
	s := startSim(t, sim.Config{TTFT: 20 * time.Millisecond})
	const minRequests = 3
	g := startGateway(t, oneRoute("", fmt.Sprintf(`    policies:
      - type: guard
        params:
          max_prompt_tokens: 2000
          breaker: {min_requests: %d, failure_ratio: 0.5, open_for: 1s}
`, minRequests), s.URL)+tenants)
	a := newClient(t, g.addr, option.WithAPIKey(keyA))
	b := newClient(t, g.addr, option.WithAPIKey(keyB))
	hc := newHTTPClient(t)
	ctx := testCtx(t)

	// explode sends oversized prompts as team-a until the breaker cuts it off; it returns how
	// many got 413 before the first 503.
	explode := func(t *testing.T) int {
		t.Helper()
		for i := range minRequests + 3 {
			_, err := a.Chat.Completions.New(ctx, userChat(explosion, 16))
			var e *openai.Error
			if !asAPIError(err, &e) {
				t.Fatalf("oversized prompt %d: %v, want an API error", i, err)
			}
			switch e.Code {
			case "prompt_too_large":
				if e.StatusCode != http.StatusRequestEntityTooLarge {
					t.Fatalf("prompt_too_large with status %d", e.StatusCode)
				}
				var n int
				if _, err := fmt.Sscanf(e.Message, "prompt is %d tokens, the route's limit is 2000", &n); err != nil || n <= 2000 {
					t.Fatalf("message %q does not name the value and the limit", e.Message)
				}
			case "tenant_breaker_open":
				if e.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("tenant_breaker_open with status %d", e.StatusCode)
				}
				ra, err := strconv.Atoi(e.Response.Header.Get("Retry-After"))
				if err != nil || ra < 1 || ra > 1 {
					t.Fatalf("Retry-After = %q, want 1 (the open period, rounded up)", e.Response.Header.Get("Retry-After"))
				}
				return i
			default:
				t.Fatalf("oversized prompt %d: %d %s: %s", i, e.StatusCode, e.Code, e.Message)
			}
		}
		t.Fatalf("not cut off after %d oversized prompts", minRequests+3)
		return 0
	}

	// Baseline: team-b's TTFT before the burst.
	var base []time.Duration
	for i := range 20 {
		d, err := streamTTFT(ctx, b, i)
		if err != nil {
			t.Fatalf("baseline request %d: %v", i, err)
		}
		base = append(base, d)
	}

	// team-b streams concurrently with team-a's burst.
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		during []time.Duration
		bErrs  []error
		stop   = make(chan struct{})
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 300; i++ {
			select {
			case <-stop:
				if i >= 20 {
					return
				}
			default:
			}
			d, err := streamTTFT(ctx, b, i)
			mu.Lock()
			if err != nil {
				bErrs = append(bErrs, err)
			} else {
				during = append(during, d)
			}
			mu.Unlock()
		}
	}()
	tripped := time.Now()
	n413 := explode(t)
	if n413 > minRequests+1 {
		t.Errorf("cut off after %d oversized prompts, want at most %d", n413, minRequests+1)
	}
	// While open, team-a is refused whatever it sends; team-b is untouched.
	_, err := a.Chat.Completions.New(ctx, userChat("a normal question", 4))
	apiErrOf(t, err, http.StatusServiceUnavailable, "tenant_breaker_open")
	if st := breakerStates(t, hc, g.admin, "all"); st["team-a"] != "open" || st["team-b"] != "closed" {
		t.Errorf("/admin/breakers during the burst: %v, want team-a open and team-b closed", st)
	}
	if v := metricValue(t, hc, g.admin, "sluice_guard_breakers_open", `route="all"`); v != 1 {
		t.Errorf("sluice_guard_breakers_open during the burst = %v, want 1 (team-a)", v)
	}
	close(stop)
	wg.Wait()
	if len(bErrs) > 0 {
		t.Fatalf("team-b: %d of %d requests failed during team-a's burst; first: %v", len(bErrs), len(bErrs)+len(during), bErrs[0])
	}
	bp, dp := p99(base), p99(during)
	t.Logf("team-a cut off after %d oversized prompts; team-b p99 TTFT %v before, %v during (%d requests)", n413, bp, dp, len(during))
	if dp > 2*bp+50*time.Millisecond {
		t.Errorf("team-b p99 TTFT rose from %v to %v during team-a's burst", bp, dp)
	}

	// Recovery by itself: after open_for, team-a's normal requests are probes, then pass.
	var firstOK time.Time
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatalf("team-a did not recover within 200 polls (%v)", time.Since(tripped))
		}
		_, err := a.Chat.Completions.New(ctx, userChat("a normal question", 4))
		if err == nil {
			if firstOK.IsZero() {
				firstOK = time.Now()
			}
			if breakerStates(t, hc, g.admin, "all")["team-a"] == "closed" {
				break
			}
			continue
		}
		if !firstOK.IsZero() {
			t.Fatalf("team-a refused after its breaker let probes through: %v", err)
		}
		apiErrOf(t, err, http.StatusServiceUnavailable, "tenant_breaker_open")
		time.Sleep(50 * time.Millisecond)
	}
	if d := firstOK.Sub(tripped); d > 10*time.Second {
		t.Errorf("team-a recovered only after %v (open_for 1s)", d)
	}

	t.Run("admin reset closes the breaker at once", func(t *testing.T) {
		explode(t)
		if st := breakerStates(t, hc, g.admin, "all"); st["team-a"] != "open" {
			t.Fatalf("team-a's breaker is %q after a second burst", st["team-a"])
		}
		resp, body := do(t, hc, http.MethodPost, "http://"+g.admin+"/admin/breakers/reset?tenant=team-a&route=all", "")
		var reset struct{ Reset int }
		if err := json.Unmarshal(body, &reset); err != nil || resp.StatusCode != http.StatusOK || reset.Reset != 1 {
			t.Fatalf("reset: %d %s", resp.StatusCode, body)
		}
		if _, err := a.Chat.Completions.New(ctx, userChat("a normal question", 4)); err != nil {
			t.Fatalf("team-a right after the reset: %v", err)
		}
		if st := breakerStates(t, hc, g.admin, "all"); st["team-a"] != "closed" || st["team-b"] != "closed" {
			t.Errorf("/admin/breakers after the reset: %v", st)
		}
		resp, body = do(t, hc, http.MethodPost, "http://"+g.admin+"/admin/breakers/reset?route=nope", "")
		checkErrorShape(t, resp, body, http.StatusNotFound, "unknown_route")
	})

	t.Run("metrics", func(t *testing.T) {
		if v := metricValue(t, hc, g.admin, "sluice_guard_rejections_total", `code="prompt_too_large"`, `route="all"`); v < 2*minRequests {
			t.Errorf(`sluice_guard_rejections_total{code="prompt_too_large",route="all"} = %v, want at least %d`, v, 2*minRequests)
		}
		if v := metricValue(t, hc, g.admin, "sluice_guard_rejections_total", `code="tenant_breaker_open"`, `route="all"`); v < 3 {
			t.Errorf(`sluice_guard_rejections_total{code="tenant_breaker_open"} = %v, want at least 3`, v)
		}
		if v := metricValue(t, hc, g.admin, "sluice_guard_breaker_trips_total", `route="all"`); v < 2 {
			t.Errorf(`sluice_guard_breaker_trips_total = %v, want at least 2`, v)
		}
	})
}

// startGatewayConfig is startGateway for a config built in code.
func startGatewayConfig(t *testing.T, cfg *config.Config) *gateway {
	t.Helper()
	return serveGateway(t, cfg, gatewayOpts{})
}

// TestPolicyShapeSignals: the guard's shape and size signals through the gateway, with the
// default guard of `sluice serve --upstream URL` and with configured limits.
func TestPolicyShapeSignals(t *testing.T) {
	s := startSim(t, sim.Config{})
	ctx := testCtx(t)

	t.Run("default guard: depth over 64", func(t *testing.T) {
		cfg, err := config.FromUpstreams("127.0.0.1:0", "127.0.0.1:0", []string{s.URL}, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(cfg.Routes[0].Policies) != 0 {
			t.Fatalf("the --upstream config has policies: %v", cfg.Routes[0].Policies)
		}
		g := startGatewayConfig(t, cfg)
		c := newClient(t, g.addr)
		nest := func(n int) string { return strings.Repeat("[", n) + `"x"` + strings.Repeat("]", n) }
		for _, tc := range []struct {
			content string
			depth   int
		}{
			// Ordinary agent traffic passes: a nested tool result, a pasted API response.
			{`{"orders":[{"items":[{"sku":"a","qty":1}]}]}`, 6},
			{"Process this: " + nest(24), 25},
			{nest(63), 64},
			// Structure meant to blow up templates and tokenizers does not, wherever it is.
			{nest(64), 65},
			{"Process this: " + nest(100) + " thanks", 101},
			{"```json\n" + nest(200) + "\n```", 201},
		} {
			_, err := c.Chat.Completions.New(ctx, userChat(tc.content, 4))
			if tc.depth <= 64 {
				if err != nil {
					t.Errorf("depth %d: %v", tc.depth, err)
				}
				continue
			}
			e := apiErrOf(t, err, http.StatusBadRequest, "prompt_too_deep")
			if want := fmt.Sprintf("nested %d levels deep, the route's limit is 64", tc.depth); !strings.Contains(e.Message, want) {
				t.Errorf("depth %d: message %q lacks %q", tc.depth, e.Message, want)
			}
		}
		// A deep tool result in a tool message is message content too. (Clients behind one
		// peer address are not cut off by each other's refusals: no breaker without
		// trusted proxies, so these refusals never reach one.)
		_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "sim-llama",
			Messages: []openai.ChatCompletionMessageParamUnion{
				openai.UserMessage("look it up"),
				openai.ToolMessage("The result: "+nest(80), "call_1"),
			},
			MaxTokens: openai.Int(4),
		})
		apiErrOf(t, err, http.StatusBadRequest, "prompt_too_deep")
		if _, err := c.Chat.Completions.New(ctx, userChat("an ordinary prompt", 4)); err != nil {
			t.Errorf("after refusals, an ordinary prompt from the same address: %v", err)
		}
	})

	t.Run("configured: max_messages and context window", func(t *testing.T) {
		g := startGateway(t, oneRoute("", `    policies:
      - type: guard
        params: {max_messages: 3, context_windows: {"sim-*": 4096}}
`, s.URL))
		c := newClient(t, g.addr)
		msgs := func(n int) []openai.ChatCompletionMessageParamUnion {
			out := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief")}
			for i := 1; i < n; i++ {
				if i%2 == 1 {
					out = append(out, openai.UserMessage(fmt.Sprint("question ", i)))
				} else {
					out = append(out, openai.AssistantMessage(fmt.Sprint("answer ", i)))
				}
			}
			return out
		}
		if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "sim-llama", Messages: msgs(3), MaxTokens: openai.Int(4)}); err != nil {
			t.Errorf("3 messages (the limit): %v", err)
		}
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "sim-llama", Messages: msgs(4), MaxTokens: openai.Int(4)})
		e := apiErrOf(t, err, http.StatusBadRequest, "too_many_messages")
		if !strings.Contains(e.Message, "request has 4 messages, the route's limit is 3") {
			t.Errorf("message %q", e.Message)
		}

		prompt := strings.Repeat("Compare the two quarterly reports line by line. ", 40) // ~400 tokens
		if _, err := c.Chat.Completions.New(ctx, userChat(prompt, 100)); err != nil {
			t.Errorf("prompt + max_tokens within the window: %v", err)
		}
		// Over the window: vLLM's 400 and its words, which the SDKs and LangChain recognise.
		_, err = c.Chat.Completions.New(ctx, userChat(prompt, 3900))
		e = apiErrOf(t, err, http.StatusBadRequest, "context_length_exceeded")
		var sum, tokens, completion int
		if _, err := fmt.Sscanf(e.Message, "This model's maximum context length is 4096 tokens. However, you requested %d tokens (%d in the messages, %d in the completion).", &sum, &tokens, &completion); err != nil ||
			sum != tokens+3900 || completion != 3900 || sum <= 4096 || e.Param != "messages" || e.Type != "invalid_request_error" {
			t.Errorf("error %+v does not name the value and the limit as vLLM does", e)
		}
		_, err = c.Chat.Completions.New(ctx, userChat("hi", 5000))
		e = apiErrOf(t, err, http.StatusBadRequest, "context_length_exceeded")
		if !strings.Contains(e.Message, "This model's maximum context length is 4096 tokens. However, you requested") {
			t.Errorf("message %q", e.Message)
		}
	})
}

// rlHeaders are the x-ratelimit-* headers of a response, parsed; it fails the test when one
// is missing or malformed.
type rlHeaders struct {
	limitReq, remReq, limitTok, remTok int
	resetReq, resetTok                 time.Duration
}

func parseRL(t *testing.T, h http.Header) rlHeaders {
	t.Helper()
	num := func(name string) int {
		v, err := strconv.Atoi(h.Get(name))
		if err != nil || v < 0 {
			t.Fatalf("%s = %q, want a count", name, h.Get(name))
		}
		return v
	}
	dur := func(name string) time.Duration {
		d, err := time.ParseDuration(h.Get(name))
		if err != nil || d < 0 || d > time.Minute {
			t.Fatalf("%s = %q, want a duration in [0, 1m]", name, h.Get(name))
		}
		return d
	}
	return rlHeaders{
		limitReq: num("X-Ratelimit-Limit-Requests"), remReq: num("X-Ratelimit-Remaining-Requests"),
		limitTok: num("X-Ratelimit-Limit-Tokens"), remTok: num("X-Ratelimit-Remaining-Tokens"),
		resetReq: dur("X-Ratelimit-Reset-Requests"), resetTok: dur("X-Ratelimit-Reset-Tokens"),
	}
}

// rateLimits reads /admin/ratelimits: the first limiter's stats and its keys' buckets.
type rateLimits struct {
	Stats struct {
		Admitted       uint64            `json:"admitted"`
		Rejected       map[string]uint64 `json:"rejected"`
		RefundedTokens uint64            `json:"refunded_tokens"`
		ExtraTokens    uint64            `json:"extra_tokens"`
	} `json:"stats"`
	Keys []struct {
		Key      string `json:"key"`
		Requests *struct {
			Remaining float64 `json:"remaining"`
		} `json:"requests"`
		Tokens *struct {
			Capacity  int     `json:"capacity"`
			Remaining float64 `json:"remaining"`
		} `json:"tokens"`
	} `json:"keys"`
}

func readRateLimits(t *testing.T, hc *http.Client, admin string) rateLimits {
	t.Helper()
	resp, body := do(t, hc, http.MethodGet, "http://"+admin+"/admin/ratelimits", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/ratelimits: %d %s", resp.StatusCode, body)
	}
	var out struct {
		Limiters []rateLimits `json:"limiters"`
	}
	if err := json.Unmarshal(body, &out); err != nil || len(out.Limiters) != 1 {
		t.Fatalf("/admin/ratelimits: %v: %s", err, body)
	}
	return out.Limiters[0]
}

// TestPolicyRateLimits: requests and tokens per minute per tenant through the gateway, the
// x-ratelimit-* headers, reconciliation of a streamed request's token charge, require_auth.
func TestPolicyRateLimits(t *testing.T) {
	tenants := withTenants(t)
	s := startSim(t, sim.Config{MaxTokensDefault: 8})
	ctx := testCtx(t)
	hc := newHTTPClient(t)

	t.Run("requests per minute", func(t *testing.T) {
		g := startGateway(t, oneRoute("", `    policies:
      - {type: ratelimit, params: {requests_per_minute: 5, tokens_per_minute: 100000}}
`, s.URL)+tenants)
		a := newClient(t, g.addr, option.WithAPIKey(keyA))
		b := newClient(t, g.addr, option.WithAPIKey(keyB))
		prevReq := 5
		for i := range 6 {
			var resp *http.Response
			_, err := a.Chat.Completions.New(ctx, userChat(fmt.Sprint("question ", i), 8), option.WithResponseInto(&resp))
			if i < 5 {
				if err != nil {
					t.Fatalf("request %d of 5: %v", i+1, err)
				}
			} else {
				e := apiErrOf(t, err, http.StatusTooManyRequests, "rate_limit_exceeded")
				resp = e.Response
				ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
				if err != nil || ra < 1 || ra > 12 {
					t.Errorf("Retry-After = %q, want 1..12 (one request every 12s)", resp.Header.Get("Retry-After"))
				}
				if !strings.Contains(e.Message, "requests per min (RPM) for tenant team-a: Limit 5") {
					t.Errorf("429 message %q", e.Message)
				}
			}
			h := parseRL(t, resp.Header)
			if h.limitReq != 5 || h.limitTok != 100000 {
				t.Errorf("request %d: limits %d requests, %d tokens", i+1, h.limitReq, h.limitTok)
			}
			wantReq := max(4-i, 0)
			if h.remReq != wantReq {
				t.Errorf("request %d: remaining requests %d, want %d", i+1, h.remReq, wantReq)
			}
			// Requests only go down within the minute; tokens refill continuously (100000 a
			// minute is 1.7 a millisecond) and the previous answer's charge is reconciled, so
			// they only have to stay below the limit.
			if i < 5 && (h.remTok >= 100000 || h.remReq >= prevReq) {
				t.Errorf("request %d: remaining %d requests / %d tokens, not below %d / 100000", i+1, h.remReq, h.remTok, prevReq)
			}
			if h.resetReq <= 0 || h.resetReq > 60*time.Second {
				t.Errorf("request %d: reset-requests %v", i+1, h.resetReq)
			}
			prevReq = h.remReq
		}
		// The other tenant's budget is its own.
		var resp *http.Response
		if _, err := b.Chat.Completions.New(ctx, userChat("question", 8), option.WithResponseInto(&resp)); err != nil {
			t.Fatalf("team-b after team-a's budget ran out: %v", err)
		}
		if h := parseRL(t, resp.Header); h.remReq != 4 {
			t.Errorf("team-b: remaining requests %d, want 4", h.remReq)
		}
		rl := readRateLimits(t, hc, g.admin)
		if rl.Stats.Rejected["requests"] != 1 || len(rl.Keys) != 2 || rl.Keys[0].Key != "team-a" || rl.Keys[1].Key != "team-b" {
			t.Errorf("/admin/ratelimits: %+v", rl)
		}
		if v := metricValue(t, hc, g.admin, "sluice_ratelimit_rejections_total", `reason="requests"`, `route="all"`); v != 1 {
			t.Errorf(`sluice_ratelimit_rejections_total{reason="requests"} = %v, want 1`, v)
		}
	})

	t.Run("the upstream's own x-ratelimit headers do not replace the tenant's", func(t *testing.T) {
		// A hosted upstream (OpenAI, Azure) sends the limits of the gateway's own key.
		up := startRecorder(t, func(w http.ResponseWriter, _ *http.Request) {
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set("X-Ratelimit-Limit-Requests", "10000")
			h.Set("X-Ratelimit-Remaining-Requests", "9999")
			h.Set("X-Ratelimit-Limit-Tokens", "2000000")
			h.Set("X-Ratelimit-Remaining-Tokens", "1999000")
			h.Set("X-Ratelimit-Reset-Requests", "6ms")
			h.Set("X-Ratelimit-Reset-Tokens", "30ms")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"rec","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		})
		g := startGateway(t, oneRoute("", `    policies:
      - {type: ratelimit, params: {requests_per_minute: 5, tokens_per_minute: 100000}}
`, up.URL)+tenants)
		a := newClient(t, g.addr, option.WithAPIKey(keyA))
		for i := range 2 {
			var resp *http.Response
			if _, err := a.Chat.Completions.New(ctx, userChat("hi", 8), option.WithResponseInto(&resp)); err != nil {
				t.Fatal(err)
			}
			h := parseRL(t, resp.Header)
			if h.limitReq != 5 || h.remReq != 4-i || h.limitTok != 100000 || h.remTok >= 100000 {
				t.Errorf("request %d: the client sees %+v, want its tenant's limits (5 requests, 100000 tokens)", i+1, h)
			}
			if n := len(resp.Header.Values("X-Ratelimit-Remaining-Requests")); n != 1 {
				t.Errorf("request %d: %d x-ratelimit-remaining-requests headers", i+1, n)
			}
		}
	})

	t.Run("tokens per minute: streaming usage reconciled", func(t *testing.T) {
		const tpm = 600 // 10 tokens a second: little refill while the test runs
		g := startGateway(t, oneRoute("", fmt.Sprintf(`    policies:
      - {type: ratelimit, params: {tokens_per_minute: %d}}
`, tpm), s.URL)+tenants)
		a := newClient(t, g.addr, option.WithAPIKey(keyA))
		// No max_tokens: the limiter charges default_max_tokens (256) up front; the simulator
		// writes at most 8 tokens.
		params := userChat("What is the status of order A-1042?", 0)
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := func() (remaining int, used int64) {
			var resp *http.Response
			st := a.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&resp))
			defer st.Close()
			var usage openai.CompletionUsage
			for st.Next() {
				if c := st.Current(); c.Usage.TotalTokens > 0 {
					usage = c.Usage
				}
			}
			if err := st.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if usage.PromptTokens == 0 || usage.CompletionTokens == 0 {
				t.Fatalf("no usage chunk: %+v", usage)
			}
			return parseRL2(t, resp.Header), usage.PromptTokens + usage.CompletionTokens
		}
		start := time.Now()
		rem1, used := stream()
		charge := tpm - rem1 // the bucket was full
		if charge < 256 {
			t.Fatalf("up-front charge %d, want at least default_max_tokens (256)", charge)
		}
		eventually(t, 5*time.Second, "the stream's charge is reconciled", func() bool {
			return readRateLimits(t, hc, g.admin).Stats.RefundedTokens > 0
		})
		rl := readRateLimits(t, hc, g.admin)
		refill := func() float64 { return tpm / 60 * time.Since(start).Seconds() }
		if len(rl.Keys) != 1 || rl.Keys[0].Key != "team-a" || rl.Keys[0].Tokens == nil {
			t.Fatalf("/admin/ratelimits: %+v", rl)
		}
		got, want := rl.Keys[0].Tokens.Remaining, float64(tpm-int(used))
		if got < want-1 || got > want+refill()+1 {
			t.Errorf("after the stream: %v tokens remain, want %v (capacity %d - usage %d) + refill; unreconciled it would be %d",
				got, want, tpm, used, rem1)
		}
		if got := rl.Stats.RefundedTokens; got != uint64(charge)-uint64(used) {
			t.Errorf("refunded %d tokens, want the charge %d - usage %d", got, charge, used)
		}
		// The next response's header: the real usage of the first, the charge of the second.
		rem2, _ := stream()
		lo := float64(tpm - int(used) - charge)
		if f := float64(rem2); f < lo-1 || f > lo+refill()+1 {
			t.Errorf("next response: x-ratelimit-remaining-tokens %d, want %v + refill (capacity %d - usage %d - charge %d)", rem2, lo, tpm, used, charge)
		}
	})

	t.Run("require_auth", func(t *testing.T) {
		g := startGateway(t, oneRoute("", `    policies:
      - {type: ratelimit, params: {require_auth: true, requests_per_minute: 100}}
`, s.URL)+tenants)
		resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", chatBody)
		e := checkErrorShape(t, resp, body, http.StatusUnauthorized, "invalid_api_key")
		if !strings.Contains(e.Error.Message, "didn't provide an API key") {
			t.Errorf("401 message %q", e.Error.Message)
		}
		unknown := newClient(t, g.addr, option.WithAPIKey("sk-not-a-tenant"))
		_, err := unknown.Chat.Completions.New(ctx, userChat("hi", 4))
		ae := apiErrOf(t, err, http.StatusUnauthorized, "invalid_api_key")
		if strings.Contains(ae.Message, "sk-not-a-tenant") {
			t.Errorf("the 401 quotes the key: %q", ae.Message)
		}
		if strings.Contains(g.logs.String(), "sk-not-a-tenant") || strings.Contains(g.logs.String(), keyA) {
			t.Errorf("the gateway logged an API key")
		}
		a := newClient(t, g.addr, option.WithAPIKey(keyA))
		if _, err := a.Chat.Completions.New(ctx, userChat("hi", 4)); err != nil {
			t.Fatalf("with team-a's key: %v", err)
		}
		if v := metricValue(t, hc, g.admin, "sluice_ratelimit_rejections_total", `reason="unauthenticated"`); v != 2 {
			t.Errorf(`sluice_ratelimit_rejections_total{reason="unauthenticated"} = %v, want 2`, v)
		}
	})
}

func parseRL2(t *testing.T, h http.Header) int {
	t.Helper()
	v, err := strconv.Atoi(h.Get("X-Ratelimit-Remaining-Tokens"))
	if err != nil {
		t.Fatalf("X-Ratelimit-Remaining-Tokens = %q", h.Get("X-Ratelimit-Remaining-Tokens"))
	}
	if h.Get("X-Ratelimit-Limit-Tokens") != "600" || h.Get("X-Ratelimit-Reset-Tokens") == "" {
		t.Fatalf("token headers: %v", h)
	}
	return v
}

// TestPolicyConfigErrors: a policy of unknown type and guard params with an unknown key are
// rejected with their path, by proxy.New and by a reload (the old config keeps serving).
func TestPolicyConfigErrors(t *testing.T) {
	s := startSim(t, sim.Config{})
	bad := []struct {
		name, policies, want string
	}{
		{"unknown type", "      - {type: nope}\n", `routes[0].policies[0] (nope): unknown policy type "nope"`},
		{"unknown guard param", "      - {type: guard, params: {max_promt_tokens: 100}}\n", `routes[0].policies[0] (guard): `},
		{"second policy", "      - {type: ratelimit, params: {requests_per_minute: 5}}\n      - {type: guard, params: {breaker: {min_request: 3}}}\n", `routes[0].policies[1] (guard): `},
	}
	for _, tc := range bad {
		t.Run("New/"+tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(oneRoute("", "    policies:\n"+tc.policies, s.URL)))
			if err != nil {
				t.Fatalf("config.Parse: %v", err)
			}
			srv, err := proxy.New(proxy.Options{Config: cfg, Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				_ = srv.Shutdown(context.Background())
				t.Fatal("proxy.New accepted the config")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if strings.Contains(tc.name, "param") && !strings.Contains(err.Error(), "max_promt_tokens") {
				t.Errorf("error %q does not name the unknown key", err)
			}
		})
	}

	t.Run("reload", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "sluice.yaml")
		good := oneRoute("", "    policies:\n      - {type: guard, params: {max_messages: 2}}\n", s.URL)
		g := startGateway(t, good, gatewayOpts{configPath: path, watchInterval: time.Hour})
		c := newClient(t, g.addr)
		hc := newHTTPClient(t)
		ctx := testCtx(t)
		version := g.srv.Config().Version
		for _, tc := range bad {
			writeFileAtomic(t, path, oneRoute("", "    policies:\n"+tc.policies, s.URL))
			err := g.srv.Reload()
			var ve *config.ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: Reload = %v, want a ValidationError with %q", tc.name, err, tc.want)
			}
			resp, body := do(t, hc, http.MethodPost, "http://"+g.admin+"/admin/reload", "")
			if e := checkErrorShape(t, resp, body, http.StatusBadRequest, "invalid_config"); !strings.Contains(e.Error.Message, tc.want) {
				t.Errorf("%s: /admin/reload message %q lacks %q", tc.name, e.Error.Message, tc.want)
			}
			if g.srv.Config().Version != version {
				t.Fatalf("%s: a bad config was swapped in", tc.name)
			}
			// The old config, guard included, keeps serving.
			if _, err := c.Chat.Completions.New(ctx, userChat("hi", 4)); err != nil {
				t.Fatalf("%s: after the failed reload: %v", tc.name, err)
			}
			_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "sim-llama", MaxTokens: openai.Int(4),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("1"), openai.AssistantMessage("2"), openai.UserMessage("3")}})
			apiErrOf(t, err, http.StatusBadRequest, "too_many_messages")
		}
	})
}
