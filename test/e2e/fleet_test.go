package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/pgtest"
	"github.com/sluicegw/sluice/test/sim"
	xdsserver "github.com/sluicegw/sluice/xds/server"
)

// The fleet test: a fleet on loopback made of the real parts, each its own process where it
// is one in production. PostgreSQL (test/pgtest) holds the shadow store the three replicas
// share; Envoy's rate limit service on Redis (test/rlstest) holds the limits they share;
// `sluice xds` serves a file to three `sluice serve --bootstrap` replicas and runs the
// weight progression from the fleet's verdicts; simulators are the primary, the baseline (the
// primary's version in a sandbox) and two candidates: one identical to the primary, one
// twice as slow to the first token, and one more behind the rate-limited routes.

// fleetFile is the file `sluice xds` serves: route chat sends to main and to the candidate's
// split (weight w), mirrors everything to the candidate and the baseline, and the candidate's
// weight progresses by 10 a second up to 30. Verdicts every 250ms. Before it, the shared rate
// limit's tenants, cluster and two routes (fleetLimits).
func fleetFile(main, base, good, bad, cand string, w int, lim *fleetLimits) string {
	return fmt.Sprintf(`shadow: {interval: 250ms, window: 500, verdict: {min_samples: 20}}
%[7]sclusters:
  - {name: main, endpoints: [{url: %[1]s}], health_check: {disabled: true}}
  - {name: base, endpoints: [{url: %[2]s}], health_check: {disabled: true}}
  - {name: good, endpoints: [{url: %[3]s}], health_check: {disabled: true}}
  - {name: bad, endpoints: [{url: %[4]s}], health_check: {disabled: true}}
%[8]sroutes:
%[9]s  - name: chat
    splits: [{cluster: main, weight: 100}, {cluster: %[5]s, weight: %[6]d}]
    mirror: {cluster: %[5]s, baseline: base, fraction: 1, max_concurrency: 8, progression: {step: 10, interval: 1s, max: 30}}
`, main, base, good, bad, cand, w, lim.tenantsYAML(), lim.clusterYAML(), lim.routesYAML())
}

// fleetReplica is one `sluice serve --bootstrap` process of the fleet.
type fleetReplica struct {
	node, listen, admin, bootstrap string
	p                              *proc
	alive                          atomic.Bool
}

// startReplica starts (or starts again) the replica from its bootstrap and waits until it is
// ready (it has its first config).
func (r *fleetReplica) start(t *testing.T, hc *http.Client) {
	t.Helper()
	r.p = startSluice(t, "serve", "--bootstrap", r.bootstrap, "--log-level", "warn")
	waitOK(t, hc, "http://"+r.admin+"/readyz", r.p)
	r.alive.Store(true)
}

// newReplica writes the bootstrap of replica node, following the control plane at cp and
// sharing the shadow store at store.
func newReplica(t *testing.T, dir, node, cp, store string) *fleetReplica {
	t.Helper()
	r := &fleetReplica{node: node, listen: freePort(t), admin: freePort(t), bootstrap: filepath.Join(dir, node+".yaml")}
	boot := fmt.Sprintf("node_id: %s\nserver: %s\nlisten: %s\nadmin: %s\nshadow_store: %q\n", node, cp, r.listen, r.admin, store)
	if err := os.WriteFile(r.bootstrap, []byte(boot), 0o600); err != nil {
		t.Fatal(err)
	}
	return r
}

// weight is the weight of split (the cluster's) of route chat on the replica, -1 when it has
// none (or did not answer).
func (r *fleetReplica) weight(t *testing.T, hc *http.Client, split string) int {
	t.Helper()
	resp, err := hc.Get("http://" + r.admin + "/admin/routes")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var rs struct {
		Routes []struct {
			Route string `json:"route"`
			State struct {
				Splits []struct {
					Name, Cluster string
					Weight        int
				} `json:"splits"`
			} `json:"state"`
		} `json:"routes"`
	}
	if json.NewDecoder(resp.Body).Decode(&rs) != nil {
		return -1
	}
	for _, rt := range rs.Routes {
		for _, sp := range rt.State.Splits {
			if rt.Route == "chat" && cmpOr(sp.Name, sp.Cluster) == split {
				return sp.Weight
			}
		}
	}
	return -1
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// report is the replica's live shadow report of route chat.
func (r *fleetReplica) report(t *testing.T, hc *http.Client) (shadow.RouteReport, bool) {
	t.Helper()
	resp, err := hc.Get("http://" + r.admin + "/admin/shadow.json")
	if err != nil {
		return shadow.RouteReport{}, false
	}
	defer resp.Body.Close()
	var rep shadow.Report
	if json.NewDecoder(resp.Body).Decode(&rep) != nil || len(rep.Routes) != 1 {
		return shadow.RouteReport{}, false
	}
	return rep.Routes[0], true
}

// fleetLoad sends one request at a time to the live replicas in turn (the simulators run
// prefills one after another: concurrent requests would make TTFT depend on arrival order),
// until stopped.
type fleetLoad struct {
	cancel context.CancelFunc
	done   chan struct{}
	sent   atomic.Int64
	failed atomic.Int64 // to a replica killed meanwhile, mostly
}

func startFleetLoad(t *testing.T, hc *http.Client, reps []*fleetReplica) *fleetLoad {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	l := &fleetLoad{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 0; ctx.Err() == nil; i++ {
			r := reps[i%len(reps)]
			if !r.alive.Load() {
				continue
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.listen+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(plainChat, i)))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", "fleet-"+strconv.Itoa(i))
			resp, err := hc.Do(req)
			l.sent.Add(1)
			if err != nil {
				l.failed.Add(1)
				continue
			}
			all, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(all), "[DONE]") {
				l.failed.Add(1)
			}
		}
	}()
	t.Cleanup(l.stop)
	return l
}

func (l *fleetLoad) stop() {
	l.cancel()
	<-l.done
}

// cpStatus is the control plane's GET /admin/xds.
func cpStatus(t *testing.T, hc *http.Client, admin string) (xdsserver.Status, bool) {
	t.Helper()
	resp, err := hc.Get("http://" + admin + "/admin/xds")
	if err != nil {
		return xdsserver.Status{}, false
	}
	defer resp.Body.Close()
	var st xdsserver.Status
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		return xdsserver.Status{}, false
	}
	return st, true
}

// chatProgress is route chat's progression in the control plane's status.
func chatProgress(st xdsserver.Status) (xdsserver.RouteProgress, bool) {
	for _, r := range st.Progression.Routes {
		if r.Route == "chat" {
			return r, true
		}
	}
	return xdsserver.RouteProgress{}, false
}

// instancePairs counts the pairs of route chat (of candidate, unless "") each gateway
// instance stored.
func instancePairs(t *testing.T, ctx context.Context, db *pgx.Conn, candidate string) map[string]int64 {
	t.Helper()
	rows, err := db.Query(ctx, "SELECT instance, COUNT(*) FROM pairs WHERE route = 'chat' AND ($1 = '' OR candidate = $1) GROUP BY instance", candidate)
	if err != nil {
		t.Fatalf("count pairs: %v", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var inst string
		var n int64
		if err := rows.Scan(&inst, &n); err != nil {
			t.Fatal(err)
		}
		out[inst] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// rssKiB is a process's resident memory (VmRSS), 0 where /proc cannot tell.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// TestFleet: three replicas driven by `sluice xds`, sharing a PostgreSQL shadow store and
// Envoy's rate limit service. It skips without PostgreSQL or redis-server (fails instead with
// SLUICE_REQUIRE_TOOLS=1).
//
//  0. The shared limit holds (fleetLimits.check): the three replicas together admit a
//     budget of requests, then one of tokens (hits: tokens), ± 5% whichever replica each
//     request hits; with the service stopped every request is served, each failed call
//     counted.
//  1. With no store, the control plane runs no progression: the replicas' fleet verdict on a
//     regressed candidate is rollback, and each only recommends it — no replica changes a
//     weight on its own under xDS.
//  2. The control plane restarts with the store: it judges before it serves, and every
//     replica gets the candidate at weight 0 (a rollback survives a control-plane restart).
//  3. A new, identical candidate is promoted one step a progression interval up to its
//     maximum, every step seen on every replica's admin API; meanwhile a replica is killed
//     (SIGKILL) and nothing it had stored is lost; started again, it gets the control plane's
//     weight at once, not the file's.
//  4. The control plane restarts once more: it recovers the promoted weight from the steps it
//     recorded in the store, and the replicas keep serving it (not the file's 0, promoted
//     again from there).
func TestFleet(t *testing.T) {
	// PostgreSQL starts while the rate limit service and Redis do; it is stopped last.
	pgBin := pgtest.Bin(t) // skips without PostgreSQL
	var (
		pg     *pgtest.Server
		pgErr  error
		pgDone = make(chan struct{})
	)
	go func() {
		defer close(pgDone)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pg, pgErr = pgtest.Launch(ctx, pgBin)
	}()
	t.Cleanup(func() {
		<-pgDone
		if pg != nil {
			pg.Close()
		}
	})
	lim := startFleetLimits(t) // skips without redis-server
	<-pgDone
	if pgErr != nil {
		t.Fatalf("pgtest: %v", pgErr)
	}
	store := pg.CreateDB(t, "fleet")
	same := sim.Config{TTFT: 40 * time.Millisecond, ITL: time.Millisecond, Seed: 1}
	main, base, good := startSim(t, same), startSim(t, same), startSim(t, same)
	bad := startSim(t, sim.Config{TTFT: 80 * time.Millisecond, ITL: time.Millisecond, Seed: 1})
	dir := t.TempDir()
	file := filepath.Join(dir, "sluice.yaml")
	writeFileAtomic(t, file, fleetFile(main.URL, base.URL, good.URL, bad.URL, "bad", 10, lim))
	cpAddr, cpAdmin := freePort(t), freePort(t)
	hc := newHTTPClient(t)
	hc.Timeout = 10 * time.Second
	ctx := testCtx(t)
	db, err := pgx.Connect(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())

	// 1. The control plane without the store: no progression.
	cp := startSluice(t, "xds", "--config", file, "--listen", cpAddr, "--admin", cpAdmin, "--watch", "50ms")
	waitOK(t, hc, "http://"+cpAdmin+"/healthz", cp)
	var reps []*fleetReplica
	for i := range 3 {
		r := newReplica(t, dir, fmt.Sprintf("replica-%d", i+1), cpAddr, store)
		r.start(t, hc)
		reps = append(reps, r)
	}
	// 0. The shared rate limit, on routes of their own (chat, mirrored, is not limited).
	limited := lim.check(t, hc, reps)
	if t.Failed() {
		t.FailNow()
	}
	started := time.Now()
	load := startFleetLoad(t, hc, reps)
	for _, r := range reps {
		eventually(t, 30*time.Second, r.node+"'s fleet verdict: rollback, recommended only", func() bool {
			rr, ok := r.report(t, hc)
			return ok && rr.Scope == shadow.ScopeFleet && rr.Verdict != nil && rr.Verdict.Decision == shadow.Rollback &&
				strings.HasPrefix(rr.Action, "recommend bad weight 10→0")
		})
		if w := r.weight(t, hc, "bad"); w != 10 {
			t.Fatalf("%s changed the candidate's weight on its own under xDS: %d, want the file's 10", r.node, w)
		}
	}
	st, ok := cpStatus(t, hc, cpAdmin)
	if rp, _ := chatProgress(st); !ok || st.Progression.On || rp.Weight != 10 || len(rp.Steps) != 0 || len(st.Nodes) != 3 {
		t.Fatalf("control plane without a store: %+v", st)
	}

	// 2. Restarted with the store, the control plane rolls the candidate back before it serves.
	if err := cp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := cp.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("sluice xds exited %d\n%s", code, cp.out.String())
	}
	cp = startSluice(t, "xds", "--config", file, "--listen", cpAddr, "--admin", cpAdmin, "--watch", "50ms", "--shadow-store", store)
	waitOK(t, hc, "http://"+cpAdmin+"/healthz", cp)
	restarted := time.Now()
	for _, r := range reps {
		eventually(t, 30*time.Second, r.node+" to get the candidate at weight 0", func() bool { return r.weight(t, hc, "bad") == 0 })
	}
	rolledBack := time.Since(restarted)
	st, _ = cpStatus(t, hc, cpAdmin)
	rp, _ := chatProgress(st)
	if !st.Progression.On || rp.Weight != 0 || rp.FileWeight != 10 || !rp.Overridden || len(rp.Steps) != 1 ||
		rp.Steps[0].Action != "weight bad 10→0" || rp.Steps[0].Decision != shadow.Rollback || !strings.HasSuffix(st.Version, "+p1") {
		t.Fatalf("control plane after the rollback: %+v", st)
	}
	if src := rp.Verdict.Sources; len(src) != 3 {
		t.Errorf("the control plane judged the pairs of %+v: want the three replicas'", src)
	}
	// The step is the verdict's action in the store, for the candidate the replicas judge.
	var cpVerdict, replicaVerdict *shadow.VerdictRecord
	sst, err := shadow.OpenStoreReadOnly(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer sst.Close()
	vs, err := sst.Verdicts(ctx, "chat", 100000)
	if err != nil {
		t.Fatal(err)
	}
	for i := range vs {
		switch {
		case vs[i].Instance == xdsserver.Instance && cpVerdict == nil:
			cpVerdict = &vs[i]
		case vs[i].Instance == "replica-1" && replicaVerdict == nil:
			replicaVerdict = &vs[i]
		}
	}
	if cpVerdict == nil || cpVerdict.Action != "weight bad 10→0" || cpVerdict.Verdict.Decision != shadow.Rollback ||
		replicaVerdict == nil || cpVerdict.CandidateID != replicaVerdict.CandidateID {
		t.Fatalf("stored verdicts: the control plane's %+v, replica-1's %+v", cpVerdict, replicaVerdict)
	}

	// 3. An identical candidate, promoted step by step.
	writeFileAtomic(t, file, fleetFile(main.URL, base.URL, good.URL, bad.URL, "good", 0, lim))
	var (
		mu       sync.Mutex
		observed = map[string][]int{} // weights of good each replica showed, in order
		seenAt   = map[string]map[int]time.Time{}
	)
	observe := func() {
		for _, r := range reps {
			if !r.alive.Load() {
				continue
			}
			w := r.weight(t, hc, "good")
			mu.Lock()
			if o := observed[r.node]; w >= 0 && (len(o) == 0 || o[len(o)-1] != w) {
				observed[r.node] = append(o, w)
				if seenAt[r.node] == nil {
					seenAt[r.node] = map[int]time.Time{}
				}
				seenAt[r.node][w] = time.Now()
			}
			mu.Unlock()
		}
	}
	killed := false
	var storedBefore int64
	eventually(t, 60*time.Second, "the identical candidate promoted to 30 on every replica", func() bool {
		observe()
		st, ok := cpStatus(t, hc, cpAdmin)
		rp, _ := chatProgress(st)
		if !ok || rp.Candidate != "good vs base" {
			return false
		}
		if !killed && rp.Weight >= 10 {
			// 3c. Mid-run, with the first step taken: replica-3 is killed.
			storedBefore = instancePairs(t, ctx, db, "")["replica-3"]
			reps[2].alive.Store(false)
			if err := reps[2].p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			reps[2].p.wait(t, 10*time.Second)
			killed = true
		}
		if rp.Weight != 30 {
			return false
		}
		for _, r := range reps[:2] {
			if r.weight(t, hc, "good") != 30 {
				return false
			}
		}
		return true
	})
	observe()
	promoted := time.Now()
	st, _ = cpStatus(t, hc, cpAdmin)
	rp, _ = chatProgress(st)
	promotion := promoted.Sub(rp.Steps[1].Time)
	var steps []string
	for _, s := range rp.Steps {
		steps = append(steps, s.Action)
	}
	if want := []string{"weight bad 10→0", "weight good 0→10", "weight good 10→20", "weight good 20→30"}; !slices.Equal(steps, want) {
		t.Fatalf("steps %q, want %q", steps, want)
	}
	for i := 2; i < len(rp.Steps); i++ {
		if gap := rp.Steps[i].Time.Sub(rp.Steps[i-1].Time); gap < time.Second {
			t.Errorf("steps %d and %d %v apart: at most one a progression interval (1s)", i-1, i, gap)
		}
	}
	mu.Lock()
	for _, r := range reps {
		o := observed[r.node]
		// In order, from the file's 0, without a weight the control plane never set.
		ok := len(o) > 0 && slices.IsSorted(o) && !slices.ContainsFunc(o, func(w int) bool { return w%10 != 0 || w > 30 })
		if r.node != "replica-3" {
			ok = ok && o[len(o)-1] == 30
		}
		if !ok {
			t.Errorf("%s showed weights %v", r.node, o)
		}
	}
	mu.Unlock()

	// 3c. Nothing replica-3 had stored is lost, and the fleet's verdict still holds it.
	if after := instancePairs(t, ctx, db, "")["replica-3"]; storedBefore == 0 || after < storedBefore {
		t.Fatalf("replica-3 had %d pairs stored before it was killed, %d after", storedBefore, after)
	}
	kept := instancePairs(t, ctx, db, "good vs base")["replica-3"]
	if !slices.ContainsFunc(rp.Verdict.Sources, func(s shadow.Source) bool {
		return s.Instance == "replica-3" && int64(s.Pairs) == kept
	}) || kept == 0 {
		t.Errorf("the fleet's verdict judged %+v: want replica-3's %d stored pairs of the candidate among them", rp.Verdict.Sources, kept)
	}
	// Started again, it gets the control plane's weight, not the file's 0.
	reps[2].start(t, hc)
	if w := reps[2].weight(t, hc, "good"); w != 30 {
		t.Errorf("replica-3 started again with the candidate at %d, want the control plane's 30", w)
	}

	// 4. The control plane restarts again: the promotion survives it, from the store's steps.
	if err := cp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := cp.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("sluice xds exited %d\n%s", code, cp.out.String())
	}
	cp = startSluice(t, "xds", "--config", file, "--listen", cpAddr, "--admin", cpAdmin, "--watch", "50ms", "--shadow-store", store)
	waitOK(t, hc, "http://"+cpAdmin+"/healthz", cp)
	restartedAgain := time.Now()
	var reconnected time.Duration
	eventually(t, 30*time.Second, "every replica connected to the control plane started again", func() bool {
		for _, r := range reps {
			if w := r.weight(t, hc, "good"); w != 30 && w != -1 {
				t.Fatalf("%s serves the candidate at %d across the control plane's restart, want the 30 it had", r.node, w)
			}
		}
		st, ok := cpStatus(t, hc, cpAdmin)
		if ok && len(st.Nodes) == 3 && reconnected == 0 {
			reconnected = time.Since(restartedAgain)
		}
		// The snapshot a replica gets when it connects is final (the control plane judges
		// before it serves): a while longer, to see the replicas serve it.
		return reconnected > 0 && time.Since(restartedAgain) > reconnected+300*time.Millisecond
	})
	st4, _ := cpStatus(t, hc, cpAdmin)
	rp4, _ := chatProgress(st4)
	var steps4 []string
	for _, s := range rp4.Steps {
		steps4 = append(steps4, s.Action)
	}
	if want := []string{"weight good 0→10", "weight good 10→20", "weight good 20→30"}; rp4.Weight != 30 || !rp4.Recovered ||
		!rp4.Overridden || !slices.Equal(steps4, want) || !strings.HasSuffix(st4.Version, "+p1") {
		t.Fatalf("control plane started again: %+v (steps %q), want good at 30 recovered, its steps %q", st4, steps4, want)
	}
	load.stop()

	// What the run cost (docs/fleet.md quotes these figures).
	total := int64(0)
	for _, n := range instancePairs(t, ctx, db, "") {
		total += n
	}
	var pairBytes, verdicts int64
	if err := db.QueryRow(ctx, "SELECT pg_total_relation_size('pairs'), (SELECT COUNT(*) FROM verdicts)").Scan(&pairBytes, &verdicts); err != nil {
		t.Fatal(err)
	}
	run := time.Since(started)
	t.Logf("fleet run %v: %d requests (%d failed, to the killed replica), %d pairs stored (%.1f a second, %d bytes each with their indexes), %d verdicts",
		run.Round(time.Millisecond), load.sent.Load(), load.failed.Load(), total, float64(total)/run.Seconds(), pairBytes/max(total, 1), verdicts)
	t.Logf("the shared rate limit's checks took %v; the rate limit service and Redis started in %v",
		limited.Round(time.Millisecond), lim.started.Round(time.Millisecond))
	t.Logf("rollback seen on every replica %v after the control plane restarted; promotion 0→30 in %v; the replicas reconnected %v after its second restart, at the recovered weight",
		rolledBack.Round(time.Millisecond), promotion.Round(time.Millisecond), reconnected.Round(time.Millisecond))
	t.Logf("the control plane's last fleet verdict took %.1f ms (%d pairs, %d sources)", 1000*rp.Verdict.Seconds, rp.Verdict.Pairs, len(rp.Verdict.Sources))
	mu.Lock()
	for _, s := range rp.Steps[1:] {
		var lags []string
		for _, r := range reps[:2] {
			if at, ok := seenAt[r.node][s.To]; ok {
				lags = append(lags, fmt.Sprintf("%s %v", r.node, at.Sub(s.Time).Round(time.Millisecond)))
			}
		}
		t.Logf("step %s: seen %s later (polled every ~20ms)", s.Action, strings.Join(lags, ", "))
	}
	mu.Unlock()
	t.Logf("resident memory: sluice xds %d KiB; replicas %d, %d, %d KiB", rssKiB(cp.cmd.Process.Pid),
		rssKiB(reps[0].p.cmd.Process.Pid), rssKiB(reps[1].p.cmd.Process.Pid), rssKiB(reps[2].p.cmd.Process.Pid))
}
