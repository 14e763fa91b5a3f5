package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
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
	identity string // cluster and model of the candidate
	qkey     string // the queue's bounds
	cfg      atomic.Pointer[config.Mirror]

	queue atomic.Pointer[shadow.Queue[*mirrorJob]]
	stop  context.CancelFunc
	done  chan struct{}

	acc     *shadow.Accumulator
	schemas *shadow.SchemaCache
	since   time.Time

	pairs, replicas, failed, incomplete atomic.Int64

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
	path     string         // escaped path and query
	endpoint string         // the path alone, for the record
	header   http.Header    // the client's headers, credentials removed, the mirror's set
	req      shadow.Request
	primary  struct {
		cluster, model string // the primary's chosen candidate (the replica goes there)
	}
	replica bool

	capture capture       // the primary's answer, written by the handler before done
	done    chan struct{} // closed when the primary's answer is complete
	answer  shadow.Answer // the primary's answer, set before done is closed
}

// capture keeps up to limit bytes of an answer.
type capture struct {
	buf       []byte
	limit     int
	truncated bool
}

func (c *capture) add(b []byte) {
	if c.truncated || len(c.buf)+len(b) > c.limit {
		c.truncated = true
		return
	}
	c.buf = append(c.buf, b...)
}

// shadowing holds the routes' mirrors.
type shadowing struct {
	srv      *Server
	mu       sync.Mutex
	routes   map[string]*mirrorRoute
	store    *shadow.Store // opened when a route first mirrors
	storeErr error
}

func newShadowing(s *Server) *shadowing {
	return &shadowing{srv: s, routes: map[string]*mirrorRoute{}}
}

// route returns the named route's mirror, or nil.
func (sh *shadowing) route(name string) *mirrorRoute {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.routes[name]
}

// list returns the mirrors by route name order of the config.
func (sh *shadowing) list() []*mirrorRoute {
	st := sh.srv.state.Load()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var out []*mirrorRoute
	for _, r := range st.snap.Routes {
		if mr := sh.routes[r.Name]; mr != nil {
			out = append(out, mr)
		}
	}
	return out
}

// sync brings the mirrors in line with a new config: new routes start a mirror, removed
// ones stop theirs, changed ones keep what they can.
func (sh *shadowing) sync(c *config.Config) {
	var halts []func()
	defer func() {
		// Outside the lock: a stopping worker may still record its pair.
		for _, h := range halts {
			h()
		}
	}()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range c.Routes {
		m := r.Mirror
		if m == nil {
			continue
		}
		seen[r.Name] = true
		identity := m.Cluster + "\x00" + m.Model
		qkey := strconv.Itoa(m.MaxQueue) + "/" + strconv.Itoa(m.MaxConcurrency)
		mr := sh.routes[r.Name]
		if mr != nil && mr.identity != identity {
			halts = append(halts, mr.halter())
			mr = nil
		}
		if mr == nil {
			sh.openStore(c)
			mr = &mirrorRoute{name: r.Name, identity: identity, acc: shadow.NewAccumulator(c.Shadow.Window),
				schemas: shadow.NewSchemaCache(shadow.DefaultSchemaCacheSize), since: time.Now()}
			sh.restore(mr, c.Shadow.Window)
			sh.routes[r.Name] = mr
		}
		mr.cfg.Store(m)
		if mr.queue.Load() == nil || mr.qkey != qkey {
			halts = append(halts, mr.halter())
			mr.start(sh, qkey, m)
		}
	}
	for name, mr := range sh.routes {
		if !seen[name] {
			halts = append(halts, mr.halter())
			delete(sh.routes, name)
		}
	}
}

// close stops every mirror (at shutdown).
func (sh *shadowing) close() {
	sh.mu.Lock()
	var halts []func()
	for _, mr := range sh.routes {
		halts = append(halts, mr.halter())
	}
	sh.mu.Unlock()
	for _, h := range halts {
		h() // outside the lock: a stopping worker may still record its pair
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.store != nil {
		if err := sh.store.Close(); err != nil {
			sh.srv.log.Warn("shadow store close", "err", err)
		}
		sh.store = nil
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
// waits: a full queue drops the copy (counted). The returned job, when not nil, must get the
// primary's answer through primaryDone.
func (sh *shadowing) offer(st *state, rt *config.CompiledRoute, preq *policy.Request, r *http.Request, ex *exchange, plan []policy.Candidate) *mirrorJob {
	m := rt.Mirror
	if m == nil || (preq.Kind != openai.KindChat && preq.Kind != openai.KindCompletion) || preq.Body == nil {
		return nil
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
	j := &mirrorJob{route: mr, cfg: m, preq: *preq, done: make(chan struct{})}
	j.path, j.endpoint = r.URL.EscapedPath(), r.URL.Path
	if r.URL.RawQuery != "" {
		j.path += "?" + r.URL.RawQuery
	}
	j.header = mirrorHeader(r.Header, m)
	j.header.Set("X-Request-Id", ex.id)
	j.req = shadow.RequestFromBody(preq.Body)
	j.capture.limit = int(m.CaptureBytes)
	if len(plan) > 0 {
		j.primary.cluster, j.primary.model = plan[0].Cluster, plan[0].Model
	}
	j.replica = m.ReplicaFraction > 0 && j.primary.cluster != "" &&
		shadow.Sampled(rt.Name+"\x00replica", ex.id, m.ReplicaFraction)
	if !mr.queue.Load().Offer(j) {
		return nil
	}
	ex.mirror = j
	return j
}

// mirrorHeader is the copy's headers: the client's without hop-by-hop headers, credentials,
// the chaos header and the configured strip list, plus the configured set list.
func mirrorHeader(src http.Header, m *config.Mirror) http.Header {
	h := make(http.Header, len(src))
	copyHeaders(h, src)
	for _, k := range config.CredentialHeaders {
		h.Del(k)
	}
	h.Del("Content-Length")
	h.Del("Accept-Encoding") // the answer is read as the model server wrote it
	h.Del(fault.Header)
	for _, k := range m.StripHeaders {
		h.Del(k)
	}
	for k, v := range m.SetHeaders {
		h.Set(k, v)
	}
	return h
}

// primaryDone hands the primary's answer to the job's worker. Safe on a nil job.
func (j *mirrorJob) primaryDone(ex *exchange, res *result) {
	if j == nil {
		return
	}
	a, err := answerOf(j.preq.Stream, j.capture.buf)
	if err != nil && ex.outcome.ErrorClass == "" {
		a.ErrorClass = "unparsed"
	}
	a.Status, a.ErrorClass = ex.outcome.Status, firstNonEmpty(ex.outcome.ErrorClass, a.ErrorClass)
	fillTimes(&a, &res.tap, j.preq.Stream, time.Now())
	j.answer = a
	close(j.done)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// answerOf parses a captured answer (an SSE stream or a JSON body).
func answerOf(stream bool, b []byte) (shadow.Answer, error) {
	if len(b) == 0 {
		return shadow.Answer{}, nil
	}
	if stream {
		return shadow.AnswerFromSSE(b)
	}
	return shadow.AnswerFromChat(b)
}

// fillTimes sets an answer's latencies the same way for both sides: TTFT from the request's
// send to its first token event, ITL the mean gap between token events, E2E to the last
// token (streams) or to the end of the body.
func fillTimes(a *shadow.Answer, tap *openai.Tap, stream bool, end time.Time) {
	if tap.Start.IsZero() {
		return
	}
	if stream {
		a.TTFT = tap.TTFT()
		if tap.Gaps > 0 {
			a.ITL = tap.GapSum / time.Duration(tap.Gaps)
		}
		if !tap.LastToken.IsZero() {
			a.E2E = tap.LastToken.Sub(tap.Start)
		}
	} else {
		a.E2E = end.Sub(tap.Start)
	}
	if a.OutputTokens == 0 {
		a.OutputTokens = tap.Tokens
	}
}

// run serves one mirrored request (a worker of the route's queue).
func (sh *shadowing) run(ctx context.Context, j *mirrorJob) {
	mr := j.route
	ctx, cancel := context.WithTimeout(ctx, j.cfg.Timeout.D())
	defer cancel()
	cand := sh.send(ctx, j, j.cfg.Cluster, j.cfg.Model, mirrorCandidate)
	select {
	case <-j.done:
	case <-ctx.Done():
		mr.incomplete.Add(1)
		return
	}
	prim := j.answer
	if prim.Status == statusClientClosed || prim.ErrorClass == classClientCancel || prim.ErrorClass == classShutdown {
		mr.incomplete.Add(1) // nothing to compare: the primary did not run to its end
		return
	}
	if !cand.OK() {
		mr.failed.Add(1)
	}
	pr := mr.schemas.Compare(j.req, prim, cand)
	mr.acc.Add(pr)
	mr.pairs.Add(1)
	var replica *shadow.Answer
	if j.replica && prim.OK() {
		rep := sh.send(ctx, j, j.primary.cluster, j.primary.model, mirrorReplica)
		replica = &rep
	}
	rec := shadow.NewPairRecord(mr.name, time.Now(), j.preq.Body, prim, cand, replica, pr)
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
	u := *ep.URL()
	base := strings.TrimSuffix(u.String(), "/")
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
	at := inj.Attempt(clusterName)
	var tap openai.Tap
	tap.Start = time.Now()
	var resp *http.Response
	ab, err := at.Before(ctx)
	switch {
	case err != nil:
	case ab != nil:
		resp = ab.Response(out)
	default:
		resp, err = cl.Transport().RoundTrip(out)
	}
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
	capt := capture{limit: int(j.cfg.CaptureBytes)}
	cut := false
	if sse && resp.StatusCode < 300 {
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
		tap.Observe(openai.Event{Data: capt.buf}, time.Now())
	}
	end := time.Now()
	a, perr := answerOf(sse, capt.buf)
	a.Status = resp.StatusCode
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
	fillTimes(&a, &tap, sse, end)
	return a
}

// Write makes a capture an io.Writer that keeps the first limit bytes and discards the rest.
func (c *capture) Write(p []byte) (int, error) {
	c.add(p)
	return len(p), nil
}
