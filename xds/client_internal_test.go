package xds

import (
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestClientBackoffs(t *testing.T) {
	c := &Client{opts: ClientOptions{
		ReconnectBase: 250 * time.Millisecond, ReconnectMax: 30 * time.Second,
		NackBase: 500 * time.Millisecond, NackMax: 15 * time.Second,
	}}
	for n, want := range []time.Duration{0, 0, 500 * time.Millisecond, time.Second, 2 * time.Second} {
		if got := c.nackDelay(n); got != want {
			t.Errorf("nackDelay(%d) = %v, want %v", n, got, want)
		}
	}
	if got := c.nackDelay(1000); got != 15*time.Second {
		t.Errorf("nackDelay(1000) = %v, want the cap", got)
	}
	for n := range 100 {
		full := expBackoff(250*time.Millisecond, 30*time.Second, n)
		if d := c.reconnectDelay(n); d < full/2 || d > full || d <= 0 {
			t.Fatalf("reconnectDelay(%d) = %v, want within [%v, %v]", n, d, full/2, full)
		}
	}
	if got := expBackoff(time.Duration(1<<62), time.Duration(1<<62), 10); got != 1<<62 {
		t.Errorf("expBackoff overflowed: %v", got)
	}
}

func TestHashContentIgnoresOrderNotContent(t *testing.T) {
	a := &anypb.Any{TypeUrl: typeCluster, Value: []byte("a")}
	b := &anypb.Any{TypeUrl: typeCluster, Value: []byte("b")}
	h1 := hashContent(typeCluster, map[string]*anypb.Any{"x": a, "y": b}, []string{"p", "q"})
	h2 := hashContent(typeCluster, map[string]*anypb.Any{"y": b, "x": a}, []string{"q", "p"})
	if h1 != h2 {
		t.Error("the same content hashes differently")
	}
	for _, other := range []string{
		hashContent(typeCluster, map[string]*anypb.Any{"x": b, "y": a}, []string{"p", "q"}),
		hashContent(typeCluster, map[string]*anypb.Any{"x": a, "y": b}, nil),
		hashContent(typeRoute, map[string]*anypb.Any{"x": a, "y": b}, []string{"p", "q"}),
	} {
		if other == h1 {
			t.Error("different content hashes the same")
		}
	}
}

func TestDecodeResourceProblems(t *testing.T) {
	if _, _, p := decodeResource(typeCluster, "x", nil); len(p) != 1 {
		t.Errorf("nil body: %q", p)
	}
	if _, _, p := decodeResource(typeCluster, "x", &anypb.Any{TypeUrl: typeRoute}); len(p) != 1 {
		t.Errorf("wrong type: %q", p)
	}
	if _, _, p := decodeResource(typeCluster, "x", &anypb.Any{TypeUrl: typeCluster, Value: []byte{0xff, 0xff}}); len(p) != 1 {
		t.Errorf("garbage: %q", p)
	}
}

// fakeSotw replays one response to sotwStream.recv.
type fakeSotw struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	resp *discoveryv3.DiscoveryResponse
}

func (f fakeSotw) Recv() (*discoveryv3.DiscoveryResponse, error) { return f.resp, nil }

// TestSotwUndecodableResourceIsReported: a state-of-the-world resource that does not decode
// has no name to tell whose it is; it must be a problem (NACK), not dropped and ACKed.
func TestSotwUndecodableResourceIsReported(t *testing.T) {
	c := &Client{opts: ClientOptions{Bootstrap: Bootstrap{RouteConfig: "sluice"}}}
	for _, typeURL := range []string{typeRoute, typePolicy, typeCluster} {
		w := &sotwStream{c: c, s: fakeSotw{resp: &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: "1", Nonce: "n",
			Resources: []*anypb.Any{{TypeUrl: typeURL, Value: []byte{0xff, 0xff, 0xff}}}}}}
		u, err := w.recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(u.problems) == 0 || len(u.upserts) != 0 {
			t.Errorf("%s: problems %v, upserts %d: an undecodable resource must be reported", shortType(typeURL), u.problems, len(u.upserts))
		}
	}
}
