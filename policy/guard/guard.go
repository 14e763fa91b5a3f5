// Package guard is the prompt-explosion guard: a policy.Admitter that rejects requests whose
// size or shape would starve everyone else on the model server, isolates the tenants that
// send them with per-(route, tenant) circuit breakers, and degrades a route in stages when
// explosions or load pile up. It is registered as policy type "guard".
// It offers the gateway its breakers and level as its admin view (policy.Viewer), its counters
// as metrics (policy.MetricsReporter, view.go) and a tenant's breaker reset (policy.Resetter).
//
// Signals, checked in Admit on the parsed request, cheapest first; a value above its limit
// fails (at the limit passes):
//
//	signal              param                     status code                     default
//	structural depth    max_depth                 400    prompt_too_deep          64
//	messages            max_messages              400    too_many_messages        off
//	prompt tokens       max_prompt_tokens         413    prompt_too_large         off
//	tokens + max_tokens context_window(s)         400    context_length_exceeded  advertised, known models
//	surge               surge_factor × p95        413    prompt_surge             3 × the sender's p95, after 100,
//	                                                                              never at 32768 tokens or less
//	repetition          max_repetition            400    prompt_repetitive        off
//
// Depth is openai.Request.Depth: JSON counts wherever it is in the content, in prose, in
// code fences, in tool results and tool-call arguments, by its nesting (see
// openai.ParseRequest for the rule). The default of 64 never refuses ordinary traffic (real
// API responses pasted as tool results are 8 to 20 deep; code, markdown and logs a handful)
// and refuses nesting built to blow up templates and parsers, which give up not far above it.
//
// The messages name the measured value and the limit, e.g. "prompt is 40213 tokens, the
// route's limit is 32000"; a request over the model's context window gets vLLM's words ("This
// model's maximum context length is 8192 tokens. However, you requested 9000 tokens (…)"),
// which the SDKs and LangChain recognise. The window is the params' per-model one, else what
// the model server advertises (policy.Request.ContextWindow), else the params' default, else
// the built-in table. A tenant whose breaker is open gets 503 tenant_breaker_open with
// Retry-After; a tenant shed at degradation level 2 gets 503 load_shed.
//
// Token counts: the fast estimate (openai.Request.PromptTokens, which errs high) decides,
// except when it is near a size limit (from 0.65× to 1.54× the limit with the default
// exact_margin of 0.35; see Params.ExactMargin for the measured error): then the prompt's text is
// extracted from the body once and counted with the model's tiktoken encoding, and that count
// decides every size signal. At most exact_concurrency exact counts run at once; when none is
// free the estimate decides (see exact.go for why encoders are shared).
//
// Surge: a prompt is measured against the baseline of its sender on the route: its tenant's;
// for an anonymous request, its client's when policy.Request.ClientKnown says the client
// address names one client, else the one baseline all anonymous clients share (behind a load
// balancer every client has the same address, which must not be mistaken for one client's).
// A baseline is a sliding window (surge_window in surge_buckets buckets) of fixed-size
// log-binned histograms of prompt tokens (surge.go). Only requests this guard admitted (not
// rerouted) that ended in success feed it, so a burst of explosions cannot raise its own
// baseline. The signal applies once the window holds surge_min_requests prompts, and never
// to a prompt of surge_floor_tokens or fewer: a flood of tiny prompts (into a sender's own
// baseline, or into the shared anonymous one, which anyone can feed) lowers the limit to the
// floor at worst, above ordinary prompt sizes. A sender's first prompts create no baseline
// until one succeeds, and at most surge_max_baselines are kept (the least recently used is
// dropped), whatever clients send.
//
// Breakers: one per (route, tenant). An anonymous request gets one per client address when
// the address names one client (breaker.anonymous "auto", the default: ClientKnown; "client":
// always), else none: its bad requests are refused one by one, and nobody is cut off for
// what another client behind the same address sent.
//
// Runaway answers: an admitted request whose answer fell into a loop (the runaway policy cut
// it, Outcome.ErrorClass runaway_generation, or only flagged it, Outcome.Flags) counts against
// its tenant's breaker as an explosion does: the tenant whose prompts send the model into
// loops is isolated like one that sends oversized prompts. It feeds no baseline.
//
// Settling: every admitted request must be settled once, through Decision.Done (a second call
// is a no-op; the gateway calls it for every admitted request, rejected later or not, as the
// policy contract says). Settling releases the in-flight count,
// reports to the tenant's breaker and feeds the baseline. A request never settled leaves its
// breaker with a request in flight (a half-open breaker waits for its probes).
//
// Priorities (for shedding at level 2) come from SetPriorities, which the gateway fills from
// its tenants config; a tenant without one has priority 0. They are not read from a request
// header: a client could raise its own priority.
//
// Everything the guard times itself (surge window, degradation) uses env.Clock; the breakers
// use real time (see breakers.go). The guard starts no goroutine.
package guard

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// The failure classes of the guard's rejections (their statuses are in policy's class table).
const (
	CodePromptTooLarge  = policy.ClassPromptTooLarge
	CodeContextLength   = policy.ClassContextLength
	CodePromptTooDeep   = policy.ClassPromptTooDeep
	CodeTooManyMessages = policy.ClassTooManyMessages
	CodeRepetitive      = policy.ClassPromptRepetitive
	CodeSurge           = policy.ClassPromptSurge
	CodeBreakerOpen     = policy.ClassTenantBreakerOpen
	CodeLoadShed        = policy.ClassLoadShed
)

func init() { policy.Register("guard", factory) }

func factory(params json.RawMessage, env policy.Env) (policy.Plugin, error) {
	var p Params
	if err := policy.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	return New(p, env)
}

// Guard is the prompt-explosion guard of one route. It is safe for concurrent use.
type Guard struct {
	policy.Named        // its type and name: a policy.Plugin
	p            Params // with defaults
	clock        policy.Clock
	route        string

	on struct{ promptTokens, contextWindow, depth, messages, repetition, surge, breaker bool }

	ctxWindows []pattern[int]
	windows    windowMemo // ctxWindows' and the built-in table's answers for recent models
	encodings  []pattern[string]
	exactSem   chan struct{}

	baseMu sync.RWMutex
	bases  map[baseKey]*baseline

	breakers *breakerSet
	trips    atomic.Uint64

	deg        degrader
	inflight   atomic.Int64
	priorities atomic.Pointer[map[string]int]

	admitted, rerouted, capped, exact, exactSkipped, runaways atomic.Uint64
	rejected                                                  [len(codesArr)]atomic.Uint64
}

var codesArr = [8]policy.Class{CodePromptTooLarge, CodeContextLength, CodePromptTooDeep, CodeTooManyMessages,
	CodeRepetitive, CodeSurge, CodeBreakerOpen, CodeLoadShed}

// New builds a Guard from p (zero fields take their defaults) after validating it whole.
func New(p Params, env policy.Env) (*Guard, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.WithDefaults()
	if env.Clock == nil {
		env.Clock = policy.SystemClock{}
	}
	g := &Guard{Named: env.Named(), p: p, clock: env.Clock, route: env.Route, bases: map[baseKey]*baseline{}}
	g.windows.seed = maphash.MakeSeed()
	g.on.promptTokens = p.MaxPromptTokens > 0 && !p.disabled(SignalPromptTokens)
	g.on.contextWindow = !p.disabled(SignalContextWindow)
	g.on.depth = p.MaxDepth > 0 && !p.disabled(SignalDepth)
	g.on.messages = p.MaxMessages > 0 && !p.disabled(SignalMessages)
	g.on.repetition = p.MaxRepetition > 0 && !p.disabled(SignalRepetition)
	g.on.surge = !p.disabled(SignalSurge)
	g.on.breaker = !p.disabled(SignalBreaker)
	for _, k := range sortedKeys(p.ContextWindows) {
		g.ctxWindows = append(g.ctxWindows, pattern[int]{k, p.ContextWindows[k]})
	}
	for _, k := range sortedKeys(p.Encodings) {
		g.encodings = append(g.encodings, pattern[string]{k, p.Encodings[k]})
	}
	g.exactSem = make(chan struct{}, p.ExactConcurrency)
	g.breakers = newBreakerSet(p.Breaker, func() { g.trips.Add(1) })
	g.deg = degrader{
		tripsPerMin: p.Degrade.TripsPerMinute,
		saturation:  p.Degrade.SaturationInflight,
		coolDown:    p.Degrade.CoolDown.D(),
	}
	return g, nil
}

// Default builds the guard a route gets without guard config: depth limit 64, surge over 3 ×
// the sender's rolling p95 once 100 of its prompts are in the window and never at 32768
// tokens or less, the model's context window when known, and the breakers with their
// defaults (anonymous requests get one per client only when the client is known).
func Default(env policy.Env) (*Guard, error) { return New(Params{}, env) }

// Params returns the guard's params, defaults filled in.
func (g *Guard) Params() Params { return g.p }

// Clusters is the cluster the guard reroutes oversized prompts to (degrade.long_context_cluster),
// checked by the gateway against the config's (a policy.ClusterUser).
func (g *Guard) Clusters() map[string]string {
	if c := g.p.Degrade.LongContextCluster; c != "" {
		return map[string]string{"degrade.long_context_cluster": c}
	}
	return nil
}

// SetPriorities sets the tenants' priorities used for shedding at level 2 (higher is more
// important; tenants not in m have 0). It is safe to call while the guard serves.
func (g *Guard) SetPriorities(m map[string]int) {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	g.priorities.Store(&c)
}

func (g *Guard) priority(tenant string) int {
	if m := g.priorities.Load(); m != nil {
		return (*m)[tenant]
	}
	return 0
}

// WarmUp builds the tiktoken encoders the guard may use, so the first exact count does not
// pay for it (a few hundred ms each).
func (g *Guard) WarmUp() error {
	names := map[string]bool{defaultEncoding: true}
	for _, p := range g.encodings {
		names[p.v] = true
	}
	for _, p := range builtinEncodings {
		names[p.v] = true
	}
	for n := range names {
		if _, err := encoder(n); err != nil {
			return err
		}
	}
	return nil
}

// ContextWindow returns the context window the guard uses for model (0: unknown) when the
// model server advertises none.
func (g *Guard) ContextWindow(model string) int { return g.contextWindow(model, 0) }

// contextWindow is the context window of model: the params' per-model windows, else what the
// model server advertises (advertised > 0: vLLM's max_model_len on /v1/models), else the
// params' window for every model, else the built-in table of well-known models.
func (g *Guard) contextWindow(model string, advertised int) int {
	w := g.windows.get(model, g.ctxWindows)
	if w.cfgOK {
		return w.cfg
	}
	if advertised > 0 {
		return advertised
	}
	if g.p.ContextWindow > 0 {
		return g.p.ContextWindow
	}
	return w.builtin
}

// windowMemo keeps the context-window lookups of recent models (each lookup tries every glob
// of the params and of the built-in table in turn, a few thousand instructions a request):
// 16 slots by the model's hash, a slot taken over by the next model hashing there. A model
// name longer than maxMemoModel is looked up every time (a client's name is not kept).
type windowMemo struct {
	seed  maphash.Seed
	slots [16]atomic.Pointer[windowHit]
}

// windowHit is one model's answers: the params' glob (cfg, cfgOK) and the built-in table's.
type windowHit struct {
	model   string
	cfg     int
	cfgOK   bool
	builtin int
}

const maxMemoModel = 256

func (m *windowMemo) get(model string, cfg []pattern[int]) windowHit {
	var slot *atomic.Pointer[windowHit]
	if len(model) <= maxMemoModel {
		slot = &m.slots[maphash.String(m.seed, model)%uint64(len(m.slots))]
		if h := slot.Load(); h != nil && h.model == model {
			return *h
		}
	}
	h := windowHit{model: model}
	h.cfg, h.cfgOK = lookup(cfg, model)
	h.builtin, _ = lookup(builtinContextWindows, model)
	if slot != nil {
		h.model = strings.Clone(model) // not a piece of a request's body
		slot.Store(&h)
	}
	return h
}

// contextLengthError is the answer to a request over the model's context window, in vLLM's
// words (OpenAI's SDKs, LangChain and LlamaIndex recognise "maximum context length" and the
// code context_length_exceeded): 400 invalid_request_error, param the prompt's field.
func contextLengthError(r *policy.Request, window, tokens, maxTokens int) *policy.Failure {
	var msg string
	if maxTokens > 0 {
		msg = fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			window, tokens+maxTokens, tokens, maxTokens)
	} else {
		msg = fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
			window, tokens)
	}
	e := policy.Fail(CodeContextLength, msg)
	switch r.Kind {
	case openai.KindChat:
		e.Param = "messages"
	case openai.KindCompletion:
		e.Param = "prompt"
	case openai.KindEmbedding, openai.KindResponses:
		e.Param = "input"
	}
	return e
}

// Encoding returns the tiktoken encoding the guard uses for model.
func (g *Guard) Encoding(model string) string {
	if v, ok := lookup(g.encodings, model); ok {
		return v
	}
	if v, ok := lookup(builtinEncodings, model); ok {
		return v
	}
	return defaultEncoding
}

// baseKey names a surge baseline: the route and the sender (see senderOf).
type baseKey struct {
	route string
	sender
}

// sender is whose prompts a baseline holds: a tenant's, a known client's (by address), or,
// both empty, every anonymous client's.
type sender struct{ tenant, client string }

// baseline returns the baseline of k, nil if there is none; with create, it makes one,
// dropping the least recently used when the guard holds surge_max_baselines.
func (g *Guard) baseline(k baseKey, now time.Time, create bool) *baseline {
	g.baseMu.RLock()
	b := g.bases[k]
	g.baseMu.RUnlock()
	if b == nil && create {
		g.baseMu.Lock()
		if b = g.bases[k]; b == nil {
			if len(g.bases) >= g.p.SurgeMaxBaselines {
				g.evictBaselineLocked()
			}
			b = newBaseline(g.p.SurgeWindow.D(), g.p.SurgeBuckets)
			g.bases[k] = b
		}
		g.baseMu.Unlock()
	}
	if b != nil {
		b.lastUsed.Store(now.UnixNano())
	}
	return b
}

// evictBaselineLocked drops the least recently used baseline. It is O(baselines) and runs
// only when the set is full, when a new sender's request has succeeded.
func (g *Guard) evictBaselineLocked() {
	var victim baseKey
	oldest := int64(0)
	first := true
	for k, b := range g.bases {
		if at := b.lastUsed.Load(); first || at < oldest {
			victim, oldest, first = k, at, false
		}
	}
	if !first {
		g.bases[victim].evicted.Store(true)
		delete(g.bases, victim)
	}
}

// senderOf is whose baseline a request's prompt is measured against: the tenant's; for an
// anonymous request, the client's when its address names one client (ClientKnown), else
// the one every anonymous client shares.
func senderOf(r *policy.Request) sender {
	switch {
	case r.Tenant != "":
		return sender{tenant: r.Tenant}
	case r.ClientKnown && r.Client != "":
		return sender{client: r.Client}
	}
	return sender{}
}

// name names the sender's baseline in a rejection.
func (s sender) name() string {
	switch {
	case s.tenant != "":
		return "this tenant's"
	case s.client != "":
		return "this client's"
	}
	return "anonymous clients'"
}

func (g *Guard) routeOf(r *policy.Request) string {
	if r.Route != "" {
		return r.Route
	}
	return g.route
}

func (g *Guard) level(now time.Time) int {
	return g.deg.eval(now, g.trips.Load(), g.inflight.Load())
}

// Level returns the route's degradation level (0, 1 or 2) now.
func (g *Guard) Level() int { return g.level(g.clock.Now()) }

// Admit checks the request against the tenant's breaker, the degradation level and the
// signals. A rejection is in Decision.Reject (the error is always nil).
func (g *Guard) Admit(_ context.Context, r *policy.Request) (policy.Decision, error) {
	if r == nil || r.Request == nil {
		return policy.Decision{}, nil
	}
	switch r.Kind {
	case openai.KindChat, openai.KindCompletion, openai.KindEmbedding, openai.KindResponses:
	default:
		return policy.Decision{}, nil
	}
	now := g.clock.Now()
	route := g.routeOf(r)
	level := g.level(now)

	var done func(error)
	if id, ok := g.breakerIdentity(r); g.on.breaker && ok {
		br := g.breakers.get(route, id, now)
		d, err := br.cb.Allow()
		if err != nil {
			return g.reject(breakerError(br, err, g.p.Breaker.OpenFor.D())), nil
		}
		done = d
	}
	if level >= 2 {
		if pr := g.priority(r.Tenant); pr < g.p.Degrade.ShedBelowPriority {
			if done != nil {
				done(errExcluded)
			}
			e := policy.Fail(CodeLoadShed, fmt.Sprintf("the route is saturated (degradation level 2): requests of priority below %d are shed, this tenant's priority is %d", g.p.Degrade.ShedBelowPriority, pr))
			e.RetryAfter = time.Second
			return g.reject(e), nil
		}
	}

	maxTokens := r.MaxTokens
	capTo := 0
	if level >= 1 && g.p.Degrade.Level1MaxTokens > 0 && (maxTokens == 0 || maxTokens > g.p.Degrade.Level1MaxTokens) {
		capTo = g.p.Degrade.Level1MaxTokens
		maxTokens = capTo
	}
	m := measurement{}
	defer m.release()
	bk := baseKey{route, senderOf(r)}
	rej, tokens := g.check(r, bk, level, maxTokens, now, &m)
	reroute := ""
	if rej != nil && level >= 1 && g.p.Degrade.LongContextCluster != "" &&
		(rej.Class == CodePromptTooLarge || rej.Class == CodeSurge) {
		// Rerouted instead of rejected; still an explosion for the tenant's breaker. A shape
		// signal checked after the size signals may still reject it.
		reroute = g.p.Degrade.LongContextCluster
		rej = g.checkRepetition(r, &m)
	}
	if rej != nil || reroute != "" {
		if done != nil {
			done(errExplosion)
			done = nil
		}
	}
	if rej != nil {
		return g.reject(rej), nil
	}

	g.admitted.Add(1)
	g.inflight.Add(1)
	t := &ticket{g: g, done: done, base: bk, b: m.base, tokens: tokens, feed: reroute == ""}
	dec := policy.Decision{Done: t.settle, Reroute: reroute, CapMaxTokens: capTo}
	if reroute != "" {
		g.rerouted.Add(1)
	}
	if capTo > 0 {
		g.capped.Add(1)
	}
	return dec, nil
}

// breakerIdentity is whom a request's breaker isolates, ok false when it gets none: the
// tenant; for an anonymous request (breaker.anonymous), its client address when that names
// one client ("auto": ClientKnown; "client": always), else nobody: a breaker keyed by an
// address that many clients share (a load balancer's, a sidecar's) would let one of them
// cut off all the others.
func (g *Guard) breakerIdentity(r *policy.Request) (string, bool) {
	if r.Tenant != "" {
		return r.Tenant, true
	}
	if r.Client == "" {
		return "", false
	}
	switch g.p.Breaker.Anonymous {
	case AnonymousClient:
		return "client:" + r.Client, true
	case AnonymousAuto:
		if r.ClientKnown {
			return "client:" + r.Client, true
		}
	}
	return "", false
}

func (g *Guard) reject(e *policy.Failure) policy.Decision {
	for i, c := range codesArr {
		if c == e.Class {
			g.rejected[i].Add(1)
		}
	}
	return policy.Decision{Reject: e}
}

func breakerError(br *breaker, err error, openFor time.Duration) *policy.Failure {
	var e *policy.Failure
	if err == gobreaker.ErrTooManyRequests {
		e = policy.Fail(CodeBreakerOpen, "this tenant's breaker for the route is half-open and its probe requests are in flight; retry shortly")
		e.RetryAfter = time.Second
		return e
	}
	ra := br.retryAfter(openFor)
	e = policy.Fail(CodeBreakerOpen, fmt.Sprintf("this tenant's breaker for the route is open after repeated oversized or malformed prompts; it lets requests through again in %s", ra.Round(time.Second)))
	e.RetryAfter = ra
	return e
}

// measurement holds what Admit computed about a request's text, reused between signals.
type measurement struct {
	pt        *promptText
	extracted bool
	base      *baseline // the sender's baseline, when check found one
}

var textPool = sync.Pool{New: func() any { return new(promptText) }}

func (m *measurement) text(r *policy.Request) *promptText {
	if !m.extracted {
		m.extracted = true
		m.pt = textPool.Get().(*promptText)
		m.pt.segs, m.pt.tokenIDs = m.pt.segs[:0], 0
		extractText(r.Kind, r.Body, m.pt)
	}
	return m.pt
}

func (m *measurement) release() {
	if m.pt != nil {
		clear(m.pt.segs) // drop the references to the body
		m.pt.segs = m.pt.segs[:0]
		if cap(m.pt.segs) <= 4096 {
			textPool.Put(m.pt)
		}
		m.pt = nil
	}
}

// check runs the shape and size signals, then repetition. It returns the first failure (size
// failures before repetition) and the prompt tokens it settled on (exact or estimate).
func (g *Guard) check(r *policy.Request, bk baseKey, level, maxTokens int, now time.Time, m *measurement) (*policy.Failure, int) {
	p := &g.p
	tokens := r.PromptTokens
	if g.on.depth && r.Depth > p.MaxDepth {
		return policy.Fail(CodePromptTooDeep,
			fmt.Sprintf("message content is nested %d levels deep, the route's limit is %d", r.Depth, p.MaxDepth)), tokens
	}
	if g.on.messages && r.Messages > p.MaxMessages {
		return policy.Fail(CodeTooManyMessages,
			fmt.Sprintf("request has %d messages, the route's limit is %d", r.Messages, p.MaxMessages)), tokens
	}

	// Size limits on the prompt's tokens.
	limPrompt, limWindow, limSurge := 0, 0, 0
	window := 0
	if g.on.promptTokens {
		limPrompt = p.MaxPromptTokens
	}
	if g.on.contextWindow {
		if window = g.contextWindow(r.Model, r.ContextWindow); window > 0 {
			limWindow = window - maxTokens
			if limWindow <= 0 {
				return contextLengthError(r, window, tokens, maxTokens), tokens
			}
		}
	}
	var p95 int
	factor := p.SurgeFactor
	if level >= 1 {
		factor = min(factor, p.Degrade.Level1SurgeFactor)
	}
	if g.on.surge {
		if b := g.baseline(bk, now, false); b != nil {
			m.base = b
			var n int
			if p95, n = b.p95(now); n >= p.SurgeMinRequests && p95 > 0 {
				limSurge = max(int(factor*float64(p95)), p.SurgeFloorTokens)
			}
		}
	}
	if near(tokens, limPrompt, p.ExactMargin) || near(tokens, limWindow, p.ExactMargin) || near(tokens, limSurge, p.ExactMargin) {
		select {
		case g.exactSem <- struct{}{}:
			tk, err := encoder(g.Encoding(r.Model))
			if err == nil {
				tokens = exactCount(tk, m.text(r), r.Messages)
				g.exact.Add(1)
			}
			<-g.exactSem
		default:
			g.exactSkipped.Add(1)
		}
	}
	switch {
	case limPrompt > 0 && tokens > limPrompt:
		return policy.Fail(CodePromptTooLarge,
			fmt.Sprintf("prompt is %d tokens, the route's limit is %d", tokens, limPrompt)), tokens
	case limWindow > 0 && tokens > limWindow:
		return contextLengthError(r, window, tokens, maxTokens), tokens
	case limSurge > 0 && tokens > limSurge:
		return policy.Fail(CodeSurge,
			fmt.Sprintf("prompt is %d tokens, the surge limit is %d (%g × the p95 of %s recent prompts on the route, %d tokens, and never below %d)",
				tokens, limSurge, factor, bk.name(), p95, p.SurgeFloorTokens)), tokens
	}
	return g.checkRepetition(r, m), tokens
}

func (g *Guard) checkRepetition(r *policy.Request, m *measurement) *policy.Failure {
	if !g.on.repetition {
		return nil
	}
	p := &g.p
	rep := repetition(m.text(r).segs, p.RepetitionNgram, p.RepetitionMinWords, p.RepetitionSampleBytes)
	if rep > p.MaxRepetition {
		return policy.Fail(CodeRepetitive,
			fmt.Sprintf("%.0f%% of the prompt's %d-word sequences are repeats, the route's limit is %.0f%%", 100*rep, p.RepetitionNgram, 100*p.MaxRepetition))
	}
	return nil
}

// near reports whether an estimate of tokens is close enough to limit (> 0) to count
// exactly: between (1-margin) × limit and limit / (1-margin), a band symmetric in ratio,
// since the estimate's error is a ratio.
func near(tokens, limit int, margin float64) bool {
	if limit <= 0 || margin <= 0 {
		return false
	}
	t, l := float64(tokens), float64(limit)
	return t >= (1-margin)*l && t <= l/(1-margin)
}

// ticket is an admitted request until it is settled.
type ticket struct {
	g       *Guard
	done    func(error)
	base    baseKey   // the baseline its prompt feeds
	b       *baseline // that baseline as the admission found it (nil: none yet)
	tokens  int
	feed    bool
	settled atomic.Bool
}

// settle is the request's Decision.Done. Only the first call counts.
func (t *ticket) settle(o policy.Outcome) {
	if !t.settled.CompareAndSwap(false, true) {
		return
	}
	g := t.g
	g.inflight.Add(-1)
	ok := o.Status >= 200 && o.Status < 300 && o.ErrorClass == ""
	runaway := isRunaway(o)
	if runaway {
		g.runaways.Add(1)
	}
	if t.done != nil {
		switch {
		case runaway:
			t.done(errRunaway)
		case ok:
			t.done(nil)
		default:
			t.done(errExcluded)
		}
	}
	now := g.clock.Now()
	if ok && !runaway && t.feed && g.on.surge {
		// The baseline the admission found, unless it was dropped since (the set was full):
		// no second lookup of the set for most requests.
		b := t.b
		if b != nil && !b.evicted.Load() {
			b.lastUsed.Store(now.UnixNano())
		} else {
			b = g.baseline(t.base, now, true)
		}
		b.add(t.tokens, now)
	}
	g.level(now)
}

// isRunaway reports whether an answer fell into a loop: the runaway policy cut it
// (ErrorClass) or flagged it (Flags).
func isRunaway(o policy.Outcome) bool {
	return o.ErrorClass == policy.ClassRunaway || slices.Contains(o.Flags, policy.ClassRunaway)
}

// Stats are the guard's counters since it was built.
type Stats struct {
	Admitted     uint64                  // requests admitted (rerouted ones included)
	Rejected     map[policy.Class]uint64 // rejections by code (every code present, 0 included)
	Rerouted     uint64                  // oversized prompts sent to the long-context cluster
	Capped       uint64                  // requests whose max_tokens was capped
	ExactCounts  uint64                  // exact (tiktoken) counts made
	ExactSkipped uint64                  // exact counts skipped because all slots were busy
	InFlight     int64                   // admitted requests not yet settled
	Level        int                     // degradation level now
	Trips        uint64                  // times a breaker of the guard opened
	Runaways     uint64                  // admitted requests whose answer fell into a loop (cut or flagged by the runaway policy)
}

// Stats returns the counters (ReportMetrics exports them).
func (g *Guard) Stats() Stats {
	s := Stats{
		Admitted: g.admitted.Load(), Rerouted: g.rerouted.Load(), Capped: g.capped.Load(),
		ExactCounts: g.exact.Load(), ExactSkipped: g.exactSkipped.Load(), InFlight: g.inflight.Load(),
		Level: g.Level(), Trips: g.trips.Load(), Runaways: g.runaways.Load(), Rejected: make(map[policy.Class]uint64, len(codesArr)),
	}
	for i, c := range codesArr {
		s.Rejected[c] = g.rejected[i].Load()
	}
	return s
}

// BreakerInfo describes one breaker, for the admin view (GET /admin/breakers).
type BreakerInfo struct {
	Route      string        `json:"route"`
	Tenant     string        `json:"tenant"`
	State      string        `json:"state"` // closed, half-open, open
	Requests   uint32        `json:"requests"`
	Successes  uint32        `json:"successes"`
	Failures   uint32        `json:"failures"`
	Excluded   uint32        `json:"excluded"`
	Trips      uint64        `json:"trips"`
	OpenedAt   time.Time     `json:"opened_at,omitzero"`   // when it last opened (real time)
	RetryAfter time.Duration `json:"retry_after,omitzero"` // while open: until probes are let through
}

// Snapshot is the guard's state: its admin view (GET /admin/breakers lists every guard's).
type Snapshot struct {
	Route    string        `json:"route"`
	Level    int           `json:"level"`
	InFlight int64         `json:"in_flight"`
	Breakers []BreakerInfo `json:"breakers"`
}

// Snapshot lists every breaker (sorted by route, then tenant) and the level.
func (g *Guard) Snapshot() Snapshot {
	s := Snapshot{Route: g.route, Level: g.Level(), InFlight: g.inflight.Load(), Breakers: []BreakerInfo{}}
	for _, b := range g.breakers.list() {
		st := b.cb.State()
		c := b.cb.Counts()
		bi := BreakerInfo{
			Route: b.key.route, Tenant: b.key.tenant, State: st.String(),
			Requests: c.Requests, Successes: c.TotalSuccesses, Failures: c.TotalFailures, Excluded: c.TotalExclusions,
			Trips: b.trips.Load(),
		}
		if at := b.openedAt.Load(); at != 0 {
			bi.OpenedAt = time.Unix(0, at)
		}
		if st == gobreaker.StateOpen {
			bi.RetryAfter = b.retryAfter(g.p.Breaker.OpenFor.D())
		}
		s.Breakers = append(s.Breakers, bi)
	}
	return s
}

// ResetTenant drops the breakers of tenant ("" : every tenant); the tenant's next request
// starts with a closed breaker. It returns how many were dropped (a policy.Resetter: POST
// /admin/breakers/reset).
func (g *Guard) ResetTenant(tenant string) int { return g.breakers.reset(tenant, tenant == "") }

// String describes the guard for logs.
func (g *Guard) String() string {
	var on []string
	for _, x := range []struct {
		n  string
		on bool
	}{{SignalDepth, g.on.depth}, {SignalMessages, g.on.messages}, {SignalPromptTokens, g.on.promptTokens},
		{SignalContextWindow, g.on.contextWindow}, {SignalSurge, g.on.surge}, {SignalRepetition, g.on.repetition},
		{SignalBreaker, g.on.breaker}} {
		if x.on {
			on = append(on, x.n)
		}
	}
	return "guard(" + strings.Join(on, ",") + ")"
}
