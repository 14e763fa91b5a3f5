package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/pgtest"
	xdsserver "github.com/sluicegw/sluice/xds/server"
)

// haFile is the file both control planes serve: route chat's candidate next starts at 0 and
// is promoted by 10 at most once a second up to 30, judged every 200ms. Nothing is sent to
// the clusters (no traffic: the pairs are planted).
const haFile = `shadow: {interval: 200ms, window: 100, verdict: {min_samples: 20}}
clusters:
  - {name: main, endpoints: [{url: "http://127.0.0.1:9"}], health_check: {disabled: true}}
  - {name: next, endpoints: [{url: "http://127.0.0.1:9"}], health_check: {disabled: true}}
routes:
  - name: chat
    splits: [{cluster: main, weight: 100}, {cluster: next, weight: 0}]
    mirror: {cluster: next, fraction: 1, progression: {step: 10, interval: 1s, max: 30}}
`

// plantPairs stores n pairs of route chat's candidate next identical to the primary (a
// promote), as two gateways would have mirrored them.
func plantPairs(t *testing.T, store string, n int) {
	t.Helper()
	st, err := shadow.OpenStore(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now().Add(-time.Hour)
	for i := range n {
		a := shadow.Answer{Status: 200, TTFT: time.Duration(40+i%9) * time.Millisecond, ITL: 5 * time.Millisecond,
			E2E: time.Duration(200+i%11) * time.Millisecond, OutputTokens: 32, FinishReason: "stop", Text: "the quick brown fox"}
		rec := shadow.NewPairRecord("chat", t0.Add(time.Duration(i)*time.Millisecond), []byte(`{"model":"m"}`), a, a, nil, shadow.Compare(shadow.Request{}, a, a))
		rec.CandidateID, rec.Instance = "next", []string{"gw-a", "gw-b"}[i%2]
		if err := st.AddPair(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
}

// TestControlPlaneHandover: two `sluice xds` on one PostgreSQL store, a replica following
// each. One leads the progression, the other follows: both replicas get the same weights,
// each step is in the store once. The leader is killed (SIGKILL): its lock goes with its
// session, the follower takes the lead at its next round and promotes on from the stored
// weight. Skips without PostgreSQL.
func TestControlPlaneHandover(t *testing.T) {
	store := pgtest.Start(t).CreateDB(t, "ha")
	plantPairs(t, store, 40)
	dir := t.TempDir()
	file := filepath.Join(dir, "fleet.yaml")
	writeFileAtomic(t, file, haFile)
	hc := newHTTPClient(t)
	hc.Timeout = 10 * time.Second

	type plane struct {
		listen, admin string
		p             *proc
	}
	start := func() plane {
		cp := plane{listen: freePort(t), admin: freePort(t)}
		cp.p = startSluice(t, "xds", "--config", file, "--listen", cp.listen, "--admin", cp.admin, "--shadow-store", store)
		waitOK(t, hc, "http://"+cp.admin+"/healthz", cp.p)
		return cp
	}
	role := func(cp plane) (string, int) {
		st, ok := cpStatus(t, hc, cp.admin)
		rp, found := chatProgress(st)
		if !ok || !found {
			return "", -1
		}
		return st.Progression.Role, rp.Weight
	}
	a := start()
	eventually(t, 10*time.Second, "the first control plane to lead at weight 10", func() bool {
		r, w := role(a)
		return r == xdsserver.RoleLeader && w >= 10
	})
	b := start()
	eventually(t, 10*time.Second, "the second control plane to follow", func() bool {
		r, _ := role(b)
		return r == xdsserver.RoleFollower
	})
	replicas := map[string]*fleetReplica{}
	for name, cp := range map[string]plane{"replica-a": a, "replica-b": b} {
		r := newReplica(t, dir, name, cp.listen, store)
		r.start(t, hc)
		replicas[name] = r
	}
	for _, w := range []int{10, 20} {
		for name, r := range replicas {
			eventually(t, 10*time.Second, fmt.Sprintf("%s at weight %d", name, w), func() bool { return r.weight(t, hc, "next") >= w })
		}
	}
	if r, _ := role(b); r != xdsserver.RoleFollower {
		t.Fatalf("the second control plane is %q, want a follower while the first leads", r)
	}

	if err := a.p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 10*time.Second, "the follower to lead once the leader was killed", func() bool {
		r, _ := role(b)
		return r == xdsserver.RoleLeader
	})
	handover := time.Since(killed)
	eventually(t, 10*time.Second, "replica-b at weight 30", func() bool { return replicas["replica-b"].weight(t, hc, "next") == 30 })
	t.Logf("handover: the follower led %v after the leader was killed (shadow.interval 200ms)", handover.Round(time.Millisecond))

	// The new leader's metrics say it leads.
	if v := metricValue(t, hc, b.admin, "sluice_xds_progression_leader"); v != 1 {
		t.Errorf("the new leader's sluice_xds_progression_leader is %v, want 1", v)
	}
	if v := metricValue(t, hc, b.admin, "sluice_xds_progression_weight", `route="chat"`, `split="next"`); v != 30 {
		t.Errorf(`the new leader's sluice_xds_progression_weight{route="chat",split="next"} is %v, want 30`, v)
	}

	// Each step is in the store once: never two control planes stepping.
	st, err := shadow.OpenStoreReadOnly(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(10 * time.Second)
	var got []string
	for {
		vs, err := st.Verdicts(context.Background(), "chat", 1000)
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, v := range slices.Backward(vs) {
			if v.Instance == xdsserver.Instance {
				got = append(got, v.Action)
			}
		}
		if len(got) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if want := []string{"weight next 0→10", "weight next 10→20", "weight next 20→30"}; !slices.Equal(got, want) {
		t.Errorf("the control planes' verdicts in the store: %q, want each step once: %q", got, want)
	}
}
