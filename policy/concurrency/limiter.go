package concurrency

import (
	"container/heap"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// CodeConcurrencyLimit is the error code of every rejection (429, with Retry-After).
const CodeConcurrencyLimit = policy.ClassConcurrencyLimit

// Rejection reasons, as counted in Stats.Rejected.
const (
	ReasonQueueFull    = "queue_full"    // the queue was full (or max_queue is -1)
	ReasonDeadline     = "deadline"      // the deadline would pass before a slot could free up
	ReasonQueueTimeout = "queue_timeout" // waited until max_wait without a slot
)

func init() { policy.Register("concurrency", factory) }

func factory(params json.RawMessage, env policy.Env) (policy.Plugin, error) {
	var p Params
	if err := policy.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	return New(p, env)
}

// AfterFuncer is implemented by clocks that can schedule a call (fake clocks in tests). When
// env.Clock implements it, the limiter's max_wait timers use it; otherwise time.AfterFunc.
type AfterFuncer interface {
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// Limiter is the adaptive concurrency limiter of one route. It is safe for concurrent use and
// starts no goroutine (a waiting Admit waits in its caller's goroutine).
type Limiter struct {
	policy.Named        // its type and name: a policy.Plugin
	p            Params // with defaults
	adaptive     bool
	clock        policy.Clock
	after        func(time.Duration, func()) func() bool
	route        string

	mu       sync.Mutex
	ctl      *controller
	limit    int // ctl.current() or p.MaxLimit when not adaptive
	inflight int
	queue    waitQueue
	seq      uint64
	hold     float64 // EWMA of slot hold time (admission to Done), ns
	load     LoadSource

	priorities atomic.Pointer[map[string]int]

	admitted, queuedTotal, cancelled atomic.Uint64
	rejected                         [3]atomic.Uint64
	wait                             waitHist
}

var reasons = [3]string{ReasonQueueFull, ReasonDeadline, ReasonQueueTimeout}

// New builds a Limiter from p (zero fields take their defaults) after validating it whole.
func New(p Params, env policy.Env) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p = p.WithDefaults()
	if env.Clock == nil {
		env.Clock = policy.SystemClock{}
	}
	l := &Limiter{Named: env.Named(), p: p, adaptive: *p.Adaptive, clock: env.Clock, route: env.Route}
	if a, ok := env.Clock.(AfterFuncer); ok {
		l.after = a.AfterFunc
	} else {
		l.after = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	l.ctl = newController(p, env.Clock.Now())
	l.limit = p.MaxLimit
	if l.adaptive {
		l.limit = l.ctl.current()
	}
	return l, nil
}

// Params returns the limiter's params, defaults filled in.
func (l *Limiter) Params() Params { return l.p }

// SetPriorities sets the tenants' priorities (higher is served first; tenants not in m have
// 0). It is safe to call while the limiter serves.
func (l *Limiter) SetPriorities(m map[string]int) {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	l.priorities.Store(&c)
}

// SetLoadSource sets where the model servers' queue and KV-cache signals come from (nil: none).
func (l *Limiter) SetLoadSource(s LoadSource) {
	l.mu.Lock()
	l.load = s
	l.mu.Unlock()
}

func (l *Limiter) priority(r *policy.Request) int {
	if l.p.TrustPriorityHeader && r.Header != nil {
		if v := r.Header.Get(PriorityHeader); v != "" {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	if m := l.priorities.Load(); m != nil {
		return (*m)[r.Tenant]
	}
	return 0
}

// ticket is one admitted request's slot.
type ticket struct {
	l     *Limiter
	start time.Time
	done  atomic.Bool
}

func (t *ticket) settle(o policy.Outcome) {
	if t.done.Swap(true) {
		return
	}
	t.l.release(t.l.clock.Now().Sub(t.start), &o)
}

// waiter is one request in the queue.
type waiter struct {
	prio     int
	deadline time.Time
	seq      uint64
	enq      time.Time
	tenant   string
	index    int       // in the heap; -1 once out
	ch       chan bool // true: granted a slot; false: timed out (buffered 1)
}

// waitQueue orders by priority (higher first), then deadline (earlier first), then arrival.
type waitQueue []*waiter

func before(a, b *waiter) bool {
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	if !a.deadline.Equal(b.deadline) {
		return a.deadline.Before(b.deadline)
	}
	return a.seq < b.seq
}

func (q waitQueue) Len() int           { return len(q) }
func (q waitQueue) Less(i, j int) bool { return before(q[i], q[j]) }
func (q waitQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *waitQueue) Push(x any) {
	w := x.(*waiter)
	w.index = len(*q)
	*q = append(*q, w)
}
func (q *waitQueue) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	w.index = -1
	return w
}

// Admit admits r at once when a slot is free and nobody waits; otherwise it queues r by
// priority and deadline and waits for a slot, or rejects it at once (429 concurrency_limit,
// Retry-After) when the queue is full or r's deadline would pass before a slot could plausibly
// free up. A waiting Admit returns ctx's error when ctx ends first.
func (l *Limiter) Admit(ctx context.Context, r *policy.Request) (policy.Decision, error) {
	now := l.clock.Now()
	l.mu.Lock()
	if l.inflight < l.limit && len(l.queue) == 0 {
		l.inflight++
		l.ctl.noteInflight(l.inflight)
		l.mu.Unlock()
		return l.grant(now, 0), nil
	}
	if len(l.queue) >= l.p.MaxQueue {
		retry := l.estimate(len(l.queue) + 1)
		l.mu.Unlock()
		return l.reject(0, retry, fmt.Sprintf("The route's concurrency limit is reached and its queue is full (%d waiting). Please try again in %s.", l.p.MaxQueue, fmtRetry(retry))), nil
	}
	w := &waiter{prio: l.priority(r), deadline: now.Add(l.p.MaxWait.D()), enq: now, tenant: r.Tenant, ch: make(chan bool, 1)}
	if d, ok := ctx.Deadline(); ok && d.Before(w.deadline) {
		w.deadline = d
	}
	l.seq++
	w.seq = l.seq
	ahead := 1
	for _, o := range l.queue {
		if before(o, w) {
			ahead++
		}
	}
	if est := l.estimate(ahead); !w.deadline.After(now) || (est > 0 && now.Add(est).After(w.deadline)) {
		retry := l.estimate(len(l.queue) + 1)
		l.mu.Unlock()
		return l.reject(1, retry, fmt.Sprintf("The route's concurrency limit is reached; the expected wait (%s) would pass the request's deadline. Please try again in %s.", est.Round(time.Millisecond), fmtRetry(retry))), nil
	}
	heap.Push(&l.queue, w)
	l.mu.Unlock()
	l.queuedTotal.Add(1)

	stop := l.after(w.deadline.Sub(now), func() { l.expire(w) })
	select {
	case granted := <-w.ch:
		stop()
		if granted {
			return l.grant(w.enq, l.clock.Now().Sub(w.enq)), nil
		}
		retry := l.estimate(1)
		return l.reject(2, retry, fmt.Sprintf("The route's concurrency limit is reached; no slot freed up within %s. Please try again in %s.", w.deadline.Sub(w.enq).Round(time.Millisecond), fmtRetry(retry))), nil
	case <-ctx.Done():
		stop()
		l.mu.Lock()
		if w.index >= 0 {
			heap.Remove(&l.queue, w.index)
			l.mu.Unlock()
		} else {
			l.mu.Unlock()
			if <-w.ch { // granted meanwhile: hand the slot on
				l.release(-1, nil)
			}
		}
		l.cancelled.Add(1)
		return policy.Decision{}, ctx.Err()
	}
}

// grant counts an admission and returns its Decision; start is when the request arrived.
func (l *Limiter) grant(start time.Time, waited time.Duration) policy.Decision {
	l.admitted.Add(1)
	l.wait.observe(waited)
	t := &ticket{l: l, start: start.Add(waited)}
	return policy.Decision{Done: t.settle}
}

func (l *Limiter) reject(reason int, retry time.Duration, msg string) policy.Decision {
	l.rejected[reason].Add(1)
	e := policy.Fail(CodeConcurrencyLimit, msg)
	e.RetryAfter = max(retry, time.Second)
	return policy.Decision{Reject: e}
}

func fmtRetry(d time.Duration) string {
	return strconv.Itoa(int(math.Ceil(max(d, time.Second).Seconds()))) + "s"
}

// estimate is the expected wait for a slot of the request at position pos (1 = next) in the
// queue: pos × mean hold time / limit (slots free up at limit / hold per second). 0 while no
// hold time has been measured. l.mu is held.
func (l *Limiter) estimate(pos int) time.Duration {
	if l.hold <= 0 || l.limit <= 0 {
		return 0
	}
	return time.Duration(float64(pos) * l.hold / float64(l.limit))
}

// expire times a waiter out (its max_wait or deadline passed).
func (l *Limiter) expire(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.index < 0 {
		return
	}
	heap.Remove(&l.queue, w.index)
	w.ch <- false
}

// release frees a slot held for hold (hold < 0: a slot granted to a waiter that had gone),
// feeds the controller with o (nil: nothing to learn), and admits waiters while slots are free.
func (l *Limiter) release(hold time.Duration, o *policy.Outcome) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	if hold >= 0 {
		const alpha = 0.1
		if l.hold == 0 {
			l.hold = float64(hold)
		} else {
			l.hold += alpha * (float64(hold) - l.hold)
		}
	}
	if o != nil && l.adaptive {
		l.ctl.observe(*o)
		if l.ctl.maybeUpdate(now, l.load) {
			l.limit = l.ctl.current()
		}
	}
	for l.inflight < l.limit && len(l.queue) > 0 {
		w := heap.Pop(&l.queue).(*waiter)
		l.inflight++
		l.ctl.noteInflight(l.inflight)
		w.ch <- true
	}
}

// Stats are the limiter's counters, for metrics.
type Stats struct {
	Limit       int               `json:"limit"`
	InFlight    int               `json:"in_flight"`
	Queued      int               `json:"queued"`       // waiting now
	Admitted    uint64            `json:"admitted"`     // total
	QueuedTotal uint64            `json:"queued_total"` // requests that waited
	Cancelled   uint64            `json:"cancelled"`    // left the queue because their context ended
	Rejected    map[string]uint64 `json:"rejected"`     // by reason (queue_full, deadline, queue_timeout)
	Wait        WaitHistogram     `json:"wait"`         // admission wait of admitted requests
}

// Stats returns the counters now.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	s := Stats{Limit: l.limit, InFlight: l.inflight, Queued: len(l.queue)}
	l.mu.Unlock()
	s.Admitted, s.QueuedTotal, s.Cancelled = l.admitted.Load(), l.queuedTotal.Load(), l.cancelled.Load()
	s.Rejected = make(map[string]uint64, len(reasons))
	for i, r := range reasons {
		s.Rejected[r] = l.rejected[i].Load()
	}
	s.Wait = l.wait.snapshot()
	return s
}

// Snapshot is the controller's state: the limiter's admin view (GET /admin/concurrency).
type Snapshot struct {
	Route            string          `json:"route"`
	Adaptive         bool            `json:"adaptive"`
	Limit            int             `json:"limit"`
	LimitExact       float64         `json:"limit_exact"`
	MinLimit         int             `json:"min_limit"`
	MaxLimit         int             `json:"max_limit"`
	InFlight         int             `json:"in_flight"`
	Queued           int             `json:"queued"`
	MaxQueue         int             `json:"max_queue"`
	BaselineTTFT     policy.Duration `json:"baseline_ttft"`
	BaselineTPOT     policy.Duration `json:"baseline_tpot"`
	SampleTTFT       policy.Duration `json:"sample_ttft"`
	SampleTPOT       policy.Duration `json:"sample_tpot"`
	Gradient         float64         `json:"gradient"`
	LatencyGradient  float64         `json:"latency_gradient"`
	PressureGradient float64         `json:"pressure_gradient"`
	Pressure         string          `json:"pressure,omitempty"` // e.g. "kv_cache:llama" in the last window
	Windows          uint64          `json:"windows"`
	LastUpdate       time.Time       `json:"last_update,omitzero"`
	HoldTime         policy.Duration `json:"hold_time"` // EWMA of slot hold time
	Waiters          []Waiter        `json:"waiters,omitempty"`
}

// Waiter is one queued request in a Snapshot (in service order; at most 100 are listed).
type Waiter struct {
	Tenant   string          `json:"tenant,omitempty"`
	Priority int             `json:"priority"`
	Waited   policy.Duration `json:"waited"`
	Deadline time.Time       `json:"deadline"`
}

// Snapshot returns the controller's state now.
func (l *Limiter) Snapshot() Snapshot {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.ctl
	s := Snapshot{
		Route: l.route, Adaptive: l.adaptive, Limit: l.limit, LimitExact: c.limit,
		MinLimit: l.p.MinLimit, MaxLimit: l.p.MaxLimit, InFlight: l.inflight, Queued: len(l.queue), MaxQueue: l.p.MaxQueue,
		BaselineTTFT: policy.Duration(c.baseTTFT.base), BaselineTPOT: policy.Duration(c.baseTPOT.base),
		SampleTTFT: policy.Duration(c.sampleTTFT), SampleTPOT: policy.Duration(c.sampleTPOT),
		Gradient: c.gradient, LatencyGradient: c.latGradient, PressureGradient: c.pressGradient, Pressure: c.pressure,
		Windows: c.windows, LastUpdate: c.lastUpdate, HoldTime: policy.Duration(l.hold),
	}
	if !l.adaptive {
		s.LimitExact = float64(l.limit)
	}
	ws := append([]*waiter(nil), l.queue...)
	sort.Slice(ws, func(i, j int) bool { return before(ws[i], ws[j]) })
	for _, w := range ws[:min(len(ws), 100)] {
		s.Waiters = append(s.Waiters, Waiter{Tenant: w.tenant, Priority: w.prio, Waited: policy.Duration(now.Sub(w.enq)), Deadline: w.deadline})
	}
	return s
}

// WaitBuckets are the upper bounds of the wait histogram's buckets.
var WaitBuckets = []time.Duration{0, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second}

// WaitHistogram is the admission wait of admitted requests: Counts[i] counts waits ≤
// WaitBuckets[i] (not cumulative; the last entry counts those above every bound), ready for a
// Prometheus const histogram.
type WaitHistogram struct {
	Counts []uint64      `json:"counts"`
	Count  uint64        `json:"count"`
	Sum    time.Duration `json:"sum"`
}

type waitHist struct {
	counts [13]atomic.Uint64
	sum    atomic.Int64
}

func (h *waitHist) observe(d time.Duration) {
	i := sort.Search(len(WaitBuckets), func(i int) bool { return d <= WaitBuckets[i] })
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

func (h *waitHist) snapshot() WaitHistogram {
	w := WaitHistogram{Counts: make([]uint64, len(h.counts)), Sum: time.Duration(h.sum.Load())}
	for i := range h.counts {
		w.Counts[i] = h.counts[i].Load()
		w.Count += w.Counts[i]
	}
	return w
}
