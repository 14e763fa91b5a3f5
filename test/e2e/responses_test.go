package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluicegw/sluice/test/sim"
)

func responsesParams(input string, maxTokens int64) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model:           "sim-llama",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(input)},
		MaxOutputTokens: openai.Int(maxTokens),
	}
}

// streamResponse streams one Responses request and returns the text, the usage's output
// tokens, the number of text deltas, and the stream's error.
func streamResponse(t *testing.T, c openai.Client, p responses.ResponseNewParams, opts ...option.RequestOption) (text string, outTokens int64, deltas int, err error) {
	t.Helper()
	st := c.Responses.NewStreaming(testCtx(t), p, opts...)
	var b strings.Builder
	for st.Next() {
		ev := st.Current()
		switch ev.Type {
		case "response.output_text.delta":
			b.WriteString(ev.Delta)
			deltas++
		case "response.completed", "response.incomplete":
			outTokens = ev.Response.Usage.OutputTokens
		}
	}
	err = st.Err()
	_ = st.Close()
	return b.String(), outTokens, deltas, err
}

// TestResponsesAPI: POST /v1/responses is served like chat: the official client streams and
// gets whole answers; the tap measures it (TTFT at the first delta, tokens from usage); the
// policies see it (the guard's context window); a failure before the first token falls back
// even though the server sent its preamble events; a stream cut after tokens ends with a
// Responses error event that the client raises.
func TestResponsesAPI(t *testing.T) {
	primary := startRoutingUpstream(t, sim.Config{MaxModelLen: 4096}, -1)
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
`, "primary", primary.URL, "backup", backup.URL))
	client := newClient(t, g.addr)
	hc := newHTTPClient(t)
	ctx := testCtx(t)

	// Non-streaming.
	resp, err := client.Responses.New(ctx, responsesParams("Tell me about lighthouses.", 6), option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() == "" || resp.Usage.OutputTokens != 6 {
		t.Errorf("response %q, usage %+v", resp.OutputText(), resp.Usage)
	}

	// Streaming: whole, measured.
	text, out, deltas, err := streamResponse(t, client, responsesParams("Tell me about lighthouses.", 8), option.WithJSONSet("ignore_eos", true))
	if err != nil || text == "" || out != 8 || deltas != 8 {
		t.Errorf("stream: %v, text %q, %d output tokens, %d deltas", err, text, out, deltas)
	}
	if v := metricValue(t, hc, g.admin, "gen_ai_server_time_to_first_token_seconds_count", `gen_ai_operation_name="chat"`); v < 1 {
		t.Errorf("no TTFT recorded for the Responses stream (%v)", v)
	}
	if v := metricValue(t, hc, g.admin, "gen_ai_client_token_usage_sum", `gen_ai_token_type="output"`); v < 14 {
		t.Errorf("output tokens recorded %v, want at least 14 (6 + 8)", v)
	}

	// Policies: the guard knows the Responses body (max_output_tokens over the window).
	_, err = client.Responses.New(ctx, responsesParams("hi", 100000))
	if e := apiErrOf(t, err, http.StatusBadRequest, "context_length_exceeded"); e.Param != "input" {
		t.Errorf("context error param %q, want input", e.Param)
	}

	// The primary dies after its preamble (response.created, response.in_progress): nothing
	// the client can use was sent, so the fallback serves the whole stream.
	dies := startRoutingUpstream(t, sim.Config{}, 2)
	g3 := startGateway(t, routingConfig(`  - name: chat
    cluster: dies
    fallback: [{cluster: backup}]
`, "dies", dies.URL, "backup", backup.URL))
	before := backup.requests.Load()
	text, _, _, err = streamResponse(t, newClient(t, g3.addr), responsesParams("Tell me about lighthouses.", 8))
	if err != nil || text == "" || backup.requests.Load()-before != 1 {
		t.Errorf("died after the preamble: %v, text %q, backup asked %d times", err, text, backup.requests.Load()-before)
	}

	// Cut after tokens: a Responses error event, once, raised by the client.
	cut := startRoutingUpstream(t, sim.Config{}, 7)
	g2 := startGateway(t, routingConfig("  - {name: chat, cluster: cut}\n", "cut", cut.URL))
	resp2, raw := do(t, hc, http.MethodPost, "http://"+g2.addr+"/v1/responses",
		`{"model":"sim-llama","input":"Tell me about lighthouses.","stream":true,"max_output_tokens":20,"ignore_eos":true}`)
	if resp2.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp2.StatusCode, raw)
	}
	evs := parseSSE(raw)
	last := evs[len(evs)-1]
	if last.name != "error" || !strings.Contains(last.data, `"type":"error"`) || !strings.Contains(last.data, `"code":"stream_cut"`) ||
		strings.Count(string(raw), "event: error") != 1 || strings.Contains(string(raw), "[DONE]") {
		t.Errorf("cut Responses stream ends with %+v:\n%s", last, raw)
	}
	_, _, _, err = streamResponse(t, newClient(t, g2.addr), responsesParams("Tell me about lighthouses.", 20), option.WithJSONSet("ignore_eos", true))
	if err == nil {
		t.Error("openai-go: a cut Responses stream ended without an error")
	}
}

// TestShadowResponses: Responses traffic is mirrored and compared like chat: an identical
// candidate is promoted on Responses streams; the copies ask the sandbox to store nothing; a
// request that continues a stored response (previous_response_id) is not mirrored, since the
// sandbox has no such response.
func TestShadowResponses(t *testing.T) {
	// ITL 5 ms: at 2 ms the gateway's own few hundred microseconds per event (more under the
	// race detector) are a large share of a gap and the two sides' measurements drift apart.
	base := sim.Config{TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond, Seed: 1}
	p := startSim(t, base)
	c := sim.New(base)
	t.Cleanup(c.Close)
	var mu sync.Mutex
	stores := map[string]int{}
	cts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/responses" {
			b, _ := io.ReadAll(r.Body)
			var req struct {
				Store *bool `json:"store"`
			}
			_ = json.Unmarshal(b, &req)
			mu.Lock()
			stores[fmt.Sprint(req.Store != nil && *req.Store)]++
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		c.ServeHTTP(w, r)
	}))
	t.Cleanup(cts.Close)
	g := startGateway(t, shadowConfig(p.URL, cts.URL, "{cluster: cand, fraction: 1, max_concurrency: 8}", ""))
	hc := newHTTPClient(t)
	for i := range 40 {
		resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/responses",
			fmt.Sprintf(`{"model":"sim-llama","input":"tell me about %d","stream":true,"max_output_tokens":12}`, i),
			"X-Session-Id", fmt.Sprintf("s-%d", i))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "response.completed") && !strings.Contains(string(body), "response.incomplete") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	eventually(t, 10*time.Second, "40 pairs", func() bool {
		return metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`) >= 40
	})
	if v := metricValue(t, hc, g.admin, "sluice_shadow_candidate_failures_total", `route="chat"`); v != 0 {
		t.Errorf("%v candidate failures on identical Responses answers", v)
	}
	verdictIs(t, hc, g, "promote")
	mu.Lock()
	if stores["true"] != 0 || stores["false"] < 40 {
		t.Errorf("the copies' store fields %v, want every copy with store false", stores)
	}
	mu.Unlock()

	offered := metricValue(t, hc, g.admin, "sluice_shadow_offered_total", `route="chat"`)
	resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/responses",
		`{"model":"sim-llama","input":"and then?","previous_response_id":"resp_unknown","max_output_tokens":4}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown previous response: %d %s", resp.StatusCode, body)
	}
	if v := metricValue(t, hc, g.admin, "sluice_shadow_offered_total", `route="chat"`); v != offered {
		t.Errorf("a request with previous_response_id was mirrored (offered %v → %v)", offered, v)
	}
}

// TestResponsesFollowUpsGoHome: a model server keeps the Responses answers it stored in its
// own memory, so a follow-up naming one (previous_response_id) must reach that server. With
// two endpoints, each follow-up of a conversation goes to the endpoint that made the answer
// it continues, even with the least-loaded endpoint elsewhere.
func TestResponsesFollowUpsGoHome(t *testing.T) {
	a, b := startSim(t, sim.Config{}), startSim(t, sim.Config{})
	g := startGateway(t, "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n"+
		"  - {name: main, endpoints: [{url: "+a.URL+"}, {url: "+b.URL+"}], health_check: {disabled: true}}\n"+
		"routes:\n  - {name: all, cluster: main}\n")
	client := newClient(t, g.addr)
	ctx := testCtx(t)
	for conv := range 6 {
		p := responsesParams(fmt.Sprintf("Conversation %d: tell me about lighthouses.", conv), 4)
		resp, err := client.Responses.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for turn := range 4 {
			p := responsesParams("And then?", 4)
			p.PreviousResponseID = openai.String(resp.ID)
			if resp, err = client.Responses.New(ctx, p); err != nil {
				t.Fatalf("conversation %d, turn %d: %v (the follow-up missed the server that stored its answer)", conv, turn, err)
			}
		}
	}
}

// TestResponsesFailedStream: a Responses stream that the server ends with response.failed
// after tokens reaches the client with that event (its own words, once), is counted as a
// failure, and its answer is not remembered as stored.
func TestResponsesFailedStream(t *testing.T) {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	primary := startScripted(t,
		ev("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_f","status":"in_progress","output":[]}}`),
		ev("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":1,"item_id":"m","output_index":0,"content_index":0,"delta":"Hello"}`),
		ev("response.failed", `{"type":"response.failed","sequence_number":2,"response":{"id":"resp_f","status":"failed","error":{"code":"server_error","message":"engine died"},"output":[]}}`))
	g := startGateway(t, routingConfig("  - {name: chat, cluster: primary}\n", "primary", primary.URL))
	hc := newHTTPClient(t)
	resp, raw := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/responses", `{"model":"sim-llama","input":"hi","stream":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	evs := parseSSE(raw)
	if last := evs[len(evs)-1]; last.name != "response.failed" || strings.Count(string(raw), "engine died") != 1 || strings.Contains(string(raw), "event: error") {
		t.Errorf("the failed stream ends with %q:\n%s", last.name, raw)
	}
	if v := metricValue(t, hc, g.admin, "sluice_requests_total", `error_type="stream_error"`); v != 1 {
		t.Errorf("a failed Responses stream counted %v times as stream_error, want 1 (a success otherwise)", v)
	}
}

// TestResponsesFollowUpHomeSplit: a follow-up goes to the split that made the stored answer
// with that split's model rewrite, even when the follow-up itself would take another split.
func TestResponsesFollowUpHomeSplit(t *testing.T) {
	a, b := startSim(t, sim.Config{Model: "m"}), startSim(t, sim.Config{Model: "canary"})
	g := startGateway(t, routingConfig(`  - name: chat
    splits: [{cluster: a, weight: 100}, {cluster: b, weight: 0, gray_flag: v2, model: canary}]
`, "a", a.URL, "b", b.URL))
	client := newClient(t, g.addr)
	ctx := testCtx(t)
	p := responsesParams("hello", 4)
	p.Model = "m"
	first, err := client.Responses.New(ctx, p, option.WithHeader("X-Gray-Flag", "v2"))
	if err != nil {
		t.Fatalf("flagged request: %v", err)
	}
	if first.Model != "canary" {
		t.Fatalf("flagged request served by model %q, want canary", first.Model)
	}
	p = responsesParams("and then?", 4)
	p.Model = "m"
	p.PreviousResponseID = openai.String(first.ID)
	next, err := client.Responses.New(ctx, p)
	if err != nil {
		t.Fatalf("follow-up without the flag: %v: it must reach split b with its rewrite", err)
	}
	if next.Model != "canary" {
		t.Fatalf("follow-up served by model %q, want canary", next.Model)
	}
}
