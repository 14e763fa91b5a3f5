package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unicode"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultModel            = "sim-llama"
	DefaultMaxRunning       = 256
	DefaultKVTokens         = 1 << 20
	DefaultTokensPerEvent   = 1
	DefaultMaxTokensDefault = 64
	DefaultMaxModelLen      = 32768
	DefaultEmbeddingDim     = 64
	DefaultTimeScale        = 1.0

	// maxEmbeddingDim bounds EmbeddingDim and the per-request "dimensions" parameter.
	maxEmbeddingDim = 65536
)

// Config describes the simulated model server. The zero value is usable: every zero field
// takes the default documented next to it. Durations are simulated durations: each is
// multiplied by TimeScale before use.
type Config struct {
	Model            string        // served model name (default "sim-llama")
	TTFT             time.Duration // fixed prefill latency per request at no load (default 0)
	PrefillPerToken  time.Duration // extra prefill time per prompt token (default 0)
	ITL              time.Duration // decode step time at batch size 1 (default 0)
	ITLPerRunning    time.Duration // extra decode step time per additional running sequence (default 0)
	MaxRunning       int           // max concurrently running sequences (default 256)
	KVTokens         int           // KV cache capacity in tokens (default 1<<20)
	TokensPerEvent   int           // tokens per SSE chunk (default 1)
	MaxTokensDefault int           // output length when max_tokens is absent (default 64)
	MaxModelLen      int           // context window: prompt+max_tokens above it is a 400 (default 32768)
	ErrorRate5xx     float64       // share of API requests answered 500 or 503 at once
	ErrorRate429     float64       // share of API requests answered 429 with Retry-After at once
	Delay            time.Duration // fixed extra delay before processing each request
	DelayJitter      time.Duration // uniform random extra delay in [0, DelayJitter)
	TimeScale        float64       // multiplies every simulated duration (default 1)
	Seed             int64         // RNG seed for error injection, jitter and unseeded sampling
	EmbeddingDim     int           // embedding vector length (default 64)
	// Embeddings batch cost (see the package doc): an embeddings request holds the one
	// embedding engine for EmbedRequestCost + EmbedItemCost × inputs before it is answered,
	// so requests queue behind each other and merging inputs into one request pays.
	EmbedRequestCost time.Duration // fixed engine time per embeddings request (default 0)
	EmbedItemCost    time.Duration // engine time per embeddings input (default 0)
	// LogprobTemperature divides the sharpness of every token's simulated next-token
	// distribution (the logprobs, when a request asks for them; see the package doc): above 1
	// a model less sure of itself (flatter distributions, higher entropy, smaller margins),
	// below 1 a surer one. Default 1; at most 100.
	LogprobTemperature float64
	// NoHealth makes GET /health answer 404 (not_found), like servers that have none
	// (Ollama, some proxies); /v1/models keeps answering.
	NoHealth bool

	// State knobs (see the package doc; Server.SetKVLeak and Server.SetSlowdown change them
	// at run time).
	//
	// LeakKVPerRequest: KV-cache tokens each finished sequence leaves in use, never freed: the
	// reported KV use stays up after requests finish and grows with each one (up to the whole
	// cache), and admission has that much less room, as with a server that leaks blocks.
	LeakKVPerRequest int
	// Slowdown multiplies the time of every engine step (0 means 1; +Inf pauses the engine):
	// throughput falls while requests keep queueing, as on a stalling server. It needs the
	// scheduler (some simulated latency: on the fast path there are no steps to slow).
	Slowdown float64
}

// Validate reports every problem of c at once (joined with errors.Join), or nil. Zero values
// are valid: they mean "use the default".
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if len(c.Model) > 256 {
		bad("Model: longer than 256 bytes")
	}
	for _, r := range c.Model {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			bad("Model %q: must not contain spaces or control characters", c.Model)
			break
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"TTFT", c.TTFT}, {"PrefillPerToken", c.PrefillPerToken}, {"ITL", c.ITL},
		{"ITLPerRunning", c.ITLPerRunning}, {"Delay", c.Delay}, {"DelayJitter", c.DelayJitter},
		{"EmbedRequestCost", c.EmbedRequestCost}, {"EmbedItemCost", c.EmbedItemCost},
	} {
		if d.v < 0 {
			bad("%s: must be >= 0, got %v", d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"MaxRunning", c.MaxRunning}, {"KVTokens", c.KVTokens}, {"TokensPerEvent", c.TokensPerEvent},
		{"MaxTokensDefault", c.MaxTokensDefault}, {"MaxModelLen", c.MaxModelLen}, {"EmbeddingDim", c.EmbeddingDim},
		{"LeakKVPerRequest", c.LeakKVPerRequest},
	} {
		if n.v < 0 {
			bad("%s: must be >= 0 (0 means default), got %d", n.name, n.v)
		}
	}
	if c.EmbeddingDim > maxEmbeddingDim {
		bad("EmbeddingDim: must be <= %d, got %d", maxEmbeddingDim, c.EmbeddingDim)
	}
	rateOK := true
	for _, r := range []struct {
		name string
		v    float64
	}{{"ErrorRate5xx", c.ErrorRate5xx}, {"ErrorRate429", c.ErrorRate429}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			bad("%s: must be within [0, 1], got %v", r.name, r.v)
			rateOK = false
		}
	}
	if rateOK && c.ErrorRate5xx+c.ErrorRate429 > 1 {
		bad("ErrorRate5xx + ErrorRate429: must be <= 1, got %v", c.ErrorRate5xx+c.ErrorRate429)
	}
	if math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) || c.TimeScale < 0 {
		bad("TimeScale: must be a finite number >= 0 (0 means 1), got %v", c.TimeScale)
	}
	if math.IsNaN(c.Slowdown) || c.Slowdown < 0 {
		bad("Slowdown: must be a number >= 0 (0 means 1, +Inf pauses the engine), got %v", c.Slowdown)
	}
	if math.IsNaN(c.LogprobTemperature) || c.LogprobTemperature < 0 || c.LogprobTemperature > 100 {
		bad("LogprobTemperature: must be within [0, 100] (0 means 1), got %v", c.LogprobTemperature)
	}
	if c.MaxTokensDefault >= 0 && c.MaxModelLen >= 0 {
		mt, ml := c.MaxTokensDefault, c.MaxModelLen
		if mt == 0 {
			mt = DefaultMaxTokensDefault
		}
		if ml == 0 {
			ml = DefaultMaxModelLen
		}
		if mt > ml {
			bad("MaxTokensDefault (%d): must be <= MaxModelLen (%d)", mt, ml)
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns c with defaults applied. Values that Validate rejects are replaced by
// their defaults too, so New never builds a server that misbehaves.
func (c Config) withDefaults() Config {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	for _, d := range []*time.Duration{&c.TTFT, &c.PrefillPerToken, &c.ITL, &c.ITLPerRunning, &c.Delay, &c.DelayJitter, &c.EmbedRequestCost, &c.EmbedItemCost} {
		if *d < 0 {
			*d = 0
		}
	}
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&c.MaxRunning, DefaultMaxRunning)
	def(&c.KVTokens, DefaultKVTokens)
	def(&c.TokensPerEvent, DefaultTokensPerEvent)
	def(&c.MaxTokensDefault, DefaultMaxTokensDefault)
	def(&c.MaxModelLen, DefaultMaxModelLen)
	def(&c.EmbeddingDim, DefaultEmbeddingDim)
	if c.EmbeddingDim > maxEmbeddingDim {
		c.EmbeddingDim = maxEmbeddingDim
	}
	if c.MaxTokensDefault > c.MaxModelLen {
		c.MaxTokensDefault = c.MaxModelLen
	}
	for _, r := range []*float64{&c.ErrorRate5xx, &c.ErrorRate429} {
		if math.IsNaN(*r) || *r < 0 {
			*r = 0
		}
		if *r > 1 {
			*r = 1
		}
	}
	if math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) || c.TimeScale <= 0 {
		c.TimeScale = DefaultTimeScale
	}
	if c.LeakKVPerRequest < 0 {
		c.LeakKVPerRequest = 0
	}
	c.Slowdown = slowdownOrOne(c.Slowdown)
	if math.IsNaN(c.LogprobTemperature) || c.LogprobTemperature <= 0 || c.LogprobTemperature > 100 {
		c.LogprobTemperature = defaultLogprobT
	}
	return c
}

// slowdownOrOne is f, or 1 for values that mean no slowdown (0, negative, NaN).
func slowdownOrOne(f float64) float64 {
	if math.IsNaN(f) || f <= 0 {
		return 1
	}
	return f
}

// slowBy multiplies a real step time by a finite slowdown factor.
func slowBy(d time.Duration, f float64) time.Duration {
	if f == 1 || d <= 0 {
		return d
	}
	if x := float64(d) * f; x < math.MaxInt64 {
		return time.Duration(x)
	}
	return time.Duration(math.MaxInt64)
}

// fastPath reports whether the configuration has no simulated latency at all, in which case
// requests are generated inline by their handler and the scheduler is not started.
func (c Config) fastPath() bool {
	return c.TTFT == 0 && c.PrefillPerToken == 0 && c.ITL == 0 && c.ITLPerRunning == 0 &&
		c.Delay == 0 && c.DelayJitter == 0
}

// embedCost is the unscaled engine time of an embeddings request with n inputs.
func (c Config) embedCost(n int) time.Duration {
	if c.EmbedRequestCost <= 0 && c.EmbedItemCost <= 0 {
		return 0
	}
	per := float64(c.EmbedItemCost) * float64(n)
	if f := float64(c.EmbedRequestCost) + per; f < math.MaxInt64 {
		return time.Duration(f)
	}
	return time.Duration(math.MaxInt64)
}

// scale multiplies a simulated duration by TimeScale.
func (c Config) scale(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if c.TimeScale == 1 {
		return d
	}
	f := float64(d) * c.TimeScale
	if f >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(f)
}
