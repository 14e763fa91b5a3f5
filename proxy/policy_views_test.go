package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// policyMetricsConfig serves route plain (the default guard) and route all (a rate limiter,
// a concurrency limiter and a guard).
func policyMetricsConfig(upstream string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: c, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: plain
    cluster: c
    match: {model: p}
  - name: all
    cluster: c
    policies:
      - {type: ratelimit, params: {requests_per_minute: 2}}
      - {type: concurrency}
      - {type: guard, params: {max_depth: 3}}
`, upstream)
}

// TestPolicyMetricsExposed: the guard's, rate limiter's and concurrency limiter's metrics,
// which they report themselves, are on /metrics with the names, types, help texts and labels
// they had when the gateway exported them through OpenTelemetry, plus the policy's name
// (policy), one series set per policy.
func TestPolicyMetricsExposed(t *testing.T) {
	srv := startPolicyServer(t)
	for range 3 { // the third is over the rate limit
		post(t, http.DefaultClient, "http://"+srv.Addr()+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(adminGet(t, srv, "/metrics", nil)))
	if err != nil {
		t.Fatal(err)
	}
	guardRoutes := []string{"all", "plain"}
	for _, want := range []struct {
		name, help string
		typ        dto.MetricType
		labels     string   // label names, sorted
		routes     []string // the routes with series
		series     int      // per route
	}{
		{"sluice_guard_rejections_total", "Requests the prompt guard rejected, by code", dto.MetricType_COUNTER, "code policy route", guardRoutes, 8},
		{"sluice_guard_level", "Staged degradation level of the route (0 normal, 1 degraded, 2 shedding)", dto.MetricType_GAUGE, "policy route", guardRoutes, 1},
		{"sluice_guard_breaker_trips_total", "Times a tenant breaker of the route opened", dto.MetricType_COUNTER, "policy route", guardRoutes, 1},
		{"sluice_guard_breakers_open", "Tenant breakers of the route's guard that are open now", dto.MetricType_GAUGE, "policy route", guardRoutes, 1},
		{"sluice_guard_exact_counts_total", "Prompts counted exactly with the tokenizer (near a limit)", dto.MetricType_COUNTER, "policy route", guardRoutes, 1},
		{"sluice_guard_runaways_total", "Admitted requests whose answer fell into a loop, counted against the tenant's breaker", dto.MetricType_COUNTER, "policy route", guardRoutes, 1},
		{"sluice_ratelimit_rejections_total", "Requests the rate limiter rejected, by reason", dto.MetricType_COUNTER, "policy reason route", []string{"all"}, 6},
		{"sluice_ratelimit_global_failures_total", "Calls to the global rate limit service that failed (admitted: fail open)", dto.MetricType_COUNTER, "policy route", []string{"all"}, 1},
		{"sluice_concurrency_limit", "Adaptive concurrency limit of the route", dto.MetricType_GAUGE, "policy route", []string{"all"}, 1},
		{"sluice_concurrency_in_flight", "Requests holding a concurrency slot", dto.MetricType_GAUGE, "policy route", []string{"all"}, 1},
		{"sluice_concurrency_queue_length", "Requests waiting for a concurrency slot", dto.MetricType_GAUGE, "policy route", []string{"all"}, 1},
		{"sluice_concurrency_rejections_total", "Requests the concurrency limiter rejected, by reason", dto.MetricType_COUNTER, "policy reason route", []string{"all"}, 3},
		{"sluice_concurrency_wait_seconds", "Time admitted requests waited for a concurrency slot", dto.MetricType_HISTOGRAM, "policy route", []string{"all"}, 1},
	} {
		f := fams[want.name]
		if f == nil {
			t.Errorf("%s: not on /metrics", want.name)
			continue
		}
		if f.GetHelp() != want.help || f.GetType() != want.typ {
			t.Errorf("%s: %s %q, want %s %q", want.name, f.GetType(), f.GetHelp(), want.typ, want.help)
		}
		perRoute := map[string]int{}
		for _, m := range f.GetMetric() {
			lbls := map[string]string{}
			for _, l := range m.GetLabel() {
				lbls[l.GetName()] = l.GetValue()
			}
			if got := strings.Join(slices.Sorted(maps.Keys(lbls)), " "); got != want.labels {
				t.Errorf("%s: labels %s, want %s", want.name, got, want.labels)
			}
			if p := lbls["policy"]; !strings.HasPrefix(want.name, "sluice_"+p+"_") {
				t.Errorf("%s: policy %q, want the policy's name", want.name, p)
			}
			perRoute[lbls["route"]]++
		}
		for _, r := range want.routes {
			if perRoute[r] != want.series {
				t.Errorf("%s: %d series on route %s, want %d", want.name, perRoute[r], r, want.series)
			}
		}
		if len(perRoute) != len(want.routes) {
			t.Errorf("%s: series on routes %v, want %v", want.name, perRoute, want.routes)
		}
	}
	rej := fams["sluice_ratelimit_rejections_total"]
	for _, m := range rej.GetMetric() {
		if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "reason" && l.GetValue() == "requests" }) &&
			m.GetCounter().GetValue() != 1 {
			t.Errorf(`sluice_ratelimit_rejections_total{reason="requests"} = %v, want 1`, m.GetCounter().GetValue())
		}
	}
	if h := fams["sluice_concurrency_wait_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleCount() != 2 || len(h.GetBucket()) != 13 {
		t.Errorf("sluice_concurrency_wait_seconds: %d waits in %d buckets, want 2 in 13 (WaitBuckets and +Inf)", h.GetSampleCount(), len(h.GetBucket()))
	}
}

// TestPolicyTypeViews: the admin endpoints older than /admin/policies keep their shapes,
// served from the policies' own views; the breaker reset goes to the guards' ResetTenant.
func TestPolicyTypeViews(t *testing.T) {
	srv := startPolicyServer(t)
	post(t, http.DefaultClient, "http://"+srv.Addr()+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	keys := func(raw json.RawMessage) string {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return strings.Join(slices.Sorted(maps.Keys(m)), " ")
	}
	list := func(path, key string) []json.RawMessage {
		var out map[string][]json.RawMessage
		body := adminGet(t, srv, path, nil)
		if err := json.Unmarshal([]byte(body), &out); err != nil || len(out) != 1 {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
		return out[key]
	}

	breakers := list("/admin/breakers", "routes")
	if len(breakers) != 2 {
		t.Fatalf("/admin/breakers: %d guards, want 2: %s", len(breakers), breakers)
	}
	for i, route := range []string{"plain", "all"} {
		var g struct{ Route string }
		_ = json.Unmarshal(breakers[i], &g)
		if k := keys(breakers[i]); k != "breakers in_flight level route" || g.Route != route {
			t.Errorf("/admin/breakers[%d]: %s, want route %s with breakers, in_flight, level", i, breakers[i], route)
		}
	}

	limiters := list("/admin/ratelimits", "limiters")
	if len(limiters) != 1 || keys(limiters[0]) != "keys name route stats" {
		t.Fatalf("/admin/ratelimits: %s", limiters)
	}
	var rl struct {
		Route, Name string
		Stats       struct{ Admitted int }
		Keys        []struct{ Key string }
	}
	if err := json.Unmarshal(limiters[0], &rl); err != nil || rl.Route != "all" || rl.Name != "ratelimit" || rl.Stats.Admitted != 1 || len(rl.Keys) != 1 {
		t.Errorf("/admin/ratelimits: %+v (%v)", rl, err)
	}

	conc := list("/admin/concurrency", "limiters")
	if len(conc) != 1 || keys(conc[0]) != "name route state" {
		t.Fatalf("/admin/concurrency: %s", conc)
	}
	var cl struct {
		Route, Name string
		State       struct {
			Route string
			Limit int
		}
	}
	if err := json.Unmarshal(conc[0], &cl); err != nil || cl.Route != "all" || cl.Name != "concurrency" || cl.State.Route != "all" || cl.State.Limit == 0 {
		t.Errorf("/admin/concurrency: %+v (%v)", cl, err)
	}

	var all struct{ Policies []policyJSON }
	adminGet(t, srv, "/admin/policies", &all)
	contracts := map[string]string{}
	for _, p := range all.Policies {
		if p.Route == "all" {
			contracts[p.Type] = fmt.Sprint(p.Contracts)
		}
	}
	for typ, want := range map[string]string{
		"guard":       "[admitter admin_view metrics tenant_reset]",
		"ratelimit":   "[admitter admin_view metrics closer]",
		"concurrency": "[admitter admin_view metrics]",
	} {
		if contracts[typ] != want {
			t.Errorf("/admin/policies: %s offers %s, want %s", typ, contracts[typ], want)
		}
	}

	for _, tc := range []struct {
		query  string
		status int
		body   string
	}{
		{"?tenant=a&route=all", 200, `"reset": 0`},
		{"", 200, `"reset": 0`},
		{"?route=nope", 404, `"code":"unknown_route"`},
	} {
		resp, err := http.Post("http://"+srv.AdminAddr()+"/admin/breakers/reset"+tc.query, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.body) {
			t.Errorf("reset%s: %d %s, want %d %s", tc.query, resp.StatusCode, b, tc.status, tc.body)
		}
	}
}

// policyJSON is one entry of GET /admin/policies.
type policyJSON struct {
	Route     string   `json:"route"`
	Type      string   `json:"type"`
	Name      string   `json:"name"`
	Contracts []string `json:"contracts"`
	View      any      `json:"view"`
}

func startPolicyServer(t *testing.T) *Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(up.Close)
	return startTestServer(t, policyMetricsConfig(up.URL))
}
