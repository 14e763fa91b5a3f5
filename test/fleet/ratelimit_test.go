package fleet

import (
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
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy/ratelimit"
	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/rlstest"
	"github.com/sluicegw/sluice/test/sim"
)

// Global rate limits on the real service: three gateway replicas, each with the ratelimit
// policy in global mode, share the budgets of testdata/ratelimit.yaml through Envoy's rate
// limit service and Redis.

const (
	replicas   = 3
	workers    = 8                // requests in flight at once
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
	b := rlstest.Budgets(t, rlsYAML)
	reqBudget, tokBudget := b["requests"], b["tokens"]
	if reqBudget == 0 || tokBudget == 0 {
		t.Fatalf("testdata/ratelimit.yaml: budgets %v, want requests and tokens", b)
	}

	redis := rlstest.StartRedis(t) // skips without redis-server
	rls := rlstest.Start(t, rlsYAML, redis.Addr())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ratelimit log:\n%s\nredis log:\n%s", rls.Logs(), redis.Logs())
		}
	})

	s := sim.New(sim.Config{MaxTokensDefault: 8})
	t.Cleanup(s.Close)
	up := httptest.NewServer(s)
	t.Cleanup(up.Close)

	tenants := rlstest.NewTenants(t, 12)
	yamlCfg := gatewayConfig(up.URL, rls.Addr(), tenants)
	reps := make([]*replica, replicas)
	for i := range reps {
		reps[i] = startReplica(t, yamlCfg)
	}
	hc := newHTTPClient(t)

	roundRobin := func(i int) int { return i % replicas }
	rng := rand.New(rand.NewPCG(19, 600))
	random := func(int) int { return rng.IntN(replicas) }

	var exhausted rlstest.Tenant // the first phase's, over its budget for the rest of its minute
	for _, tc := range []struct {
		name string
		pick func(int) int
	}{{"requests round robin", roundRobin}, {"requests random", random}} {
		t.Run(tc.name, func(t *testing.T) {
			before := failures(t, hc, reps, "requests")
			tn, res := tenants.Phase(t, func(tn rlstest.Tenant) []rlstest.Answer {
				shots := make([]rlstest.Shot, reqBudget*3/2) // half again the budget: a replica-local limit would admit them all
				for i := range shots {
					shots[i] = rlstest.Shot{Replica: tc.pick(i), Key: tn.Key, Body: rlstest.ChatBody("sim-llama", i, 8)}
				}
				return rlstest.Send(t, hc, addrs(reps), workers, shots)
			})
			if exhausted.Name == "" {
				exhausted = tn
			}
			rlstest.CheckBudget(t, res, replicas, reqBudget, "requests", func(rlstest.Answer) int { return 1 })
			rlstest.NoFailures(t, before, failures(t, hc, reps, "requests"))
		})
	}

	t.Run("tokens", func(t *testing.T) {
		before := failures(t, hc, reps, "tokens")
		sizes := rand.New(rand.NewPCG(19, 60000))
		_, res := tenants.Phase(t, func(tn rlstest.Tenant) []rlstest.Answer {
			var shots []rlstest.Shot
			// Half again the budget in charges of 20..180 completion tokens plus the prompt.
			for i, sum := 0, 0; sum < tokBudget*3/2; i++ {
				body := rlstest.ChatBody("sim-tokens", i, 20+sizes.IntN(161))
				c := rlstest.UpFrontCharge(t, body)
				shots = append(shots, rlstest.Shot{Replica: random(i), Key: tn.Key, Body: body, Charge: c})
				sum += c
			}
			return rlstest.Send(t, hc, addrs(reps), workers, shots)
		})
		rlstest.CheckBudget(t, res, replicas, tokBudget, "tokens", func(a rlstest.Answer) int { return a.Charge })
		rlstest.NoFailures(t, before, failures(t, hc, reps, "tokens"))
	})

	t.Run("tokens: one request larger than the budget", func(t *testing.T) {
		// 16 choices of 4096 tokens: more than the whole budget, so no window can ever admit
		// it. The service says so (its limit is in the answer): no Retry-After, and the
		// OpenAI SDKs are told not to retry it.
		tn := tenants.Next(t)
		body := fmt.Appendf(nil, `{"model":"sim-tokens","messages":[{"role":"user","content":"Write it all."}],"max_tokens":%d,"n":16}`,
			ratelimit.DefaultMaxTokensCap)
		charge := rlstest.UpFrontCharge(t, body)
		if charge <= tokBudget {
			t.Fatalf("charge %d: want more than the budget %d", charge, tokBudget)
		}
		before := metricSum(t, hc, reps, "sluice_ratelimit_rejections_total", `route="tokens"`, `reason="too_large"`)
		for i := range reps {
			a, h := rlstest.Do(hc, reps[i].addr, rlstest.Shot{Replica: i, Key: tn.Key, Body: body, Charge: charge})
			if a.Status != http.StatusTooManyRequests || a.ErrCode != "rate_limit_exceeded" || a.ErrType != "tokens" ||
				a.RetryAfter != "" || h.Get("X-Should-Retry") != "false" {
				t.Errorf("replica %d: %d %s %s Retry-After %q x-should-retry %q %s, want 429 rate_limit_exceeded tokens, no Retry-After, x-should-retry false",
					i, a.Status, a.ErrCode, a.ErrType, a.RetryAfter, h.Get("X-Should-Retry"), a.Failed)
			}
			if want := fmt.Sprintf("Limit %d, Requested %d", tokBudget, charge); !strings.Contains(a.Message, want) {
				t.Errorf("replica %d: message %q, want it to say %q", i, a.Message, want)
			}
		}
		if got := metricSum(t, hc, reps, "sluice_ratelimit_rejections_total", `route="tokens"`, `reason="too_large"`); got != before+replicas {
			t.Errorf("too_large rejections rose from %v to %v, want +%d", before, got, replicas)
		}
	})

	// failOpen sends n requests round robin, all of which must be served although every call
	// to the service fails, each one counted.
	failOpen := func(t *testing.T, tn rlstest.Tenant, n int) {
		t.Helper()
		before := failures(t, hc, reps, "requests")
		rejectedBefore := metricSum(t, hc, reps, "sluice_ratelimit_rejections_total", `reason="global"`)
		shots := make([]rlstest.Shot, n)
		for i := range shots {
			shots[i] = rlstest.Shot{Replica: roundRobin(i), Key: tn.Key, Body: rlstest.ChatBody("sim-llama", i, 8)}
		}
		for _, a := range rlstest.Send(t, hc, addrs(reps), workers, shots) {
			if a.Status != http.StatusOK {
				t.Errorf("replica %d: %d %s, want 200 (fail open)", a.Replica, a.Status, a.ErrCode)
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
		rls.Kill()
		failOpen(t, exhausted, 10*replicas) // over its budget (if still in its minute): served only by failing open
	})
	t.Run("service restarts", func(t *testing.T) {
		rls.Restart(t)
		answeredAgain(t, hc, reps, exhausted)
	})
	t.Run("redis stops", func(t *testing.T) {
		redis.Kill()
		failOpen(t, tenants.Next(t), 4*replicas)
		if exited, err := rls.Exited(); exited {
			t.Errorf("the rate limit service exited when Redis stopped: %v", err)
		}
	})
	t.Run("redis restarts", func(t *testing.T) {
		redis.Restart(t)
		answeredAgain(t, hc, reps, exhausted)
	})
}

// gatewayConfig is every replica's config: one simulator, and two routes whose ratelimit
// policies count in the service only (no local limits): "tokens" (model sim-tokens, hits:
// tokens) and "requests" (the rest).
func gatewayConfig(simURL, rlsAddr string, ts *rlstest.Tenants) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\n" + ts.YAML())
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
	logs        *rlstest.LogBuffer
}

func startReplica(t *testing.T, yamlCfg string) *replica {
	t.Helper()
	cfg, err := config.Parse([]byte(yamlCfg))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yamlCfg)
	}
	logs := &rlstest.LogBuffer{}
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

// addrs are the replicas' listeners, by index.
func addrs(reps []*replica) []string {
	out := make([]string, len(reps))
	for i, r := range reps {
		out[i] = r.addr
	}
	return out
}

func newHTTPClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: workers, IdleConnTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// failures is each replica's sluice_ratelimit_global_failures_total for the route.
func failures(t *testing.T, hc *http.Client, reps []*replica, route string) []float64 {
	t.Helper()
	out := make([]float64, len(reps))
	for i, r := range reps {
		out[i] = metricValue(t, hc, r.admin, rlstest.FailuresMetric, `route="`+route+`"`)
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
func answeredAgain(t *testing.T, hc *http.Client, reps []*replica, tn rlstest.Tenant) {
	t.Helper()
	for i, r := range reps {
		before := answered(t, hc, r, "requests")
		start := time.Now()
		for n := 0; ; n++ {
			a, _ := rlstest.Do(hc, r.addr, rlstest.Shot{Replica: i, Key: tn.Key, Body: rlstest.ChatBody("sim-llama", n, 8)})
			if a.Failed != "" || (a.Status != http.StatusOK && a.Status != http.StatusTooManyRequests) {
				t.Fatalf("replica %d: %d %s %s", i, a.Status, a.ErrCode, a.Failed)
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
