package concurrency

import (
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Params configure a Limiter (the `params` of a `{type: concurrency}` policy). A zero field
// takes its default (see Defaults).
type Params struct {
	// Adaptive turns the gradient controller on (default true). Off, the limit is max_limit.
	Adaptive *bool `json:"adaptive,omitempty"`
	// MinLimit is the lowest the limit goes (default 4).
	MinLimit int `json:"min_limit,omitempty"`
	// MaxLimit is the highest the limit goes (default 256). Max is its short alias (DESIGN.md's
	// `{adaptive: true, max: 256}`); set one of them.
	MaxLimit int `json:"max_limit,omitempty"`
	Max      int `json:"max,omitempty"`
	// InitialLimit is the limit before the first update (default 16, clamped to the bounds).
	InitialLimit int `json:"initial_limit,omitempty"`
	// SampleWindow is the short window whose percentile is the sample (default 1s). A window
	// closes at the first settlement after it has lasted this long and holds MinSamples.
	SampleWindow policy.Duration `json:"sample_window,omitempty"`
	// MinSamples is the settlements a window needs before it updates the limit (default 10).
	MinSamples int `json:"min_samples,omitempty"`
	// Percentile of a window's TTFT and TPOT samples taken as the sample, in (0, 1] (default 0.9).
	Percentile float64 `json:"percentile,omitempty"`
	// MinRTT is the long window of the baseline: the baseline is the minimum of the window
	// samples of the last min_rtt (default 30s), so it follows a lasting change in a minute.
	MinRTT policy.Duration `json:"min_rtt,omitempty"`
	// Tolerance: a sample up to baseline × (1 + tolerance) is not congestion (default 0.5).
	Tolerance float64 `json:"tolerance,omitempty"`
	// TargetTTFT and TargetTPOT, when set, cap the reference: a sample above the target is
	// congestion whatever the baseline (0: off).
	TargetTTFT policy.Duration `json:"target_ttft,omitempty"`
	TargetTPOT policy.Duration `json:"target_tpot,omitempty"`
	// MinGradient and MaxGradient clamp the gradient (defaults 0.5 and 1.0; max at most 2).
	MinGradient float64 `json:"min_gradient,omitempty"`
	MaxGradient float64 `json:"max_gradient,omitempty"`
	// Smoothing is the weight of the new limit against the old one, in (0, 1] (default 0.2).
	Smoothing float64 `json:"smoothing,omitempty"`
	// Headroom is added to the limit in a window without congestion (default 0: √limit).
	Headroom float64 `json:"headroom,omitempty"`
	// KVHigh: fresh KV-cache use above this is pressure (default 0.9, in (0, 1]).
	KVHigh float64 `json:"kv_high,omitempty"`
	// MaxQueue bounds the requests waiting for a slot (default 128; -1: no queue, reject at once).
	MaxQueue int `json:"max_queue,omitempty"`
	// MaxWait bounds a request's wait when its context has no earlier deadline (default 5s).
	MaxWait policy.Duration `json:"max_wait,omitempty"`
	// TrustPriorityHeader lets x-sluice-priority (an integer) set a request's priority,
	// overriding its tenant's (default false: a client could raise its own priority).
	TrustPriorityHeader bool `json:"trust_priority_header,omitempty"`
}

// PriorityHeader is the request header read when trust_priority_header is on.
const PriorityHeader = "X-Sluice-Priority"

// Defaults returns the params with every default filled in.
func Defaults() Params { return Params{}.WithDefaults() }

// WithDefaults returns p with its zero fields set to their defaults.
func (p Params) WithDefaults() Params {
	if p.Adaptive == nil {
		t := true
		p.Adaptive = &t
	}
	if p.MaxLimit == 0 {
		p.MaxLimit = p.Max
	}
	p.Max = 0
	policy.Default(&p.MinLimit, 4)
	policy.Default(&p.MaxLimit, 256)
	policy.Default(&p.InitialLimit, 16)
	p.InitialLimit = min(max(p.InitialLimit, p.MinLimit), p.MaxLimit)
	policy.Default(&p.SampleWindow, policy.Duration(time.Second))
	policy.Default(&p.MinSamples, 10)
	policy.Default(&p.Percentile, 0.9)
	policy.Default(&p.MinRTT, policy.Duration(30*time.Second))
	policy.Default(&p.Tolerance, 0.5)
	policy.Default(&p.MinGradient, 0.5)
	policy.Default(&p.MaxGradient, 1)
	policy.Default(&p.Smoothing, 0.2)
	policy.Default(&p.KVHigh, 0.9)
	policy.Default(&p.MaxQueue, 128)
	if p.MaxQueue < 0 {
		p.MaxQueue = 0
	}
	policy.Default(&p.MaxWait, policy.Duration(5*time.Second))
	return p
}

// Validate checks the params as given (zero fields mean their defaults) and returns every
// problem, joined.
func (p Params) Validate() error {
	var c policy.Check
	c.NonNegative("min_limit", p.MinLimit)
	c.NonNegative("max_limit", p.MaxLimit)
	c.NonNegative("max", p.Max)
	if p.Max != 0 && p.MaxLimit != 0 && p.Max != p.MaxLimit {
		c.Add("set max_limit or its alias max, not both (%d and %d)", p.MaxLimit, p.Max)
	}
	c.NonNegative("initial_limit", p.InitialLimit)
	if q := p.WithDefaults(); p.MinLimit >= 0 && p.MaxLimit >= 0 && p.Max >= 0 && q.MinLimit > q.MaxLimit {
		c.Add("min_limit (%d) must not exceed max_limit (%d)", q.MinLimit, q.MaxLimit)
	}
	c.NonNegativeDuration("sample_window", p.SampleWindow)
	c.NonNegative("min_samples", p.MinSamples)
	if p.Percentile < 0 || p.Percentile > 1 {
		c.Add("percentile must be in (0, 1], got %g", p.Percentile)
	}
	c.NonNegativeDuration("min_rtt", p.MinRTT)
	if q := p.WithDefaults(); p.MinRTT >= 0 && p.SampleWindow >= 0 && q.MinRTT < q.SampleWindow {
		c.Add("min_rtt (%s) must be at least sample_window (%s)", q.MinRTT.D(), q.SampleWindow.D())
	}
	if p.Tolerance < 0 || p.Tolerance > 10 {
		c.Add("tolerance must be in [0, 10], got %g", p.Tolerance)
	}
	c.NonNegativeDuration("target_ttft", p.TargetTTFT)
	c.NonNegativeDuration("target_tpot", p.TargetTPOT)
	if p.MinGradient < 0 || p.MinGradient >= 1 {
		c.Add("min_gradient must be in (0, 1), got %g", p.MinGradient)
	}
	if p.MaxGradient < 0 || (p.MaxGradient > 0 && (p.MaxGradient < 1 || p.MaxGradient > 2)) {
		c.Add("max_gradient must be in [1, 2], got %g", p.MaxGradient)
	}
	if p.Smoothing < 0 || p.Smoothing > 1 {
		c.Add("smoothing must be in (0, 1], got %g", p.Smoothing)
	}
	if p.Headroom < 0 {
		c.Add("headroom must not be negative, got %g", p.Headroom)
	}
	if p.KVHigh < 0 || p.KVHigh > 1 {
		c.Add("kv_high must be in (0, 1], got %g", p.KVHigh)
	}
	if p.MaxQueue < -1 {
		c.Add("max_queue must be -1 (no queue) or more, got %d", p.MaxQueue)
	}
	c.NonNegativeDuration("max_wait", p.MaxWait)
	return c.Err()
}
