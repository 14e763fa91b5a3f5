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
