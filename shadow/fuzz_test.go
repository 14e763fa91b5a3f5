package shadow

import (
	"encoding/json"
	"testing"
)

// FuzzAnswerParsers: captured answers come from model servers under test; no input may panic
// the parsers, and a parsed answer's tool calls are whole.
func FuzzAnswerParsers(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":3,\"function\":{\"name\":\"f\",\"arguments\":\"{\"}}]}}]}\n\n"))
	f.Add([]byte(`{"choices":[{"index":0,"message":{"content":"x","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"completion_tokens":3}}`))
	f.Add([]byte(`{"choices":[{"index":0,"text":"four"}]}`))
	f.Add([]byte(`{"error":{"message":"x"}}`))
	f.Add([]byte("data: {\"error\":1}\n\ndata: nope\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, parse := range []func([]byte) (Answer, error){AnswerFromSSE, AnswerFromChat} {
			a, err := parse(b)
			if err != nil {
				continue
			}
			for _, tc := range a.ToolCalls {
				_ = tc.Name + tc.Arguments
			}
			// The comparison must take any parsed answer.
			_ = Compare(RequestFromBody(b), a, a)
		}
	})
}

// FuzzRedact: whatever a client sent, the redacted request is valid JSON (or nil) and bounded.
func FuzzRedact(f *testing.F) {
	f.Add([]byte(`{"model":"m","user":"alice","messages":[{"role":"user","content":"key sk-abcdefghijklmnopqrstuv"}],"metadata":{"a":1}}`))
	f.Add([]byte(`{"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"password":{"type":"string"}}}}}]}`))
	f.Add([]byte(`[1,2]`))
	f.Add([]byte(`{"a":`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := Redact(b)
		if out == nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("Redact(%q) = %q: not JSON", b, out)
		}
		if len(out) > MaxRedactedBytes+1024 {
			t.Fatalf("Redact gave %d bytes, over the bound %d", len(out), MaxRedactedBytes)
		}
		_ = RequestFromBody(b)
	})
}
