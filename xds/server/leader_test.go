package server

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/pgtest"
	"github.com/sluicegw/sluice/test/rlstest"
)

// haConfig is progression.yaml for candidate next at weight 0, judged every 100ms, stepped
// by 10 at most once a second up to 40.
func haConfig(t *testing.T) string {
	t.Helper()
	c := progressConfig(t, "next", 0, 40, "embed")
	c = strings.Replace(c, "interval: 1h", "interval: 100ms", 1)
	return strings.Replace(c, "progression: {step: 10, interval: 1m,", "progression: {step: 10, interval: 1s,", 1)
}

// eventually waits (at most 10s) for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProgressionLeader: two control planes on one PostgreSQL store, each judging every
// 100ms: exactly one leads (the first); the other judges nothing, writes nothing and serves
// the leader's weights, read from the steps it records in the store; a promote steps once
// per progression interval (1s), not once per control plane; when the leader stops, the
// follower takes the lead and steps on from the stored weight, the stored step's time
// counting for the interval.
func TestProgressionLeader(t *testing.T) {
	defer goleak.VerifyNone(t)
	url := pgtest.Start(t).CreateDB(t, "ha")
	st, err := shadow.OpenStore(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	storePairs(t, st, "next", 40, 0, time.Now().Add(-time.Hour)) // identical: promote
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, file, haConfig(t))
	opts := Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: url}

	t.Run("serve", func(t *testing.T) {
		a, addrA, stopA := runServer(t, opts)
		if p := a.Status().Progression; p.Role != RoleLeader || p.LeaderSince == nil || p.Routes[0].Weight != 10 {
			t.Fatalf("the first control plane: %+v", p)
		}
		waitVerdict(t, st, "weight next 0→10", "next")
		b, addrB, stopB := runServer(t, opts)
		defer stopB()
		if p := b.Status().Progression; p.Role != RoleFollower || p.Routes[0].Verdict != nil || p.Routes[0].Weight != 10 ||
			!p.Routes[0].Recovered {
			t.Fatalf("the second control plane: %+v: want a follower at the leader's weight, judging nothing", p)
		}
		if p := a.Status().Progression; p.Role != RoleLeader {
			t.Fatalf("the first control plane after the second started: %+v", p)
		}
		if m := scrape(t, a); m.value(t, "sluice_xds_progression_leader") != 1 {
			t.Error("the leader's sluice_xds_progression_leader is not 1")
		}
		if m := scrape(t, b); m.value(t, "sluice_xds_progression_leader") != 0 {
			t.Error("the follower's sluice_xds_progression_leader is not 0")
		}

		// The replicas of either get the leader's weights.
		ca, cb := dialDelta(t, addrA, "replica-a"), dialDelta(t, addrB, "replica-b")
		for _, w := range []int{10, 20} {
			for name, c := range map[string]*deltaClient{"the leader's": ca, "the follower's": cb} {
				c.await(fmt.Sprintf("weight %d on %s replica", w, name), func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
					return chatWeight(t, r, "next") == w
				})
			}
		}
		if p := b.Status().Progression; p.Role != RoleFollower || p.Routes[0].Verdict != nil {
			t.Fatalf("the follower judged: %+v", p)
		}

		// The leader stops: the follower takes the lead over at its next round.
		stopA()
		stopped := time.Now()
		eventually(t, "the follower to lead", func() bool { return b.Status().Progression.Role == RoleLeader })
		t.Logf("handover: the follower led %v after the leader stopped (shadow.interval 100ms)", time.Since(stopped).Round(time.Millisecond))
		for _, w := range []int{30, 40} {
			cb.await(fmt.Sprintf("weight %d from the new leader", w), func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
				return chatWeight(t, r, "next") == w
			})
		}
		rp := b.Status().Progression.Routes[0]
		if last := rp.Steps[len(rp.Steps)-1]; rp.Weight != 40 || last.Action != "weight next 30→40" || last.Version == "" {
			t.Fatalf("the new leader: %+v: want it to have stepped to 40 itself", rp)
		}
		waitVerdict(t, st, "weight next 30→40", "next")
		stopB()

		// Each step is in the store once, the control planes' only verdicts, a progression
		// interval (1s) apart: never two control planes stepping.
		vs, err := st.Verdicts(context.Background(), "chat", 1000)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		var times []time.Time
		for _, v := range slices.Backward(vs) {
			if v.Instance == Instance {
				got, times = append(got, v.Action), append(times, v.Time)
			}
		}
		if want := []string{"weight next 0→10", "weight next 10→20", "weight next 20→30", "weight next 30→40"}; !slices.Equal(got, want) {
			t.Fatalf("the control planes' verdicts in the store: %q, want each step once: %q", got, want)
		}
		for i := 1; i < len(times); i++ {
			if d := times[i].Sub(times[i-1]); d < time.Second {
				t.Errorf("step %d came %v after the one before it: within the progression's interval", i, d)
			}
		}
	})
}

// metrics is a scrape of a control plane's /metrics.
type metrics map[string]*dto.MetricFamily

// scrape gets s's /metrics through its admin handler (on a loopback listener).
func scrape(t *testing.T, s *Server) metrics {
	t.Helper()
	rec := httptest.NewRecorder()
	s.AdminHandler("127.0.0.1:18001").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// value is the value of the series of name with labels (pairs of name and value); -1 when
// there is none.
func (m metrics) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	fam := m[name]
	if fam == nil {
		return -1
	}
	for _, mt := range fam.GetMetric() {
		have := map[string]string{}
		for _, l := range mt.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := len(have) == len(labels)/2
		for i := 0; match && i+1 < len(labels); i += 2 {
			match = have[labels[i]] == labels[i+1]
		}
		if !match {
			continue
		}
		switch {
		case mt.GetCounter() != nil:
			return mt.GetCounter().GetValue()
		case mt.GetGauge() != nil:
			return mt.GetGauge().GetValue()
		}
	}
	return -1
}

// TestMetrics: the control plane's /metrics (authorised as /admin/xds: TestAdminHandler)
// count its pushes, nodes, steps, verdicts, weights and failed reads, with the store writer's
// state as a gateway names it.
func TestMetrics(t *testing.T) {
	defer goleak.VerifyNone(t)
	st, storePath, file := sqliteStore(t)
	defer st.Close()
	storePairs(t, st, "cand", 40, 60*time.Millisecond, time.Now().Add(-time.Hour)) // regressed: rollback
	writeFile(t, file, progressConfig(t, "cand", 10, 30, "embed"))

	t.Run("without a store", func(t *testing.T) {
		s, err := New(Options{ConfigPath: file})
		if err != nil {
			t.Fatal(err)
		}
		m := scrape(t, s)
		if m.value(t, "sluice_xds_snapshot_pushes_total", "cause", "config") != 1 || m.value(t, "sluice_xds_nodes_connected") != 0 ||
			m.value(t, "sluice_xds_snapshot_info", "version", s.Version(), "file_version", s.Version()) != 1 {
			t.Errorf("metrics without a store: %v", m)
		}
		for _, name := range []string{"sluice_xds_progression_leader", "sluice_xds_progression_weight", "sluice_shadow_store_up"} {
			if m[name] != nil {
				t.Errorf("%s without a store", name)
			}
		}
		if m["go_goroutines"] == nil || m["process_cpu_seconds_total"] == nil && m["process_start_time_seconds"] == nil {
			t.Error("no Go runtime or process metrics")
		}
	})

	t.Run("serve", func(t *testing.T) {
		s, addr := startServerWith(t, Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: storePath})
		c := dialDelta(t, addr, "replica-1")
		c.await("the rolled back weight", func(r *discoverygrpc.DeltaDiscoveryResponse) bool { return chatWeight(t, r, "cand") == 0 })
		waitVerdict(t, st, "weight cand 10→0", "cand")
		m := scrape(t, s)
		for _, tc := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"sluice_xds_snapshot_pushes_total", []string{"cause", "config"}, 1},
			{"sluice_xds_snapshot_pushes_total", []string{"cause", "progression"}, 1},
			{"sluice_xds_snapshot_pushes_total", []string{"cause", "store"}, 0},
			{"sluice_xds_nodes_connected", nil, 1},
			{"sluice_xds_snapshot_info", []string{"version", s.Version(), "file_version", s.Status().FileVersion}, 1},
			{"sluice_xds_progression_leader", nil, 1},
			{"sluice_xds_progression_weight", []string{"route", "chat", "split", "cand"}, 0},
			{"sluice_xds_progression_verdict", []string{"route", "chat", "decision", "rollback"}, 1},
			{"sluice_xds_progression_verdict", []string{"route", "chat", "decision", "promote"}, 0},
			{"sluice_xds_progression_steps_total", []string{"route", "chat", "decision", "rollback"}, 1},
			{"sluice_xds_progression_steps_total", []string{"route", "chat", "decision", "promote"}, 0},
			{"sluice_xds_fleet_read_failures_total", []string{"route", "chat"}, 0},
			{"sluice_shadow_store_up", nil, 1},
			{"sluice_shadow_store_buffered", nil, 0},
			{"sluice_shadow_store_written_total", nil, 1},
			{"sluice_shadow_store_dropped_total", []string{"kind", "verdict"}, 0},
		} {
			if got := m.value(t, tc.name, tc.labels...); got != tc.want {
				t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
			}
		}

		// The store cannot be read: a failed read of the route's window, counted.
		db, err := sql.Open("sqlite", storePath)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec("ALTER TABLE pairs RENAME TO pairs_away"); err != nil {
			t.Fatal(err)
		}
		s.judgeAll(context.Background(), time.Now())
		if got := scrape(t, s).value(t, "sluice_xds_fleet_read_failures_total", "route", "chat"); got != 1 {
			t.Errorf("failed reads %v after one, want 1 (status %+v)", got, s.Status().Progression.Routes[0])
		}
	})
}

// TestReleaseLeadSQLite: a control plane on a SQLite store leads without a lock, so
// stopping gives none up and says nothing of a lead.
func TestReleaseLeadSQLite(t *testing.T) {
	defer goleak.VerifyNone(t)
	st, storePath, file := sqliteStore(t)
	defer st.Close()
	writeFile(t, file, progressConfig(t, "cand", 10, 30, "embed"))
	logs := &rlstest.LogBuffer{}
	s, _, stop := runServer(t, Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: storePath,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if p := s.Status().Progression; p.Role != RoleLeader {
		t.Fatalf("on a SQLite store: %+v, want the leader", p)
	}
	stop()
	if out := logs.String(); strings.Contains(out, "lead given up") || strings.Contains(out, "giving the lead up") {
		t.Errorf("a SQLite store's control plane stopped as if it held a lock:\n%s", out)
	}
}
