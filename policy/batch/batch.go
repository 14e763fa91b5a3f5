package batch

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// Send sends one request body upstream (the route's plan: pick, attempt, retry) and returns
// the complete answer. The gateway provides it per call. It is called from the batcher's own
// goroutines, possibly after its caller's Do has returned, with a context that is not the
// caller's (it ends when every caller of the batch has gone, or the batcher closes): it must
// not write to any client, only return the answer.
type Send func(ctx context.Context, body []byte) (status int, header http.Header, respBody []byte, err error)

// ErrClosed is returned by Do for a caller whose batch was dropped because the batcher closed
// before it could be sent (it is never returned when Close drains normally).
var ErrClosed = errors.New("batch: batcher closed")

// Batcher merges small requests with the same key into one upstream request and splits the
// answer back. Create it with New; stop it with Close.
type Batcher struct {
	policy.Named // its type and name: a policy.Plugin
	p            Params
	clock        policy.Clock
	itemCap      int

	mu     sync.Mutex
	keys   map[string]*keyState // keys with an open, queued or in-flight batch
	window time.Duration
	closed bool

	wg sync.WaitGroup // timer callbacks and send goroutines

	st stats
}

type caller struct {
	ctx  context.Context
	req  *openai.Request
	p    *parsed
	send Send
	done chan result // cap 1: one answer, never blocks the sender
	gone atomic.Bool // went away after its batch was sent
}

type result struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// keyState is one key's batches: at most one open (taking requests), the full ones waiting
// for a slot, and the number in flight.
type keyState struct {
	key      string
	open     *batch
	queued   []*batch
	inflight int
}

type batch struct {
	ks      *keyState
	due     bool // the window ended; sent as soon as a slot frees
	callers []*caller
	items   int
	tokens  int
	timer   *time.Timer
	sent    bool // guarded by Batcher.mu

	live   atomic.Int32 // callers still waiting, once sent
	cancel context.CancelFunc
}

// New builds a Batcher (defaults applied to zero Params fields; every problem reported). A
// nil clock means the system clock. The clock measures batch latency; windows are real timers.
func New(p Params, clock policy.Clock) (*Batcher, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.WithDefaults()
	if clock == nil {
		clock = policy.SystemClock{}
	}
	return &Batcher{
		p: p, clock: clock,
		itemCap: min(p.MaxItems, p.BackendMaxInputs),
		keys:    map[string]*keyState{},
		window:  p.InitialWindow.D(),
	}, nil
}

// Params returns the parameters in use, defaults applied.
func (b *Batcher) Params() Params { return b.p }

// Batchable reports whether Do may merge r with others: embeddings, and with
// merge_completions non-streamed completions. Chat completions never are. Do sends other
// requests alone, so calling Do for them is harmless but pointless.
func (b *Batcher) Batchable(r *openai.Request) bool {
	switch r.Kind {
	case openai.KindEmbedding:
		return true
	case openai.KindCompletion:
		return b.p.MergeCompletions && !r.Stream
	}
	return false
}

// Do sends r upstream, merged with other callers' requests of the same key that arrive within
// the window, and returns r's own answer: status, headers and body as the upstream would have
// answered r alone. It blocks until then or until ctx ends (then it returns ctx.Err(); if the
// batch was not sent yet, r's inputs are taken out of it). A request that cannot be merged
// (not Batchable, over a cap on its own, or after Close) is sent alone, unchanged, with ctx.
func (b *Batcher) Do(ctx context.Context, r *openai.Request, tenant string, send Send) (int, http.Header, []byte, error) {
	b.st.requests.Add(1)
	if err := ctx.Err(); err != nil {
		return 0, nil, nil, err
	}
	if !b.Batchable(r) {
		return b.alone(ctx, r, send)
	}
	p, err := parse(r, tenant)
	if err != nil || len(p.items) > b.itemCap || p.tokens > b.p.MaxTokens {
		return b.alone(ctx, r, send)
	}
	c := &caller{ctx: ctx, req: r, p: p, send: send, done: make(chan result, 1)}

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return b.alone(ctx, r, send)
	}
	ks := b.keys[p.key]
	if ks == nil {
		ks = &keyState{key: p.key}
		b.keys[p.key] = ks
	}
	bt := ks.open
	if bt != nil && (bt.items+len(p.items) > b.itemCap || bt.tokens+p.tokens > b.p.MaxTokens) {
		b.closeLocked(bt) // full: send it (or queue it), start another
		bt = nil
	}
	if bt == nil {
		bt = &batch{ks: ks}
		ks.open = bt
		b.wg.Add(1)
		bt.timer = time.AfterFunc(b.window, func() {
			defer b.wg.Done()
			b.mu.Lock()
			defer b.mu.Unlock()
			if ks.open == bt {
				bt.due = true
				b.dispatchLocked(ks)
			}
		})
	}
	bt.callers = append(bt.callers, c)
	bt.items += len(p.items)
	bt.tokens += p.tokens
	if bt.items >= b.itemCap || bt.tokens >= b.p.MaxTokens {
		b.st.earlyFlushes.Add(1)
		b.closeLocked(bt)
	}
	b.mu.Unlock()

	select {
	case res := <-c.done:
		return res.status, res.header, res.body, res.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	if !bt.sent {
		b.removeLocked(bt, c)
		b.mu.Unlock()
		b.st.cancelledBefore.Add(1)
		return 0, nil, nil, ctx.Err()
	}
	b.mu.Unlock()
	if c.gone.CompareAndSwap(false, true) {
		b.st.cancelledAfter.Add(1)
		if bt.live.Add(-1) == 0 {
			bt.cancel() // nobody is left to answer: stop the upstream request
		}
	}
	return 0, nil, nil, ctx.Err()
}

func (b *Batcher) alone(ctx context.Context, r *openai.Request, send Send) (int, http.Header, []byte, error) {
	b.st.alone.Add(1)
	return send(ctx, r.Body)
}

// removeLocked takes a caller that went away out of an unsent batch.
func (b *Batcher) removeLocked(bt *batch, c *caller) {
	for i, x := range bt.callers {
		if x == c {
			bt.callers = append(bt.callers[:i], bt.callers[i+1:]...)
			bt.items -= len(c.p.items)
			bt.tokens -= c.p.tokens
			break
		}
	}
	if len(bt.callers) > 0 {
		return
	}
	// Nothing left to send.
	bt.sent = true
	b.stopTimerLocked(bt)
	ks := bt.ks
	if ks.open == bt {
		ks.open = nil
	}
	if i := slices.Index(ks.queued, bt); i >= 0 {
		ks.queued = slices.Delete(ks.queued, i, i+1)
	}
	b.tidyLocked(ks)
}

// tidyLocked forgets a key with nothing open, queued or in flight.
func (b *Batcher) tidyLocked(ks *keyState) {
	if ks.open == nil && len(ks.queued) == 0 && ks.inflight == 0 && b.keys[ks.key] == ks {
		delete(b.keys, ks.key)
	}
}

// closeLocked closes the open batch bt to new callers (it is full) and sends it when a slot
// is free, in order after the full batches already waiting.
func (b *Batcher) closeLocked(bt *batch) {
	ks := bt.ks
	b.stopTimerLocked(bt)
	if ks.open == bt {
		ks.open = nil
	}
	ks.queued = append(ks.queued, bt)
	b.dispatchLocked(ks)
}

// dispatchLocked sends the key's waiting batches while slots are free: full ones first, then
// the open one if its window has ended. After Close every slot is free.
func (b *Batcher) dispatchLocked(ks *keyState) {
	for b.closed || ks.inflight < b.p.MaxInFlight {
		var bt *batch
		switch {
		case len(ks.queued) > 0:
			bt = ks.queued[0]
			ks.queued = ks.queued[1:]
		case ks.open != nil && (ks.open.due || b.closed):
			bt = ks.open
			ks.open = nil
			b.stopTimerLocked(bt)
		default:
			b.tidyLocked(ks)
			return
		}
		b.sendLocked(bt)
	}
}

func (b *Batcher) stopTimerLocked(bt *batch) {
	if bt.timer != nil && bt.timer.Stop() {
		b.wg.Done() // the callback will not run
	}
	bt.timer = nil
}

// sendLocked sends bt on a goroutine of its own, in one of its key's slots.
func (b *Batcher) sendLocked(bt *batch) {
	bt.sent = true
	if len(bt.callers) == 0 {
		return
	}
	bt.ks.inflight++
	// The batch outlives any one caller: it keeps the first caller's values (trace context)
	// but not its cancellation, and ends when every caller has gone.
	var ctx context.Context
	ctx, bt.cancel = context.WithCancel(context.WithoutCancel(bt.callers[0].ctx))
	bt.live.Store(int32(len(bt.callers)))
	b.st.batches.Add(1)
	b.st.merged.Add(int64(len(bt.callers)))
	b.st.items.Add(int64(bt.items))
	b.st.sizes[bucket(bt.items)].Add(1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.sendGroup(ctx, bt.callers, true)
		bt.cancel()
		b.mu.Lock()
		bt.ks.inflight--
		b.dispatchLocked(bt.ks)
		b.mu.Unlock()
	}()
}

// sendGroup sends a group of callers as one request and delivers the answers. A 4xx other
// than 408 and 429 (which say nothing about the inputs) is retried by halves, so one bad input
// fails only its own caller; a 5xx, a transport error or any other answer goes to everyone.
// Callers that went away are left out; a group of one sends its caller's own body.
func (b *Batcher) sendGroup(ctx context.Context, cs []*caller, first bool) {
	live := cs[:0:0]
	for _, c := range cs {
		if !c.gone.Load() {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return
	}
	if len(live) == 1 && !first {
		c := live[0]
		st, h, body, err := c.send(ctx, c.req.Body)
		deliver(c, result{st, h, body, err})
		return
	}
	body := live[0].req.Body
	if len(live) > 1 {
		var err error
		if body, err = mergeBody(live); err != nil {
			b.toAll(live, result{err: err})
			return
		}
	}
	t0 := b.clock.Now()
	status, h, rb, err := live[0].send(ctx, body)
	if first && err == nil && status < 300 {
		b.observe(b.clock.Now().Sub(t0))
	}
	switch {
	case len(live) == 1 || err != nil || status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests:
		b.toAll(live, result{status, h, rb, err})
	case status >= 400:
		b.st.splits.Add(1)
		// The halves run side by side; both end before the batch's context is released.
		mid := len(live) / 2
		left := make(chan struct{})
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer close(left)
			b.sendGroup(ctx, live[:mid], false)
		}()
		b.sendGroup(ctx, live[mid:], false)
		<-left
	case status >= 200 && status < 300:
		parts, serr := split(live, rb)
		if serr != nil {
			e := policy.Fail(policy.ClassBatchSplit, serr.Error()).OpenAI()
			b.toAll(live, result{status: e.Status, header: http.Header{"Content-Type": {"application/json"}}, body: e.Body()})
			return
		}
		for i, c := range live {
			deliver(c, result{status, h, parts[i], nil})
		}
	default:
		b.toAll(live, result{status, h, rb, err})
	}
}

func (b *Batcher) toAll(cs []*caller, r result) {
	for _, c := range cs {
		deliver(c, r)
	}
}

// deliver hands a caller its answer with headers of its own (the body length is its own).
func deliver(c *caller, r result) {
	if r.header != nil {
		r.header = r.header.Clone()
		r.header.Del("Content-Length")
	}
	select {
	case c.done <- r:
	default: // answered already; cannot happen, never block
	}
}

// observe adapts the window to one batch's latency (AIMD).
func (b *Batcher) observe(lat time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	next, grew := aimd(b.window, lat, b.p)
	b.window = next
	if grew {
		b.st.grows.Add(1)
	} else {
		b.st.shrinks.Add(1)
	}
}

// aimd is the window after a batch of latency lat: plus Increase while lat is within
// TargetLatency, times Decrease when it is not, kept within [MinWindow, MaxWindow].
func aimd(w, lat time.Duration, p Params) (next time.Duration, grew bool) {
	if lat <= p.TargetLatency.D() {
		return min(w+p.Increase.D(), p.MaxWindow.D()), true
	}
	return max(time.Duration(float64(w)*p.Decrease), p.MinWindow.D()), false
}

// Window returns the current batching window.
func (b *Batcher) Window() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.window
}

// Close sends the batches still open or waiting at once, waits for every batch in flight to be answered
// (bounded by the send function's own time-outs), and stops every goroutine and timer of the
// batcher. Later Do calls send their requests alone. Close is safe to call more than once.
func (b *Batcher) Close() error {
	b.mu.Lock()
	b.closed = true
	for _, ks := range b.keys {
		b.dispatchLocked(ks)
	}
	b.mu.Unlock()
	b.wg.Wait()
	return nil
}
