package upstream

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy/clocktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeClock = clocktest.Clock

func newFakeClock() *fakeClock { return clocktest.New(time.Unix(1_700_000_000, 0)) }

// specs returns n endpoint specs with distinct unreachable URLs.
func specs(n int) []EndpointSpec {
	out := make([]EndpointSpec, n)
	for i := range out {
		out[i] = EndpointSpec{URL: fmt.Sprintf("http://10.0.0.%d:8000", i+1)}
	}
	return out
}

func newTestCluster(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.Name == "" {
		o.Name = "test"
	}
	c, err := NewCluster(o)
	if err != nil {
		t.Fatalf("NewCluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// index returns e's position in c.Endpoints(), or -1.
func index(c *Cluster, e *Endpoint) int {
	for i, x := range c.Endpoints() {
		if x == e {
			return i
		}
	}
	return -1
}

func mustPick(t testing.TB, c *Cluster, exclude *Endpoint) int {
	t.Helper()
	e, err := c.Pick(exclude)
	if err != nil {
		t.Fatalf("Pick: %v", err)
	}
	return index(c, e)
}

// fail reports n failures on e.
func fail(e *Endpoint, n int) {
	for range n {
		e.Report(false)
	}
}

// waitFor polls cond every 5ms for at most 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
