package proxy

// Benchmarks of the stream relay path. Performance is measured here, never asserted.
//
//	go test -run '^$' -bench . -benchmem ./proxy/
//
// BenchmarkStreamRelay drives Handler.ServeHTTP for one streaming chat request whose answer
// is N pre-rendered vLLM chat chunks, served by an in-process http.RoundTripper registered
// on the cluster's own transport (no network), and written to a discarding
// http.ResponseWriter that implements http.Flusher. It reports ns/event and allocs/event:
// the whole request divided by its events, so the per-request cost (parse, plan, headers,
// telemetry) is amortised; compare events=16 with events=1024 to separate the two (the
// difference in allocs/op between them is what each extra event allocates).
//
// BenchmarkStreamRelayLoopback is the same over real loopback sockets (upstream server ->
// Sluice's listener -> HTTP client), with a "direct" baseline without Sluice: the gap
// between the two is the relay's added cost per event including its own syscalls.
//
// BenchmarkRelayLoop is the per-event loop of relayStream alone, one event per iteration on
// an endless stream: Reader.Next, then Tap.Observe, then Write + Flush on the discarding
// writer; its allocs/op is exactly the allocations per relayed event.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
)

// benchWords are the content of the rendered token chunks.
var benchWords = []string{"morning", " all", " there", " red", " before", " remember", " at", " batch", " for", " stream", " server", " report"}

// renderChatStream renders a vLLM-style chat stream: a role chunk, n content chunks of one
// token each, a finish chunk, a usage chunk and [DONE]. Each element is one whole event.
func renderChatStream(n int) [][]byte {
	const head = `data: {"id":"chatcmpl-51a8adc5c7b79a7d","object":"chat.completion.chunk","created":1796035306,"model":"sim-llama","choices":[{"index":0,"delta":{`
	evs := make([][]byte, 0, n+4)
	evs = append(evs, []byte(head+`"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"))
	for i := range n {
		evs = append(evs, []byte(head+`"content":`+strconv.Quote(benchWords[i%len(benchWords)])+`},"logprobs":null,"finish_reason":null}]}`+"\n\n"))
	}
	evs = append(evs, []byte(head+`},"logprobs":null,"finish_reason":"length"}]}`+"\n\n"))
	evs = append(evs, []byte(`data: {"id":"chatcmpl-51a8adc5c7b79a7d","object":"chat.completion.chunk","created":1796035306,"model":"sim-llama","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":`+strconv.Itoa(n)+`,"total_tokens":`+strconv.Itoa(n+12)+`}}`+"\n\n"))
	evs = append(evs, []byte("data: [DONE]\n\n"))
	return evs
}

// eventBody returns one event per Read, as a model server flushing each token does.
type eventBody struct {
	evs [][]byte
	i   int
	off int
	// loop restarts at the first event after the last, for an endless stream.
	loop bool
}

func (b *eventBody) Read(p []byte) (int, error) {
	if b.i >= len(b.evs) {
		if !b.loop {
			return 0, io.EOF
		}
		b.i = 0
	}
	n := copy(p, b.evs[b.i][b.off:])
	b.off += n
	if b.off == len(b.evs[b.i]) {
		b.i++
		b.off = 0
	}
	return n, nil
}

func (b *eventBody) Close() error { return nil }

// fakeUpstream answers every POST with the pre-rendered stream (or, when evs is nil, with
// the JSON body) and /health with 200.
type fakeUpstream struct {
	evs  [][]byte
	json []byte
}

func (u *fakeUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	resp := &http.Response{
		StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody, ContentLength: -1, Request: r,
	}
	switch {
	case r.Method != http.MethodPost:
	case u.evs != nil:
		resp.Header.Set("Content-Type", "text/event-stream")
		resp.Body = &eventBody{evs: u.evs}
	default:
		resp.Header.Set("Content-Type", "application/json")
		resp.ContentLength = int64(len(u.json))
		resp.Body = io.NopCloser(bytes.NewReader(u.json))
	}
	return resp, nil
}

// discardWriter is a ResponseWriter and Flusher that keeps nothing.
type discardWriter struct {
	h       http.Header
	status  int
	n       int64
	flushes int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }
func (w *discardWriter) Flush()                      { w.flushes++ }

// The connection deadlines a real server's writer takes (http.ResponseController).
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }
func (w *discardWriter) SetReadDeadline(time.Time) error  { return nil }

func benchChatBody(stream bool, maxTokens int) []byte {
	return fmt.Appendf(nil, `{"model":"sim-llama","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short poem about rivers and the sea."}],"max_tokens":%d,"stream":%t}`, maxTokens, stream)
}

// newBenchServer builds a Server on the `sluice serve --upstream` config (every default on)
// without listeners. upstream, when not nil, is registered on the cluster's transport for
// the "http" scheme, so every upstream request (health checks included) goes to it.
func newBenchServer(b *testing.B, upstreamURL string, upstream http.RoundTripper) *Server {
	return newBenchServerClient(b, upstreamURL, upstream, "")
}

// newBenchServerClient is newBenchServer with the clusters' http_client set (a fake upstream
// is registered on net/http's Transport, so it needs "net/http").
func newBenchServerClient(b *testing.B, upstreamURL string, upstream http.RoundTripper, client string) *Server {
	return newBenchServerWith(b, upstreamURL, upstream, client, "")
}

// newBenchServerWith is newBenchServerClient with the API listener's server too
// (config.Config.HTTPServer).
func newBenchServerWith(b *testing.B, upstreamURL string, upstream http.RoundTripper, client, server string) *Server {
	b.Helper()
	cfg, err := config.FromUpstreams("127.0.0.1:0", "127.0.0.1:0", []string{upstreamURL}, "")
	if err != nil {
		b.Fatal(err)
	}
	cfg.HTTPServer = server
	if upstream != nil {
		client = "net/http"
	}
	for i := range cfg.Clusters {
		cfg.Clusters[i].HTTPClient = client
	}
	srv, err := New(Options{Config: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if upstream != nil {
		for _, cl := range srv.state.Load().clusters {
			cl.HTTPTransport().RegisterProtocol("http", upstream)
		}
	}
	return srv
}

// closeUnstarted stops what New started (health checks, telemetry) on a Server that never
// listened.
func closeUnstarted(srv *Server) {
	st := srv.state.Load()
	st.stop()
	for _, cl := range st.clusters {
		cl.Close()
	}
	srv.cancelBase(errShutdown)
	_ = srv.tel.Shutdown(context.Background())
}

func reportPerEvent(b *testing.B, events int, mallocs0 uint64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	total := float64(b.N) * float64(events)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/event")
	b.ReportMetric(float64(ms.Mallocs-mallocs0)/total, "allocs/event")
}

// BenchmarkStreamRelay is one streaming request through Handler.ServeHTTP per iteration.
func BenchmarkStreamRelay(b *testing.B) {
	for _, n := range []int{16, 1024} {
		b.Run("events="+strconv.Itoa(n), func(b *testing.B) {
			evs := renderChatStream(n)
			srv := newBenchServer(b, "http://127.0.0.1:1", &fakeUpstream{evs: evs})
			defer closeUnstarted(srv)
			h := &Handler{srv: srv}
			body := benchChatBody(true, n)
			events := len(evs)
			var want int64
			for _, e := range evs {
				want += int64(len(e))
			}
			w := &discardWriter{h: http.Header{}}
			run := func() {
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				clear(w.h)
				w.status, w.n = 0, 0
				h.ServeHTTP(w, r)
			}
			run() // warm: caches, telemetry attribute sets, the first health check
			if w.status != http.StatusOK || w.n != want {
				b.Fatalf("relay: status %d, %d bytes relayed, want 200 and %d", w.status, w.n, want)
			}
			b.ReportAllocs()
			b.SetBytes(want)
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ResetTimer()
			for b.Loop() {
				run()
			}
			b.StopTimer()
			reportPerEvent(b, events, ms.Mallocs)
			if w.n != want {
				b.Fatalf("relayed %d bytes, want %d", w.n, want)
			}
		})
	}
}

// benchChatAnswer is a non-streaming answer as the simulator gives it for max_tokens 16.
const benchChatAnswer = `{"id":"chatcmpl-798992411968960f","object":"chat.completion","created":1796035306,"model":"sim-llama","choices":[{"index":0,"message":{"role":"assistant","content":"morning all there red before remember at batch for stream server report at"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":13,"total_tokens":15}}`

// BenchmarkRequest is one small non-streaming chat request through Handler.ServeHTTP per
// iteration, in process (same fake upstream and discarding writer as BenchmarkStreamRelay):
// Sluice's own per-request cost, without sockets.
func BenchmarkRequest(b *testing.B) {
	srv := newBenchServer(b, "http://127.0.0.1:1", &fakeUpstream{json: []byte(benchChatAnswer)})
	defer closeUnstarted(srv)
	h := &Handler{srv: srv}
	body := benchChatBody(false, 16)
	w := &discardWriter{h: http.Header{}}
	run := func() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		clear(w.h)
		w.status, w.n = 0, 0
		h.ServeHTTP(w, r)
	}
	run()
	if w.status != http.StatusOK || w.n != int64(len(benchChatAnswer)) {
		b.Fatalf("status %d, %d bytes, want 200 and %d", w.status, w.n, len(benchChatAnswer))
	}
	b.ReportAllocs()
	for b.Loop() {
		run()
	}
}

// BenchmarkStreamRelayLoopback is one streaming request per iteration over loopback TCP:
// "direct" reads the upstream itself, "sluice" reads it through a started Server.
func BenchmarkStreamRelayLoopback(b *testing.B) {
	for _, n := range []int{16, 1024} {
		b.Run("events="+strconv.Itoa(n), func(b *testing.B) { benchLoopback(b, n) })
	}
}

func benchLoopback(b *testing.B, n int) {
	evs := renderChatStream(n)
	var want int64
	for _, e := range evs {
		want += int64(len(e))
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method != http.MethodPost {
			return // health check
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, e := range evs {
			if _, err := w.Write(e); err != nil {
				return
			}
			f.Flush()
		}
	}))
	defer up.Close()

	srv := newBenchServer(b, up.URL, nil)
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
	defer client.CloseIdleConnections()
	body := benchChatBody(true, n)

	for _, tc := range []struct{ name, base string }{{"direct", up.URL}, {"sluice", "http://" + srv.Addr()}} {
		b.Run(tc.name, func(b *testing.B) {
			run := func() {
				resp, err := client.Post(tc.base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				got, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || got != want {
					b.Fatalf("status %d, %d bytes, want 200 and %d", resp.StatusCode, got, want)
				}
			}
			run()
			b.ReportAllocs()
			b.SetBytes(want)
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ResetTimer()
			for b.Loop() {
				run()
			}
			b.StopTimer()
			// Both ends run in this process: allocs/event counts client and upstream too.
			reportPerEvent(b, len(evs), ms.Mallocs)
		})
	}
}

// BenchmarkRequestLoopback is one non-streaming request per iteration over loopback TCP,
// client, gateway and upstream in this process: "direct" to the upstream, then through a
// started Server with each upstream client (clusters[].http_client). ns/op is the whole
// round trip on every hop; compare the sub-benchmarks with each other in one run.
func BenchmarkRequestLoopback(b *testing.B) {
	answer := []byte(benchChatAnswer)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	defer up.Close()
	body := benchChatBody(false, 16)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
	defer client.CloseIdleConnections()
	run := func(b *testing.B, base string) {
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		got, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || got != int64(len(answer)) {
			b.Fatalf("status %d, %d bytes", resp.StatusCode, got)
		}
	}
	b.Run("direct", func(b *testing.B) {
		run(b, up.URL)
		b.ReportAllocs()
		g0 := goroutinesCreated()
		for b.Loop() {
			run(b, up.URL)
		}
		b.ReportMetric(float64(goroutinesCreated()-g0)/float64(b.N), "goroutines/op")
	})
	for _, sc := range []struct{ server, client string }{{"sluice", "sluice"}, {"net/http", "sluice"}, {"net/http", "net/http"}} {
		b.Run("server="+strings.ReplaceAll(sc.server, "/", "")+",client="+strings.ReplaceAll(sc.client, "/", ""), func(b *testing.B) {
			srv := newBenchServerWith(b, up.URL, nil, sc.client, sc.server)
			if err := srv.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			}()
			base := "http://" + srv.Addr()
			run(b, base)
			b.ReportAllocs()
			g0 := goroutinesCreated()
			for b.Loop() {
				run(b, base)
			}
			b.ReportMetric(float64(goroutinesCreated()-g0)/float64(b.N), "goroutines/op")
		})
	}
}

// BenchmarkRelayLoop is relayStream's per-event work, one event per iteration, on an
// endless stream of token chunks arriving one per Read: reading the event, the tap's scan
// (which is also the chunk check), writing and flushing.
func BenchmarkRelayLoop(b *testing.B) {
	evs := renderChatStream(64)[1:65] // token chunks only
	steps := []struct {
		name             string
		observe, writeIt bool
	}{
		{"next", false, false},
		{"next+observe", true, false},
		{"next+observe+write+flush", true, true},
	}
	for _, s := range steps {
		b.Run(s.name, func(b *testing.B) {
			rd := openai.NewReader(&eventBody{evs: evs, loop: true}, config.DefaultMaxEventBytes)
			var tap openai.Tap
			tap.Start = time.Now()
			dw := &discardWriter{h: http.Header{}}
			var w http.ResponseWriter = dw
			fl := w.(http.Flusher)
			b.ReportAllocs()
			for b.Loop() {
				ev, err := rd.Next()
				if err != nil {
					b.Fatal(err)
				}
				now := time.Now()
				if s.observe && !tap.ObserveChunk(ev, now) {
					b.Fatal("chunk refused")
				}
				if s.writeIt {
					if _, err := w.Write(ev.Raw); err != nil {
						b.Fatal(err)
					}
					fl.Flush()
				}
			}
			if s.observe && tap.TokenEvents == 0 {
				b.Fatal("tap saw no token events")
			}
		})
	}
}

// goroutinesCreated is the count of goroutines the process has started
// (runtime/metrics' /sched/goroutines-created:goroutines).
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
