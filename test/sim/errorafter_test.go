package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// vllmError is vLLM's error body, whose code is the HTTP status as a number.
type vllmError struct {
	Error *struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Param   json.RawMessage `json:"param"`
		Code    json.RawMessage `json:"code"`
	} `json:"error"`
}

func checkVLLMError(t *testing.T, data string) {
	t.Helper()
	e := decode[vllmError](t, []byte(data))
	if e.Error == nil || e.Error.Type != "InternalServerError" || string(e.Error.Code) != "500" || string(e.Error.Param) != "null" ||
		!strings.Contains(e.Error.Message, HeaderErrorAfter) {
		t.Fatalf("error %s", data)
	}
}

// TestErrorAfter: x-sim-error-after ends a stream after N events with an in-stream error, in
// vLLM's shape for chat and completions and as an error event for the Responses API.
func TestErrorAfter(t *testing.T) {
	endpoints := []struct {
		name string
		path string
		body map[string]any
	}{
		{"chat", "/v1/chat/completions", chatBody("fail", map[string]any{"max_tokens": 8, "ignore_eos": true, "stream_options": map[string]any{"include_usage": true}})},
		{"completions", "/v1/completions", map[string]any{"prompt": "fail", "max_tokens": 8, "ignore_eos": true}},
		{"responses", "/v1/responses", map[string]any{"input": "fail", "max_output_tokens": 8, "ignore_eos": true}},
	}
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{{"fast", Config{}}, {"scheduled", scheduled}} {
		for _, ep := range endpoints {
			t.Run(cfg.name+"/"+ep.name, func(t *testing.T) {
				s, ts := start(t, cfg.cfg)
				body := map[string]any{"stream": true}
				for k, v := range ep.body {
					body[k] = v
				}
				stream := func(hdr map[string]string) []namedEvent {
					t.Helper()
					resp, err := send(context.Background(), ts, ep.path, body, hdr)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Fatalf("status %d", resp.StatusCode)
					}
					evs, err := readEvents(resp.Body)
					if err != nil {
						t.Fatalf("stream broken after %d events: %v", len(evs), err)
					}
					return evs
				}
				full := stream(nil)
				errorsSeen := int64(0)
				for _, tc := range []struct {
					n     int
					named bool
				}{{0, false}, {1, false}, {3, true}, {len(full) - 1, false}, {len(full), false}, {len(full) + 5, true}} {
					hdr := map[string]string{"x-sim-error-after": strconv.Itoa(tc.n)}
					if tc.named {
						hdr["x-sim-error-event"] = "1"
					}
					evs := stream(hdr)
					if tc.n >= len(full) {
						if len(evs) != len(full) {
							t.Fatalf("error-after %d beyond the stream: %d events, want %d", tc.n, len(evs), len(full))
						}
						continue
					}
					errorsSeen++
					for k := range tc.n {
						if evs[k].event != full[k].event {
							t.Fatalf("error-after %d: event %d %q, want %q", tc.n, k, evs[k].event, full[k].event)
						}
					}
					rest := evs[tc.n:]
					if ep.path == "/v1/responses" {
						if len(rest) != 1 || rest[0].event != "error" {
							t.Fatalf("error-after %d: after the first %d events %+v", tc.n, tc.n, rest)
						}
						var e map[string]any
						if err := json.Unmarshal([]byte(rest[0].data), &e); err != nil {
							t.Fatal(err)
						}
						if e["type"] != "error" || e["code"] != "server_error" || e["param"] != nil || e["sequence_number"] != float64(tc.n) ||
							!strings.Contains(e["message"].(string), HeaderErrorAfter) || len(e) != 5 {
							t.Fatalf("error event %s", rest[0].data)
						}
					} else {
						if len(rest) != 2 || rest[1].data != "[DONE]" || rest[1].event != "" {
							t.Fatalf("error-after %d: after the first %d events %+v", tc.n, tc.n, rest)
						}
						if want := map[bool]string{true: "error", false: ""}[tc.named]; rest[0].event != want {
							t.Fatalf("error-after %d: event name %q, want %q", tc.n, rest[0].event, want)
						}
						checkVLLMError(t, rest[0].data)
					}
				}
				waitFor(t, 5*time.Second, "the engine to drain", func() bool { return s.Stats().Running == 0 })
				if st := s.Stats(); st.Errors != errorsSeen || st.Completed != 3 || st.Aborted != 0 {
					t.Fatalf("stats %+v, want %d errors", st, errorsSeen)
				}
				// Non-streaming: a 500 with vLLM's error body at once.
				nb := map[string]any{}
				for k, v := range ep.body {
					nb[k] = v
				}
				delete(nb, "stream_options")
				resp, raw := post(t, ts, ep.path, nb, map[string]string{"x-sim-error-after": "2"})
				if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != "application/json" {
					t.Fatalf("non-stream: %d %s", resp.StatusCode, raw)
				}
				checkVLLMError(t, string(raw))
			})
		}
	}
	t.Run("bad knobs", func(t *testing.T) {
		_, ts := start(t, Config{})
		for _, hdr := range []map[string]string{
			{"x-sim-error-after": "-1"},
			{"x-sim-error-after": "soon"},
			{"x-sim-error-event": "1"},
			{"x-sim-error-after": "1", "x-sim-error-event": "maybe"},
		} {
			resp, raw := post(t, ts, "/v1/chat/completions", chatBody("x", nil), hdr)
			if resp.StatusCode != 400 || !strings.Contains(string(raw), `"code":"invalid_header"`) {
				t.Fatalf("%v: %d %s", hdr, resp.StatusCode, raw)
			}
		}
		if resp, raw := post(t, ts, "/v1/chat/completions", chatBody("x", nil), map[string]string{"x-sim-error-event": "0"}); resp.StatusCode != 200 {
			t.Fatalf("x-sim-error-event 0 alone: %d %s", resp.StatusCode, raw)
		}
	})
	t.Run("openai client", func(t *testing.T) {
		_, ts := start(t, Config{})
		client := responsesClient(ts)
		ctx := context.Background()
		hdr := option.WithHeader(HeaderErrorAfter, "3")
		cs := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: "sim-llama", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
		}, hdr)
		n := 0
		for cs.Next() {
			n++
		}
		if err := cs.Err(); err == nil || !strings.Contains(err.Error(), "InternalServerError") || n != 3 {
			t.Fatalf("chat: %d chunks, err %v", n, err)
		}
		_ = cs.Close()
		rs := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
			Model: "sim-llama", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")},
		}, hdr)
		var last responses.ResponseStreamEventUnion
		n = 0
		for rs.Next() {
			last = rs.Current()
			n++
		}
		if err := rs.Err(); err != nil || n != 4 || last.Type != "error" || last.Code != "server_error" || last.SequenceNumber != 3 {
			t.Fatalf("responses: %d events, last %s, err %v", n, last.RawJSON(), err)
		}
		_ = rs.Close()
	})
}

func TestNoHealth(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		health int
	}{{"default", Config{}, 200}, {"no health", Config{NoHealth: true}, 404}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := start(t, tc.cfg)
			resp, raw := get(t, ts, "/health")
			if resp.StatusCode != tc.health {
				t.Fatalf("/health: %d %s", resp.StatusCode, raw)
			}
			if tc.health == 404 {
				if e := decode[errorBody](t, raw); e.Error == nil || e.Error.Code == nil || *e.Error.Code != "not_found" {
					t.Fatalf("/health body %s", raw)
				}
				if resp, _ := post(t, ts, "/health", `{}`, nil); resp.StatusCode != 404 {
					t.Fatalf("POST /health: %d", resp.StatusCode)
				}
			}
			if resp, raw := get(t, ts, "/v1/models"); resp.StatusCode != 200 || !strings.Contains(string(raw), `"max_model_len":`) {
				t.Fatalf("/v1/models: %d %s", resp.StatusCode, raw)
			}
			if a := chat(t, ts, chatBody("still serving", nil), false); a.text[0] == "" {
				t.Fatal("no answer")
			}
		})
	}
}

// TestContextLengthMessage: an over-length request gets vLLM's 400 word for word, and
// /v1/models advertises the window.
func TestContextLengthMessage(t *testing.T) {
	_, ts := start(t, Config{MaxModelLen: 4096})
	_, raw := get(t, ts, "/v1/models")
	if !strings.Contains(string(raw), `"max_model_len":4096`) {
		t.Fatalf("models %s", raw)
	}
	// 15996 characters are 3999 tokens, + 1 for the message: 4000 prompt tokens.
	text := strings.Repeat("a", 15996)
	const want = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
	cases := []struct {
		name, path string
		body       map[string]any
		param      string
		message    string
	}{
		{"chat", "/v1/chat/completions", chatBody(text, map[string]any{"max_tokens": 1000}), "messages", want},
		{"chat max_completion_tokens", "/v1/chat/completions", chatBody(text, map[string]any{"max_completion_tokens": 1000}), "messages", want},
		{"responses", "/v1/responses", map[string]any{"input": text, "max_output_tokens": 1000}, "input", want},
		{"completions", "/v1/completions", map[string]any{"prompt": text + "aaaa", "max_tokens": 1000}, "prompt", want},
		{"chat without max_tokens", "/v1/chat/completions", chatBody(text+strings.Repeat("a", 400), nil), "messages",
			"This model's maximum context length is 4096 tokens. However, you requested 4101 tokens (4100 in the messages, 1 in the completion). Please reduce the length of the messages or completion."},
		{"huge max_tokens", "/v1/chat/completions", chatBody("x", map[string]any{"max_tokens": int64(1<<63 - 1)}), "messages",
			"This model's maximum context length is 4096 tokens. However, you requested 9223372036854775809 tokens (2 in the messages, 9223372036854775807 in the completion). Please reduce the length of the messages or completion."},
		{"embeddings", "/v1/embeddings", map[string]any{"input": text + strings.Repeat("a", 400)}, "input",
			"This model's maximum context length is 4096 tokens. However, you requested 4099 tokens in the input for embedding generation. Please reduce the length of the input."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, raw := post(t, ts, tc.path, tc.body, nil)
			e := decode[paramErrorBody](t, raw)
			if resp.StatusCode != http.StatusBadRequest || e.Error == nil || e.Error.Code == nil || *e.Error.Code != "context_length_exceeded" ||
				e.Error.Param == nil || *e.Error.Param != tc.param || e.Error.Type != "invalid_request_error" {
				t.Fatalf("%d %s", resp.StatusCode, raw)
			}
			if e.Error.Message != tc.message {
				t.Fatalf("message\n%s\nwant\n%s", e.Error.Message, tc.message)
			}
		})
	}
}
