package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// MaxResponseHeaderBytes bounds an upstream answer's headers.
const MaxResponseHeaderBytes = 256 << 10

// ErrNoHealthyEndpoint is returned by Pick when every endpoint of the cluster is unhealthy
// by active health checks. The gateway maps it to 503.
var ErrNoHealthyEndpoint = errors.New("upstream: no healthy endpoint")

// Cluster is a named set of endpoints with one shared transport. Build it with NewCluster,
// optionally Inherit the cluster it replaces, then Start it; Close it when it is retired.
type Cluster struct {
	name      string
	opts      Options // with defaults applied
	clock     Clock
	log       *slog.Logger
	endpoints []*Endpoint
	hcEnabled bool
	odEnabled bool   // passive ejection on failures (Outlier.ConsecutiveFailures > 0)
	ejects    bool   // ejections apply: odEnabled or Outlier.EjectFlagged with a load source
	pk        picker // Picking, resolved

	rr atomic.Uint64 // round-robin among ties

	ejectMu sync.Mutex // serialises ejection decisions (the MaxEjectionPercent count)

	tkey      transportKey
	transport *sharedTransport

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewCluster validates opts, applies defaults and builds the cluster and its transport.
// It starts nothing: call Start for active health checks. A cluster may have no endpoints
// (one a control plane named before sending its endpoints): Pick then returns
// ErrNoHealthyEndpoint.
func NewCluster(opts Options) (*Cluster, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	o.Endpoints = append([]EndpointSpec(nil), o.Endpoints...)
	c := &Cluster{
		name:      o.Name,
		opts:      o,
		clock:     o.Clock,
		log:       o.Logger.With("cluster", o.Name),
		hcEnabled: o.HealthCheck.Interval > 0,
		odEnabled: o.Outlier.ConsecutiveFailures > 0,
		pk:        newPicker(o),
	}
	c.ejects = c.odEnabled || c.pk.ejectFlags
	anyTLS := false
	c.endpoints = make([]*Endpoint, len(o.Endpoints))
	for i, spec := range o.Endpoints {
		u, _ := ParseEndpointURL(spec.URL) // validated above
		if u.Scheme == "https" {
			anyTLS = true
		}
		w := spec.Weight
		if w == 0 {
			w = DefaultWeight
		}
		c.endpoints[i] = &Endpoint{
			cluster:    c,
			url:        u,
			key:        endpointKey(u),
			raw:        spec.URL,
			metricsURL: spec.MetricsURL,
			healthURLs: healthURLs(u, o.HealthCheck.Path),
			weight:     int64(w),
			hrwKey:     hrwKey(endpointKey(u)),
			st:         newEndpointState(),
		}
		c.endpoints[i].sig.Store(noSignal)
	}
	c.pk.uniform = true
	for _, e := range c.endpoints {
		c.pk.uniform = c.pk.uniform && e.weight == c.endpoints[0].weight
	}
	t, key, err := newTransport(o, anyTLS)
	if err != nil {
		return nil, err
	}
	c.tkey = key
	c.transport = &sharedTransport{t: t, rt: newH1(t.DialContext, t, o.MaxIdleConnsPerHost)}
	c.transport.rt.off = o.NetHTTP
	c.transport.refs.Store(1)
	return c, nil
}

// healthURLs are the URLs an endpoint's active checks try: the configured path, or every
// one of AutoHealthPaths.
func healthURLs(u *url.URL, path string) []string {
	paths := []string{path}
	if path == "" {
		paths = AutoHealthPaths
	}
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = u.Scheme + "://" + u.Host + p
	}
	return out
}

// Name returns the cluster's name.
func (c *Cluster) Name() string { return c.name }

// Endpoints returns the cluster's endpoints in configuration order. The slice is shared:
// the caller must not modify it.
func (c *Cluster) Endpoints() []*Endpoint { return c.endpoints }

// Ready reports whether some endpoint of the cluster is Ready (without active health checks,
// whether it has an endpoint).
func (c *Cluster) Ready() bool {
	for _, e := range c.endpoints {
		if e.Ready() {
			return true
		}
	}
	return false
}

// HealthChecked reports whether the cluster's endpoints are actively health checked.
func (c *Cluster) HealthChecked() bool { return c.hcEnabled }

// Load returns the requests in flight per endpoint of the cluster (healthy or not) and the
// requests ever begun on its endpoints (across reloads, as InFlight). Shadow verdicts use it
// to tell whether two clusters served alike loads.
func (c *Cluster) Load() (perEndpoint float64, begun int64) {
	if len(c.endpoints) == 0 {
		return 0, 0
	}
	var in int64
	for _, e := range c.endpoints {
		in += e.st.inFlight.Load()
		begun += e.st.requests.Load()
	}
	return float64(in) / float64(len(c.endpoints)), begun
}

// Transport returns the cluster's shared transport (see newTransport for its settings).
func (c *Cluster) Transport() http.RoundTripper { return c.transport.rt }

// HTTPTransport returns the cluster's net/http Transport: health checks, model lists, https
// endpoints, and the requests the cluster's own client passes on (see h1).
func (c *Cluster) HTTPTransport() *http.Transport { return c.transport.t }

// usable is Available without the time.Time conversion: the hot-path check of Pick.
func (c *Cluster) usable(s *endpointState, now int64) bool {
	if c.hcEnabled && !s.healthy.Load() {
		return false
	}
	if c.ejects && now < s.ejectedUntil.Load() {
		return false
	}
	return true
}

// Pick is PickFor(exclude, Hint{}): the best available endpoint by the cluster's picking
// strategy, without prefix affinity.
func (c *Cluster) Pick(exclude *Endpoint) (*Endpoint, error) {
	return c.PickFor(exclude, Hint{})
}

// pickLeastInFlight returns the available endpoint with the least in-flight requests
// relative to its weight, skipping exclude (may be nil; matched by URL state, so an
// endpoint of the cluster this one replaced also counts) when any other endpoint is
// available. See the package doc for tie-breaking and panic mode.
func (c *Cluster) pickLeastInFlight(exclude *Endpoint) (*Endpoint, error) {
	now := c.clock.Now().UnixNano()
	var ex *endpointState
	if exclude != nil {
		ex = exclude.st
	}
	var (
		best         *Endpoint
		bestL, bestW int64
		ties         int
		exAvail      *Endpoint
	)
	for _, e := range c.endpoints {
		if !c.usable(e.st, now) || (c.pk.src != nil && !c.refreshLoad(e, now)) {
			continue
		}
		if e.st == ex {
			exAvail = e
			continue
		}
		l, w := max(e.st.inFlight.Load(), 0), c.fixedWeight(e)
		if best == nil {
			best, bestL, bestW, ties = e, l, w, 1
			continue
		}
		// Compare (l+1)/w with (bestL+1)/bestW without dividing.
		a, b := (l+1)*bestW, (bestL+1)*w
		switch {
		case a < b || (a == b && w > bestW):
			best, bestL, bestW, ties = e, l, w, 1
		case l == bestL && w == bestW:
			ties++
		}
	}
	if best != nil {
		if ties > 1 {
			best = c.nthTie(now, ex, bestL, bestW, ties, best)
		}
		return best.picked(pickLeastInFlight), nil
	}
	if exAvail != nil {
		return exAvail.picked(pickLeastInFlight), nil
	}
	return c.panicPick(ex)
}

// fixedWeight is e's weight in 1/weightScale units as least in-flight compares it: lowered
// to FlaggedWeight of it while e is flagged (as of its last refresh).
func (c *Cluster) fixedWeight(e *Endpoint) int64 {
	if e.flags.Load() != 0 {
		return e.weight * c.pk.flagWFixed
	}
	return e.weight * weightScale
}

// nthTie picks among endpoints tied at (l, w) round-robin. In-flight counts may move between
// the two passes; if the chosen tie is gone, the first pass's winner stands.
func (c *Cluster) nthTie(now int64, ex *endpointState, l, w int64, ties int, fallback *Endpoint) *Endpoint {
	k := int(c.rr.Add(1) % uint64(ties))
	for _, e := range c.endpoints {
		if e.st == ex || c.fixedWeight(e) != w || !c.usable(e.st, now) || max(e.st.inFlight.Load(), 0) != l {
			continue
		}
		if k == 0 {
			return e
		}
		k--
	}
	return fallback
}

// panicPick runs when no endpoint is available: among endpoints healthy by active checks
// (all of them ejected, then) it returns the one whose ejection ends soonest, preferring
// any endpoint over exclude.
func (c *Cluster) panicPick(ex *endpointState) (*Endpoint, error) {
	var best, exBest *Endpoint
	var bestUntil int64
	for _, e := range c.endpoints {
		if c.hcEnabled && !e.st.healthy.Load() {
			continue
		}
		if e.st == ex {
			exBest = e
			continue
		}
		if until := e.st.ejectedUntil.Load(); best == nil || until < bestUntil {
			best, bestUntil = e, until
		}
	}
	switch {
	case best != nil:
		return best.picked(pickPanic), nil
	case exBest != nil:
		return exBest.picked(pickPanic), nil
	}
	return nil, ErrNoHealthyEndpoint
}

// maybeEject runs when e reached the consecutive-failure threshold. It resets the count,
// and ejects e unless it is already ejected or MaxEjectionPercent forbids it.
func (c *Cluster) maybeEject(e *Endpoint) {
	c.ejectMu.Lock()
	defer c.ejectMu.Unlock()
	s := e.st
	if s.consecutive.Load() < int64(c.opts.Outlier.ConsecutiveFailures) {
		return // a concurrent Report handled this run of failures, or a success intervened
	}
	s.consecutive.Store(0)
	now := c.clock.Now().UnixNano()
	if now < s.ejectedUntil.Load() {
		return // already ejected: failures of requests still in flight
	}
	ejected := 0
	for _, o := range c.endpoints {
		if now < o.st.ejectedUntil.Load() {
			ejected++
		}
	}
	if 100*(ejected+1) > c.opts.Outlier.MaxEjectionPercent*len(c.endpoints) {
		c.log.Warn("upstream: ejection skipped: max ejection percent reached",
			"endpoint", e.raw, "ejected", ejected, "endpoints", len(c.endpoints),
			"max_ejection_percent", c.opts.Outlier.MaxEjectionPercent)
		return
	}
	c.ejectLocked(e, now, 0)
}

// ejectFlagged runs when a refresh found e flagged with Outlier.EjectFlagged on: it ejects
// e as maybeEject does, unless it is ejected already, MaxEjectionPercent forbids it, or e is
// the last available endpoint of the cluster (a flag says the server is degraded, not
// down: a degraded endpoint beats none). A skipped ejection is logged once per flagging.
func (c *Cluster) ejectFlagged(e *Endpoint, flags Flags, now int64) {
	c.ejectMu.Lock()
	defer c.ejectMu.Unlock()
	if now < e.st.ejectedUntil.Load() {
		return
	}
	ejected, others := 0, 0
	for _, o := range c.endpoints {
		switch {
		case now < o.st.ejectedUntil.Load():
			ejected++
		case o != e && (!c.hcEnabled || o.st.healthy.Load()):
			others++
		}
	}
	why := ""
	switch {
	case others == 0:
		why = "the last available endpoint"
	case 100*(ejected+1) > c.opts.Outlier.MaxEjectionPercent*len(c.endpoints):
		why = "max ejection percent reached"
	}
	if why != "" {
		if !e.ejectSkipped.Swap(true) {
			c.log.Warn("upstream: ejection of a flagged endpoint skipped: "+why, "endpoint", e.raw, "flags", flags.String(),
				"ejected", ejected, "endpoints", len(c.endpoints), "max_ejection_percent", c.opts.Outlier.MaxEjectionPercent)
		}
		return
	}
	c.ejectLocked(e, now, flags)
}

// ejectLocked ejects e from now, for BaseEjection × its multiplier (capped), because of flags
// (0: consecutive failures); c.ejectMu held.
func (c *Cluster) ejectLocked(e *Endpoint, now int64, flags Flags) {
	s := e.st
	od := c.opts.Outlier
	base, maxE := int64(od.BaseEjection), int64(od.MaxEjection)
	s.mu.Lock()
	if last := s.ejectedUntil.Load(); last != 0 && now > last {
		// Envoy lowers the multiplier by one each interval the host stays in service.
		s.multiplier = max(s.multiplier-(now-last)/int64(od.DecayInterval), 0)
	}
	if s.multiplier*base < maxE+base {
		s.multiplier++
	}
	d := min(base*s.multiplier, maxE)
	s.timesEjected++
	times := s.timesEjected
	s.ejectReason = flags
	s.ejectedUntil.Store(now + d)
	s.mu.Unlock()

	reason := "consecutive_failures"
	if flags != 0 {
		reason = flags.String()
	}
	c.log.Warn("upstream: endpoint ejected", "endpoint", e.raw, "reason", reason,
		"for", time.Duration(d), "times_ejected", times)
}

// Snapshot returns the status of every endpoint, in configuration order.
func (c *Cluster) Snapshot() []EndpointStatus {
	now := c.clock.Now().UnixNano()
	out := make([]EndpointStatus, len(c.endpoints))
	for i, e := range c.endpoints {
		out[i] = e.status(now)
	}
	return out
}

// Inherit makes c continue the state of old: every endpoint of c whose URL (ignoring a
// trailing slash and host case) is also in old shares old's endpoint state (in-flight count,
// health, ejection and multiplier, counters). When the transport settings are unchanged, c
// also shares old's transport and its pooled connections. Call Inherit before Start and
// before c is used; old keeps serving until it is closed. A nil old is a no-op.
func (c *Cluster) Inherit(old *Cluster) {
	if old == nil || old == c {
		return
	}
	c.mu.Lock()
	started := c.started || c.closed
	c.mu.Unlock()
	if started {
		panic("upstream: Inherit called after Start or Close")
	}
	byKey := make(map[string]*endpointState, len(old.endpoints))
	for _, e := range old.endpoints {
		byKey[e.key] = e.st
	}
	carried := 0
	for _, e := range c.endpoints {
		if st, ok := byKey[e.key]; ok {
			e.st = st
			carried++
		}
	}
	if c.tkey == old.tkey && c.transport != old.transport && old.transport.acquire() {
		c.transport.release()
		c.transport = old.transport
	}
	c.log.Debug("upstream: inherited endpoint state", "from", old.name, "endpoints", carried,
		"shared_transport", c.transport == old.transport)
}

// Start starts active health checking (if HealthCheck.Interval > 0): one goroutine per
// endpoint, owned by the cluster, stopped when ctx is done or Close is called. Start after
// Start or Close does nothing.
func (c *Cluster) Start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.closed {
		return
	}
	c.started = true
	if !c.hcEnabled {
		return
	}
	ctx, c.cancel = context.WithCancel(ctx)
	for _, e := range c.endpoints {
		c.wg.Add(1)
		go c.healthLoop(ctx, e)
	}
}

// Close stops health checks and waits for them to end, then releases the transport: its idle
// connections are closed once no cluster uses it. Requests in flight are not interrupted.
// Close is safe to call more than once.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.wg.Wait()
		return
	}
	c.closed = true
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
	c.wg.Wait()
	c.transport.release()
}

// sharedTransport is a transport used by one cluster and the clusters that inherited it.
type sharedTransport struct {
	t    *http.Transport // health checks, model lists, and what rt does not send itself
	rt   *h1             // requests and mirrored copies (see h1)
	refs atomic.Int64
}

func (s *sharedTransport) acquire() bool {
	for {
		n := s.refs.Load()
		if n <= 0 {
			return false
		}
		if s.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (s *sharedTransport) release() {
	if s.refs.Add(-1) == 0 {
		s.rt.close() // its idle connections, the fallback's, and those of answers in flight
	}
}

// transportKey holds every option the transport is built from; equal keys may share one.
type transportKey struct {
	connect    time.Duration
	maxIdle    int
	serverName string
	insecure   bool
	caPEM      string
	anyTLS     bool
	netHTTP    bool
}

// newTransport builds the cluster's transport: dial and TLS handshake bounded by
// ConnectTimeout, TCP keep-alive, a keep-alive pool of MaxIdleConnsPerHost per endpoint,
// HTTP/1.1 (HTTP/2 attempted via ALPN only when some endpoint is https), no proxy from the
// environment, no transparent compression (bytes are relayed as they are) and no
// response-header timeout (the gateway enforces time to first token itself).
func newTransport(o Options, anyTLS bool) (*http.Transport, transportKey, error) {
	key := transportKey{
		connect:    o.ConnectTimeout,
		maxIdle:    o.MaxIdleConnsPerHost,
		serverName: o.TLS.ServerName,
		insecure:   o.TLS.InsecureSkipVerify,
		anyTLS:     anyTLS,
		netHTTP:    o.NetHTTP,
	}
	tlsConf := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         o.TLS.ServerName,
		InsecureSkipVerify: o.TLS.InsecureSkipVerify, // explicit opt-in
	}
	if o.TLS.CAFile != "" {
		pool, pem, err := loadCA(o.TLS.CAFile)
		if err != nil {
			return nil, key, err
		}
		tlsConf.RootCAs = pool
		key.caPEM = string(pem)
	}
	dialer := &net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialContext(dialer),
		TLSClientConfig:       tlsConf,
		TLSHandshakeTimeout:   o.ConnectTimeout,
		ForceAttemptHTTP2:     anyTLS,
		DisableCompression:    true,
		MaxIdleConns:          0, // no global limit; the per-host limit applies
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		// A model server's headers are small; megabytes of them are a broken server, not
		// an answer (Go's default would hold 10 MiB per attempt).
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
	}
	return t, key, nil
}
