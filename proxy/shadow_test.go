package proxy

import (
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

func TestProgression(t *testing.T) {
	srv := newConfiguredServer(t, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: main, endpoints: [{url: "http://127.0.0.1:1"}], health_check: {disabled: true}}
  - {name: cand, endpoints: [{url: "http://127.0.0.1:2"}], health_check: {disabled: true}}
routes:
  - name: chat
    splits: [{cluster: main, weight: 100}, {cluster: cand, weight: 0}]
    mirror: {cluster: cand, fraction: 1, progression: {step: 10, interval: 1m, max: 25}}
`)
	cfg := srv.Config()
	mr := &mirrorRoute{Mirror: shadow.NewMirror("chat", mirrorSettings(cfg, cfg.Routes[0].Mirror), 10, nil, nil)}
	mr.cfg.Store(cfg.Routes[0].Mirror)
	st := srv.state.Load()
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	steps := []struct {
		decision shadow.Decision
		at       time.Duration
		want     int
		action   string
	}{
		{shadow.Promote, 0, 10, "weight cand 0→10"},
		{shadow.Promote, 30 * time.Second, 10, ""}, // within the interval
		{shadow.Hold, 2 * time.Minute, 10, ""},
		{shadow.Promote, 3 * time.Minute, 20, "weight cand 10→20"},
		{shadow.Promote, 5 * time.Minute, 25, "weight cand 20→25"}, // capped at max
		{shadow.Promote, 7 * time.Minute, 25, ""},
		{shadow.Rollback, 7*time.Minute + time.Second, 0, "weight cand 25→0"},
	}
	for i, s := range steps {
		got := mr.progress(srv.shadow, st, shadow.Verdict{Decision: s.decision}, t0.Add(s.at))
		if got != s.action {
			t.Errorf("step %d (%s): action %q, want %q", i, s.decision, got, s.action)
		}
		if w := st.router("chat").Weights()["cand"]; w != s.want {
			t.Errorf("step %d (%s): weight %d, want %d", i, s.decision, w, s.want)
		}
	}

	// Under xDS the control plane owns the weights: only a recommendation.
	xc := *cfg
	xc.Source = "xds"
	xst := &state{snap: config.NewSnapshot(&xc), routers: st.routers}
	got := mr.progress(srv.shadow, xst, shadow.Verdict{Decision: shadow.Promote}, t0.Add(time.Hour))
	if !strings.HasPrefix(got, "recommend cand weight 0→10") || st.router("chat").Weights()["cand"] != 0 {
		t.Errorf("xds: %q, weight %d", got, st.router("chat").Weights()["cand"])
	}
}

func TestMirrorHeaderAndQuery(t *testing.T) {
	src := http.Header{}
	for k, v := range map[string]string{
		"Authorization": "Bearer x", "Cookie": "c=1", "X-Api-Key": "k", "Api-Key": "k", "X-Goog-Api-Key": "g",
		"X-Auth-Token": "t", "Ocp-Apim-Subscription-Key": "o", "X-Sluice-Admin-Token": "a", "X-Sluice-Fault": "abort",
		"X-Internal": "1", "Content-Type": "application/json", "X-Session-Id": "s1", "Traceparent": "00-1-2-01",
		"Connection": "keep-alive", "Content-Length": "10", "X-Original-Url": "/admin", "X-Forwarded-Host": "evil",
	} {
		src.Set(k, v)
	}
	h := mirrorHeader(src, &config.Mirror{StripHeaders: []string{"x-internal"}, SetHeaders: map[string]string{"X-Env": "shadow"}})
	want := http.Header{"Content-Type": {"application/json"}, "X-Session-Id": {"s1"}, "Traceparent": {"00-1-2-01"}, "X-Env": {"shadow"}}
	if !headersEqual(h, want) {
		t.Errorf("mirror headers %v, want %v", h, want)
	}
	for raw, want := range map[string]string{
		"":                               "",
		"api-key=s&trace=1":              "trace=1",
		"access_token=s&sig=x&code=1":    "",
		"stream=true&model=m":            "model=m&stream=true",
		"%zz":                            "",
		"X-Amz-Signature=abc&region=eu1": "region=eu1",
	} {
		if got := mirrorQuery(raw); got != want {
			t.Errorf("mirrorQuery(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestMirrorsSwapWithRoutes: a generation's routes and mirrors serve together. Every state a
// request can load has a running mirror for each route that mirrors, comparing what that
// route's config names, and none for a route that does not, while reloads change the mirror's
// candidate and take the mirror away and back.
func TestMirrorsSwapWithRoutes(t *testing.T) {
	store := filepath.Join(t.TempDir(), "shadow.db")
	cfgFor := func(i int) string {
		mirror := ""
		switch i % 3 {
		case 0:
			mirror = "\n    mirror: {cluster: a, fraction: 1}"
		case 1:
			mirror = "\n    mirror: {cluster: b, fraction: 1}"
		}
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
shadow: {store: %q}
clusters:
  - {name: main, endpoints: [{url: "http://127.0.0.1:1"}], health_check: {disabled: true}}
  - {name: a, endpoints: [{url: "http://127.0.0.1:2"}], health_check: {disabled: true}}
  - {name: b, endpoints: [{url: "http://127.0.0.1:3"}], health_check: {disabled: true}}
routes:
  - name: chat
    splits: [{cluster: main, weight: 100}]%s
`, store, mirror)
	}
	srv := startTestServer(t, cfgFor(0))

	check := func(st *state) error {
		for _, rt := range st.snap.Routes {
			mr := st.mirrors[rt.Name]
			switch {
			case rt.Mirror == nil && mr != nil:
				return fmt.Errorf("route %s mirrors nothing, but its generation has a mirror of %s", rt.Name, mr.Identity())
			case rt.Mirror != nil && mr == nil:
				return fmt.Errorf("route %s mirrors to %s, but its generation has no mirror", rt.Name, rt.Mirror.Cluster)
			case rt.Mirror != nil && (mr.Identity() != mirrorSettings(st.snap.Config, rt.Mirror).Identity() || !mr.Running()):
				return fmt.Errorf("route %s mirrors to %s, but its generation's mirror is of %s (running %v)",
					rt.Name, rt.Mirror.Cluster, mr.Identity(), mr.Running())
			}
		}
		return nil
	}
	stop := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		for n := 0; n < 1_000_000; n++ {
			select {
			case <-stop:
				return
			default:
			}
			// (A generation that was swapped out while it was checked may have stopped its
			// mirrors since: only the serving one must hold.)
			if st := srv.state.Load(); check(st) != nil && srv.state.Load() == st {
				errs <- check(st)
				return
			}
			runtime.Gosched()
		}
	}()
	for i := 1; i <= 30; i++ {
		c, err := config.Parse([]byte(cfgFor(i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Apply(c); err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if err := check(srv.state.Load()); err != nil {
		t.Fatal(err)
	}
}
