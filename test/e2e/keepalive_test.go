package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestKeepAliveCommentsBeforeFirstEvent: SSE comments sent by a model server while a request
// waits in its queue (": ping") are not the first event. They must not end the TTFT phase
// nor commit the answer (which would rule out a retry and hide a TTFT time-out behind a 200).
func TestKeepAliveCommentsBeforeFirstEvent(t *testing.T) {
	// pings: comment blocks before the first event; then data events unless mode says otherwise.
	up := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		mode := r.Header.Get("X-Mode")
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		pings := 3
		if mode == "forever" {
			pings = 500 // 10s at 20ms: far past the TTFT time-out
		}
		for i := range pings {
			if _, err := fmt.Fprintf(w, ": ping %d\n\n", i); err != nil {
				return
			}
			fl.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		if mode == "die" {
			panic(http.ErrAbortHandler)
		}
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"rec\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"finish_reason\":null}]}\n\n", i)
			fl.Flush()
		}
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"rec\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	})
	g := startGateway(t, oneRoute("    health_check: {disabled: true}\n", "    timeouts: {ttft: 1s, idle: 5s}\n", up.URL))
	hc := newHTTPClient(t)
	url := "http://" + g.addr + "/v1/chat/completions"
	body := `{"model":"rec","stream":true,"messages":[{"role":"user","content":"hi"}]}`

	t.Run("comments then tokens are relayed", func(t *testing.T) {
		resp, b := do(t, hc, "POST", url, body, "X-Mode", "ok")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if !strings.HasPrefix(string(b), ": ping 0\n\n: ping 1\n\n: ping 2\n\ndata: ") {
			t.Errorf("comments not relayed ahead of the first event: %q", b)
		}
		text, done, _ := streamText(t, parseSSE(b))
		if text != "t0 t1 t2 " || !done {
			t.Errorf("text %q done %v", text, done)
		}
	})
	t.Run("comments do not stop the TTFT time-out", func(t *testing.T) {
		resp, b := do(t, hc, "POST", url, body, "X-Mode", "forever")
		checkErrorShape(t, resp, b, http.StatusGatewayTimeout, "ttft_timeout")
	})
	t.Run("a failure after comments is still before the first byte", func(t *testing.T) {
		resp, b := do(t, hc, "POST", url, body, "X-Mode", "die")
		checkErrorShape(t, resp, b, http.StatusBadGateway, "")
	})
}
