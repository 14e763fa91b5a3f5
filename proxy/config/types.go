// Package config is Sluice's one config model. A YAML file (and, later, xDS) produces a Config;
// Load applies defaults and Validate reports every problem at once, each with its path
// (`routes[2].cluster: unknown cluster "x"`). A Config is immutable once loaded: the gateway
// swaps whole configs atomically and never edits one in place.
//
// The config reference in docs/config.md is checked against these structs by a test
// (TestReadmeDocumentsEveryKey), so the two cannot drift.
package config

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/shadow"
)

// Config is the whole gateway configuration.
type Config struct {
	// Listen is the address of the OpenAI-compatible listener (HTTP/1.1 and h2c, or TLS).
	Listen string `yaml:"listen" json:"listen"`
	// TLS enables TLS on the listener; the files are re-read when they change.
	TLS ListenerTLS `yaml:"tls" json:"tls"`
	// HTTPServer is the server of the plain (not TLS) listener: "sluice" (default), the
	// gateway's own HTTP/1.1 server, which hands h2c and unusual requests to net/http's; or
	// "net/http" for net/http's alone. A TLS listener is always net/http's. Fixed at start.
	HTTPServer string `yaml:"http_server" json:"http_server,omitempty"`
	// Procs sizes the Go runtime's processors (GOMAXPROCS): "adaptive" (default), one while
	// one keeps up and more, up to the runtime's own number, as soon as the load needs them
	// (proxy/procs); or "fixed", the runtime's own number throughout. The GOMAXPROCS
	// environment variable, when set, is fixed. Fixed at start.
	Procs string `yaml:"procs" json:"procs,omitempty"`
	// HeapFloor is the least heap goal of the Go collector (proxy/heapfloor): while the live
	// heap is under half of it, the collector waits for the heap to reach it rather than for
	// twice the live heap. 4MiB is the runtime's own sizing; the GOGC environment variable,
	// when set, is kept. Fixed at start.
	HeapFloor ByteSize `yaml:"heap_floor" json:"heap_floor"`
	// MaxBodyBytes bounds a request body; larger requests get 413.
	MaxBodyBytes ByteSize `yaml:"max_body_bytes" json:"max_body_bytes"`
	// MaxEventBytes bounds one SSE event relayed from an upstream.
	MaxEventBytes ByteSize `yaml:"max_event_bytes" json:"max_event_bytes"`
	// DrainTimeout is how long in-flight requests may run on after SIGTERM before they are cancelled.
	DrainTimeout Duration `yaml:"drain_timeout" json:"drain_timeout"`
	// DrainDelay is how long the listener keeps accepting after SIGTERM with readiness
	// already off, so that load balancers stop sending before the listener closes.
	DrainDelay Duration `yaml:"drain_delay" json:"drain_delay"`
	// Timeouts are the defaults for every route (a cluster's and then a route's own override
	// them), and the bounds on the client's side of a request.
	Timeouts GlobalTimeouts `yaml:"timeouts" json:"timeouts"`
	// TrustedProxies are the peers (CIDRs or IPs) whose X-Forwarded-For / Forwarded headers
	// are believed, right to left, to find the client's address.
	TrustedProxies []string `yaml:"trusted_proxies" json:"trusted_proxies,omitempty"`
	// Limits bound what clients can hold of the gateway: connections, header sizes, buffers.
	Limits Limits `yaml:"limits" json:"limits"`
	// CORS, when set, lets browser pages of the given origins call the API.
	CORS CORS `yaml:"cors" json:"cors"`
	// Admin is the separate admin listener (/healthz, /readyz, /metrics, /admin/...).
	Admin Admin `yaml:"admin" json:"admin"`
	// LoadSignals: model-server metrics and local GPUs as load signals.
	LoadSignals LoadSignals `yaml:"load_signals" json:"load_signals"`
	// Chaos is built-in fault injection (off unless enabled; `sluice serve --chaos`).
	Chaos fault.Config `yaml:"chaos" json:"chaos"`
	// Tenants are identified by their API keys (Authorization: Bearer KEY).
	Tenants []Tenant `yaml:"tenants" json:"tenants,omitempty"`
	// Clusters are the upstream model-server pools.
	Clusters []Cluster `yaml:"clusters" json:"clusters"`
	// Routes are matched in order; the first match serves the request.
	Routes []Route `yaml:"routes" json:"routes"`
	// Shadow configures how mirrored pairs are judged and where they are kept (routes mirror
	// with their own `mirror:` block).
	Shadow Shadow `yaml:"shadow" json:"shadow"`

	// Source is where the config came from (file path or "flags"); set by the loader.
	Source string `yaml:"-" json:"source"`
	// Version is a short hash of the config's content; set by the loader.
	Version string `yaml:"-" json:"version"`
	// Dynamic marks a config that a control plane (xDS) produced or will produce: it may have
	// no clusters and no routes yet (a replica starting before the first push answers 404
	// no_route until routes arrive). Never set by the file loader.
	Dynamic bool `yaml:"-" json:"dynamic,omitempty"`
	// Remote marks a config a control plane serves to other hosts (LoadFileForReplicas):
	// checks of this host's environment variables and files are each replica's to make.
	Remote bool `yaml:"-" json:"-"`
}

// ListenerTLS holds the listener's certificate and key files.
type ListenerTLS struct {
	CertFile string `yaml:"cert_file" json:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file" json:"key_file,omitempty"`
}

// Enabled reports whether TLS is configured on the listener.
func (t ListenerTLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// Admin configures the admin listener.
type Admin struct {
	Listen string `yaml:"listen" json:"listen"`
	// TokenEnv names the environment variable holding the bearer token for /admin/*.
	// A token is required when Listen is not a loopback address.
	TokenEnv string `yaml:"token_env" json:"token_env"`
	// MetricsTokenEnv names the environment variable holding a bearer token that /metrics
	// requires (the admin token is accepted too): a scrape credential that grants nothing
	// else. Empty: /metrics needs no token.
	MetricsTokenEnv string `yaml:"metrics_token_env" json:"metrics_token_env,omitempty"`
	// ReadyClusters keeps /readyz 503 while any of these clusters has no endpoint that has
	// passed an active health check and is healthy now: a sidecar is ready only while its
	// model server is.
	ReadyClusters []string `yaml:"ready_clusters" json:"ready_clusters,omitempty"`
}

// Timeouts bound one upstream attempt. Zero means "inherit" while loading and "none" once resolved.
type Timeouts struct {
	// Connect bounds the TCP (and TLS) connection to an endpoint.
	Connect Duration `yaml:"connect" json:"connect"`
	// TTFT bounds the wait for the first byte of the response body (the first SSE event for streams).
	TTFT Duration `yaml:"ttft" json:"ttft"`
	// Idle bounds the gap between two SSE events (or two reads of a non-streaming body).
	Idle Duration `yaml:"idle" json:"idle"`
	// Total bounds the whole request.
	Total Duration `yaml:"total" json:"total"`
}

// GlobalTimeouts are the top-level time-outs: the defaults of every route (Timeouts) and
// the bounds on the client's side of a request, which only the listener knows.
type GlobalTimeouts struct {
	Timeouts `yaml:",inline"`
	// Body bounds reading a request's body, from the end of its headers (408 past it).
	Body Duration `yaml:"body" json:"body"`
	// Write bounds one write to the client: a client that stops reading is dropped and
	// its upstream request released.
	Write Duration `yaml:"write" json:"write"`
}

// Limits bound what clients can hold of the gateway.
type Limits struct {
	// MaxHeaderBytes bounds a request's headers (431 past it).
	MaxHeaderBytes ByteSize `yaml:"max_header_bytes" json:"max_header_bytes"`
	// MaxConnections bounds the API listener's open connections (0: three quarters of the
	// process's open-file limit), so that the admin listener and upstream connections keep
	// file descriptors.
	MaxConnections int `yaml:"max_connections" json:"max_connections"`
	// MaxConnectionsPerClient bounds one client address's open connections (trusted proxies
	// are exempt: they carry many clients). 0: DefaultMaxConnectionsPerClient when
	// TrustedProxies are configured, else none (the peer may be a load balancer or a sidecar
	// carrying every client); -1: none.
	MaxConnectionsPerClient int `yaml:"max_connections_per_client" json:"max_connections_per_client"`
	// MaxBufferedAnswer bounds a non-streaming answer held whole before it is relayed (so that
	// a failed one can be retried); a longer one is streamed through.
	MaxBufferedAnswer ByteSize `yaml:"max_buffered_answer" json:"max_buffered_answer"`
	// MaxBufferedTotal bounds all answers held at once; past it answers are streamed through.
	MaxBufferedTotal ByteSize `yaml:"max_buffered_total" json:"max_buffered_total"`
}

// CORS lets browser pages of some origins call the API (none by default).
type CORS struct {
	// AllowedOrigins are the origins ("https://app.example.com", or "*") allowed.
	AllowedOrigins []string `yaml:"allowed_origins" json:"allowed_origins,omitempty"`
}

// Or returns t with every zero field taken from d.
func (t Timeouts) Or(d Timeouts) Timeouts {
	if t.Connect == 0 {
		t.Connect = d.Connect
	}
	if t.TTFT == 0 {
		t.TTFT = d.TTFT
	}
	if t.Idle == 0 {
		t.Idle = d.Idle
	}
	if t.Total == 0 {
		t.Total = d.Total
	}
	return t
}

// Cluster is a pool of endpoints serving the same models.
type Cluster struct {
	Name      string     `yaml:"name" json:"name"`
	Endpoints []Endpoint `yaml:"endpoints" json:"endpoints"`
	// Timeouts are defaults for routes that send to this cluster.
	Timeouts    Timeouts    `yaml:"timeouts" json:"timeouts"`
	HealthCheck HealthCheck `yaml:"health_check" json:"health_check"`
	Outlier     Outlier     `yaml:"outlier" json:"outlier"`
	TLS         UpstreamTLS `yaml:"tls" json:"tls"`
	// APIKey replaces the client's Authorization with "Bearer <key>" towards this cluster.
	APIKey Secret `yaml:"api_key" json:"api_key,omitempty"`
	// APIKeyEnv names an environment variable holding APIKey (read at load time).
	APIKeyEnv string `yaml:"api_key_env" json:"api_key_env,omitempty"`
	// MaxIdleConnsPerHost sizes the keep-alive pool to each endpoint.
	MaxIdleConnsPerHost int `yaml:"max_idle_conns_per_host" json:"max_idle_conns_per_host"`
	// HTTPClient is the client of the cluster's plain-HTTP endpoints: "sluice" (default),
	// the gateway's own HTTP/1.1 client on the handler's goroutine, or "net/http", Go's
	// Transport (https endpoints always use Go's).
	HTTPClient string `yaml:"http_client" json:"http_client,omitempty"`
	// Picking chooses an endpoint for each request.
	Picking Picking `yaml:"picking" json:"picking"`
	// Pending marks a cluster a route names whose endpoints are not known yet (xDS: the
	// cluster or its endpoint assignment has not been received, or has no endpoints). It may
	// have no endpoints; its requests get 503 no_endpoint until they arrive, as with Envoy.
	// Never set by the file loader.
	Pending bool `yaml:"-" json:"pending,omitempty"`
}

// Picking configures endpoint picking within a cluster. With metrics URLs on the endpoints
// the default is load-aware (queue depth, KV-cache use, in-flight; fresh signals only) with
// prompt-prefix affinity; without, least in-flight.
type Picking struct {
	// Strategy is "least_inflight" or "load_aware" ("": load_aware when endpoints have metrics).
	Strategy       string  `yaml:"strategy" json:"strategy,omitempty"`
	InFlightWeight float64 `yaml:"inflight_weight" json:"inflight_weight,omitempty"`
	WaitingWeight  float64 `yaml:"waiting_weight" json:"waiting_weight,omitempty"`
	KVWeight       float64 `yaml:"kv_weight" json:"kv_weight,omitempty"`
	// AffinityMaxLoad: how much worse (score units ≈ requests) the prefix's endpoint may be
	// than the best before affinity is given up for a request.
	AffinityMaxLoad float64 `yaml:"affinity_max_load" json:"affinity_max_load,omitempty"`
	// AffinityMinPrefix: the shortest prompt prefix (bytes) that earns affinity.
	AffinityMinPrefix int  `yaml:"affinity_min_prefix" json:"affinity_min_prefix,omitempty"`
	DisableAffinity   bool `yaml:"disable_affinity" json:"disable_affinity,omitempty"`
	// FlaggedWeight: the share of its weight an endpoint keeps while load_signals.checks
	// flag it (0 < x <= 1; 1 leaves it alone).
	FlaggedWeight float64 `yaml:"flagged_weight" json:"flagged_weight,omitempty"`
}

// LoadSignals configures how model-server metrics (and local GPUs) are read.
type LoadSignals struct {
	// Interval between scrapes of one endpoint's metrics URL.
	Interval Duration `yaml:"interval" json:"interval"`
	// Timeout of one scrape.
	Timeout Duration `yaml:"timeout" json:"timeout"`
	// Staleness: a signal older than this is not used.
	Staleness Duration `yaml:"staleness" json:"staleness"`
	// Names is the metric-name preset: vllm, tgi, triton or sglang.
	Names string `yaml:"names" json:"names"`
	// DisableNVML stops reading this host's GPUs through NVML (/admin/gpu, metrics).
	DisableNVML bool `yaml:"disable_nvml" json:"disable_nvml,omitempty"`
	// Checks are the model-server state checks run on every scrape: a KV-cache leak and a
	// stall flag the endpoint (metric, /admin/gpu, /admin/endpoints, log); picking lowers a
	// flagged endpoint's weight (clusters[].picking.flagged_weight) and may eject it
	// (clusters[].outlier.eject_flagged).
	Checks SignalChecks `yaml:"checks" json:"checks"`
}

// SignalChecks configures the model-server state checks (package gpu's Checks).
type SignalChecks struct {
	// Disabled turns both checks off.
	Disabled bool       `yaml:"disabled" json:"disabled,omitempty"`
	KVLeak   LeakCheck  `yaml:"kv_leak" json:"kv_leak"`
	Stall    StallCheck `yaml:"stall" json:"stall"`
}

// LeakCheck flags KV-cache use that outlives every request: at least MinKVUsage on every
// scrape for For, each with nothing running or waiting. It clears on a scrape below
// ClearBelow.
type LeakCheck struct {
	MinKVUsage float64  `yaml:"min_kv_usage" json:"min_kv_usage"`
	For        Duration `yaml:"for" json:"for"`
	ClearBelow float64  `yaml:"clear_below" json:"clear_below"`
	Disabled   bool     `yaml:"disabled" json:"disabled,omitempty"`
}

// StallCheck flags a queue that grows (and stays at MinWaiting or more) while throughput
// falls to MaxThroughputRatio of what it was, over Window.
type StallCheck struct {
	Window             Duration `yaml:"window" json:"window"`
	MinWaiting         float64  `yaml:"min_waiting" json:"min_waiting"`
	MaxThroughputRatio float64  `yaml:"max_throughput_ratio" json:"max_throughput_ratio"`
	Disabled           bool     `yaml:"disabled" json:"disabled,omitempty"`
}

// Endpoint is one model-server replica.
type Endpoint struct {
	// URL is the server's base URL (scheme, host, port, optional path prefix); the request path is appended.
	URL string `yaml:"url" json:"url"`
	// Metrics is the server's Prometheus endpoint (used by load-aware picking).
	Metrics string `yaml:"metrics" json:"metrics,omitempty"`
	Weight  int    `yaml:"weight" json:"weight"`
}

// HealthCheck configures active health checking (GET Path every Interval).
type HealthCheck struct {
	Path               string   `yaml:"path" json:"path"`
	Interval           Duration `yaml:"interval" json:"interval"`
	Timeout            Duration `yaml:"timeout" json:"timeout"`
	UnhealthyThreshold int      `yaml:"unhealthy_threshold" json:"unhealthy_threshold"`
	HealthyThreshold   int      `yaml:"healthy_threshold" json:"healthy_threshold"`
	// Disabled turns active checks off for this cluster.
	Disabled bool `yaml:"disabled" json:"disabled"`
}

// Outlier configures passive ejection (Envoy outlier detection semantics).
type Outlier struct {
	ConsecutiveFailures int      `yaml:"consecutive_failures" json:"consecutive_failures"`
	BaseEjection        Duration `yaml:"base_ejection" json:"base_ejection"`
	MaxEjection         Duration `yaml:"max_ejection" json:"max_ejection"`
	MaxEjectionPercent  int      `yaml:"max_ejection_percent" json:"max_ejection_percent"`
	// EjectFlagged also ejects endpoints that load_signals.checks flag (a KV-cache leak, a
	// stall), with the same times and limits, never the last available endpoint.
	EjectFlagged bool `yaml:"eject_flagged" json:"eject_flagged,omitempty"`
	// Disabled turns passive ejection off for this cluster.
	Disabled bool `yaml:"disabled" json:"disabled"`
}

// UpstreamTLS configures HTTPS towards a cluster.
type UpstreamTLS struct {
	CAFile             string `yaml:"ca_file" json:"ca_file,omitempty"`
	ServerName         string `yaml:"server_name" json:"server_name,omitempty"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify" json:"insecure_skip_verify,omitempty"`
}

// Route sends matching requests to a cluster.
type Route struct {
	Name  string `yaml:"name" json:"name"`
	Match Match  `yaml:"match" json:"match"`
	// Cluster serves the route (optional when weighted splits name the clusters).
	Cluster string `yaml:"cluster" json:"cluster,omitempty"`
	// Model, when set, rewrites the request's model name before it is sent upstream.
	Model    string   `yaml:"model" json:"model,omitempty"`
	Timeouts Timeouts `yaml:"timeouts" json:"timeouts"`
	// Policies run on the route's requests: {type, name, params}, built by the policy registry.
	Policies []policy.Spec `yaml:"policies" json:"policies,omitempty"`
	// Mirror copies a share of the route's traffic to a sandbox cluster and compares the pairs.
	Mirror *Mirror `yaml:"mirror" json:"mirror,omitempty"`
	// Spec holds the routing keys: splits, sticky, gray_flag_header, fallback, retry, breaker,
	// resume, contract_mismatch (see policy/route).
	route.Spec `yaml:",inline"`
}

// Mirror sends a copy of a share of a route's requests to a sandbox cluster (the candidate)
// and compares each pair with the primary's answer. The copy never slows the primary: it goes
// through a bounded queue (full: dropped and counted) to a bounded number of workers, and is
// not charged to the tenant's rate limits.
type Mirror struct {
	// Cluster is the sandbox cluster the copies go to.
	Cluster string `yaml:"cluster" json:"cluster"`
	// Model, when set, rewrites the model name in the copies (the candidate model).
	Model string `yaml:"model" json:"model,omitempty"`
	// Fraction of sessions mirrored (0..1]. The choice hashes the session (else the API key's
	// tenant, else the client), so a whole conversation is mirrored or none of it.
	Fraction float64 `yaml:"fraction" json:"fraction"`
	// Baseline is a sandbox cluster running the primary's version: each sampled request is
	// sent to it and to the candidate at the same moment, and latency, error and finish
	// verdicts compare the candidate with it (same requests, same time, same load). The text
	// noise floor is then the primary against the baseline.
	Baseline string `yaml:"baseline" json:"baseline,omitempty"`
	// ReplicaFraction of mirrored requests are also sent to the primary's cluster a second time:
	// primary-vs-primary differences are the noise floor the candidate's are judged against.
	// Without a baseline only; it adds load to production and biases its latency.
	ReplicaFraction float64 `yaml:"replica_fraction" json:"replica_fraction,omitempty"`
	// AbnormalFinish lists the finish reasons that count as abnormal ("missing" for an answer
	// without one). Default: content_filter, missing, and length when the request set no
	// max_tokens (running into max_tokens it asked for is a normal end).
	AbnormalFinish []string `yaml:"abnormal_finish" json:"abnormal_finish,omitempty"`
	// MaxQueue bounds the copies waiting for a worker; past it a copy is dropped and counted.
	MaxQueue int `yaml:"max_queue" json:"max_queue"`
	// MaxConcurrency bounds the mirrored requests whose sandbox copies are in flight (one copy
	// to the candidate, one to the baseline when set, one to the primary for a replica). A
	// copy that is done does not hold its slot while its primary's answer is still coming.
	MaxConcurrency int `yaml:"max_concurrency" json:"max_concurrency"`
	// CaptureBytes bounds how much of each side's answer is kept for the comparison.
	CaptureBytes ByteSize `yaml:"capture_bytes" json:"capture_bytes"`
	// CaptureTotal bounds the answers the route's mirror holds at once, every side of every
	// mirrored request in flight together: past it an answer is kept no further (as past
	// capture_bytes: timed, not compared as text).
	CaptureTotal ByteSize `yaml:"capture_total" json:"capture_total"`
	// Timeout bounds one sandbox request.
	Timeout Duration `yaml:"timeout" json:"timeout"`
	// StripHeaders are removed from the copies, on top of the credentials, which always are
	// (Authorization, Proxy-Authorization, Cookie, X-Api-Key, Api-Key). The sandbox cluster's
	// own api_key, when configured, is sent instead.
	StripHeaders []string `yaml:"strip_headers" json:"strip_headers,omitempty"`
	// SetHeaders are set on the copies.
	SetHeaders map[string]string `yaml:"set_headers" json:"set_headers,omitempty"`
	// Progression steps the candidate's split weight by the verdict (file-configured routes).
	Progression *Progression `yaml:"progression" json:"progression,omitempty"`
}

// Progression is Flagger-style automated weight progression: on promote, the candidate's
// split weight goes up by Step every Interval up to Max; on rollback it is set to 0.
type Progression struct {
	// Split names the candidate's split of this route (default: the split whose cluster is
	// the mirror's cluster).
	Split    string   `yaml:"split" json:"split,omitempty"`
	Step     int      `yaml:"step" json:"step"`
	Interval Duration `yaml:"interval" json:"interval"`
	Max      int      `yaml:"max" json:"max"`
}

// Shadow configures the judging and storage of mirrored pairs.
type Shadow struct {
	// Store is the SQLite file for pairs and verdicts; "" keeps them in memory (lost at exit).
	// A postgres:// or postgresql:// URL names a PostgreSQL database instead, which the
	// replicas of a fleet share: each route's verdict is then judged over every replica's
	// pairs. Its password never shows in logs, reports or /admin/config.
	Store string `yaml:"store" json:"store,omitempty"`
	// Instance names this gateway in a shared store (every pair, verdict and rate it writes
	// carries it); "" means the host name (in Kubernetes, the pod's name).
	Instance string `yaml:"instance" json:"instance,omitempty"`
	// Buffer bounds what a gateway holds, in memory, of the pairs, verdicts and rates it
	// could not write to a shared store yet (the database is down or slow); past it they are
	// dropped and counted.
	Buffer ByteSize `yaml:"buffer" json:"buffer"`
	// Interval between verdicts (each is stored with its evidence).
	Interval Duration `yaml:"interval" json:"interval"`
	// Window is how many recent pairs per route the verdict judges.
	Window int `yaml:"window" json:"window"`
	// Retention is how many pairs per route the store keeps (older ones are deleted).
	Retention int `yaml:"retention" json:"retention"`
	// Verdict holds the statistical thresholds (min_samples, alpha, max_regression,
	// max_rate_increase, similarity_margin, critical_alpha; see package shadow).
	Verdict shadow.Config `yaml:"verdict" json:"verdict"`
}

// shadowShown is Shadow as /admin/config and YAML show it: the store's password masked.
type shadowShown Shadow

// MarshalJSON writes the block with the store URL's password masked.
func (s Shadow) MarshalJSON() ([]byte, error) {
	s.Store = shadow.RedactDSN(s.Store)
	return json.Marshal(shadowShown(s))
}

// MarshalYAML writes the block with the store URL's password masked.
func (s Shadow) MarshalYAML() (any, error) {
	s.Store = shadow.RedactDSN(s.Store)
	return shadowShown(s), nil
}

// Tenant is a client of the gateway, known by its API keys. Keys come by value from an
// environment variable (comma-separated) or a file (one per line) and are never logged.
type Tenant struct {
	Name     string `yaml:"name" json:"name"`
	KeysEnv  string `yaml:"keys_env" json:"keys_env,omitempty"`
	KeysFile string `yaml:"keys_file" json:"keys_file,omitempty"`
	// Priority orders tenants when a saturated route sheds load: lower is shed first.
	Priority int `yaml:"priority" json:"priority"`
}

// Match selects requests. Every given field must match; an empty Match matches everything.
type Match struct {
	// PathPrefix matches the start of the URL path (default "/").
	PathPrefix string `yaml:"path_prefix" json:"path_prefix"`
	// Model matches the request's model exactly or as a glob ("llama-3*"); empty matches any.
	Model string `yaml:"model" json:"model,omitempty"`
	// Headers must all be present with these values ("*" means present with any value).
	Headers map[string]string `yaml:"headers" json:"headers,omitempty"`
}

// Duration is policy.Duration: a Go duration string ("1.5s", "200ms") or a number of seconds.
type Duration = policy.Duration

// ByteSize is a size written as a number of bytes or with a unit: "512KiB", "16MiB", "1GB".
type ByteSize int64

// UnmarshalYAML accepts plain numbers and sizes with units.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: expected a size like \"16MiB\"", n.Line)
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = ByteSize(v)
	return nil
}

// ParseByteSize parses "123", "64KiB", "16MiB", "1GiB", "10KB", "5MB".
func ParseByteSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			mult, s = u.mult, strings.TrimSpace(strings.TrimSuffix(s, u.suffix))
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("invalid size %q (use e.g. \"16MiB\")", s)
	}
	return v * mult, nil
}

// MarshalYAML writes the number of bytes.
func (b ByteSize) MarshalYAML() (any, error) { return int64(b), nil }

// Secret is a credential: it never appears in logs, /admin/config or reports.
type Secret string

const redacted = "[redacted]"

// String hides the value.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// MarshalText hides the value.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalYAML hides the value.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// Reveal returns the value, for the one place that sends it.
func (s Secret) Reveal() string { return string(s) }

// JudgeInterval is shadow.interval, its default where unset: how often verdicts are judged.
func (s *Shadow) JudgeInterval() time.Duration {
	if d := s.Interval.D(); d > 0 {
		return d
	}
	return DefaultShadowInterval
}

// RateFreshness is how far behind the newest an instance's request rates may be and still
// count in the fleet's: three verdict intervals. Replicas and the control plane judge with
// the same figure, so the fleet's verdict is the same from any of them.
func (s *Shadow) RateFreshness() time.Duration { return 3 * s.JudgeInterval() }
