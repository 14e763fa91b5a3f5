package xds_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/xds"
)

// ---- an in-process go-control-plane management server ----

// seenRequest is one discovery request the management server got.
type seenRequest struct {
	at        time.Time
	delta     bool
	typeURL   string
	nonce     string
	version   string
	errMsg    string
	subscribe []string
	unsub     []string
	initial   map[string]string
}

// seenResponse is one delta discovery response the management server sent.
type seenResponse struct {
	typeURL string
	nonce   string
	names   []string
	removed []string
}

// mgmtServer is go-control-plane's snapshot cache and xDS server on 127.0.0.1.
type mgmtServer struct {
	cache cachev3.SnapshotCache
	addr  string
	gs    *grpc.Server
	stopX context.CancelFunc
	done  chan struct{}

	mu    sync.Mutex
	reqs  []seenRequest
	resps []seenResponse
	once  sync.Once
}

// startMgmt serves cache (a new one when nil) on addr ("127.0.0.1:0" for any port) until
// stop or the end of the test.
func startMgmt(t *testing.T, addr string, cache cachev3.SnapshotCache, opts ...grpc.ServerOption) *mgmtServer {
	t.Helper()
	if cache == nil {
		cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	}
	var (
		lis net.Listener
		err error
	)
	deadline := time.Now().Add(5 * time.Second)
	for { // the port of a server just stopped may take a moment to be free again
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	m := &mgmtServer{cache: cache, addr: lis.Addr().String(), gs: grpc.NewServer(opts...), done: make(chan struct{})}
	cb := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			m.record(seenRequest{typeURL: r.GetTypeUrl(), nonce: r.GetResponseNonce(), version: r.GetVersionInfo(),
				errMsg: r.GetErrorDetail().GetMessage(), subscribe: r.GetResourceNames()})
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			m.record(seenRequest{delta: true, typeURL: r.GetTypeUrl(), nonce: r.GetResponseNonce(),
				errMsg: r.GetErrorDetail().GetMessage(), subscribe: r.GetResourceNamesSubscribe(), unsub: r.GetResourceNamesUnsubscribe(), initial: r.GetInitialResourceVersions()})
			return nil
		},
		StreamDeltaResponseFunc: func(_ int64, _ *discoveryv3.DeltaDiscoveryRequest, r *discoveryv3.DeltaDiscoveryResponse) {
			sr := seenResponse{typeURL: r.GetTypeUrl(), nonce: r.GetNonce(), removed: slices.Clone(r.GetRemovedResources())}
			for _, res := range r.GetResources() {
				sr.names = append(sr.names, res.GetName())
			}
			m.mu.Lock()
			m.resps = append(m.resps, sr)
			m.mu.Unlock()
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.stopX = cancel
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(m.gs, serverv3.NewServer(ctx, cache, cb))
	go func() {
		defer close(m.done)
		_ = m.gs.Serve(lis)
	}()
	t.Cleanup(m.stop)
	return m
}

func (m *mgmtServer) record(r seenRequest) {
	r.at = time.Now()
	m.mu.Lock()
	m.reqs = append(m.reqs, r)
	m.mu.Unlock()
}

func (m *mgmtServer) stop() {
	m.once.Do(func() {
		m.stopX()
		m.gs.Stop()
		<-m.done
	})
}

// requests returns the requests seen so far that match.
func (m *mgmtServer) requests(match func(seenRequest) bool) []seenRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return filter(m.reqs, match)
}

// responses returns the delta responses sent so far that match.
func (m *mgmtServer) responses(match func(seenResponse) bool) []seenResponse {
	m.mu.Lock()
	defer m.mu.Unlock()
	return filter(m.resps, match)
}

func filter[T any](xs []T, match func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if match(x) {
			out = append(out, x)
		}
	}
	return out
}

func (m *mgmtServer) nacks(typeURL string) []seenRequest {
	return m.requests(func(r seenRequest) bool { return r.typeURL == typeURL && r.errMsg != "" })
}

func (m *mgmtServer) acks(typeURL string) []seenRequest {
	return m.requests(func(r seenRequest) bool { return r.typeURL == typeURL && r.nonce != "" && r.errMsg == "" })
}

// set publishes a snapshot for the node.
func (m *mgmtServer) set(t *testing.T, node string, s *cachev3.Snapshot) {
	t.Helper()
	if err := m.cache.SetSnapshot(context.Background(), node, s); err != nil {
		t.Fatalf("SetSnapshot: %v", err)
	}
}

// ---- Envoy resources ----

type resSet struct {
	clusters []*clusterv3.Cluster
	clas     []*endpointv3.ClusterLoadAssignment
	routes   []*routev3.RouteConfiguration
	policy   *corev3.TypedExtensionConfig
	noPolicy bool // serve no ECDS resource at all
}

func (r resSet) snapshot(t *testing.T, version string) *cachev3.Snapshot {
	t.Helper()
	m := map[resource.Type][]types.Resource{}
	for _, c := range r.clusters {
		m[resource.ClusterType] = append(m[resource.ClusterType], c)
	}
	for _, c := range r.clas {
		m[resource.EndpointType] = append(m[resource.EndpointType], c)
	}
	for _, c := range r.routes {
		m[resource.RouteType] = append(m[resource.RouteType], c)
	}
	if r.policy == nil && !r.noPolicy {
		r.policy = emptyPolicy(t) // as sluice xds always serves one
	}
	if r.policy != nil {
		m[resource.ExtensionConfigType] = []types.Resource{r.policy}
	}
	s, err := cachev3.NewSnapshot(version, m)
	if err != nil {
		t.Fatalf("NewSnapshot: %v", err)
	}
	return s
}

func socketEndpoint(hostport string) *endpointv3.LbEndpoint {
	host, port, _ := net.SplitHostPort(hostport)
	var p uint32
	fmt.Sscan(port, &p)
	return &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: p},
		}}},
	}}}
}

func assignment(name string, hostports ...string) *endpointv3.ClusterLoadAssignment {
	var eps []*endpointv3.LbEndpoint
	for _, hp := range hostports {
		eps = append(eps, socketEndpoint(hp))
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}}}
}

func viaEDS(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ConnectTimeout:       durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}},
	}
}

func static(name string, hostports ...string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ConnectTimeout:       durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment:       assignment(name, hostports...),
	}
}

// routesTo is the route configuration "sluice" with one catch-all route to cluster.
func routesTo(cluster string, policy *anypb.Any) *routev3.RouteConfiguration {
	r := &routev3.Route{
		Name:  "all",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
		}},
	}
	if policy != nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{xds.PolicyName: policy}
	}
	return &routev3.RouteConfiguration{Name: "sluice", VirtualHosts: []*routev3.VirtualHost{{Name: "all", Domains: []string{"*"}, Routes: []*routev3.Route{r}}}}
}

func typedStructOf(t *testing.T, v map[string]any) *anypb.Any {
	t.Helper()
	s, err := structpb.NewStruct(v)
	if err != nil {
		t.Fatal(err)
	}
	a, err := anypb.New(&xdstypev3.TypedStruct{TypeUrl: xds.RoutePolicyTypeURL, Value: s})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// ---- the client under test ----

type harness struct {
	client *xds.Client
	cancel context.CancelFunc
	done   chan error

	mu      sync.Mutex
	applied []*config.Config
	refuse  func(*config.Config) error
}

type clientOpt func(*xds.ClientOptions)

// runClient runs a client against addr (delta unless sotw) until the end of the test; the
// applied configs are recorded.
func runClient(t *testing.T, addr string, delta bool, opts ...clientOpt) *harness {
	t.Helper()
	h := &harness{done: make(chan error, 1)}
	topts := xds.TranslateOptions{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", RouteConfig: "sluice"}
	o := xds.ClientOptions{
		Bootstrap: xds.Bootstrap{NodeID: "node-1", Server: addr, RouteConfig: "sluice", Delta: delta},
		Translate: func(r xds.Resources) (*config.Config, error) { return xds.Translate(r, topts) },
		Apply: func(c *config.Config) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.refuse != nil {
				if err := h.refuse(c); err != nil {
					return err
				}
			}
			h.applied = append(h.applied, c)
			return nil
		},
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReconnectBase: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		WarmTimeout: 5 * time.Second,
	}
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, f := range opts {
		f(&o)
	}
	c, err := xds.NewClient(o)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	h.client = c
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- c.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		panic("xds client did not stop within 10s")
	}
}

func (h *harness) last() *config.Config {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.applied) == 0 {
		return nil
	}
	return h.applied[len(h.applied)-1]
}

func (h *harness) all() []*config.Config {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.applied)
}

func endpointsOf(c *config.Config, cluster string) []string {
	if c == nil {
		return nil
	}
	for _, cl := range c.Clusters {
		if cl.Name == cluster {
			var out []string
			for _, ep := range cl.Endpoints {
				out = append(out, ep.URL)
			}
			return out
		}
	}
	return nil
}

func routeClusterOf(c *config.Config) string {
	if c == nil || len(c.Routes) == 0 {
		return ""
	}
	return c.Routes[0].Cluster
}

// waitFor polls cond every 5ms for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noLeaks checks, after every other cleanup, that the test left no goroutine behind.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

func modes(t *testing.T, f func(t *testing.T, delta bool)) {
	t.Run("delta", func(t *testing.T) { f(t, true) })
	t.Run("sotw", func(t *testing.T) { f(t, false) })
}

// ---- tests ----

func TestClientAppliesAndACKs(t *testing.T) {
	modes(t, func(t *testing.T, delta bool) {
		noLeaks(t)
		m := startMgmt(t, "127.0.0.1:0", nil)
		v1 := resSet{
			clusters: []*clusterv3.Cluster{viaEDS("a"), static("b", "127.0.0.1:9002")},
			clas:     []*endpointv3.ClusterLoadAssignment{assignment("a", "127.0.0.1:9001")},
			routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
		}
		m.set(t, "node-1", v1.snapshot(t, "v1"))
		h := runClient(t, m.addr, delta)

		waitFor(t, 5*time.Second, "the first config", func() bool { return h.last() != nil })
		first := h.all()[0]
		if got := endpointsOf(first, "a"); !slices.Equal(got, []string{"http://127.0.0.1:9001"}) {
			t.Errorf("first config: cluster a endpoints = %v; the config should wait for EDS", got)
		}
		if routeClusterOf(first) != "a" {
			t.Errorf("first config: routes = %+v; the config should wait for RDS", first.Routes)
		}
		for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.RouteType} {
			waitFor(t, 5*time.Second, "an ACK of "+typ, func() bool { return len(m.acks(typ)) > 0 })
		}
		if n := m.nacks(resource.ClusterType); len(n) > 0 {
			t.Errorf("unexpected NACK: %q", n[0].errMsg)
		}

		// A new EDS cluster: the client subscribes to its endpoints and the config waits for them.
		v2 := v1
		v2.clusters = append(slices.Clone(v1.clusters), viaEDS("c"))
		v2.clas = append(slices.Clone(v1.clas), assignment("c", "127.0.0.1:9003"))
		v2.routes = []*routev3.RouteConfiguration{routesTo("c", nil)}
		m.set(t, "node-1", v2.snapshot(t, "v2"))
		waitFor(t, 5*time.Second, "the route to c", func() bool { return routeClusterOf(h.last()) == "c" })
		for _, c := range h.all() {
			if slices.ContainsFunc(c.Clusters, func(cl config.Cluster) bool { return cl.Name == "c" && len(cl.Endpoints) == 0 }) {
				t.Errorf("config %s applied with cluster c still without endpoints", c.Version)
			}
		}
		if got := endpointsOf(h.last(), "c"); !slices.Equal(got, []string{"http://127.0.0.1:9003"}) {
			t.Errorf("cluster c endpoints = %v", got)
		}
		st := h.client.Status()
		if st.State != xds.StateConnected || st.ConfigVersion != h.last().Version || !h.client.Ready() {
			t.Errorf("status = %+v, want connected at %s", st, h.last().Version)
		}
		for _, ts := range st.Types {
			if ts.Type == "eds" && (ts.Resources["a"] == "" || ts.Resources["c"] == "") {
				t.Errorf("eds resources = %v", ts.Resources)
			}
		}

		// Cluster a goes away: its endpoints are dropped and no longer subscribed to.
		v3 := resSet{
			clusters: []*clusterv3.Cluster{static("b", "127.0.0.1:9002"), viaEDS("c")},
			clas:     []*endpointv3.ClusterLoadAssignment{assignment("c", "127.0.0.1:9003")},
			routes:   []*routev3.RouteConfiguration{routesTo("c", nil)},
		}
		m.set(t, "node-1", v3.snapshot(t, "v3"))
		waitFor(t, 5*time.Second, "cluster a to go", func() bool {
			c := h.last()
			return !slices.ContainsFunc(c.Clusters, func(cl config.Cluster) bool { return cl.Name == "a" })
		})
		waitFor(t, 5*time.Second, "the endpoints of a to go", func() bool {
			for _, ts := range h.client.Status().Types {
				if ts.Type == "eds" {
					_, hasA := ts.Resources["a"]
					return !hasA && ts.Resources["c"] != ""
				}
			}
			return false
		})
		if delta {
			waitFor(t, 5*time.Second, "the EDS unsubscription", func() bool {
				return len(m.requests(func(r seenRequest) bool {
					return r.typeURL == resource.EndpointType && slices.Contains(r.unsub, "a")
				})) > 0
			})
		} else {
			waitFor(t, 5*time.Second, "the EDS resource names without a", func() bool {
				return len(m.requests(func(r seenRequest) bool {
					return r.typeURL == resource.EndpointType && slices.Equal(r.subscribe, []string{"c"})
				})) > 0
			})
		}
		if n := m.nacks(resource.EndpointType); len(n) > 0 {
			t.Errorf("unexpected EDS NACK: %q", n[0].errMsg)
		}
	})
}

func TestClientIgnoresABadPersistedFile(t *testing.T) {
	noLeaks(t)
	persist := filepath.Join(t.TempDir(), "xds.json")
	if err := os.WriteFile(persist, []byte(`{"format": "sluice-xds-resources/v1", "resources": [{"type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "a", "value": "bm90IGEgcHJvdG8="}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	h := runClient(t, dead, true, func(o *xds.ClientOptions) { o.Bootstrap.PersistPath = persist })
	waitFor(t, 5*time.Second, "a few connection attempts", func() bool { return h.client.Status().Reconnects >= 2 })
	if h.client.Ready() || h.last() != nil {
		t.Error("a config was applied from a corrupt file")
	}
}

func TestClientNACKsAndKeepsTheLastGoodConfig(t *testing.T) {
	modes(t, func(t *testing.T, delta bool) {
		noLeaks(t)
		m := startMgmt(t, "127.0.0.1:0", nil)
		good := resSet{
			clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001")},
			routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
		}
		m.set(t, "node-1", good.snapshot(t, "v1"))
		h := runClient(t, m.addr, delta, func(o *xds.ClientOptions) { o.NackBase = 20 * time.Millisecond })
		waitFor(t, 5*time.Second, "the first config", func() bool { return h.last() != nil })
		v1 := h.last().Version

		// Two clusters that fail Envoy's own validation: both problems in one NACK.
		bad1, bad2 := static("x", "127.0.0.1:9005"), static("y", "127.0.0.1:9006")
		bad1.ConnectTimeout = durationpb.New(-time.Second)
		bad2.ConnectTimeout = durationpb.New(-time.Second)
		badCDS := good
		badCDS.clusters = append(slices.Clone(good.clusters), bad1, bad2)
		m.set(t, "node-1", badCDS.snapshot(t, "v2"))
		waitFor(t, 5*time.Second, "a CDS NACK", func() bool { return len(m.nacks(resource.ClusterType)) > 0 })
		msg := m.nacks(resource.ClusterType)[0].errMsg
		for _, want := range []string{`cds "x"`, `cds "y"`, "ConnectTimeout"} {
			if !strings.Contains(msg, want) {
				t.Errorf("error_detail %q lacks %q", msg, want)
			}
		}
		if h.last().Version != v1 {
			t.Errorf("config changed to %s after a NACK", h.last().Version)
		}

		// Translation problems: an unknown key in the route's sluice.policy TypedStruct and an
		// unsupported lb_policy; every one listed.
		maglev := static("m", "127.0.0.1:9007")
		maglev.LbPolicy = clusterv3.Cluster_MAGLEV
		badTr := resSet{
			clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001"), maglev},
			routes:   []*routev3.RouteConfiguration{routesTo("a", typedStructOf(t, map[string]any{"modle": "x"}))},
		}
		before := len(m.nacks(resource.RouteType)) + len(m.nacks(resource.ClusterType))
		m.set(t, "node-1", badTr.snapshot(t, "v3"))
		waitFor(t, 5*time.Second, "NACKs of v3", func() bool {
			all := append(m.nacks(resource.RouteType), m.nacks(resource.ClusterType)...)
			if len(all) <= before {
				return false
			}
			joined := ""
			for _, r := range all {
				joined += r.errMsg + "\n"
			}
			return strings.Contains(joined, "modle") && strings.Contains(joined, "MAGLEV")
		})
		st := h.client.Status()
		if st.ConfigVersion != v1 || h.last().Version != v1 {
			t.Errorf("serving %s / %s after NACKs, want %s", st.ConfigVersion, h.last().Version, v1)
		}
		var nacked bool
		for _, ts := range st.Types {
			if ts.LastNack != nil && len(ts.LastNack.Errors) > 0 && ts.NACKs > 0 {
				nacked = true
			}
		}
		if !nacked {
			t.Errorf("status shows no NACK: %+v", st.Types)
		}

		// The gateway refusing a config (Apply's error) is a NACK too.
		h.mu.Lock()
		h.refuse = func(c *config.Config) error {
			if endpointsOf(c, "r") != nil {
				return &config.ValidationError{Problems: []string{"listen: changing it needs a restart"}}
			}
			return nil
		}
		h.mu.Unlock()
		refused := resSet{clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001"), static("r", "127.0.0.1:9008")},
			routes: []*routev3.RouteConfiguration{routesTo("a", nil)}}
		m.set(t, "node-1", refused.snapshot(t, "v4"))
		waitFor(t, 5*time.Second, "a NACK for the refused config", func() bool {
			return slices.ContainsFunc(m.nacks(resource.ClusterType), func(r seenRequest) bool { return strings.Contains(r.errMsg, "needs a restart") })
		})

		// A later good update is ACKed and applied.
		fixed := resSet{clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001"), static("b", "127.0.0.1:9002")},
			routes: []*routev3.RouteConfiguration{routesTo("b", nil)}}
		m.set(t, "node-1", fixed.snapshot(t, "v5"))
		waitFor(t, 5*time.Second, "the good update", func() bool { return routeClusterOf(h.last()) == "b" })
		waitFor(t, 5*time.Second, "the status to follow", func() bool { return h.client.Status().ConfigVersion == h.last().Version })
	})
}

func TestClientNACKsAWaitingConfigThatFailsCheck(t *testing.T) {
	noLeaks(t)
	m := startMgmt(t, "127.0.0.1:0", nil)
	good := resSet{
		clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001")},
		routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
	}
	m.set(t, "node-1", good.snapshot(t, "v1"))
	const checkMsg = "cluster quarantined: refused by the gateway's check"
	hasQuarantined := func(c *config.Config) bool {
		return slices.ContainsFunc(c.Clusters, func(cl config.Cluster) bool { return cl.Name == "quarantined" })
	}
	var (
		checkMu           sync.Mutex
		checkedBad, passd int
	)
	h := runClient(t, m.addr, true, func(o *xds.ClientOptions) {
		// Short: a waiting config wrongly ACKed would be applied by the warm time-out.
		o.WarmTimeout = 200 * time.Millisecond
		o.Check = func(c *config.Config) error {
			checkMu.Lock()
			defer checkMu.Unlock()
			if hasQuarantined(c) {
				checkedBad++
				return &config.ValidationError{Problems: []string{checkMsg}}
			}
			passd++
			return nil
		}
	})
	waitFor(t, 5*time.Second, "the first config", func() bool { return routeClusterOf(h.last()) == "a" })
	v1 := h.last().Version

	// An EDS cluster whose endpoints never come, and a route to it: the config would wait for
	// them, and Check refuses it, so it is NACKed with Check's problem rather than ACKed.
	bad := resSet{
		clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001"), viaEDS("quarantined")},
		routes:   []*routev3.RouteConfiguration{routesTo("quarantined", nil)},
	}
	m.set(t, "node-1", bad.snapshot(t, "v2"))
	waitFor(t, 5*time.Second, "a CDS NACK with Check's problem", func() bool {
		return slices.ContainsFunc(m.nacks(resource.ClusterType), func(r seenRequest) bool { return strings.Contains(r.errMsg, checkMsg) })
	})
	for _, typ := range []string{resource.ClusterType, resource.RouteType} {
		for _, n := range m.nacks(typ) {
			if !strings.Contains(n.errMsg, checkMsg) {
				t.Errorf("%s NACK %q lacks Check's problem", typ, n.errMsg)
			}
		}
	}
	// Nothing was subscribed for the refused cluster's endpoints: its CDS update was not accepted.
	if r := m.requests(func(r seenRequest) bool {
		return r.typeURL == resource.EndpointType && slices.Contains(r.subscribe, "quarantined")
	}); len(r) > 0 {
		t.Errorf("EDS subscription to the refused cluster: %+v", r[0])
	}
	// Well past the warm time-out: nothing waited, nothing was applied.
	time.Sleep(4 * 200 * time.Millisecond)
	st := h.client.Status()
	if len(st.Waiting) > 0 {
		t.Errorf("status waiting = %v after a NACK", st.Waiting)
	}
	if st.ConfigVersion != v1 || h.last().Version != v1 {
		t.Errorf("serving %s / %s after the NACK, want %s", st.ConfigVersion, h.last().Version, v1)
	}
	var cdsNack *xds.NackStatus
	for _, ts := range st.Types {
		if ts.Type == "cds" {
			cdsNack = ts.LastNack
		}
	}
	if cdsNack == nil || !slices.Contains(cdsNack.Errors, checkMsg) {
		t.Errorf("cds last NACK = %+v, want Check's problem", cdsNack)
	}
	checkMu.Lock()
	if checkedBad == 0 {
		t.Error("Check never saw the waiting config")
	}
	checkMu.Unlock()

	// A good update that waits for its endpoints passes Check: ACKed, then applied once they came.
	acksBefore := len(m.acks(resource.ClusterType))
	fixed := resSet{
		clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001"), viaEDS("b")},
		clas:     []*endpointv3.ClusterLoadAssignment{assignment("b", "127.0.0.1:9002")},
		routes:   []*routev3.RouteConfiguration{routesTo("b", nil)},
	}
	m.set(t, "node-1", fixed.snapshot(t, "v3"))
	waitFor(t, 5*time.Second, "the good update", func() bool {
		return routeClusterOf(h.last()) == "b" && slices.Equal(endpointsOf(h.last(), "b"), []string{"http://127.0.0.1:9002"})
	})
	waitFor(t, 5*time.Second, "its CDS ACK", func() bool { return len(m.acks(resource.ClusterType)) > acksBefore })
	waitFor(t, 5*time.Second, "the status to follow", func() bool { return h.client.Status().ConfigVersion == h.last().Version })
	checkMu.Lock()
	if passd == 0 {
		t.Error("Check was not asked about the good waiting config")
	}
	checkMu.Unlock()
	for _, c := range h.all() {
		if hasQuarantined(c) {
			t.Errorf("Apply was called with config %s, which Check refused", c.Version)
		}
	}
}

func TestClientKeepsTheRouteConfigurationTheServerRemoves(t *testing.T) {
	noLeaks(t)
	m := startMgmt(t, "127.0.0.1:0", nil)
	v1 := resSet{
		clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001")},
		routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
	}
	m.set(t, "node-1", v1.snapshot(t, "v1"))
	const warm = 200 * time.Millisecond
	h := runClient(t, m.addr, true, func(o *xds.ClientOptions) { o.WarmTimeout = warm })
	waitFor(t, 5*time.Second, "the first config", func() bool { return routeClusterOf(h.last()) == "a" })

	// The route configuration leaves the snapshot (and a cluster is added): the delta server
	// sends removed_resources ["sluice"]; the client ignores it and keeps its routes.
	rdsAcks := len(m.acks(resource.RouteType))
	v2 := resSet{clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001"), static("b", "127.0.0.1:9002")}}
	m.set(t, "node-1", v2.snapshot(t, "v2"))
	waitFor(t, 5*time.Second, "the removal of the route configuration", func() bool {
		return len(m.responses(func(r seenResponse) bool {
			return r.typeURL == resource.RouteType && slices.Contains(r.removed, "sluice")
		})) > 0
	})
	removal := m.responses(func(r seenResponse) bool {
		return r.typeURL == resource.RouteType && slices.Contains(r.removed, "sluice")
	})[0]
	waitFor(t, 5*time.Second, "the ACK of the removal", func() bool {
		return len(m.requests(func(r seenRequest) bool {
			return r.typeURL == resource.RouteType && r.nonce == removal.nonce && r.errMsg == ""
		})) > 0
	})
	if n := m.nacks(resource.RouteType); len(n) > 0 {
		t.Errorf("unexpected RDS NACK: %q", n[0].errMsg)
	}
	if got := len(m.acks(resource.RouteType)); got <= rdsAcks {
		t.Errorf("RDS ACKs = %d, want more than %d", got, rdsAcks)
	}
	waitFor(t, 5*time.Second, "the config with cluster b", func() bool { return endpointsOf(h.last(), "b") != nil })
	// Well past the warm time-out: the client did not go back to waiting for the route
	// configuration, nor apply a config without routes.
	time.Sleep(4 * warm)
	for _, c := range h.all() {
		if routeClusterOf(c) != "a" {
			t.Errorf("config %s applied with routes %+v, want the last route configuration kept", c.Version, c.Routes)
		}
	}
	st := h.client.Status()
	if len(st.Waiting) > 0 {
		t.Errorf("status waiting = %v after the removal", st.Waiting)
	}
	if st.ConfigVersion != h.last().Version || !h.client.Ready() {
		t.Errorf("status = %+v, want serving %s", st, h.last().Version)
	}
	for _, ts := range st.Types {
		if ts.Type == "rds" && ts.Resources["sluice"] == "" {
			t.Errorf("rds resources = %v, want sluice kept", ts.Resources)
		}
	}

	// The route configuration comes back (changed): applied as usual.
	v3 := v2
	v3.routes = []*routev3.RouteConfiguration{routesTo("b", nil)}
	m.set(t, "node-1", v3.snapshot(t, "v3"))
	waitFor(t, 5*time.Second, "the route configuration again", func() bool { return routeClusterOf(h.last()) == "b" })
	waitFor(t, 5*time.Second, "the status to follow", func() bool { return h.client.Status().ConfigVersion == h.last().Version })
	if n := m.nacks(resource.RouteType); len(n) > 0 {
		t.Errorf("unexpected RDS NACK: %q", n[0].errMsg)
	}
}

func TestClientBacksOffIdenticalNACKs(t *testing.T) {
	noLeaks(t)
	m := startMgmt(t, "127.0.0.1:0", nil)
	bad := static("x", "127.0.0.1:9005")
	bad.ConnectTimeout = durationpb.New(-time.Second)
	m.set(t, "node-1", resSet{clusters: []*clusterv3.Cluster{bad}}.snapshot(t, "v1"))
	// State-of-the-world: go-control-plane resends a NACKed snapshot at once, forever.
	start := time.Now()
	h := runClient(t, m.addr, false, func(o *xds.ClientOptions) {
		o.NackBase, o.NackMax = 50*time.Millisecond, 200*time.Millisecond
	})
	waitFor(t, 5*time.Second, "four NACKs", func() bool { return len(m.nacks(resource.ClusterType)) >= 4 })
	n := m.nacks(resource.ClusterType)
	// Waits of 50, 100 and 200ms between the first four (some slack for delivery).
	if gap := n[3].at.Sub(n[0].at); gap < 300*time.Millisecond {
		t.Errorf("four identical NACKs within %v: no back-off", gap)
	}
	waitFor(t, 5*time.Second, "one second of rejections", func() bool { return time.Since(start) > time.Second })
	if got := len(m.nacks(resource.ClusterType)); got > 15 {
		t.Errorf("%d NACKs in about a second: the back-off does not hold", got)
	}
	if h.last() != nil {
		t.Errorf("a config was applied from rejected resources")
	}
	if h.client.Ready() {
		t.Error("ready without a good config")
	}
	var repeats int
	for _, ts := range h.client.Status().Types {
		if ts.Type == "cds" && ts.LastNack != nil {
			repeats = ts.LastNack.Repeats
		}
	}
	if repeats < 3 {
		t.Errorf("last NACK repeats = %d, want the identical rejections counted", repeats)
	}
}

func TestClientReconnects(t *testing.T) {
	modes(t, func(t *testing.T, delta bool) {
		noLeaks(t)
		v1 := resSet{
			clusters: []*clusterv3.Cluster{viaEDS("a")},
			clas:     []*endpointv3.ClusterLoadAssignment{assignment("a", "127.0.0.1:9001")},
			routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
		}
		m1 := startMgmt(t, "127.0.0.1:0", nil)
		m1.set(t, "node-1", v1.snapshot(t, "v1"))
		h := runClient(t, m1.addr, delta)
		waitFor(t, 5*time.Second, "the first config", func() bool { return h.last() != nil })
		served := h.last().Version

		m1.stop()
		waitFor(t, 5*time.Second, "the client to notice", func() bool { return h.client.Status().State != xds.StateConnected })
		if h.last().Version != served || !h.client.Ready() {
			t.Fatalf("the config changed while the control plane was down")
		}

		// A new management server on the same address with the same snapshot.
		m2 := startMgmt(t, m1.addr, nil)
		m2.set(t, "node-1", v1.snapshot(t, "v1"))
		waitFor(t, 5*time.Second, "reconnection", func() bool {
			st := h.client.Status()
			return st.State == xds.StateConnected && st.Reconnects > 0
		})
		if delta {
			waitFor(t, 5*time.Second, "resumption with initial_resource_versions", func() bool {
				return len(m2.requests(func(r seenRequest) bool {
					return r.typeURL == resource.ClusterType && r.initial["a"] != ""
				})) > 0
			})
		}
		waitFor(t, 5*time.Second, "the CDS ACK on the new stream", func() bool { return len(m2.acks(resource.ClusterType)) > 0 })
		if h.last().Version != served {
			t.Errorf("the same snapshot gave a new config %s (was %s)", h.last().Version, served)
		}

		// It converges on what the control plane publishes next.
		v2 := v1
		v2.clas = []*endpointv3.ClusterLoadAssignment{assignment("a", "127.0.0.1:9001", "127.0.0.1:9011")}
		m2.set(t, "node-1", v2.snapshot(t, "v2"))
		waitFor(t, 5*time.Second, "the new endpoints", func() bool { return len(endpointsOf(h.last(), "a")) == 2 })
	})
}

func TestClientStartsFromThePersistedConfig(t *testing.T) {
	modes(t, func(t *testing.T, delta bool) {
		noLeaks(t)
		persist := filepath.Join(t.TempDir(), "xds-last-good.json")
		m := startMgmt(t, "127.0.0.1:0", nil)
		v1 := resSet{
			clusters: []*clusterv3.Cluster{viaEDS("a")},
			clas:     []*endpointv3.ClusterLoadAssignment{assignment("a", "127.0.0.1:9001")},
			routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
		}
		m.set(t, "node-1", v1.snapshot(t, "v1"))
		withPersist := func(o *xds.ClientOptions) { o.Bootstrap.PersistPath = persist }
		h1 := runClient(t, m.addr, delta, withPersist)
		waitFor(t, 5*time.Second, "the first config", func() bool { return h1.last() != nil })
		waitFor(t, 5*time.Second, "the persisted file", func() bool { _, err := os.Stat(persist); return err == nil })
		version := h1.last().Version
		h1.stop()
		m.stop()

		// The control plane is down: a new replica starts from the file.
		h2 := runClient(t, m.addr, delta, withPersist)
		waitFor(t, 5*time.Second, "the persisted config", func() bool { return h2.last() != nil })
		if h2.last().Version != version || !h2.client.Ready() || !h2.client.Status().FromPersisted {
			t.Errorf("started from %s (status %+v), want %s from the file", h2.last().Version, h2.client.Status(), version)
		}
		if got := endpointsOf(h2.last(), "a"); len(got) != 1 {
			t.Errorf("persisted cluster a endpoints = %v", got)
		}

		// The control plane comes back with something new: the replica converges.
		m2 := startMgmt(t, m.addr, nil)
		v2 := v1
		v2.clas = []*endpointv3.ClusterLoadAssignment{assignment("a", "127.0.0.1:9021")}
		m2.set(t, "node-1", v2.snapshot(t, "v2"))
		waitFor(t, 5*time.Second, "the new config", func() bool {
			return slices.Equal(endpointsOf(h2.last(), "a"), []string{"http://127.0.0.1:9021"})
		})
		waitFor(t, 5*time.Second, "the status", func() bool { return !h2.client.Status().FromPersisted })
	})
}

func TestClientWarmTimeout(t *testing.T) {
	noLeaks(t)
	m := startMgmt(t, "127.0.0.1:0", nil)
	// Cluster b's endpoints never come: the config is applied without them after WarmTimeout.
	v1 := resSet{
		clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001"), viaEDS("b")},
		routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
	}
	m.set(t, "node-1", v1.snapshot(t, "v1"))
	h := runClient(t, m.addr, true, func(o *xds.ClientOptions) { o.WarmTimeout = 200 * time.Millisecond })
	waitFor(t, 5*time.Second, "the config after the warm time-out", func() bool { return h.last() != nil })
	if got := endpointsOf(h.last(), "a"); len(got) != 1 {
		t.Errorf("cluster a endpoints = %v", got)
	}
}

// TestClientFirstConfigWaitsForThePolicy: the first config waits for the global policy (its
// tenants and time-outs), at most WarmTimeout when the control plane serves none.
func TestClientFirstConfigWaitsForThePolicy(t *testing.T) {
	noLeaks(t)
	m := startMgmt(t, "127.0.0.1:0", nil)
	v1 := resSet{
		clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001")},
		routes:   []*routev3.RouteConfiguration{routesTo("a", nil)},
		noPolicy: true,
	}
	m.set(t, "node-1", v1.snapshot(t, "v1"))
	h := runClient(t, m.addr, true, func(o *xds.ClientOptions) { o.WarmTimeout = 800 * time.Millisecond })
	waitFor(t, 5*time.Second, "waiting for the policy", func() bool {
		return slices.Contains(h.client.Status().Waiting, "ecds:"+xds.PolicyName)
	})
	if h.last() != nil {
		t.Fatal("the first config was applied without the global policy")
	}
	waitFor(t, 5*time.Second, "the config after the warm time-out", func() bool { return h.last() != nil })
}

// writeTestCA writes a CA and a server certificate for 127.0.0.1 signed by it; it returns
// the CA file and the server's certificate.
func writeTestCA(t *testing.T, dir string) (string, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "cp.test"},
		DNSNames: []string{"cp.test"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
}

func TestClientTLS(t *testing.T) {
	noLeaks(t)
	caFile, cert := writeTestCA(t, t.TempDir())
	m := startMgmt(t, "127.0.0.1:0", nil, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	m.set(t, "node-1", resSet{clusters: []*clusterv3.Cluster{static("a", "127.0.0.1:9001")},
		routes: []*routev3.RouteConfiguration{routesTo("a", nil)}}.snapshot(t, "v1"))
	h := runClient(t, m.addr, true, func(o *xds.ClientOptions) {
		o.Bootstrap.TLS = xds.BootstrapTLS{CAFile: caFile, ServerName: "cp.test"}
	})
	waitFor(t, 5*time.Second, "a config over TLS", func() bool { return h.last() != nil })

	// A client that does not trust the server's CA never gets a config.
	other, _ := writeTestCA(t, t.TempDir())
	h2 := runClient(t, m.addr, true, func(o *xds.ClientOptions) {
		o.Bootstrap.NodeID = "node-2"
		o.Bootstrap.TLS = xds.BootstrapTLS{CAFile: other}
	})
	waitFor(t, 5*time.Second, "the TLS failure", func() bool {
		return strings.Contains(h2.client.Status().LastError, "certificate")
	})
	if h2.last() != nil {
		t.Error("a config through an untrusted server")
	}
}

func TestClientRunTwice(t *testing.T) {
	noLeaks(t)
	m := startMgmt(t, "127.0.0.1:0", nil)
	h := runClient(t, m.addr, true)
	waitFor(t, 5*time.Second, "connected", func() bool { return h.client.Status().State == xds.StateConnected })
	if err := h.client.Run(context.Background()); err == nil {
		t.Error("a second Run at once: no error")
	}
}

func TestNewClientChecksItsOptions(t *testing.T) {
	_, err := xds.NewClient(xds.ClientOptions{Bootstrap: xds.Bootstrap{NodeID: "n", RouteConfig: "sluice"}})
	var be *xds.BootstrapError
	if !errors.As(err, &be) {
		t.Fatalf("err = %v, want a BootstrapError", err)
	}
	_, err = xds.NewClient(xds.ClientOptions{Bootstrap: xds.Bootstrap{NodeID: "n", RouteConfig: "sluice", Server: "127.0.0.1:1"}})
	if err == nil || !strings.Contains(err.Error(), "Translate") {
		t.Errorf("err = %v, want Translate required", err)
	}
}

func TestBootstrap(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(file, []byte(`
node_id: edge-1
cluster: edge
server: cp.internal:18000
tls: {ca_file: ca.pem, server_name: cp.internal}
sotw: true
persist: last-good.json
listen: 127.0.0.1:8080
admin: 127.0.0.1:9090
metrics_token_env: SCRAPE_TOKEN
`), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := xds.LoadBootstrap(file)
	if err != nil {
		t.Fatal(err)
	}
	want := xds.Bootstrap{NodeID: "edge-1", Cluster: "edge", Server: "cp.internal:18000",
		TLS:         xds.BootstrapTLS{CAFile: ca, ServerName: "cp.internal"},
		RouteConfig: "sluice", Delta: false, PersistPath: filepath.Join(dir, "last-good.json"),
		Listen: "127.0.0.1:8080", Admin: "127.0.0.1:9090", MetricsTokenEnv: "SCRAPE_TOKEN"}
	if b != want {
		t.Errorf("bootstrap = %+v\nwant        %+v", b, want)
	}
	if err := b.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	// JSON works too; delta is the default; the node id defaults to the hostname.
	b, err = xds.ParseBootstrap([]byte(`{"server": "127.0.0.1:18000"}`))
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if !b.Delta || b.NodeID != host || b.RouteConfig != xds.DefaultRouteConfig {
		t.Errorf("defaults: %+v", b)
	}

	if _, err := xds.ParseBootstrap([]byte("server: a:1\nnode: x\n")); err == nil || !strings.Contains(err.Error(), "node") {
		t.Errorf("unknown key: err = %v", err)
	}

	bad := xds.Bootstrap{NodeID: "n", RouteConfig: "sluice", TLS: xds.BootstrapTLS{CertFile: filepath.Join(dir, "missing.pem")},
		Listen: "nope", PersistPath: filepath.Join(dir, "no-such-dir", "f.json")}
	err = bad.Validate()
	var be *xds.BootstrapError
	if !errors.As(err, &be) {
		t.Fatalf("Validate: %v, want a BootstrapError", err)
	}
	for _, want := range []string{"server: required", "listen:", "cert_file and key_file", "tls.cert_file", "persist:"} {
		if !slices.ContainsFunc(be.Problems, func(p string) bool { return strings.HasPrefix(p, want) || strings.Contains(p, want) }) {
			t.Errorf("problems %q lack %q", be.Problems, want)
		}
	}
}

// emptyPolicy is an ECDS sluice.policy with nothing set (the defaults).
func emptyPolicy(t *testing.T) *corev3.TypedExtensionConfig {
	t.Helper()
	a, err := anypb.New(&xdstypev3.TypedStruct{TypeUrl: xds.GlobalPolicyTypeURL, Value: &structpb.Struct{}})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TypedExtensionConfig{Name: xds.PolicyName, TypedConfig: a}
}
