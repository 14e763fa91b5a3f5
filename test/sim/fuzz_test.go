package sim

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

var fuzzPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}

// FuzzRequest feeds arbitrary bodies to the three API endpoints: the simulator must never
// panic and must answer 200 or a 4xx with a valid JSON error; a 200 body must be valid JSON
// or a well-formed SSE stream.
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
