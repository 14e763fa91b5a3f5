package proxy

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/shadow"
)

// Mirroring (routes with a `mirror:` block). The runtime (queues, workers, the job's life,
// the comparison) is shadow.Mirror's; the gateway offers it the sampled requests
// (shadowing.offer), sends its copies through the one sender (SendCopy: the pick, the
// endpoint's load, the model rewrite, chaos faults) and keeps its pairs (shadow_store.go).
// The verdicts and the weight progression are the gateway's (shadow_judge.go).

// mirrorRoute is one route's mirror with the gateway's judging of it. It lives across
// reloads; a reload that changes what is compared (candidate, model, baseline) starts a new
// one, one that changes the queue's bounds starts a new lane.
type mirrorRoute struct {
	*shadow.Mirror
	cfg atomic.Pointer[config.Mirror]

	mu      sync.Mutex
	verdict *shadow.Verdict // the latest
	judged  time.Time
	stepped time.Time // the last weight progression step
	action  string    // what the progression last did
	rate    rateSample
	basis   atomic.Pointer[judgement] // what the latest verdict judged (shadow_judge.go)
}

// rateSample is the requests begun on the reference's and the candidate's clusters at the
// last verdict, for their request rates per endpoint over the interval since.
type rateSample struct {
	at                time.Time
	reference, cand   int64
	refName, candName string
	refRate, candRate float64 // per endpoint, per second, over the last interval
}

// mirrorSettings are a mirror block's settings for the shadow runtime.
func mirrorSettings(c *config.Config, m *config.Mirror) *shadow.Settings {
	return &shadow.Settings{
		Cluster: m.Cluster, Model: m.Model, Baseline: m.Baseline,
		Fraction: m.Fraction, ReplicaFraction: m.ReplicaFraction,
		MaxQueue: m.MaxQueue, MaxConcurrency: m.MaxConcurrency, Timeout: m.Timeout.D(),
		CaptureBytes: int(m.CaptureBytes), CaptureTotal: int64(m.CaptureTotal),
		MaxEventBytes: int(c.MaxEventBytes), AbnormalFinish: m.AbnormalFinish,
	}
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
		set := mirrorSettings(c, m)
		mr := old[r.Name]
		if mr != nil && mr.Identity() != set.Identity() {
			mr = nil // retired below: a new comparison starts
		}
		if mr == nil {
			sh.openStore(c)
			mr = &mirrorRoute{}
			mr.Mirror = shadow.NewMirror(r.Name, set, c.Shadow.Window, sh, sh.recordPair)
			sh.restore(mr, c.Shadow.Window)
		}
		mirrors[r.Name] = mr
		mr.cfg.Store(m)
		halts = append(halts, mr.Configure(sh.srv.baseCtx, set))
	}
	next.mirrors = mirrors
	swap()
	// The generation that no longer serves keeps its mirrors until the swap: then those the
	// new one does not have stop.
	for name, mr := range old {
		if mirrors[name] != mr {
			halts = append(halts, mr.Retire())
		}
	}
}

// close stops every mirror and closes the store (at shutdown).
func (sh *shadowing) close() {
	sh.mu.Lock()
	sh.closed = true
	var halts []func()
	for _, mr := range sh.srv.state.Load().mirrors {
		halts = append(halts, mr.Halter())
	}
	sh.mu.Unlock()
	for _, h := range halts {
		h() // outside the lock, as in sync
	}
	sh.closeStore()
}

// offer mirrors the request when its route mirrors and its session is sampled. It never
// waits, and does no more than a hash, a header copy and a channel send: a full queue drops
// the copy (counted). The returned job, when not nil, gets the primary's answer in the
// relay (its capture) and at the end through mirrorDone.
func (sh *shadowing) offer(st *state, rt *config.CompiledRoute, preq *policy.Request, r *http.Request, ex *exchange, plan []policy.Candidate) *shadow.Job {
	m := rt.Mirror
	if m == nil {
		return nil
	}
	var primary string
	if len(plan) > 0 {
		primary = plan[0].Cluster
	}
	mr := st.mirrors[rt.Name]
	if mr == nil || !mr.Samples(preq, primary) {
		return nil // not sampled, or the candidate's split serves it: nothing is copied
	}
	o := shadow.Offer{Request: preq, ID: ex.id, Endpoint: r.URL.Path, Path: r.URL.EscapedPath(), Header: mirrorHeader(r.Header, m)}
	if q := mirrorQuery(r.URL.RawQuery); q != "" {
		o.Path += "?" + q
	}
	o.Header.Set("X-Request-Id", ex.id)
	if len(plan) > 0 {
		o.PrimaryCluster, o.PrimaryModel = primary, plan[0].Model
		if cl := st.clusters[primary]; cl != nil && len(cl.Endpoints()) > 0 {
			// The primary's request is not yet begun on its endpoint: count it, as the
			// sandboxes' loads count their copies.
			per, _ := cl.Load()
			o.PrimaryLoad = per + 1/float64(len(cl.Endpoints()))
		}
	}
	j := mr.Offer(o)
	ex.mirror = j
	return j
}

// mirrorHeader is the copy's headers: the client's without hop-by-hop headers, anything
// credential-like (Authorization, cookies, every *-Key and *-Token header, the admin token),
// what an attempt never forwards either (the chaos headers, URL and host overrides) and the
// configured strip list, plus the configured set list.
func mirrorHeader(src http.Header, m *config.Mirror) http.Header {
	h := make(http.Header, len(src))
	httphead.CopyEndToEndExcept(h, src, mirrorSkips)
	stripCredentials(h) // a sandbox never sees the client's (send adds the cluster's own)
	for _, k := range m.StripHeaders {
		h.Del(k)
	}
	for k, v := range m.SetHeaders {
		h.Set(k, v)
	}
	return h
}

// mirrorSkips reports the client's headers a copy leaves out: the length, Accept-Encoding
// (the answer is read as the model server wrote it), and Sluice's own (chaos) and URL-override
// headers, as for attempts.
func mirrorSkips(k string) bool {
	return k == "Content-Length" || k == "Accept-Encoding" || overriding(k)
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

// mirrorDone hands the primary's answer to its mirrored job (nil when not mirrored): the
// outcome, the tap and whether chaos faults acted on it.
func mirrorDone(j *shadow.Job, ex *exchange, res *result) {
	if j != nil {
		j.PrimaryDone(ex.outcome, &res.tap, ex.inj.Fired())
	}
}

// SendCopy sends the job's copy to a cluster and reads the whole answer (shadow.Sender), as
// an attempt is sent: a pick, the endpoint's begin and end, the model rewrite, the one
// sender with the copy's own headers, and chaos faults whose cluster filter names the
// sandbox. load is the cluster's requests in flight per endpoint once the copy was begun on
// its endpoint (0 when it was not sent).
func (sh *shadowing) SendCopy(ctx context.Context, j *shadow.Job, clusterName, model, role string) (a shadow.Answer, load float64) {
	st := sh.srv.state.Load()
	cl := st.clusters[clusterName]
	if cl == nil {
		return failedCopy(policy.ClassNoEndpoint), 0
	}
	ep, err := cl.Pick(nil)
	if err != nil {
		return failedCopy(policy.ClassNoEndpoint), 0
	}
	ep.Begin()
	defer ep.End()
	load, _ = cl.Load()
	preq := &j.Request
	body, _, err := bodyFor(preq.Body, preq.Model, model)
	if err != nil {
		return failedCopy(policy.ClassInvalidRequest), 0
	}
	if preq.Kind == openai.KindResponses {
		// A copy leaves nothing behind: the server stores no response for it.
		if body, err = openai.SetField(body, "store", []byte("false")); err != nil {
			return failedCopy(policy.ClassInvalidRequest), 0
		}
	}
	if j.Settings().Baseline != "" {
		// Both sandboxes answer with logprobs, so their confidence is compared (a candidate
		// less sure of itself than the baseline is a regression); the client never sees a copy.
		body = shadow.AskLogprobs(preq.Request, body)
	}
	base := strings.TrimSuffix(ep.URL().String(), "/")
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, base+j.Path, bytes.NewReader(body))
	if err != nil {
		return failedCopy(policy.ClassUpstreamError), 0
	}
	out.Header = j.Header.Clone()
	out.Header.Set("X-Sluice-Mirror", role)

	// Chaos faults whose cluster filter names the sandbox act on the copy as on any attempt:
	// a way to plant a regression in a candidate and watch the verdict catch it.
	inj := sh.srv.chaos.Plan(preq, preq.Route, nil)
	defer func() {
		inj.Done(fault.Outcome{Status: a.Status, ErrorClass: a.ErrorClass, Cluster: clusterName, Attempts: 1, ClientSawError: !a.OK()})
	}()
	start := time.Now()
	resp, sse, err := send(ctx, inj.AttemptNamed(clusterName), cl, out)
	if err != nil {
		if ctx.Err() != nil {
			return failedCopy(policy.ClassTimeout), load
		}
		return failedCopy(policy.ClassConnect), load
	}
	defer resp.Body.Close()
	return j.ReadAnswer(ctx, resp, sse, start), load
}

// failedCopy is the answer of a copy that failed before an answer: the class's status.
func failedCopy(c policy.Class) shadow.Answer {
	return shadow.Answer{Status: c.Info().Status, ErrorClass: string(c)}
}
