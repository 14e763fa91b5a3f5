// Package confidence is the confidence-signal policy (type "confidence"): a
// policy.StreamFilter that reads the log probabilities of streamed answers on their way to
// the client and measures, per token, how sure the model was: the entropy of its top-k
// alternatives and the margin between its two most probable ones (see policy/openai's
// logprobs.go for the estimators and their bounds). It keeps their distributions per route
// and model in fixed buckets, and marks low-confidence spans: runs of at least span_tokens
// tokens in a row that are unsure (entropy above high_entropy or margin below low_margin),
// counted and the last ones listed. It never changes an answer the client asked logprobs for,
// and never fails or cuts one.
//
// Where the logprobs come from: the client asked for them (chat's logprobs, completions'
// logprobs, the Responses API's include "message.output_text.logprobs"), or, for a sample
// share of the streamed chat and completions requests that named neither logprobs nor
// top_logprobs, the policy asks the upstream itself (an Admitter whose Decision.SetFields
// are chat's {"logprobs": true, "top_logprobs": K} or completions' {"logprobs": K}; not a
// completions request with echo, whose logprobs would cover the prompt) and its watcher
// replaces every chunk's non-null choices[i].logprobs by null before the client sees it,
// every other byte kept: the chunk the client gets is the one it would have got without
// them. The share is a hash of the request id, so Admit and WatchStream agree without
// keeping anything per request (a request without an id is sampled only at sample 1).
//
// Non-streamed answers are read whole (a policy.BodyFilter) and, when sampled, stripped the
// same way before they are relayed. Not asked for: the Responses API (logprobs need include, a list the client owns
// and OpenAI's SDKs set for other things, and the response object echoes top_logprobs; so a
// Responses stream is read only when its client asked).
//
// Series: one per route and model. A policy on a route sees that route only; a global one
// the configured routes. Models are bounded: the params' models (names or globs, the first
// that matches names the series), else the first max_models names seen on streams that
// carried logprobs (a model server answers only models it serves, and a name longer than 128
// bytes never gets one); any other model counts under "other". The histograms are fixed
// buckets; the list of recent spans holds the last 32. Memory per watcher is a scanner, a
// strip buffer as large as a chunk and a few words per choice (n ≤ 128).
package confidence

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

func init() { policy.Register("confidence", factory) }

func factory(params json.RawMessage, env policy.Env) (policy.Plugin, error) {
	var p Params
	if err := policy.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	return New(p, env)
}

// OtherModel names the series of the models that have none of their own.
const OtherModel = "other"

// Sources of an answer's logprobs.
const (
	SourceClient  = "client"  // the client asked for them
	SourceSampled = "sampled" // the policy asked, and stripped them
)

// RecentSpans is how many low-confidence spans a policy lists.
const RecentSpans = 32

// maxRequestID bounds the request id a listed span keeps.
const maxRequestID = 128

// Policy is one confidence policy. It is safe for concurrent use and starts no goroutine.
type Policy struct {
	policy.Named
	p     Params
	route string
	salt  string
	clock policy.Clock

	mu     sync.RWMutex
	series map[seriesKey]*series
	seen   map[string]int // routes' model names with a series of their own (no models param), per route

	sampled, stripped atomic.Uint64

	spanMu sync.Mutex
	spans  [RecentSpans]Span
	nSpans int // spans recorded ever (the ring's next slot is nSpans % RecentSpans)
}

type seriesKey struct{ route, model string }

// series is one route and model's counters.
type series struct {
	route, model   string
	answers        [2]atomic.Uint64 // by source: client, sampled
	tokens, noAlts atomic.Uint64
	unsure         atomic.Uint64
	spans, spanned atomic.Uint64 // spans; answers with at least one
	entropy        hist
	margin         hist
	answerEntropy  hist
}

// New builds a policy from p (zero fields take their defaults) after validating it.
func New(p Params, env policy.Env) (*Policy, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.WithDefaults()
	if env.Clock == nil {
		env.Clock = policy.SystemClock{}
	}
	return &Policy{
		Named: env.Named(), p: p, route: env.Route, clock: env.Clock,
		salt:   env.Route + "\x00" + env.Name.Name,
		series: map[seriesKey]*series{}, seen: map[string]int{},
	}, nil
}

// Params returns the policy's params, defaults filled in.
func (p *Policy) Params() Params { return p.p }

// Admit asks the upstream for logprobs when the request is sampled (see the package doc):
// Decision.SetFields. It never rejects or waits.
func (p *Policy) Admit(_ context.Context, r *policy.Request) (policy.Decision, error) {
	if !p.sampledReq(r) {
		return policy.Decision{}, nil
	}
	p.sampled.Add(1)
	k := []byte(strconv.Itoa(p.p.TopLogprobs))
	if r.Kind == openai.KindCompletion {
		return policy.Decision{SetFields: map[string][]byte{"logprobs": k}}, nil
	}
	return policy.Decision{SetFields: map[string][]byte{"logprobs": []byte("true"), "top_logprobs": k}}, nil
}

// sampledReq reports whether the policy asks for r's logprobs: a chat or completions request
// (without echo) that names neither logprobs nor top_logprobs, whose id hashes into the
// sample share.
func (p *Policy) sampledReq(r *policy.Request) bool {
	if p.p.Sample <= 0 || r == nil || r.Request == nil || r.LogprobsNamed {
		return false
	}
	switch r.Kind {
	case openai.KindChat:
	case openai.KindCompletion:
		if r.Echo {
			return false
		}
	default:
		return false
	}
	return sampled(p.salt, r.ID, p.p.Sample)
}

// sampled reports whether id hashes into the share: FNV-1a of salt and id, mixed, as a
// uniform number in [0, 1). Without an id only a share of 1 samples.
func sampled(salt, id string, share float64) bool {
	if share >= 1 {
		return true
	}
	if id == "" {
		return false
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(salt))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(id))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11)/(1<<53) < share
}

// WatchStream watches a stream whose answer carries logprobs: the client asked for them, or
// the policy did (then the watcher strips them). Nil for any other stream.
func (p *Policy) WatchStream(r *policy.Request) policy.StreamWatcher {
	if w := p.watch(r); w != nil {
		return w
	}
	return nil
}

// WatchBody reads a non-streamed answer's logprobs (a policy.BodyFilter) and, when the
// policy asked for them, returns the body without them: every choice's logprobs null, every
// other byte as the model server sent it.
func (p *Policy) WatchBody(r *policy.Request, body []byte) ([]byte, []policy.Class) {
	w := p.watch(r)
	if w == nil {
		return nil, nil
	}
	w.sc.ScanBody(body, w.visit)
	var out []byte
	if w.strip && w.sc.Strippable() {
		out = w.sc.AppendStripped(make([]byte, 0, len(body)), body)
		w.stripped++
	}
	w.End()
	return out, nil
}

// watch is a watcher for r's answer, nil when it carries no logprobs to read.
func (p *Policy) watch(r *policy.Request) *watcher {
	if r == nil || r.Request == nil {
		return nil
	}
	source := 0
	switch {
	case r.Logprobs && (r.Kind == openai.KindChat || r.Kind == openai.KindCompletion || r.Kind == openai.KindResponses):
	case p.sampledReq(r):
		source = 1
	default:
		return nil
	}
	route := p.route
	if route == "" {
		route = r.Route
	}
	w := &watcher{p: p, route: route, model: r.Model, source: source, strip: source == 1, id: r.ID}
	w.visit = w.token
	return w
}

// seriesOf returns the series of route and a model label (modelLabel's), creating it.
func (p *Policy) seriesOf(route, label string) *series {
	k := seriesKey{route, label}
	p.mu.RLock()
	s := p.series[k]
	p.mu.RUnlock()
	if s != nil {
		return s
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s = p.series[k]; s == nil {
		s = &series{route: route, model: label}
		p.series[k] = s
	}
	return s
}

// modelLabel names model's series on route.
func (p *Policy) modelLabel(route, model string) string {
	if model == "" {
		model = "default"
	}
	if len(p.p.Models) > 0 {
		for _, m := range p.p.Models {
			if policy.Glob(m, model) {
				return m
			}
		}
		return OtherModel
	}
	if len(model) > maxModelName || model == OtherModel {
		return OtherModel
	}
	p.mu.RLock()
	_, ok := p.series[seriesKey{route, model}]
	n := p.seen[route]
	p.mu.RUnlock()
	if ok {
		return model
	}
	if n >= p.p.MaxModels {
		return OtherModel
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.series[seriesKey{route, model}]; ok {
		return model
	}
	if p.seen[route] >= p.p.MaxModels {
		return OtherModel
	}
	p.seen[route]++
	p.series[seriesKey{route, model}] = &series{route: route, model: model}
	return model
}

// Span is one low-confidence span: a run of unsure tokens in one choice of an answer.
type Span struct {
	Time      time.Time `json:"time"`
	Route     string    `json:"route"`
	Model     string    `json:"model"` // the series' name
	RequestID string    `json:"request_id,omitempty"`
	Choice    int       `json:"choice"`
	Start     int       `json:"start"`  // the first unsure token's position in the choice (from 0)
	Tokens    int       `json:"tokens"` // tokens in the run
	// MeanEntropy (nats) and MinMargin are over the run's tokens.
	MeanEntropy float64 `json:"mean_entropy"`
	MinMargin   float64 `json:"min_margin"`
	Source      string  `json:"source"`
}

func (p *Policy) record(s Span) {
	p.spanMu.Lock()
	defer p.spanMu.Unlock()
	p.spans[p.nSpans%RecentSpans] = s
	p.nSpans++
}

// SeriesSnapshot is one route and model's distributions and counters.
type SeriesSnapshot struct {
	Route string `json:"route"`
	Model string `json:"model"`
	// Answers counts the answers (choices) that carried logprobs, by source.
	Answers map[string]uint64 `json:"answers"`
	// Tokens counts the tokens with two alternatives or more (those Entropy and Margin
	// hold); TokensWithoutAlternatives the others (top_logprobs 0 or 1).
	Tokens                    uint64 `json:"tokens"`
	TokensWithoutAlternatives uint64 `json:"tokens_without_alternatives"`
	UnsureTokens              uint64 `json:"unsure_tokens"`
	Spans                     uint64 `json:"spans"`
	AnswersWithSpans          uint64 `json:"answers_with_spans"`
	// Entropy and Margin are the tokens' distributions; AnswerEntropy that of the answers'
	// mean entropies.
	Entropy       Histogram `json:"entropy"`
	Margin        Histogram `json:"margin"`
	AnswerEntropy Histogram `json:"answer_entropy"`
}

// Snapshot is what the admin API shows of a policy.
type Snapshot struct {
	Route  string `json:"route"` // the policy's route ("" for a global one)
	Name   string `json:"name"`
	Params Params `json:"params"`
	// Sampled counts the requests the policy asked logprobs for; StrippedEvents the events
	// it stripped them from.
	Sampled        uint64           `json:"sampled"`
	StrippedEvents uint64           `json:"stripped_events"`
	Series         []SeriesSnapshot `json:"series"`
	// RecentSpans are the last RecentSpans low-confidence spans, newest first.
	RecentSpans []Span `json:"recent_spans"`
}

// Snapshot returns the policy's counters, distributions and recent spans, series sorted by
// route and model.
func (p *Policy) Snapshot() Snapshot {
	s := Snapshot{Route: p.route, Name: p.TypedName().Name, Params: p.p,
		Sampled: p.sampled.Load(), StrippedEvents: p.stripped.Load(), Series: []SeriesSnapshot{}, RecentSpans: []Span{}}
	p.mu.RLock()
	all := make([]*series, 0, len(p.series))
	for _, se := range p.series {
		all = append(all, se)
	}
	p.mu.RUnlock()
	slices.SortFunc(all, func(a, b *series) int {
		if a.route != b.route {
			return cmpString(a.route, b.route)
		}
		return cmpString(a.model, b.model)
	})
	for _, se := range all {
		s.Series = append(s.Series, SeriesSnapshot{
			Route: se.route, Model: se.model,
			Answers:                   map[string]uint64{SourceClient: se.answers[0].Load(), SourceSampled: se.answers[1].Load()},
			Tokens:                    se.tokens.Load(),
			TokensWithoutAlternatives: se.noAlts.Load(),
			UnsureTokens:              se.unsure.Load(),
			Spans:                     se.spans.Load(),
			AnswersWithSpans:          se.spanned.Load(),
			Entropy:                   se.entropy.snapshot(EntropyBuckets),
			Margin:                    se.margin.snapshot(MarginBuckets),
			AnswerEntropy:             se.answerEntropy.snapshot(EntropyBuckets),
		})
	}
	p.spanMu.Lock()
	for i := 1; i <= min(p.nSpans, RecentSpans); i++ {
		s.RecentSpans = append(s.RecentSpans, p.spans[(p.nSpans-i)%RecentSpans])
	}
	p.spanMu.Unlock()
	return s
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// watcher reads one attempt's stream.
type watcher struct {
	p      *Policy
	route  string
	model  string
	id     string
	source int
	strip  bool

	sc    openai.LogprobScanner
	visit func(openai.TokenLogprob)
	buf   []byte // the stripped event

	entropy, margin localHist
	noAlts, unsure  uint64
	stripped        uint64
	choices         []choiceRun // by choice index, up to openai.MaxN
	ended           bool
	labelled        string // the series' model name, once needed
}

// label is the name of the watcher's series' model (decided once, when a token needs it).
func (w *watcher) label() string {
	if w.labelled == "" {
		w.labelled = w.p.modelLabel(w.route, w.model)
	}
	return w.labelled
}

// choiceRun is one choice's progress: its tokens so far, its entropy sum (for the answer's
// mean) and the run of unsure tokens it is in.
type choiceRun struct {
	pos        int // tokens seen
	seen       bool
	entSum     float64
	altTokens  int
	spans      int
	run        int // unsure tokens in a row, the last seen so far
	runStart   int // the run's first token's position
	runEntropy float64
	runMin     float64
}

// Event reads the logprobs of one event and, when the policy asked for them, replaces the
// event by its copy without them (Replace stays valid until the next call).
func (w *watcher) Event(ev policy.StreamEvent) policy.StreamAction {
	if ev.Data == nil || ev.IsDone() || w.ended {
		return policy.StreamAction{}
	}
	w.sc.ScanChunk(ev.Data, w.visit)
	if !w.strip || !w.sc.Strippable() {
		return policy.StreamAction{}
	}
	w.buf = w.buf[:0]
	if off := dataOffset(ev.Raw, ev.Data); off >= 0 {
		// One data line (every OpenAI-compatible server's): the event as it came, but for
		// the logprobs.
		w.buf = append(w.buf, ev.Raw[:off]...)
		w.buf = w.sc.AppendStripped(w.buf, ev.Data)
		w.buf = append(w.buf, ev.Raw[off+len(ev.Data):]...)
	} else {
		// Data split over several lines: written again as one.
		if ev.Name != nil {
			w.buf = append(append(append(w.buf, "event: "...), ev.Name...), '\n')
		}
		w.buf = append(w.buf, "data: "...)
		w.buf = w.sc.AppendStripped(w.buf, ev.Data)
		w.buf = append(w.buf, "\n\n"...)
	}
	w.stripped++
	return policy.StreamAction{Replace: w.buf}
}

// dataOffset is where data lies in raw as the value of a "data:" line (an event of one data
// line), or -1.
func dataOffset(raw, data []byte) int {
	for from := 0; from < len(raw); {
		i := bytes.Index(raw[from:], data)
		if i < 0 {
			return -1
		}
		off := from + i
		line := raw[:off]
		if j := bytes.LastIndexAny(line, "\r\n"); j >= 0 {
			line = line[j+1:]
		}
		if string(line) == "data:" || string(line) == "data: " {
			return off
		}
		from = off + 1
	}
	return -1
}

// token takes one token into account.
func (w *watcher) token(t openai.TokenLogprob) {
	if t.Choice < 0 || t.Choice >= openai.MaxN {
		return
	}
	if t.Choice >= len(w.choices) {
		w.choices = slices.Grow(w.choices, t.Choice+1-len(w.choices))[:t.Choice+1]
	}
	c := &w.choices[t.Choice]
	c.seen = true
	pos := c.pos
	c.pos++
	if !t.HasAlts() {
		w.noAlts++
		return // neither sure nor unsure: it neither extends nor ends a run
	}
	w.entropy.add(EntropyBuckets, t.Entropy)
	w.margin.add(MarginBuckets, t.Margin)
	c.entSum += t.Entropy
	c.altTokens++
	if t.Entropy > w.p.p.HighEntropy || t.Margin < w.p.p.LowMargin {
		w.unsure++
		if c.run == 0 {
			c.runStart, c.runEntropy, c.runMin = pos, 0, math.Inf(1)
		}
		c.run++
		c.runEntropy += t.Entropy
		c.runMin = min(c.runMin, t.Margin)
		return
	}
	w.closeRun(t.Choice, c)
}

// closeRun ends choice i's run of unsure tokens, recording it when it is long enough.
func (w *watcher) closeRun(i int, c *choiceRun) {
	if c.run >= w.p.p.SpanTokens {
		c.spans++
		id := w.id
		if len(id) > maxRequestID {
			id = id[:maxRequestID]
		}
		w.p.record(Span{
			Time: w.p.clock.Now(), Route: w.route, Model: w.label(), RequestID: id,
			Choice: i, Start: c.runStart, Tokens: c.run, MeanEntropy: c.runEntropy / float64(c.run), MinMargin: c.runMin,
			Source: []string{SourceClient, SourceSampled}[w.source],
		})
	}
	c.run = 0
}

// End adds what the stream carried to its series. It raises no flag: low confidence is
// measured, not a failure.
func (w *watcher) End() []policy.Class {
	if w.ended {
		return nil
	}
	w.ended = true
	var answers, spans, spanned uint64
	var ans localHist
	for i := range w.choices {
		c := &w.choices[i]
		if !c.seen {
			continue
		}
		w.closeRun(i, c)
		answers++
		spans += uint64(c.spans)
		if c.spans > 0 {
			spanned++
		}
		if c.altTokens > 0 {
			ans.add(EntropyBuckets, c.entSum/float64(c.altTokens))
		}
	}
	if w.stripped > 0 {
		w.p.stripped.Add(w.stripped)
	}
	if answers == 0 {
		return nil // no logprobs came: nothing to count
	}
	s := w.p.seriesOf(w.route, w.label())
	s.answers[w.source].Add(answers)
	s.tokens.Add(w.entropy.n)
	s.noAlts.Add(w.noAlts)
	s.unsure.Add(w.unsure)
	s.spans.Add(spans)
	s.spanned.Add(spanned)
	s.entropy.merge(&w.entropy)
	s.margin.merge(&w.margin)
	s.answerEntropy.merge(&ans)
	return nil
}

// String names the policy in logs.
func (p *Policy) String() string {
	return fmt.Sprintf("confidence(route=%q, sample=%v)", p.route, p.p.Sample)
}
