package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/ratelimit"
	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

// Global rate limits on the real service: three gateway replicas, each with the ratelimit
// policy in global mode, share the budgets of testdata/ratelimit.yaml through Envoy's rate
// limit service and Redis.

const (
	replicas   = 3
	workers    = 8                // requests in flight at once
	tolerance  = 0.05             // the fleet admits the budget ± 5%
	rlsTimeout = time.Second      // global.timeout: generous, so that -race on two cores never fails open by itself
	waitBack   = 20 * time.Second // for a replica to be answered again after a restart
)

// TestGlobalRateLimitFleet: three replicas sharing one limit of 600 requests a minute admit
// 600 ± 5% whichever replica each request hits (round robin, then random), and a budget of
// 60,000 tokens a minute (hits: tokens) likewise, and a request larger than that budget is
// refused as too large, not to be retried; when the service stops, and then when Redis
// stops, every request is still served (fail open) and each failed call is counted in
// sluice_ratelimit_global_failures_total; when they come back, every replica is answered
// again.
func TestGlobalRateLimitFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs Envoy's rate limit service and Redis")
	}
	rlsYAML, err := os.ReadFile(filepath.Join("testdata", "ratelimit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	reqBudget, tokBudget := budgets(t, rlsYAML)

	redis := startRedis(t) // skips without redis-server
	rls := startRLS(t, rlsYAML, redis.addr())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ratelimit log:\n%s\nredis log:\n%s", rls.logs(), redis.logs())
		}
	})

	s := sim.New(sim.Config{MaxTokensDefault: 8})
	t.Cleanup(s.Close)
	up := httptest.NewServer(s)
	t.Cleanup(up.Close)

	tenants := newTenants(t, 12)
	yamlCfg := gatewayConfig(up.URL, rls.addr(), tenants.all)
	reps := make([]*replica, replicas)
	for i := range reps {
		reps[i] = startReplica(t, yamlCfg)
	}
	hc := newHTTPClient(t)

	roundRobin := func(i int) int { return i % replicas }
	rng := rand.New(rand.NewPCG(19, 600))
	random := func(int) int { return rng.IntN(replicas) }

	var exhausted tenant // the first phase's, over its budget for the rest of its minute
	for _, tc := range []struct {
		name string
		pick func(int) int
	}{{"requests round robin", roundRobin}, {"requests random", random}} {
		t.Run(tc.name, func(t *testing.T) {
			before := failures(t, hc, reps, "requests")
			tn, res := inOneWindow(t, tenants, func(tn tenant) []answer {
				shots := make([]shot, reqBudget*3/2) // half again the budget: a replica-local limit would admit them all
				for i := range shots {
					shots[i] = shot{replica: tc.pick(i), key: tn.key, body: chatBody("sim-llama", i, 8)}
				}
				return send(t, hc, reps, shots)
			})
			if exhausted.name == "" {
				exhausted = tn
			}
			checkBudget(t, res, reqBudget, "requests", func(answer) int { return 1 })
			noFailures(t, before, failures(t, hc, reps, "requests"))
		})
	}

	t.Run("tokens", func(t *testing.T) {
		before := failures(t, hc, reps, "tokens")
		sizes := rand.New(rand.NewPCG(19, 60000))
		_, res := inOneWindow(t, tenants, func(tn tenant) []answer {
			var shots []shot
			// Half again the budget in charges of 20..180 completion tokens plus the prompt.
			for i, sum := 0, 0; sum < tokBudget*3/2; i++ {
				body := chatBody("sim-tokens", i, 20+sizes.IntN(161))
				c := upFrontCharge(t, body)
				shots = append(shots, shot{replica: random(i), key: tn.key, body: body, charge: c})
				sum += c
			}
			return send(t, hc, reps, shots)
		})
		checkBudget(t, res, tokBudget, "tokens", func(a answer) int { return a.charge })
		noFailures(t, before, failures(t, hc, reps, "tokens"))
	})

	t.Run("tokens: one request larger than the budget", func(t *testing.T) {
		// 16 choices of 4096 tokens: more than the whole budget, so no window can ever admit
		// it. The service says so (its limit is in the answer): no Retry-After, and the
		// OpenAI SDKs are told not to retry it.
		tn := tenants.next(t)
		body := fmt.Appendf(nil, `{"model":"sim-tokens","messages":[{"role":"user","content":"Write it all."}],"max_tokens":%d,"n":16}`,
			ratelimit.DefaultMaxTokensCap)
		charge := upFrontCharge(t, body)
		if charge <= tokBudget {
			t.Fatalf("charge %d: want more than the budget %d", charge, tokBudget)
		}
		before := metricSum(t, hc, reps, "sluice_ratelimit_rejections_total", `route="tokens"`, `reason="too_large"`)
		for i := range reps {
			a, h := doHeader(hc, reps[i], shot{replica: i, key: tn.key, body: body, charge: charge})
			if a.status != http.StatusTooManyRequests || a.errCode != "rate_limit_exceeded" || a.errType != "tokens" ||
				a.retryAfter != "" || h.Get("X-Should-Retry") != "false" {
				t.Errorf("replica %d: %d %s %s Retry-After %q x-should-retry %q %s, want 429 rate_limit_exceeded tokens, no Retry-After, x-should-retry false",
					i, a.status, a.errCode, a.errType, a.retryAfter, h.Get("X-Should-Retry"), a.failed)
			}
			if want := fmt.Sprintf("Limit %d, Requested %d", tokBudget, charge); !strings.Contains(a.message, want) {
				t.Errorf("replica %d: message %q, want it to say %q", i, a.message, want)
			}
		}
		if got := metricSum(t, hc, reps, "sluice_ratelimit_rejections_total", `route="tokens"`, `reason="too_large"`); got != before+replicas {
			t.Errorf("too_large rejections rose from %v to %v, want +%d", before, got, replicas)
		}
	})

	// failOpen sends n requests round robin, all of which must be served although every call
	// to the service fails, each one counted.
	failOpen := func(t *testing.T, tn tenant, n int) {
		t.Helper()
		before := failures(t, hc, reps, "requests")
		rejectedBefore := metricSum(t, hc, reps, "sluice_ratelimit_rejections_total", `reason="global"`)
		shots := make([]shot, n)
		for i := range shots {
			shots[i] = shot{replica: roundRobin(i), key: tn.key, body: chatBody("sim-llama", i, 8)}
		}
		for _, a := range send(t, hc, reps, shots) {
			if a.status != http.StatusOK {
				t.Errorf("replica %d: %d %s, want 200 (fail open)", a.replica, a.status, a.errCode)
			}
		}
		after := failures(t, hc, reps, "requests")
		for i := range reps {
			if got, want := after[i]-before[i], float64(n/replicas); got != want {
				t.Errorf("replica %d: sluice_ratelimit_global_failures_total{route=\"requests\"} rose by %v, want %v (one per request)", i, got, want)
			}
		}
		if got := metricSum(t, hc, reps, "sluice_ratelimit_rejections_total", `reason="global"`); got != rejectedBefore {
			t.Errorf("global rejections rose from %v to %v while the limit failed open", rejectedBefore, got)
		}
	}

	t.Run("service stops", func(t *testing.T) {
		rls.kill()
		failOpen(t, exhausted, 10*replicas) // over its budget (if still in its minute): served only by failing open
	})
	t.Run("service restarts", func(t *testing.T) {
		rls.restart(t)
		answeredAgain(t, hc, reps, exhausted)
	})
	t.Run("redis stops", func(t *testing.T) {
		redis.kill()
		failOpen(t, tenants.next(t), 4*replicas)
		if rls.p.exited() {
			t.Errorf("the rate limit service exited when Redis stopped: %v", rls.p.err)
		}
	})
	t.Run("redis restarts", func(t *testing.T) {
		redis.restart(t)
		answeredAgain(t, hc, reps, exhausted)
	})
}

// budgets reads the requests and tokens budgets (per minute) of the service's config.
func budgets(t *testing.T, conf []byte) (requests, tokens int) {
	t.Helper()
	var c struct {
		Domain      string `yaml:"domain"`
		Descriptors []struct {
			Key         string `yaml:"key"`
			Value       string `yaml:"value"`
			Descriptors []struct {
				Key       string `yaml:"key"`
				RateLimit struct {
					Unit            string `yaml:"unit"`
					RequestsPerUnit int    `yaml:"requests_per_unit"`
				} `yaml:"rate_limit"`
			} `yaml:"descriptors"`
		} `yaml:"descriptors"`
	}
	if err := yaml.Unmarshal(conf, &c); err != nil {
		t.Fatalf("testdata/ratelimit.yaml: %v", err)
	}
	if c.Domain != rlsDomain {
		t.Fatalf("testdata/ratelimit.yaml: domain %q, want %q", c.Domain, rlsDomain)
	}
	got := map[string]int{}
	for _, d := range c.Descriptors {
		if d.Key != "budget" || len(d.Descriptors) != 1 || d.Descriptors[0].Key != "tenant" || d.Descriptors[0].RateLimit.Unit != "minute" {
			t.Fatalf("testdata/ratelimit.yaml: want budget=VALUE > tenant per minute, got %+v", d)
		}
		got[d.Value] = d.Descriptors[0].RateLimit.RequestsPerUnit
	}
	if got["requests"] <= 0 || got["tokens"] <= 0 {
		t.Fatalf("testdata/ratelimit.yaml: budgets %v, want requests and tokens", got)
	}
	return got["requests"], got["tokens"]
}

// tenant is a client known by one API key.
type tenant struct {
	name, key, keysFile string
}

// tenants is a pool of tenants, each budget phase taking a fresh one.
type tenants struct {
	all  []tenant
	used int
}

func newTenants(t *testing.T, n int) *tenants {
	t.Helper()
	dir := t.TempDir()
	ts := &tenants{}
	for i := range n {
		tn := tenant{name: fmt.Sprintf("team-%02d", i), key: fmt.Sprintf("sk-fleet-team-%02d-0123456789", i)}
		tn.keysFile = filepath.Join(dir, tn.name+".keys")
		if err := os.WriteFile(tn.keysFile, []byte(tn.key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ts.all = append(ts.all, tn)
	}
	return ts
}

func (ts *tenants) next(t *testing.T) tenant {
	t.Helper()
	if ts.used == len(ts.all) {
		t.Fatalf("all %d tenants used", len(ts.all))
	}
	ts.used++
	return ts.all[ts.used-1]
}

// inOneWindow runs a budget phase with a fresh tenant, again with another (3 tries at most)
// when its requests straddled a minute boundary: the service counts in fixed calendar
// minutes (the Redis key names the window's start), so a phase that spans two windows has
// two budgets. The service runs on this host, so its clock is this one.
func inOneWindow(t *testing.T, ts *tenants, phase func(tenant) []answer) (tenant, []answer) {
	t.Helper()
	for range 3 {
		tn := ts.next(t)
		start := time.Now()
		res := phase(tn)
		end := time.Now()
		if start.Unix()/60 == end.Unix()/60 {
			return tn, res
		}
		t.Logf("the phase ran from %s to %s, across a minute boundary: again with a fresh tenant",
			start.Format(time.TimeOnly), end.Format(time.TimeOnly))
	}
	t.Fatal("3 phases in a row straddled a minute boundary")
	return tenant{}, nil
}

// checkBudget checks that the fleet admitted budget ± tolerance (what each answer costs:
// cost), with every replica admitting some and refusing some, and that every refusal is
// OpenAI's 429 rate_limit_exceeded of type typ with the service's reset as Retry-After.
func checkBudget(t *testing.T, res []answer, budget int, typ string, cost func(answer) int) {
	t.Helper()
	admitted := 0
	perReplica := make([][2]int, replicas) // admitted, refused
	for _, a := range res {
		switch a.status {
		case http.StatusOK:
			admitted += cost(a)
			perReplica[a.replica][0]++
		case http.StatusTooManyRequests:
			perReplica[a.replica][1]++
			ra, err := strconv.Atoi(a.retryAfter)
			if a.errCode != "rate_limit_exceeded" || a.errType != typ || err != nil || ra < 1 || ra > 60 {
				t.Errorf("replica %d: 429 code %q type %q Retry-After %q, want rate_limit_exceeded, %s, 1..60 seconds",
					a.replica, a.errCode, a.errType, a.retryAfter, typ)
			}
		default:
			t.Errorf("replica %d: status %d (%s), want 200 or 429", a.replica, a.status, a.errCode)
		}
	}
	lo, hi := float64(budget)*(1-tolerance), float64(budget)*(1+tolerance)
	t.Logf("%d %s admitted of a budget of %d over %d requests; per replica [admitted refused]: %v", admitted, typ, budget, len(res), perReplica)
	if float64(admitted) < lo || float64(admitted) > hi {
		t.Errorf("the fleet admitted %d %s, want %d ± %.0f%% [%.0f, %.0f]", admitted, typ, budget, tolerance*100, lo, hi)
	}
	for i, n := range perReplica {
		if n[0] == 0 || n[1] == 0 {
			t.Errorf("replica %d admitted %d and refused %d: want some of each (a shared budget)", i, n[0], n[1])
		}
	}
}

// noFailures checks that no call to the service failed during a budget phase (a call that
// fails admits its request, which would blur the count).
func noFailures(t *testing.T, before, after []float64) {
	t.Helper()
	for i := range before {
		if after[i] != before[i] {
			t.Errorf("replica %d: %v calls to the service failed during the phase (fail open)", i, after[i]-before[i])
		}
	}
}

// upFrontCharge is the token charge the policy sends as hits_addend for a chat body: the
// prompt estimate plus max_tokens (below the default cap of 4096), × n.
func upFrontCharge(t *testing.T, body []byte) int {
	t.Helper()
	r, err := openai.ParseRequest(openai.KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.MaxTokens <= 0 || r.MaxTokens > ratelimit.DefaultMaxTokensCap {
		t.Fatalf("max_tokens %d: the charge below assumes 1..%d", r.MaxTokens, ratelimit.DefaultMaxTokensCap)
	}
	return r.PromptTokens + r.MaxTokens*max(r.N, 1)
}

func chatBody(model string, i, maxTokens int) []byte {
	return fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"Question %d: what is a token bucket?"}],"max_tokens":%d}`,
		model, i, maxTokens)
}

// gatewayConfig is every replica's config: one simulator, and two routes whose ratelimit
// policies count in the service only (no local limits): "tokens" (model sim-tokens, hits:
// tokens) and "requests" (the rest).
func gatewayConfig(simURL, rlsAddr string, ts []tenant) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\ntenants:\n")
	for _, tn := range ts {
		fmt.Fprintf(&b, "  - {name: %s, keys_file: %s}\n", tn.name, tn.keysFile)
	}
	fmt.Fprintf(&b, `clusters:
  - name: sim
    endpoints: [{url: %s}]
routes:
  - name: tokens
    match: {model: sim-tokens}
    model: sim-llama
    cluster: sim
    policies:
      - type: ratelimit
        params:
          global:
            address: %s
            timeout: %s
            hits: tokens
            descriptors: [[{key: budget, value: tokens}, {key: tenant, from: tenant}]]
  - name: requests
    cluster: sim
    policies:
      - type: ratelimit
        params:
          global:
            address: %[2]s
            timeout: %[3]s
            descriptors: [[{key: budget, value: requests}, {key: tenant, from: tenant}]]
`, simURL, rlsAddr, rlsTimeout)
	return b.String()
}

// replica is one gateway, a proxy.Server in the test process with its own listeners,
// metrics and connection to the rate limit service.
type replica struct {
	srv         *proxy.Server
	addr, admin string
	logs        *syncBuffer
}

func startReplica(t *testing.T, yamlCfg string) *replica {
	t.Helper()
	cfg, err := config.Parse([]byte(yamlCfg))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yamlCfg)
	}
	logs := &syncBuffer{}
	srv, err := proxy.New(proxy.Options{
		Config:  cfg,
		Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Version: "fleet",
	})
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	r := &replica{srv: srv, addr: srv.Addr(), admin: srv.AdminAddr(), logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("gateway %s log:\n%s", r.addr, logs.String())
		}
	})
	return r
}

func newHTTPClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: workers, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// shot is one request to send: to which replica, as which tenant, and its token charge.
type shot struct {
	replica int
	key     string
	body    []byte
	charge  int
}

// answer is a shot's outcome.
type answer struct {
	shot
	status           int
	retryAfter       string
	errType, errCode string
	message          string
	failed           string // the request failed before an answer: why
}

// send sends the shots, workers at a time, each to its replica's /v1/chat/completions.
func send(t *testing.T, hc *http.Client, reps []*replica, shots []shot) []answer {
	t.Helper()
	res := make([]answer, len(shots))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, len(shots)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(shots) {
					return
				}
				res[i] = do(hc, reps[shots[i].replica], shots[i])
			}
		}()
	}
	wg.Wait()
	for _, a := range res {
		if a.failed != "" {
			t.Errorf("replica %d: %s", a.replica, a.failed)
		}
	}
	return res
}

func do(hc *http.Client, r *replica, s shot) answer {
	a, _ := doHeader(hc, r, s)
	return a
}

// doHeader is do, with the answer's headers.
func doHeader(hc *http.Client, r *replica, s shot) (answer, http.Header) {
	a := answer{shot: s}
	req, err := http.NewRequest(http.MethodPost, "http://"+r.addr+"/v1/chat/completions", bytes.NewReader(s.body))
	if err != nil {
		a.failed = err.Error()
		return a, nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := hc.Do(req)
	if err != nil {
		a.failed = err.Error()
		return a, nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		a.failed = "reading the answer: " + err.Error()
		return a, resp.Header
	}
	a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Type    string `json:"type"`
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil {
			a.errType, a.errCode, a.message = e.Error.Type, e.Error.Code, e.Error.Message
		}
	}
	return a, resp.Header
}

// failures is each replica's sluice_ratelimit_global_failures_total for the route.
func failures(t *testing.T, hc *http.Client, reps []*replica, route string) []float64 {
	t.Helper()
	out := make([]float64, len(reps))
	for i, r := range reps {
		out[i] = metricValue(t, hc, r.admin, "sluice_ratelimit_global_failures_total", `route="`+route+`"`)
	}
	return out
}

// metricSum sums a metric over the replicas.
func metricSum(t *testing.T, hc *http.Client, reps []*replica, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, r := range reps {
		sum += metricValue(t, hc, r.admin, name, labels...)
	}
	return sum
}

// metricValue sums the samples of a Prometheus metric on an admin listener whose labels
// contain every given label pair (`route="requests"`).
func metricValue(t *testing.T, hc *http.Client, admin, name string, labels ...string) float64 {
	t.Helper()
	resp, err := hc.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	var sum float64
next:
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		for _, l := range labels {
			if !strings.Contains(line[:sp], l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// answered is a replica's count of calls to the service on a route that did not fail, from
// /admin/ratelimits.
func answered(t *testing.T, hc *http.Client, r *replica, route string) uint64 {
	t.Helper()
	resp, err := hc.Get("http://" + r.admin + "/admin/ratelimits")
	if err != nil {
		t.Fatalf("/admin/ratelimits: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var out struct {
		Limiters []struct {
			Route string          `json:"route"`
			Stats ratelimit.Stats `json:"stats"`
		} `json:"limiters"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/ratelimits: %d %v", resp.StatusCode, err)
	}
	for _, l := range out.Limiters {
		if l.Route == route {
			return l.Stats.GlobalCalls - l.Stats.GlobalFailures
		}
	}
	t.Fatalf("/admin/ratelimits: no limiter on route %q", route)
	return 0
}

// answeredAgain sends requests to each replica (every 50ms, for waitBack at most) until one
// of its calls to the service is answered, once the service (or Redis) is back.
func answeredAgain(t *testing.T, hc *http.Client, reps []*replica, tn tenant) {
	t.Helper()
	for i, r := range reps {
		before := answered(t, hc, r, "requests")
		start := time.Now()
		for n := 0; ; n++ {
			a := do(hc, r, shot{replica: i, key: tn.key, body: chatBody("sim-llama", n, 8)})
			if a.failed != "" || (a.status != http.StatusOK && a.status != http.StatusTooManyRequests) {
				t.Fatalf("replica %d: %d %s %s", i, a.status, a.errCode, a.failed)
			}
			if answered(t, hc, r, "requests") > before {
				t.Logf("replica %d: answered again after %d requests, %v", i, n+1, time.Since(start).Round(time.Millisecond))
				break
			}
			if time.Since(start) > waitBack {
				t.Fatalf("replica %d: no call to the service answered within %v of its restart", i, waitBack)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
