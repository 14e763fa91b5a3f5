package upstream

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestInheritKeepsState(t *testing.T) {
	clk := newFakeClock()
	od := Outlier{ConsecutiveFailures: 2, BaseEjection: 10 * time.Second}
	hc := HealthCheck{Interval: time.Hour, UnhealthyThreshold: 1}
	old := newTestCluster(t, Options{Name: "c", Clock: clk, Outlier: od, HealthCheck: hc, Endpoints: []EndpointSpec{
		{URL: "http://a:1"}, {URL: "http://b:1"}, {URL: "http://gone:1"}, {URL: "http://d:1"},
	}})
	oa, ob, od1 := old.Endpoints()[0], old.Endpoints()[1], old.Endpoints()[3]
	oa.Begin()
	oa.Begin()
	fail(ob, 2) // ejected for 10s
	old.recordCheck(od1, errors.New("down"))
	oa.Report(false)

	nc := newTestCluster(t, Options{Name: "c", Clock: clk, Outlier: od, HealthCheck: hc, Endpoints: []EndpointSpec{
		{URL: "http://A:1/"}, // same endpoint: host case and trailing slash ignored
		{URL: "http://b:1", Weight: 5},
		{URL: "http://new:1"},
		{URL: "http://d:1"},
	}})
	nc.Inherit(old)
	na, nb, nn, nd := nc.Endpoints()[0], nc.Endpoints()[1], nc.Endpoints()[2], nc.Endpoints()[3]

	if got := na.InFlight(); got != 2 {
		t.Fatalf("inherited InFlight = %d, want 2", got)
	}
	oa.End() // a request that ran on the old cluster finishes
	if got := na.InFlight(); got != 1 {
		t.Fatalf("InFlight after the old request ended = %d, want 1", got)
	}
	if s := nc.Snapshot()[0]; s.Requests != 2 || s.ConsecutiveFailures != 1 {
		t.Fatalf("inherited counters = %+v", s)
	}
	if nb.Available(clk.Now()) {
		t.Fatal("ejection not inherited")
	}
	if s := nc.Snapshot()[1]; !s.Ejected || s.TimesEjected != 1 || s.EjectionMultiplier != 1 || s.Weight != 5 {
		t.Fatalf("inherited ejection state = %+v (weight must come from the new config)", s)
	}
	if nd.Healthy() {
		t.Fatal("health not inherited")
	}
	if !nn.Healthy() || nn.InFlight() != 0 || !nn.Available(clk.Now()) {
		t.Fatal("new endpoint does not start fresh")
	}
	// Exclusion matches across the two clusters: an endpoint of the old cluster excludes
	// its successor.
	for range 10 {
		if e, _ := nc.Pick(oa); e == na {
			t.Fatal("Pick(old a) returned new a")
		}
	}
	// Outlier state keeps counting across the reload: one more failure (2 in a row) ejects.
	na.Report(false)
	if na.Available(clk.Now()) {
		t.Fatal("consecutive failures were not carried over")
	}
}

func TestInheritAppliesNewConfigToSharedState(t *testing.T) {
	clk := newFakeClock()
	old := newTestCluster(t, Options{Name: "c", Clock: clk, Endpoints: specs(2),
		Outlier:     Outlier{ConsecutiveFailures: 1},
		HealthCheck: HealthCheck{Interval: time.Hour, UnhealthyThreshold: 1},
	})
	fail(old.Endpoints()[0], 1)
	old.recordCheck(old.Endpoints()[1], errors.New("down"))
	// The new config turns both mechanisms off: the inherited ejection and ill health no
	// longer keep the endpoints out.
	nc := newTestCluster(t, Options{Name: "c", Clock: clk, Endpoints: specs(2)})
	nc.Inherit(old)
	for i, e := range nc.Endpoints() {
		if !e.Available(clk.Now()) {
			t.Errorf("endpoint %d unavailable under a config without checks", i)
		}
	}
}

func TestInheritTransport(t *testing.T) {
	base := Options{Name: "c", Endpoints: specs(2)}
	tests := []struct {
		name      string
		change    func(*Options)
		wantShare bool
	}{
		{"same settings share", func(*Options) {}, true},
		{"endpoint changes still share", func(o *Options) { o.Endpoints = specs(3) }, true},
		{"connect timeout differs", func(o *Options) { o.ConnectTimeout = time.Second }, false},
		{"pool size differs", func(o *Options) { o.MaxIdleConnsPerHost = 4 }, false},
		{"TLS differs", func(o *Options) { o.TLS.ServerName = "x" }, false},
		{"https added", func(o *Options) { o.Endpoints = []EndpointSpec{{URL: "https://x"}} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := newTestCluster(t, base)
			o := base
			tt.change(&o)
			nc := newTestCluster(t, o)
			nc.Inherit(old)
			if got := nc.Transport() == old.Transport(); got != tt.wantShare {
				t.Fatalf("shared transport = %v, want %v", got, tt.wantShare)
			}
		})
	}
}

func TestReloadKeepsOldRequestsAndConnections(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release
		}
		_, _ = io.WriteString(w, "done")
	}))
	t.Cleanup(srv.Close)
	opts := Options{Name: "c", Endpoints: []EndpointSpec{{URL: srv.URL}}}
	old := newTestCluster(t, opts)
	e, err := old.Pick(nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Begin()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/slow", nil)
	resp, err := old.Transport().RoundTrip(req) // headers arrived; body still streaming
	if err != nil {
		t.Fatal(err)
	}

	nc := newTestCluster(t, opts)
	nc.Inherit(old)
	nc.Start(t.Context())
	old.Close() // retire the old cluster while its request is in flight

	if got := nc.Endpoints()[0].InFlight(); got != 1 {
		t.Fatalf("new cluster sees InFlight %d, want 1", got)
	}
	close(release)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != "done" {
		t.Fatalf("old request body = %q, %v", body, err)
	}
	e.End()
	if got := nc.Endpoints()[0].InFlight(); got != 0 {
		t.Fatalf("InFlight = %d after the old request ended, want 0", got)
	}
	// The new cluster still works through the shared transport.
	if body, err := get(nc, srv.URL); err != nil || body != "HTTP/1.1 done" {
		t.Fatalf("GET via new cluster = %q, %v", body, err)
	}
}

func TestInheritAfterStartPanics(t *testing.T) {
	old := newTestCluster(t, Options{Endpoints: specs(1)})
	nc := newTestCluster(t, Options{Endpoints: specs(1)})
	nc.Start(t.Context())
	defer func() {
		if recover() == nil {
			t.Fatal("Inherit after Start did not panic")
		}
	}()
	nc.Inherit(old)
}

func TestInheritNilAndClosed(t *testing.T) {
	old := newTestCluster(t, Options{Endpoints: specs(1)})
	old.Endpoints()[0].Begin()
	old.Close()
	nc := newTestCluster(t, Options{Endpoints: specs(1)})
	nc.Inherit(nil)
	nc.Inherit(nc)
	nc.Inherit(old) // state still carries; the closed transport does not
	if nc.Endpoints()[0].InFlight() != 1 {
		t.Fatal("state not inherited from a closed cluster")
	}
	if nc.Transport() == old.Transport() {
		t.Fatal("inherited the transport of a closed cluster")
	}
	old.Endpoints()[0].End()
}

func TestClusterLoad(t *testing.T) {
	c := newTestCluster(t, Options{Name: "c", Endpoints: specs(4)})
	if per, begun := c.Load(); per != 0 || begun != 0 {
		t.Fatalf("idle Load = %v, %d", per, begun)
	}
	eps := c.Endpoints()
	eps[0].Begin()
	eps[0].Begin()
	eps[1].Begin()
	eps[1].End()
	if per, begun := c.Load(); per != 0.5 || begun != 3 {
		t.Fatalf("Load = %v per endpoint, %d begun; want 0.5, 3", per, begun)
	}
	eps[0].End()
	eps[0].End()
	if per, begun := c.Load(); per != 0 || begun != 3 {
		t.Fatalf("Load after End = %v, %d; want 0, 3", per, begun)
	}
}
