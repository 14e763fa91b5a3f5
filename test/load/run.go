package load

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is one run.
type Config struct {
	Target   string // base URL (http://host:port) or a full .../v1/chat/completions URL
	Model    string
	APIKey   string
	Endpoint string // "chat" (default) or "completions"
	Workload *Workload

	Rate        float64       // open loop, req/s (sessions: session starts/s)
	Arrival     string        // poisson (default), constant, gamma
	Burstiness  float64       // gamma shape (vLLM --burstiness), default 1
	RampTo      float64       // linear ramp from Rate to RampTo over Duration
	Concurrency int           // closed loop: this many in flight (sessions: at once)
	Duration    time.Duration // stop scheduling after this (0: no limit)
	Requests    int           // stop after this many requests of the whole (0: no limit)
	TimeScale   float64       // multiplies trace timestamps (without Rate)
	SLO         SLO
	Shard       int // this shard (0-based) of Shards
	Shards      int
	Seed        uint64

	Abort    float64 // share of streams aborted mid-way
	Inflate  float64 // share of prompts inflated InflateK times
	InflateK int
	Perturb  float64 // share of prompt words replaced

	Timeout         time.Duration // per request (default 5m)
	MaxInFlight     int           // open-loop bound (default 10000); waiting for a slot shows as lag
	NoStream        bool
	NoIgnoreEOS     bool
	ContinuousUsage bool // ask vLLM's stream_options.continuous_usage_stats
	Client          *http.Client
	OnProgress      func(Live) // called about 4 times a second
}

// Live is the state of a running injection.
type Live struct {
	Elapsed          time.Duration
	Sent, Done, Errs int64
	InFlight         int64
	Total            int64 // expected requests (0: unknown)
	TTFTp50, TTFTp99 time.Duration
}

// DefaultRequests is used when neither Requests nor Duration is set and the workload is not
// a trace.
const DefaultRequests = 100

type engine struct {
	cfg      Config
	url      string
	client   *http.Client
	synth    *Synth
	col      *Collector
	sent     atomic.Int64
	inflight atomic.Int64
	spinning atomic.Bool // a goroutine spins out the end of a wait (waitUntil)
	wg       sync.WaitGroup
}

// spinWindow is how long before a send time waitUntil stops sleeping on a timer. Go's
// timers can wake up to 1 ms late when every P is idle (the netpoller's epoll timeout has
// millisecond resolution), which alone would put the scheduling lag near 1 ms; the last
// stretch is instead spent yielding (runtime.Gosched) until the send time. Only one
// goroutine of a run spins at once (the others sleep on their timers, which fire on time
// while the scheduler is kept busy). The cost is up to spinWindow of one CPU per send
// (all of one CPU above about 700 req/s).
const spinWindow = 1500 * time.Microsecond

// waitUntil waits until due; false when ctx ended first.
func (e *engine) waitUntil(ctx context.Context, timer *time.Timer, due time.Time) bool {
	for {
		d := time.Until(due)
		if d <= 0 {
			return ctx.Err() == nil
		}
		if d <= spinWindow && e.spinning.CompareAndSwap(false, true) {
			for time.Now().Before(due) {
				if ctx.Err() != nil {
					e.spinning.Store(false)
					return false
				}
				runtime.Gosched()
			}
			e.spinning.Store(false)
			return true
		}
		if d > spinWindow {
			d -= spinWindow
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
		}
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Target == "" {
		errs = append(errs, errors.New("target: required (--target URL: the OpenAI-compatible endpoint to load, e.g. http://127.0.0.1:8080)"))
	} else if err := CheckTarget(c.Target); err != nil {
		errs = append(errs, err)
	}
	if c.Workload == nil {
		errs = append(errs, errors.New("workload: required (--trace FILE, --synthetic SPEC or --sessions SPEC)"))
	}
	if c.Rate < 0 || c.Concurrency < 0 || c.Requests < 0 || c.Duration < 0 || c.RampTo < 0 {
		errs = append(errs, errors.New("rate, concurrency, requests, duration, ramp: must be >= 0"))
	}
	if c.Shards < 0 || (c.Shards > 0 && (c.Shard < 0 || c.Shard >= c.Shards)) {
		errs = append(errs, fmt.Errorf("shard %d/%d: want 0 <= i < n", c.Shard, c.Shards))
	}
	for _, p := range []float64{c.Abort, c.Inflate, c.Perturb} {
		if !(p >= 0 && p <= 1) {
			errs = append(errs, errors.New("abort, inflate, perturb: shares in [0, 1]"))
			break
		}
	}
	switch c.Arrival {
	case "", ArrivalPoisson, ArrivalConstant, ArrivalGamma:
	default:
		errs = append(errs, fmt.Errorf("arrival %q: want poisson, constant or gamma", c.Arrival))
	}
	if c.Workload != nil && c.Workload.Sessions == nil && c.Workload.Synthetic == nil && len(c.Workload.Items) == 0 {
		errs = append(errs, errors.New("workload: empty"))
	}
	if c.Workload != nil && c.Workload.Items == nil && c.Rate == 0 && c.Concurrency == 0 {
		errs = append(errs, errors.New("give a rate or a concurrency (only a trace has its own timestamps)"))
	}
	return errors.Join(errs...)
}

// CheckTarget reports whether target is an http:// or https:// URL with a host. Without a
// scheme ("127.0.0.1:8080", "localhost:8080") Go's HTTP client fails each request in
// confusing ways ("unsupported protocol scheme"), or parses the host as the scheme, so the
// error suggests the fix.
func CheckTarget(target string) error {
	u, err := url.Parse(target)
	switch {
	case err == nil && (u.Scheme == "http" || u.Scheme == "https"):
		if u.Hostname() == "" {
			return fmt.Errorf("--target %s has no host: want http://HOST:PORT, e.g. http://127.0.0.1:8080", target)
		}
		return nil
	case !strings.Contains(target, "://"):
		return fmt.Errorf("--target %s has no scheme: use http://%s", target, target)
	case err != nil:
		return fmt.Errorf("--target %s: %w", target, err)
	}
	return fmt.Errorf("--target %s: scheme %q, want http or https", target, u.Scheme)
}

func endpointURL(target, endpoint string) string {
	t := strings.TrimRight(target, "/")
	if strings.HasSuffix(t, "/completions") {
		return t
	}
	if !strings.HasSuffix(t, "/v1") {
		t += "/v1"
	}
	if endpoint == "completions" {
		return t + "/completions"
	}
	return t + "/chat/completions"
}

// Run sends cfg's workload and returns the report. Stopping ctx stops scheduling and
// cancels requests in flight; the report covers what was measured.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Shards == 0 {
		cfg.Shards = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 10000
	}
	if cfg.InflateK < 1 {
		cfg.InflateK = 10
	}
	if cfg.Requests == 0 && cfg.Duration == 0 && cfg.Workload.Items == nil && cfg.Workload.Sessions == nil {
		cfg.Requests = DefaultRequests
	}
	synth, err := NewSynth()
	if err != nil {
		return nil, err
	}
	e := &engine{cfg: cfg, url: endpointURL(cfg.Target, cfg.Endpoint), synth: synth, col: NewCollector(cfg.SLO)}
	e.client = cfg.Client
	if e.client == nil {
		tr := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns: 0, MaxIdleConnsPerHost: min(cfg.MaxInFlight, 4096), IdleConnTimeout: 90 * time.Second,
			ResponseHeaderTimeout: cfg.Timeout, DisableCompression: true}
		defer tr.CloseIdleConnections()
		e.client = &http.Client{Transport: tr}
	}
	start := time.Now()
	stopLive := e.live(start)
	switch {
	case cfg.Workload.Sessions != nil:
		e.runSessions(ctx, start)
	case cfg.Concurrency > 0 && cfg.Rate == 0:
		e.runClosed(ctx, start)
	default:
		e.runOpen(ctx, start)
	}
	e.wg.Wait()
	stopLive()
	r := e.col.Report()
	r.Meta = Meta{Target: cfg.Target, Model: cfg.Model, Workload: cfg.Workload.describe(), Load: cfg.describeLoad(),
		Started: start.UTC().Format(time.RFC3339), Tool: "sluice load"}
	if cfg.Shards > 1 {
		r.Meta.Shards = []string{fmt.Sprintf("%d/%d", cfg.Shard, cfg.Shards)}
	}
	return r, ctx.Err()
}

func (w *Workload) describe() string {
	switch {
	case w.Sessions != nil:
		s := w.Sessions
		return fmt.Sprintf("sessions n=%d turns=%d in=%s out=%s think=gamma:%g:%v", s.Sessions, s.Turns, s.In, s.Out, s.ThinkShape, s.ThinkScale)
	case w.Synthetic != nil:
		return fmt.Sprintf("synthetic in=%s out=%s", w.Synthetic.In, w.Synthetic.Out)
	}
	return fmt.Sprintf("trace %s, %d requests", w.Name, len(w.Items))
}

func (c *Config) describeLoad() string {
	var parts []string
	switch {
	case c.Concurrency > 0 && c.Rate == 0:
		parts = append(parts, fmt.Sprintf("closed loop, concurrency %d", c.Concurrency))
	case c.Rate > 0:
		a := c.Arrival
		if a == "" {
			a = ArrivalPoisson
		}
		if a == ArrivalGamma {
			a = fmt.Sprintf("gamma burstiness %g", c.Burstiness)
		}
		s := fmt.Sprintf("%s at %g req/s", a, c.Rate)
		if c.RampTo > 0 {
			s = fmt.Sprintf("%s ramping %g→%g req/s over %v", a, c.Rate, c.RampTo, c.Duration)
		}
		parts = append(parts, s)
	default:
		parts = append(parts, fmt.Sprintf("trace timestamps ×%g", max(c.TimeScale, 0)))
	}
	if c.Duration > 0 {
		parts = append(parts, "duration "+c.Duration.String())
	}
	if c.Requests > 0 {
		parts = append(parts, fmt.Sprintf("%d requests", c.Requests))
	}
	return strings.Join(parts, ", ")
}

func (e *engine) live(start time.Time) func() {
	if e.cfg.OnProgress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	total := int64(e.cfg.Requests)
	if total == 0 && e.cfg.Workload.Items != nil {
		total = int64(len(e.cfg.Workload.Items))
	}
	if total > 0 && e.cfg.Shards > 1 {
		total = (total + int64(e.cfg.Shards) - 1 - int64(e.cfg.Shard)) / int64(e.cfg.Shards)
	}
	report := func() {
		n, errs, p50, p99 := e.col.Live()
		e.cfg.OnProgress(Live{Elapsed: time.Since(start), Sent: e.sent.Load(), Done: n, Errs: errs,
			InFlight: e.inflight.Load(), Total: total, TTFTp50: p50, TTFTp99: p99})
	}
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				report()
				return
			case <-t.C:
				report()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// build turns item i into a call (prompt synthesis and client-side chaos).
func (e *engine) build(i int, it Item) *call {
	if it.Body != nil {
		return e.buildRecorded(i, it)
	}
	rng := rand.New(rand.NewPCG(e.cfg.Seed^0xc0ffee, uint64(i)))
	c := &call{index: i, maxTokens: max(it.OutputTokens, 1), input: it.InputTokens}
	var text string
	if it.Prompt != "" {
		text = it.Prompt
	} else {
		n := it.InputTokens
		if e.cfg.Inflate > 0 && rng.Float64() < e.cfg.Inflate {
			n *= e.cfg.InflateK
		}
		c.input = n
		text = e.synth.Text(n, it.HashIDs, e.cfg.Seed*1_000_003+uint64(i))
	}
	if e.cfg.Perturb > 0 {
		text = Perturb(text, e.cfg.Perturb, rng)
	}
	if e.cfg.Abort > 0 && rng.Float64() < e.cfg.Abort && c.maxTokens > 1 {
		c.abortAt = 1 + rng.IntN(c.maxTokens-1)
	}
	if e.cfg.Endpoint == "completions" {
		c.prompt = text
	} else {
		c.messages = []Message{{Role: "user", Content: text}}
	}
	return c
}

func (e *engine) mine(i int) bool { return i%e.cfg.Shards == e.cfg.Shard }

// launch sends c in its own goroutine.
func (e *engine) launch(ctx context.Context, c *call, scheduled time.Time, slots chan struct{}) {
	e.wg.Add(1)
	e.sent.Add(1)
	e.inflight.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() { <-slots }()
		res := e.do(ctx, c, scheduled)
		e.inflight.Add(-1)
		e.col.Add(res)
	}()
}

func (e *engine) runOpen(ctx context.Context, start time.Time) {
	w := e.cfg.Workload
	var p Pacer
	if e.cfg.Rate > 0 {
		rp := NewRatePacer(e.cfg.Rate, e.cfg.Arrival, e.cfg.Burstiness, e.cfg.Seed)
		if e.cfg.RampTo > 0 {
			rp.RampTo, rp.RampOver = e.cfg.RampTo, e.cfg.Duration
		}
		p = rp
	} else {
		p = &TracePacer{Items: w.Items, Scale: e.cfg.TimeScale}
	}
	slots := make(chan struct{}, e.cfg.MaxInFlight)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := 0; i < MaxTraceItems; i++ {
		if e.cfg.Requests > 0 && i >= e.cfg.Requests {
			return
		}
		at, ok := p.Next()
		if !ok || (e.cfg.Duration > 0 && at > e.cfg.Duration) {
			return
		}
		it, ok := w.item(i, e.cfg.Seed)
		if !ok {
			return
		}
		if !e.mine(i) {
			continue
		}
		c := e.build(i, it)
		if c.body == nil {
			c.body = e.encode(c) // before the send time: encoding is not scheduling lag
		}
		due := start.Add(at)
		if !e.waitUntil(ctx, timer, due) {
			return
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		e.launch(ctx, c, due, slots)
	}
}

func (e *engine) runClosed(ctx context.Context, start time.Time) {
	var next atomic.Int64
	deadline := time.Time{}
	if e.cfg.Duration > 0 {
		deadline = start.Add(e.cfg.Duration)
	}
	var wg sync.WaitGroup
	for range e.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if !deadline.IsZero() && time.Now().After(deadline) {
					return
				}
				i := int(next.Add(1) - 1)
				if i >= MaxTraceItems || (e.cfg.Requests > 0 && i >= e.cfg.Requests) {
					return
				}
				it, ok := e.cfg.Workload.item(i, e.cfg.Seed)
				if !ok {
					return
				}
				if !e.mine(i) {
					continue
				}
				c := e.build(i, it)
				e.sent.Add(1)
				e.inflight.Add(1)
				res := e.do(ctx, c, time.Now())
				e.inflight.Add(-1)
				e.col.Add(res)
			}
		}()
	}
	wg.Wait()
}
