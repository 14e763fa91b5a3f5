package server

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicegw/sluice/proxy/config"
)

const serveConfig = `
listen: 127.0.0.1:8080
admin: {listen: 127.0.0.1:9090}
clusters:
  - name: llama
    endpoints: [{url: "http://10.0.0.5:8000", weight: WEIGHT}]
  - name: small
    endpoints: [{url: "http://10.0.0.6:8000"}]
routes:
  - {name: chat, match: {path_prefix: /v1/}, cluster: llama}
`

func configWithWeight(w string) string { return strings.Replace(serveConfig, "WEIGHT", w, 1) }

// startServer runs a Server on 127.0.0.1:0 until the test ends.
func startServer(t *testing.T, file string) (*Server, string) {
	t.Helper()
	s, err := New(Options{ConfigPath: file, WatchInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return s, ln.Addr().String()
}

// deltaClient is a bare delta ADS client: it subscribes, ACKs every response and hands the
// responses to the test.
type deltaClient struct {
	t      *testing.T
	stream discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	got    chan *discoverygrpc.DeltaDiscoveryResponse
}

func dialDelta(t *testing.T, addr, node string) *deltaClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &deltaClient{t: t, stream: stream, got: make(chan *discoverygrpc.DeltaDiscoveryResponse, 64)}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			// ACK, then hand over (never blocks: the buffer outlasts the test's pushes).
			_ = stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
			select {
			case c.got <- r:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-recvDone
		conn.Close()
	})
	nodeMsg := &corev3.Node{Id: node}
	for typ, names := range map[string][]string{
		resource.ClusterType:         nil, // wildcard
		resource.EndpointType:        {"llama", "small"},
		resource.RouteType:           {DefaultRouteConfig},
		resource.ExtensionConfigType: {"sluice.policy"},
	} {
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: nodeMsg, TypeUrl: typ, ResourceNamesSubscribe: names}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// await returns the responses received until pred holds for one of them (bounded wait).
func (c *deltaClient) await(what string, pred func(*discoverygrpc.DeltaDiscoveryResponse) bool) *discoverygrpc.DeltaDiscoveryResponse {
	c.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case r := <-c.got:
			if pred(r) {
				return r
			}
		case <-deadline:
			c.t.Fatalf("timed out waiting for %s", what)
			return nil
		}
	}
}

func endpointWeight(t *testing.T, r *discoverygrpc.DeltaDiscoveryResponse, cluster string) uint32 {
	t.Helper()
	for _, res := range r.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := res.GetResource().UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		if cla.GetClusterName() == cluster {
			return cla.GetEndpoints()[0].GetLbEndpoints()[0].GetLoadBalancingWeight().GetValue()
		}
	}
	return 0
}

func TestServeDeltaADS(t *testing.T) {
	defer goleak.VerifyNone(t)
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, file, configWithWeight("2"))
	t.Run("serve", func(t *testing.T) {
		s, addr := startServer(t, file)
		v1 := s.Version()
		c := dialDelta(t, addr, "replica-1")

		types := map[string]int{}
		for len(types) < 4 {
			r := c.await("the four resource types", func(*discoverygrpc.DeltaDiscoveryResponse) bool { return true })
			types[r.GetTypeUrl()] += len(r.GetResources())
			if r.GetTypeUrl() == resource.EndpointType {
				if w := endpointWeight(t, r, "llama"); w != 2 {
					t.Errorf("llama weight %d, want 2", w)
				}
			}
			if r.GetTypeUrl() == resource.ClusterType {
				for _, res := range r.GetResources() {
					cl := &clusterv3.Cluster{}
					if err := res.GetResource().UnmarshalTo(cl); err != nil || cl.GetType() != clusterv3.Cluster_EDS {
						t.Errorf("cluster %v: %v", cl, err)
					}
				}
			}
		}
		if types[resource.ClusterType] != 2 || types[resource.EndpointType] != 2 || types[resource.RouteType] != 1 || types[resource.ExtensionConfigType] != 1 {
			t.Errorf("resources by type: %v", types)
		}

		// A second node gets the same config.
		c2 := dialDelta(t, addr, "replica-2")
		c2.await("replica-2's clusters", func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
			return r.GetTypeUrl() == resource.ClusterType && len(r.GetResources()) == 2
		})

		// An invalid file: every problem logged, the old snapshot stays.
		writeFile(t, file, configWithWeight("-5")+"\nbogus_key: 1\n")
		time.Sleep(100 * time.Millisecond) // several watch ticks
		if _, err := s.Reload(context.Background()); err != nil {
			t.Errorf("Reload of the same rejected content: %v (want nothing done)", err)
		}
		if s.Version() != v1 {
			t.Errorf("version moved to %s on an invalid file", s.Version())
		}

		// A valid change: a new version, pushed to both nodes.
		writeFile(t, file, configWithWeight("7"))
		for _, cl := range []*deltaClient{c, c2} {
			cl.await("the new weight", func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
				return r.GetTypeUrl() == resource.EndpointType && endpointWeight(t, r, "llama") == 7
			})
		}
		if s.Version() == v1 {
			t.Error("version unchanged after a valid change")
		}
		if n := len(s.Nodes()); n != 2 {
			t.Errorf("%d nodes, want 2", n)
		}
	})
}

func TestServeStateOfTheWorld(t *testing.T) {
	defer goleak.VerifyNone(t)
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, file, configWithWeight("1"))
	t.Run("serve", func(t *testing.T) {
		s, addr := startServer(t, file)
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "sotw"}, TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetResources()) != 2 || r.GetVersionInfo() != s.Version() {
			t.Errorf("got %d clusters at version %q, want 2 at %q", len(r.GetResources()), r.GetVersionInfo(), s.Version())
		}
	})
}

func TestNewRejectsInvalidFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, file, "clusters: []\nroutes: []\n")
	_, err := New(Options{ConfigPath: file})
	var ve *config.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) < 2 {
		t.Fatalf("New = %v, want every problem", err)
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New without a file gave no error")
	}
}

// TestServesReplicaOnlySettingsUnchecked: the control plane's host need not have the
// replicas' secrets or files; their names travel and each replica checks them.
func TestServesReplicaOnlySettingsUnchecked(t *testing.T) {
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	writeFile(t, file, `admin: {listen: 0.0.0.0:9090}
tenants: [{name: a, keys_env: SLUICE_TEST_UNSET_KEYS}, {name: b, keys_file: keys/b.keys}]
clusters:
  - name: llama
    endpoints: [{url: "http://10.0.0.1:8000"}]
    api_key_env: SLUICE_TEST_UNSET_KEY
    tls: {ca_file: certs/ca.pem}
routes: [{name: chat, cluster: llama}]
`)
	s, err := New(Options{ConfigPath: file})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := config.LoadFile(file); err == nil {
		t.Fatal("the same file loads for a gateway on this host: the test checks nothing")
	}
	res, err := Resources(mustLoadRemote(t, file), DefaultRouteConfig)
	if err != nil || len(res) == 0 || s.Version() == "" {
		t.Fatalf("resources %v, %v", len(res), err)
	}
}

func mustLoadRemote(t *testing.T, file string) *config.Config {
	t.Helper()
	c, err := config.LoadFileForReplicas(file)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenants[1].KeysFile != "keys/b.keys" {
		t.Errorf("keys_file %q: a relative path must stay relative for the replicas", c.Tenants[1].KeysFile)
	}
	return c
}
