// Package ratelimit is Sluice's token-aware rate limit policy: requests per minute and tokens
// per minute, per tenant, route or globally, on token buckets that may go into debt, plus an
// optional Envoy-compatible global rate limit service shared by all replicas. A Limiter offers
// the gateway its counters and buckets as its admin view (policy.Viewer) and its counters as
// metrics (policy.MetricsReporter, view.go).
//
// # Tenants
//
// A Keyring maps API keys (`Authorization: Bearer KEY`, `api-key`, `x-api-key`) to tenants.
// Keys come by value from environment variables or files and are kept only as SHA-256
// digests; nothing prints them. The handler fills policy.Request.Tenant with
// Keyring.Identify; with `require_auth` a request without a tenant gets 401 invalid_api_key.
//
// # Budgets
//
// Each key (tenant, route, or one for all) has a request bucket and a token bucket. A bucket
// holds Burst × the per-minute limit and refills continuously at the per-minute limit, so
// the long-run rate is exact and a full minute's budget may be spent at once (as OpenAI's
// limits behave with the default burst of 1).
//
// A request is charged up front: one request, and prompt estimate + min(max_tokens or
// default_max_tokens, max_tokens_cap) × n tokens (Responses API: max_output_tokens;
// embeddings: the prompt only). The charge saturates at math.MaxInt instead of overflowing.
// Charging is one O(1) bucket operation at the policy clock's now, whatever the charge: the
// bucket's level may go negative. A charge larger than the token bucket (burst < 1) waits
// until the bucket is full, takes it, and borrows the rest from the future (the bucket goes
// into debt that later requests wait out), so it is never refused forever and the long-run
// rate still holds.
//
// A request larger than one request may ever be, above both tokens_per_minute and the
// bucket's capacity (burst × tokens_per_minute), is refused at once, before any bucket is
// charged, so it puts no one into debt: 429, type "tokens", code "rate_limit_exceeded", as
// OpenAI answers a request larger than its TPM limit: "Request too large for MODEL on tokens
// per min (TPM) for tenant T: Limit 30000, Requested 50000. The input or output tokens must
// be reduced in order to run successfully." ("Limit 30000 (bucket 60000)" with burst 2).
// It has no Retry-After, since waiting never helps, and carries `x-should-retry: false` so
// that the OpenAI SDKs do not retry it; Stats counts it under ReasonTooLarge. So is a request
// that the global service (with hits: tokens) refuses with a limit below its charge alone
// ("... on tokens per min (TPM) (global limit) ...": Envoy's service sends back the limit).
//
// When a charge would have to wait, Admit gives back what it took and rejects with 429 and
// Retry-After = the longest wait, or, with `max_wait`, waits up to that long while the
// request's context allows. When the response ends, Decision.Done reconciles the charge
// with the real usage (Outcome.InputTokens + OutputTokens, saturating, streaming included):
// the difference is refunded or charged, into debt if need be. A request that ends with no
// token counts keeps only its prompt charge. Whatever is given back (a cancelled charge, a
// refund, a global rejection) is added back to the bucket, which never holds more than its
// capacity.
//
// Every response, admitted or not, carries OpenAI's headers (Decision.Header):
// x-ratelimit-{limit,remaining,reset}-{requests,tokens}, resets formatted as Go durations
// rounded up to the millisecond ("1s", "6m0s", "250ms").
package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

func init() { policy.Register("ratelimit", factory) }

func factory(params json.RawMessage, env policy.Env) (policy.Plugin, error) {
	var p Params
	if err := policy.DecodeParams(params, &p); err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	return New(p, nil, env)
}

// Rejection reasons, the keys of Stats.Rejected.
const (
	ReasonRequests = "requests"        // request budget exhausted
	ReasonTokens   = "tokens"          // token budget exhausted
	ReasonGlobal   = "global"          // the global service said OVER_LIMIT
	ReasonAuth     = "unauthenticated" // require_auth and no known tenant
	ReasonCanceled = "canceled"        // the request's context ended while waiting (max_wait)
	ReasonTooLarge = "too_large"       // one request's token charge above what any one may take
)

// reasons indexes Limiter.rejected.
var reasons = [...]string{ReasonRequests, ReasonTokens, ReasonGlobal, ReasonAuth, ReasonCanceled, ReasonTooLarge}

const (
	rejRequests = iota
	rejTokens
	rejGlobal
	rejAuth
	rejCanceled
	rejTooLarge
)

// Response headers, as OpenAI sends them (canonical form for http.Header).
const (
	HeaderLimitRequests     = "X-Ratelimit-Limit-Requests"
	HeaderRemainingRequests = "X-Ratelimit-Remaining-Requests"
	HeaderResetRequests     = "X-Ratelimit-Reset-Requests"
	HeaderLimitTokens       = "X-Ratelimit-Limit-Tokens"
	HeaderRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	HeaderResetTokens       = "X-Ratelimit-Reset-Tokens"

	// HeaderShouldRetry is the OpenAI SDKs' retry hint: "false" on a request too large to
	// ever be admitted, which they would otherwise retry as any 429.
	HeaderShouldRetry = "X-Should-Retry"
)

// Limiter is the rate limit policy: a policy.Admitter. It is safe for concurrent use.
// Close it when its config is replaced if it uses the global service.
type Limiter struct {
	policy.Named        // its type and name: a policy.Plugin
	p            Params // with defaults
	keyring      *Keyring
	clock        policy.Clock
	log          *slog.Logger
	route        string
	global       *globalClient
	sleep        func(ctx context.Context, d time.Duration) error // max_wait; tests replace it

	mu      sync.RWMutex
	buckets map[string]*bucket

	admitted       atomic.Uint64
	rejected       [len(reasons)]atomic.Uint64
	globalCalls    atomic.Uint64
	globalFailures atomic.Uint64
	refunded       atomic.Uint64
	extra          atomic.Uint64
}

// bucket is the request and token buckets of one key; a nil bucket is no limit.
type bucket struct {
	key       string
	req, tok  *tokenBucket
	rpm, tpm  float64
	maxCharge float64 // the largest token charge one request may make: max(tpm, tok's capacity)
	rpmS      string  // header values of the limits
	tpmS      string
	lastUsed  atomic.Int64 // policy clock, UnixNano
}

// New builds a Limiter. keyring may be nil: Admit then trusts policy.Request.Tenant only
// (the handler fills it); with a keyring, a request without a Tenant is identified from its
// headers.
func New(p Params, keyring *Keyring, env policy.Env) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.WithDefaults()
	if env.Clock == nil {
		env.Clock = policy.SystemClock{}
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{
		Named:   env.Named(),
		p:       p,
		keyring: keyring,
		clock:   env.Clock,
		log:     env.Logger,
		route:   env.Route,
		sleep:   sleepCtx,
		buckets: make(map[string]*bucket),
	}
	if p.Global != nil {
		g, err := newGlobalClient(*p.Global)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: global: %w", err)
		}
		l.global = g
	}
	return l, nil
}

// Close releases the connection to the global service, if any.
func (l *Limiter) Close() error {
	if l.global != nil {
		return l.global.close()
	}
	return nil
}

// Params returns the params in effect (defaults filled in).
func (l *Limiter) Params() Params { return l.p }

// Admit charges the request against its buckets and admits it, or rejects it with 429
// (Retry-After and the x-ratelimit-* headers) or, with require_auth and no tenant, 401.
// It waits only with max_wait, and never past ctx's deadline.
func (l *Limiter) Admit(ctx context.Context, r *policy.Request) (policy.Decision, error) {
	tenant := r.Tenant
	if tenant == "" && l.keyring != nil && r.Header != nil {
		tenant, _ = l.keyring.Identify(r.Header)
	}
	if l.p.RequireAuth && tenant == "" {
		l.rejected[rejAuth].Add(1)
		return policy.Decision{Reject: authError(r.Header)}, nil
	}
	now := l.clock.Now()
	b := l.bucketFor(l.keyOf(r, tenant), now)
	prompt, charge := l.charge(r)
	if b.tok != nil && float64(charge) > b.maxCharge {
		// No bucket of this key can ever hold it: refuse it before charging anything, so it
		// puts no one into debt, and tell the client not to retry.
		l.rejected[rejTooLarge].Add(1)
		h := l.headers(b, now)
		h[HeaderShouldRetry] = []string{"false"}
		return policy.Decision{Reject: l.tooLargeError(b, tenant, r.Model, charge), Header: h}, nil
	}

	// Charge one request and the tokens: each one O(1) bucket operation.
	var reqDelay, tokDelay time.Duration
	if b.req != nil {
		reqDelay = b.req.take(now, 1)
	}
	if b.tok != nil && charge > 0 {
		tokDelay = b.tok.take(now, float64(charge))
	}
	if delay := max(reqDelay, tokDelay); delay > 0 {
		if !l.mayWait(ctx, delay) {
			l.giveBack(b, charge, now)
			reason := rejRequests
			if tokDelay > reqDelay {
				reason = rejTokens
			}
			l.rejected[reason].Add(1)
			return policy.Decision{Reject: l.limitError(b, tenant, reason, charge, delay), Header: l.headers(b, now)}, nil
		}
		if err := l.sleep(ctx, delay); err != nil {
			l.giveBack(b, charge, l.clock.Now())
			l.rejected[rejCanceled].Add(1)
			return policy.Decision{Header: l.headers(b, l.clock.Now())}, err
		}
		now = l.clock.Now()
	}

	if l.global != nil {
		hits := uint32(1)
		if l.global.hitsTokens {
			hits = uint32(min(charge, math.MaxUint32))
		}
		model := ""
		if r.Request != nil {
			model = r.Model
		}
		l.globalCalls.Add(1)
		v, err := l.global.check(ctx, tenant, l.routeOf(r), model, hits)
		if err != nil && ctx.Err() != nil { // the client went away: not the service's fault
			l.giveBack(b, charge, now)
			l.rejected[rejCanceled].Add(1)
			return policy.Decision{Header: l.headers(b, now)}, ctx.Err()
		}
		switch {
		case err != nil:
			l.globalFailures.Add(1)
			if l.global.failing.CompareAndSwap(false, true) {
				l.log.Warn("ratelimit: global rate limit service failing, admitting requests (fail open)", "address", l.p.Global.Address, "err", err)
			}
		case v.over && v.tooLarge != nil:
			// Larger than the service's limit on its own: refused as a local too-large
			// request is, not to be retried (each retry would count against the tenant's
			// window again).
			l.global.ok(l.log)
			l.giveBack(b, charge, now)
			l.rejected[rejTooLarge].Add(1)
			h := l.headers(b, now)
			if h == nil {
				h = make(http.Header, 1)
			}
			h[HeaderShouldRetry] = []string{"false"}
			return policy.Decision{Reject: globalTooLargeError(v.tooLarge, tenant, model, charge), Header: h}, nil
		case v.over:
			l.global.ok(l.log)
			// Give back what was taken locally.
			l.giveBack(b, charge, now)
			l.rejected[rejGlobal].Add(1)
			e := policy.Fail(policy.ClassRateLimited, "Rate limit reached (global limit"+tenantPart(tenant)+"). Please try again in "+formatReset(v.retry)+".")
			e.Type, e.RetryAfter = l.globalType(), v.retry
			return policy.Decision{Reject: e, Header: l.headers(b, now)}, nil
		default:
			l.global.ok(l.log)
		}
	}

	l.admitted.Add(1)
	d := policy.Decision{Header: l.headers(b, now)}
	if b.tok != nil && charge > 0 {
		s := &settlement{l: l, b: b, prompt: prompt, charged: charge}
		d.Done = s.done
	}
	return d, nil
}

// giveBack returns a request's charges to its buckets (a rejection after charging, a wait
// cut short, a global rejection), never above their capacity.
func (l *Limiter) giveBack(b *bucket, tokens int, now time.Time) {
	if b.req != nil {
		b.req.give(now, 1)
	}
	if tokens > 0 && b.tok != nil {
		b.tok.give(now, float64(tokens))
	}
}

func (l *Limiter) mayWait(ctx context.Context, delay time.Duration) bool {
	if l.p.MaxWait <= 0 || delay > l.p.MaxWait.D() {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < delay {
		return false
	}
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// charge returns the prompt estimate and the whole up-front token charge, saturating at
// math.MaxInt whatever the prompt, max_tokens, n or params.
func (l *Limiter) charge(r *policy.Request) (prompt, total int) {
	if r.Request == nil {
		return 0, 0
	}
	prompt = max(r.PromptTokens, 0)
	switch r.Kind {
	case openai.KindChat, openai.KindCompletion, openai.KindResponses: // Responses: max_output_tokens, n = 1
	default:
		return prompt, prompt
	}
	out := r.MaxTokens
	if out <= 0 {
		out = max(l.p.DefaultMaxTokens, 0)
	}
	if l.p.MaxTokensCap > 0 {
		out = min(out, l.p.MaxTokensCap)
	}
	return prompt, satAdd(prompt, satMul(out, max(r.N, 1)))
}

func (l *Limiter) routeOf(r *policy.Request) string {
	if r.Route != "" {
		return r.Route
	}
	return l.route
}

func (l *Limiter) keyOf(r *policy.Request, tenant string) string {
	switch l.p.Per {
	case PerRoute:
		return l.routeOf(r)
	case PerGlobal:
		return ""
	}
	return tenant
}

// bucketFor returns the key's buckets, creating them (and evicting others) if need be.
func (l *Limiter) bucketFor(key string, now time.Time) *bucket {
	l.mu.RLock()
	b := l.buckets[key]
	l.mu.RUnlock()
	if b == nil {
		l.mu.Lock()
		if b = l.buckets[key]; b == nil {
			if len(l.buckets) >= l.p.MaxKeys {
				l.evict(now)
			}
			b = l.newBucket(key)
			l.buckets[key] = b
		}
		l.mu.Unlock()
	}
	b.lastUsed.Store(now.UnixNano())
	return b
}

// evict drops every idle bucket pair (both full: forgetting it changes nothing), or else
// the least recently used one. l.mu is held.
func (l *Limiter) evict(now time.Time) {
	var lru string
	oldest := int64(math.MaxInt64)
	n := len(l.buckets)
	for k, b := range l.buckets {
		if full(b.req, now) && full(b.tok, now) {
			delete(l.buckets, k)
			continue
		}
		if u := b.lastUsed.Load(); u < oldest {
			oldest, lru = u, k
		}
	}
	if len(l.buckets) == n {
		delete(l.buckets, lru)
	}
}

func full(tb *tokenBucket, now time.Time) bool {
	return tb == nil || tb.full(now)
}

func (l *Limiter) newBucket(key string) *bucket {
	rpm, tpm := l.p.RequestsPerMinute, l.p.TokensPerMinute
	if o, ok := l.p.Overrides[key]; ok && l.p.Per == PerTenant {
		if o.RequestsPerMinute > 0 {
			rpm = o.RequestsPerMinute
		}
		if o.TokensPerMinute > 0 {
			tpm = o.TokensPerMinute
		}
	}
	b := &bucket{key: key, rpm: rpm, tpm: tpm}
	if rpm > 0 {
		b.req = newTokenBucket(rpm, capacity(rpm, l.p.Burst))
		b.rpmS = formatCount(rpm)
	}
	if tpm > 0 {
		b.tok = newTokenBucket(tpm, capacity(tpm, l.p.Burst))
		b.tpmS = formatCount(tpm)
		b.maxCharge = max(tpm, b.tok.capacity)
	}
	return b
}

func capacity(perMinute, burst float64) int {
	return int(max(1, min(math.Ceil(perMinute*burst), math.MaxInt32)))
}

func formatCount(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// headers returns the x-ratelimit-* headers for the key's buckets at now.
func (l *Limiter) headers(b *bucket, now time.Time) http.Header {
	if b.req == nil && b.tok == nil {
		return nil
	}
	h := make(http.Header, 6)
	vals := make([]string, 6)
	if b.req != nil {
		rem, reset := state(b.req, now)
		vals[0], vals[1], vals[2] = b.rpmS, strconv.FormatInt(int64(max(rem, 0)), 10), formatReset(reset)
		h[HeaderLimitRequests] = vals[0:1:1]
		h[HeaderRemainingRequests] = vals[1:2:2]
		h[HeaderResetRequests] = vals[2:3:3]
	}
	if b.tok != nil {
		rem, reset := state(b.tok, now)
		vals[3], vals[4], vals[5] = b.tpmS, strconv.FormatInt(int64(max(rem, 0)), 10), formatReset(reset)
		h[HeaderLimitTokens] = vals[3:4:4]
		h[HeaderRemainingTokens] = vals[4:5:5]
		h[HeaderResetTokens] = vals[5:6:6]
	}
	return h
}

// state returns a bucket's whole tokens at now (negative in debt) and the time until it is
// full.
func state(tb *tokenBucket, now time.Time) (tokens float64, reset time.Duration) {
	t, reset := tb.state(now)
	return math.Floor(t), reset
}

// formatReset formats a duration as OpenAI's reset headers do: a Go duration string rounded
// up to the millisecond ("0s", "250ms", "1s", "1.5s", "6m0s").
func formatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	d = (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
	return d.String()
}

func tenantPart(tenant string) string {
	if tenant == "" {
		return ""
	}
	return " for tenant " + tenant
}

func (l *Limiter) globalType() string {
	if l.global != nil && l.global.hitsTokens {
		return "tokens"
	}
	return "requests"
}

// limitError is OpenAI's 429: type "requests" or "tokens", code "rate_limit_exceeded".
func (l *Limiter) limitError(b *bucket, tenant string, reason, charge int, delay time.Duration) *policy.Failure {
	var msg, typ string
	if reason == rejRequests {
		typ = "requests"
		msg = fmt.Sprintf("Rate limit reached on requests per min (RPM)%s: Limit %s. Please try again in %s.",
			tenantPart(tenant), b.rpmS, formatReset(delay))
	} else {
		typ = "tokens"
		msg = fmt.Sprintf("Rate limit reached on tokens per min (TPM)%s: Limit %s, Requested %d. Please try again in %s.",
			tenantPart(tenant), b.tpmS, charge, formatReset(delay))
	}
	e := policy.Fail(policy.ClassRateLimited, msg)
	e.Type, e.RetryAfter = typ, delay // OpenAI's types for its rate limits
	return e
}

// tooLargeError is OpenAI's 429 for a request larger than the TPM limit: it can never be
// admitted, so it has no Retry-After.
func (l *Limiter) tooLargeError(b *bucket, tenant, model string, charge int) *policy.Failure {
	limit := b.tpmS
	if b.maxCharge > b.tpm {
		limit += " (bucket " + formatCount(b.maxCharge) + ")"
	}
	if model != "" {
		model = " for " + model
	}
	e := policy.Fail(policy.ClassRateLimited,
		fmt.Sprintf("Request too large%s on tokens per min (TPM)%s: Limit %s, Requested %d. The input or output tokens must be reduced in order to run successfully.",
			model, tenantPart(tenant), limit, charge))
	e.Type = "tokens"
	return e
}

// globalTooLargeError is tooLargeError for a global limit (hits: tokens) below one request's
// charge: the limit and its unit are the service's.
func globalTooLargeError(lim *rlsv3.RateLimitResponse_RateLimit, tenant, model string, charge int) *policy.Failure {
	if model != "" {
		model = " for " + model
	}
	per := "per " + strings.ToLower(lim.GetUnit().String())
	if lim.GetUnit() == rlsv3.RateLimitResponse_RateLimit_MINUTE {
		per = "per min (TPM)"
	}
	e := policy.Fail(policy.ClassRateLimited,
		fmt.Sprintf("Request too large%s on tokens %s (global limit)%s: Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.",
			model, per, tenantPart(tenant), lim.GetRequestsPerUnit(), charge))
	e.Type = "tokens"
	return e
}

// authError is OpenAI's 401 invalid_api_key; it never quotes the key.
func authError(h http.Header) *policy.Failure {
	msg := "Incorrect API key provided."
	if h == nil || KeyFromHeader(h) == "" {
		msg = "You didn't provide an API key. Provide it in an Authorization header (Authorization: Bearer YOUR_KEY)."
	}
	return policy.Fail(policy.ClassInvalidAPIKey, msg)
}

// settlement reconciles one request's token charge with its real usage.
type settlement struct {
	l       *Limiter
	b       *bucket
	prompt  int
	charged int
	once    atomic.Bool
}

// maxSettledBuckets bounds what one answer's reported usage can charge beyond its up-front
// charge, in buckets (with the default burst, minutes of the key's budget).
const maxSettledBuckets = 4

func (s *settlement) done(o policy.Outcome) {
	if !s.once.CompareAndSwap(false, true) {
		return
	}
	used := satAdd(max(o.InputTokens, 0), max(o.OutputTokens, 0))
	if used == 0 {
		used = s.prompt // nothing counted (e.g. failed before any token): refund the output part
	}
	now := s.l.clock.Now()
	switch diff := used - s.charged; {
	case diff < 0:
		s.b.tok.give(now, float64(-diff))
		s.l.refunded.Add(uint64(-diff))
	case diff > 0:
		// Into debt if need be: it was used. But at most maxSettledBuckets buckets' worth: a
		// usage report beyond that is a broken or lying server, and must not put the key
		// (with per: route or global, everyone) into debt for ever.
		diff = min(diff, int(maxSettledBuckets*s.b.tok.capacity))
		s.b.tok.take(now, float64(diff))
		s.l.extra.Add(uint64(diff))
	}
}

// Stats are the Limiter's counters since it was built, for metrics.
type Stats struct {
	Admitted       uint64            `json:"admitted"`
	Rejected       map[string]uint64 `json:"rejected"`        // by reason (Reason*)
	GlobalCalls    uint64            `json:"global_calls"`    // calls to the global service
	GlobalFailures uint64            `json:"global_failures"` // calls that failed or timed out (admitted: fail open)
	RefundedTokens uint64            `json:"refunded_tokens"` // given back at reconciliation
	ExtraTokens    uint64            `json:"extra_tokens"`    // charged at reconciliation beyond the up-front charge
	Keys           int               `json:"keys"`            // bucket pairs held
}

// Stats returns the counters.
func (l *Limiter) Stats() Stats {
	s := Stats{
		Admitted:       l.admitted.Load(),
		Rejected:       make(map[string]uint64, len(reasons)),
		GlobalCalls:    l.globalCalls.Load(),
		GlobalFailures: l.globalFailures.Load(),
		RefundedTokens: l.refunded.Load(),
		ExtraTokens:    l.extra.Load(),
	}
	for i, r := range reasons {
		s.Rejected[r] = l.rejected[i].Load()
	}
	l.mu.RLock()
	s.Keys = len(l.buckets)
	l.mu.RUnlock()
	return s
}

// KeyState is the state of one key's buckets, for an admin page.
type KeyState struct {
	Key      string       `json:"key"` // tenant or route name ("" anonymous / global)
	Requests *BucketState `json:"requests,omitempty"`
	Tokens   *BucketState `json:"tokens,omitempty"`
	LastUsed time.Time    `json:"last_used"`
}

// BucketState is one bucket at the time of the snapshot.
type BucketState struct {
	LimitPerMinute float64 `json:"limit_per_minute"`
	Capacity       int     `json:"capacity"`
	Remaining      float64 `json:"remaining"` // negative while in debt
	Reset          string  `json:"reset"`     // time until full, as in the headers
}

// Snapshot returns the state of every key's buckets at the clock's now, sorted by key.
func (l *Limiter) Snapshot() []KeyState {
	now := l.clock.Now()
	l.mu.RLock()
	out := make([]KeyState, 0, len(l.buckets))
	for _, b := range l.buckets {
		ks := KeyState{Key: b.key, LastUsed: time.Unix(0, b.lastUsed.Load())}
		if b.req != nil {
			ks.Requests = bucketState(b.req, b.rpm, now)
		}
		if b.tok != nil {
			ks.Tokens = bucketState(b.tok, b.tpm, now)
		}
		out = append(out, ks)
	}
	l.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func bucketState(tb *tokenBucket, perMinute float64, now time.Time) *BucketState {
	tokens, reset := state(tb, now)
	return &BucketState{LimitPerMinute: perMinute, Capacity: int(tb.capacity), Remaining: tokens, Reset: formatReset(reset)}
}
