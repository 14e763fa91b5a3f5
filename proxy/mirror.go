package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/openai"
	"github.com/sluicegw/sluice/shadow"
)

// Mirroring (routes with a `mirror:` block). The handler offers a copy of a sampled request
// to the route's bounded queue and goes on at once; a worker sends the copy to the sandbox
// cluster while the primary is being served, waits for the primary's answer, compares the
// pair and records it. Nothing here is on the primary's path except the offer (a hash and a
// non-blocking channel send) and, for mirrored requests only, a bounded copy of the answer.

// Mirror roles, sent to the upstream in X-Sluice-Mirror.
const (
	mirrorCandidate = "candidate"
	mirrorReplica   = "replica"
)

// mirrorRoute is one route's mirror: its queue and workers, and the comparison so far. It
// lives across reloads; a reload that changes the candidate (cluster or model) starts a new
// comparison, one that changes the queue's bounds starts a new queue.
type mirrorRoute struct {
	name     string
	identity string // the candidate: cluster, and model when rewritten ("cand" or "cand/model")
	qkey     string // the queue's bounds
	cfg      atomic.Pointer[config.Mirror]

	queue atomic.Pointer[shadow.Queue[*mirrorJob]]
	stop  context.CancelFunc
	done  chan struct{}

	acc     *shadow.Accumulator
	schemas *shadow.SchemaCache
	retired atomic.Bool // replaced by a new candidate or removed: its pairs are not kept

	// Counters since the route started mirroring (they survive a new queue).
	offered, dropped, started                  atomic.Int64
	pairs, replicas, failed, incomplete, trunc atomic.Int64

	mu      sync.Mutex
	verdict *shadow.Verdict // the latest
	judged  time.Time
	stepped time.Time // the last weight progression step
	action  string    // what the progression last did
}

// mirrorJob is one mirrored request.
type mirrorJob struct {
	route    *mirrorRoute
	cfg      *config.Mirror
	preq     policy.Request // a copy taken when offered (the body and parsed request are read-only)
	path     string         // escaped path and the query without credential-like parameters
	endpoint string         // the path alone, for the record
	header   http.Header    // the client's headers, credentials removed, the mirror's set
	primary  struct {
		cluster, model string // the primary's chosen candidate (the replica goes there)
	}
	replica bool

	capture capture       // the primary's answer, written by the handler before done
	done    chan struct{} // closed when the primary's answer is complete
	// Set by the handler before done is closed; the worker parses the capture (the primary's
	// handler does no more than copy the events it relays).
	outcome policy.Outcome
	tap     openai.Tap
	faulted bool // chaos faults acted on the primary: not a fair comparison
}

// capture keeps the first limit bytes of an answer and whether it was an SSE stream.
type capture struct {
	buf       []byte
	limit     int
	truncated bool
	sse       bool
}

func (c *capture) add(b []byte) {
	if room := c.limit - len(c.buf); len(b) > room {
		c.truncated = true
		b = b[:max(0, room)]
	}
	c.buf = append(c.buf, b...)
}

// Write makes a capture an io.Writer that keeps the first limit bytes and discards the rest.
func (c *capture) Write(p []byte) (int, error) {
	c.add(p)
	return len(p), nil
}

// shadowing holds the routes' mirrors. The handler reads the route map without a lock (it is
// replaced whole); sync, judging and closing are serialised by mu.
type shadowing struct {
	srv      *Server
	mu       sync.Mutex
	judging  sync.Mutex
	routes   atomic.Pointer[map[string]*mirrorRoute]
	store    atomic.Pointer[shadow.Store] // opened when a route first mirrors
	storeErr error
}

func newShadowing(s *Server) *shadowing {
	sh := &shadowing{srv: s}
	sh.routes.Store(&map[string]*mirrorRoute{})
	return sh
}

// route returns the named route's mirror, or nil.
func (sh *shadowing) route(name string) *mirrorRoute { return (*sh.routes.Load())[name] }

// list returns the mirrors in the order of the config's routes.
func (sh *shadowing) list() []*mirrorRoute {
	st := sh.srv.state.Load()
	routes := *sh.routes.Load()
	var out []*mirrorRoute
	for _, r := range st.snap.Routes {
		if mr := routes[r.Name]; mr != nil {
			out = append(out, mr)
		}
	}
	return out
}

// identityOf names a mirror's candidate.
func identityOf(m *config.Mirror) string {
	if m.Model == "" {
		return m.Cluster
	}
	return m.Cluster + "/" + m.Model
}

// sync brings the mirrors in line with a new config: new routes start a mirror, removed
// ones stop theirs, changed ones keep what they can.
func (sh *shadowing) sync(c *config.Config) {
	var halts []func()
	defer func() {
		// Outside the lock: a stopping worker may still be finishing its pair.
		for _, h := range halts {
			h()
		}
	}()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old := *sh.routes.Load()
	next := make(map[string]*mirrorRoute, len(old))
	for _, r := range c.Routes {
		m := r.Mirror
		if m == nil {
			continue
		}
		identity := identityOf(m)
		qkey := strconv.Itoa(m.MaxQueue) + "/" + strconv.Itoa(m.MaxConcurrency)
		mr := old[r.Name]
		if mr != nil && mr.identity != identity {
			mr.retired.Store(true)
			halts = append(halts, mr.halter())
			mr = nil
		}
		if mr == nil {
			sh.openStore(c)
			mr = &mirrorRoute{name: r.Name, identity: identity, acc: shadow.NewAccumulator(c.Shadow.Window),
				schemas: shadow.NewSchemaCache(shadow.DefaultSchemaCacheSize)}
			sh.restore(mr, c.Shadow.Window)
		}
		next[r.Name] = mr
		mr.cfg.Store(m)
		if mr.queue.Load() == nil || mr.qkey != qkey {
			halts = append(halts, mr.halter())
			mr.start(sh, qkey, m)
		}
	}
	for name, mr := range old {
		if next[name] == nil {
			mr.retired.Store(true)
			halts = append(halts, mr.halter())
		}
	}
	sh.routes.Store(&next)
}

// close stops every mirror and closes the store (at shutdown).
func (sh *shadowing) close() {
	sh.mu.Lock()
	var halts []func()
	for _, mr := range *sh.routes.Load() {
		halts = append(halts, mr.halter())
	}
	sh.mu.Unlock()
	for _, h := range halts {
		h() // outside the lock, as in sync
	}
	if st := sh.store.Swap(nil); st != nil {
		if err := st.Close(); err != nil {
			sh.srv.log.Warn("shadow store close", "err", err)
		}
	}
}

func (mr *mirrorRoute) start(sh *shadowing, qkey string, m *config.Mirror) {
	ctx, cancel := context.WithCancel(sh.srv.baseCtx)
	mr.qkey, mr.stop, mr.done = qkey, cancel, make(chan struct{})
	q, done := shadow.NewQueue(m.MaxQueue, m.MaxConcurrency, sh.run), mr.done
	mr.queue.Store(q)
	go func() {
		defer close(done)
		q.Run(ctx)
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
func (sh *shadowing) offer(rt *config.CompiledRoute, preq *policy.Request, r *http.Request, ex *exchange, plan []policy.Candidate) *mirrorJob {
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
	mr := sh.route(rt.Name)
	if mr == nil {
		return nil
	}
	mr.offered.Add(1)
	j := &mirrorJob{route: mr, cfg: m, preq: *preq, done: make(chan struct{})}
	j.path, j.endpoint = r.URL.EscapedPath(), r.URL.Path
	if q := mirrorQuery(r.URL.RawQuery); q != "" {
		j.path += "?" + q
	}
	j.header = mirrorHeader(r.Header, m)
	j.header.Set("X-Request-Id", ex.id)
	j.capture.limit = int(m.CaptureBytes)
	if len(plan) > 0 {
		j.primary.cluster, j.primary.model = plan[0].Cluster, plan[0].Model
	}
	j.replica = m.ReplicaFraction > 0 && j.primary.cluster != "" &&
		shadow.Sampled(rt.Name+"\x00replica", ex.id, m.ReplicaFraction)
	if !mr.queue.Load().Offer(j) {
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

// primaryDone hands the primary's answer to the job's worker: a copy of the outcome and the
// tap, nothing parsed here. Safe on a nil job.
func (j *mirrorJob) primaryDone(ex *exchange, res *result) {
	if j == nil {
		return
	}
	j.outcome, j.tap = ex.outcome, res.tap
	j.faulted = ex.inj.Fired()
	close(j.done)
}

// primaryAnswer is the primary's answer, parsed from the capture (in the worker, after done).
func (j *mirrorJob) primaryAnswer() shadow.Answer {
	a, err := answerOf(j.capture.sse, j.capture.buf)
	if err != nil && !j.capture.truncated && j.outcome.ErrorClass == "" {
		a.ErrorClass = "unparsed"
	}
	a.Truncated = j.capture.truncated
	a.Status, a.ErrorClass = j.outcome.Status, firstNonEmpty(j.outcome.ErrorClass, a.ErrorClass)
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

// run serves one mirrored request (a worker of the route's queue): the copy to the sandbox,
// then, once the primary has finished, the comparison.
func (sh *shadowing) run(ctx context.Context, j *mirrorJob) {
	mr := j.route
	mr.started.Add(1)
	sctx, cancel := context.WithTimeout(ctx, j.cfg.Timeout.D())
	cand := sh.send(sctx, j, j.cfg.Cluster, j.cfg.Model, mirrorCandidate)
	cancel()
	// The primary usually finished first; otherwise wait for it as long as a copy may take.
	select {
	case <-j.done:
	default:
		wait := time.NewTimer(j.cfg.Timeout.D())
		select {
		case <-j.done:
			wait.Stop()
		case <-wait.C:
			mr.incomplete.Add(1)
			return
		case <-ctx.Done():
			wait.Stop()
			mr.incomplete.Add(1)
			return
		}
	}
	prim := j.primaryAnswer()
	if prim.Status == statusClientClosed || prim.ErrorClass == classClientCancel || prim.ErrorClass == classShutdown || j.faulted {
		// Nothing fair to compare: the primary did not run to its end, or chaos acted on it.
		mr.incomplete.Add(1)
		return
	}
	if !cand.OK() {
		mr.failed.Add(1)
	}
	if prim.Truncated || cand.Truncated {
		mr.trunc.Add(1)
	}
	pr := mr.schemas.Compare(shadow.RequestFromBody(j.preq.Body), prim, cand)
	var replica *shadow.Answer
	if j.replica && prim.OK() {
		rctx, cancel := context.WithTimeout(ctx, j.cfg.Timeout.D())
		rep := sh.send(rctx, j, j.primary.cluster, j.primary.model, mirrorReplica)
		cancel()
		replica = &rep
	}
	if mr.retired.Load() {
		return // the candidate changed meanwhile: this pair belongs to the old comparison
	}
	mr.acc.Add(pr)
	mr.pairs.Add(1)
	rec := shadow.NewPairRecord(mr.name, time.Now(), j.preq.Body, prim, cand, replica, pr)
	rec.CandidateID = mr.identity
	if rec.ReplicaValid {
		mr.acc.AddReplicaSimilarity(rec.ReplicaSimilarity)
		mr.replicas.Add(1)
	}
	sh.recordPair(ctx, j, rec)
}

// send sends the job's copy to a cluster and reads the whole answer, measuring it as the
// relay measures the primary's.
func (sh *shadowing) send(ctx context.Context, j *mirrorJob, clusterName, model, role string) shadow.Answer {
	st := sh.srv.state.Load()
	cl := st.clusters[clusterName]
	if cl == nil {
		return shadow.Answer{Status: http.StatusServiceUnavailable, ErrorClass: classNoEndpoint}
	}
	ep, err := cl.Pick(nil)
	if err != nil {
		return shadow.Answer{Status: http.StatusServiceUnavailable, ErrorClass: classNoEndpoint}
	}
	ep.Begin()
	defer ep.End()
	body := j.preq.Body
	if model != "" && model != j.preq.Model {
		if body, err = openai.SetModel(body, model); err != nil {
			return shadow.Answer{Status: http.StatusBadRequest, ErrorClass: "bad_request"}
		}
	}
	if j.preq.Kind == openai.KindResponses {
		// A copy leaves nothing behind: the server stores no response for it.
		if body, err = openai.SetField(body, "store", []byte("false")); err != nil {
			return shadow.Answer{Status: http.StatusBadRequest, ErrorClass: "bad_request"}
		}
	}
	base := strings.TrimSuffix(ep.URL().String(), "/")
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, base+j.path, bytes.NewReader(body))
	if err != nil {
		return shadow.Answer{Status: http.StatusBadGateway, ErrorClass: classUpstreamError}
	}
	out.Header = j.header.Clone()
	out.Header.Set("X-Sluice-Mirror", role)
	if cl.apiKey != "" {
		out.Header.Set("Authorization", "Bearer "+cl.apiKey)
	}

	// Chaos faults whose cluster filter names the sandbox act on the copy as on any attempt:
	// a way to plant a regression in a candidate and watch the verdict catch it.
	inj := sh.srv.chaos.Plan(&j.preq, j.preq.Route, nil)
	var a shadow.Answer
	defer func() {
		inj.Done(fault.Outcome{Status: a.Status, ErrorClass: a.ErrorClass, Cluster: clusterName, Attempts: 1, ClientSawError: !a.OK()})
	}()
	at := inj.AttemptNamed(clusterName)
	var tap openai.Tap
	tap.Start = time.Now()
	resp, err := roundTrip(ctx, at, cl, out)
	if err != nil {
		a = shadow.Answer{Status: http.StatusBadGateway, ErrorClass: classConnect}
		if ctx.Err() != nil {
			a = shadow.Answer{Status: http.StatusGatewayTimeout, ErrorClass: classTimeout}
		}
		return a
	}
	defer resp.Body.Close()
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if resp.StatusCode < 300 {
		resp.Body = at.WrapUpstream(ctx, resp.Body, sse)
	}
	capt := capture{limit: int(j.cfg.CaptureBytes), sse: sse && resp.StatusCode < 300}
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
	a, perr := answerOf(capt.sse, capt.buf)
	a.Status, a.Truncated = resp.StatusCode, capt.truncated
	switch s := resp.StatusCode; {
	case s == http.StatusTooManyRequests:
		a.ErrorClass = classUpstream429
	case s >= 500:
		a.ErrorClass = classUpstream5xx
	case s >= 400:
		a.ErrorClass = classUpstream4xx
	case cut && ctx.Err() != nil:
		a.ErrorClass = classTimeout
	case cut:
		a.ErrorClass = classStreamCut
	case perr != nil && !capt.truncated:
		a.ErrorClass = "unparsed"
	}
	fillTimes(&a, &tap, capt.sse)
	return a
}
