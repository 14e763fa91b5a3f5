package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
)

// Spec configures one policy: `{type, name, params}`. The YAML file and xDS
// (typed_per_filter_config) both produce Specs, so both load the same policies.
type Spec struct {
	Type   string         `yaml:"type" json:"type"`
	Name   string         `yaml:"name" json:"name,omitempty"`
	Params map[string]any `yaml:"params" json:"params,omitempty"`
}

// Env is what a factory gets besides its params.
type Env struct {
	Route  string // the route the policy belongs to ("" for a global one)
	Name   TypedName
	Clock  Clock
	Logger *slog.Logger
}

// TypedName is a built policy's type and name (its spec's name, else its type).
type TypedName struct{ Type, Name string }

// Named is what a policy embeds to be a Plugin (set it from Env.Named).
type Named struct{ id TypedName }

// TypedName is the policy's type and name.
func (n Named) TypedName() TypedName { return n.id }

// Named is the Named of the policy a factory builds.
func (e Env) Named() Named { return Named{e.Name} }

// Plugin is a built policy. What it does is discovered, not declared: the contracts it
// implements (Admitter, Observer) and the small interfaces the gateway looks for
// (PrioritySetter, LoadAware, ClusterUser, io.Closer; the send step's batcher, the admin
// API's Viewer and Resetter, the MetricsReporter), as grpc-go's balancers and GAIE's plugins
// are.
type Plugin interface {
	TypedName() TypedName
}

// PrioritySetter is a plugin that orders tenants by priority (configured on tenants[]).
type PrioritySetter interface {
	SetPriorities(byTenant map[string]int)
}

// LoadSource gives the model servers' own signals for a cluster: requests waiting in the
// server's queue and KV-cache use (0–1), aggregated over its endpoints; fresh is false when
// there is no recent scrape (the signals are then ignored). It may be called with a policy's
// lock held, and must not block.
type LoadSource interface {
	ClusterLoad(cluster string) (waiting, kvUsage float64, fresh bool)
}

// LoadFunc adapts a function to a LoadSource.
type LoadFunc func(cluster string) (waiting, kvUsage float64, fresh bool)

// ClusterLoad calls f.
func (f LoadFunc) ClusterLoad(cluster string) (float64, float64, bool) { return f(cluster) }

// LoadAware is a plugin that reads the clusters' load.
type LoadAware interface {
	SetLoadSource(LoadSource)
}

// ClusterUser is a plugin that names clusters in its params (by the param's path): the gateway
// checks them against the config's.
type ClusterUser interface {
	Clusters() map[string]string
}

// Viewer is a plugin with an admin view: GET /admin/policies shows every plugin of the
// serving generation with its view (a JSON-encodable value, bounded by the config).
type Viewer interface {
	AdminView() any
}

// Resetter is a plugin that holds state per tenant an operator may drop from the admin API
// (the guard's tenant breakers: POST /admin/breakers/reset). ResetTenant drops the tenant's
// ("": every tenant's) and returns how many entries it dropped.
type Resetter interface {
	ResetTenant(tenant string) int
}

// MetricsReporter is a plugin that exports metrics of its own. ReportMetrics is called at
// each scrape and emits the plugin's current values; the gateway adds the plugin's route and
// name as the labels route and policy. Names are Prometheus names (sluice_<type>_…, counters
// ending in _total); label values must be bounded by the config (tenants, the route's
// models), never taken from a request as they are. It must not block. The package
// metricstest checks a reporter against this contract.
type MetricsReporter interface {
	ReportMetrics(emit func(Sample))
}

// SampleKind is the kind of a Sample.
type SampleKind int

// The kinds of samples.
const (
	Counter SampleKind = iota
	Gauge
	Histogram
)

// Sample is one value a plugin exports.
type Sample struct {
	Name   string
	Help   string
	Kind   SampleKind
	Labels [][2]string // extra labels, name and value, the same names for every sample of Name
	Value  float64     // a counter's or gauge's value
	// A histogram's buckets: upper bounds (ascending, +Inf implied), the count in each
	// bucket (not cumulative; one more for +Inf may be given), the total count and sum.
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64
}

// Factory builds a policy from its params. A factory validates its params whole and returns
// every problem at once.
type Factory func(params json.RawMessage, env Env) (Plugin, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Factory{}
)

// Register makes a policy type available to configs. Policy packages call it from init.
func Register(typ string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[typ]; dup {
		panic("policy: type " + typ + " registered twice")
	}
	registry[typ] = f
}

// Types lists the registered policy types.
func Types() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Build builds a policy from its Spec.
func Build(s Spec, env Env) (Plugin, error) {
	registryMu.RLock()
	f := registry[s.Type]
	registryMu.RUnlock()
	if f == nil {
		return nil, fmt.Errorf("unknown policy type %q (known: %v)", s.Type, Types())
	}
	raw, err := json.Marshal(s.Params)
	if err != nil {
		return nil, fmt.Errorf("params: %w", err)
	}
	if env.Clock == nil {
		env.Clock = SystemClock{}
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	env.Name = TypedName{Type: s.Type, Name: s.Name}
	if env.Name.Name == "" {
		env.Name.Name = s.Type
	}
	return f(raw, env)
}

// DecodeParams decodes params strictly (unknown fields are errors) into v. Factories use it.
func DecodeParams(params json.RawMessage, v any) error {
	if len(params) == 0 || string(params) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("params: %w", err)
	}
	return nil
}
