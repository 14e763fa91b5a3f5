package config

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/sluicegw/sluice/gpu"
	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/heapfloor"
	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/shadow"
)

// Defaults applied by Load. Every one is listed in the config reference, docs/config.md.
const (
	DefaultListen        = "127.0.0.1:8080"
	DefaultAdminListen   = "127.0.0.1:9090"
	DefaultAdminTokenEnv = "SLUICE_ADMIN_TOKEN"
	DefaultMaxBodyBytes  = 16 << 20
	DefaultHeapFloor     = 16 << 20
	DefaultMaxEventBytes = 1 << 20
	DefaultDrainTimeout  = 30 * time.Second
	DefaultDrainDelay    = 5 * time.Second

	DefaultBodyTimeout  = 30 * time.Second
	DefaultWriteTimeout = 30 * time.Second

	DefaultMaxHeaderBytes          = 64 << 10
	DefaultMaxConnectionsPerClient = 512 // with trusted_proxies only (limits.max_connections_per_client unset)
	DefaultMaxBufferedAnswer       = 8 << 20
	DefaultMaxBufferedTotal        = 256 << 20

	DefaultConnectTimeout = 2 * time.Second
	DefaultTTFTTimeout    = 60 * time.Second
	DefaultIdleTimeout    = 60 * time.Second
	DefaultTotalTimeout   = 10 * time.Minute

	DefaultHealthInterval           = 5 * time.Second
	DefaultHealthTimeout            = time.Second
	DefaultHealthUnhealthyThreshold = 3
	DefaultHealthHealthyThreshold   = 2

	DefaultOutlierConsecutiveFailures = 5
	DefaultOutlierBaseEjection        = 30 * time.Second
	DefaultOutlierMaxEjection         = 300 * time.Second
	DefaultOutlierMaxEjectionPercent  = 50

	DefaultMaxIdleConnsPerHost = 256

	DefaultMirrorMaxQueue       = 64
	DefaultMirrorMaxConcurrency = 512
	DefaultMirrorCaptureBytes   = 1 << 20
	DefaultMirrorCaptureTotal   = 256 << 20
	DefaultShadowInterval       = 10 * time.Second
	DefaultShadowWindow         = 500
	DefaultShadowRetention      = 100000
	DefaultShadowBuffer         = shadow.DefaultWriterBytes
	// MinShadowBuffer is the least shadow.buffer: room for a few of the largest pairs.
	MinShadowBuffer = 4 << 20
)

// ValidationError lists every problem found in a config, each prefixed with its path
// (`routes[2].cluster: unknown cluster "x"`). A config loaded from YAML (LoadFile, Parse)
// also says where each problem is: Positions parallels Problems, and File names the file.
type ValidationError struct {
	Problems []string
	// Positions, when set, has one entry per problem: its line (and column where known) in
	// the YAML; a zero Position where the problem has no place in the file. Configs that
	// were not decoded from YAML (xDS, flags) have none.
	Positions []Position
	// File is the config file the positions are in ("" for Parse and configs not from a file).
	File string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid config (%d problems):\n  %s", len(e.Problems), strings.Join(e.Located(), "\n  "))
}

// LoadFileForReplicas loads a config file that a control plane serves to other hosts
// (`sluice xds`): what only a replica can check (environment variables, files, the admin
// token) is left to each replica, and relative paths stay relative (each replica resolves
// them against its own working directory).
func LoadFileForReplicas(file string) (*Config, error) { return loadFile(file, true) }

// LoadFile reads, decodes, defaults and validates a YAML config file.
func LoadFile(file string) (*Config, error) { return loadFile(file, false) }

func loadFile(file string, remote bool) (*Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := load(data, file, func(c *Config) {
		if c.Remote = remote; !remote {
			c.resolvePaths(filepath.Dir(file))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", file, err)
	}
	c.Source = file
	return c, nil
}

// Parse decodes YAML strictly (unknown keys are errors), applies defaults and validates.
// Relative file paths stay relative to the working directory (LoadFile makes them relative
// to the config file). Problems are reported as with LoadFile, with their lines.
func Parse(data []byte) (*Config, error) { return load(data, "", nil) }

// load decodes, finishes and validates a YAML config, and reports every problem at once in
// a *ValidationError, each with its place in the YAML: what could not be decoded (unknown
// keys, wrong types, bad durations and sizes, anywhere in the file) and what Validate finds
// in what could, less the problems that only follow from the former. prepare, when set,
// runs between decoding and Finish.
func load(data []byte, file string, prepare func(*Config)) (*Config, error) {
	d := decode(data)
	problems := d.problems
	if !d.fatal {
		if prepare != nil {
			prepare(d.config)
		}
		if err := d.config.Finish(); err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				return nil, err
			}
			for _, p := range ve.Problems {
				if !d.followsFrom(p) {
					problems = append(problems, located{p, positionOf(d.root, p)})
				}
			}
		}
	}
	if len(problems) > 0 {
		return nil, newValidationError(file, problems)
	}
	return d.config, nil
}

// resolvePaths makes the file paths of a config file relative to the file's folder.
func (c *Config) resolvePaths(dir string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	abs(&c.TLS.CertFile)
	abs(&c.TLS.KeyFile)
	for i := range c.Clusters {
		abs(&c.Clusters[i].TLS.CAFile)
	}
	for i := range c.Tenants {
		abs(&c.Tenants[i].KeysFile)
	}
}

// FromUpstreams builds the one-route, one-cluster config of `sluice serve --upstream URL`;
// healthPath is the cluster's health-check path ("": /health, else /v1/models).
func FromUpstreams(listen, admin string, upstreams []string, healthPath string) (*Config, error) {
	c := &Config{Listen: listen, Admin: Admin{Listen: admin}, Source: "flags"}
	cl := Cluster{Name: "default", HealthCheck: HealthCheck{Path: healthPath}}
	for _, u := range upstreams {
		if !strings.Contains(u, "://") {
			return nil, fmt.Errorf("--upstream %q: give a URL with its scheme, e.g. http://%s", u, u)
		}
		cl.Endpoints = append(cl.Endpoints, Endpoint{URL: u})
	}
	c.Clusters = []Cluster{cl}
	c.Routes = []Route{{Name: "default", Cluster: "default"}}
	sum := sha256.Sum256([]byte(strings.Join(upstreams, ",") + " " + healthPath))
	c.Version = hex.EncodeToString(sum[:6])
	if err := c.Finish(); err != nil {
		return nil, err
	}
	return c, nil
}

// Finish resolves environment references, applies defaults and validates. Loaders call it once.
func (c *Config) Finish() error {
	c.applyDefaults()
	return c.Validate()
}

func (c *Config) applyDefaults() {
	def := policy.Default[string]
	def(&c.Listen, DefaultListen)
	def(&c.Admin.Listen, DefaultAdminListen)
	def(&c.Admin.TokenEnv, DefaultAdminTokenEnv)
	policy.Default(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	policy.Default(&c.HeapFloor, DefaultHeapFloor)
	policy.Default(&c.MaxEventBytes, DefaultMaxEventBytes)
	policy.Default(&c.DrainTimeout, Duration(DefaultDrainTimeout))
	policy.Default(&c.DrainDelay, Duration(DefaultDrainDelay))
	c.Timeouts.Timeouts = c.Timeouts.Or(Timeouts{
		Connect: Duration(DefaultConnectTimeout), TTFT: Duration(DefaultTTFTTimeout),
		Idle: Duration(DefaultIdleTimeout), Total: Duration(DefaultTotalTimeout),
	})
	policy.Default(&c.Timeouts.Body, Duration(DefaultBodyTimeout))
	policy.Default(&c.Timeouts.Write, Duration(DefaultWriteTimeout))
	lm := &c.Limits
	policy.Default(&lm.MaxHeaderBytes, DefaultMaxHeaderBytes)
	policy.Default(&lm.MaxBufferedAnswer, DefaultMaxBufferedAnswer)
	policy.Default(&lm.MaxBufferedTotal, DefaultMaxBufferedTotal)
	ls := &c.LoadSignals
	policy.Default(&ls.Interval, Duration(gpu.DefaultInterval))
	policy.Default(&ls.Timeout, Duration(gpu.DefaultTimeout))
	policy.Default(&ls.Staleness, Duration(gpu.DefaultStaleness))
	def(&ls.Names, "vllm")
	ck := &ls.Checks
	policy.Default(&ck.KVLeak.MinKVUsage, gpu.DefaultLeakMinKVUsage)
	policy.Default(&ck.KVLeak.For, Duration(gpu.DefaultLeakFor))
	if m := ck.KVLeak.MinKVUsage; m > 0 && m <= 1 {
		policy.Default(&ck.KVLeak.ClearBelow, m/2)
	}
	policy.Default(&ck.Stall.Window, Duration(gpu.DefaultStallWindow))
	policy.Default(&ck.Stall.MinWaiting, gpu.DefaultStallMinWaiting)
	policy.Default(&ck.Stall.MaxThroughputRatio, gpu.DefaultStallMaxThroughputRatio)
	for i := range c.Clusters {
		c.Clusters[i].applyDefaults()
	}
	for i := range c.Routes {
		c.Routes[i].applyDefaults(i)
	}
	policy.Default(&c.Shadow.Interval, Duration(DefaultShadowInterval))
	policy.Default(&c.Shadow.Window, DefaultShadowWindow)
	policy.Default(&c.Shadow.Retention, DefaultShadowRetention)
	policy.Default(&c.Shadow.Buffer, ByteSize(DefaultShadowBuffer))
	c.Shadow.Verdict = c.Shadow.Verdict.WithDefaults()
}

// applyDefaults fills in a cluster's endpoint weights, health check, outlier detection, pool
// size and API key (from api_key_env).
func (cl *Cluster) applyDefaults() {
	for j := range cl.Endpoints {
		policy.Default(&cl.Endpoints[j].Weight, 1)
	}
	hc := &cl.HealthCheck
	policy.Default(&hc.Interval, Duration(DefaultHealthInterval))
	policy.Default(&hc.Timeout, Duration(DefaultHealthTimeout))
	policy.Default(&hc.UnhealthyThreshold, DefaultHealthUnhealthyThreshold)
	policy.Default(&hc.HealthyThreshold, DefaultHealthHealthyThreshold)
	od := &cl.Outlier
	policy.Default(&od.ConsecutiveFailures, DefaultOutlierConsecutiveFailures)
	policy.Default(&od.BaseEjection, Duration(DefaultOutlierBaseEjection))
	policy.Default(&od.MaxEjection, Duration(DefaultOutlierMaxEjection))
	policy.Default(&od.MaxEjectionPercent, DefaultOutlierMaxEjectionPercent)
	policy.Default(&cl.Picking.FlaggedWeight, upstream.DefaultFlaggedWeight)
	policy.Default(&cl.MaxIdleConnsPerHost, DefaultMaxIdleConnsPerHost)
	if cl.APIKey == "" && cl.APIKeyEnv != "" {
		cl.APIKey = Secret(os.Getenv(cl.APIKeyEnv))
	}
}

// applyDefaults fills in the i-th route's name, path prefix and mirror.
func (r *Route) applyDefaults(i int) {
	policy.Default(&r.Name, fmt.Sprintf("route-%d", i))
	policy.Default(&r.Match.PathPrefix, "/")
	if r.Mirror != nil {
		r.Mirror = r.Mirror.withDefaults(r.Splits)
	}
}

// withDefaults is a copy of the mirror with its defaults filled in (the decoded mirror is
// never edited in place); a progression without a split takes the split of the route that
// sends to the mirror's cluster.
func (m Mirror) withDefaults(splits []route.Split) *Mirror {
	policy.Default(&m.MaxQueue, DefaultMirrorMaxQueue)
	policy.Default(&m.MaxConcurrency, DefaultMirrorMaxConcurrency)
	policy.Default(&m.CaptureBytes, DefaultMirrorCaptureBytes)
	policy.Default(&m.CaptureTotal, max(DefaultMirrorCaptureTotal, m.CaptureBytes))
	policy.Default(&m.Timeout, Duration(DefaultTotalTimeout))
	if p := m.Progression; p != nil && p.Split == "" {
		p2 := *p
		for _, sp := range splits {
			if sp.Cluster == m.Cluster {
				p2.Split = cmp.Or(sp.Name, sp.Cluster)
				break
			}
		}
		m.Progression = &p2
	}
	return &m
}

// Validate checks the whole config and returns a *ValidationError listing every problem.
func (c *Config) Validate() error {
	var p []string
	var add problemf = func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }

	c.checkListeners(add)
	c.checkBounds(add)
	c.checkChaos(add)
	c.checkLoadSignals(add)
	clusters := c.checkClusters(add)
	c.checkReadiness(add)
	c.checkTenants(add)
	c.checkRoutes(add, clusters)
	c.checkShadow(add)
	if len(p) > 0 {
		return &ValidationError{Problems: p}
	}
	return nil
}

// problemf records one problem of a config, formatted; the checks below take it.
type problemf func(format string, args ...any)

// checkListeners checks the listeners: addresses, the admin token, TLS files.
func (c *Config) checkListeners(add problemf) {
	if err := checkHostPort(c.Listen); err != nil {
		add("listen: %v", err)
	}
	switch c.HTTPServer {
	case "", "sluice", "net/http":
	default:
		add("http_server: %q is not a server (sluice, net/http)", c.HTTPServer)
	}
	switch c.Procs {
	case "", "adaptive", "fixed":
	default:
		add("procs: %q is not a sizing (adaptive, fixed)", c.Procs)
	}
	if err := checkHostPort(c.Admin.Listen); err != nil {
		add("admin.listen: %v", err)
	} else if !c.Remote && !IsLoopback(c.Admin.Listen) && os.Getenv(c.Admin.TokenEnv) == "" {
		add("admin.listen: %q is not a loopback address, so a bearer token is required: set %s", c.Admin.Listen, c.Admin.TokenEnv)
	}
	if c.TLS.Enabled() {
		if c.TLS.CertFile == "" {
			add("tls.cert_file: required when tls.key_file is set")
		} else if _, err := os.Stat(c.TLS.CertFile); err != nil && !c.Remote {
			add("tls.cert_file: %v", err)
		}
		if c.TLS.KeyFile == "" {
			add("tls.key_file: required when tls.cert_file is set")
		} else if _, err := os.Stat(c.TLS.KeyFile); err != nil && !c.Remote {
			add("tls.key_file: %v", err)
		}
	}
}

// checkBounds checks the gateway-wide bounds: body and event sizes, drain, time-outs, trusted proxies, limits, CORS.
func (c *Config) checkBounds(add problemf) {
	if c.MaxBodyBytes < 1024 {
		add("max_body_bytes: %d is too small (at least 1024)", c.MaxBodyBytes)
	}
	if c.MaxEventBytes < 1024 {
		add("max_event_bytes: %d is too small (at least 1024)", c.MaxEventBytes)
	}
	if c.HeapFloor < heapfloor.RuntimeMinimum || c.HeapFloor > 4<<30 {
		add("heap_floor: %d is out of range (4MiB, the runtime's own sizing, to 4GiB)", c.HeapFloor)
	}
	if c.DrainTimeout < 0 {
		add("drain_timeout: must not be negative")
	}
	if c.DrainDelay < 0 {
		add("drain_delay: must not be negative")
	}
	checkTimeouts(add, "timeouts", c.Timeouts.Timeouts)
	if c.Timeouts.Body < 0 {
		add("timeouts.body: must not be negative")
	}
	if c.Timeouts.Write < 0 {
		add("timeouts.write: must not be negative")
	}
	for i, tp := range c.TrustedProxies {
		if _, err := ParsePrefix(tp); err != nil {
			add("trusted_proxies[%d]: %v", i, err)
		}
	}
	lm := c.Limits
	if lm.MaxHeaderBytes < 4<<10 || lm.MaxHeaderBytes > 16<<20 {
		add("limits.max_header_bytes: %d is out of range [4KiB, 16MiB]", lm.MaxHeaderBytes)
	}
	if lm.MaxConnections < 0 {
		add("limits.max_connections: must not be negative (0: three quarters of the open-file limit)")
	}
	if lm.MaxConnectionsPerClient < -1 {
		add("limits.max_connections_per_client: %d is not a bound (0: the default, -1: none)", lm.MaxConnectionsPerClient)
	}
	if lm.MaxBufferedAnswer < 64<<10 {
		add("limits.max_buffered_answer: %d is too small (at least 64KiB)", lm.MaxBufferedAnswer)
	}
	if lm.MaxBufferedTotal < lm.MaxBufferedAnswer {
		add("limits.max_buffered_total: %d is below max_buffered_answer (%d)", lm.MaxBufferedTotal, lm.MaxBufferedAnswer)
	}
	for i, o := range c.CORS.AllowedOrigins {
		if o != "*" && !validOrigin(o) {
			add("cors.allowed_origins[%d]: %q is not an origin (scheme://host[:port], or \"*\")", i, o)
		}
	}
}

// checkChaos checks the chaos block (its faults' own problems, prefixed).
func (c *Config) checkChaos(add problemf) {
	if err := c.Chaos.Validate(); err != nil {
		var fp fault.Problems
		if errors.As(err, &fp) {
			for _, prob := range fp {
				add("chaos.%s", prob)
			}
		} else {
			add("chaos: %v", err)
		}
	}
}

// checkLoadSignals checks load_signals.
func (c *Config) checkLoadSignals(add problemf) {
	if _, ok := gpu.Preset(c.LoadSignals.Names); !ok {
		add("load_signals.names: %q is not vllm, tgi, triton or sglang", c.LoadSignals.Names)
	}
	if c.LoadSignals.Interval < 0 || c.LoadSignals.Timeout < 0 || c.LoadSignals.Staleness < 0 {
		add("load_signals: durations must not be negative")
	}
	l, s := c.LoadSignals.Checks.KVLeak, c.LoadSignals.Checks.Stall
	unit := func(v float64) bool { return v >= 0 && v <= 1 }
	if !unit(l.MinKVUsage) {
		add("load_signals.checks.kv_leak.min_kv_usage: %v is not within 0..1", l.MinKVUsage)
	}
	if !unit(l.ClearBelow) {
		add("load_signals.checks.kv_leak.clear_below: %v is not within 0..1", l.ClearBelow)
	} else if unit(l.MinKVUsage) && l.ClearBelow >= l.MinKVUsage && l.ClearBelow > 0 {
		add("load_signals.checks.kv_leak.clear_below: %v must be below min_kv_usage %v", l.ClearBelow, l.MinKVUsage)
	}
	if l.For < 0 {
		add("load_signals.checks.kv_leak.for: must not be negative")
	}
	if s.Window < 0 {
		add("load_signals.checks.stall.window: must not be negative")
	}
	if !(s.MinWaiting >= 0 && s.MinWaiting <= 1e9) {
		add("load_signals.checks.stall.min_waiting: %v is not within 0..1e9", s.MinWaiting)
	}
	if !(s.MaxThroughputRatio >= 0 && s.MaxThroughputRatio < 1) {
		add("load_signals.checks.stall.max_throughput_ratio: %v is not within 0..1 (1 excluded)", s.MaxThroughputRatio)
	}
}

// GPU returns the checks as package gpu takes them.
func (c SignalChecks) GPU() gpu.Checks {
	return gpu.Checks{
		Disabled: c.Disabled,
		Leak:     gpu.LeakCheck{Disabled: c.KVLeak.Disabled, MinKVUsage: c.KVLeak.MinKVUsage, For: c.KVLeak.For.D(), ClearBelow: c.KVLeak.ClearBelow},
		Stall: gpu.StallCheck{Disabled: c.Stall.Disabled, Window: c.Stall.Window.D(), MinWaiting: c.Stall.MinWaiting,
			MaxThroughputRatio: c.Stall.MaxThroughputRatio},
	}
}

// checkClusters checks the clusters, and returns their names.
func (c *Config) checkClusters(add problemf) map[string]bool {
	clusters := map[string]bool{}
	if len(c.Clusters) == 0 && !c.Dynamic {
		add("clusters: at least one cluster is required")
	}
	for i, cl := range c.Clusters {
		at := fmt.Sprintf("clusters[%d]", i)
		switch {
		case cl.Name == "":
			add("%s.name: required", at)
		case clusters[cl.Name]:
			add("%s.name: duplicate cluster %q", at, cl.Name)
		}
		clusters[cl.Name] = true
		if len(cl.Endpoints) == 0 && !cl.Pending {
			add("%s.endpoints: at least one endpoint is required", at)
		}
		seen := map[string]bool{}
		for j, ep := range cl.Endpoints {
			eat := fmt.Sprintf("%s.endpoints[%d]", at, j)
			if err := checkURL(ep.URL); err != nil {
				add("%s.url: %v", eat, err)
			} else if seen[ep.URL] {
				add("%s.url: duplicate endpoint %q", eat, ep.URL)
			}
			seen[ep.URL] = true
			if ep.Metrics != "" {
				if err := checkURL(ep.Metrics); err != nil {
					add("%s.metrics: %v", eat, err)
				}
			}
			if ep.Weight < 0 || ep.Weight > upstream.MaxWeight {
				add("%s.weight: %d is not within 1..%d", eat, ep.Weight, upstream.MaxWeight)
			}
		}
		checkTimeouts(add, at+".timeouts", cl.Timeouts)
		hc := cl.HealthCheck
		if hc.Path != "" && !strings.HasPrefix(hc.Path, "/") {
			add("%s.health_check.path: must start with /", at)
		}
		if hc.Interval < 0 || hc.Timeout < 0 {
			add("%s.health_check: interval and timeout must not be negative", at)
		}
		if hc.UnhealthyThreshold < 0 || hc.HealthyThreshold < 0 {
			add("%s.health_check: thresholds must not be negative", at)
		}
		od := cl.Outlier
		if od.ConsecutiveFailures < 0 {
			add("%s.outlier.consecutive_failures: must not be negative", at)
		}
		if od.BaseEjection < 0 || od.MaxEjection < 0 {
			add("%s.outlier: ejection times must not be negative", at)
		} else if od.MaxEjection < od.BaseEjection {
			add("%s.outlier.max_ejection: %s is shorter than base_ejection %s", at, od.MaxEjection.D(), od.BaseEjection.D())
		}
		if od.MaxEjectionPercent < 0 || od.MaxEjectionPercent > 100 {
			add("%s.outlier.max_ejection_percent: %d is not within 0..100", at, od.MaxEjectionPercent)
		}
		if cl.TLS.CAFile != "" && !c.Remote {
			if _, err := os.Stat(cl.TLS.CAFile); err != nil {
				add("%s.tls.ca_file: %v", at, err)
			}
		}
		if cl.APIKeyEnv != "" && cl.APIKey == "" && !c.Remote {
			add("%s.api_key_env: environment variable %s is empty or unset", at, cl.APIKeyEnv)
		}
		if cl.MaxIdleConnsPerHost < 0 {
			add("%s.max_idle_conns_per_host: must not be negative", at)
		}
		switch cl.HTTPClient {
		case "", "sluice", "net/http":
		default:
			add("%s.http_client: %q is not a client (sluice, net/http)", at, cl.HTTPClient)
		}
		switch cl.Picking.Strategy {
		case "", "least_inflight":
		case "load_aware":
			if !cl.Pending && !slices.ContainsFunc(cl.Endpoints, func(e Endpoint) bool { return e.Metrics != "" }) {
				add("%s.picking.strategy: load_aware needs endpoints with a metrics URL", at)
			}
		default:
			add("%s.picking.strategy: %q is not least_inflight or load_aware", at, cl.Picking.Strategy)
		}
		for _, w := range []struct {
			name string
			v    float64
		}{{"inflight_weight", cl.Picking.InFlightWeight}, {"waiting_weight", cl.Picking.WaitingWeight}, {"kv_weight", cl.Picking.KVWeight}, {"affinity_max_load", cl.Picking.AffinityMaxLoad}} {
			if w.v < 0 || w.v > 1e6 || w.v != w.v {
				add("%s.picking.%s: %v is not within 0..1e6", at, w.name, w.v)
			}
		}
		if cl.Picking.AffinityMinPrefix < 0 {
			add("%s.picking.affinity_min_prefix: must not be negative", at)
		}
		if fw := cl.Picking.FlaggedWeight; !(fw >= 0 && fw <= 1) {
			add("%s.picking.flagged_weight: %v is not within 0..1", at, fw)
		}
	}
	return clusters
}

// checkReadiness checks admin.ready_clusters (against the clusters) and the metrics token.
func (c *Config) checkReadiness(add problemf) {
	for i, name := range c.Admin.ReadyClusters {
		at := fmt.Sprintf("admin.ready_clusters[%d]", i)
		var cl *Cluster
		for j := range c.Clusters {
			if c.Clusters[j].Name == name {
				cl = &c.Clusters[j]
			}
		}
		switch {
		case cl == nil:
			add("%s: unknown cluster %q", at, name)
		case cl.HealthCheck.Disabled || cl.HealthCheck.Interval == 0:
			add("%s: cluster %q has no active health check, so its readiness is unknown", at, name)
		}
	}
	if c.Admin.MetricsTokenEnv != "" && !c.Remote && os.Getenv(c.Admin.MetricsTokenEnv) == "" {
		add("admin.metrics_token_env: %s is not set (or empty)", c.Admin.MetricsTokenEnv)
	}
}

// checkTenants checks the tenants.
func (c *Config) checkTenants(add problemf) {
	tenants := map[string]bool{}
	for i, t := range c.Tenants {
		at := fmt.Sprintf("tenants[%d]", i)
		switch {
		case t.Name == "":
			add("%s.name: required", at)
		case tenants[t.Name]:
			add("%s.name: duplicate tenant %q", at, t.Name)
		}
		tenants[t.Name] = true
		if t.KeysEnv == "" && t.KeysFile == "" {
			add("%s: keys_env or keys_file is required", at)
		}
		if t.KeysEnv != "" && os.Getenv(t.KeysEnv) == "" && !c.Remote {
			add("%s.keys_env: environment variable %s is empty or unset", at, t.KeysEnv)
		}
		if t.KeysFile != "" && !c.Remote {
			if _, err := os.Stat(t.KeysFile); err != nil {
				add("%s.keys_file: %v", at, err)
			}
		}
	}
}

// checkRoutes checks the routes, against the clusters' names.
func (c *Config) checkRoutes(add problemf, clusters map[string]bool) {
	if len(c.Routes) == 0 && !c.Dynamic {
		add("routes: at least one route is required")
	}
	names := map[string]bool{}
	for i, r := range c.Routes {
		at := fmt.Sprintf("routes[%d]", i)
		if names[r.Name] {
			add("%s.name: duplicate route %q", at, r.Name)
		}
		names[r.Name] = true
		switch {
		case r.Cluster == "" && !hasWeightedSplit(r):
			add("%s.cluster: required (or weighted splits)", at)
		case r.Cluster != "" && !clusters[r.Cluster]:
			add("%s.cluster: unknown cluster %q", at, r.Cluster)
		}
		for _, prob := range r.Spec.Problems() {
			add("%s.%s", at, prob)
		}
		for j, sp := range r.Splits {
			if sp.Cluster != "" && !clusters[sp.Cluster] {
				add("%s.splits[%d].cluster: unknown cluster %q", at, j, sp.Cluster)
			}
		}
		for j, st := range r.Fallback {
			if st.Cluster != "" && !clusters[st.Cluster] {
				add("%s.fallback[%d].cluster: unknown cluster %q", at, j, st.Cluster)
			}
		}
		if !strings.HasPrefix(r.Match.PathPrefix, "/") {
			add("%s.match.path_prefix: must start with /", at)
		}
		if r.Match.Model != "" {
			if _, err := path.Match(r.Match.Model, ""); err != nil {
				add("%s.match.model: invalid glob %q: %v", at, r.Match.Model, err)
			}
		}
		for h := range r.Match.Headers {
			if h == "" || strings.ContainsAny(h, " \t:") {
				add("%s.match.headers: invalid header name %q", at, h)
			}
		}
		checkTimeouts(add, at+".timeouts", r.Timeouts)
		for j, ps := range r.Policies {
			if ps.Type == "" {
				add("%s.policies[%d].type: required", at, j)
			}
		}
		if m := r.Mirror; m != nil {
			checkMirror(add, at+".mirror", r, m, clusters)
		}
	}
}

// checkShadow checks the shadow block.
func (c *Config) checkShadow(add problemf) {
	if c.Shadow.Interval < 0 {
		add("shadow.interval: must not be negative")
	}
	if c.Shadow.Window < 8 {
		add("shadow.window: %d is too small (at least 8)", c.Shadow.Window)
	}
	if c.Shadow.Retention < c.Shadow.Window {
		add("shadow.retention: %d is smaller than shadow.window %d", c.Shadow.Retention, c.Shadow.Window)
	}
	if shadow.IsPostgresURL(c.Shadow.Store) {
		// Checked, not connected to: the database is reached when the gateway starts.
		if err := shadow.CheckPostgresURL(c.Shadow.Store); err != nil {
			add("shadow.store: %v", err)
		}
	} else if scheme, _, ok := strings.Cut(c.Shadow.Store, "://"); ok {
		// Not echoed: a URL of another database may hold its password.
		add("shadow.store: a %.32q URL: give a SQLite file, or a postgres:// or postgresql:// URL", scheme+"://")
	}
	if n := c.Shadow.Instance; len(n) > shadow.MaxNameLen || strings.ContainsFunc(n, unicode.IsControl) || n != strings.TrimSpace(n) {
		add("shadow.instance: %q: at most %d bytes, without control characters or surrounding spaces", n, shadow.MaxNameLen)
	}
	if c.Shadow.Buffer < MinShadowBuffer {
		add("shadow.buffer: %d is too small (at least %d: 4MiB)", c.Shadow.Buffer, MinShadowBuffer)
	}
	if err := c.Shadow.Verdict.Validate(); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			add("shadow.verdict: %s", strings.TrimPrefix(e, "shadow: "))
		}
	}
}

func checkMirror(add problemf, at string, r Route, m *Mirror, clusters map[string]bool) {
	switch {
	case m.Cluster == "":
		add("%s.cluster: required", at)
	case !clusters[m.Cluster]:
		add("%s.cluster: unknown cluster %q", at, m.Cluster)
	case m.Cluster == r.Cluster && len(r.Splits) == 0:
		add("%s.cluster: %q is the route's own cluster; mirror to a sandbox cluster", at, m.Cluster)
	}
	switch {
	case m.Baseline == "":
	case !clusters[m.Baseline]:
		add("%s.baseline: unknown cluster %q", at, m.Baseline)
	case m.Baseline == m.Cluster:
		add("%s.baseline: %q is the candidate's cluster; the baseline runs the primary's version in its own sandbox", at, m.Baseline)
	case m.Baseline == r.Cluster && len(r.Splits) == 0:
		add("%s.baseline: %q is the route's own cluster; the baseline is a sandbox (use replica_fraction to compare against production)", at, m.Baseline)
	}
	if m.Baseline != "" && m.ReplicaFraction > 0 {
		add("%s.replica_fraction: not with a baseline (the noise floor is the primary against the baseline)", at)
	}
	for i, f := range m.AbnormalFinish {
		if f == "" || len(f) > 64 {
			add("%s.abnormal_finish[%d]: %q is not a finish reason (\"missing\" for none)", at, i, f)
		}
	}
	if !(m.Fraction > 0 && m.Fraction <= 1) {
		add("%s.fraction: %v is not within (0, 1]", at, m.Fraction)
	}
	if !(m.ReplicaFraction >= 0 && m.ReplicaFraction <= 1) {
		add("%s.replica_fraction: %v is not within [0, 1]", at, m.ReplicaFraction)
	}
	if m.MaxQueue < 0 || m.MaxQueue > 1<<16 {
		add("%s.max_queue: %d is not within 0..65536", at, m.MaxQueue)
	}
	if m.MaxConcurrency < 1 || m.MaxConcurrency > 4096 {
		add("%s.max_concurrency: %d is not within 1..4096", at, m.MaxConcurrency)
	}
	if m.CaptureBytes < 1024 {
		add("%s.capture_bytes: %d is too small (at least 1024)", at, m.CaptureBytes)
	}
	if m.CaptureTotal < m.CaptureBytes {
		add("%s.capture_total: %d is less than capture_bytes (%d)", at, m.CaptureTotal, m.CaptureBytes)
	}
	if m.Timeout < 0 {
		add("%s.timeout: must not be negative", at)
	}
	for _, h := range m.StripHeaders {
		if h == "" || strings.ContainsAny(h, " \t:") {
			add("%s.strip_headers: invalid header name %q", at, h)
		}
	}
	for h, v := range m.SetHeaders {
		if h == "" || strings.ContainsAny(h, " \t:") {
			add("%s.set_headers: invalid header name %q", at, h)
		}
		if strings.ContainsAny(v, "\r\n") {
			add("%s.set_headers.%s: value must not contain line breaks", at, h)
		}
		if CredentialLike(h) {
			add("%s.set_headers.%s: credentials for the sandbox come from its cluster's api_key", at, h)
		}
	}
	if p := m.Progression; p != nil {
		pat := at + ".progression"
		if p.Split == "" {
			add("%s.split: no split of this route sends to %q; name the candidate's split", pat, m.Cluster)
		} else if !slices.ContainsFunc(r.Splits, func(sp route.Split) bool { return sp.Name == p.Split || sp.Name == "" && sp.Cluster == p.Split }) {
			add("%s.split: the route has no split %q", pat, p.Split)
		}
		if p.Step < 1 {
			add("%s.step: %d must be at least 1", pat, p.Step)
		}
		if p.Max < 1 {
			add("%s.max: %d must be at least 1", pat, p.Max)
		}
		if p.Interval <= 0 {
			add("%s.interval: required (how often the weight steps up)", pat)
		}
	}
}

// CredentialLike reports whether a header or query parameter name looks like it carries a
// credential (API keys, tokens, passwords, signatures, cookies). Such names never reach a
// mirror's sandbox, whatever the vendor calls them, and set_headers may not set them.
func CredentialLike(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"auth", "key", "token", "secret", "password", "passwd", "cookie", "signature", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return n == "sig" || n == "code"
}

func hasWeightedSplit(r Route) bool {
	for _, sp := range r.Splits {
		if sp.Weight > 0 {
			return true
		}
	}
	return false
}

func checkTimeouts(add problemf, at string, t Timeouts) {
	for _, f := range []struct {
		name string
		v    Duration
	}{{"connect", t.Connect}, {"ttft", t.TTFT}, {"idle", t.Idle}, {"total", t.Total}} {
		if f.v < 0 {
			add("%s.%s: must not be negative", at, f.name)
		}
	}
}

func checkHostPort(addr string) error {
	if addr == "" {
		return errors.New("required")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	return nil
}

func checkURL(s string) error {
	if _, err := upstream.ParseEndpointURL(s); err != nil {
		if strings.Contains(err.Error(), strconv.Quote(s)) {
			return err
		}
		return fmt.Errorf("%q: %w", s, err)
	}
	return nil
}

// IsLoopback reports whether a host:port listens on loopback only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ParsePrefix parses a CIDR ("10.0.0.0/8", "fd00::/8") or a single IP address (a /32 or
// /128) into its network.
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an IP address", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// validOrigin reports whether o is a browser origin: scheme://host[:port], nothing more.
func validOrigin(o string) bool {
	u, err := url.Parse(o)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.Path == "" && u.RawQuery == "" && u.Fragment == "" && u.User == nil
}
