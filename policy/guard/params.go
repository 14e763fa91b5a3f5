package guard

import (
	"slices"
	"sort"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Params configure a Guard (the `params` of a `{type: guard}` policy). A zero field takes its
// default (see Defaults); a size or shape limit whose default is 0 is off. Signals that are
// on by default are turned off by naming them in Disable.
type Params struct {
	// MaxPromptTokens is the absolute limit on prompt tokens (0: off).
	MaxPromptTokens int `json:"max_prompt_tokens,omitempty"`
	// ContextWindow is the context window of every model of the route (0: from
	// ContextWindows, else from the built-in table of well-known models, else unknown).
	// Prompt tokens + max_tokens must fit (only the prompt when max_tokens is absent).
	ContextWindow int `json:"context_window,omitempty"`
	// ContextWindows gives context windows per model glob ('*', '?', case-insensitive; the
	// longest matching glob wins; 0 means unknown: no check). They take precedence over
	// ContextWindow and the built-in table.
	ContextWindows map[string]int `json:"context_windows,omitempty"`
	// MaxDepth is the limit on the structural depth of message content, JSON embedded in
	// prose, code fences and tool results included (openai.Request.Depth; default 64).
	// Ordinary traffic stays far below it: real API responses pasted as tool results
	// (Kubernetes objects, OpenAPI documents, cloud APIs' answers) are 8 to 20 deep, code
	// and prose a handful; what is deeper is built to be, and the JSON parsers behind model
	// servers and tool frameworks give up not far above (serde_json at 128 levels, jiter,
	// pydantic's, at 200); .NET's System.Text.Json stops at 64 by default too.
	MaxDepth int `json:"max_depth,omitempty"`
	// MaxMessages is the limit on the number of chat messages (0: off).
	MaxMessages int `json:"max_messages,omitempty"`
	// MaxRepetition is the limit on the share of duplicated word n-grams, in (0, 1] (0: off).
	MaxRepetition float64 `json:"max_repetition,omitempty"`
	// RepetitionNgram is n, the words an n-gram (default 8, at most 64).
	RepetitionNgram int `json:"repetition_ngram,omitempty"`
	// RepetitionMinWords: prompts with fewer words are not measured (default 200).
	RepetitionMinWords int `json:"repetition_min_words,omitempty"`
	// RepetitionSampleBytes bounds the bytes read to measure repetition (default 32768).
	RepetitionSampleBytes int `json:"repetition_sample_bytes,omitempty"`
	// SurgeFactor is K: a prompt over K × the rolling p95 of its sender's recent prompts on
	// the route is a surge (default 3), unless it is within SurgeFloorTokens.
	SurgeFactor float64 `json:"surge_factor,omitempty"`
	// SurgeFloorTokens: a prompt of at most this many tokens is never a surge, whatever the
	// baseline (default 32768; 1 for no floor). It is what a flood of tiny prompts can lower
	// a baseline's limit to at worst, and it is above ordinary prompts: chat turns of
	// hundreds to a few thousand tokens, RAG prompts of 4k to 16k, agent turns of 10k to 30k.
	SurgeFloorTokens int `json:"surge_floor_tokens,omitempty"`
	// SurgeWindow is the length of the rolling window (default 5m).
	SurgeWindow policy.Duration `json:"surge_window,omitempty"`
	// SurgeBuckets is the number of buckets of the window (default 10).
	SurgeBuckets int `json:"surge_buckets,omitempty"`
	// SurgeMinRequests is the warm-up: the surge signal applies to a sender once its
	// baseline holds this many prompts (default 100).
	SurgeMinRequests int `json:"surge_min_requests,omitempty"`
	// SurgeMaxBaselines bounds the baselines kept, one per (route, tenant or client), about
	// 5.6 KiB each (default 1000); past it the least recently used one is dropped (its
	// sender starts a new warm-up).
	SurgeMaxBaselines int `json:"surge_max_baselines,omitempty"`
	// ExactMargin m: when the estimate is between (1-m) × and 1/(1-m) × a size limit, the
	// prompt is counted exactly with the model's tokenizer (default 0.35: 0.65× to 1.54×,
	// which covers the estimate's measured error, 0.69× for digits to 1.31× for English prose
	// and JSON against cl100k_base). At most 0.9.
	ExactMargin float64 `json:"exact_margin,omitempty"`
	// ExactConcurrency bounds the exact counts running at once; when all are busy the
	// estimate (which errs high) decides (default 2).
	ExactConcurrency int `json:"exact_concurrency,omitempty"`
	// Encodings gives the tiktoken encoding per model glob (default: o200k_base for gpt-4o*,
	// gpt-4.1*, gpt-5*, o1*, o3*, o4*, gpt-oss*; cl100k_base otherwise).
	Encodings map[string]string `json:"encodings,omitempty"`
	// Disable turns signals off by name: max_prompt_tokens, context_window, max_depth,
	// max_messages, repetition, surge, breaker.
	Disable []string `json:"disable,omitempty"`
	// Breaker configures the per-(route, tenant) breakers.
	Breaker BreakerParams `json:"breaker"`
	// Degrade configures staged degradation (off unless trips_per_minute or
	// saturation_inflight is set).
	Degrade DegradeParams `json:"degrade"`
}

// BreakerParams configure the per-(route, tenant) breakers.
type BreakerParams struct {
	// Anonymous says which breaker a request without a tenant gets: "auto" (the default):
	// one per client address when the gateway knows the address names one client
	// (policy.Request.ClientKnown: trusted_proxies is configured), else none; "client": one
	// per client address always, for clients known to connect directly (no load balancer,
	// sidecar or NAT in front); "off": none. Without a breaker, each bad request is still
	// refused on its own; a breaker shared by every client behind one address would let one
	// of them cut off the rest.
	Anonymous string `json:"anonymous,omitempty"`
	// Window is the rolling window of the counts (default 60s).
	Window policy.Duration `json:"window,omitempty"`
	// Buckets splits the window (default 10); BucketPeriod, when set, is used instead.
	Buckets      int             `json:"buckets,omitempty"`
	BucketPeriod policy.Duration `json:"bucket_period,omitempty"`
	// MinRequests: a breaker trips only once this many requests are counted in the window
	// (default 5).
	MinRequests int `json:"min_requests,omitempty"`
	// FailureRatio: it trips when explosions/counted requests reach this, in (0, 1]
	// (default 0.5).
	FailureRatio float64 `json:"failure_ratio,omitempty"`
	// OpenFor is how long it stays open before letting probes through (default 30s).
	OpenFor policy.Duration `json:"open_for,omitempty"`
	// HalfOpenProbes is how many requests a half-open breaker lets through; that many
	// successes close it, one explosion opens it again (default 3).
	HalfOpenProbes int `json:"half_open_probes,omitempty"`
	// MaxBreakers bounds the breakers kept (default 10000); past it the least recently used
	// closed breaker is dropped.
	MaxBreakers int `json:"max_breakers,omitempty"`
}

// DegradeParams configure staged degradation of the route.
type DegradeParams struct {
	// TripsPerMinute: level 1 when the route's breakers open more than this many times in a
	// minute (0: level 1 off).
	TripsPerMinute int `json:"trips_per_minute,omitempty"`
	// Level1MaxTokens caps max_tokens at level 1 and above (0: no cap).
	Level1MaxTokens int `json:"level1_max_tokens,omitempty"`
	// LongContextCluster, when set, receives the prompts that fail a size signal
	// (max_prompt_tokens, surge) at level 1 and above, instead of a rejection.
	LongContextCluster string `json:"long_context_cluster,omitempty"`
	// Level1SurgeFactor is the surge factor at level 1 and above (default 2; at least 1).
	Level1SurgeFactor float64 `json:"level1_surge_factor,omitempty"`
	// SaturationInflight: level 2 when more than this many requests admitted by this guard
	// are in flight (0: level 2 off).
	SaturationInflight int `json:"saturation_inflight,omitempty"`
	// ShedBelowPriority: at level 2, tenants whose priority is below this are rejected
	// (default 1; tenants without a priority have 0).
	ShedBelowPriority int `json:"shed_below_priority,omitempty"`
	// CoolDown: a level steps down one level after its condition has been false this long
	// (default 2m).
	CoolDown policy.Duration `json:"cool_down,omitempty"`
}

// Signal names, as used in Disable.
const (
	SignalPromptTokens  = "max_prompt_tokens"
	SignalContextWindow = "context_window"
	SignalDepth         = "max_depth"
	SignalMessages      = "max_messages"
	SignalRepetition    = "repetition"
	SignalSurge         = "surge"
	SignalBreaker       = "breaker"
)

// Breaker.Anonymous modes.
const (
	AnonymousAuto   = "auto"
	AnonymousClient = "client"
	AnonymousOff    = "off"
)

var signals = []string{SignalPromptTokens, SignalContextWindow, SignalDepth, SignalMessages,
	SignalRepetition, SignalSurge, SignalBreaker}

// Defaults returns the params with every default filled in.
func Defaults() Params { return Params{}.WithDefaults() }

// WithDefaults returns p with its zero fields set to their defaults.
func (p Params) WithDefaults() Params {
	policy.Default(&p.MaxDepth, 64)
	policy.Default(&p.RepetitionNgram, 8)
	policy.Default(&p.RepetitionMinWords, 200)
	policy.Default(&p.RepetitionSampleBytes, 32<<10)
	policy.Default(&p.SurgeFactor, 3)
	policy.Default(&p.SurgeFloorTokens, 32768)
	policy.Default(&p.SurgeMaxBaselines, 1000)
	policy.Default(&p.SurgeWindow, policy.Duration(5*time.Minute))
	policy.Default(&p.SurgeBuckets, 10)
	policy.Default(&p.SurgeMinRequests, 100)
	policy.Default(&p.ExactMargin, 0.35)
	policy.Default(&p.ExactConcurrency, 2)
	b := &p.Breaker
	policy.Default(&b.Anonymous, AnonymousAuto)
	policy.Default(&b.Window, policy.Duration(time.Minute))
	policy.Default(&b.Buckets, 10)
	policy.Default(&b.MinRequests, 5)
	policy.Default(&b.FailureRatio, 0.5)
	policy.Default(&b.OpenFor, policy.Duration(30*time.Second))
	policy.Default(&b.HalfOpenProbes, 3)
	policy.Default(&b.MaxBreakers, 10000)
	d := &p.Degrade
	policy.Default(&d.Level1SurgeFactor, 2)
	policy.Default(&d.ShedBelowPriority, 1)
	policy.Default(&d.CoolDown, policy.Duration(2*time.Minute))
	return p
}

// Validate checks the params as given (zero fields mean their defaults) and returns every
// problem, joined.
func (p Params) Validate() error {
	var c policy.Check
	c.NonNegative("max_prompt_tokens", p.MaxPromptTokens)
	c.NonNegative("context_window", p.ContextWindow)
	for _, g := range sortedKeys(p.ContextWindows) {
		if g == "" {
			c.Add("context_windows: empty model pattern")
		}
		if v := p.ContextWindows[g]; v < 0 {
			c.Add("context_windows[%q] must not be negative, got %d", g, v)
		}
	}
	c.NonNegative("max_depth", p.MaxDepth)
	c.NonNegative("max_messages", p.MaxMessages)
	if p.MaxRepetition < 0 || p.MaxRepetition > 1 {
		c.Add("max_repetition must be in [0, 1], got %g", p.MaxRepetition)
	}
	if p.RepetitionNgram < 0 || p.RepetitionNgram > 64 {
		c.Add("repetition_ngram must be in [1, 64], got %d", p.RepetitionNgram)
	}
	c.NonNegative("repetition_min_words", p.RepetitionMinWords)
	if p.RepetitionSampleBytes < 0 || (p.RepetitionSampleBytes > 0 && p.RepetitionSampleBytes < 1024) {
		c.Add("repetition_sample_bytes must be at least 1024, got %d", p.RepetitionSampleBytes)
	}
	if p.SurgeFactor < 0 || (p.SurgeFactor > 0 && p.SurgeFactor < 1) {
		c.Add("surge_factor must be at least 1, got %g", p.SurgeFactor)
	}
	c.NonNegativeDuration("surge_window", p.SurgeWindow)
	c.NonNegative("surge_buckets", p.SurgeBuckets)
	c.NonNegative("surge_min_requests", p.SurgeMinRequests)
	c.NonNegative("surge_floor_tokens", p.SurgeFloorTokens)
	c.NonNegative("surge_max_baselines", p.SurgeMaxBaselines)
	if q := p.WithDefaults(); q.SurgeWindow > 0 && q.SurgeBuckets > 0 && q.SurgeWindow.D()/time.Duration(q.SurgeBuckets) < time.Millisecond {
		c.Add("surge_window / surge_buckets must be at least 1ms, got %s / %d", q.SurgeWindow.D(), q.SurgeBuckets)
	}
	if p.ExactMargin < 0 || p.ExactMargin > 0.9 {
		c.Add("exact_margin must be in [0, 0.9], got %g", p.ExactMargin)
	}
	c.NonNegative("exact_concurrency", p.ExactConcurrency)
	for _, g := range sortedKeys(p.Encodings) {
		if g == "" {
			c.Add("encodings: empty model pattern")
		}
		if e := p.Encodings[g]; !knownEncodings[e] {
			c.Add("encodings[%q]: unknown encoding %q (known: cl100k_base, o200k_base, p50k_base, p50k_edit, r50k_base)", g, e)
		}
	}
	for _, s := range p.Disable {
		if !slices.Contains(signals, s) {
			c.Add("disable: unknown signal %q (known: %v)", s, signals)
		}
	}
	b := p.Breaker
	switch b.Anonymous {
	case "", AnonymousAuto, AnonymousClient, AnonymousOff:
	default:
		c.Add("breaker.anonymous: unknown mode %q (known: auto, client, off)", b.Anonymous)
	}
	c.NonNegativeDuration("breaker.window", b.Window)
	c.NonNegative("breaker.buckets", b.Buckets)
	c.NonNegativeDuration("breaker.bucket_period", b.BucketPeriod)
	if b.Buckets > 0 && b.BucketPeriod > 0 {
		c.Add("breaker: set buckets or bucket_period, not both")
	}
	if q := p.WithDefaults().Breaker; b.BucketPeriod > 0 && q.BucketPeriod > q.Window {
		c.Add("breaker.bucket_period (%s) must not exceed breaker.window (%s)", q.BucketPeriod.D(), q.Window.D())
	}
	c.NonNegative("breaker.min_requests", b.MinRequests)
	if b.FailureRatio < 0 || b.FailureRatio > 1 {
		c.Add("breaker.failure_ratio must be in (0, 1], got %g", b.FailureRatio)
	}
	c.NonNegativeDuration("breaker.open_for", b.OpenFor)
	if b.HalfOpenProbes < 0 || b.HalfOpenProbes > 1<<16 {
		c.Add("breaker.half_open_probes must be in [1, 65536], got %d", b.HalfOpenProbes)
	}
	c.NonNegative("breaker.max_breakers", b.MaxBreakers)
	d := p.Degrade
	c.NonNegative("degrade.trips_per_minute", d.TripsPerMinute)
	c.NonNegative("degrade.level1_max_tokens", d.Level1MaxTokens)
	if d.Level1SurgeFactor < 0 || (d.Level1SurgeFactor > 0 && d.Level1SurgeFactor < 1) {
		c.Add("degrade.level1_surge_factor must be at least 1, got %g", d.Level1SurgeFactor)
	}
	c.NonNegative("degrade.saturation_inflight", d.SaturationInflight)
	c.NonNegativeDuration("degrade.cool_down", d.CoolDown)
	if d.TripsPerMinute == 0 && d.SaturationInflight == 0 &&
		(d.Level1MaxTokens != 0 || d.LongContextCluster != "") {
		c.Add("degrade: set trips_per_minute and/or saturation_inflight, or level1_max_tokens and long_context_cluster never apply")
	}
	return c.Err()
}

func (p Params) disabled(s string) bool { return slices.Contains(p.Disable, s) }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
