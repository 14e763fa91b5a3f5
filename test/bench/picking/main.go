// Command picking compares least-in-flight and load-aware endpoint picking under skewed
// load. It starts four simulated model servers (test/sim, in-process on 127.0.0.1) with a
// vLLM-like performance model, drives extra background requests straight at the first so
// that its queue is many times the others', scrapes every server's /metrics (vLLM gauge
// names, parsed with expfmt) every 100 ms, and sends the same foreground workload
// (streaming chat requests at a fixed concurrency) through a proxy/upstream cluster picking
// least in-flight and through one picking load-aware, alternating the two in rounds so that
// drift on a noisy machine affects both alike. It prints TTFT p50/p99 side by side.
//
//	go run ./test/bench/picking [--rounds 3] [--requests 400] [--concurrency 32] [--background 30]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/test/bench/chatstream"
	"github.com/sluicegw/sluice/test/sim"
)

type options struct {
	rounds      int
	requests    int
	concurrency int
	background  int
	maxTokens   int
	scrape      time.Duration
	staleAfter  time.Duration
	ttft, itl   time.Duration
	maxRunning  int
	timeScale   float64
	warmup      time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; each runs both strategies, alternating which goes first")
	flag.IntVar(&o.requests, "requests", 400, "foreground streaming requests per strategy per round")
	flag.IntVar(&o.concurrency, "concurrency", 32, "foreground requests in flight")
	flag.IntVar(&o.background, "background", 30, "background requests kept in flight on endpoint 0 (sent to it directly)")
	flag.IntVar(&o.maxTokens, "max-tokens", 32, "mean output tokens per request (ignore_eos; uniform from half to 1.5 times)")
	flag.DurationVar(&o.scrape, "scrape", 100*time.Millisecond, "metrics scrape interval")
	flag.DurationVar(&o.staleAfter, "stale-after", 2*time.Second, "a scrape older than this is not used")
	flag.DurationVar(&o.ttft, "ttft", 20*time.Millisecond, "simulated prefill time per request")
	flag.DurationVar(&o.itl, "itl", 5*time.Millisecond, "simulated decode step time")
	flag.IntVar(&o.maxRunning, "max-running", 8, "simulated max running sequences per server")
	flag.Float64Var(&o.timeScale, "time-scale", 1, "simulator TimeScale")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "background load before the first round")
	flag.Parse()
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "picking:", err)
		os.Exit(1)
	}
}

const nServers = 4

func run(o options, out io.Writer) error {
	if o.rounds < 1 || o.requests < 1 || o.concurrency < 1 || o.background < 0 {
		return errors.New("rounds, requests and concurrency must be at least 1, background at least 0")
	}
	cfg := sim.Config{TTFT: o.ttft, ITL: o.itl, MaxRunning: o.maxRunning, TimeScale: o.timeScale, Seed: 1}
	var urls []string
	for range nServers {
		s := sim.New(cfg)
		ts := httptest.NewServer(s)
		defer s.Close()
		defer ts.Close()
		urls = append(urls, ts.URL)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	scr := newScraper(urls, o.scrape, o.staleAfter, client)
	wg.Go(func() { scr.run(ctx) })

	// Bodies of varied lengths (max_tokens from half to 1.5 times --max-tokens, ignore_eos),
	// so that requests do not start and end in lockstep.
	var bodies [][]byte
	for n := max(o.maxTokens/2, 1); n <= o.maxTokens*3/2; n++ {
		bodies = append(bodies, fmt.Appendf(nil, `{"model":"sim-llama","stream":true,"max_tokens":%d,"ignore_eos":true,`+
			`"messages":[{"role":"user","content":"Summarise the state of the cluster in a few words."}]}`, n))
	}
	var seq atomic.Uint64
	body := func() []byte { return bodies[(seq.Add(1)*0x9e3779b97f4a7c15>>32)%uint64(len(bodies))] }
	for range o.background {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = chatstream.TTFT(ctx, client, urls[0], body())
			}
		})
	}

	clusters := map[string]*upstream.Cluster{}
	for _, st := range []string{upstream.StrategyLeastInFlight, upstream.StrategyLoadAware} {
		eps := make([]upstream.EndpointSpec, len(urls))
		for i, u := range urls {
			eps[i] = upstream.EndpointSpec{URL: u, MetricsURL: u + "/metrics"}
		}
		cl, err := upstream.NewCluster(upstream.Options{
			Name: st, Endpoints: eps, Load: scr,
			Picking: upstream.Picking{Strategy: st},
		})
		if err != nil {
			return err
		}
		defer cl.Close()
		clusters[st] = cl
	}

	fmt.Fprintf(out, "4 simulators (TTFT %v, ITL %v, MaxRunning %d, TimeScale %g); %d background streams on endpoint 0; "+
		"foreground %d streaming requests x %d tokens at concurrency %d per strategy per round; scrape every %v\n",
		o.ttft, o.itl, o.maxRunning, o.timeScale, o.background, o.requests, o.maxTokens, o.concurrency, o.scrape)
	time.Sleep(o.warmup)

	all := map[string]*result{}
	order := []string{upstream.StrategyLeastInFlight, upstream.StrategyLoadAware}
	fmt.Fprintf(out, "\n%-6s %-15s %9s %9s %9s %8s  %-28s %s\n", "round", "strategy", "p50", "p99", "max", "errors", "share of requests per endpoint", "mean queue (waiting) per endpoint")
	for r := range o.rounds {
		for _, st := range order {
			res := foreground(ctx, o, clusters[st], client, body, scr)
			if all[st] == nil {
				all[st] = &result{share: make([]int, nServers), waiting: make([]float64, nServers)}
			}
			all[st].merge(res)
			fmt.Fprintf(out, "%-6d %-15s %9s %9s %9s %8d  %-28s %s\n", r+1, st,
				ms(res.pct(0.50)), ms(res.pct(0.99)), ms(res.pct(1)), res.errors, shares(res.share), queues(res.waiting, res.samples))
		}
		slices.Reverse(order)
	}
	fmt.Fprintf(out, "\nall rounds (%d requests per strategy):\n", o.rounds*o.requests)
	fmt.Fprintf(out, "%-15s %9s %9s %9s %8s  %-28s %s\n", "strategy", "TTFT p50", "TTFT p99", "max", "errors", "share per endpoint", "mean queue per endpoint")
	for _, st := range []string{upstream.StrategyLeastInFlight, upstream.StrategyLoadAware} {
		res := all[st]
		fmt.Fprintf(out, "%-15s %9s %9s %9s %8d  %-28s %s\n", st, ms(res.pct(0.50)), ms(res.pct(0.99)), ms(res.pct(1)),
			res.errors, shares(res.share), queues(res.waiting, res.samples))
	}
	for _, st := range []string{upstream.StrategyLeastInFlight, upstream.StrategyLoadAware} {
		fmt.Fprintf(out, "picks %-15s %+v\n", st, clusters[st].PickStats())
	}
	return nil
}

type result struct {
	ttft    []time.Duration
	errors  int
	share   []int
	waiting []float64 // sum of sampled queue lengths per endpoint
	samples int
}

func (r *result) merge(o *result) {
	r.ttft = append(r.ttft, o.ttft...)
	r.errors += o.errors
	for i := range r.share {
		r.share[i] += o.share[i]
		r.waiting[i] += o.waiting[i]
	}
	r.samples += o.samples
}

func (r *result) pct(p float64) time.Duration {
	if len(r.ttft) == 0 {
		return 0
	}
	s := slices.Clone(r.ttft)
	slices.Sort(s)
	i := min(int(p*float64(len(s))), len(s)-1)
	return s[i]
}

// foreground sends o.requests streaming requests at o.concurrency through cl and measures
// TTFT; meanwhile it samples each server's queue as scraped.
func foreground(ctx context.Context, o options, cl *upstream.Cluster, client *http.Client, body func() []byte, scr *scraper) *result {
	res := &result{share: make([]int, nServers), waiting: make([]float64, nServers)}
	var mu sync.Mutex
	var next atomic.Int64
	eps := cl.Endpoints()
	done := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(o.scrape)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			mu.Lock()
			for i, e := range eps {
				if l, ok := scr.Get(e.String()); ok {
					res.waiting[i] += l.Waiting
				}
			}
			res.samples++
			mu.Unlock()
		}
	})
	var wg sync.WaitGroup
	for range o.concurrency {
		wg.Go(func() {
			for next.Add(1) <= int64(o.requests) {
				e, err := cl.PickFor(nil, upstream.Hint{})
				if err != nil {
					mu.Lock()
					res.errors++
					mu.Unlock()
					continue
				}
				e.Begin()
				ttft, err := chatstream.TTFT(ctx, client, e.String(), body())
				e.End()
				mu.Lock()
				if err != nil {
					res.errors++
				} else {
					res.ttft = append(res.ttft, ttft)
					res.share[slices.Index(eps, e)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(done)
	sampler.Wait()
	return res
}

// scraper polls each server's /metrics and keeps the vLLM load gauges of the last
// successful scrape. It is the experiment's upstream.LoadSource (package gpu provides the
// gateway's).
type scraper struct {
	urls     []string
	interval time.Duration
	stale    time.Duration
	client   *http.Client
	snap     atomic.Pointer[map[string]sample] // endpoint URL → last good scrape
}

type sample struct {
	load upstream.Load
	at   time.Time
}

func newScraper(urls []string, interval, stale time.Duration, client *http.Client) *scraper {
	s := &scraper{urls: urls, interval: interval, stale: stale, client: client}
	s.snap.Store(&map[string]sample{})
	return s
}

// Get implements upstream.LoadSource.
func (s *scraper) Get(url string) (upstream.Load, bool) {
	sm, ok := (*s.snap.Load())[url]
	if !ok || time.Since(sm.at) > s.stale {
		return upstream.Load{}, false
	}
	return sm.load, true
}

func (s *scraper) run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		next := maps(*s.snap.Load())
		for _, u := range s.urls {
			if l, err := s.scrape(ctx, u+"/metrics"); err == nil {
				next[u] = sample{load: l, at: time.Now()}
			}
		}
		s.snap.Store(&next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func maps(m map[string]sample) map[string]sample {
	out := make(map[string]sample, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *scraper) scrape(ctx context.Context, url string) (upstream.Load, error) {
	ctx, cancel := context.WithTimeout(ctx, s.interval)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return upstream.Load{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return upstream.Load{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return upstream.Load{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return upstream.Load{}, err
	}
	gauge := func(names ...string) (float64, bool) {
		for _, n := range names {
			if f, ok := fams[n]; ok {
				v := 0.0
				for _, m := range f.GetMetric() {
					v += m.GetGauge().GetValue()
				}
				return v, true
			}
		}
		return 0, false
	}
	var l upstream.Load
	var ok1, ok2, ok3 bool
	l.Waiting, ok1 = gauge("vllm:num_requests_waiting")
	l.Running, ok2 = gauge("vllm:num_requests_running")
	l.KVCacheUsage, ok3 = gauge("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
	if !ok1 || !ok2 || !ok3 {
		return upstream.Load{}, errors.New("vllm gauges missing")
	}
	return l, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func shares(n []int) string {
	total := 0
	for _, x := range n {
		total += x
	}
	parts := make([]string, len(n))
	for i, x := range n {
		parts[i] = fmt.Sprintf("%.0f%%", 100*float64(x)/float64(max(total, 1)))
	}
	return strings.Join(parts, " ")
}

func queues(sum []float64, samples int) string {
	parts := make([]string, len(sum))
	for i, x := range sum {
		parts[i] = fmt.Sprintf("%.1f", x/float64(max(samples, 1)))
	}
	return strings.Join(parts, " ")
}
