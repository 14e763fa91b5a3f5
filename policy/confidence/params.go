package confidence

import (
	"math"
	"strings"

	"github.com/sluicegw/sluice/policy"
)

// Defaults.
const (
	DefaultTopLogprobs = 5
	DefaultHighEntropy = 1.0 // nats: above it a token is unsure (top-5 entropy is at most ln 5 ≈ 1.61)
	DefaultLowMargin   = 0.1 // below it a token is unsure
	DefaultSpanTokens  = 8
	DefaultMaxModels   = 8

	// MaxTopLogprobs is the most alternatives a policy may ask for (vLLM's default
	// max_logprobs, OpenAI's limit).
	MaxTopLogprobs = 20
	// MaxModelsLimit bounds max_models and the models list.
	MaxModelsLimit = 64
	// maxModelName bounds a model name that may get a series of its own.
	maxModelName = 128
)

// Params configures a confidence policy (`{type: confidence, params: {...}}`). Zero values
// take the defaults (WithDefaults).
type Params struct {
	// Sample is the share of streamed chat and completions requests that did not ask for
	// logprobs for which the upstream is asked for them (chat: logprobs true and
	// top_logprobs; completions: logprobs), and the stream's chunks stripped of them before
	// the client sees them. 0 (the default) asks for none: only answers whose client asked
	// are read. The choice is a hash of the request id, so it is the same for every attempt.
	Sample float64 `json:"sample,omitempty"`
	// TopLogprobs is the number of alternatives asked per token (default 5, 2..20): entropy
	// and margin need two at least; more cost the model server more (vLLM computes them on
	// the GPU, and they multiply the answer's bytes).
	TopLogprobs int `json:"top_logprobs,omitempty"`
	// HighEntropy: a token whose entropy (nats, over its alternatives) is above it is unsure
	// (default 1.0).
	HighEntropy float64 `json:"high_entropy,omitempty"`
	// LowMargin: a token whose top-1/top-2 probability margin is below it is unsure (default
	// 0.1).
	LowMargin float64 `json:"low_margin,omitempty"`
	// SpanTokens: a run of at least this many unsure tokens in a row is a low-confidence
	// span, counted and listed (default 8).
	SpanTokens int `json:"span_tokens,omitempty"`
	// Models names the models that get their own series (exact names or globs, the first
	// that matches names the series); any other model counts under "other". Without it the
	// first max_models model names seen get their own series, and later ones "other".
	Models []string `json:"models,omitempty"`
	// MaxModels bounds the series per route when Models is not given (default 8, at most 64).
	MaxModels int `json:"max_models,omitempty"`
}

// WithDefaults returns p with zero values replaced by the defaults.
func (p Params) WithDefaults() Params {
	policy.Default(&p.TopLogprobs, DefaultTopLogprobs)
	policy.Default(&p.HighEntropy, DefaultHighEntropy)
	policy.Default(&p.LowMargin, DefaultLowMargin)
	policy.Default(&p.SpanTokens, DefaultSpanTokens)
	policy.Default(&p.MaxModels, DefaultMaxModels)
	return p
}

// Validate checks p (before or after defaults) and returns every problem, joined, or nil.
func (p Params) Validate() error {
	var c policy.Check
	if math.IsNaN(p.Sample) || p.Sample < 0 || p.Sample > 1 {
		c.Add("sample: %v is not within [0, 1]", p.Sample)
	}
	if p.TopLogprobs != 0 && (p.TopLogprobs < 2 || p.TopLogprobs > MaxTopLogprobs) {
		c.Add("top_logprobs: %d is not within 2..%d (entropy and margin need two alternatives)", p.TopLogprobs, MaxTopLogprobs)
	}
	if math.IsNaN(p.HighEntropy) || p.HighEntropy < 0 || p.HighEntropy > 10 {
		c.Add("high_entropy: %v is not within (0, 10] nats", p.HighEntropy)
	}
	if math.IsNaN(p.LowMargin) || p.LowMargin < 0 || p.LowMargin > 1 {
		c.Add("low_margin: %v is not within (0, 1]", p.LowMargin)
	}
	if p.SpanTokens < 0 || p.SpanTokens > 1<<16 {
		c.Add("span_tokens: %d is not within 1..65536", p.SpanTokens)
	}
	if p.MaxModels < 0 || p.MaxModels > MaxModelsLimit {
		c.Add("max_models: %d is not within 1..%d", p.MaxModels, MaxModelsLimit)
	}
	if len(p.Models) > MaxModelsLimit {
		c.Add("models: %d names, at most %d", len(p.Models), MaxModelsLimit)
	}
	for i, m := range p.Models {
		switch {
		case m == "" || len(m) > maxModelName:
			c.Add("models[%d]: a model name or glob of 1 to %d bytes, got %d", i, maxModelName, len(m))
		case m == OtherModel:
			c.Add("models[%d]: %q names the series of every other model", i, m)
		case strings.ContainsFunc(m, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			c.Add("models[%d]: control characters in %q", i, m)
		}
	}
	return c.Err()
}
