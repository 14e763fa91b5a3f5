package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

const plainBody = `{"model":"sim-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`

// TestClientHeadersNeverForwarded: Sluice's own headers (the admin token, chaos faults) and
// headers that name another URL or host never reach a model server; with a cluster API key,
// none of the client's credentials do.
func TestClientHeadersNeverForwarded(t *testing.T) {
	rec := startRecorder(t, nil)
	t.Setenv("E2E_UPSTREAM_KEY", "sk-cluster")
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n    api_key_env: E2E_UPSTREAM_KEY\n", "", rec.URL))
	_, _ = do(t, newHTTPClient(t), http.MethodPost, "http://"+g.addr+"/v1/chat/completions", plainBody,
		"X-Sluice-Admin-Token", "admin-secret", "X-Sluice-Fault", "abort", "X-Original-URL", "/admin", "X-Rewrite-URL", "/admin",
		"X-Forwarded-Host", "evil.example", "Authorization", "Bearer sk-client", "Api-Key", "k1", "X-Api-Key", "k2",
		"Cookie", "session=s", "X-Goog-Api-Key", "k3", "Ocp-Apim-Subscription-Key", "k4", "X-Keep", "yes")
	hs := rec.all()
	if len(hs) != 1 {
		t.Fatalf("%d upstream requests", len(hs))
	}
	h := hs[0]
	for _, k := range []string{"X-Sluice-Admin-Token", "X-Sluice-Fault", "X-Original-Url", "X-Rewrite-Url", "X-Forwarded-Host",
		"Api-Key", "X-Api-Key", "Cookie", "X-Goog-Api-Key", "Ocp-Apim-Subscription-Key"} {
		if v := h.Get(k); v != "" {
			t.Errorf("%s reached the model server: %q", k, v)
		}
	}
	if got := h.Get("Authorization"); got != "Bearer sk-cluster" {
		t.Errorf("Authorization %q, want the cluster's key", got)
	}
	if h.Get("X-Keep") != "yes" {
		t.Error("an ordinary header was dropped")
	}
}

// TestClientHeadersAsSDKsSendThem: the same rules for a request whose header names arrive in
// lower case, as httpx-based SDKs (the official Python client) send them, through a load
// balancer that appends to X-Forwarded-For and lists a header of its own in Connection: the
// gateway's headers, the URL overrides, the hop-by-hop ones, Accept-Encoding (the tap reads
// the answer as the model server wrote it) and the length stay out; the trace context and the
// forwarded-for chain go on, with the balancer's address appended; the SDK's own pass.
func TestClientHeadersAsSDKsSendThem(t *testing.T) {
	rec := startRecorder(t, nil)
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n", "", rec.URL))
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\naccept: application/json\r\n"+
		"accept-encoding: gzip, deflate\r\ncontent-type: application/json\r\nuser-agent: OpenAI/Python 1.99.0\r\n"+
		"x-stainless-lang: python\r\nx-stainless-retry-count: 0\r\nauthorization: Bearer sk-client\r\n"+
		"x-forwarded-for: 203.0.113.7\r\nx-forwarded-proto: https\r\nx-forwarded-host: evil.example\r\n"+
		"x-original-url: /admin\r\nx-sluice-fault: abort\r\ntraceparent: %s\r\n"+
		"connection: keep-alive, x-lb-hop\r\nx-lb-hop: 1\r\ncontent-length: %d\r\n\r\n%s", tp, len(plainBody), plainBody)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	hs := rec.all()
	if len(hs) != 1 {
		t.Fatalf("%d upstream requests", len(hs))
	}
	h := hs[0]
	for _, k := range []string{"X-Sluice-Fault", "X-Original-Url", "X-Forwarded-Host", "X-Lb-Hop", "Accept-Encoding"} {
		if v := h.Get(k); v != "" {
			t.Errorf("%s reached the model server: %q", k, v)
		}
	}
	for k, want := range map[string]string{
		"Traceparent": tp, "X-Forwarded-For": "203.0.113.7, 127.0.0.1", "X-Forwarded-Proto": "http",
		"Authorization": "Bearer sk-client", "X-Stainless-Lang": "python", "User-Agent": "OpenAI/Python 1.99.0",
		"Content-Length": strconv.Itoa(len(plainBody)),
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
}

// TestRequestShapesRefused: paths some servers read as another path, and bodies a browser
// page could send without asking (not JSON), are refused before anything reaches a model
// server; preflights get Sluice's answer (no CORS allowance unless configured), and a model
// server's own Access-Control headers never reach the client.
func TestRequestShapesRefused(t *testing.T) {
	rec := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*") // vLLM's default
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"rec","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	})
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n", "", rec.URL))
	hc := newHTTPClient(t)
	raw := func(reqLine string) string {
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "%s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", reqLine)
		status, _ := bufio.NewReader(c).ReadString('\n')
		return status
	}
	for _, p := range []string{"/v1/models/..;/admin", "/v1/a/..%5C..%5Cadmin", "/v1//models", "/v1/models/.;x/y", "/v1/x\\..\\y"} {
		if st := raw("GET " + p); !strings.Contains(st, " 400 ") {
			t.Errorf("GET %s: %q, want 400", p, st)
		}
	}
	// An empty JSON body: a client error in OpenAI's shape, not a forwarded request.
	resp, body := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", "", "Content-Type", "application/json")
	checkErrorShape(t, resp, body, http.StatusBadRequest, "invalid_json")
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/v1/chat/completions", strings.NewReader(plainBody))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(b), `"unsupported_media_type"`) {
			t.Errorf("Content-Type %q: %d %s, want 415", ct, resp.StatusCode, b)
		}
	}
	if n := rec.count(); n != 0 {
		t.Errorf("%d refused requests reached the model server", n)
	}

	// Preflight and answers without configured origins: no allowance.
	pre, _ := http.NewRequest(http.MethodOptions, "http://"+g.addr+"/v1/chat/completions", nil)
	pre.Header.Set("Origin", "https://evil.example")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	presp, err := hc.Do(pre)
	if err != nil {
		t.Fatal(err)
	}
	presp.Body.Close()
	if presp.StatusCode != http.StatusNoContent || presp.Header.Get("Access-Control-Allow-Origin") != "" || rec.count() != 0 {
		t.Errorf("preflight: %d %v (model server asked %d times)", presp.StatusCode, presp.Header, rec.count())
	}
	resp, _ = do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", plainBody, "Origin", "https://evil.example")
	if v := resp.Header.Get("Access-Control-Allow-Origin"); v != "" {
		t.Errorf("the model server's Access-Control-Allow-Origin %q reached the client", v)
	}

	// With an allowed origin.
	g2 := startGateway(t, "cors: {allowed_origins: [\"https://app.example\"]}\n"+oneRoute("    health_check: {disabled: true}\n", "", rec.URL))
	pre2, _ := http.NewRequest(http.MethodOptions, "http://"+g2.addr+"/v1/chat/completions", nil)
	pre2.Header.Set("Origin", "https://app.example")
	pre2.Header.Set("Access-Control-Request-Method", "POST")
	pre2.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
	presp2, err := hc.Do(pre2)
	if err != nil {
		t.Fatal(err)
	}
	presp2.Body.Close()
	if presp2.Header.Get("Access-Control-Allow-Origin") != "https://app.example" || presp2.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
		t.Errorf("allowed preflight: %v", presp2.Header)
	}
	resp, _ = do(t, hc, http.MethodPost, "http://"+g2.addr+"/v1/chat/completions", plainBody, "Origin", "https://app.example")
	if resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example" || !strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "X-Request-Id") {
		t.Errorf("allowed origin's answer: %v", resp.Header)
	}
}

// rawUpstream answers every connection with the same bytes, whatever the request.
func rawUpstream(t *testing.T, answer string) (url string, conns *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				_, _ = io.WriteString(c, answer)
			}()
		}
	}()
	return "http://" + ln.Addr().String(), conns
}

// TestUpstreamAnswersOutOfShape: answers that break HTTP are upstream_protocol (the server
// was reached and may have done the work: not retried at once on another endpoint as a
// connection failure is), and successful answers not in the promised shape never reach the
// client as successes.
func TestUpstreamAnswersOutOfShape(t *testing.T) {
	const ok = `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	var many1xx strings.Builder
	for range 10000 { // 400 KB of informational answers, past the bound on upstream headers
		many1xx.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
	}
	many1xx.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	for _, tc := range []struct {
		name, answer, body string
		class              string
	}{
		{"garbage status line", "HELLO WORLD\r\n\r\n", plainBody, "upstream_protocol"},
		{"bad chunking", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n", plainBody, "upstream_protocol"},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n" + ok, plainBody, "upstream_protocol"},
		{"huge headers", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 1<<20) + "\r\nContent-Length: 2\r\n\r\n{}", plainBody, "upstream_protocol"},
		{"flood of 1xx", many1xx.String(), plainBody, "upstream_protocol"},
		{"html to a stream", "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n<html></html>",
			`{"model":"sim-llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "upstream_malformed"},
		{"truncated JSON", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n" + ok[:20], plainBody, "upstream_malformed"},
		{"claims gzip", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: " + fmt.Sprint(len(ok)) + "\r\n\r\n" + ok, plainBody, "upstream_malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u1, c1 := rawUpstream(t, tc.answer)
			u2, c2 := rawUpstream(t, tc.answer)
			g := startGateway(t, "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n"+
				"  - {name: main, endpoints: [{url: "+u1+"}, {url: "+u2+"}], health_check: {disabled: true}, outlier: {disabled: true}}\n"+
				"routes:\n  - {name: all, cluster: main}\n")
			hc := newHTTPClient(t)
			resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", tc.body)
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), `"`+tc.class+`"`) {
				t.Errorf("%d %s, want 502 %s", resp.StatusCode, b, tc.class)
			}
			if n := c1.Load() + c2.Load(); n != 1 {
				t.Errorf("%d upstream connections: a server that answered was retried at once on another endpoint", n)
			}
			if v := metricValue(t, hc, g.admin, "sluice_requests_total", `error_type="`+tc.class+`"`); v != 1 {
				t.Errorf("counted %v times as %s", v, tc.class)
			}
		})
	}
}

// TestClientLimits: a client that sends part of a body is answered 408 at the body time-out
// and holds nothing after; one that stops reading a stream is dropped at the write time-out
// and its upstream request released at once; headers over the bound get 431; connections
// over the per-client bound are closed at once while the admin listener stays reachable.
func TestClientLimits(t *testing.T) {
	var upstreamDone atomic.Int64
	big := strings.Repeat("x", 32<<10)
	streamer := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		defer upstreamDone.Add(1)
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}\n\n", big); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			default:
			}
		}
	})
	g := startGateway(t, "timeouts: {body: 300ms, write: 500ms}\nlimits: {max_header_bytes: 16KiB, max_connections_per_client: 8}\n"+
		oneRoute("    health_check: {disabled: true}\n", "", streamer.URL))
	hc := newHTTPClient(t)

	t.Run("slow body", func(t *testing.T) {
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprint(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		status, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(status, " 408 ") {
			t.Fatalf("a body that never came: %q %v, want 408", status, err)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("answered after %v, want about the body time-out (300ms)", el)
		}
	})

	t.Run("reader that stops", func(t *testing.T) {
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 10)
		}
		body := `{"model":"sim-llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		// Never read: the gateway's writes fill the socket and block.
		eventually(t, 10*time.Second, "the stalled client dropped and its upstream released", func() bool {
			return upstreamDone.Load() >= 1 && metricValue(t, hc, g.admin, "sluice_requests_total", `error_type="client_stalled"`) == 1
		})
	})

	t.Run("headers over the bound", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/v1/chat/completions", strings.NewReader(plainBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Big", strings.Repeat("a", 32<<10))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("32 KiB of headers: %d, want 431", resp.StatusCode)
		}
	})

	t.Run("connections per client", func(t *testing.T) {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for range 8 {
			c, err := net.Dial("tcp", g.addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		eventually(t, 5*time.Second, "8 connections open", func() bool {
			return metricValue(t, hc, g.admin, "sluice_connections_open") >= 8
		})
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Closed as it arrives: the read ends at once with EOF or a reset, not at the deadline.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		began := time.Now()
		var ne net.Error
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() || time.Since(began) > 2*time.Second {
			t.Errorf("a connection over the per-client bound was kept (read: %v after %v)", err, time.Since(began))
		}
		if resp, _ := do(t, hc, http.MethodGet, "http://"+g.admin+"/healthz", ""); resp.StatusCode != http.StatusOK {
			t.Errorf("admin listener: %d", resp.StatusCode)
		}
		if v := metricValue(t, hc, g.admin, "sluice_connections_rejected_total", `bound="client"`); v < 1 {
			t.Errorf("rejected connections not counted (%v)", v)
		}
	})
}

// TestModelLabelsBounded: model names only a client gave never become metric label values:
// a thousand random long names leave one "other" series.
func TestModelLabelsBounded(t *testing.T) {
	up := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, routingConfig("  - {name: all, cluster: main}\n", "main", up.URL))
	hc := newHTTPClient(t)
	for i := range 300 {
		name := fmt.Sprintf("m-%d-%s", i, strings.Repeat("z", 4<<10))
		_, _ = do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions",
			`{"model":"`+name+`","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	}
	_, _ = do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", plainBody)
	_, body := do(t, hc, http.MethodGet, "http://"+g.admin+"/metrics", "")
	if strings.Contains(string(body), "zzzz") {
		t.Error("a client's model name is a metric label")
	}
	if !strings.Contains(string(body), `gen_ai_request_model="other"`) || !strings.Contains(string(body), `gen_ai_request_model="sim-llama"`) {
		t.Error("want the unknown names as other and the served model as itself")
	}
	if len(body) > 1<<20 {
		t.Errorf("/metrics is %d bytes after 300 unknown model names", len(body))
	}
}

// TestDrainDelay: on SIGTERM (Run's context ending) readiness goes off at once while the
// listener still accepts for drain_delay, then the gateway drains.
func TestDrainDelay(t *testing.T) {
	up := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, "drain_delay: 1s\n"+routingConfig("  - {name: all, cluster: main}\n", "main", up.URL))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { <-ctx.Done(); done <- g.srv.Drain() }()
	hc := newHTTPClient(t)
	cancel()
	eventually(t, 2*time.Second, "not ready", func() bool {
		resp, _ := do(t, hc, http.MethodGet, "http://"+g.admin+"/readyz", "")
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	if resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", plainBody); resp.StatusCode != http.StatusOK {
		t.Errorf("during the drain delay: %d %s, want still served", resp.StatusCode, b)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no drain after the delay")
	}
}

// TestDrainDelayKeepsReadinessOff: a config applied during the drain delay (an xDS update, a
// reload) does not turn readiness back on.
func TestDrainDelayKeepsReadinessOff(t *testing.T) {
	up := startRoutingUpstream(t, sim.Config{}, -1)
	g := startGateway(t, "drain_delay: 1500ms\n"+routingConfig("  - {name: all, cluster: main}\n", "main", up.URL))
	done := make(chan error, 1)
	go func() { done <- g.srv.Drain() }()
	hc := newHTTPClient(t)
	ready := func() int {
		resp, _ := do(t, hc, http.MethodGet, "http://"+g.admin+"/readyz", "")
		return resp.StatusCode
	}
	eventually(t, time.Second, "not ready", func() bool { return ready() == http.StatusServiceUnavailable })
	next, err := config.Parse([]byte("drain_delay: 1500ms\n" + routingConfig("  - {name: all-v2, cluster: main}\n", "main", up.URL)))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.srv.Apply(next); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if st := ready(); st != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d after a config applied during the drain delay, want 503", st)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Drain: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no drain after the delay")
	}
}

// TestAnonymousClientsBehindAProxy: every client behind a load balancer has its address. By
// default (no trusted proxies) one client's refused prompts never cut off another; with
// trusted_proxies the clients are told apart by X-Forwarded-For, and the one sending
// explosions is isolated by its own breaker while the other is served.
func TestAnonymousClientsBehindAProxy(t *testing.T) {
	up := startRoutingUpstream(t, sim.Config{}, -1)
	deep := `{"model":"sim-llama","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `"}]}`
	hc := newHTTPClient(t)
	for _, tc := range []struct {
		name, extra string
		badXFF      string // what the bad client's requests carry when they reach Sluice
		isolated    bool   // the bad client's breaker opens
	}{
		{"default", "", "198.51.100.1", false},
		{"trusted proxies", "trusted_proxies: [127.0.0.1]\n", "198.51.100.1", true},
		// The bad client writes the good client's address into its own X-Forwarded-For;
		// the proxy appends the address it saw. Read right to left, the forgery is ignored.
		{"trusted proxies, forged hop", "trusted_proxies: [127.0.0.1]\n", "198.51.100.2, 198.51.100.1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, tc.extra+routingConfig("  - {name: all, cluster: main}\n", "main", up.URL))
			var last int
			for range 12 {
				resp, _ := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", deep, "X-Forwarded-For", tc.badXFF)
				last = resp.StatusCode
			}
			if want := map[bool]int{false: 400, true: 503}[tc.isolated]; last != want {
				t.Errorf("the bad client's 12th explosion: %d, want %d", last, want)
			}
			resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", plainBody, "X-Forwarded-For", "198.51.100.2")
			if resp.StatusCode != http.StatusOK {
				t.Errorf("an unrelated client behind the same proxy: %d %s", resp.StatusCode, b)
			}
		})
	}
}

// TestSlowUploadPassThrough: a pass-through body (a multipart transcription upload) that does
// not arrive within timeouts.body is the client's failure over HTTP/1 and HTTP/2: 408
// body_timeout, never a connection failure of the model server (no endpoint failure, no
// retry, no 502).
func TestSlowUploadPassThrough(t *testing.T) {
	var upstreamSaw atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			// A real server refuses the part it got (or the connection is gone).
			http.Error(w, `{"error":{"message":"malformed multipart body","type":"invalid_request_error"}}`, http.StatusBadRequest)
			return
		}
		upstreamSaw.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"text":"hi"}`)
	}))
	defer up.Close()
	g := startGateway(t, "timeouts: {body: 300ms}\n"+oneRoute("    health_check: {disabled: true}\n", "", up.URL))
	hc := newHTTPClient(t)
	const boundary = "b0undary"
	head := "--" + boundary + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--" + boundary +
		"\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n" + strings.Repeat("RIFF", 256)
	endpointFailures := func() int64 {
		_, b := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/endpoints", "")
		var eps map[string][]struct {
			Failures int64 `json:"failures"`
		}
		if err := json.Unmarshal(b, &eps); err != nil || len(eps["main"]) != 1 {
			t.Fatalf("/admin/endpoints: %v %s", err, b)
		}
		return eps["main"][0].Failures
	}
	check := func(t *testing.T, status int, body string) {
		t.Helper()
		if status != http.StatusRequestTimeout || !strings.Contains(body, `"body_timeout"`) {
			t.Errorf("a body that stopped: %d %s, want 408 body_timeout", status, body)
		}
		if n := endpointFailures(); n != 0 {
			t.Errorf("the endpoint has %d failures, want none: the client was slow, not the model server", n)
		}
		if n := upstreamSaw.Load(); n != 0 {
			t.Errorf("the model server took %d incomplete uploads whole", n)
		}
		if v := metricValue(t, hc, g.admin, "sluice_upstream_errors_total"); v != 0 {
			t.Errorf("%v upstream errors counted for the client's slow body", v)
		}
	}

	t.Run("http1", func(t *testing.T) {
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=%s\r\nContent-Length: 100000\r\n\r\n%s", boundary, head)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		check(t, resp.StatusCode, string(b))
	})

	t.Run("http2", func(t *testing.T) {
		var protos http.Protocols
		protos.SetUnencryptedHTTP2(true)
		tr := &http.Transport{Protocols: &protos}
		defer tr.CloseIdleConnections()
		pr, pw := io.Pipe()
		defer pw.Close()
		go func() { _, _ = io.WriteString(pw, head) }() // then nothing more
		req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/v1/audio/transcriptions", pr)
		req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("protocol %s", resp.Proto)
		}
		b, _ := io.ReadAll(resp.Body)
		check(t, resp.StatusCode, string(b))
	})
}
