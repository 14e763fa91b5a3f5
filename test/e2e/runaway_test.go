package e2e

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

// TestRunawayPolicyConfig: a route's `{type: runaway}` policy is built from the config, shown
// by /admin/policies?type=runaway with its params, exported in /metrics, and its bad params are refused
// all at once.
func TestRunawayPolicyConfig(t *testing.T) {
	s := startSim(t, sim.Config{})
	g := startGateway(t, oneRoute("", `    policies:
      - type: runaway
        params: {action: flag, max_period: 128, min_words: 64}
`, s.URL))
	hc := newHTTPClient(t)
	resp, body := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/policies?type=runaway", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/runaway: %d %s", resp.StatusCode, body)
	}
	var view struct {
		Policies []struct {
			View struct {
				Route  string `json:"route"`
				Name   string `json:"name"`
				Params struct {
					Action    string `json:"action"`
					MaxPeriod int    `json:"max_period"`
					MinWords  int    `json:"min_words"`
					Repeats   int    `json:"repeats"`
				} `json:"params"`
				Stats struct {
					Streams uint64            `json:"streams"`
					Counts  []json.RawMessage `json:"counts"`
				} `json:"stats"`
				Recent []json.RawMessage `json:"recent"`
			} `json:"view"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(body, &view); err != nil {
		t.Fatalf("/admin/runaway: %v: %s", err, body)
	}
	if len(view.Policies) != 1 {
		t.Fatalf("/admin/runaway: %s", body)
	}
	p := view.Policies[0].View
	if p.Route != "all" || p.Name != "runaway" || p.Params.Action != "flag" || p.Params.MaxPeriod != 128 || p.Params.MinWords != 64 ||
		p.Params.Repeats != 3 || p.Stats.Counts == nil || p.Recent == nil {
		t.Fatalf("/admin/runaway: %s", body)
	}
	if _, m := do(t, hc, http.MethodGet, "http://"+g.admin+"/metrics", ""); !strings.Contains(string(m), "sluice_runaway_streams_total{") {
		t.Error("/metrics has no sluice_runaway_streams_total")
	}
	if v := metricValue(t, hc, g.admin, "sluice_runaway_streams_total", `route="all"`); v != float64(p.Stats.Streams) {
		t.Errorf("sluice_runaway_streams_total = %v, the admin view says %d", v, p.Stats.Streams)
	}

	cfg, err := config.Parse([]byte(oneRoute("", "    policies:\n      - {type: runaway, params: {action: block, repeats: 1, fields: [content]}}\n", s.URL)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		_ = srv.Shutdown(context.Background())
		t.Fatal("proxy.New accepted bad runaway params")
	}
	for _, want := range []string{"routes[0].policies[0] (runaway)", `action must be "cut" or "flag"`, "repeats must be in [2, 1000]", `fields[0] must be "text" or "arguments"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestRunawayCutThroughGateway: with the official client, a stream the model server lets fall
// into a loop (x-sim-loop-after) ends cleanly: no error, finish_reason "length", far fewer
// tokens than max_tokens, and the upstream request is cancelled (the simulator sees its
// client go away); an ordinary answer on the same route runs to its end; the guard's tenant
// breaker counts the loop.
func TestRunawayCutThroughGateway(t *testing.T) {
	s := startSim(t, sim.Config{ITL: time.Millisecond})
	g := startGateway(t, oneRoute("", `    policies:
      - type: runaway
`, s.URL))
	client := newClient(t, g.addr)
	params := openai.ChatCompletionNewParams{
		Model:     "sim-llama",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me about rivers")},
		MaxTokens: openai.Int(4096),
	}
	read := func(opts ...option.RequestOption) (openai.ChatCompletionAccumulator, int, error) {
		stream := client.Chat.Completions.NewStreaming(testCtx(t), params, opts...)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		n := 0
		for stream.Next() {
			c := stream.Current()
			acc.AddChunk(c)
			if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
				n++
			}
		}
		return acc, n, stream.Err()
	}
	acc, n, err := read(option.WithHeader(sim.HeaderLoopAfter, "50"))
	if err != nil {
		t.Fatalf("a cut stream ended with an error: %v", err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "length" || n < 50 || n > 400 {
		t.Fatalf("cut stream: %d tokens, choices %+v; want finish_reason length within a few hundred tokens", n, acc.Choices)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().Cancelled == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stats(); st.Cancelled != 1 || st.GenerationTokens > 1000 {
		t.Errorf("the upstream request was not cancelled at the cut: %+v", st)
	}
	// The shapes real clients send. Two choices (n: 2), both looping: the cut ends every
	// choice (the client's accumulator sees each with finish_reason length).
	stream2 := func(p openai.ChatCompletionNewParams, opts ...option.RequestOption) openai.ChatCompletionAccumulator {
		t.Helper()
		stream := client.Chat.Completions.NewStreaming(testCtx(t), p, opts...)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("n=%d, %d tools: the stream ended with an error: %v", p.N.Value, len(p.Tools), err)
		}
		return acc
	}
	n2 := params
	n2.N = openai.Int(2)
	acc2 := stream2(n2, option.WithHeader(sim.HeaderLoopAfter, "50"))
	if len(acc2.Choices) != 2 {
		t.Fatalf("n=2: %d choices, want 2", len(acc2.Choices))
	}
	for i, ch := range acc2.Choices {
		if ch.FinishReason != "length" {
			t.Errorf("n=2: choice %d finish_reason %q, want length (the cut ends every choice)", i, ch.FinishReason)
		}
	}
	// Tools offered and a tool call answered (its arguments streamed in pieces): watched,
	// never cut.
	withTools := params
	withTools.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name: "lookup", Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}},
	})}
	acc3 := stream2(withTools)
	if len(acc3.Choices) != 1 || acc3.Choices[0].FinishReason != "tool_calls" || len(acc3.Choices[0].Message.ToolCalls) != 1 ||
		!json.Valid([]byte(acc3.Choices[0].Message.ToolCalls[0].Function.Arguments)) {
		t.Errorf("a tool call through the runaway policy: %+v", acc3.Choices)
	}

	params.MaxTokens = openai.Int(200)
	acc, n, err = read()
	if err != nil || len(acc.Choices) != 1 || acc.Choices[0].FinishReason == "" || n < 100 {
		t.Fatalf("an ordinary answer: %d tokens, %+v, %v", n, acc.Choices, err)
	}
	hc := newHTTPClient(t)
	if v := metricValue(t, hc, g.admin, "sluice_runaway_detections_total", `action="cut"`); v != 2 {
		t.Errorf("sluice_runaway_detections_total{action=cut} = %v, want 2", v)
	}
	if v := metricValue(t, hc, g.admin, "sluice_guard_runaways_total"); v != 2 {
		t.Errorf("sluice_guard_runaways_total = %v, want 2 (each loop counts against the tenant's breaker)", v)
	}
}
