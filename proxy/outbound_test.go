package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
)

// newTestServer builds a server (not started: no listener, no health checks) for one endpoint.
func newTestServer(t *testing.T, endpoint string) *Server {
	t.Helper()
	return newConfiguredServer(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - name: main
    endpoints: [{url: "`+endpoint+`"}]
    health_check: {disabled: true}
    api_key: sk-cluster
routes:
  - {name: all, cluster: main}
`)
}

// newConfiguredServer builds a server from a YAML config (not started), closed at the end.
func newConfiguredServer(t *testing.T, yml string) *Server {
	t.Helper()
	cfg, err := config.Parse([]byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Config: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st := srv.state.Load()
		st.stop()
		for _, cl := range st.clusters {
			cl.Close()
		}
		srv.shadow.close()
	})
	return srv
}

func TestOutbound(t *testing.T) {
	tests := []struct {
		endpoint, target, want string
	}{
		{"http://up:8000", "/v1/chat/completions", "http://up:8000/v1/chat/completions"},
		{"http://up:8000/", "/v1/chat/completions", "http://up:8000/v1/chat/completions"},
		{"http://up:8000/base/", "/v1/models?x=1", "http://up:8000/base/v1/models?x=1"},
		{"http://up:8000", "/v1/models/org%2Fname", "http://up:8000/v1/models/org%2Fname"},
		{"http://up:8000/a%2Fb", "/v1/models/org%2Fname?q=%2F", "http://up:8000/a%2Fb/v1/models/org%2Fname?q=%2F"},
		{"https://up", "/v1/models/a%20b", "https://up/v1/models/a%20b"},
		{"http://up:8000/", "/v1/models/caf%C3%A9?q=a%20b", "http://up:8000/v1/models/caf%C3%A9?q=a%20b"},
		{"http://up:8000/", "/v1/models/a%2fb", "http://up:8000/v1/models/a%2fb"},
		{"http://up:8000/base", "/v1/models/a%20b", "http://up:8000/base/v1/models/a%20b"},
		// A bare "?" (an empty query) is the client's to send, as net/http's reverse proxy does.
		{"http://up:8000", "/v1/models?", "http://up:8000/v1/models?"},
		{"http://up:8000/base/", "/v1/models/org%2Fname?", "http://up:8000/base/v1/models/org%2Fname?"},
	}
	for _, tt := range tests {
		t.Run(tt.endpoint+tt.target, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tt.target, nil)
			r.Header.Set("Connection", "X-Hop")
			r.Header.Set("X-Hop", "1")
			r.Header.Set("Authorization", "Bearer client")
			r.Header.Set("X-Forwarded-For", "10.0.0.1")
			out, ex := outboundOf(t, tt.endpoint, r)
			if got := out.URL.String(); got != tt.want {
				t.Errorf("upstream URL %s, want %s", got, tt.want)
			}
			if out.Host != out.URL.Host || out.Method != http.MethodGet {
				t.Errorf("Host %q method %q", out.Host, out.Method)
			}
			hdr := out.Header
			if hdr.Get("X-Hop") != "" || hdr.Get("Connection") != "" {
				t.Errorf("hop-by-hop headers forwarded: %v", hdr)
			}
			// The client's credential is still on: send replaces it with the cluster's
			// (TestSendUsesClusterCredential).
			if hdr.Get("Authorization") != "Bearer client" || hdr.Get("X-Request-Id") != ex.id {
				t.Errorf("Authorization %q, X-Request-Id %q", hdr.Get("Authorization"), hdr.Get("X-Request-Id"))
			}
			if got := hdr.Get("X-Forwarded-For"); got != "10.0.0.1, 192.0.2.1" {
				t.Errorf("X-Forwarded-For %q", got)
			}
			if out.Body != nil && out.Body != http.NoBody {
				if b, _ := io.ReadAll(out.Body); len(b) > 0 {
					t.Errorf("a GET got a body: %q", b)
				}
			}
		})
	}
}

// TestSendUsesClusterCredential: the one sender puts the cluster's credential on every request
// it sends (an attempt's or a mirrored copy's) in place of every credential-like header of the
// client's, leaves the request's own to a cluster without one, and reports an event stream as
// one.
func TestSendUsesClusterCredential(t *testing.T) {
	got := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	srv := newTestServer(t, up.URL)
	cl := srv.state.Load().clusters["main"]
	for _, tc := range []struct {
		key       string
		wantAuth  string
		wantOther bool
	}{
		{"sk-cluster", "Bearer sk-cluster", false},
		{"", "Bearer client", true},
	} {
		c := *cl
		c.apiKey = tc.key
		out, _ := http.NewRequest(http.MethodPost, up.URL+"/v1/chat/completions", strings.NewReader("{}"))
		out.Header.Set("Authorization", "Bearer client")
		out.Header.Set("X-Api-Key", "client-key")
		out.Header.Set("Cookie", "session=1")
		out.Header.Set("X-Trace", "t")
		resp, sse, err := send(context.Background(), nil, &c, out)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := <-got
		other := h.Get("X-Api-Key") != "" || h.Get("Cookie") != ""
		if h.Get("Authorization") != tc.wantAuth || other != tc.wantOther || h.Get("X-Trace") != "t" || !sse {
			t.Errorf("cluster key %q: upstream headers %v, sse %v; want Authorization %q, the client's other credentials %v",
				tc.key, h, sse, tc.wantAuth, tc.wantOther)
		}
	}
}

// TestOutboundAllocs: a plain client's request (five headers, a body: vegeta's) gets an
// upstream request whose header map is one small map, where a hint of nine made a table.
func TestOutboundAllocs(t *testing.T) {
	srv := newTestServer(t, "http://up:8000")
	h := &Handler{srv: srv}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	for k, v := range map[string]string{"User-Agent": "Go-http-client/1.1", "Content-Type": "application/json",
		"Content-Length": strconv.Itoa(len(body)), "X-Vegeta-Seq": "0", "Accept-Encoding": "gzip"} {
		r.Header.Set(k, v)
	}
	ex := newExchange(httptest.NewRecorder(), r, 0)
	ex.preq = &policy.Request{Request: &openai.Request{Kind: openai.KindChat, Model: "m", Body: body}}
	cl := srv.state.Load().clusters["main"]
	ep := cl.Endpoints()[0]
	at := new(attemptScope)
	a := testing.AllocsPerRun(50, func() {
		var res result
		out, err := h.outbound(context.Background(), ex, policy.Candidate{Cluster: "main"}, cl, ep, at, &res)
		if err != nil || len(out.Header) != 6 {
			t.Fatalf("outbound: %v, headers %v", err, out.Header)
		}
	})
	// The request's copy (WithContext), the header map and its group, the body's GetBody
	// (a method value); the map made for nine was four allocations, six in all.
	if a > 4 {
		t.Errorf("%v allocations an outbound request, want at most 4", a)
	}
}

// TestOutboundForwardedForLines: a request that came through a chain of proxies, each of
// which added its own X-Forwarded-For line, goes upstream with every hop, in order, and its
// client's address last (as net/http's ReverseProxy joins them).
func TestOutboundForwardedForLines(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	r.Header.Add("X-Forwarded-For", "203.0.113.7")
	r.Header.Add("X-Forwarded-For", "10.0.0.1, 10.0.0.2")
	out, _ := outboundOf(t, "http://up:8000", r)
	if got, want := out.Header.Values("X-Forwarded-For"), []string{"203.0.113.7, 10.0.0.1, 10.0.0.2, 192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("X-Forwarded-For %q, want %q", got, want)
	}
}

// outboundOf is the upstream request a gateway with one endpoint builds for the models
// request r, and r's exchange.
func outboundOf(t *testing.T, endpoint string, r *http.Request) (*http.Request, *exchange) {
	t.Helper()
	srv := newTestServer(t, endpoint)
	h := &Handler{srv: srv}
	ex := newExchange(httptest.NewRecorder(), r, 0)
	ex.preq = &policy.Request{Request: &openai.Request{Kind: openai.KindModels}}
	cl := srv.state.Load().clusters["main"]
	var res result
	out, err := h.outbound(context.Background(), ex, policy.Candidate{Cluster: "main"}, cl, cl.Endpoints()[0], new(attemptScope), &res)
	if err != nil {
		t.Fatal(err)
	}
	return out, ex
}
