package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/xds"
)

// richConfig has a key of every kind that travels: splits with gray flags, mirror with
// progression, fallback, retry, outlier, health checks, policies, TLS, DNS names, weights,
// metrics, path prefixes, and the global keys.
const richConfig = `
listen: 127.0.0.1:8080
admin: {listen: 127.0.0.1:9090}
max_body_bytes: 8MiB
max_event_bytes: 512KiB
drain_timeout: 10s
timeouts: {connect: 1s, ttft: 30s, idle: 20s, total: 5m}
load_signals: {interval: 2s, names: sglang}
chaos:
  enabled: true
  allowed_networks: [127.0.0.1/32]
  faults:
    - {kind: abort, status: 503, percent: 1}
tenants:
  - {name: team-a, keys_file: keys.txt, priority: 2}
shadow: {window: 64, retention: 1000, verdict: {min_samples: 20}}
clusters:
  - name: cand
    endpoints:
      - {url: "http://10.0.0.9:8000", metrics: "http://10.0.0.9:8000/metrics"}
    health_check: {disabled: true}
  - name: fallback
    endpoints:
      - {url: "https://llm.example.com/openai", weight: 1}
    tls: {ca_file: ca.pem, server_name: llm.example.com}
    api_key_env: XDS_ROUNDTRIP_KEY
    outlier: {disabled: true}
  - name: llama
    endpoints:
      - {url: "http://10.0.0.5:8000", metrics: "http://10.0.0.5:9000/metrics", weight: 3}
      - {url: "http://[fd00::6]:8000/v1base", weight: 1}
    timeouts: {connect: 500ms, ttft: 20s}
    health_check: {path: /ready, interval: 3s, timeout: 2s, unhealthy_threshold: 4, healthy_threshold: 1}
    outlier: {consecutive_failures: 3, base_ejection: 10s, max_ejection: 1m, max_ejection_percent: 34}
    max_idle_conns_per_host: 32
    picking: {strategy: load_aware, kv_weight: 2, affinity_min_prefix: 128}
routes:
  - name: chat
    match: {path_prefix: /v1/chat/, model: "llama-3*", headers: {x-team: a, x-debug: "*"}}
    cluster: llama
    model: llama-3-70b
    timeouts: {ttft: 10s, idle: 15s, total: 2m, connect: 300ms}
    splits:
      - {cluster: llama, weight: 95}
      - {name: canary, cluster: cand, weight: 5, gray_flag: v2, model: cand-model}
    sticky: ["header:X-Session-ID", key]
    gray_flag_header: x-canary
    fallback:
      - {cluster: fallback, model: gpt-4o-mini, on: [5xx, 429, ttft_timeout], timeouts: {ttft: 5s}}
    retry: {attempts: 3, per_try_timeout: 20s, backoff_base: 50ms, backoff_max: 1s, budget: 0.5, min_retries_per_second: 1, honor_retry_after: false, max_retry_after: 3s}
    breaker: {window: 30s, min_requests: 10, failure_ratio: 0.25, open_for: 10s}
    resume: true
    contract_mismatch: [{status: 404, code: model_not_found}]
    policies:
      - {type: guard, params: {max_depth: 5, surge_factor: 3}}
      - {type: ratelimit, name: rl, params: {tokens_per_minute: 200000, per: tenant}}
      - {type: concurrency, params: {adaptive: false, max: 64}}
    mirror:
      cluster: cand
      fraction: 0.1
      model: cand-model
      replica_fraction: 0.25
      abnormal_finish: [content_filter, missing]
      max_queue: 16
      capture_bytes: 64KiB
      capture_total: 32MiB
      timeout: 30s
      strip_headers: [x-user]
      set_headers: {x-shadow: "1"}
      progression: {step: 5, interval: 10m, max: 50}
  - name: default
    cluster: fallback
`

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// toResources turns the typed resource lists into xds.Resources, as a client holds them.
func toResources(t testing.TB, m map[resource.Type][]types.Resource) xds.Resources {
	t.Helper()
	res := xds.Resources{
		Clusters:  map[string]*clusterv3.Cluster{},
		Endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		Routes:    map[string]*routev3.RouteConfiguration{},
	}
	for typ, rs := range m {
		for _, r := range rs {
			switch v := r.(type) {
			case *clusterv3.Cluster:
				res.Clusters[v.GetName()] = v
			case *endpointv3.ClusterLoadAssignment:
				res.Endpoints[v.GetClusterName()] = v
			case *routev3.RouteConfiguration:
				res.Routes[v.GetName()] = v
			case *corev3.TypedExtensionConfig:
				res.Policy = v
			default:
				t.Fatalf("unexpected %s resource %T", typ, r)
			}
		}
	}
	return res
}

func TestResourcesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "keys.txt"), "k1\n")
	writeFile(t, filepath.Join(dir, "ca.pem"), "") // existence is all Validate checks
	t.Setenv("XDS_ROUNDTRIP_KEY", "secret")
	rich := filepath.Join(dir, "rich.yaml")
	writeFile(t, rich, richConfig)

	tests := []struct {
		name, file string
		// kinds of the resources expected
		eds, strictDNS int
	}{
		{"examples/sluice.yaml", "../../examples/sluice.yaml", 2, 0},
		{"rich", rich, 2, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			orig, err := config.LoadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Resources(orig, "rc")
			if err != nil {
				t.Fatalf("Resources: %v", err)
			}
			eds, dns := 0, 0
			for _, r := range m[resource.ClusterType] {
				switch r.(*clusterv3.Cluster).GetType() {
				case clusterv3.Cluster_EDS:
					eds++
				case clusterv3.Cluster_STRICT_DNS:
					dns++
				}
			}
			if eds != tc.eds || dns != tc.strictDNS || len(m[resource.EndpointType]) != tc.eds {
				t.Errorf("%d EDS clusters, %d STRICT_DNS, %d assignments; want %d, %d, %d", eds, dns, len(m[resource.EndpointType]), tc.eds, tc.strictDNS, tc.eds)
			}
			got, err := xds.Translate(toResources(t, m), xds.TranslateOptions{
				Listen: orig.Listen, TLS: orig.TLS, AdminListen: orig.Admin.Listen, AdminTokenEnv: orig.Admin.TokenEnv, RouteConfig: "rc",
				// The replica's own settings come from its bootstrap and flags.
				LoadSignals: orig.LoadSignals, Chaos: orig.Chaos.Enabled, ShadowStore: orig.Shadow.Store,
			})
			if err != nil {
				t.Fatalf("Translate: %v", err)
			}
			if got.Source != xds.Source || !got.Dynamic || got.Version == "" {
				t.Errorf("source %q dynamic %v version %q", got.Source, got.Dynamic, got.Version)
			}
			got.Source, got.Version, got.Dynamic = orig.Source, orig.Version, orig.Dynamic
			want := *orig
			want.Clusters = append([]config.Cluster(nil), orig.Clusters...)
			// Translate orders clusters by name.
			sortClusters(want.Clusters)
			if !reflect.DeepEqual(got, &want) {
				diff(t, &want, got)
			}
		})
	}
}

func sortClusters(cs []config.Cluster) {
	for i := range cs {
		for j := i + 1; j < len(cs); j++ {
			if cs[j].Name < cs[i].Name {
				cs[i], cs[j] = cs[j], cs[i]
			}
		}
	}
}

// diff reports the top-level keys that differ.
func diff(t *testing.T, want, got *config.Config) {
	t.Helper()
	var a, b map[string]any
	ja, _ := json.Marshal(want)
	jb, _ := json.Marshal(got)
	_ = json.Unmarshal(ja, &a)
	_ = json.Unmarshal(jb, &b)
	for k := range a {
		x, _ := json.MarshalIndent(a[k], "", " ")
		y, _ := json.MarshalIndent(b[k], "", " ")
		if string(x) != string(y) {
			t.Errorf("%s differs:\nwant %s\n got %s", k, x, y)
		}
	}
	if !t.Failed() {
		// Equal JSON, different Go values (int vs float in params, nil vs empty).
		t.Errorf("configs differ in Go values:\nwant %#v\n got %#v", want, got)
	}
}

func TestResourcesProblems(t *testing.T) {
	c := &config.Config{Clusters: []config.Cluster{{Name: "mixed", Endpoints: []config.Endpoint{
		{URL: "http://10.0.0.1:80"}, {URL: "https://10.0.0.2:443"}, {URL: "http://10.0.0.3:80/?q=1"},
	}}}}
	_, err := Resources(c, "")
	if err == nil {
		t.Fatal("Resources accepted mixed schemes and a query")
	}
	for _, w := range []string{`cluster "mixed": endpoints[1].url: http and https`, `endpoints[2].url: a query`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in %v", w, err)
		}
	}
	if _, err := Resources(nil, ""); err == nil {
		t.Error("Resources(nil) gave no error")
	}
}
