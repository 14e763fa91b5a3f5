package runaway

import (
	"slices"

	"github.com/sluicegw/sluice/policy"
)

// Actions: what the policy does with a loop it found.
const (
	// ActionCut ends the stream at once with a clean finish (finish_reason "length", an SSE
	// comment, the end marker; a Responses stream's response.incomplete), and the gateway
	// cancels the upstream request, so the model server frees the sequence. The default: an
	// operator adds the policy to free the GPU.
	ActionCut = "cut"
	// ActionFlag lets the answer run and counts it: the Outcome's Flags carry
	// runaway_generation (the tenant's breaker counts it), the metrics and the admin view
	// too. To measure before cutting.
	ActionFlag = "flag"
)

// Fields the policy can watch.
const (
	// FieldText: what the model writes, content, reasoning and refusal together (one text
	// per choice, in the order it streams).
	FieldText = "text"
	// FieldArguments: the arguments of the choice's tool calls (one text per choice, the
	// calls one after the other).
	FieldArguments = "arguments"
)

// Params configure the runaway policy (the `params` of a `{type: runaway}` policy). A zero
// field takes its default.
type Params struct {
	// Action is "cut" (default) or "flag".
	Action string `json:"action,omitempty"`
	// MinPeriod is the shortest repeated block, in tokens (default 1: a token repeated).
	MinPeriod int `json:"min_period,omitempty"`
	// MaxPeriod is the longest repeated block, in tokens (default 256, about a paragraph of
	// 180 words; at most 4096). It sets the detector's memory: about 16 bytes a token of
	// max_period per watched text, 4 KiB at the default, 64 KiB at 4096.
	MaxPeriod int `json:"max_period,omitempty"`
	// Repeats is how many times the block must have been generated, its first copy included
	// (default 3, at least 2).
	Repeats int `json:"repeats,omitempty"`
	// MinWords is how long the repetition must run, in words, a number, punctuation mark or
	// line break counting a quarter (default 96; at least 8). A repetition whose copies differ
	// in a number (a counter) must run twice as long.
	MinWords int `json:"min_words,omitempty"`
	// Counters lets a number change from copy to copy ("Step 7: … Step 8: …"): default true.
	// False counts only exact copies.
	Counters *bool `json:"counters,omitempty"`
	// Fields are the texts watched: "text" (content, reasoning, refusal) and "arguments"
	// (tool calls); default both.
	Fields []string `json:"fields,omitempty"`
	// MaxChoices bounds the choices watched in a stream with n > 1 (default 8, at most 64):
	// choices with a higher index are not watched.
	MaxChoices int `json:"max_choices,omitempty"`
}

// The defaults.
const (
	DefaultMinPeriod  = 1
	DefaultMaxPeriod  = 256
	DefaultRepeats    = 3
	DefaultMinWords   = 96
	DefaultMaxChoices = 8
	maxMaxPeriod      = 4096
	maxMaxChoices     = 64
)

// WithDefaults fills the zero fields with their defaults.
func (p Params) WithDefaults() Params {
	if p.Action == "" {
		p.Action = ActionCut
	}
	if p.MinPeriod == 0 {
		p.MinPeriod = DefaultMinPeriod
	}
	if p.MaxPeriod == 0 {
		p.MaxPeriod = max(DefaultMaxPeriod, p.MinPeriod)
	}
	if p.Repeats == 0 {
		p.Repeats = DefaultRepeats
	}
	if p.MinWords == 0 {
		p.MinWords = DefaultMinWords
	}
	if p.Counters == nil {
		on := true
		p.Counters = &on
	}
	if len(p.Fields) == 0 {
		p.Fields = []string{FieldText, FieldArguments}
	}
	if p.MaxChoices == 0 {
		p.MaxChoices = DefaultMaxChoices
	}
	return p
}

// Validate reports every problem of p at once.
func (p Params) Validate() error {
	var c policy.Check
	switch p.Action {
	case "", ActionCut, ActionFlag:
	default:
		c.Add("action must be %q or %q, got %q", ActionCut, ActionFlag, p.Action)
	}
	if p.MinPeriod < 0 || p.MinPeriod > maxMaxPeriod {
		c.Add("min_period must be in [1, %d], got %d", maxMaxPeriod, p.MinPeriod)
	}
	if p.MaxPeriod < 0 || p.MaxPeriod > maxMaxPeriod {
		c.Add("max_period must be in [1, %d], got %d", maxMaxPeriod, p.MaxPeriod)
	}
	if q := p.WithDefaults(); p.MaxPeriod > 0 && q.MinPeriod > q.MaxPeriod {
		c.Add("min_period %d is above max_period %d", q.MinPeriod, q.MaxPeriod)
	}
	if p.Repeats < 0 || p.Repeats == 1 || p.Repeats > 1000 {
		c.Add("repeats must be in [2, 1000], got %d", p.Repeats)
	}
	if p.MinWords < 0 || (p.MinWords > 0 && p.MinWords < 8) || p.MinWords > 1<<20 {
		c.Add("min_words must be in [8, %d], got %d", 1<<20, p.MinWords)
	}
	for i, f := range p.Fields {
		switch {
		case f != FieldText && f != FieldArguments:
			c.Add("fields[%d] must be %q or %q, got %q", i, FieldText, FieldArguments, f)
		case slices.Index(p.Fields, f) < i:
			c.Add("fields[%d]: %q is listed twice", i, f)
		}
	}
	if p.MaxChoices < 0 || p.MaxChoices > maxMaxChoices {
		c.Add("max_choices must be in [1, %d], got %d", maxMaxChoices, p.MaxChoices)
	}
	return c.Err()
}

// thresholds are the detector's thresholds of p (with defaults).
func (p Params) thresholds() Thresholds {
	return Thresholds{MinPeriod: p.MinPeriod, MaxPeriod: p.MaxPeriod, Repeats: p.Repeats, MinWords: p.MinWords, Counters: *p.Counters}
}
