package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy/clock"
)

// Scraper defaults.
const (
	DefaultInterval  = 250 * time.Millisecond // the Kubernetes inference extension uses 50 ms
	DefaultTimeout   = 1 * time.Second
	DefaultStaleness = 2 * time.Second
	DefaultMaxBody   = 8 << 20
)

// Scraper polls each endpoint's Prometheus metrics URL and keeps the last good Load per
// endpoint; Get reads it without locks or allocation. Each good scrape also runs the state
// checks (Checks: a KV-cache leak, a stall) on a short history of the endpoint's samples
// (fixed size), and the Load carries the flags they raise; entering and leaving a flag is
// logged on Logger.
//
// Set the exported fields before the first call to any method; zero values take the defaults.
// Start runs the pollers (one goroutine per endpoint, each with at most one request in
// flight) until its context ends or Close is called. Set may be called at any time, before or
// after Start, to change the endpoints (a config reload): endpoints kept with the same metrics
// URL keep their state and poller, removed ones are stopped before Set returns.
type Scraper struct {
	Interval  time.Duration // time between scrapes of one endpoint (default 250 ms)
	Timeout   time.Duration // per scrape, connect to end of body (default 1 s)
	Staleness time.Duration // Get reports a load only this long after its scrape (default 2 s)
	Names     Names         // metric names (default VLLM)
	MaxBody   int64         // bytes read of a metrics page at most (default 8 MiB)
	Client    *http.Client  // default: a private client without proxy, keep-alives on
	Clock     clock.Clock   // stamps Load.At and judges freshness (default the system clock)
	Devices   Source        // local devices shown by Snapshot; nil for none
	Checks    Checks        // model-server state checks (default: both on, default thresholds)
	Logger    *slog.Logger  // flags entered and left; default: discard

	eps atomic.Pointer[map[string]*endpoint] // endpoint URL → state, replaced whole by Set

	mu      sync.Mutex // guards what follows; never held on the hot path
	started bool
	closed  bool
	ctx     context.Context // pollers' parent, set by Start
	cancel  context.CancelFunc
	names   *compiledNames
	client  *http.Client
	checks  *Checks // Checks with defaults, nil when disabled; set by prepare
	log     *slog.Logger
	wg      sync.WaitGroup
}

var _ Loads = (*Scraper)(nil)

// endpoint is the state of one polled endpoint.
type endpoint struct {
	url, metricsURL string
	load            atomic.Pointer[Load] // last good scrape; nil before the first
	scrapes         atomic.Uint64        // attempts finished (good or bad)
	failures        atomic.Uint64

	errMu     sync.Mutex
	lastErr   string
	lastErrAt time.Time

	checkMu sync.Mutex // guards chk: held by a scrape's checks and by Snapshot
	chk     checker

	cancel context.CancelFunc // stops the poller; nil while none runs
	done   chan struct{}      // closed when the poller has returned
}

// Get returns endpoint's last load if its scrape is no older than Staleness. It does not
// allocate; reading the clock is most of its cost, so callers looking at many endpoints at
// once use GetAt.
func (s *Scraper) Get(endpoint string) (Load, bool) { return s.GetAt(endpoint, s.now()) }

// GetAt is Get with the current time given (read once per pick, not once per endpoint).
func (s *Scraper) GetAt(endpoint string, now time.Time) (Load, bool) {
	m := s.eps.Load()
	if m == nil {
		return Load{}, false
	}
	e := (*m)[endpoint]
	if e == nil {
		return Load{}, false
	}
	l := e.load.Load()
	if l == nil || now.Sub(l.At) > s.staleness() {
		return Load{}, false
	}
	return *l, true
}

// Set replaces the endpoints to poll: endpoint URL → its metrics URL (an empty metrics URL
// means the endpoint is not polled). Pollers of removed or changed endpoints have stopped when
// Set returns.
func (s *Scraper) Set(endpoints map[string]string) {
	s.mu.Lock()
	old := s.eps.Load()
	next := make(map[string]*endpoint, len(endpoints))
	for ep, murl := range endpoints {
		if murl == "" {
			continue
		}
		if old != nil {
			if e := (*old)[ep]; e != nil && e.metricsURL == murl {
				next[ep] = e
				continue
			}
		}
		e := &endpoint{url: ep, metricsURL: murl}
		next[ep] = e
		if s.running() {
			s.launch(e)
		}
	}
	s.eps.Store(&next)
	var stopped []chan struct{}
	if old != nil {
		for ep, e := range *old {
			if next[ep] == e {
				continue
			}
			if e.cancel != nil {
				e.cancel()
				stopped = append(stopped, e.done)
			}
		}
	}
	s.mu.Unlock()
	for _, done := range stopped {
		<-done
	}
}

// Start starts polling every endpoint set so far, and those Set adds later, until ctx ends
// or Close is called. It fails if Names is invalid or the Scraper was started or closed.
func (s *Scraper) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return errors.New("gpu: Scraper started twice or after Close")
	}
	if err := s.prepare(); err != nil {
		return err
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.started = true
	if m := s.eps.Load(); m != nil {
		for _, e := range *m {
			s.launch(e)
		}
	}
	return nil
}

// prepare compiles the names, resolves the checks and builds the client, once; s.mu held.
func (s *Scraper) prepare() error {
	if s.names != nil {
		return nil
	}
	names := s.Names
	if len(names.Waiting)+len(names.Running)+len(names.KVCache)+len(names.Throughput) == 0 {
		names = VLLM
	}
	c, err := names.compile()
	if err := errors.Join(err, s.Checks.Validate()); err != nil {
		return err
	}
	if !s.Checks.Disabled {
		checks := s.Checks.withDefaults()
		s.checks = &checks
	}
	s.log = s.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.client = s.Client
	if s.client == nil {
		s.client = &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: s.timeout(), KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	s.names = c
	return nil
}

// Poll scrapes every endpoint once now, one after the other, and records the results as
// the pollers do (loads, failures, checks); it returns when all are done or ctx ends. It is
// for callers that drive scraping themselves, such as tests on an injected clock, and does
// not need Start (with pollers running too, an endpoint is scraped once more). It fails
// only if Names or Checks are invalid, or the Scraper was closed.
func (s *Scraper) Poll(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("gpu: Poll after Close")
	}
	err := s.prepare()
	names, client := s.names, s.client
	s.mu.Unlock()
	if err != nil {
		return err
	}
	m := s.eps.Load()
	if m == nil {
		return nil
	}
	eps := make([]*endpoint, 0, len(*m))
	for _, e := range *m {
		eps = append(eps, e)
	}
	slices.SortFunc(eps, func(a, b *endpoint) int { return strings.Compare(a.url, b.url) })
	var body bytes.Buffer
	var scratch []byte
	for _, e := range eps {
		if ctx.Err() != nil {
			break
		}
		s.scrape(ctx, e, names, client, &body, &scratch)
	}
	return nil
}

// Close stops every poller and waits for them; idle connections are closed. Get keeps
// answering from the last loads (until they go stale). Safe to call more than once.
func (s *Scraper) Close() error {
	s.mu.Lock()
	s.closed = true
	if s.cancel != nil {
		s.cancel()
	}
	client := s.client
	s.mu.Unlock()
	s.wg.Wait()
	if client != nil {
		client.CloseIdleConnections()
	}
	return nil
}

// running reports whether pollers should run; s.mu held.
func (s *Scraper) running() bool { return s.started && !s.closed && s.ctx.Err() == nil }

// launch starts e's poller; s.mu held.
func (s *Scraper) launch(e *endpoint) {
	ctx, cancel := context.WithCancel(s.ctx)
	e.cancel, e.done = cancel, make(chan struct{})
	s.wg.Add(1)
	go s.poll(ctx, e, s.names, s.client)
}

func (s *Scraper) poll(ctx context.Context, e *endpoint, names *compiledNames, client *http.Client) {
	defer s.wg.Done()
	defer close(e.done)
	var body bytes.Buffer
	var scratch []byte
	t := time.NewTicker(s.interval())
	defer t.Stop()
	for {
		s.scrape(ctx, e, names, client, &body, &scratch)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape fetches and parses e's metrics page once, recording the load or the failure, and
// runs the checks on a good load.
func (s *Scraper) scrape(ctx context.Context, e *endpoint, names *compiledNames, client *http.Client, body *bytes.Buffer, scratch *[]byte) {
	l, has, err := s.fetch(ctx, e.metricsURL, names, client, body, scratch)
	if ctx.Err() != nil {
		return // stopped: not the endpoint's fault
	}
	e.scrapes.Add(1)
	if err != nil {
		e.failures.Add(1)
		e.errMu.Lock()
		e.lastErr, e.lastErrAt = err.Error(), s.now()
		e.errMu.Unlock()
		return
	}
	l.At = s.now()
	s.check(e, &l, has)
	e.load.Store(&l)
}

// check runs the checks on a good load of e, sets l.Flags and logs the flags it enters and
// leaves.
func (s *Scraper) check(e *endpoint, l *Load, has uint8) {
	if s.checks == nil {
		return
	}
	var buf [2 * len(CheckNames)]transition
	e.checkMu.Lock()
	flags, tr := e.chk.observe(s.checks, l, has, l.At, buf[:0])
	e.checkMu.Unlock()
	l.Flags = flags
	for _, t := range tr {
		if t.on {
			s.log.Warn("gpu: endpoint flagged", "endpoint", e.url, "check", CheckNames[t.check], "detail", t.detail)
		} else {
			s.log.Info("gpu: endpoint flag cleared", "endpoint", e.url, "check", CheckNames[t.check],
				"after", t.after, "detail", t.detail)
		}
	}
}

func (s *Scraper) fetch(ctx context.Context, url string, names *compiledNames, client *http.Client, body *bytes.Buffer, scratch *[]byte) (Load, uint8, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Load{}, 0, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := client.Do(req)
	if err != nil {
		return Load{}, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return Load{}, 0, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); strings.Contains(ct, "protobuf") {
		return Load{}, 0, fmt.Errorf("GET %s: unsupported content type %q", url, ct)
	}
	limit := s.maxBody()
	body.Reset()
	if _, err := body.ReadFrom(io.LimitReader(resp.Body, limit+1)); err != nil {
		return Load{}, 0, fmt.Errorf("GET %s: %w", url, err)
	}
	if int64(body.Len()) > limit {
		return Load{}, 0, fmt.Errorf("GET %s: page larger than %d bytes", url, limit)
	}
	l, has, err := parseLoad(body.Bytes(), names, scratch)
	if err != nil {
		return Load{}, 0, fmt.Errorf("%s: %w", url, err)
	}
	return l, has, nil
}

// ScrapeOnce fetches each metrics URL once, concurrently, with the Scraper's Names, Timeout,
// MaxBody and Client, without touching its state: the one-shot check of `sluice gpu`.
// Results are in the order of urls; At is the time of each answer.
func (s *Scraper) ScrapeOnce(ctx context.Context, urls []string) ([]Load, []error) {
	names := s.Names
	if len(names.Waiting)+len(names.Running)+len(names.KVCache)+len(names.Throughput) == 0 {
		names = VLLM
	}
	loads, errs := make([]Load, len(urls)), make([]error, len(urls))
	c, err := names.compile()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return loads, errs
	}
	client := s.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{}}
		defer client.CloseIdleConnections()
	}
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() {
			var body bytes.Buffer
			loads[i], _, errs[i] = s.fetch(ctx, u, c, client, &body, nil)
			if errs[i] == nil {
				loads[i].At = s.now()
			}
		})
	}
	wg.Wait()
	return loads, errs
}

// EndpointStatus is one endpoint as the admin page shows it.
type EndpointStatus struct {
	Endpoint    string        `json:"endpoint"`
	MetricsURL  string        `json:"metrics_url"`
	Load        *Load         `json:"load,omitempty"` // last good scrape, nil before the first
	Fresh       bool          `json:"fresh"`          // Get would return Load
	Age         time.Duration `json:"-"`              // since the last good scrape
	AgeSeconds  float64       `json:"age_seconds,omitempty"`
	Scrapes     uint64        `json:"scrapes"`
	Failures    uint64        `json:"failures"`
	LastError   string        `json:"last_error,omitempty"`
	LastErrorAt time.Time     `json:"last_error_at,omitzero"`
	// Checks is each state check's standing (none when Checks.Disabled, or before Start or
	// Poll).
	Checks []CheckStatus `json:"checks,omitempty"`
	// Flagged is the checks' flags now, fresh or not (Load.Flags is as of the last scrape).
	Flagged Flags `json:"flagged,omitempty"`
}

// Snapshot is the state of all signals, for /admin/gpu and for metrics export.
type Snapshot struct {
	At           time.Time        `json:"at"`
	Staleness    time.Duration    `json:"-"`
	Endpoints    []EndpointStatus `json:"endpoints"` // sorted by Endpoint
	DeviceSource string           `json:"device_source,omitempty"`
	Devices      []Device         `json:"devices,omitempty"`
	DevicesError string           `json:"devices_error,omitempty"`
}

// Snapshot returns every endpoint's status and, if Devices is set, the local devices (queried
// now, under ctx).
func (s *Scraper) Snapshot(ctx context.Context) Snapshot {
	now := s.now()
	snap := Snapshot{At: now, Staleness: s.staleness()}
	checks := s.resolvedChecks()
	if m := s.eps.Load(); m != nil {
		for _, e := range *m {
			st := EndpointStatus{Endpoint: e.url, MetricsURL: e.metricsURL,
				Scrapes: e.scrapes.Load(), Failures: e.failures.Load()}
			if l := e.load.Load(); l != nil {
				c := *l
				st.Load = &c
				st.Age = now.Sub(l.At)
				st.AgeSeconds = st.Age.Seconds()
				st.Fresh = st.Age <= snap.Staleness
			}
			e.errMu.Lock()
			st.LastError, st.LastErrorAt = e.lastErr, e.lastErrAt
			e.errMu.Unlock()
			if checks != nil {
				e.checkMu.Lock()
				st.Checks, st.Flagged = e.chk.status(checks), e.chk.flags
				e.checkMu.Unlock()
			}
			snap.Endpoints = append(snap.Endpoints, st)
		}
	}
	slices.SortFunc(snap.Endpoints, func(a, b EndpointStatus) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	if s.Devices != nil {
		snap.DeviceSource = s.Devices.Name()
		devs, err := s.Devices.Devices(ctx)
		snap.Devices = devs
		if err != nil {
			snap.DevicesError = err.Error()
		}
	}
	return snap
}

// resolvedChecks returns the checks in use, nil when disabled or not prepared yet.
func (s *Scraper) resolvedChecks() *Checks {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checks
}

func (s *Scraper) now() time.Time {
	if s.Clock != nil {
		return s.Clock.Now()
	}
	return time.Now()
}

func (s *Scraper) interval() time.Duration  { return orDefault(s.Interval, DefaultInterval) }
func (s *Scraper) timeout() time.Duration   { return orDefault(s.Timeout, DefaultTimeout) }
func (s *Scraper) staleness() time.Duration { return orDefault(s.Staleness, DefaultStaleness) }

func (s *Scraper) maxBody() int64 {
	if s.MaxBody > 0 {
		return s.MaxBody
	}
	return DefaultMaxBody
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
