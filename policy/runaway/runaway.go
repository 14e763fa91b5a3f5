// Package runaway is the runaway-generation breaker: a policy.StreamFilter that watches a
// streamed answer as it goes to the client and finds degenerate repetition, the same n-gram or
// paragraph generated again and again, which keeps a sequence on the GPU until max_tokens. It
// cuts the stream with a clean finish (the upstream request is cancelled, so the model server
// frees the sequence), or only flags it, by policy. It is registered as policy type "runaway";
// a route gets it by listing it among its policies (it is not a default).
//
// Every text of a stream is watched on its own, each by one Detector (detect.go): per choice
// (n > 1, several prompts), the text the model writes (content, reasoning and refusal, in the
// order they stream) and the arguments of its tool calls. Chat and completions chunks and the
// Responses API's events are read by openai.ScanDeltas, in place.
//
// On a loop, with action cut, the watcher ends the stream at the event that completed it (that
// event is not relayed) with a tail in the stream's own words:
//
//	chat         a final chunk for each choice not yet finished, {"id","object":
//	             "chat.completion.chunk","created","model","choices":[{"index":i,"delta":{},
//	             "logprobs":null,"finish_reason":"length"}]} (id, created and model the
//	             stream's, from its first chunks), then the comment
//	             ": sluice: runaway generation cut after N tokens", then data: [DONE]
//	completions  the same with {"index":i,"text":"","logprobs":null,"finish_reason":"length"}
//	             in "object":"text_completion" chunks
//	Responses    the comment, then the terminal event response.incomplete, numbered after the
//	             last event, its response {"id","object":"response","created_at","status":
//	             "incomplete","error":null,"incomplete_details":{"reason":"max_output_tokens"},
//	             "model","output":[],"usage":{…}}: what a client gets when max_output_tokens
//	             stops an answer, which the SDKs handle (the output's text is in the deltas
//	             already relayed; the usage is the gateway's estimate: the prompt's estimate,
//	             and the tokens the detector counted)
//
// N is the tokens the detector counted in the stream's texts (see detect.go for what a token
// is). finish_reason "length" is what a client already handles for an answer stopped short,
// and what the answer would have ended with at max_tokens. The Outcome's ErrorClass is
// runaway_generation. With action flag the answer runs on; End returns the flag
// runaway_generation, which reaches the Observers in Outcome.Flags (the guard's tenant
// breaker counts it as it counts an explosion).
//
// Counts: streams watched, and loops cut and flagged per tenant and model, for the metrics
// and the admin view (Stats, Snapshot). The label sets are bounded: tenants are the configured
// ones (SetPriorities gives them; another name counts as "other", an anonymous request as
// "anonymous"), models are the ones the route's model servers name in their chunks, at most
// maxModels of them (then "other"). The last maxRecent loops are kept for the admin view
// (request id, tenant, model, choice, period, tokens; never the text).
//
// Cost: a detector is about 4 KiB at the default max_period, taken from a pool when a text
// starts and given back at End; the watcher reads each event's data once and feeds each byte
// of text to a detector once (benchmarks in bench_test.go).
package runaway

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

func init() { policy.Register("runaway", factory) }

func factory(params json.RawMessage, env policy.Env) (policy.Plugin, error) {
	var p Params
	if err := policy.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	return New(p, env)
}

const (
	maxModels   = 32   // model labels kept; more are "other"
	maxSeries   = 1024 // (tenant, model) pairs counted; more count as ("other", "other")
	maxRecent   = 32   // loops kept for the admin view
	maxTail     = 64   // choices a tail closes
	maxMetaLen  = 256  // a longer id or model is not kept
	maxScratch  = 64 << 10
	labelOther  = "other"
	labelAnon   = "anonymous"
	chanText    = 0
	chanArgs    = 1
	numChannels = 2
)

// Policy is the runaway breaker of one route. It is safe for concurrent use; each stream's
// watcher is used by one goroutine.
type Policy struct {
	policy.Named
	p      Params // with defaults
	th     Thresholds
	route  string
	clock  policy.Clock
	log    *slog.Logger
	cut    bool
	fields [numChannels]bool
	pool   sync.Pool // *Detector

	tenants atomic.Pointer[map[string]struct{}]
	streams atomic.Uint64

	mu     sync.Mutex
	counts map[seriesKey]*Count
	models map[string]struct{}
	recent [maxRecent]Detection
	nrec   int // loops recorded (the ring holds the last maxRecent)
}

type seriesKey struct{ tenant, model string }

// New builds the policy from p after validating it whole.
func New(p Params, env policy.Env) (*Policy, error) {
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
	pol := &Policy{
		Named: env.Named(), p: p, th: p.thresholds(), route: env.Route, clock: env.Clock, log: env.Logger,
		cut: p.Action == ActionCut, counts: map[seriesKey]*Count{}, models: map[string]struct{}{},
	}
	pol.fields[chanText] = slices.Contains(p.Fields, FieldText)
	pol.fields[chanArgs] = slices.Contains(p.Fields, FieldArguments)
	th := pol.th
	pol.pool.New = func() any { return NewDetector(th) }
	return pol, nil
}

// Params returns the policy's params, defaults filled in.
func (p *Policy) Params() Params { return p.p }

// SetPriorities takes the configured tenants (a policy.PrioritySetter): they are the tenant
// labels of the counts.
func (p *Policy) SetPriorities(byTenant map[string]int) {
	m := make(map[string]struct{}, len(byTenant))
	for t := range byTenant {
		m[t] = struct{}{}
	}
	p.tenants.Store(&m)
}

// WatchStream starts watching one attempt's stream (a policy.StreamFilter): streamed chat,
// completions and Responses answers; nil for anything else.
func (p *Policy) WatchStream(r *policy.Request) policy.StreamWatcher {
	if r == nil || r.Request == nil || !r.Stream {
		return nil
	}
	switch r.Kind {
	case openai.KindChat, openai.KindCompletion, openai.KindResponses:
	default:
		return nil
	}
	p.streams.Add(1)
	w := &watcher{p: p, kind: r.Kind, reqID: r.ID, tenant: r.Tenant, reqModel: r.Model,
		prompt: r.PromptTokens, created: -1, seq: -1}
	w.choices = 1
	if r.Kind != openai.KindResponses {
		w.choices = max(r.N, 1)
		if r.Kind == openai.KindCompletion {
			w.choices *= max(r.Inputs, 1)
		}
	}
	w.choices = min(w.choices, maxTail)
	w.yield = w.delta
	return w
}

// watcher watches one stream.
type watcher struct {
	p        *Policy
	kind     openai.Kind
	reqID    string
	tenant   string
	reqModel string
	prompt   int

	dets     []*Detector // by choice × numChannels + channel, made as texts start
	yield    func(openai.TextDelta) bool
	scratch  []byte
	choices  int    // the choices a tail closes: the request's, or the highest index seen + 1
	finished uint64 // choices (below 64) whose finish_reason was relayed
	evFinish uint64 // those of the event being read (relayed unless it is cut)

	id, model string // the stream's, from its first events
	created   int64
	seq       int // Responses: the highest sequence_number relayed

	hit     *Detector // the detector that found a loop
	hitCh   int
	hitIdx  int
	done    bool // a loop was found (cut or flagged): nothing more to read
	flagged bool
	ended   bool
}

// Event reads one event (a policy.StreamWatcher).
func (w *watcher) Event(ev policy.StreamEvent) policy.StreamAction {
	if w.done || w.ended || ev.Data == nil || ev.IsDone() {
		return policy.StreamAction{}
	}
	w.evFinish = 0
	m := openai.ScanDeltas(ev.Data, w.yield)
	if w.id == "" && len(m.ID) > 0 && len(m.ID) <= maxMetaLen {
		w.id = string(decodeMeta(m.ID, m.IDEsc))
	}
	if w.model == "" && len(m.Model) > 0 && len(m.Model) <= maxMetaLen {
		w.model = string(decodeMeta(m.Model, m.ModelEsc))
	}
	if w.created < 0 && m.Created >= 0 {
		w.created = m.Created
	}
	if w.hit == nil { // the event is relayed (a cut one is not)
		w.seq = max(w.seq, m.Seq)
		w.finished |= w.evFinish
		return policy.StreamAction{}
	}
	w.done = true
	loop, _ := w.hit.Found()
	tokens := w.tokens()
	d := w.p.record(w, loop, tokens)
	if !w.p.cut {
		w.flagged = true
		return policy.StreamAction{}
	}
	return policy.StreamAction{Cut: &policy.StreamCut{
		Class: policy.ClassRunaway,
		Tail:  w.tail(tokens),
		Reason: fmt.Sprintf("runaway generation: choice %d's %s repeats a block of %d tokens (%d tokens of repetition), cut after %d tokens",
			d.Choice, d.Field, d.Period, loop.At-loop.Start+1, tokens),
	}}
}

func decodeMeta(raw []byte, esc bool) []byte {
	if !esc {
		return raw
	}
	return openai.TextDelta{Raw: raw, Esc: true}.AppendText(nil)
}

// delta feeds one text delta to its detector; false (stop the scan) once one found a loop.
func (w *watcher) delta(d openai.TextDelta) bool {
	if d.Choice < 0 {
		return true
	}
	if d.Field == openai.FieldFinish {
		if d.Choice < 64 {
			w.evFinish |= 1 << d.Choice
		}
		w.choices = max(w.choices, min(d.Choice+1, maxTail))
		return true
	}
	ch := chanText
	if d.Field == openai.FieldArguments {
		ch = chanArgs
	}
	if !w.p.fields[ch] || d.Choice >= w.p.p.MaxChoices {
		return true
	}
	w.choices = max(w.choices, min(d.Choice+1, maxTail))
	i := d.Choice*numChannels + ch
	if i >= len(w.dets) {
		w.dets = append(w.dets, make([]*Detector, i+1-len(w.dets))...)
	}
	det := w.dets[i]
	if det == nil {
		det = w.p.pool.Get().(*Detector)
		det.Reset()
		w.dets[i] = det
	}
	var found bool
	if d.Esc {
		w.scratch = d.AppendText(w.scratch[:0])
		found = det.Feed(w.scratch)
	} else {
		found = det.Feed(d.Raw)
	}
	if found {
		w.hit, w.hitCh, w.hitIdx = det, ch, d.Choice
		return false
	}
	return true
}

// tokens is the tokens the detectors counted in the stream.
func (w *watcher) tokens() int {
	n := 0
	for _, d := range w.dets {
		if d != nil {
			n += d.Tokens()
		}
	}
	return n
}

// End ends the watch (a policy.StreamWatcher): the detectors go back to the pool, and a loop
// that was only flagged is the flag runaway_generation.
func (w *watcher) End() []policy.Class {
	if w.ended {
		return nil
	}
	w.ended = true
	for i, d := range w.dets {
		if d != nil {
			w.p.pool.Put(d)
			w.dets[i] = nil
		}
	}
	w.hit = nil
	if cap(w.scratch) > maxScratch {
		w.scratch = nil
	}
	if w.flagged {
		return []policy.Class{policy.ClassRunaway}
	}
	return nil
}

// tail is what the client gets in place of the rest of a cut stream.
func (w *watcher) tail(tokens int) []byte {
	comment := ": sluice: runaway generation cut after " + strconv.Itoa(tokens) + " tokens\n\n"
	var b []byte
	switch w.kind {
	case openai.KindResponses:
		b = append(b, comment...)
		b = append(b, "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"sequence_number\":"...)
		b = strconv.AppendInt(b, int64(w.seq+1), 10)
		b = append(b, `,"response":{"id":`...)
		b = openai.AppendString(b, w.id)
		b = append(b, `,"object":"response","created_at":`...)
		b = strconv.AppendInt(b, w.createdOrNow(), 10)
		b = append(b, `,"status":"incomplete","error":null,"incomplete_details":{"reason":"max_output_tokens"},"model":`...)
		b = openai.AppendString(b, w.modelName())
		b = append(b, `,"output":[],"usage":{"input_tokens":`...)
		b = strconv.AppendInt(b, int64(w.prompt), 10)
		b = append(b, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
		b = strconv.AppendInt(b, int64(tokens), 10)
		b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		b = strconv.AppendInt(b, int64(w.prompt+tokens), 10)
		b = append(b, "}}}\n\n"...)
		return b
	case openai.KindCompletion:
		for i := range w.choices {
			if i < 64 && w.finished&(1<<i) != 0 {
				continue
			}
			b = w.chunkHead(b, "text_completion")
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"text":"","logprobs":null,"finish_reason":"length"}]}`+"\n\n"...)
		}
	default:
		for i := range w.choices {
			if i < 64 && w.finished&(1<<i) != 0 {
				continue
			}
			b = w.chunkHead(b, "chat.completion.chunk")
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"delta":{},"logprobs":null,"finish_reason":"length"}]}`+"\n\n"...)
		}
	}
	b = append(b, comment...)
	return append(b, openai.DoneEvent...)
}

// chunkHead appends a chunk's start, up to its choice's index value.
func (w *watcher) chunkHead(b []byte, object string) []byte {
	b = append(b, `data: {"id":`...)
	b = openai.AppendString(b, w.id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, w.createdOrNow(), 10)
	b = append(b, `,"model":`...)
	b = openai.AppendString(b, w.modelName())
	return append(b, `,"choices":[{"index":`...)
}

func (w *watcher) createdOrNow() int64 {
	if w.created >= 0 {
		return w.created
	}
	return w.p.clock.Now().Unix()
}

// modelName is the stream's model, else the request's.
func (w *watcher) modelName() string {
	if w.model != "" {
		return w.model
	}
	return w.reqModel
}

// Detection is one loop found, for the admin view.
type Detection struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Tenant    string    `json:"tenant"`
	Model     string    `json:"model"`
	Choice    int       `json:"choice"`
	Field     string    `json:"field"`  // text or arguments
	Period    int       `json:"period"` // tokens of the repeated block
	Repeated  int       `json:"repeated_tokens"`
	Tokens    int       `json:"tokens"` // tokens of the stream when it was found
	Action    string    `json:"action"` // cut or flag
}

// Count is the loops found for one tenant and model.
type Count struct {
	Tenant  string `json:"tenant"`
	Model   string `json:"model"`
	Cut     uint64 `json:"cut"`
	Flagged uint64 `json:"flagged"`
}

// record counts a loop and keeps it among the recent ones.
func (p *Policy) record(w *watcher, loop Loop, tokens int) Detection {
	d := Detection{
		Time: p.clock.Now(), RequestID: w.reqID, Choice: w.hitIdx, Field: FieldText,
		Period: loop.Period, Repeated: loop.At - loop.Start + 1, Tokens: tokens, Action: p.p.Action,
	}
	if w.hitCh == chanArgs {
		d.Field = FieldArguments
	}
	if len(d.RequestID) > maxMetaLen {
		d.RequestID = d.RequestID[:maxMetaLen]
	}
	p.mu.Lock()
	d.Tenant, d.Model = p.tenantLabel(w.tenant), p.modelLabelLocked(w.modelName())
	k := seriesKey{d.Tenant, d.Model}
	c := p.counts[k]
	if c == nil {
		if len(p.counts) >= maxSeries-1 { // the last one is (other, other)
			k = seriesKey{labelOther, labelOther}
			c = p.counts[k]
		}
		if c == nil {
			c = &Count{Tenant: k.tenant, Model: k.model}
			p.counts[k] = c
		}
	}
	if p.cut {
		c.Cut++
	} else {
		c.Flagged++
	}
	p.recent[p.nrec%maxRecent] = d
	p.nrec++
	p.mu.Unlock()
	p.log.Info("runaway generation", "request_id", d.RequestID, "tenant", d.Tenant, "model", d.Model,
		"choice", d.Choice, "field", d.Field, "period", d.Period, "repeated_tokens", d.Repeated, "tokens", d.Tokens, "action", d.Action)
	return d
}

func (p *Policy) tenantLabel(t string) string {
	if t == "" {
		return labelAnon
	}
	if m := p.tenants.Load(); m != nil {
		if _, ok := (*m)[t]; !ok {
			return labelOther
		}
	}
	return t
}

func (p *Policy) modelLabelLocked(m string) string {
	if m == "" {
		return labelOther
	}
	if _, ok := p.models[m]; ok {
		return m
	}
	if len(p.models) >= maxModels {
		return labelOther
	}
	p.models[m] = struct{}{}
	return m
}

// Stats are the policy's counters since it was built.
type Stats struct {
	Streams uint64  `json:"streams"` // streams watched
	Cut     uint64  `json:"cut"`     // loops cut
	Flagged uint64  `json:"flagged"` // loops flagged
	Counts  []Count `json:"counts"`  // by tenant and model, sorted
}

// Stats returns the counters (the gateway exports them as metrics).
func (p *Policy) Stats() Stats {
	s := Stats{Streams: p.streams.Load(), Counts: []Count{}}
	p.mu.Lock()
	for _, c := range p.counts {
		s.Counts = append(s.Counts, *c)
		s.Cut += c.Cut
		s.Flagged += c.Flagged
	}
	p.mu.Unlock()
	slices.SortFunc(s.Counts, func(a, b Count) int {
		if a.Tenant != b.Tenant {
			if a.Tenant < b.Tenant {
				return -1
			}
			return 1
		}
		if a.Model < b.Model {
			return -1
		}
		if a.Model > b.Model {
			return 1
		}
		return 0
	})
	return s
}

// Snapshot is the policy's state, for the admin API.
type Snapshot struct {
	Route  string      `json:"route"`
	Name   string      `json:"name"`
	Params Params      `json:"params"`
	Stats  Stats       `json:"stats"`
	Recent []Detection `json:"recent"` // the last loops found, newest first
}

// Snapshot returns the counters, the params and the recent loops.
func (p *Policy) Snapshot() Snapshot {
	s := Snapshot{Route: p.route, Name: p.TypedName().Name, Params: p.p, Stats: p.Stats(), Recent: []Detection{}}
	p.mu.Lock()
	for i := p.nrec - 1; i >= 0 && i >= p.nrec-maxRecent; i-- {
		s.Recent = append(s.Recent, p.recent[i%maxRecent])
	}
	p.mu.Unlock()
	return s
}

// String describes the policy for logs.
func (p *Policy) String() string {
	return fmt.Sprintf("runaway(%s, period %d..%d, repeats %d, min_words %d)", p.p.Action, p.p.MinPeriod, p.p.MaxPeriod, p.p.Repeats, p.p.MinWords)
}
