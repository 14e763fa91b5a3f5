package upstream

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Defaults applied by NewCluster to zero-valued options.
const (
	DefaultConnectTimeout      = 2 * time.Second
	DefaultMaxIdleConnsPerHost = 256
	DefaultHealthTimeout       = 1 * time.Second
	DefaultUnhealthyThreshold  = 3
	DefaultHealthyThreshold    = 2
	DefaultBaseEjection        = 30 * time.Second  // Envoy's base_ejection_time
	DefaultMaxEjection         = 300 * time.Second // Envoy's max_ejection_time
	DefaultMaxEjectionPercent  = 50                // Envoy's is 10
	DefaultDecayInterval       = 10 * time.Second  // Envoy's outlier interval
	DefaultWeight              = 1
	MaxWeight                  = 10000

	// Picking (see Picking and the package doc).
	StrategyLeastInFlight    = "least_inflight"
	StrategyLoadAware        = "load_aware"
	DefaultInFlightWeight    = 1.0                   // score per in-flight request per unit of endpoint weight
	DefaultWaitingWeight     = 1.0                   // score per request waiting in the model server's queue
	DefaultKVWeight          = 4.0                   // score at a full KV cache (KVCacheUsage 1)
	DefaultAffinityMaxLoad   = 2.0                   // the affinity endpoint may score this much above the best
	DefaultAffinityMinPrefix = 256                   // bytes of prompt prefix (Hint.PrefixLen) for affinity
	DefaultLoadCache         = 10 * time.Millisecond // how long picks reuse a signal read from Options.Load
	DefaultFlaggedWeight     = 0.1                   // share of its weight a flagged endpoint keeps (Load.Flags)
	maxPickingWeight         = 1e6
)

// Clock is the time source; tests inject a fake. Only Now is needed: ejection expiry is
// checked lazily against it.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// EndpointSpec is one endpoint of a cluster as configured.
type EndpointSpec struct {
	URL        string // base URL, http or https, no user info, query or fragment
	MetricsURL string // optional model-server metrics URL (scraped by package gpu)
	Weight     int    // relative capacity, 1..MaxWeight; 0 means DefaultWeight
}

// HealthCheck configures active health checking. A zero Interval disables it.
type HealthCheck struct {
	// Path is the request path (may carry a query) on the endpoint's host. Empty: the
	// default, AutoHealthPaths in order — "/health" (vLLM, TGI, SGLang, llama.cpp), then
	// "/v1/models" for servers without one (Ollama and some proxies answer 404 there) — the
	// first that exists is used from then on.
	Path               string
	Interval           time.Duration // time between checks of one endpoint; 0 disables active checks
	Timeout            time.Duration // per check; default 1s
	UnhealthyThreshold int           // consecutive failures to mark unhealthy; default 3
	HealthyThreshold   int           // consecutive successes to mark healthy again; default 2
}

// AutoHealthPaths are the paths an empty HealthCheck.Path tries, in order.
var AutoHealthPaths = []string{"/health", "/v1/models"}

// Outlier configures passive outlier detection (Envoy's consecutive_5xx), and the ejection
// of endpoints whose model server is flagged by its metrics (EjectFlagged).
type Outlier struct {
	ConsecutiveFailures int           // failures in a row that eject; 0 disables passive ejection
	BaseEjection        time.Duration // ejection time = BaseEjection × multiplier; default 30s
	MaxEjection         time.Duration // cap on one ejection; default max(300s, BaseEjection)
	MaxEjectionPercent  int           // 1..100, Envoy's rule (see package doc); 0 means 50
	DecayInterval       time.Duration // each full interval back in service lowers the multiplier by one; default 10s
	// EjectFlagged ejects an endpoint whose load (Options.Load) carries flags (a KV-cache
	// leak, a stall), as a failing one is ejected: for BaseEjection × multiplier, within
	// MaxEjectionPercent, and never the last available endpoint. Off by default: a flagged
	// endpoint then only has its weight lowered (Picking.FlaggedWeight).
	EjectFlagged bool
}

// Picking configures how Pick and PickFor choose an endpoint (see the package doc for the
// score). The zero value is the default: load-aware scoring when Options.Load is set, else
// least in-flight; prefix affinity on.
type Picking struct {
	// Strategy is "least_inflight" (in-flight requests per weight only; Load is read for its
	// flags only, see FlaggedWeight) or
	// "load_aware" (in-flight plus the model server's queue and KV-cache use, from
	// Options.Load, fresh signals only). "" means load_aware when Load is set, else
	// least_inflight. load_aware without a Load is an error.
	Strategy string

	// Score weights. When all three are zero the defaults apply (InFlight 1, Waiting 1,
	// KV 4); when any is set, the others are used as given (0 drops that term). Each must
	// be finite and in [0, 1e6].
	InFlightWeight float64 // per (in-flight+1)/weight
	WaitingWeight  float64 // per waiting request (vllm:num_requests_waiting)
	KVWeight       float64 // per unit of KV-cache use, 0..1 (vllm:kv_cache_usage_perc)

	// AffinityMaxLoad is how much higher the affinity endpoint's score may be than the best
	// score before affinity is abandoned for that request (additive, in score units: with
	// the default weights, one unit is one more request in flight or waiting). Default 2.
	AffinityMaxLoad float64
	// AffinityMinPrefix is the shortest prompt prefix, in bytes (Hint.PrefixLen), that
	// earns affinity; a hint without a length (PrefixLen 0) is taken as long enough.
	// Default 256.
	AffinityMinPrefix int
	// DisableAffinity ignores Hint.PrefixHash.
	DisableAffinity bool
	// LoadCache is how long a signal read from Options.Load is reused by picks before Load
	// is asked again, per endpoint; well below the scrape interval (50-100 ms), it only
	// spares the source a call per endpoint per pick. Default 10ms; negative: ask on
	// every pick.
	LoadCache time.Duration
	// FlaggedWeight is the share of its weight an endpoint keeps while its load (Options.Load)
	// carries flags (a KV-cache leak, a stall, found by package gpu's checks), under either
	// strategy: it is picked less, but still picked when the others are loaded enough. In
	// (0, 1]; 0 means the default, 0.1; 1 leaves the weight alone.
	FlaggedWeight float64
}

// TLS configures the client side of TLS to https endpoints.
type TLS struct {
	CAFile             string // PEM bundle; when set it is the only root pool trusted (system roots are not)
	ServerName         string // overrides the name verified and sent in SNI
	InsecureSkipVerify bool   // do not verify the server certificate (tests only)
}

// Options configure one cluster.
type Options struct {
	Name           string
	Endpoints      []EndpointSpec
	ConnectTimeout time.Duration // TCP dial timeout, and TLS handshake timeout; default 2s
	HealthCheck    HealthCheck
	// Authorization, when set, is sent with the cluster's own requests to its endpoints
	// (health checks, model discovery): the cluster's API key, since a server started with
	// one wants it on /v1/models. Never logged.
	Authorization string
	// DiscoverModels has the active health checks also ask healthy endpoints for their
	// models (GET /v1/models every ModelsInterval; see Cluster.Models).
	DiscoverModels      bool
	Outlier             Outlier
	TLS                 TLS
	MaxIdleConnsPerHost int          // keep-alive pool per endpoint; default 256
	NetHTTP             bool         // plain-HTTP endpoints too through net/http's Transport, not h1
	Load                LoadSource   // model-server load per endpoint; nil: in-flight counts only
	Picking             Picking      // strategy, score weights, prefix affinity
	Clock               Clock        // default: the real clock
	Logger              *slog.Logger // health and ejection transitions; default: discard
}

// Validate reports every problem with the options at once (joined with errors.Join), each
// prefixed with the field path, e.g. "endpoints[1].url: scheme must be http or https".
// Zero values are valid where a default exists. It reads TLS.CAFile if one is named.
func (o Options) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if strings.TrimSpace(o.Name) == "" {
		add("name", "must not be empty")
	}
	seen := make(map[string]int, len(o.Endpoints))
	for i, ep := range o.Endpoints {
		field := fmt.Sprintf("endpoints[%d]", i)
		u, err := ParseEndpointURL(ep.URL)
		if err != nil {
			add(field+".url", "%v", err)
		} else {
			key := endpointKey(u)
			if j, dup := seen[key]; dup {
				add(field+".url", "duplicate of endpoints[%d]", j)
			} else {
				seen[key] = i
			}
		}
		if ep.MetricsURL != "" {
			if _, err := ParseEndpointURL(ep.MetricsURL); err != nil {
				add(field+".metrics_url", "%v", err)
			}
		}
		if ep.Weight < 0 || ep.Weight > MaxWeight {
			add(field+".weight", "must be between 1 and %d (0 means %d), got %d", MaxWeight, DefaultWeight, ep.Weight)
		}
	}
	if o.ConnectTimeout < 0 {
		add("connect_timeout", "must not be negative")
	}
	if o.MaxIdleConnsPerHost < 0 {
		add("max_idle_conns_per_host", "must not be negative")
	}

	hc := o.HealthCheck
	if hc.Path != "" {
		if !strings.HasPrefix(hc.Path, "/") {
			add("health_check.path", "must start with /")
		} else if _, err := url.ParseRequestURI(hc.Path); err != nil {
			add("health_check.path", "%v", err)
		}
	}
	if hc.Interval < 0 {
		add("health_check.interval", "must not be negative")
	}
	if hc.Timeout < 0 {
		add("health_check.timeout", "must not be negative")
	}
	if hc.UnhealthyThreshold < 0 {
		add("health_check.unhealthy_threshold", "must not be negative")
	}
	if hc.HealthyThreshold < 0 {
		add("health_check.healthy_threshold", "must not be negative")
	}

	od := o.Outlier
	if od.ConsecutiveFailures < 0 {
		add("outlier.consecutive_failures", "must not be negative")
	}
	if od.BaseEjection < 0 {
		add("outlier.base_ejection", "must not be negative")
	}
	if od.MaxEjection < 0 {
		add("outlier.max_ejection", "must not be negative")
	}
	if od.BaseEjection > 0 && od.MaxEjection > 0 && od.MaxEjection < od.BaseEjection {
		add("outlier.max_ejection", "must not be less than base_ejection (%v < %v)", od.MaxEjection, od.BaseEjection)
	}
	if od.MaxEjectionPercent < 0 || od.MaxEjectionPercent > 100 {
		add("outlier.max_ejection_percent", "must be between 0 and 100, got %d", od.MaxEjectionPercent)
	}
	if od.DecayInterval < 0 {
		add("outlier.decay_interval", "must not be negative")
	}

	pk := o.Picking
	switch pk.Strategy {
	case "", StrategyLeastInFlight:
	case StrategyLoadAware:
		if o.Load == nil {
			add("picking.strategy", "%s needs a load source (model-server metrics)", StrategyLoadAware)
		}
	default:
		add("picking.strategy", "must be %q or %q, got %q", StrategyLeastInFlight, StrategyLoadAware, pk.Strategy)
	}
	for _, w := range []struct {
		field string
		v     float64
	}{
		{"picking.inflight_weight", pk.InFlightWeight}, {"picking.waiting_weight", pk.WaitingWeight},
		{"picking.kv_weight", pk.KVWeight}, {"picking.affinity_max_load", pk.AffinityMaxLoad},
	} {
		if math.IsNaN(w.v) || w.v < 0 || w.v > maxPickingWeight {
			add(w.field, "must be between 0 and %g, got %v", float64(maxPickingWeight), w.v)
		}
	}
	if pk.AffinityMinPrefix < 0 {
		add("picking.affinity_min_prefix", "must not be negative")
	}
	if !(pk.FlaggedWeight >= 0 && pk.FlaggedWeight <= 1) {
		add("picking.flagged_weight", "must be within 0..1 (0 means %v), got %v", DefaultFlaggedWeight, pk.FlaggedWeight)
	}

	if o.TLS.CAFile != "" {
		if _, _, err := loadCA(o.TLS.CAFile); err != nil {
			add("tls.ca_file", "%v", err)
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns o with every zero value that has a default filled in.
func (o Options) withDefaults() Options {
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.MaxIdleConnsPerHost == 0 {
		o.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if o.HealthCheck.Timeout == 0 {
		o.HealthCheck.Timeout = DefaultHealthTimeout
	}
	if o.HealthCheck.UnhealthyThreshold == 0 {
		o.HealthCheck.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
	if o.HealthCheck.HealthyThreshold == 0 {
		o.HealthCheck.HealthyThreshold = DefaultHealthyThreshold
	}
	if o.Outlier.BaseEjection == 0 {
		o.Outlier.BaseEjection = DefaultBaseEjection
	}
	if o.Outlier.MaxEjection == 0 {
		o.Outlier.MaxEjection = max(DefaultMaxEjection, o.Outlier.BaseEjection)
	}
	if o.Outlier.MaxEjectionPercent == 0 {
		o.Outlier.MaxEjectionPercent = DefaultMaxEjectionPercent
	}
	if o.Outlier.DecayInterval == 0 {
		o.Outlier.DecayInterval = DefaultDecayInterval
	}
	pk := &o.Picking
	if pk.Strategy == "" {
		pk.Strategy = StrategyLeastInFlight
		if o.Load != nil {
			pk.Strategy = StrategyLoadAware
		}
	}
	if pk.InFlightWeight == 0 && pk.WaitingWeight == 0 && pk.KVWeight == 0 {
		pk.InFlightWeight, pk.WaitingWeight, pk.KVWeight = DefaultInFlightWeight, DefaultWaitingWeight, DefaultKVWeight
	}
	if pk.AffinityMaxLoad == 0 {
		pk.AffinityMaxLoad = DefaultAffinityMaxLoad
	}
	if pk.AffinityMinPrefix == 0 {
		pk.AffinityMinPrefix = DefaultAffinityMinPrefix
	}
	if pk.LoadCache == 0 {
		pk.LoadCache = DefaultLoadCache
	}
	if pk.FlaggedWeight == 0 {
		pk.FlaggedWeight = DefaultFlaggedWeight
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// ParseEndpointURL parses an endpoint's base URL (or metrics URL): http or https, a host, an
// optional port and path, and no credentials, query or fragment.
func ParseEndpointURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("must not be empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "parse "))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("scheme must be http or https")
	case u.Host == "" || u.Hostname() == "":
		return nil, errors.New("host must not be empty")
	case u.User != nil:
		return nil, errors.New("must not contain user info (credentials)")
	case u.RawQuery != "" || u.ForceQuery:
		return nil, errors.New("must not contain a query")
	case u.Fragment != "":
		return nil, errors.New("must not contain a fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("invalid port %q", p)
		}
	}
	return u, nil
}

// endpointKey identifies an endpoint across reloads: the URL with a trailing slash removed
// and the host lower-cased.
func endpointKey(u *url.URL) string {
	v := *u
	v.Host = strings.ToLower(v.Host)
	return strings.TrimSuffix(v.String(), "/")
}

func loadCA(file string) (*x509.CertPool, []byte, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("%s: no PEM certificates found", file)
	}
	return pool, pem, nil
}
