package upstream

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestValidateValid(t *testing.T) {
	tests := []Options{
		{Name: "a", Endpoints: specs(1)},
		{Name: "a", Endpoints: []EndpointSpec{
			{URL: "https://llm.internal:8443/base/", MetricsURL: "http://llm.internal:9000/metrics", Weight: 3},
			{URL: "http://[::1]:8000", Weight: MaxWeight},
		}},
		{
			Name: "full", Endpoints: specs(3), ConnectTimeout: time.Second,
			HealthCheck: HealthCheck{Path: "/ready?x=1", Interval: time.Second, Timeout: time.Second, UnhealthyThreshold: 1, HealthyThreshold: 1},
			Outlier:     Outlier{ConsecutiveFailures: 5, BaseEjection: time.Second, MaxEjection: time.Second, MaxEjectionPercent: 100},
		},
	}
	for i, o := range tests {
		if err := o.Validate(); err != nil {
			t.Errorf("options %d: %v", i, err)
		}
	}
}

func TestValidateListsEveryError(t *testing.T) {
	o := Options{
		Name: " ",
		Endpoints: []EndpointSpec{
			{URL: "http://ok:8000"},
			{URL: "ftp://x"},
			{URL: ""},
			{URL: "http://ok:8000/"},
			{URL: "http://user:pw@h"},
			{URL: "http://h?q=1"},
			{URL: "http://h#f"},
			{URL: "http://:80"},
			{URL: "http://h:99999"},
			{URL: "http://h2", MetricsURL: "not a url", Weight: -1},
			{URL: "http://h3", Weight: MaxWeight + 1},
		},
		ConnectTimeout:      -1,
		MaxIdleConnsPerHost: -1,
		HealthCheck:         HealthCheck{Path: "health", Interval: -1, Timeout: -1, UnhealthyThreshold: -1, HealthyThreshold: -1},
		Outlier:             Outlier{ConsecutiveFailures: -1, BaseEjection: 10 * time.Second, MaxEjection: time.Second, MaxEjectionPercent: 101, DecayInterval: -1},
		TLS:                 TLS{CAFile: filepath.Join(t.TempDir(), "missing.pem")},
	}
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate = nil")
	}
	want := []string{
		"name: must not be empty",
		"endpoints[1].url: scheme must be http or https",
		"endpoints[2].url: must not be empty",
		"endpoints[3].url: duplicate of endpoints[0]",
		"endpoints[4].url: must not contain user info",
		"endpoints[5].url: must not contain a query",
		"endpoints[6].url: must not contain a fragment",
		"endpoints[7].url: host must not be empty",
		"endpoints[8].url: invalid port",
		"endpoints[9].metrics_url: scheme must be http or https",
		"endpoints[9].weight: must be between 1 and 10000",
		"endpoints[10].weight: must be between 1 and 10000",
		"connect_timeout: must not be negative",
		"max_idle_conns_per_host: must not be negative",
		"health_check.path: must start with /",
		"health_check.interval: must not be negative",
		"health_check.timeout: must not be negative",
		"health_check.unhealthy_threshold: must not be negative",
		"health_check.healthy_threshold: must not be negative",
		"outlier.consecutive_failures: must not be negative",
		"outlier.max_ejection: must not be less than base_ejection",
		"outlier.max_ejection_percent: must be between 0 and 100",
		"outlier.decay_interval: must not be negative",
		"tls.ca_file:",
	}
	msg := err.Error()
	lines := strings.Split(msg, "\n")
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("missing %q", w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(lines), len(want), msg)
	}
	if _, err := NewCluster(o); err == nil || err.Error() != msg {
		t.Errorf("NewCluster error differs from Validate:\n%v", err)
	}
}

func TestValidateEmpty(t *testing.T) {
	err := Options{}.Validate()
	if err == nil || !strings.Contains(err.Error(), "name: must not be empty") {
		t.Fatalf("Validate = %v", err)
	}
}

// A cluster without endpoints (one a control plane has named but not filled yet) is valid:
// every pick fails with ErrNoHealthyEndpoint, which the gateway answers with 503.
func TestClusterWithoutEndpoints(t *testing.T) {
	for _, pk := range []Picking{{}, {Strategy: StrategyLeastInFlight}} {
		c, err := NewCluster(Options{Name: "pending", Picking: pk, HealthCheck: HealthCheck{Interval: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		if ep, err := c.PickFor(nil, Hint{PrefixHash: 42}); ep != nil || !errors.Is(err, ErrNoHealthyEndpoint) {
			t.Errorf("PickFor = %v, %v; want ErrNoHealthyEndpoint", ep, err)
		}
		c.Start(context.Background())
		c.Close()
	}
}

func TestValidateCAFileWithoutCertificates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(path, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Options{Name: "a", Endpoints: specs(1), TLS: TLS{CAFile: path}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "tls.ca_file: ") || !strings.Contains(err.Error(), "no PEM certificates") {
		t.Fatalf("Validate = %v", err)
	}
}

func TestDefaults(t *testing.T) {
	c := newTestCluster(t, Options{Endpoints: specs(2)})
	o := c.opts
	checks := []struct {
		name      string
		got, want any
	}{
		{"connect", o.ConnectTimeout, 2 * time.Second},
		{"idle", o.MaxIdleConnsPerHost, 256},
		{"path (auto: /health, then /v1/models)", o.HealthCheck.Path, ""},
		{"health URLs", strings.Join(c.Endpoints()[0].healthURLs, " "), "http://10.0.0.1:8000/health http://10.0.0.1:8000/v1/models"},
		{"hc timeout", o.HealthCheck.Timeout, time.Second},
		{"unhealthy", o.HealthCheck.UnhealthyThreshold, 3},
		{"healthy", o.HealthCheck.HealthyThreshold, 2},
		{"base", o.Outlier.BaseEjection, 30 * time.Second},
		{"max", o.Outlier.MaxEjection, 300 * time.Second},
		{"percent", o.Outlier.MaxEjectionPercent, 50},
		{"decay", o.Outlier.DecayInterval, 10 * time.Second},
		{"weight", c.Endpoints()[0].Weight(), 1},
		{"hc enabled", c.hcEnabled, false},
		{"outlier enabled", c.odEnabled, false},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	// A base ejection above the default max raises the max to it.
	c2 := newTestCluster(t, Options{Endpoints: specs(1), Outlier: Outlier{BaseEjection: 10 * time.Minute}})
	if c2.opts.Outlier.MaxEjection != 10*time.Minute {
		t.Errorf("max ejection = %v, want 10m", c2.opts.Outlier.MaxEjection)
	}
}

func TestEndpointAccessors(t *testing.T) {
	c := newTestCluster(t, Options{Name: "n", Endpoints: []EndpointSpec{
		{URL: "http://h:8000/base", MetricsURL: "http://h:9000/metrics", Weight: 7},
	}})
	e := c.Endpoints()[0]
	if c.Name() != "n" || e.String() != "http://h:8000/base" || e.URL().Path != "/base" ||
		e.MetricsURL() != "http://h:9000/metrics" || e.Weight() != 7 || e.InFlight() != 0 {
		t.Fatalf("accessors: %s %s %s %s %d %d", c.Name(), e, e.URL(), e.MetricsURL(), e.Weight(), e.InFlight())
	}
	s := c.Snapshot()[0]
	if s.URL != e.String() || s.Weight != 7 || !s.Healthy || s.Ejected {
		t.Fatalf("snapshot = %+v", s)
	}
}
