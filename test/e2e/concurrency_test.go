package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/sim"
)

// TestConcurrencyLimit: a burst larger than the route's limit plus its queue. The model
// server never runs more than the limit at once; the requests the queue holds are served in
// turn; the rest are refused at once with 429 concurrency_limit and Retry-After.
func TestConcurrencyLimit(t *testing.T) {
	s := startSim(t, sim.Config{TTFT: 20 * time.Millisecond, ITL: 10 * time.Millisecond, MaxRunning: 64})
	g := startGateway(t, fmt.Sprintf(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: a, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: chat
    cluster: a
    policies:
      - {type: concurrency, params: {adaptive: false, min_limit: 1, max_limit: 2, max_queue: 2, max_wait: 5s}}
`, s.URL))
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	body := `{"model":"sim-llama","stream":true,"max_tokens":20,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`

	const burst = 10
	type answer struct {
		status     int
		code       string
		retryAfter string
		err        error
	}
	answers := make([]answer, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Post("http://"+g.addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				answers[i].err = err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers[i] = answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), err: err}
			if resp.StatusCode != http.StatusOK {
				var e apiError
				_ = json.Unmarshal(b, &e)
				if e.Error.Code != nil {
					answers[i].code = *e.Error.Code
				}
			} else if !strings.Contains(string(b), "[DONE]") {
				answers[i].err = fmt.Errorf("stream without [DONE]: %s", b)
			}
		}()
	}
	wg.Wait()
	ok, limited := 0, 0
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("request %d: %v", i, a.err)
		case a.status == http.StatusOK:
			ok++
		case a.status == http.StatusTooManyRequests && a.code == "concurrency_limit" && a.retryAfter != "":
			limited++
		default:
			t.Errorf("request %d: status %d code %q Retry-After %q", i, a.status, a.code, a.retryAfter)
		}
	}
	// The limit (2) and the queue (2) hold four; the others find the queue full at once.
	if ok < 4 || ok+limited != burst || limited == 0 {
		t.Errorf("%d served, %d refused with 429, want at least 4 served and the rest refused", ok, limited)
	}
	if peak := s.Stats().PeakRunning; peak > 2 {
		t.Errorf("the model server ran %d requests at once, above the limit of 2", peak)
	}
	resp, b := do(t, hc, http.MethodGet, "http://"+g.admin+"/admin/concurrency", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"route": "chat"`) {
		t.Errorf("/admin/concurrency: %d %s", resp.StatusCode, b)
	}
	if v := metricValue(t, hc, g.admin, "sluice_concurrency_rejections_total", `reason="queue_full"`, `route="chat"`); v < 1 {
		t.Errorf("queue_full rejections metric = %v", v)
	}
	if v := metricValue(t, hc, g.admin, "sluice_concurrency_wait_seconds_count", `route="chat"`); v != float64(ok) {
		t.Errorf("wait histogram counts %v admissions, want %d", v, ok)
	}
}
