package shadow

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// The mirroring runtime of one route (a route with a `mirror:` block). The gateway's handler
// offers a copy of a sampled request (Mirror.Offer) and goes on at once; a worker sends the
// copy to the candidate and, at the same moment, to the baseline (or, without one, to the
// primary's cluster for a replica) through the gateway's Sender, reads both answers and is
// free again: it does not wait for the primary. Whoever finishes last of the primary's
// handler (Job.PrimaryDone) and the worker hands the triple to the comparison: the worker
// compares it itself, the handler queues it for the route's comparers (never on its own
// goroutine). Nothing here is on the primary's path except the offer (a hash and a
// non-blocking channel send) and, for mirrored requests only, a bounded copy of the answer.

// Mirror roles, sent to the upstream in X-Sluice-Mirror.
const (
	RoleCandidate = "candidate"
	RoleBaseline  = "baseline"
	RoleReplica   = "replica"
)

// statusClientClosed is the status of an answer the client gave up on (nginx's 499).
const statusClientClosed = policy.StatusClientClosed

// Settings are what a route's mirror does: its config's mirror block.
type Settings struct {
	Cluster  string // the candidate's
	Model    string // the candidate's model, "" for the client's
	Baseline string // the cluster running the primary's version in a sandbox, "" for none

	Fraction        float64 // of sessions mirrored
	ReplicaFraction float64 // of mirrored requests also sent to the primary's cluster (without a baseline)

	MaxQueue, MaxConcurrency int
	Timeout                  time.Duration // of the copies, and of a sandbox answer's wait for the primary's
	CaptureBytes             int           // of each answer kept
	CaptureTotal             int64         // of the route's answers kept at once
	MaxEventBytes            int           // of one SSE event read from a sandbox
	AbnormalFinish           []string      // finish reasons counted as abnormal
}

// Identity names what the settings compare: the candidate ("cand", or "cand/model" when the
// model is rewritten) and, with one, the baseline ("cand vs base"). A change of either
// starts a new comparison: pairs judged against another reference are not this one's.
func (s *Settings) Identity() string {
	id := s.Cluster
	if s.Model != "" {
		id += "/" + s.Model
	}
	if s.Baseline != "" {
		id += " vs " + s.Baseline
	}
	return id
}

// lanes is the bounds that make a new lane.
func (s *Settings) lanes() string {
	return strconv.Itoa(s.MaxQueue) + "/" + strconv.Itoa(s.MaxConcurrency)
}

// A Sender sends a job's copy to a cluster, as the gateway sends its attempts (a pick, the
// endpoint's load, the model rewrite, the copy's headers, chaos faults), and reads the whole
// answer (ReadAnswer). load is the cluster's requests in flight per endpoint once the copy was
// begun on its endpoint (0 when it was not sent).
type Sender interface {
	SendCopy(ctx context.Context, j *Job, cluster, model, role string) (a Answer, load float64)
}

// A Recorder keeps one compared pair (a store of the gateway's own, or a shared store's
// writer). It is called on a comparer and must not wait long.
type Recorder func(ctx context.Context, j *Job, rec PairRecord)

// Mirror is one route's mirror: its queues and workers, and the comparison so far. It lives
// across reloads: Configure takes a reload's settings of the same Identity, and a change of
// the queue's bounds starts a new lane.
type Mirror struct {
	name     string
	identity string
	send     Sender
	record   Recorder
	settings atomic.Pointer[Settings]

	mu    sync.Mutex // lane changes
	lanes string     // the running lane's bounds
	lane  atomic.Pointer[mirrorLane]
	stop  context.CancelFunc
	done  chan struct{}

	acc     *Accumulator
	schemas *SchemaCache
	retired atomic.Bool // replaced by a new candidate or removed: its pairs are not kept

	captured atomic.Int64 // bytes of answers held by the route's jobs (mirror.capture_total)

	// Counters since the route started mirroring (they survive a new lane).
	offered, dropped, started, pairs, incomplete, trunc atomic.Int64
	replicas                                            atomic.Int64
	sides                                               [3]sideCounters // candidate, baseline, replica
}

// The sides of a triple, indexes of Mirror.sides.
const (
	sideCandidate = iota
	sideBaseline
	sideReplica
)

// sideCounters count one sandbox side's copies.
type sideCounters struct{ sent, failed, compared atomic.Int64 }

// mirrorLane is one set of a route's queues: sandbox copies waiting for a worker, and
// triples whose primary finished last waiting for a comparer.
type mirrorLane struct {
	send, compare *Queue[*Job]
}

// comparers bounds the goroutines comparing triples the handler handed over (comparison is
// CPU work: ROUGE-L is bounded by MaxWords², schema checks by the answer's size).
func comparers() int { return max(1, min(4, runtime.GOMAXPROCS(0))) }

// NewMirror returns route's mirror of settings s, comparing over a window of pairs, sending
// its copies through send and keeping its pairs with record (nil: not kept). It does not
// run until Start.
func NewMirror(route string, s *Settings, window int, send Sender, record Recorder) *Mirror {
	m := &Mirror{name: route, identity: s.Identity(), send: send, record: record,
		acc: NewAccumulator(window), schemas: NewSchemaCache(DefaultSchemaCacheSize)}
	m.settings.Store(s)
	return m
}

// Name is the mirror's route.
func (m *Mirror) Name() string { return m.name }

// Identity is what the mirror compares (Settings.Identity).
func (m *Mirror) Identity() string { return m.identity }

// Settings are the mirror's settings now.
func (m *Mirror) Settings() *Settings { return m.settings.Load() }

// Accumulator is the mirror's comparison so far.
func (m *Mirror) Accumulator() *Accumulator { return m.acc }

// Configure takes a reload's settings (of the same Identity) and starts a new lane under
// ctx when the queue's bounds changed (or none runs). It returns what stops the lane it
// replaced (a no-op when none): call it without holding locks the lane's workers may need.
func (m *Mirror) Configure(ctx context.Context, s *Settings) (halt func()) {
	m.settings.Store(s)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lane.Load() != nil && m.lanes == s.lanes() {
		return func() {}
	}
	halt = m.halterLocked()
	m.startLocked(ctx, s)
	return halt
}

// Retire marks a mirror that no longer serves its route (removed, or replaced by a new
// comparison) and returns what stops its lane: its pairs are not kept from now on.
func (m *Mirror) Retire() (halt func()) {
	m.retired.Store(true)
	return m.Halter()
}

// Halter detaches the running lane and returns what stops it and waits for its workers
// (their sandbox requests are cancelled; queued copies are dropped).
func (m *Mirror) Halter() func() {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.halterLocked()
}

func (m *Mirror) halterLocked() func() {
	stop, done := m.stop, m.done
	m.stop = nil
	if stop == nil {
		return func() {}
	}
	return func() {
		stop()
		<-done
	}
}

func (m *Mirror) startLocked(ctx context.Context, s *Settings) {
	ctx, cancel := context.WithCancel(ctx)
	m.lanes, m.stop, m.done = s.lanes(), cancel, make(chan struct{})
	ln := &mirrorLane{
		send:    NewQueue(s.MaxQueue, s.MaxConcurrency, m.run),
		compare: NewQueue(max(256, s.MaxConcurrency), comparers(), m.compare),
	}
	ln.send.OnDrop((*Job).abandon)
	ln.compare.OnDrop(func(j *Job) {
		j.mirror.incomplete.Add(1) // stopped before its turn: nothing is compared after a stop
		j.abandon()
	})
	m.lane.Store(ln)
	done := m.done
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		wg.Go(func() { ln.send.Run(ctx) })
		wg.Go(func() { ln.compare.Run(ctx) })
		wg.Wait()
	}()
}

// An Offer is a request the gateway offers to mirror: its parsed request and what the copy
// is sent with.
type Offer struct {
	Request  *policy.Request
	ID       string      // the request's id (X-Request-Id), which samples replicas
	Path     string      // escaped path and the query, credential-like parameters removed
	Endpoint string      // the path alone, for the record
	Header   http.Header // the copy's headers (the gateway removed credentials), owned by the job
	// The primary's chosen cluster and model (the replica goes there), and its cluster's
	// requests in flight per endpoint, this one counted.
	PrimaryCluster, PrimaryModel string
	PrimaryLoad                  float64
}

// Mirrorable reports whether a request can be compared on a sandbox: chat, completions and
// Responses requests with a body, but not a Responses request that continues a response the
// primary stored (previous_response_id: the sandbox has no such response) or runs in the
// background (its answer is polled for later).
func Mirrorable(preq *policy.Request) bool {
	switch {
	case preq.Body == nil:
		return false
	case preq.Kind == openai.KindChat, preq.Kind == openai.KindCompletion:
		return true
	case preq.Kind == openai.KindResponses:
		return preq.PreviousResponseID == "" && !preq.Background
	}
	return false
}

// Samples reports whether the request is one to mirror: it can be compared (Mirrorable),
// the candidate does not serve it itself (primaryCluster, the primary's chosen cluster, is
// not the candidate's: its split's answer has nothing to be compared with) and its
// conversation (session, else tenant, else client) is sampled at the mirror's fraction. A
// hash, nothing more: the gateway asks it before it prepares an Offer.
func (m *Mirror) Samples(preq *policy.Request, primaryCluster string) bool {
	s := m.settings.Load()
	if !Mirrorable(preq) || primaryCluster == s.Cluster {
		return false
	}
	key := preq.Session
	if key == "" {
		key = preq.Tenant
	}
	if key == "" {
		key = preq.Client
	}
	return Sampled(m.name, key, s.Fraction)
}

// Offer mirrors a request the mirror Samples. It never waits: a full queue drops the copy
// (counted). The returned job, when not nil, must get the primary's answer through
// PrimaryDone (and its bytes through Capture).
func (m *Mirror) Offer(o Offer) *Job {
	s := m.settings.Load()
	preq := o.Request
	m.offered.Add(1)
	ln := m.lane.Load()
	if ln == nil {
		m.dropped.Add(1) // not started, or stopped
		return nil
	}
	j := &Job{mirror: m, lane: ln, settings: s, Request: *preq, Path: o.Path, Endpoint: o.Endpoint, Header: o.Header}
	j.primary.cluster, j.primary.model = o.PrimaryCluster, o.PrimaryModel
	j.loads.Primary = o.PrimaryLoad
	j.capture = capture{limit: s.CaptureBytes, budget: &m.captured, total: s.CaptureTotal}
	j.replica = s.Baseline == "" && s.ReplicaFraction > 0 && j.primary.cluster != "" &&
		Sampled(m.name+"\x00replica", o.ID, s.ReplicaFraction)
	if !ln.send.Offer(j) {
		m.dropped.Add(1)
		return nil
	}
	return j
}

// Job is one mirrored request.
type Job struct {
	mirror   *Mirror
	lane     *mirrorLane
	settings *Settings

	Request  policy.Request // a copy taken when offered (the body and parsed request are read-only)
	Path     string         // escaped path and the query without credential-like parameters
	Endpoint string         // the path alone, for the record
	Header   http.Header    // the copy's headers: clone them to send

	primary struct {
		cluster, model string // the primary's chosen candidate (the replica goes there)
	}
	replica bool
	loads   Loads // the primary's at the offer, the sandboxes' when sent

	// The primary's answer: written by the handler, read by the comparison once primaryIn.
	capture capture
	outcome policy.Outcome
	tap     openai.Tap
	faulted bool // chaos faults acted on the primary: not a fair comparison

	// The sandboxes' answers: written by the worker, read once sandboxIn.
	cand   Answer
	second *Answer // the baseline's or the replica's, when one was asked

	mu        sync.Mutex
	primaryIn bool        // the handler is done with the job
	sandboxIn bool        // the worker is done with it
	dead      bool        // it will not be compared (timed out, dropped, stopped)
	timer     *time.Timer // bounds the sandbox answers' wait for the primary's
}

// Settings are the settings the job was offered under.
func (j *Job) Settings() *Settings { return j.settings }

// Capture keeps the next bytes of the primary's answer (up to capture_bytes, within the
// route's capture_total). sse says the answer is an SSE stream. Only the handler calls it,
// before PrimaryDone.
func (j *Job) Capture(b []byte, sse bool) {
	if sse {
		j.capture.sse = true
	}
	j.capture.add(b)
}

// Event makes a job a stream watcher of the primary's stream (policy.StreamWatcher): it
// captures each event as the model server sent it, before any filter replaced it (the
// model server's answer is what is compared). It never changes the stream.
func (j *Job) Event(ev policy.StreamEvent) policy.StreamAction {
	j.Capture(ev.Raw, true)
	return policy.StreamAction{}
}

// End ends a watch of one attempt's stream; a resumed stream goes on in the same capture.
func (j *Job) End() []policy.Class { return nil }

// PrimaryDone hands the primary's answer to the job: its outcome, its tap (TTFT, tokens)
// and whether chaos faults acted on it; nothing is parsed here. When the sandboxes have
// answered already, the triple goes to the route's comparers. Safe on a nil job; called
// once, when the handler is done writing.
func (j *Job) PrimaryDone(outcome policy.Outcome, tap *openai.Tap, faulted bool) {
	if j == nil {
		return
	}
	j.outcome, j.faulted = outcome, faulted
	if tap != nil {
		j.tap = *tap
	}
	j.mu.Lock()
	j.primaryIn = true
	dead, ready := j.dead, j.sandboxIn
	if j.timer != nil {
		j.timer.Stop()
	}
	j.mu.Unlock()
	switch {
	case dead:
		j.release()
	case ready:
		if !j.lane.compare.Offer(j) {
			j.mirror.dropped.Add(1) // the comparers are behind: never wait for them
			j.release()
		}
	}
}

// sandboxDone is the worker's side of PrimaryDone: it compares the triple at once when the
// primary finished first, else leaves the job to the handler (for at most the mirror's
// time-out) without holding its worker.
func (m *Mirror) sandboxDone(ctx context.Context, j *Job) {
	j.mu.Lock()
	j.sandboxIn = true
	if j.primaryIn {
		j.mu.Unlock()
		m.compare(ctx, j)
		return
	}
	j.timer = time.AfterFunc(j.settings.Timeout, j.expire)
	j.mu.Unlock()
}

// expire gives up on a primary that did not finish within the mirror's time-out after its
// sandboxes did.
func (j *Job) expire() {
	j.mu.Lock()
	gone := j.primaryIn || j.dead
	j.dead = true
	j.mu.Unlock()
	if !gone {
		j.mirror.incomplete.Add(1) // its capture is released when the handler is done with it
	}
}

// abandon marks a job that will not be compared (dropped when its queue stopped) and
// releases what it holds once the handler is done with it.
func (j *Job) abandon() {
	j.mu.Lock()
	j.dead = true
	primaryIn := j.primaryIn
	j.mu.Unlock()
	if primaryIn {
		j.release()
	}
}

// release gives the job's captured bytes back to the route's budget.
func (j *Job) release() { j.capture.release() }

// primaryAnswer is the primary's answer, parsed from the capture (in the worker, after done).
func (j *Job) primaryAnswer() Answer {
	a, err := answerOf(j.capture.sse, j.capture.buf)
	if err != nil && !j.capture.truncated && j.outcome.ErrorClass == "" {
		a.ErrorClass = string(policy.ClassUnparsed)
	}
	a.Truncated = j.capture.truncated
	a.Status = j.outcome.Status
	if j.outcome.ErrorClass != "" {
		a.ErrorClass = string(j.outcome.ErrorClass)
	}
	fillTimes(&a, &j.tap, j.capture.sse)
	return a
}

// run serves one mirrored request (a worker of the route's send queue): the copies to the
// candidate and to the baseline or replica, sent at the same moment and read to their ends;
// then the worker is free (sandboxDone).
func (m *Mirror) run(ctx context.Context, j *Job) {
	m.started.Add(1)
	s := j.settings
	sctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	var cluster, role string
	side := sideCandidate
	switch {
	case s.Baseline != "":
		cluster, role, side = s.Baseline, RoleBaseline, sideBaseline
	case j.replica:
		cluster, role, side = j.primary.cluster, RoleReplica, sideReplica
	}
	// The baseline and the replica run the primary's version: they get the request as the
	// primary did (its model rewrite, when its split had one).
	model := j.primary.model
	var wg sync.WaitGroup
	if cluster != "" {
		wg.Go(func() {
			a, load := m.send.SendCopy(sctx, j, cluster, model, role)
			j.second = &a
			if side == sideBaseline {
				j.loads.Baseline = load
			}
			m.sides[side].count(a)
		})
	}
	a, load := m.send.SendCopy(sctx, j, s.Cluster, s.Model, RoleCandidate)
	j.cand, j.loads.Candidate = a, load
	m.sides[sideCandidate].count(a)
	wg.Wait()
	m.sandboxDone(ctx, j)
}

// count counts one sent copy of a side.
func (c *sideCounters) count(a Answer) {
	c.sent.Add(1)
	if !a.OK() {
		c.failed.Add(1)
	}
}

// compare compares a job's triple (or pair) and records it: on the worker when the primary
// finished first, on a comparer when the handler handed it over.
func (m *Mirror) compare(ctx context.Context, j *Job) {
	defer j.release()
	prim := j.primaryAnswer()
	if prim.Status == statusClientClosed || prim.ErrorClass == string(policy.ClassClientCancel) ||
		prim.ErrorClass == string(policy.ClassShutdown) || j.faulted {
		// Nothing fair to compare: the primary did not run to its end, or chaos acted on it.
		m.incomplete.Add(1)
		return
	}
	if m.retired.Load() {
		return // what is compared changed meanwhile: this triple belongs to the old comparison
	}
	s := j.settings
	cand := j.cand
	var base, replica *Answer
	if j.second != nil {
		if s.Baseline != "" {
			base = j.second
		} else {
			replica = j.second
		}
	}
	if prim.Truncated || cand.Truncated || base != nil && base.Truncated {
		m.trunc.Add(1)
	}
	req := RequestFromBody(j.Request.Body)
	req.AbnormalFinish = s.AbnormalFinish
	pr := m.schemas.CompareTriple(req, prim, base, cand)
	pr.Loads = j.loads
	pr.Loads.Valid = j.loads.Primary > 0 && j.loads.Candidate > 0 && (base == nil || j.loads.Baseline > 0)
	m.acc.Add(pr)
	m.pairs.Add(1)
	m.sides[sideCandidate].compared.Add(1)
	rec := NewPairRecord(m.name, time.Now(), j.Request.Body, prim, cand, replica, pr)
	rec.CandidateID = m.identity
	if base != nil {
		rec.SetBaseline(*base)
		m.sides[sideBaseline].compared.Add(1)
	}
	if rec.ReplicaValid {
		m.acc.AddReplicaSimilarity(rec.ReplicaSimilarity)
		m.replicas.Add(1)
		m.sides[sideReplica].compared.Add(1)
	}
	// The captures are read: their bytes go back to the budget before the record is written,
	// which may wait on a slow store.
	j.release()
	if m.record != nil {
		rec.RequestID = j.Request.ID
		rec.Endpoint = j.Endpoint
		m.record(ctx, j, rec)
	}
}

// MirrorCounters are a route mirror's counters since it started mirroring, for metrics.
type MirrorCounters struct {
	Offered, Dropped, Started, Pairs, Incomplete, Truncated, Replicas int64
	CandidateFailures, BaselineFailures                               int64
	Queued                                                            int64 // copies waiting for a worker now
	Captured                                                          int64 // bytes of capture_total reserved now
}

// Counters returns the mirror's counters.
func (m *Mirror) Counters() MirrorCounters {
	c := MirrorCounters{
		Offered: m.offered.Load(), Dropped: m.dropped.Load(), Started: m.started.Load(), Pairs: m.pairs.Load(),
		Incomplete: m.incomplete.Load(), Truncated: m.trunc.Load(), Replicas: m.replicas.Load(),
		CandidateFailures: m.sides[sideCandidate].failed.Load(), BaselineFailures: m.sides[sideBaseline].failed.Load(),
		Captured: m.captured.Load(),
	}
	if ln := m.lane.Load(); ln != nil {
		c.Queued = ln.send.Counts().Queued
	}
	return c
}

// Stats are the mirror's counters for the report.
func (m *Mirror) Stats() MirrorStats {
	s := m.settings.Load()
	ms := MirrorStats{Offered: m.offered.Load(), Mirrored: m.started.Load(), Dropped: m.dropped.Load(),
		Compared: m.pairs.Load(), Incomplete: m.incomplete.Load(),
		Failed: m.sides[sideCandidate].failed.Load(), Replicas: m.replicas.Load()}
	for i, side := range []struct{ name, cluster string }{
		{RoleCandidate, s.Cluster}, {RoleBaseline, s.Baseline}, {RoleReplica, "primary's"},
	} {
		c := &m.sides[i]
		if c.sent.Load() == 0 && (i != sideBaseline || s.Baseline == "") && i != sideCandidate {
			continue
		}
		ms.Sides = append(ms.Sides, SideStats{Side: side.name, Cluster: side.cluster,
			Sent: c.sent.Load(), Failed: c.failed.Load(), Compared: c.compared.Load()})
	}
	return ms
}

// Running reports whether the mirror has a lane started and is not retired.
func (m *Mirror) Running() bool { return m.lane.Load() != nil && !m.retired.Load() }
