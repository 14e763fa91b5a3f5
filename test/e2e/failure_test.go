package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/test/sim"
)

func chatParams(maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "sim-llama",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Write a long story.")},
		MaxTokens: openai.Int(maxTokens),
	}
}

// TestClientCancelCancelsUpstream: a client that goes away mid-stream makes the gateway
// cancel the upstream request at once; the gateway counts it as 499.
func TestClientCancelCancelsUpstream(t *testing.T) {
	// 500 tokens at 10ms each: the stream would run for 5s if nothing cancelled it.
	s := startSim(t, sim.Config{ITL: 10 * time.Millisecond})
	g := startGateway(t, oneRoute("", "", s.URL))
	client := newClient(t, g.addr, option.WithJSONSet("ignore_eos", true))

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams(500))
	for i := 0; i < 5; i++ {
		if !stream.Next() {
			t.Fatalf("stream ended after %d chunks: %v", i, stream.Err())
		}
	}
	before := s.Stats()
	if before.Cancelled != 0 || before.Running != 1 {
		t.Fatalf("before cancel: %+v", before)
	}
	cancel()
	_ = stream.Close()

	eventually(t, 5*time.Second, "simulator saw the cancellation", func() bool { return s.Stats().Cancelled == 1 })
	if st := s.Stats(); st.Completed != 0 || st.Running != 0 {
		t.Errorf("after cancel: %+v", st)
	}
	hc := newHTTPClient(t)
	eventually(t, 5*time.Second, "gateway counted a 499", func() bool {
		return metricValue(t, hc, g.admin, "sluice_requests_total", `http_response_status_code="499"`) == 1
	})
	// A cancellation is not an upstream failure.
	if v := metricValue(t, hc, g.admin, "sluice_upstream_errors_total"); v != 0 {
		t.Errorf("sluice_upstream_errors_total = %v after a client cancel, want 0", v)
	}
}

// TestUpstreamDiesMidStream: an upstream killed after tokens reached the client ends the
// stream with an in-band SSE error event, seen by openai-go and in the raw bytes.
func TestUpstreamDiesMidStream(t *testing.T) {
	s := startSim(t, sim.Config{})
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n", "", s.URL))

	t.Run("openai-go", func(t *testing.T) {
		client := newClient(t, g.addr, option.WithHeader("x-sim-die-after", "5"))
		stream := client.Chat.Completions.NewStreaming(testCtx(t), chatParams(40))
		n := 0
		for stream.Next() {
			n++
		}
		err := stream.Err()
		if err == nil {
			t.Fatalf("stream of %d chunks ended without an error", n)
		}
		if !strings.Contains(err.Error(), "stream_cut") || !strings.Contains(err.Error(), "error") {
			t.Errorf("stream error does not say what happened: %v", err)
		}
		_ = stream.Close()
		if n != 5 {
			t.Errorf("got %d chunks before the error, want 5", n)
		}
	})

	t.Run("raw bytes", func(t *testing.T) {
		hc := newHTTPClient(t)
		body := `{"model":"sim-llama","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hi"}]}`
		resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body, "x-sim-die-after", "5")
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		evs := parseSSE(b)
		if len(evs) != 6 {
			t.Fatalf("%d events, want 5 chunks and an error: %s", len(evs), b)
		}
		if !strings.HasSuffix(string(b), "\n\n") {
			t.Errorf("body does not end with a blank line: %q", b)
		}
		last := evs[len(evs)-1]
		if last.name != "error" || !strings.HasPrefix(last.data, `{"error":{`) {
			t.Fatalf("last event = %+v, want event: error with an OpenAI error body", last)
		}
		tail := string(b[strings.LastIndex(string(b), "event: error"):])
		if !strings.HasPrefix(tail, "event: error\ndata: {\"error\":{") {
			t.Errorf("body does not end with the error event: %q", tail)
		}
		e := checkErrorJSON(t, []byte(last.data), "stream_cut")
		if e.Error.Type != "server_error" {
			t.Errorf("error type %q", e.Error.Type)
		}
		for _, ev := range evs {
			if ev.data == "[DONE]" {
				t.Error("a cut stream must not end with [DONE]")
			}
		}
	})

	t.Run("killed before the first event", func(t *testing.T) {
		// Nothing reached the client: a plain 502 in OpenAI's error shape, not a stream.
		hc := newHTTPClient(t)
		body := `{"model":"sim-llama","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hi"}]}`
		resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body, "x-sim-die-after", "0")
		checkErrorShape(t, resp, b, http.StatusBadGateway, "")
		resp, b = do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", chatBody, "x-sim-die-after", "0")
		checkErrorShape(t, resp, b, http.StatusBadGateway, "")
	})
}

// TestTimeouts: the route's TTFT time-out answers 504 before the first byte (streaming or
// not); the idle time-out ends a stream that stalls mid-way with an SSE error event.
func TestTimeouts(t *testing.T) {
	s := startSim(t, sim.Config{})
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n", "    timeouts: {ttft: 200ms, idle: 200ms}\n", s.URL))
	hc := newHTTPClient(t)

	t.Run("TTFT", func(t *testing.T) {
		for _, stream := range []bool{false, true} {
			name := map[bool]string{false: "non-streaming", true: "streaming"}[stream]
			t.Run(name, func(t *testing.T) {
				body := `{"model":"sim-llama","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
				resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body, "x-sim-stall-first", "3s")
				checkErrorShape(t, resp, b, http.StatusGatewayTimeout, "ttft_timeout")

				client := newClient(t, g.addr, option.WithHeader("x-sim-stall-first", "3s"))
				var err error
				if stream {
					st := client.Chat.Completions.NewStreaming(testCtx(t), chatParams(8))
					for st.Next() {
						t.Fatal("got a chunk after a TTFT time-out")
					}
					err = st.Err()
					_ = st.Close()
				} else {
					_, err = client.Chat.Completions.New(testCtx(t), chatParams(8))
				}
				var apiErr *openai.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout || apiErr.Code != "ttft_timeout" {
					t.Fatalf("openai-go error = %v, want a 504 ttft_timeout", err)
				}
			})
		}
	})

	t.Run("idle mid-stream", func(t *testing.T) {
		client := newClient(t, g.addr, option.WithHeader("x-sim-stall-after", "3"), option.WithHeader("x-sim-stall-for", "3s"))
		st := client.Chat.Completions.NewStreaming(testCtx(t), chatParams(20))
		n := 0
		for st.Next() {
			n++
		}
		err := st.Err()
		_ = st.Close()
		if n != 3 || err == nil || !strings.Contains(err.Error(), "idle_timeout") {
			t.Fatalf("after %d chunks: err = %v, want an idle_timeout stream error after 3", n, err)
		}

		body := `{"model":"sim-llama","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`
		resp, b := do(t, hc, http.MethodPost, "http://"+g.addr+"/v1/chat/completions", body,
			"x-sim-stall-after", "3", "x-sim-stall-for", "3s")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		evs := parseSSE(b)
		last := evs[len(evs)-1]
		if last.name != "error" {
			t.Fatalf("last event %+v, want an error event", last)
		}
		var e apiError
		if err := json.Unmarshal([]byte(last.data), &e); err != nil || deref(e.Error.Code) != "idle_timeout" {
			t.Fatalf("error event %q: %v", last.data, err)
		}
	})

	// The stalled upstream requests were cancelled, not left running for 3s.
	eventually(t, 5*time.Second, "stalled upstream requests cancelled", func() bool {
		st := s.Stats()
		return st.Running == 0 && st.Cancelled >= 6
	})
}
