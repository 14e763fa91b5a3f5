package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluicegw/sluice/test/sim"
)

// scripted is an upstream that answers every streaming request with the same SSE events and
// then closes the stream (no [DONE] unless the script has one). It counts /v1/ requests.
type scripted struct {
	URL      string
	requests atomic.Int64
}

func startScripted(t *testing.T, events ...string) *scripted {
	t.Helper()
	s := &scripted{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			return
		}
		s.requests.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			fmt.Fprint(w, ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(ts.Close)
	s.URL = ts.URL
	return s
}

func chunk(delta string, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"sim-llama","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + fr + `}]}` + "\n\n"
}

const streamBody = `{"model":"sim-llama","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`

// TestResumeToolCallStream: a stream of tool-call deltas cut after 3 events is never resumed
// (a continuation would send the same call id twice and arguments that no longer parse): it
// ends with the in-band error, and the official client raises it.
func TestResumeToolCallStream(t *testing.T) {
	primary := startRoutingUpstream(t, sim.Config{}, 3)
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
    resume: true
`, "primary", primary.URL, "backup", backup.URL))
	body := `{"model":"sim-llama","stream":true,"max_tokens":64,"tool_choice":"required",` +
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],` +
		`"messages":[{"role":"user","content":"What is the weather in Paris?"}]}`
	resp, raw := do(t, newHTTPClient(t), http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	ids := map[string]int{}
	var args strings.Builder
	errors, roles := 0, 0
	for _, ev := range parseSSE(raw) {
		if ev.name == "error" || strings.Contains(ev.data, `"error"`) {
			errors++
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Role      string `json:"role"`
					ToolCalls []struct {
						ID       string `json:"id"`
						Function struct {
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(ev.data), &c) != nil {
			continue
		}
		for _, ch := range c.Choices {
			if ch.Delta.Role != "" {
				roles++
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.ID != "" {
					ids[tc.ID]++
				}
				args.WriteString(tc.Function.Arguments)
			}
		}
	}
	if len(ids) != 1 || roles != 1 {
		t.Errorf("tool call ids %v, role chunks %d: want one call started once\n%s", ids, roles, raw)
	}
	if errors != 1 {
		t.Errorf("%d error events, want the one in-band error\n%s", errors, raw)
	}
	if n := backup.requests.Load(); n != 0 {
		t.Errorf("the backup got %d continuation requests for a tool-call stream, want 0", n)
	}
	if a := args.String(); strings.Count(a, "{") > 1 {
		t.Errorf("arguments relayed %q: a continuation restarted them", a)
	}

	// The official client sees the stream fail, not a corrupted call.
	client := newClient(t, g.addr)
	params := routingParams("What is the weather in Paris?", 64)
	params.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}
	params.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name:       "get_weather",
		Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
	})}
	if _, _, err := routingStream(testCtx(t), client, params); err == nil {
		t.Error("openai-go: a cut tool-call stream ended without an error")
	}
}

// TestFinishedStreamWithoutDone: an answer that reported finish_reason but lost its [DONE]
// is complete: the client gets [DONE], never a second answer appended by a resume.
func TestFinishedStreamWithoutDone(t *testing.T) {
	events := []string{chunk(`{"role":"assistant","content":""}`, "")}
	for _, w := range []string{"Hello", " there", ","} {
		events = append(events, chunk(`{"content":"`+w+`"}`, ""))
	}
	events = append(events, chunk(`{}`, "stop")) // then the connection ends: no [DONE]
	primary := startScripted(t, events...)
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	for _, resume := range []bool{true, false} {
		t.Run(fmt.Sprintf("resume=%v", resume), func(t *testing.T) {
			g := startGateway(t, routingConfig(fmt.Sprintf(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
    resume: %v
`, resume), "primary", primary.URL, "backup", backup.URL))
			before := backup.requests.Load()
			resp, raw := do(t, newHTTPClient(t), http.MethodPost, "http://"+g.addr+"/v1/chat/completions", streamBody)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, raw)
			}
			evs := parseSSE(raw)
			stops := strings.Count(string(raw), `"finish_reason":"stop"`)
			if len(evs) != len(events)+1 || evs[len(evs)-1].data != "[DONE]" || stops != 1 || strings.Contains(string(raw), "error") {
				t.Errorf("%d events (want %d, the last [DONE]), %d stop chunks (want 1):\n%s", len(evs), len(events)+1, stops, raw)
			}
			if n := backup.requests.Load() - before; n != 0 {
				t.Errorf("backup asked %d times for a finished answer", n)
			}
			hc := newHTTPClient(t)
			if v := metricValue(t, hc, g.admin, "sluice_requests_total", `error_type="stream_cut"`); v != 0 {
				t.Errorf("a finished answer counted as stream_cut (%v)", v)
			}
			// The official client accumulates one whole answer.
			client := newClient(t, g.addr)
			_, acc, err := routingStream(testCtx(t), client, routingParams("hi", 8))
			if err != nil || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "Hello there," || acc.Choices[0].FinishReason != "stop" {
				t.Errorf("openai-go: %v %+v", err, acc.Choices)
			}
		})
	}
}

// TestUpstreamStreamError: an error the model server sends in the stream reaches the client
// once, in the server's own words, and is never followed by a second error of Sluice's; as
// the first event it becomes an HTTP error answer; with resume the stream continues on the
// fallback instead.
func TestUpstreamStreamError(t *testing.T) {
	vllmErr := `data: {"error":{"message":"CUDA error: an illegal memory access was encountered","type":"InternalServerError","param":null,"code":500}}` + "\n\n"
	named := "event: error\n" + `data: {"error":{"message":"engine dead","type":"server_error","code":"engine_dead"}}` + "\n\n"
	head := []string{chunk(`{"role":"assistant","content":""}`, ""), chunk(`{"content":"Hello"}`, "")}
	backup := startRoutingUpstream(t, sim.Config{}, -1)
	for _, tc := range []struct {
		name     string
		events   []string
		resume   bool
		status   int    // the client's HTTP status
		wantErr  string // in the body; "" for none
		errCount int
	}{
		{"vLLM error then [DONE]", append(append([]string{}, head...), vllmErr, "data: [DONE]\n\n"), false, 200, "illegal memory access", 1},
		{"named error event then close", append(append([]string{}, head...), named), false, 200, "engine dead", 1},
		{"first event is an error", []string{`data: {"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}}` + "\n\n", "data: [DONE]\n\n"}, false, 400, "max_tokens is too large", 1},
		{"resumed on the fallback", append(append([]string{}, head...), vllmErr, "data: [DONE]\n\n"), true, 200, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := startScripted(t, tc.events...)
			g := startGateway(t, routingConfig(fmt.Sprintf(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
    resume: %v
`, tc.resume), "primary", primary.URL, "backup", backup.URL))
			resp, raw := do(t, newHTTPClient(t), http.MethodPost, "http://"+g.addr+"/v1/chat/completions", streamBody)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			if n := strings.Count(string(raw), `"error"`); n != tc.errCount {
				t.Errorf("%d error objects, want %d:\n%s", n, tc.errCount, raw)
			}
			if tc.wantErr != "" && !strings.Contains(string(raw), tc.wantErr) {
				t.Errorf("the server's words %q are not in the answer:\n%s", tc.wantErr, raw)
			}
			if tc.resume {
				text, done, _ := streamText(t, parseSSE(raw))
				if !done || !strings.HasPrefix(text, "Hello") || len(text) <= len("Hello") {
					t.Errorf("resumed stream: done %v text %q", done, text)
				}
			}
		})
	}
}

// TestResumeEdges: a resumed stream always ends the way its last server ended it — with that
// server's finish and [DONE] even when it finishes at once, with one error when it errs too,
// and with an in-band error (never silently) when no candidate is left to try.
func TestResumeEdges(t *testing.T) {
	vllmErr := `data: {"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}` + "\n\n"
	head := []string{chunk(`{"role":"assistant","content":""}`, ""), chunk(`{"content":"Hello"}`, "")}
	route := func(primary, backup string) string {
		return routingConfig(`  - name: chat
    cluster: primary
    fallback: [{cluster: backup}]
    resume: true
`, "primary", primary, "backup", backup)
	}
	hc := newHTTPClient(t)
	t.Run("continuation finishes at once", func(t *testing.T) {
		primary := startScripted(t, append(append([]string{}, head...), vllmErr)...)
		backup := startScripted(t, chunk(`{"role":"assistant","content":""}`, ""), chunk(`{"content":""}`, "stop"), "data: [DONE]\n\n")
		g := startGateway(t, route(primary.URL, backup.URL))
		_, raw := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", streamBody)
		if !strings.Contains(string(raw), `"finish_reason":"stop"`) || !strings.HasSuffix(string(raw), "data: [DONE]\n\n") || strings.Contains(string(raw), "error") {
			t.Errorf("a continuation that finished at once lost its finish or [DONE]:\n%s", raw)
		}
	})
	t.Run("continuation errs too", func(t *testing.T) {
		primary := startScripted(t, append(append([]string{}, head...), vllmErr)...)
		backup := startScripted(t, chunk(`{"role":"assistant","content":""}`, ""), chunk(`{"content":" world"}`, ""), vllmErr, "data: [DONE]\n\n")
		g := startGateway(t, route(primary.URL, backup.URL))
		_, raw := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", streamBody)
		if n := strings.Count(string(raw), `"error"`); n != 1 {
			t.Errorf("%d errors, want the second server's one:\n%s", n, raw)
		}
		if v := metricValue(t, hc, g.admin, "sluice_requests_total", `error_type="stream_error"`); v != 1 {
			t.Errorf("the resumed stream that erred again counted %v times as stream_error, want 1", v)
		}
	})
	t.Run("no candidate left", func(t *testing.T) {
		primary := startScripted(t, head...) // cut after "Hello"
		dead := startRoutingUpstream(t, sim.Config{NoHealth: true}, -1)
		g := startGateway(t, "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n"+
			routingCluster("primary", primary.URL)+
			"  - {name: backup, endpoints: [{url: "+dead.URL+"}], health_check: {path: /health, interval: 10ms, unhealthy_threshold: 1}}\n"+
			"routes:\n  - name: chat\n    cluster: primary\n    fallback: [{cluster: backup}]\n    resume: true\n")
		eventually(t, 5*time.Second, "the backup unhealthy", func() bool {
			_, b := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/endpoints", "")
			return strings.Contains(strings.ReplaceAll(string(b), " ", ""), `"healthy":false`)
		})
		_, raw := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", streamBody)
		if !strings.Contains(string(raw), "Hello") || !strings.Contains(string(raw), "event: error") {
			t.Errorf("a stream whose resume found no candidate ended without an error:\n%s", raw)
		}
	})
}
