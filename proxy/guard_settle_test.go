package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy/guard"
)

// TestGuardSettlesEveryRequest: the guard learns of a request's end through its
// Decision.Done alone (it is no Observer), so the gateway must call it for every request the
// guard admitted, whatever its fate: answered, failed upstream, cut by the total time-out,
// or abandoned by its client. Afterwards the guard holds none in flight.
func TestGuardSettlesEveryRequest(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), "fail"):
			http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
		case strings.Contains(string(b), "slow"):
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	}))
	t.Cleanup(up.Close)
	srv := startTestServer(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: c, endpoints: [{url: "`+up.URL+`"}], health_check: {disabled: true}}
routes:
  - name: r
    cluster: c
    retry: {attempts: 1}
    timeouts: {total: 300ms}
    policies:
      - {type: guard}
`)
	url := "http://" + srv.Addr() + "/v1/chat/completions"
	body := func(text string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
	}
	for _, tc := range []struct {
		text string
		code int
	}{{"hello", 200}, {"fail", 500}, {"slow", 504}} {
		if code, b := post(t, http.DefaultClient, url, body(tc.text)); code != tc.code {
			t.Fatalf("%s: %d %s, want %d", tc.text, code, b, tc.code)
		}
	}
	// A client that gives up while its request runs.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body("slow")))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("the abandoned request was answered: %d %s", resp.StatusCode, b)
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the abandoned request: %v", err)
	}

	var g *guard.Guard
	for _, a := range srv.state.Load().admitters["r"] {
		if gg, ok := a.(*guard.Guard); ok {
			g = gg
		}
	}
	if g == nil {
		t.Fatal("the route has no guard")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := g.Stats()
		if st.Admitted == 4 && st.InFlight == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guard: %d admitted, %d still in flight; want 4 and 0", st.Admitted, st.InFlight)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
