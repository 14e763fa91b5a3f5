package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	extensionservice "github.com/envoyproxy/go-control-plane/envoy/service/extension/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	cplog "github.com/envoyproxy/go-control-plane/pkg/log"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// DefaultWatchInterval is how often the config file is checked for changes.
const DefaultWatchInterval = time.Second

// Options configure a Server.
type Options struct {
	// ConfigPath is the Sluice YAML config served (required).
	ConfigPath string
	// RouteConfig names the RouteConfiguration served (default DefaultRouteConfig).
	RouteConfig string
	// WatchInterval is how often ConfigPath is checked for changes (default 1s).
	WatchInterval time.Duration
	// Logger logs pushes and rejected files (default: discard).
	Logger *slog.Logger
	// GRPCOptions are passed to grpc.NewServer (credentials, keep-alive, limits).
	GRPCOptions []grpc.ServerOption
	// ShadowStore is the shadow store the replicas share (a postgres:// URL; a SQLite file
	// works too, for one host). With one (default: the file's shadow.store when it is a
	// postgres URL), Serve runs the weight progression of the routes with a
	// mirror.progression from the fleet's verdicts (docs/xds.md).
	ShadowStore string
	// StoreWait bounds how long Serve waits for the shadow store to open before it judges
	// once and serves (default 5s; the file's weights are served when it passes).
	StoreWait time.Duration
}

// Server serves a config file over xDS (ADS, delta and state-of-the-world, plus CDS, EDS,
// RDS and ECDS on their own services) from one go-control-plane snapshot cache. Every node
// that connects gets the current snapshot; a changed, valid file becomes a new snapshot
// (version: the config's version) pushed to every node; an invalid file is logged with every
// problem and the previous snapshot keeps being served.
type Server struct {
	opts  Options
	log   *slog.Logger
	cache cache.SnapshotCache

	mu          sync.Mutex
	current     *cache.Snapshot
	version     string           // of the snapshot served
	content     []byte           // of the file served
	tried       []byte           // of the file last read, valid or not
	streams     map[int64]string // open streams and their node ids
	file        *config.Config   // the file's config, as loaded
	fileVersion string
	gen         int                       // counts the file's accepted changes
	served      *config.Config            // file with the overlay's weights: what the snapshot holds
	overlay     map[string]int            // route → its progression split's weight, set by the control plane
	pushes      int                       // weight changes so far (the snapshot versions' "+pN")
	prog        map[string]*progressState // by route
	restored    bool                      // the weights were recovered from the store's steps (restoreWeights)

	// The progression's leadership (leading): lead is the store's progression lock (made
	// when the store opened), role this control plane's ("" until then), leaderSince when it
	// took the lead, leadErr why the lock could not be tried last.
	lead        *shadow.Leader
	role        string
	leaderSince time.Time
	leadErr     string

	// Counters for the metrics (metrics.go).
	published    map[string]int64  // snapshots pushed, by cause (pushConfig, …)
	stepCounts   map[stepKey]int64 // weight steps made, by route and decision
	readFailures map[string]int64  // by route: reads of its window or steps from the store that failed
	metrics      http.Handler      // GET /metrics

	// storeURL is the shared shadow store ("": no progression); writer, started by Serve,
	// writes the control plane's verdicts to it and holds the store read.
	storeURL string
	writer   atomic.Pointer[shadow.Writer]
	// started is closed when Serve serves: with a store, once it has judged (or, following,
	// read the leader's weights) or the store did not open in time.
	started     chan struct{}
	startedOnce sync.Once
}

// The roles of a control plane in the progression (ProgressionStatus.Role).
const (
	// RoleLeader judges the fleet's verdicts and steps the weights (recording the steps in
	// the store).
	RoleLeader = "leader"
	// RoleFollower serves the weights the leader's steps recorded in the store.
	RoleFollower = "follower"
)

// The causes of a snapshot push, as the metrics count them.
const (
	pushConfig      = "config"      // the file changed
	pushProgression = "progression" // a weight step of this control plane's
	pushStore       = "store"       // weights read from the store's steps (recovered at start, or the leader's)
)

var pushCauses = []string{pushConfig, pushProgression, pushStore}

// stepKey counts a route's weight steps by decision.
type stepKey struct {
	route    string
	decision shadow.Decision
}

// fleet is the one snapshot key: every node gets the same resources.
type fleet struct{}

// ID implements cache.NodeHash.
func (fleet) ID(*corev3.Node) string { return "fleet" }

// New loads the file (it must be valid) and builds the server. Nothing listens until Serve.
func New(opts Options) (*Server, error) {
	if opts.ConfigPath == "" {
		return nil, errors.New("xds server: no config file")
	}
	if opts.RouteConfig == "" {
		opts.RouteConfig = DefaultRouteConfig
	}
	if opts.WatchInterval <= 0 {
		opts.WatchInterval = DefaultWatchInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.StoreWait <= 0 {
		opts.StoreWait = storeWait
	}
	s := &Server{opts: opts, log: opts.Logger, streams: map[int64]string{}, overlay: map[string]int{}, prog: map[string]*progressState{},
		published: map[string]int64{}, stepCounts: map[stepKey]int64{}, readFailures: map[string]int64{}, started: make(chan struct{})}
	s.cache = cache.NewSnapshotCache(false, fleet{}, slogAdapter{opts.Logger})
	s.metrics = s.metricsHandler()
	if _, err := s.Reload(context.Background()); err != nil {
		return nil, err
	}
	s.storeURL = opts.ShadowStore
	if s.storeURL == "" && shadow.IsPostgresURL(s.file.Shadow.Store) {
		s.storeURL = s.file.Shadow.Store
	}
	return s, nil
}

// Version is the version of the snapshot being served (the config's version).
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Nodes lists the ids of the nodes connected now, sorted.
func (s *Server) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodesLocked()
}

func (s *Server) nodesLocked() []string {
	seen := map[string]bool{}
	out := []string{}
	for _, n := range s.streams {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Reload re-reads the file. Content unchanged since the last read does nothing; a valid new
// config becomes the snapshot of every node (changed reports it); an invalid one is returned
// (a *config.ValidationError lists every problem) and the old snapshot stays. The weights the
// control plane set (its progression) stay on the new config, except on the routes whose
// splits, progression split or candidate the file changed: those take the file's weights.
func (s *Server) Reload(ctx context.Context) (changed bool, err error) {
	data, err := os.ReadFile(s.opts.ConfigPath)
	if err != nil {
		return false, fmt.Errorf("xds server: read config: %w", err)
	}
	s.mu.Lock()
	same := s.current != nil && bytes.Equal(data, s.tried)
	s.tried = data
	s.mu.Unlock()
	if same {
		return false, nil
	}
	c, err := config.LoadFileForReplicas(s.opts.ConfigPath)
	if err != nil {
		return false, err
	}
	if _, err := Resources(c, s.opts.RouteConfig); err != nil {
		return false, fmt.Errorf("config %s: %w", s.opts.ConfigPath, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fileVersion == c.Version {
		s.content = data
		return false, nil
	}
	overlay, dropped := keptOverlay(s.file, c, s.overlay)
	eff := withWeights(c, overlay)
	if len(overlay) > 0 {
		if err := eff.Validate(); err != nil {
			// The file's weights with the control plane's break a rule (say, every split at
			// 0): the file's own win.
			s.log.Warn("progression: the file's new config refuses the control plane's weights; serving the file's", "err", err)
			dropped, overlay, eff = append(dropped, slices.Sorted(maps.Keys(overlay))...), map[string]int{}, c
		}
	}
	version := snapshotVersion(c.Version, overlay, s.pushes)
	if err := s.publish(ctx, eff, version, pushConfig); err != nil {
		return false, err
	}
	s.content, s.file, s.fileVersion, s.overlay = data, c, c.Version, overlay
	s.gen++
	for _, name := range dropped {
		if ps := s.prog[name]; ps != nil {
			ps.stepped = time.Time{} // a new rollout: its first promote steps at once
			ps.recovered = false
		}
		s.log.Info("progression: the file changed the route; its weights are the file's again", "route", name)
	}
	for name := range s.prog {
		if r := findRoute(c, name); r == nil || progressed(*r) == nil {
			delete(s.prog, name)
		}
	}
	return true, nil
}

// publish makes eff, under version, the snapshot of every node (called with s.mu held);
// cause is why, as the metrics count it.
func (s *Server) publish(ctx context.Context, eff *config.Config, version, cause string) error {
	res, err := Resources(eff, s.opts.RouteConfig)
	if err != nil {
		return fmt.Errorf("config %s: %w", s.opts.ConfigPath, err)
	}
	snap, err := cache.NewSnapshot(version, res)
	if err != nil {
		return fmt.Errorf("xds server: snapshot: %w", err)
	}
	// One snapshot for the fleet (the cache's node hash maps every node to it).
	if err := s.cache.SetSnapshot(ctx, fleet{}.ID(nil), snap); err != nil {
		return fmt.Errorf("xds server: snapshot: %w", err)
	}
	s.current, s.version, s.served = snap, version, eff
	s.published[cause]++
	return nil
}

// seen records a stream's node the first time the stream asks for anything.
func (s *Server) seen(stream int64, node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[stream]; ok {
		return
	}
	s.streams[stream] = node
	s.log.Info("xds node connected", "node", node, "version", s.version)
}

func (s *Server) closed(stream int64, node *corev3.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[stream]; ok {
		delete(s.streams, stream)
		s.log.Info("xds node disconnected", "node", node.GetId())
	}
}

func (s *Server) callbacks() xdsserver.Callbacks {
	return xdsserver.CallbackFuncs{
		StreamRequestFunc: func(id int64, r *discoverygrpc.DiscoveryRequest) error {
			if n := r.GetNode().GetId(); n != "" {
				s.seen(id, n)
			}
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discoverygrpc.DeltaDiscoveryRequest) error {
			if n := r.GetNode().GetId(); n != "" {
				s.seen(id, n)
			}
			return nil
		},
		StreamClosedFunc:      s.closed,
		DeltaStreamClosedFunc: s.closed,
	}
}

// Serve serves xDS on ln and watches the file until ctx ends; then it stops the gRPC server
// (closing the streams) and returns nil. It closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	xs := xdsserver.NewServer(ctx, s.cache, s.callbacks())
	// Clients may ping every 10s even without a stream (grpc's default policy allows one ping
	// every 5 minutes and answers more with GOAWAY "too_many_pings", cutting idle replicas off).
	gopts := append([]grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime: 10 * time.Second, PermitWithoutStream: true})}, s.opts.GRPCOptions...)
	gs := grpc.NewServer(gopts...)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(gs, xs)
	clusterservice.RegisterClusterDiscoveryServiceServer(gs, xs)
	endpointservice.RegisterEndpointDiscoveryServiceServer(gs, xs)
	routeservice.RegisterRouteDiscoveryServiceServer(gs, xs)
	extensionservice.RegisterExtensionConfigDiscoveryServiceServer(gs, xs)

	var wg sync.WaitGroup
	if s.storeURL != "" {
		w := s.startProgression(ctx)
		defer func() {
			cctx, ccancel := context.WithTimeout(context.Background(), writerCloseWait)
			defer ccancel()
			s.releaseLead(cctx, w)
			if err := w.Close(cctx); err != nil {
				s.log.Warn("shadow store close", "err", err)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.progressLoop(ctx)
		}()
	} else if s.hasProgression() {
		s.log.Info("progression off: no shared shadow store (--shadow-store, or a postgres:// shadow.store in the file); the routes' weights are the file's")
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watch(ctx)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(ln) }()
	s.startedOnce.Do(func() { close(s.started) })
	s.log.Info("xds control plane serving", "addr", ln.Addr().String(), "config", s.opts.ConfigPath, "version", s.Version())

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("xds server: %w", err)
	}
	cancel()
	gs.Stop() // xDS streams never end by themselves: a graceful stop would wait forever
	if err == nil {
		<-serveErr
	}
	wg.Wait()
	return err
}

// hasProgression reports whether a route of the file has a mirror.progression.
func (s *Server) hasProgression() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.file.Routes, func(r config.Route) bool { return progressed(r) != nil })
}

// startProgression starts the writer of the shared store and, before anything is served,
// waits for it (at most Options.StoreWait), recovers the weights the steps recorded in the
// store set (restoreWeights) and judges once: a control plane that restarts thus serves the
// weights it had set (a promotion or a rollback), and a candidate the fleet's verdict rolls
// back at weight 0, from its first snapshot, not the file's weights for an interval. A
// control plane that does not get the lead (another leads) serves the leader's weights from
// its first snapshot instead.
func (s *Server) startProgression(ctx context.Context) *shadow.Writer {
	opened := make(chan struct{})
	url := s.storeURL
	w := shadow.StartWriter(func(ctx context.Context) (*shadow.Store, error) { return shadow.OpenStore(ctx, url) },
		shadow.WriterConfig{Log: s.log.With("component", "shadow store"), OnOpen: func(*shadow.Store) { close(opened) }})
	s.writer.Store(w)
	t := time.NewTimer(s.opts.StoreWait)
	defer t.Stop()
	select {
	case <-opened:
	case <-t.C:
		s.log.Warn("progression: the shadow store did not open in time; serving the file's weights until it does",
			"store", shadow.RedactDSN(url), "err", w.Stats().LastError)
	case <-ctx.Done():
		return w
	}
	s.judgeAll(ctx, time.Now())
	s.mu.Lock()
	role := s.role
	s.mu.Unlock()
	s.log.Info("progression on: the fleet's verdicts step the weights of routes with a mirror.progression",
		"store", shadow.RedactDSN(url), "role", role, "version", s.Version())
	return w
}

// progressLoop judges (or, following, reads the leader's weights) every shadow.interval
// (the served config's) until ctx ends.
func (s *Server) progressLoop(ctx context.Context) {
	for {
		s.mu.Lock()
		d := s.file.Shadow.JudgeInterval()
		s.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.judgeAll(ctx, time.Now())
	}
}

func (s *Server) watch(ctx context.Context) {
	t := time.NewTicker(s.opts.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := s.Reload(ctx)
		var ve *config.ValidationError
		switch {
		case errors.As(err, &ve):
			s.log.Error("config file rejected; the previous snapshot keeps being served",
				"file", s.opts.ConfigPath, "version", s.Version(), "problems", len(ve.Problems))
			for _, p := range ve.Problems {
				s.log.Error("config problem", "file", s.opts.ConfigPath, "problem", p)
			}
		case err != nil:
			s.log.Error("config file rejected; the previous snapshot keeps being served", "file", s.opts.ConfigPath, "err", err)
		case changed:
			s.log.Info("config pushed", "file", s.opts.ConfigPath, "version", s.Version(), "nodes", len(s.Nodes()))
		}
	}
}

// slogAdapter is go-control-plane's logger on slog (its debug chatter at debug level).
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Debugf(format string, args ...any) { a.l.Debug(fmt.Sprintf(format, args...)) }
func (a slogAdapter) Infof(format string, args ...any)  { a.l.Debug(fmt.Sprintf(format, args...)) }
func (a slogAdapter) Warnf(format string, args ...any)  { a.l.Warn(fmt.Sprintf(format, args...)) }
func (a slogAdapter) Errorf(format string, args ...any) { a.l.Error(fmt.Sprintf(format, args...)) }

var _ cplog.Logger = slogAdapter{}
