package gpu

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/sim"
)

// TestScraperSimulator proves the default names match what the simulator (vLLM's names)
// serves: a queue builds up behind a one-slot server and the scraper sees it.
func TestScraperSimulator(t *testing.T) {
	srv := sim.New(sim.Config{ITL: 20 * time.Millisecond, MaxRunning: 1, KVTokens: 1000})
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); srv.Close() })

	s := &Scraper{Interval: 5 * time.Millisecond}
	s.Set(map[string]string{ts.URL: ts.URL + "/metrics"})
	startScraper(t, s)

	waitFor(t, 5*time.Second, "an idle load", func() bool { _, ok := s.Get(ts.URL); return ok })
	if l, _ := s.Get(ts.URL); l.Waiting != 0 || l.Running != 0 || l.KVCacheUsage != 0 {
		t.Fatalf("idle server: load %+v", l)
	}

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	body := `{"model":"sim-llama","messages":[{"role":"user","content":"hello there"}],"max_tokens":200,"ignore_eos":true}`
	for range 3 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := ts.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	var last Load
	waitFor(t, 5*time.Second, "waiting, running and KV use to show", func() bool {
		last, _ = s.Get(ts.URL)
		return last.Waiting == 2 && last.Running == 1 && last.KVCacheUsage > 0
	})
	if last.KVCacheUsage > 1 {
		t.Errorf("KV usage %v > 1", last.KVCacheUsage)
	}
}

func TestScraperFailuresCounted(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		page    string
		maxBody int64
		err     string
	}{
		{name: "malformed", status: 200, page: "vllm:num_requests_waiting{oops 1\n", err: "parse metrics"},
		{name: "not metrics", status: 200, page: "<html>hello</html>", err: "no load metrics"},
		{name: "status 500", status: 500, page: vllmPage, err: "status 500"},
		{name: "too large", status: 200, page: vllmPage, maxBody: 100, err: "larger than 100 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPageServer(t, "")
			p.set(tc.status, tc.page)
			s := &Scraper{Interval: 5 * time.Millisecond, MaxBody: tc.maxBody}
			s.Set(map[string]string{"ep": p.metricsURL()})
			startScraper(t, s)
			var st EndpointStatus
			waitFor(t, 5*time.Second, "two failures", func() bool {
				st = s.Snapshot(t.Context()).Endpoints[0]
				return st.Failures >= 2
			})
			if _, ok := s.Get("ep"); ok {
				t.Error("Get ok after only failures")
			}
			if !strings.Contains(st.LastError, tc.err) || st.LastErrorAt.IsZero() || st.Load != nil || st.Scrapes < st.Failures {
				t.Errorf("status %+v, want last error containing %q", st, tc.err)
			}
			// The endpoint recovers once it serves a good (and small) page.
			p.set(200, "vllm:num_requests_waiting 1\n")
			waitFor(t, 5*time.Second, "recovery", func() bool { _, ok := s.Get("ep"); return ok })
		})
	}
}

func TestScraperTimeout(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(ts.Close)
	defer close(release)
	s := &Scraper{Interval: 5 * time.Millisecond, Timeout: 20 * time.Millisecond}
	s.Set(map[string]string{"ep": ts.URL})
	startScraper(t, s)
	waitFor(t, 5*time.Second, "a timed-out scrape", func() bool {
		st := s.Snapshot(t.Context()).Endpoints[0]
		return st.Failures >= 1 && strings.Contains(st.LastError, "deadline exceeded")
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestScraperStaleness(t *testing.T) {
	t.Run("injected clock", func(t *testing.T) {
		p := newPageServer(t, vllmPage)
		clk := newFakeClock()
		s := &Scraper{Interval: 5 * time.Millisecond, Staleness: 2 * time.Second, Clock: clk}
		s.Set(map[string]string{"ep": p.metricsURL()})
		startScraper(t, s)
		waitFor(t, 5*time.Second, "a load", func() bool { _, ok := s.Get("ep"); return ok })
		p.set(500, "down")
		n := p.hits.Load()
		waitFor(t, 5*time.Second, "a failing scrape", func() bool { return p.hits.Load() >= n+2 })

		clk.Advance(2 * time.Second) // exactly the limit: still fresh
		if _, ok := s.Get("ep"); !ok {
			t.Error("stale at exactly Staleness")
		}
		clk.Advance(time.Millisecond)
		if l, ok := s.Get("ep"); ok {
			t.Errorf("Get = %+v, true after Staleness", l)
		}
		st := s.Snapshot(t.Context())
		if e := st.Endpoints[0]; e.Fresh || e.Load == nil || e.Age != 2*time.Second+time.Millisecond {
			t.Errorf("snapshot %+v", e)
		}
		// A good scrape makes it fresh again.
		p.set(200, vllmPage)
		waitFor(t, 5*time.Second, "fresh again", func() bool { _, ok := s.Get("ep"); return ok })
	})
	t.Run("real clock", func(t *testing.T) {
		p := newPageServer(t, vllmPage)
		s := &Scraper{Interval: 5 * time.Millisecond, Staleness: 50 * time.Millisecond}
		s.Set(map[string]string{"ep": p.metricsURL()})
		startScraper(t, s)
		waitFor(t, 5*time.Second, "a load", func() bool { _, ok := s.Get("ep"); return ok })
		l0, _ := s.Get("ep")
		p.set(200, "garbage")
		// Measured from the last good scrape (a scrape can land just before the page
		// turns to garbage, or well before it on a busy machine), not from p.set.
		last := l0.At
		waitFor(t, 5*time.Second, "staleness", func() bool {
			l, ok := s.Get("ep")
			if ok {
				last = l.At
			}
			return !ok
		})
		if d := time.Since(last); d < 50*time.Millisecond {
			t.Errorf("went stale %v after the last good scrape, before Staleness", d)
		}
	})
}

func TestScraperSet(t *testing.T) {
	a, b := newPageServer(t, vllmPage), newPageServer(t, vllmPage)
	s := &Scraper{Interval: 5 * time.Millisecond}
	s.Set(map[string]string{"a": a.metricsURL(), "b": b.metricsURL(), "none": ""})
	startScraper(t, s)
	waitFor(t, 5*time.Second, "both polled", func() bool {
		_, okA := s.Get("a")
		_, okB := s.Get("b")
		return okA && okB
	})
	if _, ok := s.Get("none"); ok {
		t.Error("endpoint without metrics URL has a load")
	}
	before := (*s.eps.Load())["a"]

	// Same set again: state (and poller) kept.
	s.Set(map[string]string{"a": a.metricsURL(), "b": b.metricsURL()})
	if got := (*s.eps.Load())["a"]; got != before {
		t.Error("state of a replaced by an identical Set")
	}

	// Remove b, add c.
	c := newPageServer(t, vllmPage)
	s.Set(map[string]string{"a": a.metricsURL(), "c": c.metricsURL()})
	time.Sleep(20 * time.Millisecond) // a scrape of b cancelled by Set may still land
	bHits := b.hits.Load()
	if _, ok := s.Get("b"); ok {
		t.Error("removed endpoint still has a load")
	}
	aHits := a.hits.Load()
	waitFor(t, 5*time.Second, "a and c polled", func() bool {
		_, ok := s.Get("c")
		return ok && a.hits.Load() >= aHits+3
	})
	if got := b.hits.Load(); got != bHits {
		t.Errorf("removed endpoint polled %d more times", got-bHits)
	}
	eps := s.Snapshot(t.Context()).Endpoints
	if len(eps) != 2 || eps[0].Endpoint != "a" || eps[1].Endpoint != "c" {
		t.Errorf("snapshot endpoints %+v", eps)
	}

	// A changed metrics URL starts afresh: the old load is not carried over.
	down := newPageServer(t, "")
	down.set(500, "")
	s.Set(map[string]string{"a": down.metricsURL()})
	if _, ok := s.Get("a"); ok {
		t.Error("load kept across a metrics URL change")
	}
	waitFor(t, 5*time.Second, "the new URL polled", func() bool { return down.hits.Load() > 0 })
	if _, ok := s.Get("a"); ok {
		t.Error("load from a failing URL")
	}

	// Empty set: nothing polled.
	s.Set(nil)
	time.Sleep(20 * time.Millisecond) // scrapes cancelled by Set may still land
	aHits, dHits, cHits := a.hits.Load(), down.hits.Load(), c.hits.Load()
	time.Sleep(30 * time.Millisecond)
	if a.hits.Load() != aHits || down.hits.Load() != dHits || c.hits.Load() != cHits {
		t.Error("endpoints polled after Set(nil)")
	}
}

func TestScraperLifecycle(t *testing.T) {
	p := newPageServer(t, vllmPage)

	t.Run("set before and after start", func(t *testing.T) {
		s := &Scraper{Interval: 5 * time.Millisecond}
		s.Set(map[string]string{"a": p.metricsURL()})
		if _, ok := s.Get("a"); ok {
			t.Error("load before Start")
		}
		startScraper(t, s)
		waitFor(t, 5*time.Second, "a", func() bool { _, ok := s.Get("a"); return ok })
		s.Set(map[string]string{"a": p.metricsURL(), "b": p.metricsURL()})
		waitFor(t, 5*time.Second, "b", func() bool { _, ok := s.Get("b"); return ok })
	})
	t.Run("start twice, after close, close twice", func(t *testing.T) {
		s := &Scraper{}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Start(t.Context()); err == nil {
			t.Error("Start after Close succeeded")
		}
		s = &Scraper{}
		startScraper(t, s)
		if err := s.Start(t.Context()); err == nil {
			t.Error("second Start succeeded")
		}
		_ = s.Close()
		_ = s.Close()
		// A scrape cancelled by Close (or by an earlier subtest's scraper) may still reach the
		// server after it: let those land before counting.
		time.Sleep(20 * time.Millisecond)
		n := p.hits.Load()
		s.Set(map[string]string{"a": p.metricsURL()}) // after Close: not polled
		time.Sleep(20 * time.Millisecond)
		if p.hits.Load() != n {
			t.Error("polled after Close")
		}
	})
	t.Run("context ends the pollers", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		s := &Scraper{Interval: 5 * time.Millisecond}
		s.Set(map[string]string{"a": p.metricsURL()})
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "a", func() bool { _, ok := s.Get("a"); return ok })
		cancel()
		_ = s.Close() // waits for the pollers
		if got := s.Snapshot(t.Context()).Endpoints[0].Failures; got != 0 {
			t.Errorf("cancellation counted as %d failures", got)
		}
	})
	t.Run("bad names", func(t *testing.T) {
		s := &Scraper{Names: Names{Waiting: []string{"bad name"}}}
		if err := s.Start(t.Context()); err == nil {
			t.Error("Start with bad names succeeded")
		}
	})
	t.Run("tgi names", func(t *testing.T) {
		tgi := newPageServer(t, "tgi_queue_size 4\ntgi_batch_current_size 2\n")
		s := &Scraper{Interval: 5 * time.Millisecond, Names: TGI}
		s.Set(map[string]string{"t": tgi.metricsURL()})
		startScraper(t, s)
		waitFor(t, 5*time.Second, "tgi load", func() bool {
			l, ok := s.Get("t")
			return ok && l.Waiting == 4 && l.Running == 2
		})
	})
}

func TestScraperSnapshotAndScrapeOnce(t *testing.T) {
	p := newPageServer(t, vllmPage)
	f := &Fake{}
	f.SetDevices([]Device{{Index: 0, Name: "NVIDIA H100 80GB HBM3", UtilizationGPU: 0.5}}, nil)
	clk := newFakeClock()
	s := &Scraper{Interval: 5 * time.Millisecond, Devices: f, Clock: clk}
	s.Set(map[string]string{"ep": p.metricsURL()})
	startScraper(t, s)
	waitFor(t, 5*time.Second, "a load", func() bool { _, ok := s.Get("ep"); return ok })
	snap := s.Snapshot(t.Context())
	if snap.DeviceSource != "fake" || len(snap.Devices) != 1 || snap.DevicesError != "" || len(snap.Endpoints) != 1 ||
		!snap.Endpoints[0].Fresh || snap.Endpoints[0].Load.Waiting != 3 {
		t.Fatalf("snapshot %+v", snap)
	}
	if _, err := json.Marshal(snap); err != nil {
		t.Fatal(err)
	}
	f.SetDevices(nil, ErrUnavailable)
	if snap := s.Snapshot(t.Context()); snap.DevicesError == "" {
		t.Error("device error not shown")
	}

	loads, errs := (&Scraper{Timeout: time.Second}).ScrapeOnce(t.Context(), []string{p.metricsURL(), "http://127.0.0.1:1/metrics", "::bad"})
	if errs[0] != nil || loads[0].Running != 5 || loads[0].At.IsZero() {
		t.Errorf("ScrapeOnce[0] = %+v, %v", loads[0], errs[0])
	}
	if errs[1] == nil || errs[2] == nil {
		t.Errorf("ScrapeOnce errors %v", errs)
	}
	_, errs = (&Scraper{Names: Names{Waiting: []string{"x{"}}}).ScrapeOnce(t.Context(), []string{p.metricsURL()})
	if errs[0] == nil {
		t.Error("ScrapeOnce with bad names succeeded")
	}
}

func TestFake(t *testing.T) {
	clk := newFakeClock()
	f := &Fake{Staleness: time.Second, Clock: clk}
	var _ Loads = f
	if _, ok := f.Get("a"); ok {
		t.Error("unset load found")
	}
	f.SetLoad("a", Load{Waiting: 1})
	if l, ok := f.Get("a"); !ok || l.Waiting != 1 || !l.At.Equal(clk.Now()) {
		t.Errorf("Get = %+v, %v", l, ok)
	}
	clk.Advance(2 * time.Second)
	if _, ok := f.Get("a"); ok {
		t.Error("stale load returned")
	}
	f.SetLoad("a", Load{Waiting: 2})
	f.RemoveLoad("a")
	if _, ok := f.Get("a"); ok {
		t.Error("removed load returned")
	}
	devs := []Device{{Index: 0}}
	f.SetDevices(devs, nil)
	devs[0].Index = 9
	got, err := f.Devices(t.Context())
	if err != nil || len(got) != 1 || got[0].Index != 0 || f.Name() != "fake" {
		t.Errorf("Devices = %+v, %v", got, err)
	}
	f.SetDevices(nil, ErrUnavailable)
	if _, err := f.Devices(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("err = %v", err)
	}
}

// TestGetDoesNotAllocate guards the hot path.
func TestGetDoesNotAllocate(t *testing.T) {
	s := scraperWithLoads(64)
	now := time.Now()
	if n := testing.AllocsPerRun(1000, func() { s.Get("http://10.0.0.7:8000"); s.GetAt("http://10.0.0.8:8000", now) }); n != 0 {
		t.Errorf("Get allocates %v times", n)
	}
	if _, ok := s.Get("http://10.0.0.7:8000"); !ok {
		t.Error("no load")
	}
}

// scraperWithLoads returns a Scraper (not started) with n endpoints holding a fresh load.
func scraperWithLoads(n int) *Scraper {
	s := &Scraper{}
	m := map[string]string{}
	for i := range n {
		ep := "http://10.0.0." + itoa(i) + ":8000"
		m[ep] = ep + "/metrics"
	}
	s.Set(m)
	for _, e := range *s.eps.Load() {
		e.load.Store(&Load{Waiting: 1, Running: 2, KVCacheUsage: 0.3, At: time.Now().Add(time.Hour)})
	}
	return s
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// BenchmarkGet is the hot-path lookup; most of it is reading the clock (time.Now).
func BenchmarkGet(b *testing.B) {
	s := scraperWithLoads(64)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := s.Get("http://10.0.0.42:8000"); !ok {
			b.Fatal("no load")
		}
	}
}

// BenchmarkGetAt is the lookup with the time read once elsewhere (per pick).
func BenchmarkGetAt(b *testing.B) {
	s := scraperWithLoads(64)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := s.GetAt("http://10.0.0.42:8000", now); !ok {
			b.Fatal("no load")
		}
	}
}

func TestPoll(t *testing.T) {
	p := newPageServer(t, vllmPage+"vllm:generation_tokens_total 7\n")
	clk := newFakeClock()
	s := &Scraper{Clock: clk, Interval: time.Hour}
	s.Set(map[string]string{"b": p.metricsURL(), "a": p.metricsURL()})
	if snap := s.Snapshot(t.Context()); len(snap.Endpoints[0].Checks) != 0 {
		t.Errorf("checks shown before any poll: %+v", snap.Endpoints[0])
	}
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if p.hits.Load() != 2 {
		t.Errorf("one Poll scraped %d times, want once per endpoint", p.hits.Load())
	}
	l, ok := s.Get("a")
	if !ok || l.Waiting != 3 || l.Throughput != 7 || !l.At.Equal(clk.Now()) || l.Flags != 0 {
		t.Errorf("after Poll: %+v, %v", l, ok)
	}
	snap := s.Snapshot(t.Context())
	if e := snap.Endpoints[0]; len(e.Checks) != 2 || e.Checks[0].Check != "kv_leak" || e.Checks[1].Check != "stall" || e.Scrapes != 1 {
		t.Errorf("snapshot after Poll: %+v", e)
	}
	// Pollers and Poll together (run with -race).
	s.Interval = 2 * time.Millisecond
	startScraper(t, s)
	for range 20 {
		if err := s.Poll(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Poll(ctx); err != nil {
		t.Errorf("Poll with a done context: %v", err)
	}
	_ = s.Close()
	if err := s.Poll(t.Context()); err == nil {
		t.Error("Poll after Close succeeded")
	}
	if err := (&Scraper{Names: Names{Waiting: []string{"bad name"}}}).Poll(t.Context()); err == nil {
		t.Error("Poll with bad names succeeded")
	}
	checks := &Scraper{Checks: Checks{Disabled: true}}
	checks.Set(map[string]string{"a": p.metricsURL()})
	if err := checks.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e := checks.Snapshot(t.Context()).Endpoints[0]; e.Checks != nil {
		t.Errorf("checks shown while disabled: %+v", e.Checks)
	}
}
