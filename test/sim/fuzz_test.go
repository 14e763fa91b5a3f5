package sim

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

var fuzzPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}

// FuzzRequest feeds arbitrary bodies to the four API endpoints: the simulator must never
// panic and must answer 200 or a 4xx with a valid JSON error; a 200 body must be valid JSON
// or a well-formed SSE stream (for the Responses API: named events numbered from 0, ending
// with response.completed or response.incomplete).
func FuzzRequest(f *testing.F) {
	seeds := []struct {
		ep   uint8
		body string
	}{
		{0, `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}]}`},
		{0, `{"messages":[{"role":"user","content":"hi [[mem:x1]]"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5}`},
		{0, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x"}}]}],"seed":3,"temperature":0.5}`},
		{0, `{"messages":[{"role":"user","content":"w"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"array","items":{"type":"object","properties":{"b":{"enum":[1,"x"]}}}},"n":{"type":"number","exclusiveMinimum":3}},"required":["a","z"]}}}],"stream":true}`},
		{0, `{"messages":[{"role":"user","content":"w"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"string","minLength":5,"maxLength":2}}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`},
		{0, `{"messages":[{"role":"tool","content":null,"tool_call_id":"c"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`},
		{0, `{"messages":[],"max_tokens":-1}`},
		{0, `{"messages":[{"role":"user","content":"x"}],"max_tokens":99999999999999999}`},
		{0, `{"messages":[{"role":"user","content":"\u0000\ud800 [[mem:` + strings.Repeat("a", 40) + `]]"}]}`},
		{1, `{"prompt":["a","b"],"stream":true,"max_tokens":3}`},
		{1, `{"prompt":[[1,2],[3]],"ignore_eos":true}`},
		{1, `{"prompt":[1,"a"]}`},
		{1, `{"prompt":[]}`},
		{2, `{"input":["a","b"],"encoding_format":"base64","dimensions":8}`},
		{2, `{"input":[[1,2,3]],"dimensions":-1}`},
		{2, `{"input":123}`},
		{0, `{`},
		{1, `null`},
		{2, ``},
		{3, `{"model":"sim-llama","input":"hi [[mem:r1]]","instructions":"be brief","max_output_tokens":5}`},
		{3, `{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"http://x"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"b","annotations":[]}]}],"stream":true}`},
		{3, `{"input":"w","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},"required":["a"]},"strict":true},{"type":"web_search"}],"stream":true,"max_output_tokens":3}`},
		{3, `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"r"}]},{"type":"reasoning","summary":[]}],"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}}`},
		{3, `{"input":"x","tool_choice":"required","tools":[{"type":"function","name":"f"}],"text":{"format":{"type":"json_schema","name":"n","schema":{}}},"metadata":{"k":"v"},"store":false,"seed":1,"temperature":0.3}`},
		{3, `{"input":"x","previous_response_id":"resp_0000000000000000"}`},
		{3, `{"input":[{"type":"function_call"}],"max_output_tokens":-2,"text":{"format":{"type":"x"}}}`},
		{3, `{"input":[{"role":"user","content":{"a":1}}]}`},
		{3, `{"input":[]}`},
		{3, `[]`},
	}
	for _, s := range seeds {
		f.Add(s.ep, []byte(s.body))
	}
	srv := New(Config{MaxModelLen: 512, MaxTokensDefault: 16, KVTokens: 4096, TokensPerEvent: 2})
	defer srv.Close()
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		path := fuzzPaths[int(ep)%len(fuzzPaths)]
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(string(body))))
		out := rec.Body.Bytes()
		switch {
		case rec.Code == 200:
		case rec.Code >= 400 && rec.Code < 500:
			var e errorBody
			if err := json.Unmarshal(out, &e); err != nil || e.Error == nil || e.Error.Message == "" {
				t.Fatalf("status %d with body %q", rec.Code, out)
			}
			return
		default:
			t.Fatalf("status %d for %s %q: %s", rec.Code, path, body, out)
		}
		if rec.Header().Get("Content-Type") == "text/event-stream" && path == "/v1/responses" {
			checkResponsesStream(t, out)
			return
		}
		if rec.Header().Get("Content-Type") == "text/event-stream" {
			events := strings.Split(strings.TrimSuffix(string(out), "\n\n"), "\n\n")
			if events[len(events)-1] != "data: [DONE]" {
				t.Fatalf("stream does not end with [DONE]: %q", out)
			}
			for _, ev := range events[:len(events)-1] {
				data, ok := strings.CutPrefix(ev, "data: ")
				if !ok || !json.Valid([]byte(data)) {
					t.Fatalf("bad event %q", ev)
				}
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON response: %q", out)
		}
	})
}

// checkResponsesStream checks a Responses stream's framing: `event: T\ndata: {"type":"T",
// "sequence_number":N,...}` blocks, N counting from 0, the last a terminal event.
func checkResponsesStream(t *testing.T, out []byte) {
	events := strings.Split(strings.TrimSuffix(string(out), "\n\n"), "\n\n")
	for i, ev := range events {
		name, data, ok := strings.Cut(ev, "\ndata: ")
		name, named := strings.CutPrefix(name, "event: ")
		var d struct {
			Type string `json:"type"`
			Seq  *int   `json:"sequence_number"`
		}
		if !ok || !named || json.Unmarshal([]byte(data), &d) != nil || d.Type != name || d.Seq == nil || *d.Seq != i {
			t.Fatalf("bad event %d %q", i, ev)
		}
	}
	if last := events[len(events)-1]; !strings.HasPrefix(last, "event: response.completed\n") && !strings.HasPrefix(last, "event: response.incomplete\n") {
		t.Fatalf("stream does not end with a terminal event: %q", last)
	}
}
