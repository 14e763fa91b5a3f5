package e2e

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluicegw/sluice/test/sim"
)

// TestModelsList: GET /v1/models lists every model Sluice can serve — what each route's
// clusters advertise (their own objects, max_model_len kept) and the names routes answer to
// (a route for "gpt-4o" rewritten to a local model) — not only the default route's cluster.
func TestModelsList(t *testing.T) {
	llama := startRoutingUpstream(t, sim.Config{Model: "llama-3-8b", MaxModelLen: 32768}, -1)
	qwen := startRoutingUpstream(t, sim.Config{Model: "qwen-7b"}, -1)
	embed := startRoutingUpstream(t, sim.Config{Model: "bge-small"}, -1)
	g := startGateway(t, routingConfig(`  - {name: llama, match: {model: llama-3-8b}, cluster: llama}
  - {name: qwen, match: {model: "qwen*"}, cluster: qwen}
  - {name: alias, match: {model: gpt-4o}, cluster: llama, model: llama-3-8b}
  - {name: embed, match: {path_prefix: /v1/embeddings}, cluster: embed}
`, "llama", llama.URL, "qwen", qwen.URL, "embed", embed.URL))
	client := newClient(t, g.addr)
	ctx := testCtx(t)
	page, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	want := []string{"llama-3-8b", "qwen-7b", "bge-small", "gpt-4o"}
	if !slices.Equal(ids, want) {
		t.Fatalf("models %v, want %v", ids, want)
	}
	// The server's own object, vendor fields kept; the alias says what it serves.
	var raw struct {
		Data []map[string]any `json:"data"`
	}
	_, body := do(t, newHTTPClient(t), http.MethodGet, "http://"+g.addr+"/v1/models", "")
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if got := raw.Data[0]["max_model_len"]; got != float64(32768) {
		t.Errorf("llama's max_model_len %v, want the advertised 32768: %s", got, body)
	}
	if a := raw.Data[3]; a["owned_by"] != "sluice" || a["root"] != "llama-3-8b" || a["max_model_len"] != float64(32768) {
		t.Errorf("alias object %v", a)
	}

	m, err := client.Models.Get(ctx, "qwen-7b")
	if err != nil || m.ID != "qwen-7b" {
		t.Errorf("GET /v1/models/qwen-7b: %v %+v", err, m)
	}
	_, err = client.Models.Get(ctx, "mistral")
	if e := apiErrOf(t, err, http.StatusNotFound, "model_not_found"); e.Param != "model" {
		t.Errorf("unknown model: %+v", e)
	}
}

// TestMissingModel: a body without "model" is served when its route serves one model (vLLM
// serves its default model): the route's rewrite, else the one model its cluster advertises.
// With several, it is a 400 that names them.
func TestMissingModel(t *testing.T) {
	one := startRoutingUpstream(t, sim.Config{Model: "llama-3-8b"}, -1)
	other := startRoutingUpstream(t, sim.Config{Model: "qwen-7b"}, -1)
	hc := newHTTPClient(t)
	noModel := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	for _, tc := range []struct {
		name   string
		yaml   string
		status int
		model  string // the model the answer names
		msg    string
	}{
		{"one model advertised", routingConfig("  - {name: all, cluster: one}\n", "one", one.URL), 200, "llama-3-8b", ""},
		{"route rewrite", routingConfig("  - {name: all, cluster: both, model: qwen-7b}\n", "both", other.URL), 200, "qwen-7b", ""},
		{"exact-model route", routingConfig("  - {name: q, match: {model: qwen-7b}, cluster: q}\n", "q", other.URL), 200, "qwen-7b", ""},
		{"several models", "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n" +
			"  - {name: mixed, endpoints: [{url: " + one.URL + "}, {url: " + other.URL + "}], health_check: {disabled: true}}\n" +
			"routes:\n  - {name: all, cluster: mixed}\n", 400, "", "This route serves several models (llama-3-8b, qwen-7b)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, tc.yaml)
			resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", noModel)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status != 200 {
				if !strings.Contains(string(body), tc.msg) || !strings.Contains(string(body), `"missing_field"`) {
					t.Errorf("body %s, want missing_field and %q", body, tc.msg)
				}
				return
			}
			var c struct{ Model string }
			if err := json.Unmarshal(body, &c); err != nil || c.Model != tc.model {
				t.Errorf("answered by model %q (%v), want %q: %s", c.Model, err, tc.model, body)
			}
		})
	}
}

// TestAdvertisedContextWindow: a model server's advertised max_model_len wins over the
// built-in table (8192 for *llama-3-*), and a request over the window gets vLLM's 400.
func TestAdvertisedContextWindow(t *testing.T) {
	up := startRoutingUpstream(t, sim.Config{Model: "meta-llama-3-8b", MaxModelLen: 32768}, -1)
	g := startGateway(t, "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n"+
		"  - {name: main, endpoints: [{url: "+up.URL+"}], health_check: {interval: 20ms}}\n"+
		"routes:\n  - {name: all, cluster: main}\n")
	client := newClient(t, g.addr)
	ctx := testCtx(t)
	params := openai.ChatCompletionNewParams{
		Model:     "meta-llama-3-8b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Write a long essay.")},
		MaxTokens: openai.Int(12000), // over the table's 8192, within the server's 32768
	}
	eventually(t, 5*time.Second, "12000 max_tokens accepted once the server's window is known", func() bool {
		_, err := client.Chat.Completions.New(ctx, params)
		return err == nil
	})
	params.MaxTokens = openai.Int(40000)
	_, err := client.Chat.Completions.New(ctx, params)
	e := apiErrOf(t, err, http.StatusBadRequest, "context_length_exceeded")
	if !strings.HasPrefix(e.Message, "This model's maximum context length is 32768 tokens. However, you requested ") || e.Param != "messages" {
		t.Errorf("error %+v, want vLLM's words with the advertised window", e)
	}
}

// TestHealthPathDefault: a model server without /health (it answers 404 there, as Ollama
// does) stays in service: the default health check falls back to /v1/models. With the path
// configured to /health it is marked unhealthy, as configured.
func TestHealthPathDefault(t *testing.T) {
	up := startRoutingUpstream(t, sim.Config{NoHealth: true}, -1)
	hc := newHTTPClient(t)
	cfg := func(path string) string {
		return "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n" +
			"  - {name: main, endpoints: [{url: " + up.URL + "}], health_check: {interval: 10ms, unhealthy_threshold: 2" + path + "}}\n" +
			"routes:\n  - {name: all, cluster: main}\n"
	}
	body := `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`

	g := startGateway(t, cfg(""))
	time.Sleep(150 * time.Millisecond) // fifteen checks: enough to mark it unhealthy, were it
	for i := range 3 {
		if resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s: a server without /health was taken out of service", i, resp.StatusCode, b)
		}
	}

	g2 := startGateway(t, cfg(", path: /health"))
	eventually(t, 5*time.Second, "the endpoint marked unhealthy on a configured /health that 404s", func() bool {
		resp, _ := do(t, hc, http.MethodPost, "http://"+g2.addr+"/v1/chat/completions", body)
		return resp.StatusCode == http.StatusServiceUnavailable
	})
}
