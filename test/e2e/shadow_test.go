package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/sim"
)

// shadowConfig is a gateway with a primary cluster "main" and a sandbox cluster "cand", one
// route mirroring to it, verdicts every 100ms on at least 20 samples a side.
func shadowConfig(primary, candidate, mirror, extra string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
shadow: {interval: 100ms, window: 200, verdict: {min_samples: 20}}
%s
clusters:
  - name: main
    endpoints: [{url: %s}]
  - name: cand
    endpoints: [{url: %s}]
    api_key: sandbox-key
routes:
  - name: chat
    cluster: main
    mirror: %s
`, extra, primary, candidate, mirror)
}

const toolChat = `{"model":"sim-llama","stream":true,"max_tokens":24,"messages":[{"role":"user","content":"weather in %d?"}],
"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}`

const plainChat = `{"model":"sim-llama","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"tell me about %d"}]}`

// drive sends n streaming requests, conc at a time, each its own session, and fails the test
// on any primary error.
func drive(t *testing.T, hc *http.Client, g *gateway, n, conc int, body string) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	var mu sync.Mutex
	var failed []string
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(body, i)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", fmt.Sprintf("s-%d", i))
			resp, err := hc.Do(req)
			if err != nil {
				mu.Lock()
				failed = append(failed, err.Error())
				mu.Unlock()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
				mu.Lock()
				failed = append(failed, fmt.Sprintf("%d %s", resp.StatusCode, b))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d primary requests failed, first: %s", len(failed), failed[0])
	}
}

// verdictIs waits for the route's verdict metric to show decision.
func verdictIs(t *testing.T, hc *http.Client, g *gateway, decision string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, hc, g.admin, "sluice_shadow_verdict", `route="chat"`, `decision="`+decision+`"`) != 1 {
		if time.Now().After(deadline) {
			_, body := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/shadow.json", "")
			var rep shadow.Report
			_ = json.Unmarshal(body, &rep)
			if len(rep.Routes) == 1 && rep.Routes[0].Verdict != nil {
				v := rep.Routes[0].Verdict
				t.Logf("verdict %s: %s", v.Decision, v.Reason)
				for _, e := range v.Evidence {
					t.Logf("  %-22s %-13s n=%d/%d p=%.3g primary=%.4g candidate=%.4g", e.Metric, e.Verdict, e.NPrimary, e.NCandidate, e.P, e.Primary, e.Cand)
				}
			}
			t.Fatalf("no %s verdict within 10s", decision)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestShadowVerdicts plants regressions in the candidate and checks the verdict: an identical
// candidate is promoted, one 30% slower to the first token is rolled back, and one that drops
// tool calls (the drift fault on the sandbox cluster) is rolled back as critical.
func TestShadowVerdicts(t *testing.T) {
	// One request at a time: the simulator runs prefills one after another, so concurrent
	// arrivals would make TTFT depend on arrival order (a bimodal spread that hides a 30% shift
	// in the medians of 40 samples).
	base := sim.Config{TTFT: 50 * time.Millisecond, ITL: 2 * time.Millisecond, Seed: 1}
	for _, tc := range []struct {
		name     string
		cand     sim.Config
		extra    string
		body     string
		decision string
		metric   string // the metric that must show a regression ("" for promote)
	}{
		{"identical", base, "", plainChat, "promote", ""},
		{"slower ttft", sim.Config{TTFT: 65 * time.Millisecond, ITL: 2 * time.Millisecond, Seed: 1}, "", plainChat, "rollback", "ttft"},
		{"tool calls dropped", base,
			"chaos: {enabled: true, faults: [{kind: drift, cluster: cand, remove: ['choices[].delta.tool_calls']}]}",
			toolChat, "rollback", "tool_call_breakage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startSim(t, base)
			c := startSim(t, tc.cand)
			g := startGateway(t, shadowConfig(p.URL, c.URL, "{cluster: cand, fraction: 1, max_concurrency: 8}", tc.extra))
			hc := newHTTPClient(t)
			drive(t, hc, g, 40, 1, tc.body)
			eventually(t, 10*time.Second, "40 pairs", func() bool {
				return metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`) >= 40
			})
			verdictIs(t, hc, g, tc.decision)
			if tc.metric != "" {
				_, body := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/shadow.json", "")
				var rep shadow.Report
				if err := json.Unmarshal(body, &rep); err != nil || len(rep.Routes) != 1 || rep.Routes[0].Verdict == nil {
					t.Fatalf("report: %v\n%s", err, body)
				}
				found := false
				for _, e := range rep.Routes[0].Verdict.Evidence {
					if e.Metric == tc.metric && e.Verdict == shadow.Regression {
						found = true
					}
				}
				if !found {
					t.Fatalf("no regression of %s in the evidence: %+v", tc.metric, rep.Routes[0].Verdict)
				}
				_, page := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/shadow", "")
				if !strings.Contains(string(page), "rollback") || !strings.Contains(string(page), "<html") {
					t.Fatalf("HTML report lacks the verdict: %.300s", page)
				}
			}
		})
	}
}

// TestMirrorQueueFullDrops: a sandbox that does not answer fills the one worker and the queue
// of one; the other copies are dropped and counted, and every primary request is served.
func TestMirrorQueueFullDrops(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	sandbox := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	p := startSim(t, sim.Config{})
	g := startGateway(t, shadowConfig(p.URL, sandbox.URL, "{cluster: cand, fraction: 1, max_concurrency: 1, max_queue: 1}", ""))
	hc := newHTTPClient(t)
	drive(t, hc, g, 10, 4, plainChat)
	if d := metricValue(t, hc, g.admin, "sluice_shadow_dropped_total", `route="chat"`); d != 8 {
		t.Fatalf("dropped %v copies, want 8 (one in the worker, one queued)", d)
	}
	if o := metricValue(t, hc, g.admin, "sluice_shadow_offered_total", `route="chat"`); o != 10 {
		t.Fatalf("offered %v, want 10", o)
	}
	once.Do(func() { close(release) })
}

// TestMirrorCredentials: the copy carries neither the client's credentials nor the stripped
// headers, gets the sandbox's own key and the set headers, is a stream when the request is,
// and is not charged to the tenant's rate limit.
func TestMirrorCredentials(t *testing.T) {
	t.Setenv("SHADOW_TENANT_KEYS", "tenant-secret")
	var queries sync.Map
	sandbox := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		queries.Store(r.URL.RawQuery, true)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	})
	p := startSim(t, sim.Config{})
	cfg := shadowConfig(p.URL, sandbox.URL,
		"{cluster: cand, fraction: 1, strip_headers: [x-internal], set_headers: {x-env: shadow}}",
		"tenants: [{name: acme, keys_env: SHADOW_TENANT_KEYS}]")
	cfg = strings.Replace(cfg, "    mirror:", "    policies: [{type: ratelimit, params: {requests_per_minute: 3, burst: 3}}]\n    mirror:", 1)
	g := startGateway(t, cfg)
	hc := newHTTPClient(t)
	for i := range 3 {
		resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions?api-key=qsecret&trace=1", fmt.Sprintf(plainChat, i),
			"Authorization", "Bearer tenant-secret", "Cookie", "session=abc", "X-Api-Key", "k", "X-Internal", "1",
			"X-Sluice-Admin-Token", "admin-secret", "X-Goog-Api-Key", "g", "X-Auth-Token", "a", "Ocp-Apim-Subscription-Key", "o")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s (mirrored copies must not be charged to the tenant)", i, resp.StatusCode, body)
		}
	}
	eventually(t, 5*time.Second, "3 copies at the sandbox", func() bool { return sandbox.count() == 3 })
	h := sandbox.last(t)
	for _, k := range []string{"Cookie", "X-Api-Key", "X-Internal", "X-Sluice-Admin-Token", "X-Goog-Api-Key", "X-Auth-Token", "Ocp-Apim-Subscription-Key"} {
		if v := h.Get(k); v != "" {
			t.Errorf("sandbox got %s: %q", k, v)
		}
	}
	if a := h.Get("Authorization"); a != "Bearer sandbox-key" {
		t.Errorf("sandbox Authorization = %q, want the sandbox's own key", a)
	}
	if h.Get("X-Env") != "shadow" || h.Get("X-Sluice-Mirror") != "candidate" {
		t.Errorf("set headers missing: %v", h)
	}
	queries.Range(func(k, _ any) bool {
		if q := k.(string); strings.Contains(q, "secret") || !strings.Contains(q, "trace=1") {
			t.Errorf("sandbox query %q: credentials must go, the rest stay", q)
		}
		return true
	})
	for _, b := range sandbox.allBodies() {
		if !strings.Contains(b, `"stream":true`) {
			t.Errorf("copy is not a stream: %s", b)
		}
	}
}

// TestMirrorWholeSessions: at fraction 0.5 every request of a session is mirrored or none is.
func TestMirrorWholeSessions(t *testing.T) {
	sandbox := startRecorder(t, nil)
	p := startSim(t, sim.Config{})
	g := startGateway(t, shadowConfig(p.URL, sandbox.URL, "{cluster: cand, fraction: 0.5}", ""))
	hc := newHTTPClient(t)
	body := `{"model":"sim-llama","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	want := 0
	for s := range 20 {
		for range 3 {
			resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body, "X-Session-Id", fmt.Sprintf("conv-%d", s))
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
		}
	}
	eventually(t, 5*time.Second, "copies settle", func() bool {
		n := sandbox.count()
		if n%3 != 0 {
			return false
		}
		want = n
		return metricValue(t, hc, g.admin, "sluice_shadow_offered_total", `route="chat"`) == float64(n)
	})
	if want == 0 || want == 60 {
		t.Fatalf("%d of 60 requests mirrored at fraction 0.5", want)
	}
	seen := map[string]int{}
	for _, h := range sandbox.all() {
		seen[h.Get("X-Session-Id")]++
	}
	for s, n := range seen {
		if n != 3 {
			t.Errorf("session %s: %d of its 3 requests mirrored", s, n)
		}
	}
}

// TestShadowProgression: on a file-configured route, promote steps the candidate's split
// weight up to the maximum, and live traffic follows it.
func TestShadowProgression(t *testing.T) {
	base := sim.Config{TTFT: 50 * time.Millisecond, ITL: 2 * time.Millisecond, Seed: 1}
	p := startSim(t, base)
	c := startSim(t, base)
	cfg := shadowConfig(p.URL, c.URL, "{cluster: cand, fraction: 1, progression: {step: 10, interval: 100ms, max: 30}}", "")
	cfg = strings.Replace(cfg, "    cluster: main\n", "    splits: [{cluster: main, weight: 100}, {cluster: cand, weight: 0}]\n", 1)
	g := startGateway(t, cfg)
	hc := newHTTPClient(t)
	drive(t, hc, g, 40, 1, plainChat)
	verdictIs(t, hc, g, "promote")
	eventually(t, 10*time.Second, "the candidate's weight at its maximum", func() bool {
		_, body := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/shadow.json", "")
		var rep shadow.Report
		return json.Unmarshal(body, &rep) == nil && len(rep.Routes) == 1 && strings.Contains(rep.Routes[0].Action, "weight cand 20→30")
	})
	toCand := 0
	for i := range 40 {
		resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions",
			fmt.Sprintf(`{"model":"sim-llama","max_tokens":2,"messages":[{"role":"user","content":"%d"}]}`, i), "X-Session-Id", fmt.Sprintf("p-%d", i))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if resp.Header.Get("X-Sluice-Upstream") == "cand" {
			toCand++
		}
	}
	// Weight 30 of 130: about 9 of 40; far from 0 and from 40.
	if toCand < 2 || toCand > 25 {
		t.Errorf("%d of 40 requests went to the candidate at weight 30/130", toCand)
	}
}
