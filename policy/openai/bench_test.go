package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// chatBody builds a chat request whose text is about tokens tokens of English prose.
func chatBody(tokens int) []byte {
	words := strings.Fields(`the model server answers each request with a stream of tokens while the gateway
		counts them and measures the time to the first token and the gaps between tokens so that
		operators can see how their serving stack behaves under load and where latency comes from
		when many clients share one cluster of accelerators and some prompts are much longer than others`)
	var sb strings.Builder
	for i := 0; sb.Len() < tokens*4; i++ {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(words[i%len(words)])
		if i%17 == 16 {
			sb.WriteString(".\n")
		}
	}
	text := sb.String()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body, _ := json.Marshal(map[string]any{
		"model":          "meta-llama/Llama-3.1-8B-Instruct",
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"max_tokens":     512,
		"temperature":    0.7,
		"messages": []msg{
			{"system", "You are a helpful assistant."},
			{"user", text[:len(text)/2]},
			{"assistant", "Understood."},
			{"user", text[len(text)/2:]},
		},
	})
	return body
}

// BenchmarkParseRequest parses chat requests of about 1,000 and 32,000 prompt tokens.
func BenchmarkParseRequest(b *testing.B) {
	for _, tokens := range []int{1000, 32000} {
		body := chatBody(tokens)
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var r *Request
			for b.Loop() {
				var err error
				if r, err = ParseRequest(KindChat, body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.PromptTokens), "est-tokens")
		})
	}
}

// BenchmarkParseRequestResponses is BenchmarkParseRequest for the same conversation as a
// Responses request (instructions, input items with content parts).
func BenchmarkParseRequestResponses(b *testing.B) {
	for _, tokens := range []int{1000, 32000} {
		body := responsesBody(tokens)
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var r *Request
			for b.Loop() {
				var err error
				if r, err = ParseRequest(KindResponses, body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.PromptTokens), "est-tokens")
		})
	}
}

// BenchmarkParseRequestStdlib is the comparison point: encoding/json into a typed struct
// with messages kept raw (what ParseRequest replaces).
func BenchmarkParseRequestStdlib(b *testing.B) {
	for _, tokens := range []int{1000, 32000} {
		body := chatBody(tokens)
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var v struct {
					Model    string            `json:"model"`
					Stream   bool              `json:"stream"`
					Messages []json.RawMessage `json:"messages"`
				}
				if err := json.Unmarshal(body, &v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSetModel(b *testing.B) {
	body := chatBody(1000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SetModel(body, "llama-3-8b"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelayEvent is the relay's per-event work: read an event of a vLLM chat stream
// (arriving one event a read, as a model server flushes them), observe it with a Tap, and
// write its bytes through.
func BenchmarkRelayEvent(b *testing.B) {
	stream := loadSSE(b, "chat_usage.sse")
	src := &eventReader{data: stream}
	r := NewReader(src, 0)
	var tap Tap
	now := time.Now()
	b.SetBytes(int64(len(stream) / bytes.Count(stream, []byte("\n\n"))))
	b.ReportAllocs()
	for b.Loop() {
		ev, err := r.Next()
		if err != nil {
			b.Fatal(err)
		}
		tap.Observe(ev, now)
		if _, err := io.Discard.Write(ev.Raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelayEventResponses is BenchmarkRelayEvent for a vLLM Responses stream: its
// events (response.created and response.completed echo the whole response) averaged.
func BenchmarkRelayEventResponses(b *testing.B) {
	stream := loadSSE(b, "responses_text.sse")
	src := &eventReader{data: stream}
	r := NewReader(src, 0)
	var tap Tap
	now := time.Now()
	b.SetBytes(int64(len(stream) / bytes.Count(stream, []byte("\n\n"))))
	b.ReportAllocs()
	for b.Loop() {
		ev, err := r.Next()
		if err != nil {
			b.Fatal(err)
		}
		tap.Observe(ev, now)
		if _, err := io.Discard.Write(ev.Raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTapEvent is the Tap's work on one token event: a vLLM chat chunk, and a vLLM
// Responses text delta (its fields in alphabetical order, "type" last).
func BenchmarkTapEvent(b *testing.B) {
	for _, bc := range []struct{ name, data string }{
		{"chat", `{"id":"chatcmpl-3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c","object":"chat.completion.chunk","created":1718041200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" blue"},"logprobs":null,"finish_reason":null}]}`},
		{"responses", `{"content_index":0,"delta":" blue","item_id":"msg_0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ev := Event{Data: []byte(bc.data)}
			var tap Tap
			now := time.Now()
			b.SetBytes(int64(len(bc.data)))
			b.ReportAllocs()
			for b.Loop() {
				tap.Observe(ev, now)
			}
			if tap.TokenEvents == 0 {
				b.Fatal("not a token event")
			}
		})
	}
}

// eventReader repeats a stream forever, one event a Read.
type eventReader struct {
	data []byte
	off  int
}

func (e *eventReader) Read(p []byte) (int, error) {
	rest := e.data[e.off:]
	n := bytes.Index(rest, []byte("\n\n")) + 2
	n = copy(p, rest[:n])
	e.off = (e.off + n) % len(e.data)
	return n, nil
}

func BenchmarkEstimateTokens(b *testing.B) {
	b.Run("chars", func(b *testing.B) {
		n := 0
		for i := 0; b.Loop(); i++ {
			n += EstimateTokens(i)
		}
		_ = n
	})
	text := chatBody(1000)
	b.Run("text=4KB", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		b.ReportAllocs()
		for b.Loop() {
			_ = EstimateTextTokens(text)
		}
	})
}

// agentBody builds an agent conversation of about tokens prompt tokens: tool calls with JSON
// arguments, tool results that are pasted API responses (JSON text, 9 deep), and assistant
// replies with prose, a markdown table and a fenced code block: the content the depth
// measurement reads character by character.
func agentBody(tokens int) []byte {
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-7d9f","namespace":"prod","labels":{"app":"web","tier":"frontend"}},` +
		`"spec":{"containers":[{"name":"web","image":"nginx:1.27","ports":[{"containerPort":8080,"protocol":"TCP"}],` +
		`"env":[{"name":"DB_PASSWORD","valueFrom":{"secretKeyRef":{"name":"db","key":"password"}}}],` +
		`"resources":{"limits":{"cpu":"500m","memory":"256Mi"}}}]},"status":{"phase":"Running","podIP":"10.1.2.3"}}`
	reply := "The pod `web-7d9f` is **Running** on 10.1.2.3. Here is a summary:\n\n| field | value |\n|---|---|\n| phase | Running |\n| image | nginx:1.27 |\n\n" +
		"To restart it:\n\n```go\nfunc restart(ctx context.Context, c *kubernetes.Clientset) error {\n\tfor _, p := range pods {\n\t\tif err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {\n\t\t\treturn fmt.Errorf(\"delete %s: %w\", p.Name, err)\n\t\t}\n\t}\n\treturn nil\n}\n```\n"
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	type msg struct {
		Role       string `json:"role"`
		Content    string `json:"content,omitempty"`
		ToolCalls  []call `json:"tool_calls,omitempty"`
		ToolCallID string `json:"tool_call_id,omitempty"`
	}
	msgs := []msg{{Role: "system", Content: "You are an SRE assistant. Use the tools."}, {Role: "user", Content: "Why is the web tier slow?"}}
	size := 0
	for i := 0; size < tokens*4; i++ {
		id := fmt.Sprintf("call_%d", i)
		msgs = append(msgs,
			msg{Role: "assistant", ToolCalls: []call{{ID: id, Type: "function", Function: fn{Name: "get_pod", Arguments: `{"namespace":"prod","name":"web-7d9f","fields":["spec","status"]}`}}}},
			msg{Role: "tool", ToolCallID: id, Content: pod},
			msg{Role: "assistant", Content: reply})
		size += len(pod) + len(reply) + 80
	}
	body, _ := json.Marshal(map[string]any{"model": "meta-llama/Llama-3.1-8B-Instruct", "max_tokens": 512, "messages": msgs})
	return body
}

// BenchmarkParseRequestAgent parses agent conversations of about 1,000 and 32,000 prompt
// tokens (see agentBody).
func BenchmarkParseRequestAgent(b *testing.B) {
	for _, tokens := range []int{1000, 32000} {
		body := agentBody(tokens)
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var r *Request
			for b.Loop() {
				var err error
				if r, err = ParseRequest(KindChat, body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.Depth), "depth")
		})
	}
}

// BenchmarkParseRequestPathological parses a megabyte of content built to make a depth
// measurement rescan or work hard: open brackets, an object key repeated, brackets that never
// form JSON, and JSON text nested in strings as deep as it is followed.
func BenchmarkParseRequestPathological(b *testing.B) {
	// nested is JSON text in JSON strings 8 levels down, the innermost an array of a
	// megabyte: every character is read at every level.
	nested := "[" + strings.Repeat("1,", 1<<19) + "1]"
	for range 8 {
		q, _ := json.Marshal(nested)
		nested = "[" + string(q) + "]"
	}
	for _, bc := range []struct{ name, text string }{
		{"brackets", strings.Repeat("[", 1<<20)},
		{"keys", strings.Repeat(`{"a":`, 1<<20/5)},
		{"broken", strings.Repeat("[x", 1<<19)},
		{"levels", nested},
	} {
		q, _ := json.Marshal(bc.text)
		body := []byte(`{"model":"m","messages":[{"role":"user","content":` + string(q) + `}]}`)
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var r *Request
			for b.Loop() {
				var err error
				if r, err = ParseRequest(KindChat, body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.Depth), "depth")
		})
	}
}

// BenchmarkScanDeltas is the text-delta extractor's cost on one token event: a vLLM chat
// chunk, a tool call's arguments chunk, and a Responses text delta (members in alphabetical
// order, "type" last).
func BenchmarkScanDeltas(b *testing.B) {
	for _, bc := range []struct{ name, data string }{
		{"chat", `{"id":"chatcmpl-3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c","object":"chat.completion.chunk","created":1718041200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" blue"},"logprobs":null,"finish_reason":null}]}`},
		{"tool_call", `{"id":"chatcmpl-3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c","object":"chat.completion.chunk","created":1718041200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\", \"unit\": \""}}]},"logprobs":null,"finish_reason":null}]}`},
		{"responses", `{"content_index":0,"delta":" blue","item_id":"msg_0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data := []byte(bc.data)
			n := 0
			yield := func(d TextDelta) bool { n += len(d.Raw); return true }
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				ScanDeltas(data, yield)
			}
			if n == 0 {
				b.Fatal("no text")
			}
		})
	}
}
