package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

// routingUpstream is a simulator behind a wrapper that counts its API requests and can force
// a simulator knob on every one of them (the gateway forwards the client's headers to every
// candidate, so a knob meant for one upstream only is set here, not by the client).
type routingUpstream struct {
	*sim.Server
	URL      string
	requests atomic.Int64 // API requests (not health checks)
	status   atomic.Int32 // when not 0: every API request is answered with this status
	dieAfter int          // >= 0: every stream is killed after this many events
}

func startRoutingUpstream(t *testing.T, cfg sim.Config, dieAfter int) *routingUpstream {
	t.Helper()
	u := &routingUpstream{Server: sim.New(cfg), dieAfter: dieAfter}
	t.Cleanup(u.Close)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			u.requests.Add(1)
			if s := u.status.Load(); s != 0 {
				r.Header.Set(sim.HeaderStatus, strconv.Itoa(int(s)))
			}
			if u.dieAfter >= 0 {
				r.Header.Set(sim.HeaderDieAfter, strconv.Itoa(u.dieAfter))
			}
		}
		u.Server.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	u.URL = ts.URL
	return u
}

// routingCluster is the YAML of a cluster of one endpoint without health checks or passive
// ejection, so that only the route's breakers and fallback act on failures.
func routingCluster(name, url string) string {
	return fmt.Sprintf("  - {name: %s, endpoints: [{url: %s}], health_check: {disabled: true}, outlier: {disabled: true}}\n", name, url)
}

// routingConfig is a gateway config with the given clusters (name, URL pairs) and routes YAML.
func routingConfig(routes string, clusters ...string) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n")
	for i := 0; i+1 < len(clusters); i += 2 {
		b.WriteString(routingCluster(clusters[i], clusters[i+1]))
	}
	b.WriteString("routes:\n")
	b.WriteString(routes)
	return b.String()
}

// routed is where the gateway sent one request, from its response headers.
type routed struct {
	upstream string
	attempts int
}

func routedOf(resp *http.Response) routed {
	if resp == nil {
		return routed{}
	}
	n, _ := strconv.Atoi(resp.Header.Get("X-Sluice-Attempts"))
	return routed{upstream: resp.Header.Get("X-Sluice-Upstream"), attempts: n}
}

func routingParams(content string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "sim-llama",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// routingAsk sends one non-streaming chat request through the official client and returns
// where it was served.
func routingAsk(ctx context.Context, c openai.Client, opts ...option.RequestOption) (routed, error) {
	var resp *http.Response
	_, err := c.Chat.Completions.New(ctx, routingParams("hello", 2), append(opts, option.WithResponseInto(&resp))...)
	return routedOf(resp), err
}

// routingStream sends one streaming chat request and returns where it was served and the
// accumulated answer.
func routingStream(ctx context.Context, c openai.Client, params openai.ChatCompletionNewParams, opts ...option.RequestOption) (routed, openai.ChatCompletionAccumulator, error) {
	var resp *http.Response
	st := c.Chat.Completions.NewStreaming(ctx, params, append(opts, option.WithResponseInto(&resp))...)
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	err := st.Err()
	_ = st.Close()
	return routedOf(resp), acc, err
}

// routeState is one route of GET /admin/routes.
type routeState struct {
	Route string `json:"route"`
	State struct {
		Splits []struct {
			Name     string `json:"name"`
			Cluster  string `json:"cluster"`
			Weight   int    `json:"weight"`
			GrayFlag string `json:"gray_flag"`
		} `json:"splits"`
		Budget struct {
			Requests int64 `json:"requests"`
			Clusters []struct {
				Cluster          string `json:"cluster"`
				Sent             int64  `json:"sent"`
				Retries          int64  `json:"retries"`
				RetriesAllowed   int64  `json:"retries_allowed"`
				Fallbacks        int64  `json:"fallbacks"`
				FallbacksAllowed int64  `json:"fallbacks_allowed"`
			} `json:"clusters"`
			Exhausted map[string]int64 `json:"exhausted"`
		} `json:"budget"`
		Breakers []struct {
			Cluster string `json:"cluster"`
			State   string `json:"state"`
			Trips   uint64 `json:"trips"`
		} `json:"breakers"`
	} `json:"state"`
}

func adminRoute(t *testing.T, hc *http.Client, admin, name string) routeState {
	t.Helper()
	resp, body := do(t, hc, http.MethodGet, "http://"+admin+"/admin/routes", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/routes: %d %s", resp.StatusCode, body)
	}
	var out struct {
		Routes []routeState `json:"routes"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("GET /admin/routes: %v: %s", err, body)
	}
	for _, r := range out.Routes {
		if r.Route == name {
			return r
		}
	}
	t.Fatalf("GET /admin/routes has no route %q: %s", name, body)
	return routeState{}
}

// clusterBreaker returns the state and trips of a cluster's breaker on the route.
func clusterBreaker(t *testing.T, hc *http.Client, admin, route, cluster string) (string, uint64) {
	t.Helper()
	for _, b := range adminRoute(t, hc, admin, route).State.Breakers {
		if b.Cluster == cluster {
			return b.State, b.Trips
		}
	}
	t.Fatalf("route %q has no breaker for cluster %q", route, cluster)
	return "", 0
}

// TestSplits: weighted splits share traffic by weight over many sessions, a session keeps its
// split, the gray flag always wins (also at weight 0), and a weight change through the admin
// API under load fails no request and moves only the sessions it must.
func TestSplits(t *testing.T) {
	a := startRoutingUpstream(t, sim.Config{}, -1)
	b := startRoutingUpstream(t, sim.Config{}, -1)
	c := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig(`  - name: chat
    splits:
      - {cluster: a, weight: 80}
      - {cluster: b, weight: 20}
      - {cluster: c, weight: 0, gray_flag: v2}
`, "a", a.URL, "b", b.URL, "c", c.URL))
	client := newClient(t, g.addr)
	hc := newHTTPClient(t)
	ctx := testCtx(t)

	const sessions = 400
	session := func(i int) string { return fmt.Sprintf("session-%04d", i) }
	// askAll sends one request per session, 8 at a time, and returns where each was served.
	askAll := func() []string {
		out := make([]string, sessions)
		var (
			wg   sync.WaitGroup
			next atomic.Int64
			mu   sync.Mutex
			errs []error
		)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1) - 1); i < sessions; i = int(next.Add(1) - 1) {
					r, err := routingAsk(ctx, client, option.WithHeader("X-Session-ID", session(i)))
					if err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("%s: %w", session(i), err))
						mu.Unlock()
						continue
					}
					out[i] = r.upstream
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("%d of %d requests failed, first: %v", len(errs), sessions, errs[0])
		}
		return out
	}
	share := func(m []string, cluster string) int {
		n := 0
		for _, u := range m {
			if u == cluster {
				n++
			}
		}
		return n
	}
	// within reports whether n of sessions is within 5 standard deviations of a share p.
	within := func(n int, p float64) bool {
		sd := math.Sqrt(sessions * p * (1 - p))
		return math.Abs(float64(n)-sessions*p) <= 5*sd
	}

	before := askAll()
	nb := share(before, "b")
	t.Logf("80/20: a %d, b %d of %d sessions", share(before, "a"), nb, sessions)
	if share(before, "a")+nb != sessions || !within(nb, 0.2) {
		t.Fatalf("80/20 split: a %d, b %d, c %d of %d sessions; want b within 5 sd of 20%%",
			share(before, "a"), nb, share(before, "c"), sessions)
	}
	if got := a.requests.Load() + b.requests.Load(); got != sessions || c.requests.Load() != 0 {
		t.Fatalf("simulators saw a %d, b %d, c %d requests, want %d on a and b, none on c",
			a.requests.Load(), b.requests.Load(), c.requests.Load(), sessions)
	}

	// Sticky: every session lands on its split again.
	again := askAll()
	for i := range sessions {
		if again[i] != before[i] {
			t.Errorf("%s moved from %s to %s without a weight change", session(i), before[i], again[i])
		}
	}

	// Gray flag: always the flagged split, whatever the session, although its weight is 0.
	for i := range 20 {
		r, err := routingAsk(ctx, client, option.WithHeader("X-Session-ID", session(i)), option.WithHeader("x-gray-flag", "v2"))
		if err != nil || r.upstream != "c" {
			t.Fatalf("gray-flagged request %d: served by %q, err %v; want c", i, r.upstream, err)
		}
	}
	if n := c.requests.Load(); n != 20 {
		t.Errorf("gray split saw %d requests, want 20", n)
	}
	// An unknown flag value is an ordinary request.
	if r, err := routingAsk(ctx, client, option.WithHeader("X-Session-ID", session(0)), option.WithHeader("x-gray-flag", "v3")); err != nil || r.upstream != before[0] {
		t.Errorf("unknown gray flag: served by %q, err %v; want %s", r.upstream, err, before[0])
	}

	// Bad weight changes are refused whole.
	url := "http://" + g.admin + "/admin/routes/chat/weights"
	for _, bad := range []string{`{"nope": 1}`, `{"a": -1}`, `{"a": 0, "b": 0, "c": 0}`, `[1]`} {
		resp, body := do(t, hc, http.MethodPut, url, bad)
		checkErrorShape(t, resp, body, http.StatusBadRequest, "")
	}
	if resp, body := do(t, hc, http.MethodPut, "http://"+g.admin+"/admin/routes/nope/weights", `{"a": 1}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("PUT weights of an unknown route: %d %s", resp.StatusCode, body)
	}

	// A weight change under load: no request fails, and every answer comes from the
	// session's split under the old weights or under the new ones.
	type seen struct {
		i  int
		up string
	}
	var (
		wg       sync.WaitGroup
		stop     atomic.Bool
		mu       sync.Mutex
		loadSeen []seen
		failures []error
		changed  = make(chan struct{})
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			after := 0 // requests sent after the change
			for k := 0; k < 5000 && !stop.Load() && ctx.Err() == nil; k++ {
				i := (w*97 + k*13) % sessions
				r, err := routingAsk(ctx, client, option.WithHeader("X-Session-ID", session(i)))
				mu.Lock()
				if err != nil {
					failures = append(failures, err)
				} else {
					loadSeen = append(loadSeen, seen{i, r.upstream})
				}
				mu.Unlock()
				select {
				case <-changed:
					if after++; after >= 25 {
						return
					}
				default:
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	resp, body := do(t, hc, http.MethodPut, url, `{"a": 50, "b": 50}`)
	close(changed)
	if resp.StatusCode != http.StatusOK {
		stop.Store(true)
		wg.Wait()
		t.Fatalf("PUT weights: %d %s", resp.StatusCode, body)
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed during the weight change, first: %v", len(failures), failures[0])
	}
	if len(loadSeen) < 100 {
		t.Fatalf("only %d requests ran during the weight change", len(loadSeen))
	}
	rs := adminRoute(t, hc, g.admin, "chat")
	weights := map[string]int{}
	for _, s := range rs.State.Splits {
		weights[s.Name] = s.Weight
	}
	if weights["a"] != 50 || weights["b"] != 50 || weights["c"] != 0 {
		t.Errorf("GET /admin/routes splits after the change: %+v", rs.State.Splits)
	}

	after := askAll()
	moved := 0
	for i := range sessions {
		switch {
		case before[i] == "b" && after[i] != "b":
			t.Errorf("%s left b, which gained weight (now %s)", session(i), after[i])
		case before[i] != after[i]:
			moved++
		}
	}
	t.Logf("50/50: a %d, b %d; %d sessions moved a→b; %d requests under load", share(after, "a"), share(after, "b"), moved, len(loadSeen))
	if !within(share(after, "b"), 0.5) {
		t.Errorf("50/50 split: b has %d of %d sessions", share(after, "b"), sessions)
	}
	// 80/20 → 50/50 must move 30% of the sessions (a→b), no more.
	if !within(moved, 0.3) {
		t.Errorf("%d of %d sessions moved, want about 30%%", moved, sessions)
	}
	for _, s := range loadSeen {
		if s.up != before[s.i] && s.up != after[s.i] {
			t.Errorf("%s was served by %s under load, neither its old split %s nor its new %s", session(s.i), s.up, before[s.i], after[s.i])
		}
	}
}

// TestFallback: a primary failing before the first byte (5xx, or stalled past the TTFT
// time-out) is replaced by the fallback cluster with no client error, and the response names
// the cluster that served and counts the attempts.
func TestFallback(t *testing.T) {
	t.Run("5xx", func(t *testing.T) {
		primary := startRoutingUpstream(t, sim.Config{ErrorRate5xx: 1}, -1)
		backup := startRoutingUpstream(t, sim.Config{}, -1)
		g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
`, "primary", primary.URL, "backup", backup.URL))
		client := newClient(t, g.addr)
		ctx := testCtx(t)
		for i := range 8 {
			r, err := routingAsk(ctx, client)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if r != (routed{"backup", 2}) {
				t.Errorf("request %d: served by %q after %d attempts, want backup after 2", i, r.upstream, r.attempts)
			}
		}
		for i := range 4 {
			r, acc, err := routingStream(ctx, client, routingParams("tell me", 8))
			if err != nil || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
				t.Fatalf("stream %d: err %v, answer %+v", i, err, acc.Choices)
			}
			if r != (routed{"backup", 2}) {
				t.Errorf("stream %d: served by %q after %d attempts, want backup after 2", i, r.upstream, r.attempts)
			}
		}
		if p, b := primary.requests.Load(), backup.requests.Load(); p != 12 || b != 12 {
			t.Errorf("primary saw %d requests, backup %d; want 12 each", p, b)
		}
		if st := primary.Stats(); st.Errors != 12 {
			t.Errorf("primary answered %d errors, want 12", st.Errors)
		}
	})

	t.Run("stall before first byte", func(t *testing.T) {
		// The primary holds every request for 3s; the route's TTFT budget is 300ms, the
		// fallback step has its own 2s.
		primary := startRoutingUpstream(t, sim.Config{Delay: 3 * time.Second}, -1)
		backup := startRoutingUpstream(t, sim.Config{}, -1)
		g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    timeouts: {ttft: 300ms}
    fallback: [{cluster: backup, timeouts: {ttft: 2s}}]
`, "primary", primary.URL, "backup", backup.URL))
		client := newClient(t, g.addr)
		ctx := testCtx(t)
		for i, stream := range []bool{false, true, false, true} {
			t0 := time.Now()
			var (
				r   routed
				err error
			)
			if stream {
				var acc openai.ChatCompletionAccumulator
				r, acc, err = routingStream(ctx, client, routingParams("tell me", 8))
				if err == nil && (len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "") {
					err = fmt.Errorf("empty answer %+v", acc.Choices)
				}
			} else {
				r, err = routingAsk(ctx, client)
			}
			el := time.Since(t0)
			if err != nil {
				t.Fatalf("request %d (stream %v): %v after %v", i, stream, err, el)
			}
			if r != (routed{"backup", 2}) {
				t.Errorf("request %d: served by %q after %d attempts, want backup after 2", i, r.upstream, r.attempts)
			}
			// 300ms on the primary, then the backup (fast): far below the 3s stall.
			if el < 250*time.Millisecond || el > 2*time.Second {
				t.Errorf("request %d (stream %v) took %v, want the TTFT budget (300ms) and little more", i, stream, el)
			}
		}
		if p := primary.requests.Load(); p != 4 {
			t.Errorf("primary saw %d requests, want 4", p)
		}
		eventually(t, 5*time.Second, "the primary saw its stalled requests cancelled", func() bool {
			st := primary.Stats()
			return st.Cancelled == 4 && st.Completed == 0
		})
	})
}

// TestBreaker: a failing primary's breaker opens after min_requests; while open the primary
// gets no request and the fallback serves; after open_for a half-open probe reaches it (and
// reopens the breaker while it still fails); once healthy, the probes close it and it takes
// the traffic back. /admin/routes shows each state.
func TestBreaker(t *testing.T) {
	primary := startRoutingUpstream(t, sim.Config{}, -1)
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
    breaker: {min_requests: 5, failure_ratio: 0.5, open_for: 1s, window: 10s}
`, "primary", primary.URL, "backup", backup.URL))
	client := newClient(t, g.addr)
	hc := newHTTPClient(t)
	ctx := testCtx(t)
	ask := func(want routed) {
		t.Helper()
		r, err := routingAsk(ctx, client)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		if r != want {
			t.Fatalf("served by %q after %d attempts, want %q after %d", r.upstream, r.attempts, want.upstream, want.attempts)
		}
	}
	state := func() string {
		s, _ := clusterBreaker(t, hc, g.admin, "chat", "primary")
		return s
	}
	// sluice_route_breaker_state says the same: 0 closed, 1 half-open, 2 open.
	gauge := func(want float64) {
		t.Helper()
		if v := metricValue(t, hc, g.admin, "sluice_route_breaker_state", `route="chat"`, `cluster="primary"`); v != want {
			t.Errorf("sluice_route_breaker_state{cluster=\"primary\"} = %v, want %v", v, want)
		}
	}
	if s := state(); s != "closed" {
		t.Fatalf("primary breaker starts %q", s)
	}
	gauge(0)
	if s, _ := clusterBreaker(t, hc, g.admin, "chat", "backup"); s != "closed" {
		t.Fatalf("backup breaker starts %q", s)
	}

	// Five failures in a row: the breaker opens.
	primary.status.Store(http.StatusInternalServerError)
	for range 5 {
		ask(routed{"backup", 2})
	}
	opened := time.Now()
	if s, trips := clusterBreaker(t, hc, g.admin, "chat", "primary"); s != "open" || trips != 1 {
		t.Fatalf("after 5 failures the primary breaker is %q (trips %d), want open (1)", s, trips)
	}
	gauge(2)
	if n := primary.requests.Load(); n != 5 {
		t.Fatalf("primary saw %d requests, want 5", n)
	}

	// Open: the primary is skipped, the backup serves at the first attempt.
	for i := 0; i < 10 && time.Since(opened) < 500*time.Millisecond; i++ {
		ask(routed{"backup", 1})
	}
	if n := primary.requests.Load(); n != 5 {
		t.Fatalf("primary saw %d requests while its breaker was open, want none", n-5)
	}

	// After open_for: half-open; a probe reaches the still-failing primary and reopens it.
	eventually(t, 5*time.Second, "primary breaker half-open", func() bool { return state() == "half-open" })
	gauge(1)
	ask(routed{"backup", 2})
	if n := primary.requests.Load(); n != 6 {
		t.Fatalf("primary saw %d requests, want the half-open probe (6)", n)
	}
	if s, trips := clusterBreaker(t, hc, g.admin, "chat", "primary"); s != "open" || trips != 2 {
		t.Fatalf("after a failed probe the primary breaker is %q (trips %d), want open (2)", s, trips)
	}

	// Healthy again: the probes succeed (half_open_probes: 3) and close the breaker.
	primary.status.Store(0)
	eventually(t, 5*time.Second, "primary breaker half-open again", func() bool { return state() == "half-open" })
	for range 3 {
		ask(routed{"primary", 1})
	}
	if s := state(); s != "closed" {
		t.Fatalf("after 3 successful probes the primary breaker is %q, want closed", s)
	}
	gauge(0)
	before := backup.requests.Load()
	for range 10 {
		ask(routed{"primary", 1})
	}
	if n := backup.requests.Load(); n != before {
		t.Errorf("backup saw %d requests after the primary recovered", n-before)
	}
	if n := primary.requests.Load(); n != 6+13 {
		t.Errorf("primary saw %d requests, want %d", n, 6+13)
	}
}

// TestRetryBudget: a primary that always fails, retry.attempts 3 and no fallback: the retry
// budget keeps the upstream's load near the offered load instead of tripling it.
func TestRetryBudget(t *testing.T) {
	primary := startRoutingUpstream(t, sim.Config{}, -1)
	primary.status.Store(http.StatusInternalServerError)
	g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    retry: {attempts: 3, budget: 0.2, min_retries_per_second: 1, backoff_base: 1ms, backoff_max: 2ms}
    breaker: {disabled: true}
`, "primary", primary.URL))
	client := newClient(t, g.addr)
	hc := newHTTPClient(t)
	ctx := testCtx(t)

	const n = 100
	var (
		wg     sync.WaitGroup
		next   atomic.Int64
		mu     sync.Mutex
		status = map[int]int{}
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= n {
				_, err := routingAsk(ctx, client)
				code := 0
				var ae *openai.Error
				if asAPIError(err, &ae) {
					code = ae.StatusCode
				}
				mu.Lock()
				status[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if status[http.StatusInternalServerError] != n {
		t.Errorf("client statuses %v, want %d × 500 (the upstream's answer stands)", status, n)
	}
	// Budget: 20% of the requests in the 10s window, at least 1/s × 10s.
	const allowed = n + n/5
	got := primary.requests.Load()
	t.Logf("%d requests, upstream saw %d (without a budget: %d)", n, got, 3*n)
	if got <= n || got > allowed {
		t.Errorf("upstream saw %d requests for %d client requests, want some retries and at most %d (budget 20%%), far below %d", got, n, allowed, 3*n)
	}
	b := adminRoute(t, hc, g.admin, "chat").State.Budget
	if b.Requests != n || len(b.Clusters) != 1 || b.Clusters[0].Sent != n || b.Clusters[0].Retries != got-n ||
		b.Clusters[0].Retries > b.Clusters[0].RetriesAllowed || b.Exhausted["retry"] == 0 || b.Exhausted["fallback"] != 0 {
		t.Errorf("/admin/routes budget %+v, want %d requests and sends, %d retries within the allowance, refusals counted", b, n, got-n)
	}
	if v := metricValue(t, hc, g.admin, "sluice_retry_budget_exhausted_total", `kind="retry"`); v != float64(b.Exhausted["retry"]) {
		t.Errorf("sluice_retry_budget_exhausted_total{kind=retry} = %v, want %d", v, b.Exhausted["retry"])
	}
}

// TestFallbackNotStarvedByRetryBudget: a primary answering 30% of requests with 5xx and a
// healthy fallback. Every streaming request is served (moving to another cluster is routing,
// not a retry storm: the fallback budget is not the retry budget). Then a route whose
// fallback budget is tiny: the refusals are said in a header, counted and logged.
func TestFallbackNotStarvedByRetryBudget(t *testing.T) {
	primary := startRoutingUpstream(t, sim.Config{ErrorRate5xx: 0.3, Seed: 7}, -1)
	fallback := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig(`  - name: chat
    match: {path_prefix: /v1/chat/}
    cluster: primary
    fallback: [{cluster: fallback}]
  - name: tight
    match: {path_prefix: /v1/completions}
    cluster: primary
    fallback: [{cluster: fallback}]
    retry: {fallback_budget: 0, min_fallbacks_per_second: 0.2}
`, "primary", primary.URL, "fallback", fallback.URL))
	client := newClient(t, g.addr)
	hc := newHTTPClient(t)
	ctx := testCtx(t)

	const n = 300
	var (
		wg       sync.WaitGroup
		next     atomic.Int64
		mu       sync.Mutex
		failed   []string
		onFB     int
		attempts = map[int]int{}
	)
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= n {
				r, acc, err := routingStream(ctx, client, routingParams("hello", 4))
				mu.Lock()
				attempts[r.attempts]++
				switch {
				case err != nil:
					failed = append(failed, fmt.Sprintf("%v (upstream %s, attempts %d)", err, r.upstream, r.attempts))
				case len(acc.Choices) == 0 || acc.Choices[0].Message.Content == "":
					failed = append(failed, "empty answer")
				case r.upstream == "fallback":
					onFB++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d of %d streaming requests failed with a healthy fallback, e.g. %s", len(failed), n, failed[0])
	}
	if onFB < n/10 || attempts[2] != onFB {
		t.Errorf("%d served by the fallback, attempts %v: want about 30%% moved on in 2 attempts", onFB, attempts)
	}
	b := adminRoute(t, hc, g.admin, "chat").State.Budget
	if b.Exhausted["fallback"] != 0 || b.Exhausted["retry"] != 0 {
		t.Errorf("budget refusals %v on the default route, want none", b.Exhausted)
	}

	// The tight route: 2 fallbacks a window, every other failure of the primary stands.
	primary.status.Store(http.StatusServiceUnavailable)
	refused := 0
	for i := range 6 {
		resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/completions", `{"model":"sim-llama","prompt":"hi","max_tokens":2}`)
		switch {
		case i < 2 && resp.StatusCode != http.StatusOK:
			t.Errorf("request %d: %d %s, want the fallback's 200 (the floor allows 2 a window)", i, resp.StatusCode, body)
		case resp.StatusCode == http.StatusServiceUnavailable:
			if got := resp.Header.Get("X-Sluice-Budget-Exhausted"); got != "fallback" {
				t.Errorf("request %d: 503 without X-Sluice-Budget-Exhausted: fallback (got %q)", i, got)
			}
			refused++
		}
	}
	if refused != 4 {
		t.Errorf("%d requests refused by the fallback budget, want 4", refused)
	}
	if v := metricValue(t, hc, g.admin, "sluice_retry_budget_exhausted_total", `kind="fallback"`, `route="tight"`); v != 4 {
		t.Errorf("sluice_retry_budget_exhausted_total{route=tight,kind=fallback} = %v, want 4", v)
	}
	if logs := g.logs.String(); strings.Count(logs, "retry budget exhausted") != 1 {
		t.Errorf("want the refusals logged once per interval, log:\n%s", logs)
	}
}

// resumedRaw streams TestResume's request raw through g and returns its events.
func resumedRaw(t *testing.T, g *gateway) []sseEvent {
	t.Helper()
	body := `{"model":"sim-llama","stream":true,"max_tokens":40,"ignore_eos":true,"temperature":0,` +
		`"messages":[{"role":"user","content":"Tell me a long story about a lighthouse."}]}`
	resp, raw := do(t, newHTTPClient(t), http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	return parseSSE(raw)
}

// TestResume: a stream cut mid-way by the primary continues on the fallback (resume: true)
// and the client gets one complete answer, word for word the uncut one; without resume the
// same cut ends the stream with an in-band error.
func TestResume(t *testing.T) {
	// The primary kills every stream after 10 events (the role chunk and 9 tokens).
	primary := startRoutingUpstream(t, sim.Config{}, 10)
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	route := func(resume bool) string {
		return routingConfig(fmt.Sprintf(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
    resume: %v
`, resume), "primary", primary.URL, "backup", backup.URL)
	}
	ctx := testCtx(t)
	params := routingParams("Tell me a long story about a lighthouse.", 40)
	params.Temperature = openai.Float(0)
	ignoreEOS := option.WithJSONSet("ignore_eos", true)

	// The uncut answer, straight from a simulator.
	direct := openai.NewClient(option.WithBaseURL(backup.URL+"/v1/"), option.WithAPIKey("sk-e2e"), option.WithMaxRetries(0),
		option.WithHTTPClient(newHTTPClient(t)))
	want, err := direct.Chat.Completions.New(ctx, params, ignoreEOS)
	if err != nil {
		t.Fatal(err)
	}
	wantText := want.Choices[0].Message.Content
	if n := len(strings.Fields(wantText)); n != 40 {
		t.Fatalf("uncut answer has %d words, want 40: %q", n, wantText)
	}
	backupBefore := backup.requests.Load()

	t.Run("resume", func(t *testing.T) {
		g := startGateway(t, route(true))
		client := newClient(t, g.addr, ignoreEOS)
		r, acc, err := routingStream(ctx, client, params)
		if err != nil {
			t.Fatalf("resumed stream ended with an error: %v", err)
		}
		if len(acc.Choices) != 1 {
			t.Fatalf("%d choices", len(acc.Choices))
		}
		if got := acc.Choices[0].Message.Content; got != wantText {
			t.Errorf("resumed answer differs from the uncut one:\n got %q\nwant %q", got, wantText)
		}
		if fr := acc.Choices[0].FinishReason; fr != "length" {
			t.Errorf("finish_reason %q, want length", fr)
		}
		// The headers went out with the primary's first bytes.
		if r.upstream != "primary" {
			t.Errorf("x-sluice-upstream %q, want primary (the stream started there)", r.upstream)
		}
		if st := primary.Stats(); st.Aborted != 1 {
			t.Errorf("primary killed %d streams, want 1", st.Aborted)
		}
		if n := backup.requests.Load() - backupBefore; n != 1 {
			t.Errorf("backup saw %d continuation requests, want 1", n)
		}
	})

	t.Run("raw chunks", func(t *testing.T) {
		// The continuation's chunks carry the id of the stream the client already has.
		g := startGateway(t, route(true))
		evs := resumedRaw(t, g)
		text, done, chunks := streamText(t, evs)
		if text != wantText || !done || chunks != 40 {
			t.Errorf("resumed raw stream: %d content chunks, [DONE] %v, text %q; want 40, true, %q", chunks, done, text, wantText)
		}
		ids := map[string]int{}
		for _, ev := range evs {
			var c struct {
				ID string `json:"id"`
			}
			if ev.data != "[DONE]" && json.Unmarshal([]byte(ev.data), &c) == nil {
				ids[c.ID]++
			}
		}
		if len(ids) != 1 {
			t.Errorf("chunk ids of one resumed stream: %v, want one id", ids)
		}
	})

	t.Run("through a replacing filter", func(t *testing.T) {
		// A stream filter that rewrites every event (confidence sampling asks the model
		// servers for logprobs the client did not ask for and strips them) on a resumed
		// stream: the client gets one stream, one id, the uncut text, and no logprobs.
		g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
    resume: true
    policies: [{type: confidence, params: {sample: 1}}]
`, "primary", primary.URL, "backup", backup.URL))
		evs := resumedRaw(t, g)
		text, done, chunks := streamText(t, evs)
		if text != wantText || !done || chunks != 40 {
			t.Errorf("resumed filtered stream: %d content chunks, [DONE] %v, text %q; want 40, true, %q", chunks, done, text, wantText)
		}
		ids := map[string]int{}
		for _, ev := range evs {
			var c struct {
				ID      string `json:"id"`
				Choices []struct {
					Logprobs json.RawMessage `json:"logprobs"`
				} `json:"choices"`
			}
			if ev.data == "[DONE]" || json.Unmarshal([]byte(ev.data), &c) != nil {
				continue
			}
			ids[c.ID]++
			for _, ch := range c.Choices {
				if len(ch.Logprobs) > 0 && string(ch.Logprobs) != "null" {
					t.Errorf("the client got logprobs it did not ask for: %s", ev.data)
				}
			}
		}
		if len(ids) != 1 {
			t.Errorf("chunk ids of one resumed, filtered stream: %v, want one id", ids)
		}
		// The filter did rewrite the stream: it stripped the logprobs it asked for, on both
		// sides of the resume (the continuation asked for them too).
		stripped := metricValue(t, newHTTPClient(t), g.admin, "sluice_confidence_stripped_events_total", `route="chat"`)
		if stripped < 40 {
			t.Errorf("sluice_confidence_stripped_events_total = %v, want every token event stripped (≥ 40)", stripped)
		}
	})

	t.Run("continuation fails", func(t *testing.T) {
		// The fallback answers 500 to the continuation: the client must learn that its
		// stream is incomplete (an in-band error), never see it end as if it were whole.
		broken := startRoutingUpstream(t, sim.Config{}, -1)
		broken.status.Store(http.StatusInternalServerError)
		g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: broken}]
    resume: true
`, "primary", primary.URL, "broken", broken.URL))
		client := newClient(t, g.addr, ignoreEOS)
		_, acc, err := routingStream(ctx, client, params)
		if err == nil {
			t.Fatalf("a stream whose continuation failed ended without an error (text %q)", acc.Choices[0].Message.Content)
		}
		if n := broken.requests.Load(); n != 1 {
			t.Errorf("fallback saw %d continuation requests, want 1", n)
		}
	})

	t.Run("no resume", func(t *testing.T) {
		g := startGateway(t, route(false))
		client := newClient(t, g.addr, ignoreEOS)
		before := backup.requests.Load()
		_, acc, err := routingStream(ctx, client, params)
		if err == nil || !strings.Contains(err.Error(), "stream_cut") {
			t.Fatalf("cut stream without resume: err %v, want the in-band stream_cut error", err)
		}
		if len(acc.Choices) == 1 {
			got := acc.Choices[0].Message.Content
			if len(strings.Fields(got)) != 9 || !strings.HasPrefix(wantText, got) {
				t.Errorf("text before the cut %q, want the first 9 words of %q", got, wantText)
			}
		} else {
			t.Errorf("%d choices before the cut", len(acc.Choices))
		}
		if n := backup.requests.Load() - before; n != 0 {
			t.Errorf("backup saw %d requests without resume", n)
		}
	})
}

// TestFallbackContractMismatch: an upstream answering with an error listed in the route's
// contract_mismatch (its API drifted) moves the request on to the fallback; another 4xx is
// the client's answer.
func TestFallbackContractMismatch(t *testing.T) {
	var primaryRequests atomic.Int64
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		primaryRequests.Add(1)
		code := "unsupported_param"
		if c := r.Header.Get("X-Test-Code"); c != "" {
			code = c
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":"drifted","type":"invalid_request_error","param":"max_tokens","code":%q}}`, code)
	}))
	t.Cleanup(primary.Close)
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    contract_mismatch: [{status: 400, code: unsupported_param}]
    fallback: [{cluster: backup, on: [5xx, contract]}]
`, "primary", primary.URL, "backup", backup.URL))
	client := newClient(t, g.addr)
	ctx := testCtx(t)

	for i := range 3 {
		r, err := routingAsk(ctx, client)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if r != (routed{"backup", 2}) {
			t.Errorf("request %d: served by %q after %d attempts, want backup after 2", i, r.upstream, r.attempts)
		}
	}
	r, acc, err := routingStream(ctx, client, routingParams("tell me", 8))
	if err != nil || len(acc.Choices) != 1 || r != (routed{"backup", 2}) {
		t.Errorf("stream: %+v, err %v, choices %d", r, err, len(acc.Choices))
	}

	// Another 400 is not a contract mismatch: the client gets it as it is.
	before := backup.requests.Load()
	_, err = routingAsk(ctx, client, option.WithHeader("X-Test-Code", "invalid_value"))
	var ae *openai.Error
	if !asAPIError(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != "invalid_value" {
		t.Fatalf("plain 400: err %v, want the upstream's 400 invalid_value", err)
	}
	if n := backup.requests.Load() - before; n != 0 {
		t.Errorf("a plain 400 reached the fallback (%d requests)", n)
	}
	if n := primaryRequests.Load(); n != 5 {
		t.Errorf("primary saw %d requests, want 5", n)
	}
}

// TestRoutingConfigErrors: routing keys are validated with the config, every problem with its
// path.
func TestRoutingConfigErrors(t *testing.T) {
	const head = "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n" +
		"  - {name: a, endpoints: [{url: \"http://127.0.0.1:1\"}]}\n" +
		"  - {name: b, endpoints: [{url: \"http://127.0.0.1:2\"}]}\nroutes:\n"
	for _, tc := range []struct {
		name, route string
		want        []string
	}{
		{"unknown split cluster", "  - {name: r, splits: [{cluster: a, weight: 1}, {cluster: nope, weight: 1}]}\n",
			[]string{`routes[0]`, `unknown cluster "nope"`}},
		{"unknown fallback cluster", "  - {name: r, cluster: a, fallback: [{cluster: b}, {cluster: gone}]}\n",
			[]string{`routes[0]`, `unknown cluster "gone"`}},
		{"bad fallback condition", "  - {name: r, cluster: a, fallback: [{cluster: b, on: [5xx, 6xx]}]}\n",
			[]string{`routes[0].fallback[0].on[1]: unknown condition "6xx"`}},
		{"fallback without cluster", "  - {name: r, cluster: a, fallback: [{on: [5xx]}]}\n",
			[]string{`routes[0].fallback[0].cluster: required`}},
		{"negative weight", "  - {name: r, cluster: a, splits: [{cluster: b, weight: -5}]}\n",
			[]string{`routes[0].splits[0].weight: -5 is negative`}},
		{"no weighted split", "  - {name: r, splits: [{cluster: a, gray_flag: x}]}\n",
			[]string{`routes[0].cluster: required`}},
		{"retry out of range", "  - {name: r, cluster: a, retry: {attempts: 11, budget: 1.5}}\n",
			[]string{`routes[0].retry.attempts: 11 is out of range`, `routes[0].retry.budget: 1.5 is out of range`}},
		{"bad contract", "  - {name: r, cluster: a, contract_mismatch: [{status: 200}]}\n",
			[]string{`routes[0].contract_mismatch[0].status: 200 is not an error status`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(head + tc.route))
			var ve *config.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("config.Parse = %v, want a ValidationError", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}
