package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// Mirroring (routes with a `mirror:` block). The handler offers a copy of a sampled request
// to the route's bounded queue and goes on at once; a worker sends the copy to the candidate
// and, at the same moment, to the baseline (or, without one, to the primary's cluster for a
// replica), reads both answers and is free again: it does not wait for the primary. Whoever
// finishes last of the primary's handler and the worker hands the triple to the comparison:
// the worker compares it itself, the handler queues it for the route's comparers (never on
// its own goroutine). Nothing here is on the primary's path except the offer (a hash and a
// non-blocking channel send) and, for mirrored requests only, a bounded copy of the answer.

// Mirror roles, sent to the upstream in X-Sluice-Mirror.
const (
	mirrorCandidate = "candidate"
	mirrorBaseline  = "baseline"
	mirrorReplica   = "replica"
)

// mirrorRoute is one route's mirror: its queues and workers, and the comparison so far. It
// lives across reloads; a reload that changes what is compared (candidate, model, baseline)
// starts a new comparison, one that changes the queue's bounds starts a new lane.
type mirrorRoute struct {
	name     string
	identity string // what is compared: see identityOf
	qkey     string // the lane's bounds
	cfg      atomic.Pointer[config.Mirror]

	lane atomic.Pointer[mirrorLane]
	stop context.CancelFunc
	done chan struct{}

	acc     *shadow.Accumulator
	schemas *shadow.SchemaCache
	retired atomic.Bool // replaced by a new candidate or removed: its pairs are not kept

	captured atomic.Int64 // bytes of answers held by the route's jobs (mirror.capture_total)

	// Counters since the route started mirroring (they survive a new lane).
	offered, dropped, started, pairs, incomplete, trunc atomic.Int64
	replicas                                            atomic.Int64
	sides                                               [3]sideCounters // candidate, baseline, replica

	mu      sync.Mutex
	verdict *shadow.Verdict // the latest
	judged  time.Time
	stepped time.Time // the last weight progression step
	action  string    // what the progression last did
	rate    rateSample
	basis   atomic.Pointer[judgement] // what the latest verdict judged (shadow_judge.go)
}

// The sides of a triple, indexes of mirrorRoute.sides.
const (
	sideCandidate = iota
	sideBaseline
	sideReplica
)

// sideCounters count one sandbox side's copies.
type sideCounters struct{ sent, failed, compared atomic.Int64 }

// rateSample is the requests begun on the reference's and the candidate's clusters at the
// last verdict, for their request rates per endpoint over the interval since.
type rateSample struct {
	at                time.Time
	reference, cand   int64
	refName, candName string
	refRate, candRate float64 // per endpoint, per second, over the last interval
}

// mirrorLane is one set of a route's queues: sandbox copies waiting for a worker, and
// triples whose primary finished last waiting for a comparer. A new lane starts when the
// mirror's bounds change.
type mirrorLane struct {
	send, compare *shadow.Queue[*mirrorJob]
}

// comparers bounds the goroutines comparing triples the handler handed over (comparison is
// CPU work: ROUGE-L is bounded by shadow.MaxWords², schema checks by the answer's size).
func comparers() int { return max(1, min(4, runtime.GOMAXPROCS(0))) }

// mirrorJob is one mirrored request.
type mirrorJob struct {
	route    *mirrorRoute
	lane     *mirrorLane
	cfg      *config.Mirror
	preq     policy.Request // a copy taken when offered (the body and parsed request are read-only)
	path     string         // escaped path and the query without credential-like parameters
	endpoint string         // the path alone, for the record
	header   http.Header    // the client's headers, credentials removed, the mirror's set
	primary  struct {
		cluster, model string // the primary's chosen candidate (the replica goes there)
	}
	replica bool
	loads   shadow.Loads // the primary's at the offer, the sandboxes' when sent

	// The primary's answer: written by the handler, read by the comparison once primaryIn.
	capture capture
	outcome policy.Outcome
	tap     openai.Tap
	faulted bool // chaos faults acted on the primary: not a fair comparison

	// The sandboxes' answers: written by the worker, read once sandboxIn.
	cand   shadow.Answer
	second *shadow.Answer // the baseline's or the replica's, when one was asked

	mu        sync.Mutex
	primaryIn bool        // the handler is done with the job
	sandboxIn bool        // the worker is done with it
	dead      bool        // it will not be compared (timed out, dropped, stopped)
	timer     *time.Timer // bounds the sandbox answers' wait for the primary's
}

// capture keeps the first limit bytes of an answer and whether it was an SSE stream. With a
// budget, the bytes kept count against the route's capture_total: past it the capture ends
// as at its limit (truncated).
type capture struct {
	buf       []byte
	limit     int
	truncated bool
	sse       bool

	budget *atomic.Int64
	total  int64 // the budget's bound
	held   int64 // bytes reserved from it (the bytes kept, rounded up to captureGrab)
}

// captureGrab is how much of the route's budget a capture reserves at a time, so that the
// primary's relay touches the route's shared counter once per 64 KiB, not once per event.
const captureGrab = 64 << 10

func (c *capture) add(b []byte) {
	if c.truncated || len(b) == 0 {
		return // a cut capture takes nothing more: a gap would corrupt what was kept
	}
	if room := c.limit - len(c.buf); len(b) > room {
		c.truncated = true
		b = b[:max(0, room)]
	}
	if need := int64(len(c.buf)+len(b)) - c.held; c.budget != nil && need > 0 && !c.reserve(need) {
		c.truncated = true
		return
	}
	c.buf = append(c.buf, b...)
}

// reserve takes at least need more bytes of the budget: a grab (at most up to the capture's
// limit) when the budget has room for it, else just need; false when not even that fits.
func (c *capture) reserve(need int64) bool {
	for _, n := range []int64{min(max(need, captureGrab), int64(c.limit)-c.held), need} {
		if n < need {
			continue
		}
		if c.budget.Add(n) <= c.total {
			c.held += n
			return true
		}
		c.budget.Add(-n)
	}
	return false
}

// release gives the capture's bytes back to the budget and drops them.
func (c *capture) release() {
	if c.budget != nil && c.held > 0 {
		c.budget.Add(-c.held)
	}
	c.held, c.buf = 0, nil
}

// Write makes a capture an io.Writer that keeps the first limit bytes and discards the rest.
func (c *capture) Write(p []byte) (int, error) {
	c.add(p)
	return len(p), nil
}

// shadowing runs the routes' mirrors. The mirrors themselves belong to the config's
// generation (state.mirrors), swapped with its routes in one step; sync, judging and closing
// are serialised by mu.
type shadowing struct {
	srv      *Server
	mu       sync.Mutex
	judging  sync.Mutex
	store    atomic.Pointer[shadow.Store] // opened when a route first mirrors
	storeErr error
	closed   bool

	writer atomic.Pointer[shadow.Writer] // a shared store's, which opens it (shadow_store.go)
}

func newShadowing(s *Server) *shadowing { return &shadowing{srv: s} }

// list returns the serving generation's mirrors in the order of its routes.
func (sh *shadowing) list() []*mirrorRoute {
	st := sh.srv.state.Load()
	var out []*mirrorRoute
	for _, r := range st.snap.Routes {
		if mr := st.mirrors[r.Name]; mr != nil {
			out = append(out, mr)
		}
	}
	return out
}

// identityOf names what a mirror compares: the candidate ("cand", or "cand/model" when the
// model is rewritten) and, with one, the baseline ("cand vs base"). A change of either
// starts a new comparison: pairs judged against another reference are not this one's.
func identityOf(m *config.Mirror) string {
	id := m.Cluster
	if m.Model != "" {
		id += "/" + m.Model
	}
	if m.Baseline != "" {
		id += " vs " + m.Baseline
	}
	return id
}

// sync brings the mirrors of old (the serving generation's) in line with the config of next,
// the generation about to serve: new routes start a mirror, removed ones stop theirs, changed
// ones keep what they can. swap puts next to work with its mirrors, in one step with its
// routes; the mirrors next no longer has stop after it.
func (sh *shadowing) sync(old map[string]*mirrorRoute, next *state, swap func()) {
	var halts []func()
	defer func() {
		// Outside the lock: a stopping worker may still be finishing its pair.
		for _, h := range halts {
			h()
		}
	}()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		swap() // shutting down: no mirror starts again
		return
	}
	c := next.snap.Config
	mirrors := make(map[string]*mirrorRoute, len(old))
	for _, r := range c.Routes {
		m := r.Mirror
		if m == nil {
			continue
		}
		identity := identityOf(m)
		qkey := strconv.Itoa(m.MaxQueue) + "/" + strconv.Itoa(m.MaxConcurrency)
		mr := old[r.Name]
		if mr != nil && mr.identity != identity {
			mr = nil // retired below: a new comparison starts
		}
		if mr == nil {
			sh.openStore(c)
			mr = &mirrorRoute{name: r.Name, identity: identity, acc: shadow.NewAccumulator(c.Shadow.Window),
				schemas: shadow.NewSchemaCache(shadow.DefaultSchemaCacheSize)}
			sh.restore(mr, c.Shadow.Window)
		}
		mirrors[r.Name] = mr
		mr.cfg.Store(m)
		if mr.lane.Load() == nil || mr.qkey != qkey {
			halts = append(halts, mr.halter())
			mr.start(sh, qkey, m)
		}
	}
	next.mirrors = mirrors
	swap()
	// The generation that no longer serves keeps its mirrors until the swap: then those the
	// new one does not have stop.
	for name, mr := range old {
		if mirrors[name] != mr {
			mr.retired.Store(true)
			halts = append(halts, mr.halter())
		}
	}
}

// close stops every mirror and closes the store (at shutdown).
func (sh *shadowing) close() {
	sh.mu.Lock()
	sh.closed = true
	var halts []func()
	for _, mr := range sh.srv.state.Load().mirrors {
		halts = append(halts, mr.halter())
	}
	sh.mu.Unlock()
	for _, h := range halts {
		h() // outside the lock, as in sync
	}
	sh.closeStore()
}

func (mr *mirrorRoute) start(sh *shadowing, qkey string, m *config.Mirror) {
	ctx, cancel := context.WithCancel(sh.srv.baseCtx)
	mr.qkey, mr.stop, mr.done = qkey, cancel, make(chan struct{})
	ln := &mirrorLane{
		send:    shadow.NewQueue(m.MaxQueue, m.MaxConcurrency, sh.run),
		compare: shadow.NewQueue(max(256, m.MaxConcurrency), comparers(), sh.compare),
	}
	ln.send.OnDrop((*mirrorJob).abandon)
	ln.compare.OnDrop(func(j *mirrorJob) {
		j.route.incomplete.Add(1) // stopped before its turn: nothing is compared after a stop
		j.abandon()
	})
	mr.lane.Store(ln)
	done := mr.done
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		wg.Go(func() { ln.send.Run(ctx) })
		wg.Go(func() { ln.compare.Run(ctx) })
		wg.Wait()
	}()
}

// halter detaches the route's running queue and returns what stops it and waits for its
// workers (their sandbox requests are cancelled; queued copies are dropped). Call the
// result without holding shadowing.mu.
func (mr *mirrorRoute) halter() func() {
	stop, done := mr.stop, mr.done
	mr.stop = nil
	if stop == nil {
		return func() {}
	}
	return func() {
		stop()
		<-done
	}
}

// offer mirrors the request when its route mirrors and its session is sampled. It never
// waits, and does no more than a hash, a header copy and a channel send: a full queue drops
// the copy (counted). The returned job, when not nil, must get the primary's answer through
// primaryDone.
func (sh *shadowing) offer(st *state, rt *config.CompiledRoute, preq *policy.Request, r *http.Request, ex *exchange, plan []policy.Candidate) *mirrorJob {
	m := rt.Mirror
	if m == nil || !mirrorable(preq) {
		return nil
	}
	if len(plan) > 0 && plan[0].Cluster == m.Cluster {
		return nil // the candidate serves this one itself (its split): nothing to compare it with
	}
	key := preq.Session
	if key == "" {
		key = preq.Tenant
	}
	if key == "" {
		key = preq.Client
	}
	if !shadow.Sampled(rt.Name, key, m.Fraction) {
		return nil
	}
	mr := st.mirrors[rt.Name]
	if mr == nil {
		return nil
	}
	mr.offered.Add(1)
	ln := mr.lane.Load()
	j := &mirrorJob{route: mr, lane: ln, cfg: m, preq: *preq}
	j.path, j.endpoint = r.URL.EscapedPath(), r.URL.Path
	if q := mirrorQuery(r.URL.RawQuery); q != "" {
		j.path += "?" + q
	}
	j.header = mirrorHeader(r.Header, m)
	j.header.Set("X-Request-Id", ex.id)
	j.capture = capture{limit: int(m.CaptureBytes), budget: &mr.captured, total: int64(m.CaptureTotal)}
	if len(plan) > 0 {
		j.primary.cluster, j.primary.model = plan[0].Cluster, plan[0].Model
		if cl := sh.srv.state.Load().clusters[j.primary.cluster]; cl != nil && len(cl.Endpoints()) > 0 {
			// The primary's request is not yet begun on its endpoint: count it, as the
			// sandboxes' loads count their copies.
			per, _ := cl.Load()
			j.loads.Primary = per + 1/float64(len(cl.Endpoints()))
		}
	}
	j.replica = m.Baseline == "" && m.ReplicaFraction > 0 && j.primary.cluster != "" &&
		shadow.Sampled(rt.Name+"\x00replica", ex.id, m.ReplicaFraction)
	if !ln.send.Offer(j) {
		mr.dropped.Add(1)
		return nil
	}
	ex.mirror = j
	return j
}

// mirrorable reports whether a request can be compared on a sandbox: chat, completions and
// Responses requests with a body, but not a Responses request that continues a response the
// primary stored (previous_response_id: the sandbox has no such response) or runs in the
// background (its answer is polled for later).
func mirrorable(preq *policy.Request) bool {
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

// mirrorHeader is the copy's headers: the client's without hop-by-hop headers, anything
// credential-like (Authorization, cookies, every *-Key and *-Token header, the admin token),
// the chaos header and the configured strip list, plus the configured set list.
func mirrorHeader(src http.Header, m *config.Mirror) http.Header {
	h := make(http.Header, len(src))
	copyHeaders(h, src)
	for k := range h {
		if config.CredentialLike(k) {
			delete(h, k)
		}
	}
	h.Del("Content-Length")
	h.Del("Accept-Encoding") // the answer is read as the model server wrote it
	h.Del(fault.Header)
	h.Del(fault.HeaderToken)
	for _, k := range m.StripHeaders {
		h.Del(k)
	}
	for k, v := range m.SetHeaders {
		h.Set(k, v)
	}
	return h
}

// mirrorQuery is the query without credential-like parameters (?api-key=…).
func mirrorQuery(raw string) string {
	if raw == "" {
		return ""
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return "" // not forwarded rather than forwarded unfiltered
	}
	for k := range v {
		if config.CredentialLike(k) {
			v.Del(k)
		}
	}
	return v.Encode()
}

// primaryDone hands the primary's answer to the job: a copy of the outcome and the tap,
// nothing parsed here. When the sandboxes have answered already, the triple goes to the
// route's comparers. Safe on a nil job; called once, when the handler is done writing.
func (j *mirrorJob) primaryDone(ex *exchange, res *result) {
	if j == nil {
		return
	}
	j.outcome, j.tap = ex.outcome, res.tap
	j.faulted = ex.inj.Fired()
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
			j.route.dropped.Add(1) // the comparers are behind: never wait for them
			j.release()
		}
	}
}

// sandboxDone is the worker's side of primaryDone: it compares the triple at once when the
// primary finished first, else leaves the job to the handler (for at most the mirror's
// time-out) without holding its worker.
func (sh *shadowing) sandboxDone(ctx context.Context, j *mirrorJob) {
	j.mu.Lock()
	j.sandboxIn = true
	if j.primaryIn {
		j.mu.Unlock()
		sh.compare(ctx, j)
		return
	}
	j.timer = time.AfterFunc(j.cfg.Timeout.D(), j.expire)
	j.mu.Unlock()
}

// expire gives up on a primary that did not finish within the mirror's time-out after its
// sandboxes did.
func (j *mirrorJob) expire() {
	j.mu.Lock()
	gone := j.primaryIn || j.dead
	j.dead = true
	j.mu.Unlock()
	if !gone {
		j.route.incomplete.Add(1) // its capture is released when the handler is done with it
	}
}

// abandon marks a job that will not be compared (dropped when its queue stopped) and
// releases what it holds once the handler is done with it.
func (j *mirrorJob) abandon() {
	j.mu.Lock()
	j.dead = true
	primaryIn := j.primaryIn
	j.mu.Unlock()
	if primaryIn {
		j.release()
	}
}

// release gives the job's captured bytes back to the route's budget.
func (j *mirrorJob) release() { j.capture.release() }

// primaryAnswer is the primary's answer, parsed from the capture (in the worker, after done).
func (j *mirrorJob) primaryAnswer() shadow.Answer {
	a, err := answerOf(j.capture.sse, j.capture.buf)
	if err != nil && !j.capture.truncated && j.outcome.ErrorClass == "" {
		a.ErrorClass = "unparsed"
	}
	a.Truncated = j.capture.truncated
	a.Status, a.ErrorClass = j.outcome.Status, firstNonEmpty(string(j.outcome.ErrorClass), a.ErrorClass)
	fillTimes(&a, &j.tap, j.capture.sse)
	return a
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// answerOf parses a captured answer (an SSE stream or a JSON body).
func answerOf(sse bool, b []byte) (shadow.Answer, error) {
	if len(b) == 0 {
		return shadow.Answer{}, nil
	}
	if sse {
		return shadow.AnswerFromSSE(b)
	}
	return shadow.AnswerFromChat(b)
}

// fillTimes sets an answer's latencies the same way for both sides, from the tap the relay
// (primary) or the mirror (copies) kept: TTFT from the request's send to its first token
// event, ITL the mean gap between token events, E2E to the last token; for a JSON body, E2E
// to the end of the body (which the tap records as its first token).
func fillTimes(a *shadow.Answer, tap *openai.Tap, sse bool) {
	if tap.Start.IsZero() {
		return
	}
	if sse {
		a.TTFT = tap.TTFT()
		if tap.Gaps > 0 {
			a.ITL = tap.GapSum / time.Duration(tap.Gaps)
		}
		if !tap.LastToken.IsZero() {
			a.E2E = tap.LastToken.Sub(tap.Start)
		}
	} else if !tap.FirstToken.IsZero() {
		a.E2E = tap.FirstToken.Sub(tap.Start)
	}
	if a.OutputTokens == 0 {
		a.OutputTokens = tap.Tokens
	}
}

// run serves one mirrored request (a worker of the route's send queue): the copies to the
// candidate and to the baseline or replica, sent at the same moment and read to their ends;
// then the worker is free (sandboxDone).
func (sh *shadowing) run(ctx context.Context, j *mirrorJob) {
	mr := j.route
	mr.started.Add(1)
	sctx, cancel := context.WithTimeout(ctx, j.cfg.Timeout.D())
	defer cancel()
	var cluster, role string
	side := sideCandidate
	switch {
	case j.cfg.Baseline != "":
		cluster, role, side = j.cfg.Baseline, mirrorBaseline, sideBaseline
	case j.replica:
		cluster, role, side = j.primary.cluster, mirrorReplica, sideReplica
	}
	// The baseline and the replica run the primary's version: they get the request as the
	// primary did (its model rewrite, when its split had one).
	model := j.primary.model
	var wg sync.WaitGroup
	if cluster != "" {
		wg.Go(func() {
			a, load := sh.send(sctx, j, cluster, model, role)
			j.second = &a
			if side == sideBaseline {
				j.loads.Baseline = load
			}
			count(&mr.sides[side], a)
		})
	}
	a, load := sh.send(sctx, j, j.cfg.Cluster, j.cfg.Model, mirrorCandidate)
	j.cand, j.loads.Candidate = a, load
	count(&mr.sides[sideCandidate], a)
	wg.Wait()
	sh.sandboxDone(ctx, j)
}

// count counts one sent copy of a side.
func count(c *sideCounters, a shadow.Answer) {
	c.sent.Add(1)
	if !a.OK() {
		c.failed.Add(1)
	}
}

// compare compares a job's triple (or pair) and records it: on the worker when the primary
// finished first, on a comparer when the handler handed it over.
func (sh *shadowing) compare(ctx context.Context, j *mirrorJob) {
	defer j.release()
	mr := j.route
	prim := j.primaryAnswer()
	if prim.Status == statusClientClosed || prim.ErrorClass == string(policy.ClassClientCancel) || prim.ErrorClass == string(policy.ClassShutdown) || j.faulted {
		// Nothing fair to compare: the primary did not run to its end, or chaos acted on it.
		mr.incomplete.Add(1)
		return
	}
	if mr.retired.Load() {
		return // what is compared changed meanwhile: this triple belongs to the old comparison
	}
	cand := j.cand
	var base, replica *shadow.Answer
	if j.second != nil {
		if j.cfg.Baseline != "" {
			base = j.second
		} else {
			replica = j.second
		}
	}
	if prim.Truncated || cand.Truncated || base != nil && base.Truncated {
		mr.trunc.Add(1)
	}
	req := shadow.RequestFromBody(j.preq.Body)
	req.AbnormalFinish = j.cfg.AbnormalFinish
	pr := mr.schemas.CompareTriple(req, prim, base, cand)
	pr.Loads = j.loads
	pr.Loads.Valid = j.loads.Primary > 0 && j.loads.Candidate > 0 && (base == nil || j.loads.Baseline > 0)
	mr.acc.Add(pr)
	mr.pairs.Add(1)
	mr.sides[sideCandidate].compared.Add(1)
	rec := shadow.NewPairRecord(mr.name, time.Now(), j.preq.Body, prim, cand, replica, pr)
	rec.CandidateID = mr.identity
	if base != nil {
		rec.SetBaseline(*base)
		mr.sides[sideBaseline].compared.Add(1)
	}
	if rec.ReplicaValid {
		mr.acc.AddReplicaSimilarity(rec.ReplicaSimilarity)
		mr.replicas.Add(1)
		mr.sides[sideReplica].compared.Add(1)
	}
	sh.recordPair(ctx, j, rec)
}

// send sends the job's copy to a cluster and reads the whole answer, measuring it as the
// relay measures the primary's. load is the cluster's requests in flight per endpoint once
// the copy was begun on its endpoint (0 when it was not sent).
func (sh *shadowing) send(ctx context.Context, j *mirrorJob, clusterName, model, role string) (a shadow.Answer, load float64) {
	st := sh.srv.state.Load()
	cl := st.clusters[clusterName]
	if cl == nil {
		return shadow.Answer{Status: http.StatusServiceUnavailable, ErrorClass: string(policy.ClassNoEndpoint)}, 0
	}
	ep, err := cl.Pick(nil)
	if err != nil {
		return shadow.Answer{Status: http.StatusServiceUnavailable, ErrorClass: string(policy.ClassNoEndpoint)}, 0
	}
	ep.Begin()
	defer ep.End()
	load, _ = cl.Load()
	body, _, err := bodyFor(j.preq.Body, j.preq.Model, model)
	if err != nil {
		return shadow.Answer{Status: http.StatusBadRequest, ErrorClass: string(policy.ClassInvalidRequest)}, 0
	}
	if j.preq.Kind == openai.KindResponses {
		// A copy leaves nothing behind: the server stores no response for it.
		if body, err = openai.SetField(body, "store", []byte("false")); err != nil {
			return shadow.Answer{Status: http.StatusBadRequest, ErrorClass: string(policy.ClassInvalidRequest)}, 0
		}
	}
	if j.cfg.Baseline != "" {
		// Both sandboxes answer with logprobs, so their confidence is compared (a candidate
		// less sure of itself than the baseline is a regression); the client never sees a copy.
		body = shadow.AskLogprobs(j.preq.Request, body)
	}
	base := strings.TrimSuffix(ep.URL().String(), "/")
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, base+j.path, bytes.NewReader(body))
	if err != nil {
		return shadow.Answer{Status: http.StatusBadGateway, ErrorClass: string(policy.ClassUpstreamError)}, 0
	}
	out.Header = j.header.Clone()
	out.Header.Set("X-Sluice-Mirror", role)

	// Chaos faults whose cluster filter names the sandbox act on the copy as on any attempt:
	// a way to plant a regression in a candidate and watch the verdict catch it.
	inj := sh.srv.chaos.Plan(&j.preq, j.preq.Route, nil)
	defer func() {
		inj.Done(fault.Outcome{Status: a.Status, ErrorClass: a.ErrorClass, Cluster: clusterName, Attempts: 1, ClientSawError: !a.OK()})
	}()
	var tap openai.Tap
	tap.Start = time.Now()
	resp, sse, err := send(ctx, inj.AttemptNamed(clusterName), cl, out)
	if err != nil {
		a = shadow.Answer{Status: http.StatusBadGateway, ErrorClass: string(policy.ClassConnect)}
		if ctx.Err() != nil {
			a = shadow.Answer{Status: http.StatusGatewayTimeout, ErrorClass: string(policy.ClassTimeout)}
		}
		return a, load
	}
	defer resp.Body.Close()
	capt := capture{limit: int(j.cfg.CaptureBytes), sse: sse && resp.StatusCode < 300,
		budget: &j.route.captured, total: int64(j.cfg.CaptureTotal)}
	defer capt.release() // the parsed answer is what is kept
	cut := false
	if capt.sse {
		rd := openai.NewReader(resp.Body, int(st.snap.Config.MaxEventBytes))
		for {
			ev, err := rd.Next()
			if err != nil {
				cut = !errors.Is(err, io.EOF) || !tap.Done
				break
			}
			tap.Observe(ev, time.Now())
			capt.add(ev.Raw)
		}
	} else {
		_, err := io.Copy(&capt, io.LimitReader(resp.Body, maxBufferedBody))
		cut = err != nil
		now := time.Now()
		tap.FirstToken = now // the end of the body, as the relay records it
		if !capt.truncated {
			tap.ObserveBody(capt.buf, now)
		}
	}
	var perr error
	a, perr = answerOf(capt.sse, capt.buf)
	a.Status, a.Truncated = resp.StatusCode, capt.truncated
	class, _ := statusClass(resp.StatusCode)
	a.ErrorClass = string(class)
	switch {
	case a.ErrorClass != "":
	case cut && ctx.Err() != nil:
		a.ErrorClass = string(policy.ClassTimeout)
	case cut:
		a.ErrorClass = string(policy.ClassStreamCut)
	case perr != nil && !capt.truncated:
		a.ErrorClass = string(policy.ClassUnparsed)
	}
	fillTimes(&a, &tap, capt.sse)
	return a, load
}
