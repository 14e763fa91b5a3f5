package e2e

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/test/sim"
)

// TestBadRequests: the gateway's own answers to bad requests, in OpenAI's error shape.
func TestBadRequests(t *testing.T) {
	s := startSim(t, sim.Config{})
	g := startGateway(t, "max_body_bytes: 4KiB\n"+oneRoute("", "", s.URL))
	hc := newHTTPClient(t)
	big := `{"model":"sim-llama","messages":[{"role":"user","content":"` + strings.Repeat("x", 64<<10) + `"}]}`
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"oversized body", "POST", "/v1/chat/completions", big, 413, "request_too_large"},
		{"oversized embeddings body", "POST", "/v1/embeddings", `{"model":"sim-llama","input":"` + strings.Repeat("y", 8<<10) + `"}`, 413, "request_too_large"},
		{"malformed JSON", "POST", "/v1/chat/completions", `{"model":"sim-llama","messages":[`, 400, "invalid_json"},
		{"not an object", "POST", "/v1/completions", `[1,2,3]`, 400, "invalid_type"},
		{"model of the wrong type", "POST", "/v1/chat/completions", `{"model":5,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_type"},
		{"stream of the wrong type", "POST", "/v1/chat/completions", `{"model":"sim-llama","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_type"},
		{"messages of the wrong type", "POST", "/v1/chat/completions", `{"model":"sim-llama","messages":"hi"}`, 400, "invalid_type"},
		{"input of the wrong type", "POST", "/v1/embeddings", `{"model":"sim-llama","input":{"a":1}}`, 400, ""},
		{"unknown path outside /v1/", "GET", "/nope", "", 404, "unknown_url"},
		{"unknown path under /v1/ (answered upstream)", "GET", "/v1/nope", "", 404, "not_found"},
		// Dot segments would reach paths outside /v1/ on an upstream that normalises them
		// (or another route's endpoint than the one matched): the gateway refuses them.
		{"dot-dot out of /v1/", "GET", "/v1/../metrics", "", 400, "invalid_path"},
		{"escaped dot-dot out of /v1/", "GET", "/v1/%2e%2e/metrics", "", 400, "invalid_path"},
		{"dot-dot across routes", "POST", "/v1/chat/../embeddings", `{"model":"sim-llama","input":"x"}`, 400, "invalid_path"},
		{"dot segment", "GET", "/v1/./models", "", 400, "invalid_path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := do(t, hc, tt.method, "http://"+g.addr+tt.path, tt.body)
			checkErrorShape(t, resp, b, tt.status, tt.code)
			if resp.Header.Get("X-Request-Id") == "" {
				t.Error("error answer without X-Request-Id")
			}
		})
	}
	// The gateway rejected the bad bodies itself: the simulator saw none of them.
	if n := s.Stats().Requests; n != 0 {
		t.Errorf("simulator got %d API requests, want 0", n)
	}
	// The official client sees the same statuses.
	client := newClient(t, g.addr)
	_, err := client.Chat.Completions.New(testCtx(t), openai.ChatCompletionNewParams{
		Model:    "sim-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("z", 8<<10))},
	})
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 413 || apiErr.Code != "request_too_large" {
		t.Errorf("openai-go with an oversized prompt: %v", err)
	}
}

// TestHeaders: request ids, hop-by-hop headers and trace context on the way through.
func TestHeaders(t *testing.T) {
	rec := startRecorder(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "X-Bar")
		w.Header().Set("X-Bar", "dropped")
		w.Header().Set("X-Upstream", "kept")
		w.Header().Set("X-Request-Id", "chosen-by-upstream") // the gateway's id must win
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","model":"rec","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`))
	})
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n", "", rec.URL))
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"

	t.Run("x-request-id forwarded", func(t *testing.T) {
		resp, _ := do(t, hc, "POST", url, chatBody, "X-Request-Id", "req-e2e-42")
		if got := resp.Header.Get("X-Request-Id"); got != "req-e2e-42" {
			t.Errorf("response X-Request-Id = %q", got)
		}
		if got := rec.last(t).Get("X-Request-Id"); got != "req-e2e-42" {
			t.Errorf("upstream X-Request-Id = %q", got)
		}
	})
	t.Run("x-request-id generated", func(t *testing.T) {
		resp, _ := do(t, hc, "POST", url, chatBody)
		id := resp.Header.Get("X-Request-Id")
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) {
			t.Errorf("generated X-Request-Id = %q", id)
		}
		if got := rec.last(t).Get("X-Request-Id"); got != id {
			t.Errorf("upstream X-Request-Id = %q, client got %q", got, id)
		}
		resp2, _ := do(t, hc, "POST", url, chatBody)
		if resp2.Header.Get("X-Request-Id") == id {
			t.Error("two requests got the same generated id")
		}
	})
	t.Run("hop-by-hop headers dropped both ways", func(t *testing.T) {
		resp, _ := do(t, hc, "POST", url, chatBody,
			"Connection", "X-Foo", "X-Foo", "bar", "Keep-Alive", "timeout=5", "Proxy-Authorization", "Basic eDp5",
			"Te", "trailers", "Upgrade", "h2c", "X-Keep", "yes")
		h := rec.last(t)
		for _, k := range []string{"X-Foo", "Keep-Alive", "Proxy-Authorization", "Te", "Upgrade"} {
			if v := h.Values(k); len(v) > 0 {
				t.Errorf("upstream got hop-by-hop %s: %q", k, v)
			}
		}
		if c := h.Get("Connection"); strings.Contains(strings.ToLower(c), "x-foo") {
			t.Errorf("upstream got Connection: %q", c)
		}
		if h.Get("X-Keep") != "yes" {
			t.Errorf("end-to-end header lost: %v", h)
		}
		if h.Get("X-Forwarded-For") != "127.0.0.1" || h.Get("X-Forwarded-Proto") != "http" {
			t.Errorf("X-Forwarded-For %q, X-Forwarded-Proto %q", h.Get("X-Forwarded-For"), h.Get("X-Forwarded-Proto"))
		}
		if resp.Header.Get("X-Bar") != "" {
			t.Errorf("client got X-Bar, named in the upstream's Connection header")
		}
		if resp.Header.Get("X-Upstream") != "kept" || resp.Header.Get("X-Sluice-Upstream") != "main" {
			t.Errorf("response headers: %v", resp.Header)
		}
	})
	t.Run("traceparent propagated unchanged without a tracer", func(t *testing.T) {
		const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		const ts = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
		do(t, hc, "POST", url, chatBody, "traceparent", tp, "tracestate", ts)
		h := rec.last(t)
		if h.Get("Traceparent") != tp || h.Get("Tracestate") != ts {
			t.Errorf("upstream traceparent %q tracestate %q, want them unchanged", h.Get("Traceparent"), h.Get("Tracestate"))
		}
		do(t, hc, "POST", url, chatBody)
		if v := rec.last(t).Get("Traceparent"); v != "" {
			t.Errorf("traceparent %q invented without one incoming", v)
		}
	})
	t.Run("client Authorization passes through", func(t *testing.T) {
		do(t, hc, "POST", url, chatBody, "Authorization", "Bearer client-key")
		if got := rec.last(t).Get("Authorization"); got != "Bearer client-key" {
			t.Errorf("upstream Authorization = %q", got)
		}
	})
}

// TestPassiveEjection: an endpoint answering 503 is ejected after consecutive failures and
// the traffic moves to the healthy endpoint of the same cluster.
func TestPassiveEjection(t *testing.T) {
	good := startSim(t, sim.Config{})
	bad := startSim(t, sim.Config{ErrorRate5xx: 1})
	g := startGateway(t, oneRoute(`    health_check: {disabled: true}
    outlier: {consecutive_failures: 2, base_ejection: 1m, max_ejection: 2m}
`, "", good.URL, bad.URL))
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"

	failed := 0
	for range 10 {
		resp, b := do(t, hc, "POST", url, chatBody)
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusInternalServerError, http.StatusServiceUnavailable:
			checkErrorShape(t, resp, b, resp.StatusCode, "")
			failed++
		default:
			t.Fatalf("unexpected status %d: %s", resp.StatusCode, b)
		}
	}
	if failed != 2 {
		t.Errorf("%d requests failed before the ejection, want 2 (consecutive_failures)", failed)
	}
	badSeen := bad.Stats().Requests
	for range 10 {
		if resp, b := do(t, hc, "POST", url, chatBody); resp.StatusCode != http.StatusOK {
			t.Fatalf("after the ejection: %d %s", resp.StatusCode, b)
		}
	}
	if n := bad.Stats().Requests; n != badSeen {
		t.Errorf("the ejected endpoint got %d more requests", n-badSeen)
	}

	resp, b := do(t, hc, "GET", "http://"+g.admin+"/admin/endpoints", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/endpoints: %d %s", resp.StatusCode, b)
	}
	var eps map[string][]struct {
		URL          string `json:"url"`
		Ejected      bool   `json:"ejected"`
		TimesEjected int64  `json:"times_ejected"`
		Requests     int64  `json:"requests"`
		Failures     int64  `json:"failures"`
	}
	if err := json.Unmarshal(b, &eps); err != nil {
		t.Fatalf("/admin/endpoints: %v: %s", err, b)
	}
	for _, ep := range eps["main"] {
		switch ep.URL {
		case bad.URL:
			if !ep.Ejected || ep.TimesEjected != 1 || ep.Failures != 2 {
				t.Errorf("bad endpoint: %+v, want ejected once after 2 failures", ep)
			}
		case good.URL:
			if ep.Ejected || ep.Failures != 0 || ep.Requests != 18 {
				t.Errorf("good endpoint: %+v, want 18 requests and no failure", ep)
			}
		default:
			t.Errorf("unknown endpoint %+v", ep)
		}
	}
	if len(eps["main"]) != 2 {
		t.Errorf("/admin/endpoints: %s", b)
	}
}

// TestH2C: an HTTP/2 client with prior knowledge streams through the plain-text listener.
func TestH2C(t *testing.T) {
	s := startSim(t, sim.Config{ITL: time.Millisecond})
	g := startGateway(t, oneRoute("", "", s.URL))
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	body := `{"model":"sim-llama","stream":true,"max_tokens":16,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, b := do(t, hc, "POST", "http://"+g.addr+"/v1/chat/completions", body)
	if resp.ProtoMajor != 2 {
		t.Fatalf("protocol %s, want HTTP/2", resp.Proto)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	text, done, chunks := streamText(t, parseSSE(b))
	if !done || chunks != 16 {
		t.Fatalf("h2c stream: %d chunks, done %v: %q", chunks, done, text)
	}

	// The official client over h2c gets the same answer as over HTTP/1.1.
	params := openai.ChatCompletionNewParams{
		Model: "sim-llama", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(16),
	}
	h2c := newClient(t, g.addr, option.WithHTTPClient(hc))
	h2, err := h2c.Chat.Completions.New(testCtx(t), params)
	if err != nil {
		t.Fatalf("openai-go over h2c: %v", err)
	}
	h1c := newClient(t, g.addr)
	h1, err := h1c.Chat.Completions.New(testCtx(t), params)
	if err != nil {
		t.Fatalf("openai-go over HTTP/1.1: %v", err)
	}
	if h1.Choices[0].Message.Content != h2.Choices[0].Message.Content {
		t.Errorf("h2c %q, HTTP/1.1 %q", h2.Choices[0].Message.Content, h1.Choices[0].Message.Content)
	}

	// Resetting the HTTP/2 stream mid-way cancels the upstream request.
	before := s.Stats().Cancelled
	long := `{"model":"sim-llama","stream":true,"max_tokens":5000,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, r := openStream(t, hc, g.addr, 0, long)
	if resp.ProtoMajor != 2 {
		t.Fatalf("protocol %s, want HTTP/2", resp.Proto)
	}
	if evs := readEvents(t, r, 3); len(evs) != 3 {
		t.Fatalf("stream start: %+v", evs)
	}
	resp.Body.Close()
	eventually(t, 5*time.Second, "upstream cancelled after an HTTP/2 stream reset", func() bool {
		return s.Stats().Cancelled == before+1
	})
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key as PEM files.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "sluice-e2e"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	var b bytes.Buffer
	if err := pem.Encode(&b, &pem.Block{Type: typ, Bytes: der}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTLS: a TLS listener (self-signed certificate, HTTP/2 by ALPN) in front of an HTTPS
// upstream trusted through a CA file.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	s := sim.New(sim.Config{})
	t.Cleanup(s.Close)
	up := httptest.NewTLSServer(s)
	t.Cleanup(up.Close)
	caFile := filepath.Join(dir, "upstream-ca.pem")
	writePEM(t, caFile, "CERTIFICATE", up.Certificate().Raw)

	certFile, keyFile, cert := selfSigned(t, dir)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	g := startGateway(t, fmt.Sprintf("tls: {cert_file: %s, key_file: %s}\n", certFile, keyFile)+
		oneRoute(fmt.Sprintf("    tls: {ca_file: %s}\n", caFile), "", up.URL))

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	body := `{"model":"sim-llama","stream":true,"max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, b := do(t, hc, "POST", "https://"+g.addr+"/v1/chat/completions", body)
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || resp.TLS == nil {
		t.Fatalf("status %d, proto %s: %s", resp.StatusCode, resp.Proto, b)
	}
	if _, done, chunks := streamText(t, parseSSE(b)); !done || chunks != 8 {
		t.Fatalf("TLS stream: %d chunks, done %v", chunks, done)
	}

	client := openai.NewClient(option.WithBaseURL("https://"+g.addr+"/v1/"), option.WithAPIKey("k"),
		option.WithMaxRetries(0), option.WithHTTPClient(hc))
	emb, err := client.Embeddings.New(testCtx(t), openai.EmbeddingNewParams{
		Model: "sim-llama", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("tls")},
	})
	if err != nil || len(emb.Data) != 1 {
		t.Fatalf("openai-go over TLS: %v", err)
	}
	if n := s.Stats().Completed; n != 2 {
		t.Errorf("HTTPS upstream completed %d requests, want 2", n)
	}

	// A client that does not trust the certificate is refused.
	untrusted := &http.Transport{}
	t.Cleanup(untrusted.CloseIdleConnections)
	if _, err := (&http.Client{Transport: untrusted, Timeout: 10 * time.Second}).Get("https://" + g.addr + "/v1/models"); err == nil {
		t.Error("an untrusting client connected")
	}

	// Replacing the certificate files is picked up by new connections, without a restart.
	newDir := t.TempDir()
	newCert, newKey, rotated := selfSigned(t, newDir)
	if err := os.Rename(newCert, certFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(newKey, keyFile); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the rotated certificate is served", func() bool {
		c, err := tls.Dial("tcp", g.addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return false
		}
		defer c.Close()
		return bytes.Equal(c.ConnectionState().PeerCertificates[0].Raw, rotated.Raw)
	})
}

// TestAdmin: the admin API needs the bearer token when SLUICE_ADMIN_TOKEN is set, and never
// shows a cluster's api_key.
func TestAdmin(t *testing.T) {
	const secret = "sk-upstream-very-secret-123"
	rec := startRecorder(t, nil)
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n    api_key: "+secret+"\n", "", rec.URL))
	hc := newHTTPClient(t)
	admin := "http://" + g.admin

	// The cluster's key replaces the client's towards the upstream.
	do(t, hc, "POST", "http://"+g.addr+"/v1/chat/completions", chatBody, "Authorization", "Bearer client-key")
	if got := rec.last(t).Get("Authorization"); got != "Bearer "+secret {
		t.Errorf("upstream Authorization = %q, want the cluster's key", got)
	}

	// Without a token on loopback the admin API is open, and redacts the key.
	resp, b := do(t, hc, "GET", admin+"/admin/config", "")
	if resp.StatusCode != 200 {
		t.Fatalf("/admin/config without a token set: %d", resp.StatusCode)
	}
	if bytes.Contains(b, []byte(secret)) || !bytes.Contains(b, []byte(`"api_key": "[redacted]"`)) {
		t.Errorf("/admin/config shows or loses the api_key:\n%s", b)
	}

	t.Setenv("SLUICE_ADMIN_TOKEN", "admin-token-1")
	tests := []struct {
		method, path, auth string
		status             int
	}{
		{"GET", "/admin/config", "", 401},
		{"GET", "/admin/config", "Bearer wrong", 401},
		{"GET", "/admin/config", "admin-token-1", 401}, // not a bearer token
		{"GET", "/admin/config", "Bearer admin-token-1", 200},
		{"GET", "/admin/endpoints", "", 401},
		{"GET", "/admin/endpoints", "Bearer admin-token-1", 200},
		{"POST", "/admin/reload", "", 401},
		{"POST", "/admin/reload", "Bearer admin-token-1", 400}, // started without a file
		{"GET", "/healthz", "", 200},
		{"GET", "/readyz", "", 200},
		{"GET", "/metrics", "", 200},
	}
	for _, tt := range tests {
		var hdr []string
		if tt.auth != "" {
			hdr = []string{"Authorization", tt.auth}
		}
		resp, b := do(t, hc, tt.method, admin+tt.path, "", hdr...)
		if resp.StatusCode != tt.status {
			t.Errorf("%s %s (auth %q) = %d, want %d: %s", tt.method, tt.path, tt.auth, resp.StatusCode, tt.status, b)
			continue
		}
		if tt.status == 401 {
			checkErrorShape(t, resp, b, 401, "invalid_admin_token")
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s: 401 without WWW-Authenticate", tt.method, tt.path)
			}
		}
		if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, []byte("admin-token-1")) {
			t.Errorf("%s %s leaks a credential:\n%s", tt.method, tt.path, b)
		}
	}
}
