package upstream

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/gpu"
	"github.com/sluicegw/sluice/test/sim"
)

// These tests plant a KV-cache leak and a stall in real simulators, read them through the
// real scraper (gpu.Scraper, polled by the test on a fake clock) and check what picking does
// with the flags: a lower weight, and ejection when it is on.

// scraperLoad is the LoadSource the gateway builds on the scraper (proxy.loadSource).
type scraperLoad struct{ s *gpu.Scraper }

func (l scraperLoad) Get(ep string) (Load, bool) {
	v, ok := l.s.Get(ep)
	var f Flags
	if v.Flags.Has(gpu.FlagKVLeak) {
		f |= FlagKVLeak
	}
	if v.Flags.Has(gpu.FlagStall) {
		f |= FlagStall
	}
	return Load{Waiting: v.Waiting, Running: v.Running, KVCacheUsage: v.KVCacheUsage, Flags: f}, ok
}

// simFleet is n simulators behind one scraper and three clusters on them: flagged (the
// defaults: flagged endpoints keep 0.1 of their weight), control (FlaggedWeight 1: flags
// change nothing) and eject (EjectFlagged). Everything runs on one fake clock.
type simFleet struct {
	t       *testing.T
	sims    []*sim.Server
	urls    []string
	clk     *fakeClock
	scraper *gpu.Scraper
	flagged *Cluster
	control *Cluster
	eject   *Cluster
	ctx     context.Context
	cancel  context.CancelFunc // ends every request in flight
	wg      sync.WaitGroup
}

func newSimFleet(t *testing.T, checks gpu.Checks, cfgs ...sim.Config) *simFleet {
	t.Helper()
	f := &simFleet{t: t, clk: newFakeClock()}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	metrics := map[string]string{}
	var sp []EndpointSpec
	for _, cfg := range cfgs {
		s := sim.New(cfg)
		ts := httptest.NewServer(s)
		t.Cleanup(func() { ts.Close(); s.Close() })
		f.sims = append(f.sims, s)
		f.urls = append(f.urls, ts.URL)
		metrics[ts.URL] = ts.URL + "/metrics"
		sp = append(sp, EndpointSpec{URL: ts.URL, MetricsURL: ts.URL + "/metrics"})
	}
	t.Cleanup(func() { f.cancel(); f.wg.Wait() }) // before the servers close
	f.scraper = &gpu.Scraper{Clock: f.clk, Staleness: time.Hour, Checks: checks}
	f.scraper.Set(metrics)
	t.Cleanup(func() { _ = f.scraper.Close() })
	src := scraperLoad{f.scraper}
	f.flagged = newTestCluster(t, Options{Name: "flagged", Endpoints: sp, Clock: f.clk, Load: src})
	f.control = newTestCluster(t, Options{Name: "control", Endpoints: sp, Clock: f.clk, Load: src, Picking: Picking{FlaggedWeight: 1}})
	f.eject = newTestCluster(t, Options{Name: "eject", Endpoints: sp, Clock: f.clk, Load: src, Outlier: Outlier{EjectFlagged: true}})
	return f
}

// poll advances the clock by d and scrapes every simulator once; it returns each one's flags.
func (f *simFleet) poll(d time.Duration) []gpu.Flags {
	f.t.Helper()
	f.clk.Advance(d)
	if err := f.scraper.Poll(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	out := make([]gpu.Flags, len(f.urls))
	for i, u := range f.urls {
		l, ok := f.scraper.Get(u)
		if !ok {
			f.t.Fatalf("no fresh load for simulator %d", i)
		}
		out[i] = l.Flags
	}
	return out
}

// request sends one chat request to simulator i and reads its answer, in the background
// unless wait; the stream ends when the fleet's requests are cancelled.
func (f *simFleet) request(i, maxTokens int, wait bool) { f.requestPrompt(i, "hi", maxTokens, wait) }

func (f *simFleet) requestPrompt(i int, prompt string, maxTokens int, wait bool) {
	body := `{"messages":[{"role":"user","content":"` + prompt + `"}],"stream":true,"ignore_eos":true,"max_tokens":` + strconv.Itoa(maxTokens) + `}`
	run := func() {
		req, err := http.NewRequestWithContext(f.ctx, http.MethodPost, f.urls[i]+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if wait {
		run()
		return
	}
	f.wg.Go(run)
}

// until waits (boundedly) for cond, polling the simulators' state, not the clock.
func (f *simFleet) until(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// share holds n picks of c in flight and returns the share endpoint i got.
func share(t *testing.T, c *Cluster, n, i int) float64 {
	t.Helper()
	return float64(holdPicks(t, c, n, Hint{})[i]) / float64(n)
}

func TestPlantedLeakThroughScraper(t *testing.T) {
	leaky := sim.Config{ITL: time.Millisecond, KVTokens: 10000, LeakKVPerRequest: 2000}
	clean := sim.Config{ITL: time.Millisecond, KVTokens: 10000}
	f := newSimFleet(t, gpu.Checks{}, leaky, clean, clean)
	for i := range f.sims {
		f.request(i, 20, true)
		f.request(i, 20, true)
	}
	if st := f.sims[0].Stats(); st.Running != 0 || st.KVUsage != 0.4 {
		t.Fatalf("leaky simulator after its requests: %+v", st)
	}

	// Idle with 40% of the cache held: flagged once it has been so for 5 minutes (the
	// default), that is on the 11th scrape 30s apart, the first counting from 0.
	const every = 30 * time.Second
	flaggedAt := 0
	for n := 1; n <= 20 && flaggedAt == 0; n++ {
		flags := f.poll(every)
		if flags[1] != 0 || flags[2] != 0 {
			t.Fatalf("scrape %d: a clean simulator flagged: %v", n, flags)
		}
		if flags[0].Has(gpu.FlagKVLeak) {
			flaggedAt = n
		}
	}
	if flaggedAt != 11 {
		t.Fatalf("leak flagged on scrape %d, want 11 (5m of idle at 30s per scrape)", flaggedAt)
	}
	snap := f.scraper.Snapshot(t.Context())
	if e := snap.Endpoints[indexOf(snap, f.urls[0])]; !e.Flagged.Has(gpu.FlagKVLeak) || len(e.Checks) != 2 ||
		!e.Checks[0].Flagged || e.Checks[0].TimesFlagged != 1 || !strings.Contains(e.Checks[0].Detail, "KV cache 40% used") {
		t.Errorf("scraper snapshot %+v", e)
	}

	// Picking: with 90 requests held in flight, the flagged simulator gets a small share
	// (not none); with flags ignored it gets close to a third; with ejection none.
	const n = 90
	flagged, control := share(t, f.flagged, n, 0), share(t, f.control, n, 0)
	if flagged == 0 || flagged > 0.1 || control < 0.25 {
		t.Errorf("share of the leaking simulator: %.3f flagged, %.3f with flags ignored", flagged, control)
	}
	if got := share(t, f.eject, n, 0); got != 0 {
		t.Errorf("share with ejection: %.3f", got)
	}
	if st := f.eject.Snapshot()[0]; !st.Ejected || st.EjectionReason != "kv_leak" {
		t.Errorf("eject cluster: %+v", st)
	}
	if st := f.flagged.Snapshot()[0]; st.Ejected || st.EffectiveWeight != DefaultFlaggedWeight || strings.Join(st.Flags, ",") != "kv_leak" {
		t.Errorf("flagged cluster: %+v", st)
	}

	// The leak is freed (a restart): the next scrape clears the flag, and once the ejection
	// is over the simulator takes its share again.
	f.sims[0].SetKVLeak(0)
	if flags := f.poll(every); flags[0] != 0 {
		t.Fatalf("flags after the leak was freed: %v", flags)
	}
	if got := share(t, f.flagged, n, 0); math.Abs(got-1.0/3) > 0.02 {
		t.Errorf("share after clearing: %.3f", got)
	}
	f.poll(DefaultBaseEjection)
	if got := share(t, f.eject, n, 0); math.Abs(got-1.0/3) > 0.02 {
		t.Errorf("share after the ejection: %.3f", got)
	}
}

func TestPlantedStallThroughScraper(t *testing.T) {
	cfg := sim.Config{ITL: 2 * time.Millisecond, MaxRunning: 2}
	f := newSimFleet(t, gpu.Checks{}, cfg, cfg, cfg)
	// Busy: two long answers running on each simulator, nothing queued.
	for i := range f.sims {
		f.request(i, 30000, false)
		f.request(i, 30000, false)
	}
	f.until("every simulator busy", func() bool {
		for _, s := range f.sims {
			if s.Stats().Running != 2 {
				return false
			}
		}
		return true
	})
	const every = 2 * time.Second
	step := func() []gpu.Flags {
		base := f.sims[0].Stats().GenerationTokens
		f.until("tokens", func() bool { return f.sims[0].Stats().GenerationTokens >= base+20 })
		return f.poll(every)
	}
	for n := range 20 { // 40s of normal service: a window of history
		if flags := step(); flags[0]|flags[1]|flags[2] != 0 {
			t.Fatalf("scrape %d of normal service: flags %v", n, flags)
		}
	}

	// Stall: simulator 0's engine stops while a request joins its queue every scrape.
	f.sims[0].SetSlowdown(math.Inf(1))
	flaggedAt := 0
	for k := 1; k <= 20 && flaggedAt == 0; k++ {
		f.request(0, 50, false)
		f.until("the request queued", func() bool { return f.sims[0].Stats().Waiting == k })
		flags := f.poll(every)
		if flags[1]|flags[2] != 0 {
			t.Fatalf("a healthy simulator flagged: %v", flags)
		}
		if flags[0].Has(gpu.FlagKVLeak) {
			t.Fatalf("stall flagged as a leak: %v", flags[0])
		}
		if flags[0].Has(gpu.FlagStall) {
			flaggedAt = k
		}
	}
	// The queue must reach min_waiting (2) and stay there through half a window (15s)
	// before the stall is flagged: 2 + 15/2 scrapes, plus the history's granularity.
	if flaggedAt < 9 || flaggedAt > 13 {
		t.Fatalf("stall flagged on scrape %d of the stall, want 9..13", flaggedAt)
	}

	const n = 90
	flagged, control := share(t, f.flagged, n, 0), share(t, f.control, n, 0)
	if flagged == 0 || flagged > control/3 {
		t.Errorf("share of the stalled simulator: %.3f flagged, %.3f with flags ignored", flagged, control)
	}
	if got := share(t, f.eject, n, 0); got != 0 {
		t.Errorf("share with ejection: %.3f", got)
	}
	if st := f.eject.Snapshot()[0]; !st.Ejected || st.EjectionReason != "stall" {
		t.Errorf("eject cluster: %+v", st)
	}

	// Recovery: the engine runs again and the long answers end; the queue drains and the
	// flag clears on the next scrape.
	f.sims[0].SetSlowdown(1)
	f.cancel() // ends every stream, the queued ones too
	f.wg.Wait()
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.until("the queue drained", func() bool { return f.sims[0].Stats().Waiting == 0 })
	if flags := f.poll(every); flags[0] != 0 {
		t.Fatalf("flags after recovery: %v", flags)
	}
}

// TestOrdinaryTrafficNeverFlagged: an idle simulator, a busy one with its KV cache well
// used, and one that takes bursts that queue and drain are never flagged, with both checks
// set to react fast (a 10s leak, a 10s stall window). The simulators run in real time, so
// here the fake clock runs ten times faster than it (each scrape advances it by ten times
// the real time since the last one): rates seen by the checks are the simulators' own.
func TestOrdinaryTrafficNeverFlagged(t *testing.T) {
	checks := gpu.Checks{Leak: gpu.LeakCheck{For: 10 * time.Second}, Stall: gpu.StallCheck{Window: 10 * time.Second}}
	idle := sim.Config{ITL: 2 * time.Millisecond}
	busy := sim.Config{ITL: 2 * time.Millisecond, MaxRunning: 4, KVTokens: 32100}
	bursty := sim.Config{ITL: time.Millisecond, MaxRunning: 4, KVTokens: 4000}
	f := newSimFleet(t, checks, idle, busy, bursty)
	long := strings.Repeat("word ", 3200) // 4001 prompt tokens: 4 running hold half the cache, reserve all of it
	for range 4 {
		f.requestPrompt(1, long, 4000, false)
	}
	f.until("the busy simulator busy", func() bool { return f.sims[1].Stats().Running == 4 })
	sawQueue, sawHighKV := false, false
	last := time.Now()
	for n := range 40 {
		if n%12 == 4 { // a burst: 24 requests at once on a 4-slot server
			for range 24 {
				f.request(2, 40, false)
			}
			f.until("the burst queued", func() bool { return f.sims[2].Stats().Waiting > 0 })
		}
		// Paced by the busy simulator's progress (about 100ms of it), not by sleeping.
		base := f.sims[1].Stats().GenerationTokens
		f.until("tokens", func() bool { return f.sims[1].Stats().GenerationTokens >= base+200 })
		now := time.Now()
		flags := f.poll(10 * now.Sub(last))
		last = now
		for i, fl := range flags {
			if fl != 0 {
				t.Fatalf("scrape %d: simulator %d flagged %v on ordinary traffic", n, i, fl)
			}
		}
		l, _ := f.scraper.Get(f.urls[2])
		sawQueue = sawQueue || l.Waiting > 0
		l, _ = f.scraper.Get(f.urls[1])
		sawHighKV = sawHighKV || (l.KVCacheUsage >= 0.5 && l.Running == 4)
	}
	if !sawQueue || !sawHighKV {
		t.Errorf("the traffic was not what it should be: a queue seen %v, high KV while running seen %v", sawQueue, sawHighKV)
	}
	for _, e := range f.scraper.Snapshot(t.Context()).Endpoints {
		for _, c := range e.Checks {
			if c.TimesFlagged != 0 {
				t.Errorf("%s: %s flagged %d times", e.Endpoint, c.Check, c.TimesFlagged)
			}
		}
	}
}

func indexOf(s gpu.Snapshot, url string) int {
	for i, e := range s.Endpoints {
		if e.Endpoint == url {
			return i
		}
	}
	return -1
}
