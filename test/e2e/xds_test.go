package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/openai/openai-go/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/telemetry"
	"github.com/sluicegw/sluice/test/sim"
	"github.com/sluicegw/sluice/xds"
)

// controlPlane is go-control-plane's snapshot cache and ADS server in the test process, on
// 127.0.0.1; it records the NACKs it gets.
type controlPlane struct {
	cache cachev3.SnapshotCache
	addr  string
	gs    *grpc.Server
	stopX context.CancelFunc
	done  chan struct{}
	once  sync.Once

	mu    sync.Mutex
	nacks []string // error_detail messages
	acks  int
}

// startControlPlane serves a new snapshot cache on addr ("127.0.0.1:0": any port) until stop
// or the end of the test.
func startControlPlane(t *testing.T, addr string) *controlPlane {
	t.Helper()
	var (
		ln  net.Listener
		err error
	)
	deadline := time.Now().Add(5 * time.Second)
	for { // the port of a control plane just stopped may take a moment to be free
		if ln, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("control plane listen %s: %v", addr, err)
	}
	cp := &controlPlane{cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), addr: ln.Addr().String(),
		gs: grpc.NewServer(), done: make(chan struct{})}
	note := func(nonce string, msg string) {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		switch {
		case msg != "":
			cp.nacks = append(cp.nacks, msg)
		case nonce != "":
			cp.acks++
		}
	}
	cb := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			note(r.GetResponseNonce(), r.GetErrorDetail().GetMessage())
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			note(r.GetResponseNonce(), r.GetErrorDetail().GetMessage())
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp.stopX = cancel
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(cp.gs, serverv3.NewServer(ctx, cp.cache, cb))
	go func() {
		defer close(cp.done)
		_ = cp.gs.Serve(ln)
	}()
	t.Cleanup(cp.stop)
	return cp
}

func (cp *controlPlane) stop() {
	cp.once.Do(func() {
		cp.stopX()
		cp.gs.Stop()
		<-cp.done
	})
}

func (cp *controlPlane) nackMessages() []string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]string(nil), cp.nacks...)
}

func (cp *controlPlane) ackCount() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.acks
}

// push publishes a snapshot of the given resources for the nodes.
func (cp *controlPlane) push(t *testing.T, version string, res []types.Resource, nodes ...string) {
	t.Helper()
	m := map[resource.Type][]types.Resource{}
	if !slices.ContainsFunc(res, func(r types.Resource) bool { _, ok := r.(*corev3.TypedExtensionConfig); return ok }) {
		res = append(res, emptyPolicy(t)) // as sluice xds always serves one
	}
	for _, r := range res {
		var typ resource.Type
		switch r.(type) {
		case *clusterv3.Cluster:
			typ = resource.ClusterType
		case *endpointv3.ClusterLoadAssignment:
			typ = resource.EndpointType
		case *routev3.RouteConfiguration:
			typ = resource.RouteType
		case *corev3.TypedExtensionConfig:
			typ = resource.ExtensionConfigType
		default:
			t.Fatalf("resource of type %T", r)
		}
		m[typ] = append(m[typ], r)
	}
	snap, err := cachev3.NewSnapshot(version, m)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for _, n := range nodes {
		if err := cp.cache.SetSnapshot(context.Background(), n, snap); err != nil {
			t.Fatalf("SetSnapshot: %v", err)
		}
	}
}

// xdsGateway is a gateway that takes its config from an xDS control plane.
type xdsGateway struct {
	*gateway
	client *xds.Client
}

// startXDSGateway runs a gateway started empty (not ready) and its ADS client against the
// control plane at server, until the test ends.
func startXDSGateway(t *testing.T, server, node string, delta bool) *xdsGateway {
	t.Helper()
	topts := xds.TranslateOptions{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", RouteConfig: "sluice"}
	cfg, err := xds.InitialConfig(topts)
	if err != nil {
		t.Fatalf("InitialConfig: %v", err)
	}
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceVersion: "e2e"})
	if err != nil {
		t.Fatalf("telemetry: %v", err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: log, Telemetry: tel, Version: "e2e", AwaitConfig: true})
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	client, err := xds.NewClient(xds.ClientOptions{
		Bootstrap: xds.Bootstrap{NodeID: node, Server: server, RouteConfig: "sluice", Delta: delta},
		Translate: func(r xds.Resources) (*config.Config, error) { return xds.Translate(r, topts) },
		Apply:     srv.Apply,
		Logger:    log.With("component", "xds"),
		Version:   "e2e",
		// Short waits keep the test quick; the defaults are for production.
		ReconnectBase: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		NackBase: 50 * time.Millisecond, NackMax: 500 * time.Millisecond, WarmTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatalf("xds.NewClient: %v", err)
	}
	reg, err := client.RegisterMetrics(tel.Meter())
	if err != nil {
		t.Fatalf("RegisterMetrics: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("xds client did not stop within 10s")
		}
		_ = reg.Unregister()
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := srv.Shutdown(sctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		_ = tel.Shutdown(context.Background())
		if t.Failed() {
			t.Logf("gateway %s log:\n%s", node, logs.String())
		}
	})
	return &xdsGateway{gateway: &gateway{srv: srv, addr: srv.Addr(), admin: srv.AdminAddr(), logs: logs}, client: client}
}

// ---- Envoy resources for the tests ----

func hostPort(t *testing.T, rawURL string) (string, uint32) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return u.Hostname(), uint32(p)
}

func lbEndpointOf(t *testing.T, rawURL string) *endpointv3.LbEndpoint {
	host, port := hostPort(t, rawURL)
	return &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}}},
	}}}
}

// edsClusterOf is an EDS cluster and its assignment (one endpoint at rawURL).
func edsClusterOf(t *testing.T, name, rawURL string) []types.Resource {
	return []types.Resource{
		&clusterv3.Cluster{
			Name:                 name,
			ConnectTimeout:       durationpb.New(time.Second),
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			}},
		},
		&endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{lbEndpointOf(t, rawURL)},
		}}},
	}
}

// staticClusterOf is a STATIC cluster with an inline assignment (one endpoint at rawURL).
func staticClusterOf(t *testing.T, name, rawURL string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ConnectTimeout:       durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{lbEndpointOf(t, rawURL)},
		}}},
	}
}

// weightedRoute is the route configuration "sluice": everything to the clusters by weight
// (name, weight pairs); policy, when set, is the route's sluice.policy.
func weightedRoute(policy *anypb.Any, split ...any) *routev3.RouteConfiguration {
	var wc []*routev3.WeightedCluster_ClusterWeight
	for i := 0; i+1 < len(split); i += 2 {
		wc = append(wc, &routev3.WeightedCluster_ClusterWeight{Name: split[i].(string), Weight: wrapperspb.UInt32(uint32(split[i+1].(int)))})
	}
	r := &routev3.Route{
		Name:  "chat",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/v1/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: wc}},
		}},
	}
	if policy != nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{xds.PolicyName: policy}
	}
	return &routev3.RouteConfiguration{Name: "sluice", VirtualHosts: []*routev3.VirtualHost{{
		Name: "sluice", Domains: []string{"*"}, Routes: []*routev3.Route{r},
	}}}
}

func routePolicy(t *testing.T, v map[string]any) *anypb.Any {
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

func resList(parts ...any) []types.Resource {
	var out []types.Resource
	for _, p := range parts {
		switch p := p.(type) {
		case []types.Resource:
			out = append(out, p...)
		case types.Resource:
			out = append(out, p)
		}
	}
	return out
}

// ---- helpers ----

func chatOnce(ctx context.Context, client openai.Client) error {
	_, err := client.Chat.Completions.New(ctx, xdsChatParams())
	return err
}

func xdsChatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "sim-llama",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello over xds")},
		MaxTokens: openai.Int(4),
	}
}

// streamOnce streams a chat completion and fails unless it ends with content.
func streamOnce(ctx context.Context, client openai.Client) error {
	stream := client.Chat.Completions.NewStreaming(ctx, xdsChatParams())
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	if text.Len() == 0 {
		return fmt.Errorf("stream without content")
	}
	return nil
}

func readyz(t *testing.T, hc *http.Client, admin string) int {
	t.Helper()
	resp, _ := do(t, hc, http.MethodGet, "http://"+admin+"/readyz", "")
	return resp.StatusCode
}

// load sends chat completions from workers until stop; it counts requests and failures.
type load struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	stop       chan struct{}
	wg         sync.WaitGroup
}

func startLoad(ctx context.Context, client openai.Client, workers int) *load {
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			send := chatOnce
			if w%2 == 1 {
				send = streamOnce
			}
			for {
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				if err := send(ctx, client); err != nil {
					if ctx.Err() != nil {
						return
					}
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
				} else {
					l.ok.Add(1)
				}
			}
		}()
	}
	return l
}

func (l *load) end() {
	close(l.stop)
	l.wg.Wait()
}

// ---- tests ----

// The first config arrives over delta xDS and makes the gateway ready; weight changes of a
// weighted_clusters route shift the traffic while a load (plain and streamed) runs, without
// one failed request.
func TestXDSConfigArrivesAndWeightsShiftUnderLoad(t *testing.T) {
	slow := sim.Config{ITL: 2 * time.Millisecond} // requests are in flight when configs swap
	a := startRoutingUpstream(t, slow, -1)
	b := startRoutingUpstream(t, slow, -1)
	cp := startControlPlane(t, "127.0.0.1:0")
	g := startXDSGateway(t, cp.addr, "replica-1", true)
	hc := newHTTPClient(t)

	if code := readyz(t, hc, g.admin); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before any config = %d, want 503", code)
	}
	clusters := resList(edsClusterOf(t, "a", a.URL), staticClusterOf(t, "b", b.URL))
	cp.push(t, "1", resList(clusters, weightedRoute(nil, "a", 100, "b", 0)), "replica-1")
	eventually(t, 10*time.Second, "/readyz after the first config", func() bool { return readyz(t, hc, g.admin) == http.StatusOK })
	v1 := g.srv.Config().Version

	ctx := testCtx(t)
	client := newClient(t, g.addr)
	l := startLoad(ctx, client, 4)
	defer func() {
		select {
		case <-l.stop:
		default:
			l.end()
		}
	}()
	eventually(t, 10*time.Second, "traffic on a", func() bool { return a.requests.Load() >= 20 })
	if n := b.requests.Load(); n != 0 {
		t.Errorf("b got %d requests at weight 0", n)
	}

	cp.push(t, "2", resList(clusters, weightedRoute(nil, "a", 50, "b", 50)), "replica-1")
	eventually(t, 10*time.Second, "traffic on b at 50/50", func() bool { return b.requests.Load() >= 20 })

	cp.push(t, "3", resList(clusters, weightedRoute(nil, "a", 0, "b", 100)), "replica-1")
	var v3 string
	eventually(t, 10*time.Second, "the third config", func() bool {
		v := g.srv.Config().Version
		if v != v1 && g.srv.Config().Routes[0].Splits[0].Weight == 0 {
			v3 = v
			return true
		}
		return false
	})
	aAt, bAt := a.requests.Load(), b.requests.Load()
	eventually(t, 10*time.Second, "traffic on b only", func() bool { return b.requests.Load() >= bAt+40 })
	l.end()
	// Requests already past routing when the config swapped may still land on a.
	if extra := a.requests.Load() - aAt; extra > 4 {
		t.Errorf("a got %d requests after its weight went to 0", extra)
	}
	if f := l.failed.Load(); f != 0 {
		t.Errorf("%d of %d requests failed during the weight shifts; first: %v", f, f+l.ok.Load(), l.firstErr.Load())
	}
	t.Logf("%d requests during the shifts: a %d, b %d", l.ok.Load()+l.failed.Load(), a.requests.Load(), b.requests.Load())
	if st := g.client.Status(); st.ConfigVersion != v3 || st.State != xds.StateConnected {
		t.Errorf("client status: version %s state %s, want %s connected", st.ConfigVersion, st.State, v3)
	}
	if n := cp.nackMessages(); len(n) > 0 {
		t.Errorf("unexpected NACKs: %q", n)
	}
	if v := metricValue(t, hc, g.admin, "sluice_xds_acks_total", `type="rds"`); v < 3 {
		t.Errorf("sluice_xds_acks_total{type=rds} = %v, want at least 3", v)
	}
	if v := metricValue(t, hc, g.admin, "sluice_xds_connected"); v != 1 {
		t.Errorf("sluice_xds_connected = %v", v)
	}
	if v := metricValue(t, hc, g.admin, "sluice_xds_config_info", `version="`+v3+`"`); v != 1 {
		t.Errorf("sluice_xds_config_info{version=%s} = %v", v3, v)
	}
}

// A bad update (an unknown key in the route's sluice.policy, an unsupported cluster) is
// NACKed with every problem while the old config keeps serving; a later good one is ACKed.
func TestXDSBadUpdateIsNACKedAndTheOldConfigServes(t *testing.T) {
	a := startRoutingUpstream(t, sim.Config{}, -1)
	b := startRoutingUpstream(t, sim.Config{}, -1)
	cp := startControlPlane(t, "127.0.0.1:0")
	g := startXDSGateway(t, cp.addr, "replica-1", true)
	hc := newHTTPClient(t)
	ctx := testCtx(t)
	client := newClient(t, g.addr)

	good := resList(staticClusterOf(t, "a", a.URL), staticClusterOf(t, "b", b.URL))
	cp.push(t, "1", resList(good, weightedRoute(nil, "a", 1)), "replica-1")
	eventually(t, 10*time.Second, "the first config", func() bool { return readyz(t, hc, g.admin) == http.StatusOK })
	v1 := g.srv.Config().Version

	maglev := staticClusterOf(t, "c", b.URL)
	maglev.LbPolicy = clusterv3.Cluster_MAGLEV
	cp.push(t, "2", resList(good, maglev, weightedRoute(routePolicy(t, map[string]any{"retyr": map[string]any{"budget": 0.2}}), "b", 1)), "replica-1")
	eventually(t, 10*time.Second, "NACKs naming both problems", func() bool {
		all := strings.Join(cp.nackMessages(), "\n")
		return strings.Contains(all, "retyr") && strings.Contains(all, "MAGLEV")
	})
	for i := range 10 {
		if err := chatOnce(ctx, client); err != nil {
			t.Fatalf("request %d while the bad update is pending: %v", i, err)
		}
	}
	if b.requests.Load() != 0 || g.srv.Config().Version != v1 {
		t.Errorf("the bad update took effect: b got %d, version %s (was %s)", b.requests.Load(), g.srv.Config().Version, v1)
	}
	if v := metricValue(t, hc, g.admin, "sluice_xds_nacks_total"); v < 2 {
		t.Errorf("sluice_xds_nacks_total = %v, want at least 2", v)
	}
	st := g.client.Status()
	var errs []string
	for _, ts := range st.Types {
		if ts.LastNack != nil {
			errs = append(errs, ts.LastNack.Errors...)
		}
	}
	if !strings.Contains(strings.Join(errs, "\n"), "retyr") {
		t.Errorf("status last NACKs = %q, want the problem", errs)
	}

	acks := cp.ackCount()
	cp.push(t, "3", resList(good, weightedRoute(nil, "b", 1)), "replica-1")
	eventually(t, 10*time.Second, "the good update", func() bool { return g.srv.Config().Version != v1 })
	eventually(t, 10*time.Second, "its ACK", func() bool { return cp.ackCount() > acks })
	before := b.requests.Load()
	for i := range 5 {
		if err := chatOnce(ctx, client); err != nil {
			t.Fatalf("request %d after the good update: %v", i, err)
		}
	}
	if got := b.requests.Load() - before; got != 5 {
		t.Errorf("b got %d of 5 requests after the good update", got)
	}
}

// The control plane goes away: the replica keeps serving its config and stays ready; it comes
// back (a new server on the same port, state-of-the-world this time): the replica reconnects
// and follows it again.
func TestXDSControlPlaneDownAndBack(t *testing.T) {
	a := startRoutingUpstream(t, sim.Config{}, -1)
	b := startRoutingUpstream(t, sim.Config{}, -1)
	cp := startControlPlane(t, "127.0.0.1:0")
	g := startXDSGateway(t, cp.addr, "replica-1", false)
	hc := newHTTPClient(t)
	ctx := testCtx(t)
	client := newClient(t, g.addr)

	clusters := resList(edsClusterOf(t, "a", a.URL), edsClusterOf(t, "b", b.URL))
	v1 := resList(clusters, weightedRoute(nil, "a", 1))
	cp.push(t, "1", v1, "replica-1")
	eventually(t, 10*time.Second, "the first config", func() bool { return readyz(t, hc, g.admin) == http.StatusOK })

	cp.stop()
	eventually(t, 10*time.Second, "the replica to notice", func() bool {
		return metricValue(t, hc, g.admin, "sluice_xds_connected") == 0
	})
	for i := range 10 {
		if err := chatOnce(ctx, client); err != nil {
			t.Fatalf("request %d with the control plane down: %v", i, err)
		}
	}
	if code := readyz(t, hc, g.admin); code != http.StatusOK {
		t.Errorf("/readyz with the control plane down = %d, want 200", code)
	}

	cp2 := startControlPlane(t, cp.addr)
	cp2.push(t, "1", v1, "replica-1")
	eventually(t, 10*time.Second, "reconnection", func() bool {
		return metricValue(t, hc, g.admin, "sluice_xds_connected") == 1 &&
			metricValue(t, hc, g.admin, "sluice_xds_reconnects_total") >= 1
	})
	cp2.push(t, "2", resList(clusters, weightedRoute(nil, "b", 1)), "replica-1")
	eventually(t, 10*time.Second, "the new config", func() bool {
		before := b.requests.Load()
		return chatOnce(ctx, client) == nil && b.requests.Load() == before+1
	})
}

var configInfoRE = regexp.MustCompile(`(?m)^sluice_config_info\{[^}]*version="([^"]+)"`)

// configVersion reads the version a replica serves from its /metrics (sluice_config_info).
func configVersion(t *testing.T, hc *http.Client, admin string) string {
	t.Helper()
	resp, err := hc.Get("http://" + admin + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return ""
	}
	m := configInfoRE.FindStringSubmatch(string(body))
	if m == nil {
		return ""
	}
	return m[1]
}

// Two replicas (`sluice serve --xds`, one delta, one state-of-the-world) driven by
// `sluice xds` from one file converge to the same config version, and follow the file.
func TestXDSTwoReplicasFollowOneFile(t *testing.T) {
	a := startRoutingUpstream(t, sim.Config{}, -1)
	b := startRoutingUpstream(t, sim.Config{}, -1)
	dir := t.TempDir()
	file := filepath.Join(dir, "sluice.yaml")
	fileFor := func(cluster string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: a, endpoints: [{url: %s}], health_check: {disabled: true}}
  - {name: b, endpoints: [{url: %s}], health_check: {disabled: true}}
routes:
  - {name: chat, cluster: %s}
`, a.URL, b.URL, cluster)
	}
	writeFileAtomic(t, file, fileFor("a"))
	cpAddr := freePort(t)
	startSluice(t, "xds", "--config", file, "--listen", cpAddr, "--watch", "50ms")

	hc := newHTTPClient(t)
	type replica struct{ listen, admin string }
	var reps []replica
	for i, mode := range [][]string{nil, {"--xds-sotw"}} {
		r := replica{freePort(t), freePort(t)}
		args := append([]string{"serve", "--xds", cpAddr, "--node-id", fmt.Sprintf("replica-%d", i),
			"--listen", r.listen, "--admin", r.admin}, mode...)
		p := startSluice(t, args...)
		waitOK(t, hc, "http://"+r.admin+"/readyz", p)
		reps = append(reps, r)
	}

	ctx := testCtx(t)
	converged := func() string {
		v0 := configVersion(t, hc, reps[0].admin)
		for _, r := range reps[1:] {
			if configVersion(t, hc, r.admin) != v0 {
				return ""
			}
		}
		return v0
	}
	var v1 string
	eventually(t, 10*time.Second, "both replicas on one version", func() bool { v1 = converged(); return v1 != "" })
	for _, r := range reps {
		if err := chatOnce(ctx, newClient(t, r.listen)); err != nil {
			t.Fatalf("request through %s: %v", r.listen, err)
		}
	}
	if a.requests.Load() != 2 {
		t.Errorf("a got %d of 2 requests", a.requests.Load())
	}

	writeFileAtomic(t, file, fileFor("b"))
	eventually(t, 10*time.Second, "both replicas on the new version", func() bool {
		v := converged()
		return v != "" && v != v1
	})
	for _, r := range reps {
		if err := chatOnce(ctx, newClient(t, r.listen)); err != nil {
			t.Fatalf("request through %s after the change: %v", r.listen, err)
		}
	}
	if b.requests.Load() != 2 {
		t.Errorf("b got %d of 2 requests after the change", b.requests.Load())
	}
	// The client's state on the admin API, as an operator reads it.
	for i, r := range reps {
		resp, body := do(t, hc, http.MethodGet, "http://"+r.admin+"/admin/xds", "")
		var st struct {
			State         string `json:"state"`
			Mode          string `json:"mode"`
			ConfigVersion string `json:"config_version"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &st) != nil {
			t.Fatalf("/admin/xds: %d %s", resp.StatusCode, body)
		}
		wantMode := []string{"delta", "sotw"}[i]
		if st.State != "connected" || st.Mode != wantMode || st.ConfigVersion == "" {
			t.Errorf("replica %d /admin/xds: %s", i, body)
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
