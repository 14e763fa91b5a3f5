// Package proxy is the gateway: the server and its listeners, the request path
// (handler.go, read top-down), the admin API, config reloads and the graceful drain.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/sluicegw/sluice/gpu"
	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/http1"
	"github.com/sluicegw/sluice/proxy/procs"
	"github.com/sluicegw/sluice/proxy/telemetry"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// Options configure a Server.
type Options struct {
	Config *config.Config
	// ConfigPath, when set, is watched for changes and re-read on Reload (SIGHUP).
	ConfigPath string
	Logger     *slog.Logger
	Telemetry  *telemetry.Telemetry
	Version    string
	// WatchInterval is how often ConfigPath is checked for changes (default 1s).
	WatchInterval time.Duration
	// Chaos turns fault injection on whatever the config says (`sluice serve --chaos`).
	Chaos bool
	// AwaitConfig keeps /readyz false after Start until the first Apply (a config pushed by a
	// control plane); Config is then only the bootstrap (listeners, defaults).
	AwaitConfig bool
	// XDSStatus, when set, is served as GET /admin/xds (the xDS client's state).
	XDSStatus func() any
}

// Server runs the gateway listener and the admin listener.
type Server struct {
	opts    Options
	created time.Time // when New ran: the "created" of the models Sluice lists itself
	log     *slog.Logger
	tel     *telemetry.Telemetry
	state   atomic.Pointer[state]

	reloadMu sync.Mutex

	shutdownOnce sync.Once
	shutdownErr  error
	draining     atomic.Bool
	ready        atomic.Bool
	started      atomic.Bool // Start ran
	applied      atomic.Bool // a config was Applied (AwaitConfig)

	baseCtx    context.Context
	cancelBase context.CancelCauseFunc

	ln, adminLn   net.Listener
	apiLn         atomic.Pointer[limitListener] // the API listener's connection bounds
	http, admin   *http.Server
	api           apiServer // serves the API listener: http, or the own HTTP/1.1 server in front of it
	certs         *certReloader
	wg            sync.WaitGroup
	stopWatch     context.CancelFunc
	releaseProcs  func()     // the process's processor Controller, held while serving (procs: adaptive)
	heapFloor     *busyFloor // the collector's heap floor (heap_floor), held while serving and busy
	reloadsFailed atomic.Int64
	metricsReg    metric.Registration
	signalsReg    metric.Registration
	chaosReg      metric.Registration
	shadowReg     metric.Registration
	connReg       metric.Registration
	plugins       pluginCollector // the metrics policies report themselves

	// Load signals: one scraper of the endpoints' metrics URLs (re-pointed at every reload)
	// and this host's GPUs.
	scraper *gpu.Scraper
	devices *gpu.NVML

	// shadow holds the routes' mirrors (queues, workers, comparisons); it lives across reloads.
	shadow *shadowing

	// chaos is the fault-injection engine (faults from the config, the admin API and the
	// x-sluice-fault header); it lives across reloads.
	chaos *fault.Engine

	// homes remembers where stored Responses answers live; it lives across reloads.
	homes *homes

	// buffers bounds the non-streaming answers held at once (limits.max_buffered_total).
	buffers answerBuffers

	// served are the model names servers answered for (metric labels; see modelLabel).
	served servedModels

	// fileLimit is the open-file limit, read once (the connection bound is checked on every
	// accepted connection).
	fileLimit int
}

// state is one immutable generation of the running config: the compiled routes and the live
// clusters. A reload builds a new state and swaps it in; requests in flight keep the old one.
type state struct {
	snap      *config.Snapshot
	clusters  map[string]*clusterState
	routers   []*route.Router // by route index: splits, fallback chain, retries, cluster breakers
	admitters map[string][]policy.Admitter
	observers map[string][]policy.Observer
	filters   map[string][]policy.StreamFilter // the stream filters of each route, in order
	bodies    map[string][]policy.BodyFilter   // the body filters of each route, in order
	tenants   tenantResolver                   // nil when no tenants are configured
	trust     trust                            // the trusted proxies
	cors      cors                             // the browser origins allowed
	models    map[string]bool                  // the model names the config gives (see modelLabel)
	policies  []*builtPolicy
	batchers  []batcher          // by route index; nil where the route does not batch
	stop      context.CancelFunc // stops this generation's health checks
	ctx       context.Context    // this generation's: its health checks run until stop
	metrics   map[string]string  // endpoint URL → its metrics URL, for the scraper
	// mirrors are the routes' running mirrors (by route name), nil until the server starts:
	// a generation's routes and mirrors serve together.
	mirrors map[string]*mirrorRoute
}

// tenantResolver names the tenant of a request from its API key.
type tenantResolver interface {
	Identify(h http.Header) (tenant string, ok bool)
}

type clusterState struct {
	*upstream.Cluster
	apiKey string
	named  []string // the cluster's name as a header value (X-Sluice-Upstream), shared by its answers
}

// plan returns the route's candidates: the chosen split, then the fallback steps.
func (st *state) plan(ctx context.Context, rt *config.CompiledRoute, r *policy.Request) []policy.Candidate {
	return st.routers[rt.Index].Plan(ctx, r)
}

// router is the named route's router, or nil.
func (st *state) router(name string) *route.Router {
	for i, r := range st.snap.Routes {
		if r.Name == name {
			return st.routers[i]
		}
	}
	return nil
}

// New builds a server from a validated config. Nothing listens until Start.
func New(opts Options) (*Server, error) {
	if opts.Config == nil {
		return nil, errors.New("proxy: no config")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if opts.WatchInterval == 0 {
		opts.WatchInterval = time.Second
	}
	s := &Server{opts: opts, log: opts.Logger, tel: opts.Telemetry, created: time.Now(), homes: newHomes(maxHomes),
		fileLimit: openFileLimit()}
	if s.tel == nil {
		tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceVersion: opts.Version})
		if err != nil {
			return nil, fmt.Errorf("telemetry: %w", err)
		}
		s.tel = tel
	}
	s.baseCtx, s.cancelBase = context.WithCancelCause(context.Background())
	ls := opts.Config.LoadSignals
	names, _ := gpu.Preset(ls.Names)
	s.scraper = &gpu.Scraper{Interval: ls.Interval.D(), Timeout: ls.Timeout.D(), Staleness: ls.Staleness.D(), Names: names,
		Checks: ls.Checks.GPU(), Logger: opts.Logger}
	if !ls.DisableNVML {
		// No GPU or no driver is normal (a gateway host): the source reports unavailable.
		s.devices, _ = gpu.NewNVML()
		s.scraper.Devices = s.devices
	}
	opts.Config = opts.served(opts.Config)
	chaos, err := fault.New(opts.Config.Chaos, policy.SystemClock{}, time.Now().UnixNano())
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	s.chaos = chaos
	s.shadow = newShadowing(s)
	st, err := s.build(opts.Config, nil)
	if err != nil {
		return nil, err
	}
	s.start(st)
	s.state.Store(st)
	s.tel.SetConfigInfo(opts.Config.Version)
	if s.metricsReg, err = s.routeMetrics(s.tel.Meter()); err != nil {
		return nil, fmt.Errorf("route metrics: %w", err)
	}
	if s.signalsReg, err = s.signalMetrics(s.tel.Meter()); err != nil {
		return nil, fmt.Errorf("signal metrics: %w", err)
	}
	if s.chaosReg, err = s.chaosMetrics(s.tel.Meter()); err != nil {
		return nil, fmt.Errorf("chaos metrics: %w", err)
	}
	if s.shadowReg, err = s.shadowMetrics(s.tel.Meter()); err != nil {
		return nil, fmt.Errorf("shadow metrics: %w", err)
	}
	if s.connReg, err = s.connectionMetrics(s.tel.Meter()); err != nil {
		return nil, fmt.Errorf("connection metrics: %w", err)
	}
	s.plugins = pluginCollector{s}
	if err := s.tel.Registry().Register(s.plugins); err != nil {
		return nil, fmt.Errorf("policy metrics: %w", err)
	}
	return s, nil
}

// build turns a config into a state ready to start, carrying endpoint state (health, ejections,
// in-flight counts) over from the previous one.
func (s *Server) build(c *config.Config, prev *state) (*state, error) {
	st := &state{
		trust:     newTrust(c.TrustedProxies),
		cors:      newCORS(c.CORS),
		models:    knownModels(c),
		snap:      config.NewSnapshot(c),
		clusters:  map[string]*clusterState{},
		admitters: map[string][]policy.Admitter{},
		observers: map[string][]policy.Observer{},
		filters:   map[string][]policy.StreamFilter{},
		bodies:    map[string][]policy.BodyFilter{},
	}
	var ctx context.Context
	ctx, st.stop = context.WithCancel(s.baseCtx)
	metrics := map[string]string{}
	for _, cc := range c.Clusters {
		opts := clusterOptions(cc, c.Timeouts.Timeouts, s.log)
		if c.Remote {
			opts.TLS.CAFile = "" // each replica's own file: not here to read
		}
		for _, ep := range cc.Endpoints {
			if ep.Metrics != "" {
				metrics[ep.URL] = ep.Metrics
				opts.Load = loadSource{s.scraper}
			}
		}
		cl, err := upstream.NewCluster(opts)
		if err != nil {
			st.stop()
			for _, built := range st.clusters {
				built.Close()
			}
			return nil, fmt.Errorf("cluster %q: %w", cc.Name, err)
		}
		if prev != nil {
			if old := prev.clusters[cc.Name]; old != nil {
				cl.Inherit(old.Cluster)
			}
		}
		st.clusters[cc.Name] = &clusterState{Cluster: cl, apiKey: cc.APIKey.Reveal(), named: headerValue(cc.Name)}
	}
	fail := func(err error) (*state, error) {
		st.stop()
		for _, cl := range st.clusters {
			cl.Close()
		}
		return nil, err
	}
	var problems []string
	for i, r := range st.snap.Routes {
		rtr, err := route.New(r.Spec, r.Cluster, r.Model, policy.SystemClock{})
		if err != nil {
			problems = append(problems, fmt.Sprintf("routes[%d]: %v", i, err))
			continue
		}
		if prev != nil {
			if old := prev.router(r.Name); old != nil {
				rtr.Inherit(old)
			}
		}
		st.routers = append(st.routers, rtr)
	}
	if len(problems) > 0 {
		return fail(&config.ValidationError{Problems: problems})
	}
	if !c.Remote { // the tenants' keys of a config served to replicas are the replicas'
		kr, err := buildKeyring(c)
		if err != nil {
			return fail(err)
		}
		if kr != nil {
			st.tenants = kr
		}
	}
	if err := s.buildPolicies(st, prev); err != nil {
		return fail(err)
	}
	st.ctx, st.metrics = ctx, metrics
	return st, nil
}

// close retires a state: its health checks stop, its clusters close (their transports when
// next no longer shares them), and its policies that next does not keep are closed (next
// nil: all of them).
func (st *state) close(next *state) {
	st.stop()
	for _, cl := range st.clusters {
		cl.Close()
	}
	if next == nil {
		next = &state{}
	}
	retire(st, next)
}

// start puts a built state to work: its clusters' health checks, and the load-signal scraper
// pointed at its endpoints. Building a state has no such effect, so that checking a config
// (Check) leaves the serving one alone.
func (s *Server) start(st *state) {
	for _, cl := range st.clusters {
		cl.Start(st.ctx)
	}
	s.scraper.Set(st.metrics)
}

// loadSource gives endpoint picking the scraped model-server load.
type loadSource struct{ s *gpu.Scraper }

func (l loadSource) Get(endpoint string) (upstream.Load, bool) {
	v, ok := l.s.Get(endpoint)
	return upstream.Load{Waiting: v.Waiting, Running: v.Running, KVCacheUsage: v.KVCacheUsage, Flags: upstreamFlags(v.Flags)}, ok
}

func clusterOptions(cc config.Cluster, defaults config.Timeouts, log *slog.Logger) upstream.Options {
	o := upstream.Options{
		Name:                cc.Name,
		ConnectTimeout:      cc.Timeouts.Or(defaults).Connect.D(),
		MaxIdleConnsPerHost: cc.MaxIdleConnsPerHost,
		NetHTTP:             cc.HTTPClient == "net/http",
		TLS:                 upstream.TLS{CAFile: cc.TLS.CAFile, ServerName: cc.TLS.ServerName, InsecureSkipVerify: cc.TLS.InsecureSkipVerify},
		Logger:              log,
	}
	for _, ep := range cc.Endpoints {
		o.Endpoints = append(o.Endpoints, upstream.EndpointSpec{URL: ep.URL, MetricsURL: ep.Metrics, Weight: ep.Weight})
	}
	if k := cc.APIKey.Reveal(); k != "" {
		o.Authorization = "Bearer " + k
	}
	o.DiscoverModels = true
	p := cc.Picking
	o.Picking = upstream.Picking{Strategy: p.Strategy, InFlightWeight: p.InFlightWeight, WaitingWeight: p.WaitingWeight,
		KVWeight: p.KVWeight, AffinityMaxLoad: p.AffinityMaxLoad, AffinityMinPrefix: p.AffinityMinPrefix, DisableAffinity: p.DisableAffinity,
		FlaggedWeight: p.FlaggedWeight}
	if !cc.HealthCheck.Disabled {
		o.HealthCheck = upstream.HealthCheck{
			Path: cc.HealthCheck.Path, Interval: cc.HealthCheck.Interval.D(), Timeout: cc.HealthCheck.Timeout.D(),
			UnhealthyThreshold: cc.HealthCheck.UnhealthyThreshold, HealthyThreshold: cc.HealthCheck.HealthyThreshold,
		}

	}
	if !cc.Outlier.Disabled {
		o.Outlier = upstream.Outlier{
			ConsecutiveFailures: cc.Outlier.ConsecutiveFailures, BaseEjection: cc.Outlier.BaseEjection.D(),
			MaxEjection: cc.Outlier.MaxEjection.D(), MaxEjectionPercent: cc.Outlier.MaxEjectionPercent,
			EjectFlagged: cc.Outlier.EjectFlagged,
		}
	}
	return o
}

// Start binds both listeners and serves in the background. Use Addr and AdminAddr for the
// bound addresses (useful with port 0).
func (s *Server) Start() error {
	c := s.state.Load().snap.Config
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", c.Listen, err)
	}
	aln, err := net.Listen("tcp", c.Admin.Listen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("admin listen %s: %w", c.Admin.Listen, err)
	}
	lln := newLimitListener(ln, s.connectionBounds)
	s.apiLn.Store(lln)
	ln = lln
	s.ln, s.adminLn = ln, aln

	var protos http.Protocols
	protos.SetHTTP1(true)
	s.http = &http.Server{
		Handler:           &Handler{srv: s},
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    int(c.Limits.MaxHeaderBytes),
		IdleTimeout:       120 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		Protocols:         &protos,
	}
	if d := c.Timeouts.Write.D(); d > 0 {
		// HTTP/2: a client that stops reading the connection (its TCP window at zero) stops
		// every write, stream resets included, so only closing the connection frees its
		// streams: after the write time-out without a byte taken. A peer that is gone
		// without a word is found by a ping. Fixed at start: a reload changes the time-out of
		// each write (deadlineWriter), not this.
		s.http.HTTP2 = &http.HTTP2Config{WriteByteTimeout: d, SendPingTimeout: h2PingAfter, PingTimeout: h2PingTimeout}
	}
	if c.TLS.Enabled() {
		s.certs = &certReloader{certFile: c.TLS.CertFile, keyFile: c.TLS.KeyFile, log: s.log}
		if _, err := s.certs.get(); err != nil {
			ln.Close()
			aln.Close()
			return err
		}
		protos.SetHTTP2(true)
		s.http.TLSConfig = &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.certs.get() },
			NextProtos:     []string{"h2", "http/1.1"},
		}
		ln = tls.NewListener(ln, s.http.TLSConfig)
	} else {
		protos.SetUnencryptedHTTP2(true) // h2c with prior knowledge
	}
	s.admin = &http.Server{Handler: s.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
	s.api = s.http
	if ownServer(c) {
		// The gateway's own HTTP/1.1 server on the connection's goroutine; net/http's
		// serves what it hands over (h2c, unusual requests, errors) with the settings above.
		s.api = &http1.Server{
			Handler: s.http.Handler, Fallback: s.http, BaseContext: s.baseCtx,
			ReadHeaderTimeout: s.http.ReadHeaderTimeout, IdleTimeout: s.http.IdleTimeout,
			WatchAfter: watchAfter, Log: s.log,
		}
	}
	// Before the listeners serve: their requests feed it (busyFloor.request).
	s.heapFloor = &busyFloor{bytes: uint64(c.HeapFloor)}
	s.heapFloor.hold()

	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.api.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("gateway listener stopped", "err", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		if err := s.admin.Serve(aln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin listener stopped", "err", err)
		}
	}()
	if s.opts.ConfigPath != "" {
		var wctx context.Context
		wctx, s.stopWatch = context.WithCancel(s.baseCtx)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.watch(wctx)
		}()
	}
	if err := s.scraper.Start(s.baseCtx); err != nil {
		s.log.Warn("load signals not started", "err", err)
	}
	s.reloadMu.Lock()
	cur := s.state.Load()
	st := *cur // the same generation, now with its mirrors running
	s.shadow.sync(nil, &st, func() { s.state.Store(&st) })
	s.started.Store(true) // under reloadMu: every generation applied from now on mirrors
	s.reloadMu.Unlock()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.judgeLoop(s.baseCtx)
	}()
	go func() {
		defer s.wg.Done()
		s.memoryLoop(s.baseCtx)
	}()
	if c.Procs != "fixed" {
		s.releaseProcs = procs.Acquire(s.log)
	}
	if !s.opts.AwaitConfig || s.applied.Load() {
		s.ready.Store(true)
	}
	s.log.Info("sluice listening", "addr", s.Addr(), "admin", s.AdminAddr(), "tls", c.TLS.Enabled(),
		"config", c.Source, "version", c.Version)
	return nil
}

// h2PingAfter is how long an HTTP/2 connection may go without a frame from the client before
// it is pinged, and h2PingTimeout how long the ping may go unanswered before it is closed.
const (
	h2PingAfter   = 30 * time.Second
	h2PingTimeout = 15 * time.Second
)

// watchAfter is how long a request runs on the own HTTP/1.1 server before the connection is
// watched for the client going away (see http1.Server.WatchAfter): the longest a client
// that left goes unseen, short against any model's answer, and long enough that a gateway
// under load (requests queued a few ms) starts no watch for its quick answers.
const watchAfter = 20 * time.Millisecond

// ownServer reports whether c's API listener is served by the own HTTP/1.1 server.
func ownServer(c *config.Config) bool { return !c.TLS.Enabled() && c.HTTPServer != "net/http" }

// apiServer is what serves the API listener: net/http's server, or the own HTTP/1.1 one.
type apiServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// connectionBounds are the API listener's bounds now: limits.max_connections (by default
// three quarters of the open-file limit, the rest left to the admin listener, upstream
// connections and files), limits.max_connections_per_client (0: none; by default only with
// trusted proxies, without which a peer may carry many clients), and the trusted proxies,
// which carry many clients and are not bound per client.
func (s *Server) connectionBounds() (total, perClient int, trusted trust) {
	st := s.state.Load()
	lm := st.snap.Config.Limits
	total = lm.MaxConnections
	if total == 0 {
		total = s.fileLimit * 3 / 4
	}
	switch perClient = lm.MaxConnectionsPerClient; {
	case perClient == 0 && len(st.trust) > 0:
		perClient = config.DefaultMaxConnectionsPerClient
	case perClient < 0:
		perClient = 0 // off
	}
	return total, perClient, st.trust
}

// Addr is the gateway listener's bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// AdminAddr is the admin listener's bound address.
func (s *Server) AdminAddr() string { return s.adminLn.Addr().String() }

// Chaos is the fault-injection engine (as the admin API drives it).
func (s *Server) Chaos() *fault.Engine { return s.chaos }

// Config returns the config now serving.
func (s *Server) Config() *config.Config { return s.state.Load().snap.Config }

// Reload re-reads the config file. A valid file is swapped in atomically (requests in flight
// finish on the old one); an invalid one is rejected with every problem logged and counted,
// and the old config keeps serving.
func (s *Server) Reload() error {
	if s.opts.ConfigPath == "" {
		if s.opts.AwaitConfig {
			return errors.New("no config file to reload: the config comes from the xDS control plane")
		}
		return errors.New("no config file to reload (started with --upstream)")
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	err := s.reloadLocked()
	s.tel.ConfigReload(context.Background(), err == nil)
	if err != nil {
		s.reloadsFailed.Add(1)
		s.log.Error("config reload rejected; the previous config keeps serving", "file", s.opts.ConfigPath, "err", err)
	}
	return err
}

func (s *Server) reloadLocked() error {
	c, err := config.LoadFile(s.opts.ConfigPath)
	if err != nil {
		return err
	}
	return s.applyLocked(c)
}

// Apply swaps in a config that came from elsewhere than the file (a control plane). It must
// be finished (defaults applied, validated); it is rejected, with every problem, when it
// changes what needs a restart, and the old config keeps serving. The first Apply makes a
// server started with AwaitConfig ready.
func (s *Server) Apply(c *config.Config) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	err := s.applyLocked(c)
	s.tel.ConfigReload(context.Background(), err == nil)
	if err != nil {
		s.reloadsFailed.Add(1)
		s.log.Error("config rejected; the previous config keeps serving", "source", c.Source, "err", err)
		return err
	}
	s.applied.Store(true)
	if s.started.Load() && !s.draining.Load() {
		s.ready.Store(true)
	}
	return nil
}

func (s *Server) applyLocked(c *config.Config) error {
	c = s.opts.served(c)
	old := s.state.Load()
	if c.Version == old.snap.Config.Version {
		return nil
	}
	if err := restartProblems(c, old.snap.Config); err != nil {
		return err
	}
	oc := old.snap.Config
	var faults *fault.Compiled
	if !reflect.DeepEqual(c.Chaos.Faults, oc.Chaos.Faults) {
		// Validated with the config; installed with its routes, where it replaces the
		// configured faults (and any set through the admin API) with the file's.
		var err error
		if faults, err = s.chaos.Compile(c.Chaos.Faults); err != nil {
			return fmt.Errorf("chaos.faults: %w", err)
		}
	}
	st, err := s.build(c, old)
	if err != nil {
		return err
	}
	s.start(st)
	// One generation: the routes, their mirrors and the faults swap in one step.
	swap := func() {
		s.state.Store(st)
		if faults != nil {
			s.chaos.Install(faults)
		}
	}
	if s.started.Load() {
		s.shadow.sync(old.mirrors, st, swap)
	} else {
		swap()
	}
	if s.certs != nil {
		s.certs.set(c.TLS.CertFile, c.TLS.KeyFile)
	}
	old.close(st)
	s.tel.SetConfigInfo(c.Version)
	s.log.Info("config reloaded", "source", c.Source, "version", c.Version)
	return nil
}

// restartProblems lists what c changes of oc that needs a restart, or nil.
func restartProblems(c, oc *config.Config) error {
	var p []string
	if c.Listen != oc.Listen {
		p = append(p, fmt.Sprintf("listen: changing %q to %q needs a restart", oc.Listen, c.Listen))
	}
	if c.Admin.Listen != oc.Admin.Listen {
		p = append(p, fmt.Sprintf("admin.listen: changing %q to %q needs a restart", oc.Admin.Listen, c.Admin.Listen))
	}
	if c.Chaos.Enabled != oc.Chaos.Enabled {
		p = append(p, "chaos.enabled: turning fault injection on or off needs a restart")
	}
	if c.Shadow.Store != oc.Shadow.Store {
		p = append(p, "shadow.store: changing the store file needs a restart")
	}
	if c.LoadSignals != oc.LoadSignals {
		p = append(p, "load_signals: changing it needs a restart")
	}
	if c.TLS.Enabled() != oc.TLS.Enabled() {
		p = append(p, "tls: turning TLS on or off needs a restart")
	}
	if c.Limits.MaxHeaderBytes != oc.Limits.MaxHeaderBytes {
		p = append(p, "limits.max_header_bytes: changing it needs a restart")
	}
	if ownServer(c) != ownServer(oc) {
		p = append(p, "http_server: changing the listener's server needs a restart")
	}
	if len(p) > 0 {
		return &config.ValidationError{Problems: p}
	}
	return nil
}

// served is the config the server runs for c: c itself, or with Chaos (sluice serve
// --chaos) a copy with fault injection on. The caller's config is never edited: it may be
// kept, compared or applied again.
func (o Options) served(c *config.Config) *config.Config {
	if !o.Chaos || c.Chaos.Enabled {
		return c
	}
	cc := *c
	cc.Chaos.Enabled = true
	return &cc
}

// Check reports whether Apply would take c, without applying it: the restart rules, then a
// build of every cluster and policy, torn down at once. A control plane's client checks
// what it ACKs even when it does not apply it yet. It has no effect on the serving config:
// no health check starts and the load-signal scraper keeps its endpoints.
func (s *Server) Check(c *config.Config) error {
	cc := s.opts.served(c)
	if err := restartProblems(cc, s.Config()); err != nil {
		return err
	}
	st, err := s.build(cc, nil)
	if err != nil {
		return err
	}
	st.close(nil)
	return nil
}

// CheckConfig reports what a gateway would refuse in c past its validation (config.Finish):
// every cluster, route and policy is built as New and Apply build them, and torn down at
// once. Nothing starts, listens or is contacted. A config loaded for replicas
// (config.LoadFileForReplicas) is checked without what only each replica has (its CA files,
// its tenants' keys). `sluice check` runs it.
func CheckConfig(c *config.Config) error {
	s := &Server{log: slog.New(slog.DiscardHandler), scraper: &gpu.Scraper{}}
	s.baseCtx, s.cancelBase = context.WithCancelCause(context.Background())
	defer s.cancelBase(nil)
	st, err := s.build(c, nil)
	if err != nil {
		return err
	}
	st.close(nil)
	return nil
}

// watch polls the config file and reloads it when its content changes.
func (s *Server) watch(ctx context.Context) {
	t := time.NewTicker(s.opts.WatchInterval)
	defer t.Stop()
	last := fileStamp(s.opts.ConfigPath)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if st := fileStamp(s.opts.ConfigPath); st != last {
			last = st
			_ = s.Reload()
		}
	}
}

type stamp struct {
	mod  time.Time
	size int64
}

func fileStamp(p string) stamp {
	fi, err := os.Stat(p)
	if err != nil {
		return stamp{}
	}
	return stamp{fi.ModTime(), fi.Size()}
}

// Shutdown drains: it stops accepting, lets requests in flight finish until ctx's deadline
// (the drain deadline), then cancels those left (streams end with an SSE error event) and
// closes everything.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.shutdown(ctx) })
	return s.shutdownErr
}

func (s *Server) shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.ready.Store(false)
	if s.stopWatch != nil {
		s.stopWatch()
	}
	err := s.api.Shutdown(ctx)
	if err != nil {
		s.log.Warn("drain deadline passed; cancelling requests still in flight", "err", err)
		s.cancelBase(errShutdown)
		grace, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.api.Shutdown(grace)
		cancel()
		_ = s.api.Close()
	}
	s.cancelBase(errShutdown)
	actx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = s.admin.Shutdown(actx)
	cancel()
	s.wg.Wait()
	if s.releaseProcs != nil {
		s.releaseProcs()
	}
	if s.heapFloor != nil {
		s.heapFloor.close()
	}
	s.shadow.close()
	st := s.state.Load()
	st.close(nil)
	_ = s.metricsReg.Unregister()
	_ = s.signalsReg.Unregister()
	_ = s.chaosReg.Unregister()
	_ = s.shadowReg.Unregister()
	_ = s.connReg.Unregister()
	s.tel.Registry().Unregister(s.plugins)
	_ = s.scraper.Close()
	if s.devices != nil {
		_ = s.devices.Close()
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// Run starts the server and serves until ctx is done, then drains (see Drain).
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	return s.Drain()
}

// Drain is what SIGTERM does: readiness goes off first while the listener still accepts for
// drain_delay, so that load balancers stop sending before it closes (a connection in their
// backlog would be reset); then the gateway shuts down, requests in flight running on for
// drain_timeout.
func (s *Server) Drain() error {
	s.draining.Store(true) // before readiness: a config applied meanwhile must not turn it back on
	s.ready.Store(false)
	if delay := s.Config().DrainDelay.D(); delay > 0 {
		s.log.Info("not ready; accepting for the drain delay before draining", "delay", delay)
		time.Sleep(delay)
	}
	d := s.Config().DrainTimeout.D()
	s.log.Info("draining", "deadline", d)
	dctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return s.Shutdown(dctx)
}

// certReloader serves the listener's certificate, re-reading the files when they change
// (checked at most once a second).
type certReloader struct {
	mu                sync.Mutex
	certFile, keyFile string
	cert              *tls.Certificate
	stamp             [2]stamp
	checked           time.Time
	log               *slog.Logger
}

func (c *certReloader) set(certFile, keyFile string) {
	c.mu.Lock()
	c.certFile, c.keyFile, c.checked = certFile, keyFile, time.Time{}
	c.mu.Unlock()
}

func (c *certReloader) get() (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.cert != nil && now.Sub(c.checked) < time.Second {
		return c.cert, nil
	}
	c.checked = now
	st := [2]stamp{fileStamp(c.certFile), fileStamp(c.keyFile)}
	if c.cert != nil && st == c.stamp {
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil {
			c.log.Error("TLS certificate reload failed; keeping the previous one", "err", err)
			return c.cert, nil
		}
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	if c.cert != nil {
		c.log.Info("TLS certificate reloaded", "cert", c.certFile)
	}
	c.cert, c.stamp = &cert, st
	return c.cert, nil
}
