package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
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

	mu      sync.Mutex
	current *cache.Snapshot
	version string
	content []byte           // of the file served
	tried   []byte           // of the file last read, valid or not
	streams map[int64]string // open streams and their node ids
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
	s := &Server{opts: opts, log: opts.Logger, streams: map[int64]string{}}
	s.cache = cache.NewSnapshotCache(false, fleet{}, slogAdapter{opts.Logger})
	if _, err := s.Reload(context.Background()); err != nil {
		return nil, err
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
// (a *config.ValidationError lists every problem) and the old snapshot stays.
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
	res, err := Resources(c, s.opts.RouteConfig)
	if err != nil {
		return false, fmt.Errorf("config %s: %w", s.opts.ConfigPath, err)
	}
	snap, err := cache.NewSnapshot(c.Version, res)
	if err != nil {
		return false, fmt.Errorf("xds server: snapshot: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.version == c.Version {
		s.content = data
		return false, nil
	}
	s.current, s.version, s.content = snap, c.Version, data
	// One snapshot for the fleet (the cache's node hash maps every node to it).
	if err := s.cache.SetSnapshot(ctx, fleet{}.ID(nil), snap); err != nil {
		return true, fmt.Errorf("xds server: snapshot: %w", err)
	}
	return true, nil
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
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watch(ctx)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(ln) }()
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
