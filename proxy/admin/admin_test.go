package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/shadow"
)

// fakeGateway is a gateway with one route "chat" and one guard-like policy.
type fakeGateway struct {
	cfg      *config.Config
	notReady string
	weights  map[string]int
	resets   []string
	shadow   error // ShadowReport's error
}

func (g *fakeGateway) Config() *config.Config                          { return g.cfg }
func (g *fakeGateway) NotReady() string                                { return g.notReady }
func (g *fakeGateway) Reload() error                                   { return errors.New("no config file") }
func (g *fakeGateway) Endpoints() map[string][]upstream.EndpointStatus { return nil }
func (g *fakeGateway) Routes() []RouteState                            { return nil }
func (g *fakeGateway) Router(name string) Router {
	if name != "chat" {
		return nil
	}
	return (*fakeRouter)(g)
}
func (g *fakeGateway) Policies() []Policy {
	return []Policy{{Route: "chat", Type: "guard", Name: "guard", Contracts: []string{"admin_view", "tenant_reset"}, Plugin: (*fakeGuard)(g)}}
}
func (g *fakeGateway) ShadowReport(context.Context, bool) (shadow.Report, error) {
	return shadow.Report{}, g.shadow
}
func (g *fakeGateway) ShadowStore() *shadow.Store  { return nil }
func (g *fakeGateway) Signals(context.Context) any { return map[string]int{"endpoints": 0} }

type fakeRouter fakeGateway

func (r *fakeRouter) SetWeights(w map[string]int) error {
	for k, v := range w {
		if v < 0 {
			return errors.New("weight of " + k + " below 0")
		}
		r.weights[k] = v
	}
	return nil
}
func (r *fakeRouter) Weights() map[string]int { return r.weights }

type fakeGuard fakeGateway

func (g *fakeGuard) TypedName() policy.TypedName {
	return policy.TypedName{Type: "guard", Name: "guard"}
}
func (g *fakeGuard) AdminView() any { return map[string]string{"route": "chat"} }
func (g *fakeGuard) ResetTenant(t string) int {
	g.resets = append(g.resets, t)
	return 2
}

var _ policy.Viewer = (*fakeGuard)(nil)
var _ policy.Resetter = (*fakeGuard)(nil)

// TestHandler: the admin API answers from the gateway it is given, in OpenAI's error shape
// when it refuses; the admin token is required once set, and off loopback.
func TestHandler(t *testing.T) {
	g := &fakeGateway{cfg: &config.Config{}, weights: map[string]int{"a": 100}}
	g.cfg.Admin.Listen = "127.0.0.1:9901"
	g.cfg.Admin.TokenEnv = "SLUICE_ADMIN_TEST_TOKEN"
	srv := httptest.NewServer(Handler(Options{Gateway: g}))
	t.Cleanup(srv.Close)
	do := func(method, path, body, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"GET", "/healthz", "", 200, "ok"},
		{"GET", "/readyz", "", 200, "ready"},
		{"PUT", "/admin/routes/chat/weights", `{"a": 30}`, 200, `"a": 30`},
		{"PUT", "/admin/routes/chat/weights", `{"a": -1}`, 400, `"code":"invalid_weights"`},
		{"PUT", "/admin/routes/chat/weights", `{"a": "x"}`, 400, `"code":"invalid_json"`},
		{"PUT", "/admin/routes/nope/weights", `{"a": 1}`, 404, `"code":"unknown_route"`},
		{"GET", "/admin/routes", "", 200, `"routes": []`},
		{"GET", "/admin/breakers", "", 200, `"route": "chat"`},
		{"GET", "/admin/policies?type=guard", "", 200, `"tenant_reset"`},
		{"GET", "/admin/policies?type=ratelimit", "", 200, `"policies": []`},
		{"POST", "/admin/breakers/reset?tenant=t1", "", 200, `"reset": 2`},
		{"POST", "/admin/breakers/reset?route=nope", "", 404, `"code":"unknown_route"`},
		{"POST", "/admin/reload", "", 400, `"code":"invalid_config"`},
		{"GET", "/admin/gpu", "", 200, `"endpoints": 0`},
		{"GET", "/admin/shadow/export", "", 404, `"code":"no_shadow_store"`},
		{"GET", "/admin/shadow.json", "", 200, "{"},
		{"POST", "/admin/shadow/judge", "", 200, "{"},
		{"GET", "/admin/shadow", "", 200, "<"},
		{"GET", "/admin/xds", "", 404, ""},    // not under xDS
		{"GET", "/admin/faults", "", 404, ""}, // no chaos engine given
	} {
		status, body := do(tc.method, tc.path, tc.body, "")
		if status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, status, body, tc.status, tc.want)
		}
		if status >= 400 && tc.want != "" {
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			if json.Unmarshal([]byte(body), &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("%s %s: not OpenAI's error shape: %s", tc.method, tc.path, body)
			}
		}
	}
	if len(g.resets) != 1 || g.resets[0] != "t1" {
		t.Errorf("resets %v, want [t1]", g.resets)
	}

	g.shadow = errors.New("shadow store closed")
	for _, ep := range []struct{ method, path string }{{"GET", "/admin/shadow"}, {"GET", "/admin/shadow.json"}, {"POST", "/admin/shadow/judge"}} {
		if status, body := do(ep.method, ep.path, "", ""); status != 500 || !strings.Contains(body, `"code":"shadow_report"`) || !strings.Contains(body, "shadow store closed") {
			t.Errorf("%s %s without a report: %d %s, want 500 shadow_report with the cause", ep.method, ep.path, status, body)
		}
	}

	g.notReady = "draining"
	if status, body := do("GET", "/readyz", "", ""); status != 503 || !strings.Contains(body, "draining") {
		t.Errorf("readyz while draining: %d %s", status, body)
	}

	// A token once set is required, and compared whole.
	t.Setenv("SLUICE_ADMIN_TEST_TOKEN", "s3cret")
	for _, tc := range []struct {
		token  string
		status int
	}{{"", 401}, {"s3cre", 401}, {"s3cret!", 401}, {"s3cret", 200}} {
		if status, body := do("GET", "/admin/breakers", "", tc.token); status != tc.status {
			t.Errorf("token %q: %d %s, want %d", tc.token, status, body, tc.status)
		}
	}
	if status, _ := do("GET", "/healthz", "", ""); status != 200 {
		t.Errorf("healthz needs no token: %d", status)
	}

	// Off loopback, no token set: refused rather than open.
	t.Setenv("SLUICE_ADMIN_TEST_TOKEN", "")
	g.cfg.Admin.Listen = "0.0.0.0:9901"
	if status, _ := do("GET", "/admin/config", "", ""); status != 401 {
		t.Errorf("off loopback without a token: %d, want 401", status)
	}
}

func TestPlacedView(t *testing.T) {
	for _, tc := range []struct {
		view any
		want string // "" an error
	}{
		{struct {
			A int `json:"a"`
		}{1}, `{"route":"r","name":"n","a":1}`},
		{struct{}{}, `{"route":"r","name":"n"}`},
		{map[string]int{}, `{"route":"r","name":"n"}`},
		{[]int{1}, ""},
		{nil, ""},
		{func() {}, ""},
	} {
		b, err := json.Marshal(placedView{"r", "n", tc.view})
		if got := string(b); got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("placedView(%#v) = %s, %v; want %s", tc.view, got, err, tc.want)
		}
	}
}
