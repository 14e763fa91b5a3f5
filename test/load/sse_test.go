package load

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestStreamShapes: answers in the SSE shapes servers and proxies really send are read as
// the spec reads them: an event's data split over several data: lines, CR or CRLF line
// endings, comments (keep-alives), event: error, a stream cut mid-event.
func TestStreamShapes(t *testing.T) {
	const (
		hi   = `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi there"}}]}`
		stop = `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
	)
	for _, tt := range []struct {
		name  string
		body  string
		class string // "" for a success
	}{
		{"plain", "data: " + hi + "\n\ndata: " + stop + "\n\ndata: [DONE]\n\n", ""},
		{"data over two lines", "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi there\"}}]}\n\ndata: " + stop + "\n\ndata: [DONE]\n\n", ""},
		{"CRLF", "data: " + hi + "\r\n\r\ndata: " + stop + "\r\n\r\ndata: [DONE]\r\n\r\n", ""},
		{"CR", "data: " + hi + "\r\rdata: " + stop + "\r\rdata: [DONE]\r\r", ""},
		{"comments", ": keep-alive\n\ndata: " + hi + "\n\n: ping\n\ndata: " + stop + "\n\ndata: [DONE]\n\n", ""},
		{"event: error", "data: " + hi + "\n\nevent: error\ndata: {\"error\":{\"message\":\"engine died\",\"type\":\"server_error\"}}\n\n", ErrStream},
		{"cut mid-event", "data: " + hi + "\n\ndata: {\"id\":\"c\",\"obj", ErrTruncated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tt.body)
			}))
			defer ts.Close()
			sp, err := ParseSynthetic("in=fixed:8,out=fixed:2")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := Run(ctx, Config{Target: ts.URL, Workload: &Workload{Synthetic: sp}, Concurrency: 1, Requests: 1, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			if tt.class == "" {
				if r.OK != 1 || r.OutputTokens != 2 || len(r.Errors) != 0 {
					t.Errorf("ok %d, output tokens %d, errors %v %v; want 1 ok, 2 tokens (from usage)", r.OK, r.OutputTokens, r.Errors, r.Samples)
				}
				return
			}
			if r.OK != 0 || r.Errors[tt.class] != 1 {
				t.Errorf("ok %d, errors %v %v; want one %s", r.OK, r.Errors, r.Samples, tt.class)
			}
		})
	}
}
