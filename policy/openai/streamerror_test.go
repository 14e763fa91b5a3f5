package openai

import (
	"encoding/json"
	"testing"
)

func TestStreamErrorBody(t *testing.T) {
	for _, tc := range []struct {
		name, data    string
		status        int
		msg, typ, cod string
	}{
		{"vLLM (new)", `{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}}`, 400, "max_tokens is too large", "BadRequestError", "400"},
		{"vLLM (old)", `{"object":"error","message":"CUDA error","type":"InternalServerError","param":null,"code":500}`, 500, "CUDA error", "InternalServerError", "500"},
		{"OpenAI", `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`, 429, "slow down", "requests", "rate_limit_exceeded"},
		{"TGI", `{"error":"Input validation error: inputs must have less than 4096 tokens","error_type":"validation"}`, 502, "Input validation error: inputs must have less than 4096 tokens", "validation", ""},
		{"type names a status", `{"error":{"message":"no such model","type":"NotFoundError"}}`, 404, "no such model", "NotFoundError", ""},
		{"Responses error event", `{"type":"error","code":"context_length_exceeded","message":"too long","param":"input","sequence_number":3}`, 400, "too long", "server_error", "context_length_exceeded"},
		{"Responses rate limit", `{"type":"error","code":"rate_limit_exceeded","message":"later","param":null,"sequence_number":1}`, 429, "later", "server_error", "rate_limit_exceeded"},
		{"response.failed", `{"type":"response.failed","sequence_number":4,"response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"engine died"}}}`, 500, "engine died", "server_error", "server_error"},
		{"string status code", `{"error":{"message":"busy","code":"503"}}`, 503, "busy", "server_error", "503"},
		{"code out of range", `{"error":{"message":"odd","code":200}}`, 502, "odd", "server_error", "200"},
		{"not JSON", `data is not json`, 502, "the model server reported an error in the stream", "server_error", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := StreamErrorBody([]byte(tc.data))
			var got struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			code := ""
			if got.Error.Code != nil {
				code = *got.Error.Code
			}
			if status != tc.status || got.Error.Message != tc.msg || got.Error.Type != tc.typ || code != tc.cod {
				t.Errorf("got %d %s, want %d message %q type %q code %q", status, body, tc.status, tc.msg, tc.typ, tc.cod)
			}
		})
	}
}

func FuzzStreamErrorBody(f *testing.F) {
	for _, s := range []string{`{"error":{"message":"m","code":400}}`, `{"object":"error","code":"x"}`, `{"error":"e"}`,
		`{"type":"error","code":"invalid_x"}`, `{"response":{"error":{"code":1}}}`, `[]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		status, body := StreamErrorBody(b)
		if status < 400 || status > 599 || !json.Valid(body) {
			t.Fatalf("status %d body %s", status, body)
		}
	})
}
