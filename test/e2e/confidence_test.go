package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/test/sim"
)

// TestConfidencePolicy: a route with a confidence policy builds from the config; its
// Admitter decides which requests it asks logprobs for (every streamed chat request without
// them, at sample 1), counted in /admin/policies?type=confidence and /metrics; the client never gets
// logprobs it did not ask for, and gets them unchanged when it did.
func TestConfidencePolicy(t *testing.T) {
	s := startSim(t, sim.Config{})
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n",
		"    policies:\n      - {type: confidence, params: {sample: 1, top_logprobs: 4, models: [sim-llama]}}\n", s.URL))
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"

	plain := `{"model":"sim-llama","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	resp, body := do(t, hc, http.MethodPost, url, plain, "X-Request-Id", "conf-1")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if strings.Contains(string(body), "top_logprobs") {
		t.Fatalf("the client got logprobs it did not ask for:\n%s", body)
	}
	asked := `{"model":"sim-llama","stream":true,"max_tokens":16,"logprobs":true,"top_logprobs":2,"messages":[{"role":"user","content":"hi"}]}`
	resp, body = do(t, hc, http.MethodPost, url, asked, "X-Request-Id", "conf-2")
	if resp.StatusCode != http.StatusOK || strings.Count(string(body), `"top_logprobs":[`) < 8 {
		t.Fatalf("the client asked for logprobs: %d %s", resp.StatusCode, body)
	}

	resp, b := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/policies?type=confidence", "")
	var view struct {
		Policies []struct {
			View struct {
				Route   string `json:"route"`
				Name    string `json:"name"`
				Sampled uint64 `json:"sampled"`
				Params  struct {
					Sample      float64 `json:"sample"`
					TopLogprobs int     `json:"top_logprobs"`
				} `json:"params"`
			} `json:"view"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(b, &view); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/confidence: %d %s %v", resp.StatusCode, b, err)
	}
	if len(view.Policies) != 1 {
		t.Fatalf("/admin/confidence: %s", b)
	}
	p := view.Policies[0].View
	if p.Route != "all" || p.Name != "confidence" || p.Sampled != 1 || p.Params.TopLogprobs != 4 || p.Params.Sample != 1 {
		t.Errorf("/admin/confidence: %+v", p)
	}
	if v := metricValue(t, hc, g.admin, "sluice_confidence_sampled_total", `route="all"`, `policy="confidence"`); v != 1 {
		t.Errorf("sluice_confidence_sampled_total %v, want 1", v)
	}
}
