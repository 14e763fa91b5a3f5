package shadow

import (
	"encoding/json"
	"net/url"
	"strings"
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
	// Responses API streams and bodies.
	f.Add([]byte(vllmResponsesToolStream))
	f.Add([]byte(responsesTextStream))
	f.Add([]byte("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Su\"}\n\nevent: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\",\"sequence_number\":2,\"error\":{\"message\":\"boom\"}}\n\n"))
	f.Add([]byte("data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":3,\"delta\":\"{\"}\n\ndata: {\"type\":\"response.incomplete\",\"response\":{\"incomplete_details\":{\"reason\":\"max_output_tokens\"}}}\n\n"))
	f.Add([]byte(`{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"{\"a\":1}"}]},{"type":"function_call","name":"f","arguments":"{}"}],"usage":{"output_tokens":3},"text":{"format":{"type":"json_schema","schema":{"type":"object"}}},"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}`))
	f.Add([]byte(`{"object":"response","status":"failed","error":{"code":"x","message":"y"},"output":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, parse := range []func([]byte) (Answer, error){AnswerFromSSE, AnswerFromChat, AnswerFromResponse} {
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
	f.Add([]byte(`{"model":"m","user":"alice","instructions":"key sk-abcdefghijklmnopqrstuv","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}],"tools":[{"type":"function","name":"f","parameters":{"properties":{"password":{"type":"string"}}}}],"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"}}},"tool_choice":{"type":"function","name":"f"},"previous_response_id":"resp_1","metadata":{"a":1}}`))
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

// FuzzPostgresURL: whatever shadow.store holds, checking and masking it never panics, and
// neither the masked URL nor the check's error shows a password given in the user info or
// as a parameter.
func FuzzPostgresURL(f *testing.F) {
	f.Add("postgres://u:%s@db:5432/shadow?sslmode=require", "Pa55word-x")
	f.Add("postgresql://db/shadow?password=%s&sslmode=maybe", "hunter2hunter2")
	f.Add("postgres://u:%s@db:port/x#frag", "zzzzzzzz")
	f.Add("postgres://u:%s@[::1:5432/x", "qwertyuiop")
	f.Add("postgres://%s", "@@@@@@@@")
	f.Add("/var/lib/%s.db", "notapassword")
	f.Fuzz(func(t *testing.T, format, pw string) {
		if strings.Count(format, "%s") != 1 || strings.Contains(format, "%!") {
			return
		}
		dsn := strings.Replace(format, "%s", url.QueryEscape(pw), 1)
		masked := RedactDSN(dsn)
		err := CheckPostgresURL(dsn)
		if !IsPostgresURL(dsn) {
			if masked != dsn || err == nil {
				t.Fatalf("%q: a file path was changed to %q, or passed as a URL (%v)", dsn, masked, err)
			}
			return
		}
		// A password worth looking for: long, of its own letters, not elsewhere in the URL.
		rest := strings.Replace(format, "%s", "", 1)
		if len(pw) < 8 || !alnum(pw) || strings.Contains(rest, pw) || strings.Contains(RedactDSN(rest), pw) {
			return
		}
		if !strings.Contains(format, ":%s@") && !strings.Contains(format, "password=%s") {
			return
		}
		if strings.Contains(masked, pw) {
			t.Fatalf("masked %q shows the password", masked)
		}
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Fatalf("the check of %q shows the password: %v", dsn, err)
		}
	})
}

func alnum(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
