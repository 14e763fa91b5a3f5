package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/sim"
)

// baselineConfig is a gateway with the primary cluster "main", a baseline sandbox "base"
// (the primary's version) and a candidate sandbox "cand"; the route mirrors with mirror.
func baselineConfig(primary, baseline, candidate, mirror string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
shadow: {interval: 100ms, window: 400, verdict: {min_samples: 20}}
clusters:
  - name: main
    endpoints: [{url: %s}]
  - name: base
    endpoints: [{url: %s}]
  - name: cand
    endpoints: [{url: %s}]
routes:
  - name: chat
    cluster: main
    mirror: %s
`, primary, baseline, candidate, mirror)
}

// loadPrimary keeps conc streaming requests in flight straight at the primary's model server
// (production traffic the gateway does not mirror) until the returned stop is called: the
// primary runs hot while the sandboxes see only the mirrored copies.
func loadPrimary(t *testing.T, url string, conc int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	hc := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil && i < 10000; i++ {
				body := fmt.Sprintf(`{"model":"sim-llama","stream":true,"max_tokens":48,"messages":[{"role":"user","content":"load %d %d"}]}`, w, i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			hc.CloseIdleConnections()
		})
	}
	t.Cleanup(stop)
	return stop
}

// report fetches the shadow report's one route.
func report(t *testing.T, hc *http.Client, g *gateway) shadow.RouteReport {
	t.Helper()
	_, body := do(t, hc, http.MethodPost, "http://"+g.admin+"/admin/shadow/judge", "")
	var rep shadow.Report
	if err := json.Unmarshal(body, &rep); err != nil || len(rep.Routes) != 1 || rep.Routes[0].Verdict == nil {
		t.Fatalf("report: %v\n%.2000s", err, body)
	}
	return rep.Routes[0]
}

func evidence(v *shadow.Verdict, metric string) shadow.Evidence {
	for _, e := range v.Evidence {
		if e.Metric == metric {
			return e
		}
	}
	return shadow.Evidence{}
}

func logVerdict(t *testing.T, v *shadow.Verdict) {
	t.Helper()
	t.Logf("verdict %s: %s", v.Decision, v.Reason)
	for _, e := range v.Evidence {
		t.Logf("  %-22s %-14s %-20s n=%d/%d p=%.3g ref=%.4g cand=%.4g ratio=%.3f [%.3f, %.3f] %s",
			e.Metric, e.Verdict, e.Test, e.NPrimary, e.NCandidate, e.P, e.Primary, e.Cand, e.Ratio, e.Low, e.High, e.Note)
	}
}

// TestShadowBaselineUnderLoad: the primary runs hot (production traffic on top of the
// mirrored requests) while the baseline and the candidate, sandboxes of the same size, get
// only the copies, sent to both at the same moment. Judged against the baseline, an
// identical candidate is promoted, one 30% slower to the first token is rolled back on TTFT,
// and one 25% slower to the end with the same TTFT is rolled back on E2E. The primary's own
// latencies (several times the sandboxes') play no part.
func TestShadowBaselineUnderLoad(t *testing.T) {
	primaryCfg := sim.Config{TTFT: 40 * time.Millisecond, ITL: 3 * time.Millisecond, ITLPerRunning: 500 * time.Microsecond, Seed: 1}
	sandbox := sim.Config{TTFT: 40 * time.Millisecond, ITL: 3 * time.Millisecond, ITLPerRunning: 500 * time.Microsecond, Seed: 2}
	slowTTFT := sandbox
	slowTTFT.TTFT = 52 * time.Millisecond
	slowDecode := sandbox
	slowDecode.ITL = 4 * time.Millisecond
	for _, tc := range []struct {
		name     string
		cand     sim.Config
		decision shadow.Decision
		metric   string // the metric that must regress ("" for promote)
		pass     string // a latency metric that must pass
	}{
		{"identical", sandbox, shadow.Promote, "", shadow.MetricTTFT},
		{"ttft +30%", slowTTFT, shadow.Rollback, shadow.MetricTTFT, ""},
		{"e2e +25% same ttft", slowDecode, shadow.Rollback, shadow.MetricE2E, shadow.MetricTTFT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startSim(t, primaryCfg)
			b := startSim(t, sandbox)
			c := startSim(t, tc.cand)
			stop := loadPrimary(t, p.URL, 6)
			g := startGateway(t, baselineConfig(p.URL, b.URL, c.URL, "{cluster: cand, baseline: base, fraction: 1}"))
			hc := newHTTPClient(t)
			drive(t, hc, g, 60, 2, plainChat)
			stop()
			eventually(t, 10*time.Second, "60 triples", func() bool {
				return metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`) >= 60
			})
			rr := report(t, hc, g)
			v := rr.Verdict
			if v.Decision != tc.decision {
				logVerdict(t, v)
				t.Fatalf("decision %s, want %s", v.Decision, tc.decision)
			}
			if tc.metric != "" {
				if e := evidence(v, tc.metric); e.Verdict != shadow.Regression || e.Test != shadow.StatWilcoxon || e.Reference != "baseline" || !(e.Low > 1) {
					logVerdict(t, v)
					t.Fatalf("%s evidence %+v: want a paired regression against the baseline with its interval above 1", tc.metric, e)
				}
			}
			if tc.pass != "" {
				if e := evidence(v, tc.pass); e.Verdict != shadow.Pass {
					logVerdict(t, v)
					t.Fatalf("%s: %s, want pass", tc.pass, e.Verdict)
				}
			}
			// The primary ran hot: judged against it, the candidate would look fast.
			if rr.Samples.Baseline == nil || rr.Samples.Baseline.Requests < 60 {
				t.Fatalf("report samples %+v: want the baseline's 60 requests", rr.Samples)
			}
			if m := rr.Mirror; m.Dropped != 0 || m.Compared < 60 || len(m.Sides) < 2 {
				t.Fatalf("mirror counters %+v: want nothing dropped, 60 compared, both sides", m)
			}
		})
	}
}

// TestShadowWithoutBaselineNotComparable: without a baseline, a candidate that gets half the
// primary's requests (fraction 0.5) serves a different load, so its latencies are reported
// as not comparable and the decision holds, asking for a baseline: never a pass for a
// candidate planted 30% slower.
func TestShadowWithoutBaselineNotComparable(t *testing.T) {
	cfg := sim.Config{TTFT: 30 * time.Millisecond, ITL: 2 * time.Millisecond, Seed: 1}
	slow := cfg
	slow.TTFT = 39 * time.Millisecond
	for _, tc := range []struct {
		name string
		cand sim.Config
	}{{"identical", cfg}, {"ttft +30%", slow}} {
		t.Run(tc.name, func(t *testing.T) {
			p := startSim(t, cfg)
			c := startSim(t, tc.cand)
			g := startGateway(t, shadowConfig(p.URL, c.URL, "{cluster: cand, fraction: 0.5}", ""))
			hc := newHTTPClient(t)
			// Long enough for the request rates to be measured over whole seconds.
			drive(t, hc, g, 120, 2, plainChat)
			rr := report(t, hc, g)
			v := rr.Verdict
			if v.Decision != shadow.Hold || !strings.Contains(v.Reason, "baseline") {
				logVerdict(t, v)
				t.Fatalf("decision %s (%s), want hold asking for a baseline", v.Decision, v.Reason)
			}
			for _, m := range []string{shadow.MetricTTFT, shadow.MetricE2E} {
				e := evidence(v, m)
				if e.Verdict != shadow.NotComparable || !strings.Contains(e.Note, "requests a second") {
					logVerdict(t, v)
					t.Fatalf("%s: %s (%s), want not_comparable with the two loads", m, e.Verdict, e.Note)
				}
			}
		})
	}
}

// connCounter counts a server's connections: open now, the most open at once, and opened.
type connCounter struct {
	mu               sync.Mutex
	open, peak, seen int
}

func (c *connCounter) state(_ net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s {
	case http.StateNew:
		c.open++
		c.seen++
		c.peak = max(c.peak, c.open)
	case http.StateClosed, http.StateHijacked:
		c.open--
	}
}

func (c *connCounter) get() (open, peak, seen int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open, c.peak, c.seen
}

// startSimCounted is startSim counting the server's connections.
func startSimCounted(t *testing.T, cfg sim.Config) (*simServer, *connCounter) {
	t.Helper()
	s := sim.New(cfg)
	t.Cleanup(s.Close)
	cc := &connCounter{}
	ts := httptest.NewUnstartedServer(s)
	ts.Config.ConnState = cc.state
	ts.Start()
	t.Cleanup(ts.Close)
	return &simServer{Server: s, URL: ts.URL}, cc
}

// TestMirrorSustainedLongAnswers: 50 mirrored requests a second with 3-second answers, with
// the default mirror settings and a baseline: about 150 requests in flight on each of the
// three clusters. No copy is dropped or left uncompared (a sandbox answer that is done
// waits for its primary without holding a worker), each sandbox's connections stay within
// the copies in flight and are reused, and the goroutines come back down when it is over.
func TestMirrorSustainedLongAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("sustained load")
	}
	cfg := sim.Config{TTFT: 5 * time.Millisecond, ITL: 100 * time.Millisecond, Seed: 1}
	p, pc := startSimCounted(t, cfg)
	b, bc := startSimCounted(t, cfg)
	c, cc := startSimCounted(t, cfg)
	g := startGateway(t, baselineConfig(p.URL, b.URL, c.URL, "{cluster: cand, baseline: base, fraction: 1}"))
	hc := newHTTPClient(t)
	hc.Transport.(*http.Transport).MaxIdleConnsPerHost = 256
	before := runtime.NumGoroutine()

	const rate, total = 50, 300
	body := `{"model":"sim-llama","stream":true,"max_tokens":30,"messages":[{"role":"user","content":"long answer %d"}]}`
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	peakG := 0
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for i := range total {
		<-tick.C
		peakG = max(peakG, runtime.NumGoroutine())
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(body, i)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", fmt.Sprintf("s-%d", i))
			resp, err := hc.Do(req)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && (resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]")) {
					err = fmt.Errorf("%d %.200s", resp.StatusCode, b)
				}
			}
			if err != nil {
				mu.Lock()
				failed = append(failed, err.Error())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d of %d primary requests failed, first: %s", len(failed), total, failed[0])
	}
	deadline := time.Now().Add(20 * time.Second)
	for metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`) < total && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	rr := report(t, hc, g)
	m := rr.Mirror
	if m.Offered != total || m.Dropped != 0 || m.Incomplete != 0 || m.Compared != total {
		t.Fatalf("mirror counters %+v: want %d offered and compared, none dropped or incomplete", m, total)
	}
	for _, s := range m.Sides {
		if s.Sent != total || s.Failed != 0 || s.Compared != total {
			t.Fatalf("side %+v: want %d sent and compared, none failed", s, total)
		}
	}
	for name, cnt := range map[string]*connCounter{"baseline": bc, "candidate": cc} {
		_, peak, seen := cnt.get()
		t.Logf("%s: %d connections at once, %d opened", name, peak, seen)
		// About 150 copies are in flight at once: the connections follow them and are reused.
		if peak > 220 || seen > 240 {
			t.Errorf("%s: %d connections at once, %d opened for %d copies: want them bounded by the copies in flight and reused", name, peak, seen, total)
		}
	}
	// Every copy in flight costs a few goroutines (client, gateway, worker, simulators): a
	// bound per request in flight, not one that grows with the run.
	if peakG-before > 40*200 {
		t.Errorf("goroutines peaked at %d (from %d) for ~150 requests in flight", peakG, before)
	}
	// Once it is over, what is left is the idle keep-alive connections (a few goroutines
	// each, on both ends): nothing waits on a job, a timer or a worker.
	hc.CloseIdleConnections()
	eventually(t, 10*time.Second, "goroutines back to the idle connections'", func() bool {
		po, _, _ := pc.get()
		bo, _, _ := bc.get()
		co, _, _ := cc.get()
		n := runtime.NumGoroutine()
		if n > before+4*(po+bo+co)+64 {
			t.Logf("goroutines: %d before, peak %d, %d now; connections open: %d primary, %d baseline, %d candidate", before, peakG, n, po, bo, co)
			return false
		}
		return true
	})
}

// TestMirrorWorkerNotHeldByPrimary: with one worker and no queue, copies whose sandboxes
// answer at once are all served while their slow primaries are still streaming (the worker is
// not held for them); the primary's handler, finishing last, hands each triple to the
// comparers. With a mirror time-out shorter than the primary, the finished copies give up
// waiting and count as incomplete. Either way the captured answers are let go.
func TestMirrorWorkerNotHeldByPrimary(t *testing.T) {
	// The simulator's prefills run one after another: the primaries' first tokens come 300 ms
	// apart, while each copy is done within milliseconds.
	slow := sim.Config{TTFT: 300 * time.Millisecond, ITL: 5 * time.Millisecond, Seed: 1}
	fast := sim.Config{TTFT: 5 * time.Millisecond, ITL: time.Millisecond, Seed: 2}
	for _, tc := range []struct {
		name      string
		mirror    string
		compared  float64
		incompl   float64
		reference string
	}{
		{"compared by the handler's hand-off", "{cluster: cand, baseline: base, fraction: 1, max_concurrency: 1, max_queue: 0}", 10, 0, ""},
		{"waits no longer than the time-out", "{cluster: cand, baseline: base, fraction: 1, max_concurrency: 1, max_queue: 0, timeout: 200ms}", 0, 10, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startSim(t, slow)
			b := startSim(t, fast)
			c := startSim(t, fast)
			g := startGateway(t, baselineConfig(p.URL, b.URL, c.URL, tc.mirror))
			hc := newHTTPClient(t)
			var wg sync.WaitGroup
			for i := range 10 {
				time.Sleep(40 * time.Millisecond) // each copy is done long before the next comes
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodPost, "http://"+g.addr+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(plainChat, i)))
					req.Header.Set("Content-Type", "application/json")
					resp, err := hc.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
			}
			wg.Wait()
			eventually(t, 10*time.Second, "every copy accounted for", func() bool {
				return metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`)+
					metricValue(t, hc, g.admin, "sluice_shadow_incomplete_total", `route="chat"`) >= 10
			})
			if d := metricValue(t, hc, g.admin, "sluice_shadow_dropped_total", `route="chat"`); d != 0 {
				t.Fatalf("%v copies dropped: the worker was held for the primary", d)
			}
			if n := metricValue(t, hc, g.admin, "sluice_shadow_pairs_total", `route="chat"`); n != tc.compared {
				t.Fatalf("%v compared, want %v", n, tc.compared)
			}
			if n := metricValue(t, hc, g.admin, "sluice_shadow_incomplete_total", `route="chat"`); n != tc.incompl {
				t.Fatalf("%v incomplete, want %v", n, tc.incompl)
			}
			_, page := do(t, hc, http.MethodGet, "http://"+g.admin+"/metrics", "")
			if !strings.Contains(string(page), `sluice_shadow_captured_bytes{`) {
				t.Fatal("no sluice_shadow_captured_bytes in /metrics")
			}
			eventually(t, 5*time.Second, "captured answers let go", func() bool {
				return metricValue(t, hc, g.admin, "sluice_shadow_captured_bytes", `route="chat"`) == 0
			})
		})
	}
}
