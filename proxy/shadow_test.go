package proxy

import (
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
	mr := &mirrorRoute{name: "chat"}
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
