package e2e

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/test/sim"
)

// TestConnectFailureRetriesOtherEndpoint: a refused connection is retried once on another
// endpoint of the cluster, so the client never sees it, and the dead endpoint is ejected.
func TestConnectFailureRetriesOtherEndpoint(t *testing.T) {
	good := startSim(t, sim.Config{})
	dead := "http://" + freePort(t) // nothing listens there
	g := startGateway(t, oneRoute(`    health_check: {disabled: true}
    outlier: {consecutive_failures: 2, base_ejection: 1m, max_ejection: 2m}
`, "", dead, good.URL))
	hc := newHTTPClient(t)
	for i := range 8 {
		resp, b := do(t, hc, "POST", "http://"+g.addr+"/v1/chat/completions", chatBody)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if n := good.Stats().Completed; n != 8 {
		t.Errorf("the live endpoint completed %d requests, want 8", n)
	}
	if v := metricValue(t, hc, g.admin, "sluice_upstream_errors_total", `error_type="connect"`); v != 2 {
		t.Errorf(`sluice_upstream_errors_total{error_type="connect"} = %v, want 2 (then ejected)`, v)
	}
}

// TestNoHealthyEndpoint: when active health checks find every endpoint down, requests get 503
// no_endpoint with Retry-After; when one comes back, traffic resumes.
func TestNoHealthyEndpoint(t *testing.T) {
	s := sim.New(sim.Config{})
	t.Cleanup(s.Close)
	var healthy atomicBool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.get() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	g := startGateway(t, oneRoute(`    health_check: {interval: 20ms, timeout: 1s, unhealthy_threshold: 1, healthy_threshold: 1}
`, "", up.URL))
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"
	var (
		resp *http.Response
		b    []byte
	)
	eventually(t, 10*time.Second, "503 once the only endpoint is unhealthy", func() bool {
		resp, b = do(t, hc, "POST", url, chatBody)
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	checkErrorShape(t, resp, b, http.StatusServiceUnavailable, "no_endpoint")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("503 no_endpoint without Retry-After")
	}
	healthy.set(true)
	eventually(t, 10*time.Second, "200 once the endpoint is healthy again", func() bool {
		resp, _ = do(t, hc, "POST", url, chatBody)
		return resp.StatusCode == http.StatusOK
	})
}

// TestClientCancelNonStreaming: a client that gives up on a non-streaming request cancels the
// upstream request too.
func TestClientCancelNonStreaming(t *testing.T) {
	s := startSim(t, sim.Config{})
	g := startGateway(t, oneRoute("", "", s.URL))
	client := newClient(t, g.addr, option.WithHeader("x-sim-stall-first", "30s"))
	ctx, cancel := context.WithCancel(testCtx(t))
	errc := make(chan error, 1)
	go func() {
		_, err := client.Chat.Completions.New(ctx, chatParams(8))
		errc <- err
	}()
	eventually(t, 5*time.Second, "the request reached the simulator", func() bool { return s.Stats().Requests == 1 })
	cancel()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a cancelled request succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not return after cancel")
	}
	eventually(t, 5*time.Second, "the simulator saw the cancellation", func() bool { return s.Stats().Cancelled == 1 })
}

// TestTotalTimeoutMidStream: the route's total time-out ends a stream that has started with an
// in-band error event.
func TestTotalTimeoutMidStream(t *testing.T) {
	s := startSim(t, sim.Config{ITL: 10 * time.Millisecond})
	g := startGateway(t, oneRoute("", "    timeouts: {total: 300ms}\n", s.URL))
	client := newClient(t, g.addr, option.WithJSONSet("ignore_eos", true))
	st := client.Chat.Completions.NewStreaming(testCtx(t), chatParams(1000))
	n := 0
	for st.Next() {
		n++
	}
	err := st.Err()
	_ = st.Close()
	if err == nil || !strings.Contains(err.Error(), `"timeout"`) {
		t.Fatalf("after %d chunks: %v, want a timeout stream error", n, err)
	}
	if n == 0 || n >= 1000 {
		t.Errorf("%d chunks before the time-out", n)
	}
	eventually(t, 5*time.Second, "upstream cancelled", func() bool { return s.Stats().Cancelled == 1 })
}

// TestOversizedEvent: an upstream event larger than max_event_bytes ends the answer with an
// upstream_error; the endpoint, which did nothing wrong, is not counted as failing.
func TestOversizedEvent(t *testing.T) {
	// 600 tokens per event: a chunk of several KiB, over the 1KiB bound.
	s := startSim(t, sim.Config{TokensPerEvent: 600})
	g := startGateway(t, "max_event_bytes: 1KiB\n"+oneRoute(`    health_check: {disabled: true}
    outlier: {consecutive_failures: 1, base_ejection: 1m, max_ejection: 2m, max_ejection_percent: 100}
`, "", s.URL))
	hc := newHTTPClient(t)
	url := "http://" + g.addr

	// Chat: the small role chunk goes out first, then the big chunk ends the stream in-band.
	body := `{"model":"sim-llama","stream":true,"max_tokens":600,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, b := do(t, hc, "POST", url+"/v1/chat/completions", body)
	evs := parseSSE(b)
	if resp.StatusCode != 200 || len(evs) == 0 || evs[len(evs)-1].name != "error" {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	checkErrorJSON(t, []byte(evs[len(evs)-1].data), "upstream_error")

	// Completions: the first event is already too big, so nothing was sent: a 502.
	body = `{"model":"sim-llama","stream":true,"max_tokens":600,"ignore_eos":true,"prompt":"hi"}`
	resp, b = do(t, hc, "POST", url+"/v1/completions", body)
	e := checkErrorShape(t, resp, b, http.StatusBadGateway, "upstream_error")
	if strings.Contains(e.Error.Message, "connect") {
		t.Errorf("an oversized event reported as a connection failure: %q", e.Error.Message)
	}

	// The endpoint answered correctly: it must not have been ejected for the gateway's limit.
	resp, b = do(t, hc, "GET", "http://"+g.admin+"/admin/endpoints", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/admin/endpoints: %d", resp.StatusCode)
	}
	if strings.Contains(string(b), `"ejected": true`) || !strings.Contains(string(b), `"failures": 0`) {
		t.Errorf("endpoint counted as failing for an oversized event: %s", b)
	}
	if v := metricValue(t, hc, g.admin, "sluice_upstream_errors_total", `error_type="connect"`); v != 0 {
		t.Errorf("oversized event counted as %v connect errors", v)
	}
}

// TestModelsThroughClient makes sure the client's list still works behind a route with a
// model rewrite (GET requests carry no model and pass through).
func TestModelsThroughClient(t *testing.T) {
	s := startSim(t, sim.Config{Model: "served"})
	g := startGateway(t, oneRoute("", "    model: served\n", s.URL))
	client := newClient(t, g.addr)
	page, err := client.Models.List(testCtx(t))
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "served" {
		t.Fatalf("models: %v %+v", err, page)
	}
	resp, err := client.Chat.Completions.New(testCtx(t), openai.ChatCompletionNewParams{
		Model: "anything", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(4),
	})
	if err != nil || resp.Model != "served" {
		t.Fatalf("rewritten model: %v", err)
	}
}

// TestTimeoutsBeforeTheFirstByte: a model server slower than a time-out, with the official
// client: the per-try time-out ends each attempt (the retry runs, then the answer is its
// 504), the total time-out ends the request, the TTFT time-out the attempt; each answer
// names its own class, and the simulator sees every attempt cancelled (nothing left running
// upstream).
func TestTimeoutsBeforeTheFirstByte(t *testing.T) {
	for _, tc := range []struct {
		name, route string
		code        string
		attempts    int64
	}{
		{"per try", "    retry: {attempts: 2, per_try_timeout: 150ms, backoff_base: 10ms, budget: 1, min_retries_per_second: 100}\n", "per_try_timeout", 2},
		{"total", "    timeouts: {total: 200ms}\n", "timeout", 1},
		{"ttft", "    timeouts: {ttft: 150ms}\n    retry: {attempts: 1}\n", "ttft_timeout", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, sim.Config{TTFT: 3 * time.Second})
			g := startGateway(t, oneRoute("", tc.route, s.URL))
			client := newClient(t, g.addr)
			start := time.Now()
			_, err := client.Chat.Completions.New(testCtx(t), chatParams(8))
			took := time.Since(start)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout || apiErr.Code != tc.code {
				t.Fatalf("%v, want a 504 with code %s", err, tc.code)
			}
			if took > 2*time.Second {
				t.Errorf("answered after %v: the time-out did not end the wait", took)
			}
			eventually(t, 5*time.Second, "every attempt cancelled upstream", func() bool {
				st := s.Stats()
				return st.Requests == tc.attempts && st.Cancelled == tc.attempts
			})
		})
	}
}
