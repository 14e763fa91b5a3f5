package rlstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/ratelimit"
)

// The budget phases of the fleet tests: tenants known by API keys, requests ("shots") sent to
// the replicas of a fleet, and the check that the fleet together admitted a shared budget.

// Tolerance is how far the fleet's admissions may be from a budget: ± 5%.
const Tolerance = 0.05

// FailuresMetric counts a replica's calls to the service that failed (the request admitted:
// fail open), by route.
const FailuresMetric = "sluice_ratelimit_global_failures_total"

// Tenant is a client known by one API key, in a keys file of its own.
type Tenant struct {
	Name, Key, KeysFile string
}

// Tenants is a pool of tenants, each budget phase taking a fresh one (a fresh descriptor in
// the service: a budget of its own).
type Tenants struct {
	All  []Tenant
	used int
}

// NewTenants writes n tenants' keys files into a temporary directory.
func NewTenants(t testing.TB, n int) *Tenants {
	t.Helper()
	dir := t.TempDir()
	ts := &Tenants{}
	for i := range n {
		tn := Tenant{Name: fmt.Sprintf("team-%02d", i), Key: fmt.Sprintf("sk-fleet-team-%02d-0123456789", i)}
		tn.KeysFile = filepath.Join(dir, tn.Name+".keys")
		if err := os.WriteFile(tn.KeysFile, []byte(tn.Key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ts.All = append(ts.All, tn)
	}
	return ts
}

// Next is a tenant no phase has used yet.
func (ts *Tenants) Next(t testing.TB) Tenant {
	t.Helper()
	if ts.used == len(ts.All) {
		t.Fatalf("all %d tenants used", len(ts.All))
	}
	ts.used++
	return ts.All[ts.used-1]
}

// YAML is the config's tenants key listing them, each with its keys file.
func (ts *Tenants) YAML() string {
	var b strings.Builder
	b.WriteString("tenants:\n")
	for _, tn := range ts.All {
		fmt.Fprintf(&b, "  - {name: %s, keys_file: %s}\n", tn.Name, tn.KeysFile)
	}
	return b.String()
}

// Phase runs a budget phase with a fresh tenant, again with another when its requests
// straddled a boundary of the service's fixed windows (InOneWindow); it returns the tenant
// of the run kept and its answers.
func (ts *Tenants) Phase(t testing.TB, phase func(Tenant) []Answer) (Tenant, []Answer) {
	t.Helper()
	var tn Tenant
	res := InOneWindow(t, func(int) []Answer {
		tn = ts.Next(t)
		return phase(tn)
	})
	return tn, res
}

// Shot is one request to send: to which replica (an index into the addresses Send is
// given), as which tenant's key, and its token charge (for a tokens budget).
type Shot struct {
	Replica int
	Key     string
	Body    []byte
	Charge  int
}

// Answer is a shot's outcome.
type Answer struct {
	Shot
	Status           int
	RetryAfter       string
	ErrType, ErrCode string
	Message          string
	Failed           string // the request failed before an answer: why
}

// Send sends the shots, workers at a time, each to its replica's /v1/chat/completions
// (addrs[shot.Replica], host:port); a shot that got no answer fails t.
func Send(t testing.TB, hc *http.Client, addrs []string, workers int, shots []Shot) []Answer {
	t.Helper()
	res := make([]Answer, len(shots))
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
				res[i], _ = Do(hc, addrs[shots[i].Replica], shots[i])
			}
		}()
	}
	wg.Wait()
	for _, a := range res {
		if a.Failed != "" {
			t.Errorf("replica %d: %s", a.Replica, a.Failed)
		}
	}
	return res
}

// Do sends one shot to the gateway at addr and returns its answer, with the answer's headers
// (nil when there was none).
func Do(hc *http.Client, addr string, s Shot) (Answer, http.Header) {
	a := Answer{Shot: s}
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(s.Body))
	if err != nil {
		a.Failed = err.Error()
		return a, nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.Key)
	resp, err := hc.Do(req)
	if err != nil {
		a.Failed = err.Error()
		return a, nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		a.Failed = "reading the answer: " + err.Error()
		return a, resp.Header
	}
	a.Status, a.RetryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Type    string `json:"type"`
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil {
			a.ErrType, a.ErrCode, a.Message = e.Error.Type, e.Error.Code, e.Error.Message
		}
	}
	return a, resp.Header
}

// CheckBudget checks that the fleet of replicas admitted budget ± Tolerance (what each
// answer costs: cost), with every replica admitting some and refusing some, and that every
// refusal is OpenAI's 429 rate_limit_exceeded of type typ with the service's reset as
// Retry-After.
func CheckBudget(t testing.TB, res []Answer, replicas, budget int, typ string, cost func(Answer) int) {
	t.Helper()
	admitted := 0
	perReplica := make([][2]int, replicas) // admitted, refused
	for _, a := range res {
		if a.Replica < 0 || a.Replica >= replicas {
			t.Fatalf("an answer of replica %d of %d", a.Replica, replicas)
		}
		switch a.Status {
		case http.StatusOK:
			admitted += cost(a)
			perReplica[a.Replica][0]++
		case http.StatusTooManyRequests:
			perReplica[a.Replica][1]++
			ra, err := strconv.Atoi(a.RetryAfter)
			if a.ErrCode != "rate_limit_exceeded" || a.ErrType != typ || err != nil || ra < 1 || ra > 60 {
				t.Errorf("replica %d: 429 code %q type %q Retry-After %q, want rate_limit_exceeded, %s, 1..60 seconds",
					a.Replica, a.ErrCode, a.ErrType, a.RetryAfter, typ)
			}
		default:
			t.Errorf("replica %d: status %d (%s), want 200 or 429", a.Replica, a.Status, a.ErrCode)
		}
	}
	lo, hi := float64(budget)*(1-Tolerance), float64(budget)*(1+Tolerance)
	t.Logf("%d %s admitted of a budget of %d over %d requests; per replica [admitted refused]: %v", admitted, typ, budget, len(res), perReplica)
	if float64(admitted) < lo || float64(admitted) > hi {
		t.Errorf("the fleet admitted %d %s, want %d ± %.0f%% [%.0f, %.0f]", admitted, typ, budget, Tolerance*100, lo, hi)
	}
	for i, n := range perReplica {
		if n[0] == 0 || n[1] == 0 {
			t.Errorf("replica %d admitted %d and refused %d: want some of each (a shared budget)", i, n[0], n[1])
		}
	}
}

// NoFailures checks that no call to the service failed during a budget phase (a call that
// fails admits its request, which would blur the count): before and after are each
// replica's FailuresMetric.
func NoFailures(t testing.TB, before, after []float64) {
	t.Helper()
	for i := range before {
		if after[i] != before[i] {
			t.Errorf("replica %d: %v calls to the service failed during the phase (fail open)", i, after[i]-before[i])
		}
	}
}

// UpFrontCharge is the token charge the policy sends as hits_addend for a chat body: the
// prompt estimate plus max_tokens (below the default cap of 4096), × n.
func UpFrontCharge(t testing.TB, body []byte) int {
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

// ChatBody is chat request i to model, asking for maxTokens.
func ChatBody(model string, i, maxTokens int) []byte {
	return fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"Question %d: what is a token bucket?"}],"max_tokens":%d}`,
		model, i, maxTokens)
}
