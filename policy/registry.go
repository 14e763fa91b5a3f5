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
	Clock  Clock
	Logger *slog.Logger
}

// Factory builds a policy from its params. The result implements Admitter, Observer, or both.
// A factory validates its params whole and returns every problem at once.
type Factory func(params json.RawMessage, env Env) (any, error)

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
func Build(s Spec, env Env) (any, error) {
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
	p, err := f(raw, env)
	if err != nil {
		return nil, err
	}
	_, isA := p.(Admitter)
	_, isO := p.(Observer)
	if !isA && !isO {
		return nil, fmt.Errorf("policy type %q built a %T, which is neither an Admitter nor an Observer", s.Type, p)
	}
	return p, nil
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
