package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicegw/sluice/proxy/config"
)

// TestGenerationCarriesFaults: checking a config that changes the chaos faults changes
// nothing; applying it swaps the routes and the faults as one generation (a request on the
// new route meets the new fault; the old fault is gone).
func TestGenerationCarriesFaults(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer up.Close()
	gen := func(route string, status int) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
chaos:
  enabled: true
  faults:
    - {kind: abort, status: %d, route: %s}
clusters:
  - {name: c, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - {name: %s, cluster: c}
`, status, route, up.URL, route)
	}
	srv := startTestServer(t, gen("one", 503))
	url := "http://" + srv.Addr() + "/v1/chat/completions"
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	if st, b := post(t, http.DefaultClient, url, body); st != 503 {
		t.Fatalf("generation one: %d %s", st, b)
	}
	next, err := config.Parse([]byte(gen("two", 429)))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Check(next); err != nil {
		t.Fatal(err)
	}
	if l := srv.chaos.List(); len(l) != 1 || l[0].Spec.Status != 503 {
		t.Fatalf("Check changed the faults: %+v", l)
	}
	if err := srv.Apply(next); err != nil {
		t.Fatal(err)
	}
	if l := srv.chaos.List(); len(l) != 1 || l[0].Spec.Status != 429 || l[0].Spec.Route != "two" {
		t.Fatalf("Apply did not install the generation's faults: %+v", l)
	}
	if st, b := post(t, http.DefaultClient, url, body); st != 429 {
		t.Fatalf("generation two: %d %s", st, b)
	}
}
