package route

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Defaults of the keys of a Spec (a zero value takes its default).
const (
	DefaultGrayFlagHeader      = "x-gray-flag"
	DefaultAttempts            = 1
	DefaultBackoffBase         = 25 * time.Millisecond
	DefaultBackoffMax          = 250 * time.Millisecond
	DefaultMaxRetryAfter       = 2 * time.Second
	DefaultBudget              = 0.2
	DefaultMinRetriesPerSecond = 3.0
	// DefaultFallbackBudget lets every request a partly failing cluster cannot serve fall
	// back: moving to another cluster is routing, not a retry storm.
	DefaultFallbackBudget        = 1.0
	DefaultMinFallbacksPerSecond = 3.0
	DefaultBreakerWindow         = 60 * time.Second
	DefaultBreakerBuckets        = 10
	DefaultBreakerMinRequests    = 20
	DefaultBreakerFailureRatio   = 0.5
	DefaultBreakerOpenFor        = 30 * time.Second
	DefaultHalfOpenProbes        = 3

	// MaxAttempts bounds retry.attempts.
	MaxAttempts = 10
	// BudgetWindow is the sliding window of the retry budget (as Finagle's and Envoy's).
	BudgetWindow = 10 * time.Second
)

// Sticky key sources (Spec.Sticky).
const (
	StickyHeaderPrefix = "header:" // "header:NAME": the request header NAME
	StickyBodyUser     = "body:user"
	StickyKey          = "key"    // the bearer API key (hashed, never stored), else the tenant
	StickyTenant       = "tenant" // the tenant name
	StickyClient       = "client" // the client's IP address
	StickyNone         = "none"   // no stickiness: every request is spread at random by weight
)

// DefaultSticky is the sticky key sources of a Spec that names none.
var DefaultSticky = []string{"header:X-Session-ID", StickyBodyUser, StickyKey}

// Spec is a route's routing: splits, stickiness, the fallback chain, retries and breakers. The
// config embeds it in config.Route (`yaml:",inline"`), so its keys sit next to the route's.
// It has no methods that decode it: embedding would promote them to the Route.
type Spec struct {
	// Splits share the route's traffic between clusters by weight and gray flag. Empty: the
	// route's own cluster serves every request.
	Splits []Split `yaml:"splits" json:"splits,omitempty"`
	// Sticky lists where a request's session key comes from, first non-empty wins:
	// "header:NAME", "body:user", "key" (API key, else tenant), "tenant", "client", or "none".
	// Empty: DefaultSticky.
	Sticky []string `yaml:"sticky" json:"sticky,omitempty"`
	// GrayFlagHeader names the header whose value selects a split by its gray_flag.
	GrayFlagHeader string `yaml:"gray_flag_header" json:"gray_flag_header,omitempty"`
	// Fallback is the ordered chain tried after the chosen split fails before the first byte.
	Fallback []Step `yaml:"fallback" json:"fallback,omitempty"`
	// Retry bounds attempts per candidate, their back-off, and the route's retry budget.
	Retry Retry `yaml:"retry" json:"retry"`
	// Breaker configures the route's per-cluster circuit breakers.
	Breaker Breaker `yaml:"breaker" json:"breaker"`
	// Resume continues a stream cut mid-way on the next candidate, the text already sent
	// becoming an assistant prefix (the handler does this; the plan adds "stream_cut" to the
	// default conditions).
	Resume bool `yaml:"resume" json:"resume,omitempty"`
	// ContractMismatch lists upstream answers that mean the model server's API drifted; they
	// are the condition "contract".
	ContractMismatch []Contract `yaml:"contract_mismatch" json:"contract_mismatch,omitempty"`
}

// Split is one share of a route's traffic.
type Split struct {
	// Name names the split in Candidate.Split, metrics and SetWeights (default: Cluster).
	Name    string `yaml:"name" json:"name,omitempty"`
	Cluster string `yaml:"cluster" json:"cluster"`
	// Weight is the split's share relative to the others (0: only gray-flagged requests).
	Weight int `yaml:"weight" json:"weight"`
	// GrayFlag: a request whose gray-flag header equals it always goes to this split.
	GrayFlag string `yaml:"gray_flag" json:"gray_flag,omitempty"`
	// Model rewrites the request's model (default: the route's model rewrite).
	Model string `yaml:"model" json:"model,omitempty"`
}

// Step is one fallback of the chain.
type Step struct {
	Cluster string `yaml:"cluster" json:"cluster"`
	// Model rewrites the request's model on this step ("" keeps the request's model).
	Model string `yaml:"model" json:"model,omitempty"`
	// On lists the failures of the candidate before this step that move the request on to
	// it (policy.Cond*). Empty: policy.DefaultOn (plus "stream_cut" with resume).
	On []string `yaml:"on" json:"on,omitempty"`
	// Timeouts override the route's for attempts on this step.
	Timeouts StepTimeouts `yaml:"timeouts" json:"timeouts"`
}

// StepTimeouts are a fallback step's own time-outs (0 keeps the route's).
type StepTimeouts struct {
	TTFT  Duration `yaml:"ttft" json:"ttft,omitempty"`
	Idle  Duration `yaml:"idle" json:"idle,omitempty"`
	Total Duration `yaml:"total" json:"total,omitempty"`
}

// Retry configures attempts per candidate and the route's retry and fallback budgets.
type Retry struct {
	// Attempts per candidate, the first included (default 1: no retry on the same cluster).
	Attempts int `yaml:"attempts" json:"attempts,omitempty"`
	// PerTryTimeout bounds one attempt (0: the route's time-outs only).
	PerTryTimeout Duration `yaml:"per_try_timeout" json:"per_try_timeout,omitempty"`
	// BackoffBase and BackoffMax bound the full-jitter exponential back-off between attempts.
	BackoffBase Duration `yaml:"backoff_base" json:"backoff_base,omitempty"`
	BackoffMax  Duration `yaml:"backoff_max" json:"backoff_max,omitempty"`
	// Budget is the share of the requests sent to a cluster that may be retried on it, in
	// [0, 1] (default 0.2). Each target cluster has its own.
	Budget *float64 `yaml:"budget" json:"budget,omitempty"`
	// MinRetriesPerSecond is the retry budget's floor per cluster (default 3), so that a quiet
	// route may retry.
	MinRetriesPerSecond *float64 `yaml:"min_retries_per_second" json:"min_retries_per_second,omitempty"`
	// FallbackBudget is the share of the route's requests that may move on to one fallback
	// cluster, in [0, 1] (default 1: every request the cluster before it cannot serve).
	// Fallbacks never spend the retry budget.
	FallbackBudget *float64 `yaml:"fallback_budget" json:"fallback_budget,omitempty"`
	// MinFallbacksPerSecond is the fallback budget's floor per cluster (default 3).
	MinFallbacksPerSecond *float64 `yaml:"min_fallbacks_per_second" json:"min_fallbacks_per_second,omitempty"`
	// HonorRetryAfter waits for an upstream's Retry-After before retrying it (default true).
	HonorRetryAfter *bool `yaml:"honor_retry_after" json:"honor_retry_after,omitempty"`
	// MaxRetryAfter: a longer Retry-After is not waited for; the candidate is not retried.
	MaxRetryAfter Duration `yaml:"max_retry_after" json:"max_retry_after,omitempty"`
}

// Breaker configures the per-cluster circuit breakers of a route.
type Breaker struct {
	// Window is the rolling window the failure ratio is measured over, in Buckets buckets.
	Window  Duration `yaml:"window" json:"window,omitempty"`
	Buckets int      `yaml:"buckets" json:"buckets,omitempty"`
	// MinRequests counted in the window before the breaker may open.
	MinRequests int `yaml:"min_requests" json:"min_requests,omitempty"`
	// FailureRatio of counted requests at which it opens, in (0, 1].
	FailureRatio float64 `yaml:"failure_ratio" json:"failure_ratio,omitempty"`
	// OpenFor is how long it stays open before letting probes through (half-open).
	OpenFor Duration `yaml:"open_for" json:"open_for,omitempty"`
	// HalfOpenProbes: this many probes succeeding in a row close it; one failing reopens it.
	HalfOpenProbes int `yaml:"half_open_probes" json:"half_open_probes,omitempty"`
	// Disabled turns the route's breakers off.
	Disabled bool `yaml:"disabled" json:"disabled,omitempty"`
}

// Contract is an upstream answer that means the server's API drifted: its status (0: any) and
// its OpenAI error code ("": any).
type Contract struct {
	Status int    `yaml:"status" json:"status,omitempty"`
	Code   string `yaml:"code" json:"code,omitempty"`
}

// Matches reports whether an answer with this status and error code is the contract mismatch.
func (c Contract) Matches(status int, code string) bool {
	return (c.Status == 0 || c.Status == status) && (c.Code == "" || c.Code == code)
}

// Clusters lists the clusters the spec names (splits, then fallback steps), each once.
func (s Spec) Clusters() []string {
	var out []string
	for _, sp := range s.Splits {
		if !slices.Contains(out, sp.Cluster) {
			out = append(out, sp.Cluster)
		}
	}
	for _, st := range s.Fallback {
		if !slices.Contains(out, st.Cluster) {
			out = append(out, st.Cluster)
		}
	}
	return out
}

// Problems is every problem of a Spec, each with its path relative to the route
// (`splits[1].weight: ...`). As an error it lists them all.
type Problems []string

func (p Problems) Error() string {
	if len(p) == 1 {
		return p[0]
	}
	return fmt.Sprintf("%d problems:\n  %s", len(p), strings.Join(p, "\n  "))
}

// Validate checks the spec and returns Problems listing every problem (nil when none).
// Whether the named clusters exist is the config's business (see Clusters).
func (s Spec) Validate() error {
	if p := s.Problems(); len(p) > 0 {
		return p
	}
	return nil
}

// Problems lists every problem of the spec (nil when none).
func (s Spec) Problems() Problems {
	var p Problems
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }

	names := map[string]int{}
	flags := map[string]int{}
	servable := false
	for i, sp := range s.Splits {
		at := fmt.Sprintf("splits[%d]", i)
		if sp.Cluster == "" {
			add("%s.cluster: required", at)
		}
		if sp.Weight < 0 {
			add("%s.weight: %d is negative (use 0 for a split that gets only gray-flagged requests)", at, sp.Weight)
		}
		if sp.Weight > 0 || sp.GrayFlag != "" {
			servable = true
		}
		name := sp.name()
		if j, dup := names[name]; dup && name != "" {
			add("%s.name: %q is also splits[%d]'s name (two splits of one cluster need distinct names)", at, name, j)
		} else {
			names[name] = i
		}
		if sp.GrayFlag != "" {
			if j, dup := flags[sp.GrayFlag]; dup {
				add("%s.gray_flag: %q is also splits[%d]'s gray flag", at, sp.GrayFlag, j)
			} else {
				flags[sp.GrayFlag] = i
			}
		}
	}
	if len(s.Splits) > 0 && !servable {
		add("splits: no split has a weight > 0 or a gray flag")
	}

	for i, src := range s.Sticky {
		if err := checkSticky(src); err != nil {
			add("sticky[%d]: %v", i, err)
		}
	}
	if slices.Contains(s.Sticky, StickyNone) && len(s.Sticky) > 1 {
		add("sticky: %q cannot be combined with other sources", StickyNone)
	}
	if s.GrayFlagHeader != "" && !validHeaderName(s.GrayFlagHeader) {
		add("gray_flag_header: %q is not a valid header name", s.GrayFlagHeader)
	}

	for i, st := range s.Fallback {
		at := fmt.Sprintf("fallback[%d]", i)
		if st.Cluster == "" {
			add("%s.cluster: required", at)
		}
		for j, c := range st.On {
			if !slices.Contains(Conditions, c) {
				add("%s.on[%d]: unknown condition %q (known: %s)", at, j, c, strings.Join(Conditions, ", "))
			}
		}
		checkDur(add, at+".timeouts.ttft", st.Timeouts.TTFT)
		checkDur(add, at+".timeouts.idle", st.Timeouts.Idle)
		checkDur(add, at+".timeouts.total", st.Timeouts.Total)
	}

	r := s.Retry
	if r.Attempts < 0 || r.Attempts > MaxAttempts {
		add("retry.attempts: %d is out of range [1, %d] (attempts per candidate, the first included)", r.Attempts, MaxAttempts)
	}
	checkDur(add, "retry.per_try_timeout", r.PerTryTimeout)
	checkDur(add, "retry.backoff_base", r.BackoffBase)
	checkDur(add, "retry.backoff_max", r.BackoffMax)
	checkDur(add, "retry.max_retry_after", r.MaxRetryAfter)
	if r.BackoffBase >= 0 && r.BackoffMax >= 0 {
		rr := r.withDefaults()
		if rr.BackoffMax < rr.BackoffBase {
			add("retry.backoff_max: %v is below backoff_base %v", rr.BackoffMax.D(), rr.BackoffBase.D())
		}
	}
	if r.Budget != nil && !(*r.Budget >= 0 && *r.Budget <= 1) {
		add("retry.budget: %v is out of range [0, 1] (the share of requests that may be retried)", *r.Budget)
	}
	if r.MinRetriesPerSecond != nil && !(*r.MinRetriesPerSecond >= 0) {
		add("retry.min_retries_per_second: %v is negative", *r.MinRetriesPerSecond)
	}
	if r.FallbackBudget != nil && !(*r.FallbackBudget >= 0 && *r.FallbackBudget <= 1) {
		add("retry.fallback_budget: %v is out of range [0, 1] (the share of requests that may move on to one fallback cluster)", *r.FallbackBudget)
	}
	if r.MinFallbacksPerSecond != nil && !(*r.MinFallbacksPerSecond >= 0) {
		add("retry.min_fallbacks_per_second: %v is negative", *r.MinFallbacksPerSecond)
	}

	b := s.Breaker
	checkDur(add, "breaker.window", b.Window)
	checkDur(add, "breaker.open_for", b.OpenFor)
	if b.Buckets < 0 {
		add("breaker.buckets: %d is negative", b.Buckets)
	}
	if b.MinRequests < 0 {
		add("breaker.min_requests: %d is negative", b.MinRequests)
	}
	if !(b.FailureRatio >= 0 && b.FailureRatio <= 1) {
		add("breaker.failure_ratio: %v is out of range (0, 1]", b.FailureRatio)
	}
	if b.HalfOpenProbes < 0 {
		add("breaker.half_open_probes: %d is negative", b.HalfOpenProbes)
	}
	if b.Window >= 0 && b.Buckets > 0 {
		bb := b.withDefaults()
		if bb.Window.D()/time.Duration(bb.Buckets) < time.Millisecond {
			add("breaker.buckets: %d buckets of a %v window are shorter than 1ms", bb.Buckets, bb.Window.D())
		}
	}

	for i, c := range s.ContractMismatch {
		at := fmt.Sprintf("contract_mismatch[%d]", i)
		if c.Status == 0 && c.Code == "" {
			add("%s: give a status, a code or both", at)
		}
		if c.Status != 0 && (c.Status < 400 || c.Status > 599) {
			add("%s.status: %d is not an error status (400-599)", at, c.Status)
		}
	}
	return p
}

func checkDur(add func(string, ...any), at string, d Duration) {
	if d < 0 {
		add("%s: %v is negative", at, d.D())
	}
}

func checkSticky(src string) error {
	switch src {
	case StickyBodyUser, StickyKey, StickyTenant, StickyClient, StickyNone:
		return nil
	}
	if name, ok := strings.CutPrefix(src, StickyHeaderPrefix); ok {
		if !validHeaderName(name) {
			return fmt.Errorf("%q: %q is not a valid header name", src, name)
		}
		return nil
	}
	return fmt.Errorf("unknown source %q (use \"header:NAME\", %q, %q, %q, %q or %q)",
		src, StickyBodyUser, StickyKey, StickyTenant, StickyClient, StickyNone)
}

// validHeaderName reports whether s is a non-empty RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Conditions are the known failure conditions, the values of a step's `on`.
var Conditions = []string{
	policy.CondConnect, policy.Cond5xx, policy.Cond429, policy.CondTTFTTimeout,
	policy.CondBreakerOpen, policy.CondNoEndpoint, policy.CondOverload, policy.CondContract,
	policy.CondStreamCut,
}

func (sp Split) name() string {
	if sp.Name != "" {
		return sp.Name
	}
	return sp.Cluster
}

func (r Retry) withDefaults() Retry {
	if r.Attempts == 0 {
		r.Attempts = DefaultAttempts
	}
	if r.BackoffBase == 0 {
		r.BackoffBase = Duration(DefaultBackoffBase)
	}
	if r.BackoffMax == 0 {
		r.BackoffMax = max(Duration(DefaultBackoffMax), r.BackoffBase)
	}
	if r.MaxRetryAfter == 0 {
		r.MaxRetryAfter = Duration(DefaultMaxRetryAfter)
	}
	if r.Budget == nil {
		r.Budget = ptr(DefaultBudget)
	}
	if r.MinRetriesPerSecond == nil {
		r.MinRetriesPerSecond = ptr(DefaultMinRetriesPerSecond)
	}
	if r.FallbackBudget == nil {
		r.FallbackBudget = ptr(DefaultFallbackBudget)
	}
	if r.MinFallbacksPerSecond == nil {
		r.MinFallbacksPerSecond = ptr(DefaultMinFallbacksPerSecond)
	}
	if r.HonorRetryAfter == nil {
		r.HonorRetryAfter = ptr(true)
	}
	return r
}

func (r Retry) retryRule() BudgetRule {
	return BudgetRule{Ratio: *r.Budget, MinPerSecond: *r.MinRetriesPerSecond}
}

func (r Retry) fallbackRule() BudgetRule {
	return BudgetRule{Ratio: *r.FallbackBudget, MinPerSecond: *r.MinFallbacksPerSecond}
}

func (b Breaker) withDefaults() Breaker {
	if b.Window == 0 {
		b.Window = Duration(DefaultBreakerWindow)
	}
	if b.Buckets == 0 {
		b.Buckets = DefaultBreakerBuckets
	}
	if b.MinRequests == 0 {
		b.MinRequests = DefaultBreakerMinRequests
	}
	if b.FailureRatio == 0 {
		b.FailureRatio = DefaultBreakerFailureRatio
	}
	if b.OpenFor == 0 {
		b.OpenFor = Duration(DefaultBreakerOpenFor)
	}
	if b.HalfOpenProbes == 0 {
		b.HalfOpenProbes = DefaultHalfOpenProbes
	}
	return b
}

func ptr[T any](v T) *T { return &v }

// Duration is policy.Duration: "250ms", "1.5s" or a number of seconds, in YAML and JSON.
type Duration = policy.Duration
