package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/telemetry"
	"github.com/sluicegw/sluice/test/sim"
)

// simServer is a simulated model server on 127.0.0.1:<ephemeral>.
type simServer struct {
	*sim.Server
	URL string
}

// startSim serves a simulator over plain HTTP; both are closed when the test ends (after the
// gateway, whose cleanup is registered later).
func startSim(t *testing.T, cfg sim.Config) *simServer {
	t.Helper()
	s := sim.New(cfg)
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return &simServer{Server: s, URL: ts.URL}
}

// gateway is a Sluice server running in the test process.
type gateway struct {
	srv   *proxy.Server
	addr  string // gateway listener, host:port
	admin string // admin listener, host:port
	logs  *syncBuffer
}

// gatewayOpts adjust the options of startGateway.
type gatewayOpts struct {
	configPath    string               // write the YAML here and watch it
	watchInterval time.Duration        // with configPath
	telemetry     *telemetry.Telemetry // nil: the gateway's own
}

// startGateway builds the gateway from a YAML config, starts it and shuts it down (drain
// deadline 10s) when the test ends. The gateway's log is shown when the test fails.
func startGateway(t *testing.T, yaml string, o ...gatewayOpts) *gateway {
	t.Helper()
	var opt gatewayOpts
	if len(o) > 0 {
		opt = o[0]
	}
	var (
		cfg *config.Config
		err error
	)
	if opt.configPath != "" {
		writeFileAtomic(t, opt.configPath, yaml)
		cfg, err = config.LoadFile(opt.configPath)
	} else {
		cfg, err = config.Parse([]byte(yaml))
	}
	if err != nil {
		t.Fatalf("config: %v\n%s", err, yaml)
	}
	return serveGateway(t, cfg, opt)
}

// serveGateway runs a gateway on a built config until the test ends.
func serveGateway(t *testing.T, cfg *config.Config, opt gatewayOpts) *gateway {
	t.Helper()
	logs := &syncBuffer{}
	srv, err := proxy.New(proxy.Options{
		Config:        cfg,
		ConfigPath:    opt.configPath,
		WatchInterval: opt.watchInterval,
		Logger:        slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Version:       "e2e",
		Telemetry:     opt.telemetry,
	})
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	g := &gateway{srv: srv, addr: srv.Addr(), admin: srv.AdminAddr(), logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	})
	return g
}

// oneRoute is the config of a gateway with one cluster of the given endpoints and one
// catch-all route; extra is appended to the cluster (indented YAML lines), routeExtra to the
// route.
func oneRoute(clusterExtra, routeExtra string, endpoints ...string) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n  - name: main\n    endpoints:\n")
	for _, ep := range endpoints {
		fmt.Fprintf(&b, "      - url: %s\n", ep)
	}
	b.WriteString(clusterExtra)
	b.WriteString("routes:\n  - name: all\n    cluster: main\n")
	b.WriteString(routeExtra)
	return b.String()
}

// newHTTPClient is a plain client with its own transport, closed when the test ends.
func newHTTPClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// newClient is the official OpenAI client pointed at the gateway: no retries, its own
// transport (closed at the end of the test), extra options for the simulator's knobs.
func newClient(t *testing.T, addr string, opts ...option.RequestOption) openai.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	base := []option.RequestOption{
		option.WithBaseURL("http://" + addr + "/v1/"),
		option.WithAPIKey("sk-e2e"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: tr}),
		option.WithRequestTimeout(30 * time.Second),
	}
	return openai.NewClient(append(base, opts...)...)
}

// testCtx is a context bounded well below the package time-out.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// do sends a request and returns the response with its whole body read.
func do(t *testing.T, c *http.Client, method, url, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return resp, b
}

// apiError is OpenAI's error body.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// checkErrorShape asserts an OpenAI error response: status, JSON content type, the shape
// {"error":{"message","type","param","code"}} and, if code is not empty, its code.
func checkErrorShape(t *testing.T, resp *http.Response, body []byte, status int, code string) apiError {
	t.Helper()
	if resp.StatusCode != status {
		t.Errorf("status = %d, want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	return checkErrorJSON(t, body, code)
}

func checkErrorJSON(t *testing.T, body []byte, code string) apiError {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error body lacks error.%s: %s", k, body)
		}
	}
	var e apiError
	_ = json.Unmarshal(body, &e)
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error body without message or type: %s", body)
	}
	if code != "" && (e.Error.Code == nil || *e.Error.Code != code) {
		t.Errorf("error code = %v, want %q (body %s)", deref(e.Error.Code), code, body)
	}
	return e
}

func deref(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

// sseEvent is one event of a raw SSE body.
type sseEvent struct {
	name string
	data string
}

// parseSSE splits a raw SSE body into events (data lines joined by "\n").
func parseSSE(body []byte) []sseEvent {
	var (
		out []sseEvent
		cur sseEvent
		has bool
	)
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if has {
				out = append(out, cur)
			}
			cur, has = sseEvent{}, false
		case strings.HasPrefix(line, "event:"):
			cur.name, has = strings.TrimSpace(strings.TrimPrefix(line, "event:")), true
		case strings.HasPrefix(line, "data:"):
			d := strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
			if cur.data != "" {
				cur.data += "\n"
			}
			cur.data += d
			has = true
		}
	}
	if has {
		out = append(out, cur)
	}
	return out
}

// streamText concatenates the content (chat) or text (completions) of a raw SSE body's
// chunks and reports whether it ended with [DONE].
func streamText(t *testing.T, events []sseEvent) (text string, done bool, chunks int) {
	t.Helper()
	var b strings.Builder
	for _, ev := range events {
		if ev.data == "[DONE]" {
			done = true
			continue
		}
		var c struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("chunk is not JSON: %v: %q", err, ev.data)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" || ch.Text != "" {
				chunks++
			}
			b.WriteString(ch.Delta.Content)
			b.WriteString(ch.Text)
		}
	}
	return b.String(), done, chunks
}

// metricValue sums the samples of a Prometheus metric on the admin listener whose labels
// contain every given label pair (`result="error"`).
func metricValue(t *testing.T, c *http.Client, admin, name string, labels ...string) float64 {
	t.Helper()
	resp, body := do(t, c, http.MethodGet, "http://"+admin+"/metrics", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	var sum float64
next:
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line[:sp], l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// eventually polls cond every 10ms for up to d and fails the test with msg if it never holds.
func eventually(t *testing.T, d time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writeFileAtomic replaces a file in one rename, so a watcher never reads half of it.
func writeFileAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// recorder is an upstream that records the headers of the requests it gets and answers a
// fixed chat completion (or what respond writes).
type recorder struct {
	mu      sync.Mutex
	headers []http.Header
	bodies  []string
	URL     string
	respond func(w http.ResponseWriter, r *http.Request)
}

func startRecorder(t *testing.T, respond func(w http.ResponseWriter, r *http.Request)) *recorder {
	t.Helper()
	rec := &recorder{respond: respond}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/health" {
			return
		}
		if r.Header.Get("User-Agent") == "sluice-model-discovery" {
			// The gateway's own model discovery, whenever its health checks ask: not the
			// traffic a test counts (and a recorder answers no model list).
			http.NotFound(w, r)
			return
		}
		rec.mu.Lock()
		rec.headers = append(rec.headers, r.Header.Clone())
		rec.bodies = append(rec.bodies, string(b))
		rec.mu.Unlock()
		if rec.respond != nil {
			rec.respond(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"rec","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(ts.Close)
	rec.URL = ts.URL
	return rec
}

// count is how many requests the recorder got.
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.headers)
}

// all returns the headers of every request so far.
func (r *recorder) all() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.headers...)
}

// allBodies returns the bodies of every request so far.
func (r *recorder) allBodies() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

func (r *recorder) last(t *testing.T) http.Header {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.headers) == 0 {
		t.Fatal("upstream got no request")
	}
	return r.headers[len(r.headers)-1]
}

const chatBody = `{"model":"sim-llama","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`

// asAPIError is errors.As for the client's *openai.Error.
func asAPIError(err error, target **openai.Error) bool {
	return err != nil && errors.As(err, target)
}

// atomicBool is a flag shared with a handler.
type atomicBool struct {
	mu sync.Mutex
	v  bool
}

func (b *atomicBool) get() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.v
}

func (b *atomicBool) set(v bool) {
	b.mu.Lock()
	b.v = v
	b.mu.Unlock()
}
