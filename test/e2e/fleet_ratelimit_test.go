package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/rlstest"
	"github.com/sluicegw/sluice/test/sim"
)

// The fleet's shared rate limit (issue 19), checked on TestFleet's xDS replicas: Envoy's rate
// limit service on Redis (test/rlstest), named by two routes of the file `sluice xds` serves,
// each with a ratelimit policy in global mode. Tenants travel over xDS (the global policy's
// tenants, their keys_file read by each replica: one host here), so the descriptors key on
// the tenant, as in test/fleet; each budget phase takes a fresh tenant. The routes send to a
// simulator of their own, so that neither the limited load nor the mirrored route "chat"
// (never limited) slows the other.

const (
	limitWorkers = 8           // requests in flight at once
	limitTimeout = time.Second // global.timeout: generous, so that -race on two cores never fails open by itself
)

// fleetLimits are the shared rate limit's parts: the service (on Redis), the tenants and the
// limited routes' simulator, with the budgets of testdata/ratelimit-fleet.yaml.
type fleetLimits struct {
	redis            *rlstest.Redis
	rls              *rlstest.Service
	tenants          *rlstest.Tenants
	upstream         string        // the limited routes' simulator
	requests, tokens int           // budgets a minute per tenant
	started          time.Duration // how long the service and Redis took to start
}

// startFleetLimits starts Redis and the rate limit service (the test skips without
// redis-server, fails instead with SLUICE_REQUIRE_TOOLS=1) and the limited routes' simulator.
func startFleetLimits(t *testing.T) *fleetLimits {
	t.Helper()
	conf, err := os.ReadFile(filepath.Join("testdata", "ratelimit-fleet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b := rlstest.Budgets(t, conf)
	l := &fleetLimits{requests: b["requests"], tokens: b["tokens"], tenants: rlstest.NewTenants(t, 8)}
	if l.requests == 0 || l.tokens == 0 {
		t.Fatalf("testdata/ratelimit-fleet.yaml: budgets %v, want requests and tokens", b)
	}
	t0 := time.Now()
	l.redis = rlstest.StartRedis(t)
	l.rls = rlstest.Start(t, conf, l.redis.Addr())
	l.started = time.Since(t0)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ratelimit log:\n%s\nredis log:\n%s", l.rls.Logs(), l.redis.Logs())
		}
	})
	l.upstream = startSim(t, sim.Config{Seed: 1}).URL
	return l
}

// tenantsYAML is the file's tenants.
func (l *fleetLimits) tenantsYAML() string {
	if l == nil {
		return "" // a fleet file without limits
	}
	return l.tenants.YAML()
}

// clusterYAML is the limited routes' cluster.
func (l *fleetLimits) clusterYAML() string {
	if l == nil {
		return ""
	}
	return fmt.Sprintf("  - {name: limited, endpoints: [{url: %s}], health_check: {disabled: true}}\n", l.upstream)
}

// routesYAML are the two limited routes, before route chat (which matches everything):
// model fleet-requests counts requests, fleet-tokens tokens (hits: tokens), each in the
// service only (no local limit).
func (l *fleetLimits) routesYAML() string {
	if l == nil {
		return ""
	}
	var b strings.Builder
	for _, r := range []struct{ budget, hits string }{{"requests", "requests"}, {"tokens", "tokens"}} {
		fmt.Fprintf(&b, `  - name: limited-%[1]s
    match: {model: fleet-%[1]s}
    model: sim-llama
    cluster: limited
    policies:
      - type: ratelimit
        params:
          global:
            address: %[2]s
            timeout: %[3]s
            hits: %[4]s
            descriptors: [[{key: budget, value: %[1]s}, {key: tenant, from: tenant}]]
`, r.budget, l.rls.Addr(), limitTimeout, r.hits)
	}
	return b.String()
}

// failures is each replica's count of failed calls to the service on a limited route.
func (l *fleetLimits) failures(t *testing.T, hc *http.Client, reps []*fleetReplica, budget string) []float64 {
	t.Helper()
	out := make([]float64, len(reps))
	for i, r := range reps {
		out[i] = metricValue(t, hc, r.admin, rlstest.FailuresMetric, `route="limited-`+budget+`"`)
	}
	return out
}

// check runs the shared limit's phases on the replicas: the fleet admits the requests budget
// ± 5% (round robin), then the tokens budget ± 5% (a random replica each request), each
// with no call to the service failing; with the service stopped, every request is served and
// each replica counts one failed call per request. It returns how long it took.
func (l *fleetLimits) check(t *testing.T, hc *http.Client, reps []*fleetReplica) time.Duration {
	t.Helper()
	start := time.Now()
	addrs := make([]string, len(reps))
	for i, r := range reps {
		addrs[i] = r.listen
	}
	before := l.failures(t, hc, reps, "requests")
	exhausted, res := l.tenants.Phase(t, func(tn rlstest.Tenant) []rlstest.Answer {
		shots := make([]rlstest.Shot, l.requests*3/2) // half again the budget: a replica-local limit would admit them all
		for i := range shots {
			shots[i] = rlstest.Shot{Replica: i % len(reps), Key: tn.Key, Body: rlstest.ChatBody("fleet-requests", i, 4)}
		}
		return rlstest.Send(t, hc, addrs, limitWorkers, shots)
	})
	rlstest.CheckBudget(t, res, len(reps), l.requests, "requests", func(rlstest.Answer) int { return 1 })
	rlstest.NoFailures(t, before, l.failures(t, hc, reps, "requests"))

	before = l.failures(t, hc, reps, "tokens")
	rng := rand.New(rand.NewPCG(19, 12000))
	_, res = l.tenants.Phase(t, func(tn rlstest.Tenant) []rlstest.Answer {
		var shots []rlstest.Shot
		// Half again the budget in charges of 20..180 completion tokens plus the prompt.
		for i, sum := 0, 0; sum < l.tokens*3/2; i++ {
			body := rlstest.ChatBody("fleet-tokens", i, 20+rng.IntN(161))
			c := rlstest.UpFrontCharge(t, body)
			shots = append(shots, rlstest.Shot{Replica: rng.IntN(len(reps)), Key: tn.Key, Body: body, Charge: c})
			sum += c
		}
		return rlstest.Send(t, hc, addrs, limitWorkers, shots)
	})
	rlstest.CheckBudget(t, res, len(reps), l.tokens, "tokens", func(a rlstest.Answer) int { return a.Charge })
	rlstest.NoFailures(t, before, l.failures(t, hc, reps, "tokens"))

	// The service stops: the tenant over its budget (if still in its minute) is served, by
	// failing open, and every failed call is counted.
	l.rls.Kill()
	const perReplica = 10
	before = l.failures(t, hc, reps, "requests")
	shots := make([]rlstest.Shot, perReplica*len(reps))
	for i := range shots {
		shots[i] = rlstest.Shot{Replica: i % len(reps), Key: exhausted.Key, Body: rlstest.ChatBody("fleet-requests", i, 4)}
	}
	for _, a := range rlstest.Send(t, hc, addrs, limitWorkers, shots) {
		if a.Status != http.StatusOK {
			t.Errorf("%s: %d %s with the rate limit service stopped, want 200 (fail open)", reps[a.Replica].node, a.Status, a.ErrCode)
		}
	}
	after := l.failures(t, hc, reps, "requests")
	for i, r := range reps {
		if got := after[i] - before[i]; got != perReplica {
			t.Errorf("%s: %s{route=\"limited-requests\"} rose by %v, want %d (one per request)", r.node, rlstest.FailuresMetric, got, perReplica)
		}
	}
	return time.Since(start)
}
