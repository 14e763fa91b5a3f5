package sim

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// discard is a minimal ResponseWriter so that benchmarks measure the simulator, not the
// recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Flush()                      {}

func benchServe(b *testing.B, path, body string) {
	s := New(Config{})
	defer s.Close()
	raw := []byte(body)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &discard{h: http.Header{}}
		for pb.Next() {
			clear(w.h)
			r := httptest.NewRequest("POST", path, bytes.NewReader(raw))
			s.ServeHTTP(w, r)
		}
	})
}

func BenchmarkFastChat(b *testing.B) {
	benchServe(b, "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Write a short poem about rivers."}],"max_tokens":64}`)
}

func BenchmarkFastChatStream(b *testing.B) {
	benchServe(b, "/v1/chat/completions", `{"model":"sim-llama","messages":[{"role":"user","content":"Write a short poem about rivers."}],"max_tokens":64,"stream":true}`)
}

func BenchmarkFastEmbeddings(b *testing.B) {
	benchServe(b, "/v1/embeddings", `{"model":"sim-llama","input":["a short text","another one"]}`)
}

func BenchmarkFastResponses(b *testing.B) {
	benchServe(b, "/v1/responses", `{"model":"sim-llama","input":"hello there","max_output_tokens":16}`)
}

func BenchmarkFastResponsesStream(b *testing.B) {
	benchServe(b, "/v1/responses", `{"model":"sim-llama","input":"hello there","max_output_tokens":16,"stream":true}`)
}

// BenchmarkFastChatHTTP drives the fast path over real HTTP on 127.0.0.1 (client included in
// the cost).
func BenchmarkFastChatHTTP(b *testing.B) {
	_, ts := start(b, Config{})
	tr := ts.Client().Transport.(*http.Transport)
	tr.MaxIdleConnsPerHost = 64
	body := []byte(`{"model":"sim-llama","messages":[{"role":"user","content":"Write a short poem about rivers."}],"max_tokens":32}`)
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", ts.URL+"/v1/chat/completions", bytes.NewReader(body))
			resp, err := ts.Client().Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}
