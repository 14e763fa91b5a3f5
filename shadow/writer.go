package shadow

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Writer bounds. A Writer holds what it could not write yet up to WriterConfig.MaxBytes,
// counting each record as its texts plus writerRecordOverhead.
const (
	DefaultWriterBytes   = 64 << 20
	writerRecordOverhead = 1 << 10
	defaultWriteTimeout  = 5 * time.Second
	defaultMinBackoff    = 100 * time.Millisecond
	defaultMaxBackoff    = 5 * time.Second
)

// The kinds of record a Writer writes, as its counters name them.
const (
	KindPair    = "pair"
	KindVerdict = "verdict"
	KindRate    = "rate"
	KindPrune   = "prune"
)

var writerKinds = []string{KindPair, KindVerdict, KindRate, KindPrune}

// The kinds of writeOp, indexes of writerKinds.
const (
	opPair = iota
	opVerdict
	opRate
	opPrune
	opKinds // how many
)

// WriterConfig configures a Writer.
type WriterConfig struct {
	// MaxBytes bounds the records held while the store cannot take them
	// (DefaultWriterBytes when ≤ 0); a record that does not fit is dropped and counted.
	MaxBytes int64
	// Timeout bounds one write or one attempt to open the store (5 s when ≤ 0).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before trying again after the store could
	// not be reached, doubled from one to the other (100 ms and 5 s when ≤ 0).
	MinBackoff, MaxBackoff time.Duration
	// Log gets a line when the store becomes unreachable and when it is reachable again
	// (nil: none).
	Log *slog.Logger
	// OnOpen is called once, on the writer's goroutine, when the store has opened.
	OnOpen func(*Store)
}

func (c WriterConfig) withDefaults() WriterConfig {
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultWriterBytes
	}
	if c.Timeout <= 0 {
		c.Timeout = defaultWriteTimeout
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = defaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = defaultMaxBackoff
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Writer writes pairs, verdicts and rates to a store from one goroutine of its own, so that
// whoever records them never waits for the database: Add… only queues (or drops, counted,
// when MaxBytes are held) and returns. The writer opens the store itself, and tries again,
// with back-off, while the store cannot be reached (at start, or when a shared database
// goes away): the records wait in order and are written once it answers. A record the
// store refuses for good (not a connection problem) is counted as failed and not tried
// again. Close stops it. Writes are at least once: a write whose answer was lost is tried
// again.
type Writer struct {
	open func(context.Context) (*Store, error)
	cfg  WriterConfig
	st   atomic.Pointer[Store]

	mu      sync.Mutex
	limit   int64 // MaxBytes, as SetMaxBytes last set it
	queue   []*writeOp
	head    int                 // queue[head:] waits
	pending map[string]*writeOp // the rate and prune ops waiting, by key: a newer one replaces it
	bytes   int64
	closed  bool
	emptied chan struct{} // closed (and replaced) when the queue empties

	wake     chan struct{}
	stopping chan struct{} // closed by Close: write what is held, then stop
	hard     context.Context
	abandon  context.CancelFunc // Close's deadline passed: stop now
	done     chan struct{}

	written, failed, retries atomic.Int64
	dropped                  [opKinds]atomic.Int64 // by kind, in the order of writerKinds
	connected                atomic.Bool
	state                    atomic.Pointer[writerState]
}

type writerState struct {
	lastErr   string
	lastErrAt time.Time
	downSince time.Time
}

type writeOp struct {
	kind    int // opPair…, the index of its name in writerKinds
	key     string
	size    int64
	pair    PairRecord
	session string // the pair's session id, hashed with the store's key when written
	verdict VerdictRecord
	rate    RateRecord
	route   string
	keep    int
}

// StartWriter starts a writer of the store that open opens (called again, after a back-off,
// until it succeeds). The caller owns the writer and must Close it.
func StartWriter(open func(context.Context) (*Store, error), cfg WriterConfig) *Writer {
	hard, abandon := context.WithCancel(context.Background())
	cfg = cfg.withDefaults()
	w := &Writer{open: open, cfg: cfg, limit: cfg.MaxBytes, pending: map[string]*writeOp{}, emptied: make(chan struct{}),
		wake: make(chan struct{}, 1), stopping: make(chan struct{}), hard: hard, abandon: abandon, done: make(chan struct{})}
	w.state.Store(&writerState{})
	go w.run()
	return w
}

// Store returns the store once the writer has opened it (nil before).
func (w *Writer) Store() *Store { return w.st.Load() }

// AddPair queues a pair; false when it was dropped (the writer is full or closed).
func (w *Writer) AddPair(r PairRecord) bool { return w.AddPairSession(r, "") }

// AddPairSession queues a pair whose session id is session: the pair is stored with its
// keyed hash (Store.SessionHash, in the store's key), which needs the store open. False
// when it was dropped.
func (w *Writer) AddPairSession(r PairRecord, session string) bool {
	return w.add(&writeOp{kind: opPair, size: pairSize(r) + int64(len(session)), pair: r, session: session})
}

// SetMaxBytes changes the bound of what the writer holds (≤ 0: DefaultWriterBytes); what
// it holds past a lower bound stays, and is written.
func (w *Writer) SetMaxBytes(n int64) {
	if n <= 0 {
		n = DefaultWriterBytes
	}
	w.mu.Lock()
	w.limit = n
	w.mu.Unlock()
}

// AddVerdict queues a verdict; false when it was dropped.
func (w *Writer) AddVerdict(v VerdictRecord) bool {
	size := int64(writerRecordOverhead + len(v.Verdict.Reason) + len(v.Action) + 512*len(v.Verdict.Evidence))
	return w.add(&writeOp{kind: opVerdict, size: size, verdict: v})
}

// AddRate queues the instance's latest rates of a route; a newer one replaces one still
// waiting. False when it was dropped.
func (w *Writer) AddRate(r RateRecord) bool {
	return w.add(&writeOp{kind: opRate, key: "rate\x00" + r.Route + "\x00" + r.CandidateID, size: writerRecordOverhead, rate: r})
}

// Prune queues a Store.Prune of route keeping keep (one waiting for the route is
// replaced). False when it was dropped.
func (w *Writer) Prune(route string, keep int) bool {
	return w.add(&writeOp{kind: opPrune, key: "prune\x00" + route, size: writerRecordOverhead, route: route, keep: keep})
}

func pairSize(r PairRecord) int64 {
	n := writerRecordOverhead + len(r.Request) + len(r.RequestID) + len(r.Route) + len(r.CandidateID)
	for _, a := range []*Answer{&r.Primary, &r.Candidate, r.Baseline, r.Replica} {
		if a == nil {
			continue
		}
		n += len(a.Text) + len(a.ErrorClass) + len(a.FinishReason)
		for _, c := range a.ToolCalls {
			n += len(c.Name) + len(c.Arguments) + 32
		}
	}
	for _, s := range []*SideResult{&r.Result.Primary, &r.Result.Candidate, r.Result.Baseline} {
		if s == nil {
			continue
		}
		for _, p := range s.Problems {
			n += len(p) + 16
		}
	}
	for _, p := range r.Result.Notes {
		n += len(p) + 16
	}
	return int64(n)
}

func (w *Writer) add(op *writeOp) bool {
	w.mu.Lock()
	if op.key != "" {
		if old := w.pending[op.key]; old != nil && !w.closed {
			old.rate, old.keep = op.rate, op.keep // still waiting: the newer one is what counts
			w.mu.Unlock()
			return true
		}
	}
	if w.closed || w.bytes+op.size > w.limit {
		w.mu.Unlock()
		w.dropped[op.kind].Add(1)
		return false
	}
	w.queue = append(w.queue, op)
	w.bytes += op.size
	if op.key != "" {
		w.pending[op.key] = op
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

// peek returns the oldest op waiting, or nil.
func (w *Writer) peek() *writeOp {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.head == len(w.queue) {
		return nil
	}
	return w.queue[w.head]
}

// pop removes op, the oldest, once written or failed.
func (w *Writer) pop(op *writeOp) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queue[w.head] = nil
	w.head++
	w.bytes -= op.size
	if op.key != "" && w.pending[op.key] == op {
		delete(w.pending, op.key)
	}
	switch {
	case w.head == len(w.queue):
		w.queue, w.head = w.queue[:0], 0
		close(w.emptied)
		w.emptied = make(chan struct{})
	case w.head > 1024 && w.head > len(w.queue)/2:
		n := copy(w.queue, w.queue[w.head:])
		clear(w.queue[n:])
		w.queue, w.head = w.queue[:n], 0
	}
}

func (w *Writer) run() {
	defer close(w.done)
	backoff := w.cfg.MinBackoff
	for {
		st := w.st.Load()
		var err error
		if st == nil {
			select {
			case <-w.stopping:
				return // never opened: what is held cannot be written
			default:
			}
			st, err = w.openStore()
		}
		var op *writeOp
		if err == nil {
			if op = w.peek(); op == nil {
				select {
				case <-w.wake:
					continue
				case <-w.stopping:
					if w.peek() == nil {
						return
					}
					continue
				}
			}
			err = w.apply(st, op)
		}
		switch {
		case err == nil:
			// Counted before the pop: Flush returns once the queue is empty, and what it
			// waited for is then in Stats.
			w.written.Add(1)
			w.pop(op)
			w.up()
			backoff = w.cfg.MinBackoff
		case st != nil && !transientError(err):
			w.failed.Add(1)
			w.pop(op) // the store answered and refused it: trying again would not help
			w.noteErr(err)
			w.up()
		default:
			w.down(err)
			w.retries.Add(1)
			// Jittered, so that the replicas of a fleet do not all come back at once.
			d := backoff/2 + rand.N(backoff/2+1)
			backoff = min(2*backoff, w.cfg.MaxBackoff)
			var unopened <-chan struct{}
			if st == nil {
				unopened = w.stopping // closing, and it never opened: give up
			}
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-unopened:
				t.Stop()
				return
			case <-w.hard.Done():
				t.Stop()
				return
			}
		}
	}
}

func (w *Writer) openStore() (*Store, error) {
	ctx, cancel := context.WithTimeout(w.hard, w.cfg.Timeout)
	defer cancel()
	st, err := w.open(ctx)
	if err != nil {
		return nil, err
	}
	w.st.Store(st)
	w.up()
	if w.cfg.OnOpen != nil {
		w.cfg.OnOpen(st)
	}
	return st, nil
}

func (w *Writer) apply(st *Store, op *writeOp) error {
	ctx, cancel := context.WithTimeout(w.hard, w.cfg.Timeout)
	defer cancel()
	switch op.kind {
	case opPair:
		r := op.pair
		if op.session != "" {
			r.Session = st.SessionHash(op.session)
		}
		return st.AddPair(ctx, r)
	case opVerdict:
		return st.AddVerdict(ctx, op.verdict)
	case opRate:
		w.mu.Lock() // AddRate may replace it meanwhile
		r := op.rate
		w.mu.Unlock()
		return st.AddRate(ctx, r)
	default:
		w.mu.Lock()
		keep := op.keep
		w.mu.Unlock()
		return st.Prune(ctx, op.route, keep)
	}
}

func (w *Writer) noteErr(err error) {
	s := *w.state.Load()
	s.lastErr, s.lastErrAt = cut(err.Error(), MaxProblemLen), time.Now()
	w.state.Store(&s)
}

func (w *Writer) down(err error) {
	w.noteErr(err)
	if w.connected.Swap(false) || w.state.Load().downSince.IsZero() {
		s := *w.state.Load()
		s.downSince = time.Now()
		w.state.Store(&s)
		w.cfg.Log.Warn("shadow store unreachable: records are held and written when it answers",
			"err", err, "held", w.Stats().Buffered)
	}
}

func (w *Writer) up() {
	if w.connected.Swap(true) {
		return
	}
	s := *w.state.Load()
	if !s.downSince.IsZero() {
		w.cfg.Log.Info("shadow store reachable again", "down_for", time.Since(s.downSince).Round(time.Millisecond),
			"held", w.Stats().Buffered)
	}
	s.downSince = time.Time{}
	w.state.Store(&s)
}

// Flush waits until every record queued so far was written or failed, or ctx ends.
func (w *Writer) Flush(ctx context.Context) error {
	w.mu.Lock()
	if w.head == len(w.queue) {
		w.mu.Unlock()
		return nil
	}
	ch := w.emptied
	w.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("shadow store: flush: %d records held: %w", w.Stats().Buffered, ctx.Err())
	}
}

// Close stops taking records, writes those held until ctx ends, then stops the writer and
// closes the store. What could not be written is counted as dropped, and reported.
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return nil
	}
	w.closed = true
	close(w.stopping)
	w.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
		w.abandon()
		<-w.done
	}
	w.abandon()
	w.mu.Lock()
	left := 0
	for _, op := range w.queue[w.head:] {
		w.dropped[op.kind].Add(1)
		left++
	}
	clear(w.queue)
	w.queue, w.head, w.bytes = nil, 0, 0
	clear(w.pending)
	close(w.emptied) // nothing is held any more: Flush returns
	w.emptied = make(chan struct{})
	w.mu.Unlock()
	var err error
	if st := w.st.Load(); st != nil {
		err = st.Close()
	}
	if left > 0 {
		return fmt.Errorf("shadow store: %d records not written at close (dropped)", left)
	}
	return err
}

// WriterStats are a Writer's counters and state.
type WriterStats struct {
	// Opened: the store has opened. Connected: the last write (or opening) reached it.
	Opened    bool `json:"opened"`
	Connected bool `json:"connected"`
	// Buffered records (BufferedBytes of MaxBytes) wait to be written.
	Buffered      int   `json:"buffered"`
	BufferedBytes int64 `json:"buffered_bytes"`
	MaxBytes      int64 `json:"max_bytes"`
	// Written records; Failed ones the store refused; Retries of writes (or openings) that
	// did not reach it; Dropped records by kind (pair, verdict, rate, prune), not kept
	// because MaxBytes were held or the writer was closing.
	Written int64            `json:"written"`
	Failed  int64            `json:"failed"`
	Retries int64            `json:"retries"`
	Dropped map[string]int64 `json:"dropped"`
	// LastError is the last failure, at LastErrorTime; DownSince when the store stopped
	// answering (zero while it answers).
	LastError     string    `json:"last_error,omitempty"`
	LastErrorTime time.Time `json:"last_error_time,omitzero"`
	DownSince     time.Time `json:"down_since,omitzero"`
}

// Stats returns the writer's counters and state.
func (w *Writer) Stats() WriterStats {
	w.mu.Lock()
	s := WriterStats{Buffered: len(w.queue) - w.head, BufferedBytes: w.bytes, MaxBytes: w.limit}
	w.mu.Unlock()
	s.Opened, s.Connected = w.st.Load() != nil, w.connected.Load()
	s.Written, s.Failed, s.Retries = w.written.Load(), w.failed.Load(), w.retries.Load()
	s.Dropped = make(map[string]int64, len(writerKinds))
	for i, k := range writerKinds {
		s.Dropped[k] = w.dropped[i].Load()
	}
	st := w.state.Load()
	s.LastError, s.LastErrorTime, s.DownSince = st.lastErr, st.lastErrAt, st.downSince
	return s
}
