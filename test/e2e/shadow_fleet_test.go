package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/pgtest"
	"github.com/sluicegw/sluice/test/sim"
)

// fleetConfig is a gateway named instance sharing the shadow store at store: a primary, a
// baseline and a candidate cluster, one route mirroring to both sandboxes, verdicts only when
// asked (POST /admin/shadow/judge).
func fleetConfig(store, instance, primary, baseline, candidate string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
shadow: {store: %q, instance: %s, interval: 1h, window: 200, verdict: {min_samples: 20}}
clusters:
  - {name: main, endpoints: [{url: %s}]}
  - {name: base, endpoints: [{url: %s}]}
  - {name: cand, endpoints: [{url: %s}]}
routes:
  - name: chat
    cluster: main
    mirror: {cluster: cand, baseline: base, fraction: 1, max_concurrency: 8}
`, store, instance, primary, baseline, candidate)
}

// judge asks g to judge now and returns its report.
func judge(t *testing.T, hc *http.Client, g *gateway) shadow.Report {
	t.Helper()
	resp, body := do(t, hc, http.MethodPost, "http://"+g.admin+"/admin/shadow/judge", "")
	var rep shadow.Report
	if err := json.Unmarshal(body, &rep); err != nil || resp.StatusCode != http.StatusOK || len(rep.Routes) != 1 || rep.Routes[0].Verdict == nil {
		t.Fatalf("judge: %d %v\n%s", resp.StatusCode, err, body)
	}
	return rep
}

// TestShadowFleetStore: two gateways share a PostgreSQL shadow store. The verdict each gives
// is the fleet's: over both gateways' pairs, with the same evidence from either. When the
// database stops, a gateway goes on serving, holds its pairs (the admin view and the metrics
// say so) and judges its own; when it is back, what was held is written and the fleet's
// verdict covers it.
func TestShadowFleetStore(t *testing.T) {
	pg := pgtest.Start(t)
	store := pg.CreateDB(t, "shadow")
	base := sim.Config{TTFT: 50 * time.Millisecond, ITL: 2 * time.Millisecond, Seed: 1}
	p, b := startSim(t, base), startSim(t, base)
	c := startSim(t, sim.Config{TTFT: 65 * time.Millisecond, ITL: 2 * time.Millisecond, Seed: 1}) // 30% slower to the first token
	ga := startGateway(t, fleetConfig(store, "gw-a", p.URL, b.URL, c.URL))
	gb := startGateway(t, fleetConfig(store, "gw-b", p.URL, b.URL, c.URL))
	hc := newHTTPClient(t)
	const each = 25
	// One request at a time (see TestShadowVerdicts), half of the traffic to each gateway.
	drive(t, hc, ga, each, 1, plainChat)
	drive(t, hc, gb, each, 1, plainChat)
	for _, g := range []*gateway{ga, gb} {
		eventually(t, 20*time.Second, "the pairs written to the shared store", func() bool {
			return metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`) >= each &&
				metricValue(t, hc, g.admin, "sluice_shadow_store_written_total") >= each
		})
	}

	ra, rb := judge(t, hc, ga), judge(t, hc, gb)
	for name, rep := range map[string]shadow.Report{"gw-a": ra, "gw-b": rb} {
		rr := rep.Routes[0]
		if rr.Scope != shadow.ScopeFleet || len(rr.Sources) != 2 || rr.Samples.Candidate.Requests != 2*each ||
			rr.Verdict.Decision != shadow.Rollback {
			t.Fatalf("%s: scope %q, sources %+v, %d pairs, %s (%s): want the fleet's %d pairs rolled back",
				name, rr.Scope, rr.Sources, rr.Samples.Candidate.Requests, rr.Verdict.Decision, rr.Verdict.Reason, 2*each)
		}
		if s := rep.Store; s == nil || !s.Shared || s.Instance != name || s.Writer == nil || !s.Writer.Connected {
			t.Fatalf("%s: store %+v", name, rep.Store)
		}
	}
	va, _ := json.Marshal(ra.Routes[0].Verdict)
	vb, _ := json.Marshal(rb.Routes[0].Verdict)
	if string(va) != string(vb) {
		t.Fatalf("the gateways judged the fleet differently:\n gw-a %s\n gw-b %s", va, vb)
	}

	// The verdicts just given are records too, written behind the answer: wait until both
	// gateways hold nothing, so that what gw-a holds below is the pairs it serves meanwhile.
	for _, g := range []*gateway{ga, gb} {
		eventually(t, 20*time.Second, "the verdicts written to the shared store", func() bool {
			return metricValue(t, hc, g.admin, "sluice_shadow_store_buffered") == 0
		})
	}

	// The database goes away: gw-a serves on and holds its pairs.
	pg.Stop(t)
	drive(t, hc, ga, 20, 1, plainChat)
	eventually(t, 20*time.Second, "gw-a to find the store down", func() bool {
		return metricValue(t, hc, ga.admin, "sluice_shadow_pairs_total", `route="chat"`) >= each+20 &&
			metricValue(t, hc, ga.admin, "sluice_shadow_store_up") == 0 &&
			metricValue(t, hc, ga.admin, "sluice_shadow_store_retries_total") > 0
	})
	if held := metricValue(t, hc, ga.admin, "sluice_shadow_store_buffered"); held != 20 {
		t.Fatalf("%v records held, want the 20 pairs", held)
	}
	if d := metricValue(t, hc, ga.admin, "sluice_shadow_store_dropped_total"); d != 0 {
		t.Fatalf("%v records dropped with room left", d)
	}
	down := judge(t, hc, ga)
	if rr := down.Routes[0]; rr.Scope != shadow.ScopeInstance || rr.Samples.Candidate.Requests != each+20 {
		t.Fatalf("while down: scope %q over %d pairs, want gw-a's own %d", rr.Scope, rr.Samples.Candidate.Requests, each+20)
	}
	if w := down.Store.Writer; w.Connected || w.Buffered < 20 || w.LastError == "" || w.DownSince.IsZero() {
		t.Fatalf("admin view while down: %+v", w)
	}

	pg.Restart(t)
	eventually(t, 30*time.Second, "gw-a to write what it held", func() bool {
		return metricValue(t, hc, ga.admin, "sluice_shadow_store_up") == 1 &&
			metricValue(t, hc, ga.admin, "sluice_shadow_store_buffered") == 0
	})
	back := judge(t, hc, ga)
	if rr := back.Routes[0]; rr.Scope != shadow.ScopeFleet || rr.Samples.Candidate.Requests != 2*each+20 ||
		len(rr.Sources) != 2 || rr.Sources[0] != (shadow.Source{Instance: "gw-a", Pairs: each + 20}) {
		t.Fatalf("after the restart: scope %q, %d pairs, sources %+v", rr.Scope, rr.Samples.Candidate.Requests, rr.Sources)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := shadow.OpenStoreReadOnly(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if n, _, err := st.Count(ctx, "chat"); err != nil || n != 2*each+20 {
		t.Fatalf("%d pairs stored, want %d: %v", n, 2*each+20, err)
	}
}
