package batch

import (
	"encoding/json"
	"math"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Type is the policy type name of the batcher in configs ({type: batch, params: {...}}).
const Type = "batch"

// Defaults applied to zero-valued Params fields.
const (
	DefaultMinWindow        = policy.Duration(500 * time.Microsecond)
	DefaultMaxWindow        = policy.Duration(20 * time.Millisecond)
	DefaultTargetLatency    = policy.Duration(200 * time.Millisecond)
	DefaultIncrease         = policy.Duration(500 * time.Microsecond)
	DefaultDecrease         = 0.5
	DefaultMaxItems         = 256
	DefaultMaxTokens        = 32768
	DefaultBackendMaxInputs = 2048 // OpenAI's own per-request input limit
	DefaultMaxInFlight      = 4
)

// Params configure a Batcher. Zero values take the defaults above.
type Params struct {
	// Window bounds: how long the first request of a batch waits for others. The window
	// starts at InitialWindow (default: MinWindow) and adapts within [MinWindow, MaxWindow].
	MinWindow     policy.Duration `json:"min_window" yaml:"min_window"`
	MaxWindow     policy.Duration `json:"max_window" yaml:"max_window"`
	InitialWindow policy.Duration `json:"initial_window" yaml:"initial_window"`
	// TargetLatency is the batch latency (the upstream send, answer included) under which the
	// window grows by Increase; above it the window is multiplied by Decrease (0 < d < 1).
	TargetLatency policy.Duration `json:"target_latency" yaml:"target_latency"`
	Increase      policy.Duration `json:"increase" yaml:"increase"`
	Decrease      float64         `json:"decrease" yaml:"decrease"`
	// Caps per upstream request: inputs (MaxItems, and the backend's own limit
	// BackendMaxInputs) and estimated prompt tokens. A batch that reaches a cap is sent at
	// once; a request that alone exceeds one is sent alone, unchanged.
	MaxItems         int `json:"max_items" yaml:"max_items"`
	MaxTokens        int `json:"max_tokens" yaml:"max_tokens"`
	BackendMaxInputs int `json:"backend_max_inputs" yaml:"backend_max_inputs"`
	// MaxInFlight bounds the batches of one key in flight at once. A batch whose window ends
	// while MaxInFlight are in flight stays open (it keeps taking requests up to the caps) and
	// is sent when one of them is answered, so batches grow with the load instead of queueing
	// at the model server (self-clocking, as Clipper's per-replica batch queues).
	MaxInFlight int `json:"max_in_flight" yaml:"max_in_flight"`
	// MergeCompletions also merges /v1/completions requests with identical parameters and
	// stream false into one request with a prompt array (off by default).
	MergeCompletions bool `json:"merge_completions" yaml:"merge_completions"`
}

// WithDefaults returns p with the defaults applied to zero fields.
func (p Params) WithDefaults() Params {
	policy.Default(&p.MinWindow, DefaultMinWindow)
	policy.Default(&p.MaxWindow, max(DefaultMaxWindow, p.MinWindow))
	policy.Default(&p.InitialWindow, p.MinWindow)
	policy.Default(&p.TargetLatency, DefaultTargetLatency)
	policy.Default(&p.Increase, DefaultIncrease)
	policy.Default(&p.Decrease, DefaultDecrease)
	policy.Default(&p.MaxItems, DefaultMaxItems)
	policy.Default(&p.MaxTokens, DefaultMaxTokens)
	policy.Default(&p.BackendMaxInputs, DefaultBackendMaxInputs)
	policy.Default(&p.MaxInFlight, DefaultMaxInFlight)
	return p
}

// Validate reports every problem of p (defaults applied first) at once, or nil.
func (p Params) Validate() error {
	p = p.WithDefaults()
	var c policy.Check
	for _, d := range []struct {
		name string
		v    policy.Duration
	}{
		{"min_window", p.MinWindow}, {"max_window", p.MaxWindow}, {"initial_window", p.InitialWindow},
		{"target_latency", p.TargetLatency}, {"increase", p.Increase},
	} {
		if d.v < 0 {
			c.Add("%s: must be > 0, got %v", d.name, d.v.D())
		}
	}
	if p.MaxWindow > policy.Duration(time.Second) {
		c.Add("max_window: at most 1s (a batching window is a few milliseconds), got %v", p.MaxWindow.D())
	}
	if p.MinWindow > p.MaxWindow {
		c.Add("min_window (%v): must be <= max_window (%v)", p.MinWindow.D(), p.MaxWindow.D())
	}
	if p.InitialWindow < p.MinWindow || p.InitialWindow > p.MaxWindow {
		c.Add("initial_window (%v): must be within [min_window, max_window] = [%v, %v]", p.InitialWindow.D(), p.MinWindow.D(), p.MaxWindow.D())
	}
	if math.IsNaN(p.Decrease) || p.Decrease <= 0 || p.Decrease >= 1 {
		c.Add("decrease: must be within (0, 1), got %v", p.Decrease)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"max_items", p.MaxItems}, {"max_tokens", p.MaxTokens}, {"backend_max_inputs", p.BackendMaxInputs}, {"max_in_flight", p.MaxInFlight}} {
		if n.v < 0 {
			c.Add("%s: must be > 0, got %d", n.name, n.v)
		}
	}
	return c.Err()
}

func init() { policy.Register(Type, factory) }

func factory(params json.RawMessage, env policy.Env) (policy.Plugin, error) {
	return FromSpec(params, env)
}

// FromSpec builds a Batcher from the params of a {type: batch} policy spec (strict: unknown
// fields are errors; every problem is reported). It is registered as the policy type batch:
// not an Admitter or an Observer, it sits at the send step, where the gateway finds it by what
// it offers (Batchable, Do).
func FromSpec(params json.RawMessage, env policy.Env) (*Batcher, error) {
	var p Params
	if err := policy.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	b, err := New(p, env.Clock)
	if err != nil {
		return nil, err
	}
	b.Named = env.Named()
	return b, nil
}
