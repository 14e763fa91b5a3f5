package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/alarm"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/proxy/scope"
	"github.com/sluicegw/sluice/proxy/telemetry"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// forward is the retry/fallback loop, the one place where attempts are repeated. The plan is
// the route's candidates in order (the split, then the fallback steps). On each candidate:
// its breaker, an endpoint, the attempt; a failure before anything reached the client is
// retried on the same candidate (retry.attempts, back-off, Retry-After, under the retry
// budget; a connection failure once on another endpoint at once) and then moves on to the
// next candidate when the failure is one of the conditions the plan moves on for. After the
// first byte, a cut stream is resumed on the next candidate (resume: true) or ends with an
// in-band error event.
func (h *Handler) forward(ctx context.Context, ex *exchange, st *state, rt *config.CompiledRoute, plan []policy.Candidate) result {
	rtr := st.routers[rt.Index]
	rtr.Budgets().RecordRequest()
	replayable := ex.preq.Body != nil || ex.r.Body == nil || ex.r.Body == http.NoBody
	ex.capture = rtr.Resume() && ex.preq.Kind == openai.KindChat && ex.preq.Stream && ex.preq.N <= 1
	var res result
	attempts := 0
	for ci := 0; ci < len(plan); ci++ {
		cand := plan[ci]
		cond := h.tryCandidate(ctx, ex, st, rt, rtr, cand, ci > 0, &res, &attempts)
		if ctx.Err() != nil || !replayable || cond == "" || !route.Moves(cand, cond) || ci+1 == len(plan) {
			break
		}
		if ex.committed && !h.prepareResume(ex, &res) {
			break
		}
	}
	return h.settlePending(ex, res)
}

// tryCandidate runs the attempts on one candidate (fallback: it is not the plan's first). It
// returns the condition of the last failure ("" when it succeeded, failed for good, or a
// budget allows no more attempts). The first attempt on a fallback spends the fallback
// budget of its cluster, every further attempt on a candidate the retry budget of its
// cluster.
func (h *Handler) tryCandidate(ctx context.Context, ex *exchange, st *state, rt *config.CompiledRoute, rtr *route.Router, cand policy.Candidate, fallback bool, res *result, attempts *int) string {
	cl := st.clusters[cand.Cluster]
	if cl == nil {
		unavailable(ex, res, classFailure(policy.ClassNoEndpoint, time.Second), cand.Cluster)
		return policy.CondNoEndpoint
	}
	var prev *upstream.Endpoint
	for try := 0; ; try++ {
		done, ok := rtr.Breakers().Allow(cand.Cluster)
		if !ok {
			h.srv.tel.UpstreamError(ctx, cand.Cluster, string(policy.ClassBreakerOpen))
			unavailable(ex, res, classFailure(policy.ClassBreakerOpen, rtr.Breakers().RetryAfter(cand.Cluster)), cand.Cluster)
			return policy.CondBreakerOpen
		}
		ep, err := cl.PickFor(prev, upstream.Hint{PrefixHash: ex.preq.PrefixHash, PrefixLen: ex.preq.PrefixLen, Home: ex.home})
		if err != nil {
			done.End(false, true)
			h.srv.tel.UpstreamError(ctx, cand.Cluster, string(policy.ClassNoEndpoint))
			unavailable(ex, res, classFailure(policy.ClassNoEndpoint, time.Second), cand.Cluster)
			return policy.CondNoEndpoint
		}
		if !h.spend(ctx, ex, rt, rtr, cand.Cluster, try, fallback) {
			// The budget is spent: no new upstream request; the last answer stands.
			done.End(false, true)
			return ""
		}
		*attempts++
		resumed := ex.committed
		ex.giveBack(&h.srv.buffers) // the answer held from the attempt before is dropped now
		*res = h.attempt(ctx, ex, limitsOf(rt, rtr, cand), cand, cl, ep, *attempts)
		code := res.errorCode()
		class := res.class()
		failed, excluded := rtr.Verdict(class, res.status, code)
		done.End(failed, excluded)
		if class != "" && class != policy.ClassClientCancel && class != policy.ClassBodyTimeout {
			h.srv.tel.UpstreamError(ctx, cand.Cluster, string(class))
		}
		if resumed && res.fail != nil && class != policy.ClassClientCancel {
			// The continuation failed before its first byte: a transport error, or an
			// upstream error answer (res.pending), which cannot be relayed mid-stream. Either
			// way the client's stream ends with an in-band error, never silently.
			res.fail.Phase, res.pending = policy.InStream, nil
		}
		if ex.committed {
			if res.fail != nil && ex.sse && (class == policy.ClassStreamCut || class == policy.ClassIdleTimeout || class == policy.ClassStreamError) {
				return policy.CondStreamCut
			}
			return ""
		}
		cond := rtr.Condition(class, res.status, code)
		// A contract mismatch moves on whatever its class (a 4xx the route says is the
		// candidate's, not the request's).
		if res.fail == nil || !(res.fail.Retryable() || cond == policy.CondContract) || ctx.Err() != nil {
			return ""
		}
		// Retry this candidate: at once on another endpoint after a connection failure
		// (nothing reached the model server), else after a back-off.
		switch {
		case try+1 < rtr.Attempts():
			wait, ok := rtr.Backoff(try, res.retryAfter())
			if !ok || !sleep(ctx, wait) {
				return cond
			}
		case class == policy.ClassConnect && try == 0 && len(cl.Endpoints()) > 1:
		default:
			return cond
		}
		prev = ep
	}
}

// unavailable records that a candidate could not be tried (unknown cluster, breaker open, no
// endpoint). Before anything reached the client it is the request's answer; once a stream
// has started (a resume), the stream keeps what the client has and ends with this in-band
// error unless a later candidate continues it.
func unavailable(ex *exchange, res *result, f *policy.Failure, cluster string) {
	if !ex.committed {
		*res = failed(f)
		res.cluster = cluster
		return
	}
	f.Phase = policy.InStream
	res.fail, res.upstreamErr, res.pending = f, nil, nil
}

// budgetLogEvery bounds the log of a route's budget refusals to one line per kind and interval.
const budgetLogEvery = 10 * time.Second

// spend records the attempt number try on cluster in the route's budgets: the first attempt
// of the plan is a send, the first on a fallback spends the cluster's fallback budget, the
// others its retry budget. When the budget refuses, the refusal is said in a response header
// (if the client has none yet) and logged at most once per budgetLogEvery; the counter is
// the budgets' own (sluice_retry_budget_exhausted_total).
func (h *Handler) spend(ctx context.Context, ex *exchange, rt *config.CompiledRoute, rtr *route.Router, cluster string, try int, fallback bool) bool {
	b := rtr.Budgets()
	kind := route.KindRetry
	switch {
	case try == 0 && !fallback:
		b.RecordSend(cluster)
		return true
	case try == 0:
		if b.TryFallback(cluster) {
			return true
		}
		kind = route.KindFallback
	default:
		if b.TryRetry(cluster) {
			return true
		}
	}
	if !ex.committed {
		ex.w.Header().Set("X-Sluice-Budget-Exhausted", kind)
	}
	if n, due := b.LogDue(kind, budgetLogEvery); due {
		h.srv.log.LogAttrs(ctx, slog.LevelWarn, "retry budget exhausted: an attempt was refused",
			slog.String("route", rt.Name), slog.String("kind", kind), slog.String("cluster", cluster),
			slog.Int64("refused_since_last_log", n), slog.String("request_id", ex.id))
	}
	return false
}

// prepareResume turns the request into the continuation of the stream cut so far: the text
// the client already has becomes an assistant prefix that the next candidate continues.
func (h *Handler) prepareResume(ex *exchange, res *result) bool {
	if !ex.capture || res.fail == nil || res.fail.Phase != policy.InStream {
		return false
	}
	if why := ex.streamed.Unresumable; why != "" {
		// A continuation would restart or garble what the client already has (a tool call
		// half sent gets a second id and arguments that no longer parse): the stream ends
		// with its in-band error instead.
		h.srv.log.Info("not resuming a cut stream: a continuation cannot carry what was sent", "request_id", ex.id,
			"cluster", res.cluster, "class", res.class(), "sent", why)
		return false
	}
	left := 0
	if ex.preq.MaxTokens > 0 {
		// One token per event, as vLLM streams by default.
		if left = ex.preq.MaxTokens - res.tap.TokenEvents; left <= 0 {
			return false
		}
	}
	body, err := openai.ContinuationBody(ex.preq.Body, string(ex.streamed.Text), left)
	if err != nil {
		return false
	}
	ex.contBody = body
	tap := res.tap
	// The continuation is a new answer from another server: whether it errs or ends is its
	// own to say.
	tap.ErrorSeen, tap.Done = false, false
	ex.carryTap = &tap
	h.srv.log.Info("resuming a cut stream on the next candidate", "request_id", ex.id,
		"cluster", res.cluster, "class", res.class(), "tokens_so_far", tap.TokenEvents)
	return true
}

// sleep waits d, or less if ctx ends first (then it returns false).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// settlePending relays a buffered upstream answer that no retry replaced, or ends a broken
// stream with its in-band error.
func (h *Handler) settlePending(ex *exchange, res result) result {
	if res.pending != nil && !ex.committed {
		ex.writePending(res.pending, &res)
	}
	res.pending = nil
	if f := res.fail; f != nil && ex.committed && ex.sse && f.Phase == policy.InStream && !clientSide(f.Class) {
		// Never end a started stream silently.
		ev := res.upstreamErr // the model server's own words, once
		switch {
		case ev != nil:
		case ex.preq.Kind == openai.KindResponses:
			ev = f.OpenAI().ResponsesSSE(res.tap.Seq)
		default:
			ev = f.OpenAI().SSE()
		}
		_, _ = ex.w.Write(ev)
		ex.flush()
		res.upstreamErr = nil
	}
	return res
}

// attempt sends the request to one endpoint and relays the answer.
// limits bound one attempt: the candidate's own time-outs, else the route's, and the per-try
// time-out (the shorter of retry.per_try_timeout and the step's total).
type limits struct {
	connect, ttft, idle, try time.Duration
}

func limitsOf(rt *config.CompiledRoute, rtr *route.Router, cand policy.Candidate) limits {
	l := limits{connect: rt.Route.Timeouts.Connect.D(), ttft: rt.Timeouts.TTFT.D(), idle: rt.Timeouts.Idle.D(), try: rtr.PerTryTimeout()}
	if cand.TTFT > 0 {
		l.ttft = cand.TTFT
	}
	if cand.Idle > 0 {
		l.idle = cand.Idle
	}
	if cand.Total > 0 && (l.try == 0 || cand.Total < l.try) {
		l.try = cand.Total
	}
	return l
}

func (h *Handler) attempt(ctx context.Context, ex *exchange, lim limits, cand policy.Candidate, cl *clusterState, ep *upstream.Endpoint, n int) (res result) {
	res.cluster, res.named, res.endpoint, res.attempts = cand.Cluster, cl.named, ep.String(), n
	res.model = ex.preq.Model
	ep.Begin()
	defer ep.End()

	// The attempt's scope, made in the request's (ctx), ends at the per-try time-out, by the
	// watchdog or the relay (cancel), or when the attempt returns. The values are added
	// first so that the transports get the scope itself: a context made from it (net/http's
	// Transport, the h1 client's watch) is told of its end without a goroutine.
	vctx := ctx
	if lim.connect > 0 {
		vctx = upstream.WithConnectTimeout(vctx, lim.connect) // the route's own, else the cluster's pool default
	}
	vctx, span := h.srv.tel.StartClient(vctx, ex.preq.Kind.Operation(), ex.preq.Model, cand.Cluster, res.endpoint, n)
	var try time.Time
	if lim.try > 0 {
		try = time.Now().Add(lim.try)
	}
	at := new(attemptScope)
	as := &at.scope
	as.Init(ctx, vctx, try, errTryTimeout)
	defer as.Cancel(nil)
	actx := context.Context(as)
	defer func() {
		// The attempt's own outcome: a failed attempt's span says why (error.type, status).
		telemetry.SetGenAIResult(span, telemetry.RequestRecord{
			Operation: ex.preq.Kind.Operation(), ResponseModel: res.model, Stream: ex.preq.Stream,
			Status: res.status, ErrorClass: string(res.class()), TTFT: res.tap.TTFT(),
			InputTokens: res.tap.Usage.PromptTokens, OutputTokens: res.tap.Tokens,
			FinishReason: res.tap.FinishReason, ResponseID: res.tap.ID,
		})
		span.End()
	}()

	out, err := h.outbound(actx, ex, cand, cl, ep, at, &res)
	if err != nil {
		res.failWith(policy.Failf(policy.ClassInvalidRequest, err, err.Error()))
		return res
	}
	defer func() {
		if res.fail != nil && ex.committed {
			res.fail.Phase = policy.InStream // the client has part of the answer
		}
	}()

	wd := &at.wd
	wd.start(lim.ttft, lim.idle, as)
	defer wd.stop()
	sent := time.Now()
	if ex.carryTap != nil {
		res.tap = *ex.carryTap // a resumed stream: the client's TTFT and tokens go on
	} else {
		res.tap.Start = sent
	}
	// Upstream chaos stands in for the model server: a delay, an abort answer, or faults in
	// the body it sends.
	resp, sse, err := send(actx, ex.inj.Attempt(cand.Cluster), cl, out)
	res.wait += time.Since(sent)
	if ex.bodyTimedOut() {
		// A pass-through body the client did not send in time: the client's failure, not
		// the model server's (whatever the transport made of the cut body, or the server of
		// the part it got), and it cannot be sent again.
		if resp != nil {
			resp.Body.Close()
		}
		res.failWith(bodyTimeout(ex.w, h.srv.state.Load().snap.Config.Timeouts.Body.D()))
		return res
	}
	if err != nil {
		class := transportClass(actx)
		if class == policy.ClassConnect && protocolFailure(err) {
			// The server was reached and answered badly (a malformed status line or
			// headers, a flood of 1xx, oversized headers, a short answer): not a connection
			// failure, and the request may have been run.
			ep.Report(false)
			res.failWith(protocolError(err))
			return res
		}
		if class == policy.ClassConnect {
			ep.Report(false)
		}
		res.failWith(attemptFailure(class, err))
		return res
	}
	defer resp.Body.Close()
	if sse && resp.StatusCode < 300 {
		h.relayStream(actx, as, ex, resp, wd, ep, &res)
	} else {
		h.relayBody(actx, ex, resp, wd, ep, &res)
	}
	return res
}

// outbound builds the upstream request: same method, path and query on the endpoint's base
// URL; the client's headers minus hop-by-hop ones; request id and trace context; the
// cluster's credential; the body (with the model rewritten if the candidate says so).
func (h *Handler) outbound(ctx context.Context, ex *exchange, cand policy.Candidate, cl *clusterState, ep *upstream.Endpoint, at *attemptScope, res *result) (*http.Request, error) {
	r := ex.r
	at.url = *ep.URL()
	u := &at.url
	// Keep the path as the client escaped it (a model id "org/name" is one segment,
	// /v1/models/org%2Fname); RawPath is used only where it is a valid encoding of Path.
	if (u.Path == "" || u.Path == "/") && u.RawPath == "" && r.URL.RawPath == "" {
		// An endpoint at its root and a path its client wrote as net/url would: the
		// client's path is the request's, escaped when written as it was (no string made).
		u.Path, u.RawPath = r.URL.Path, ""
	} else {
		raw := strings.TrimSuffix(u.EscapedPath(), "/") + r.URL.EscapedPath()
		u.Path = strings.TrimSuffix(u.Path, "/") + r.URL.Path
		u.RawPath = raw
	}
	u.RawQuery, u.ForceQuery = r.URL.RawQuery, r.URL.ForceQuery

	out := (&http.Request{
		Method:     r.Method,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, outboundHeaders(r)),
		Host:       u.Host,
	}).WithContext(ctx)
	body := ex.preq.Body
	if ex.contBody != nil {
		body = ex.contBody
	}
	skip := neverForwarded
	if body != nil {
		skip = neverForwardedWithBody // the tap needs the bytes as the model server wrote them
	}
	httphead.CopyEndToEndExcept(out.Header, r.Header, skip)

	body, model, err := bodyFor(body, ex.preq.Model, cand.Model)
	if err != nil {
		return nil, err
	}
	res.model = model
	switch {
	case body != nil:
		rb := &at.body
		rb.set(body)
		out.Body, out.GetBody = rb, rb.again
		out.ContentLength = int64(len(body))
	case r.Body != nil && r.Body != http.NoBody:
		out.Body = r.Body
		out.ContentLength = r.ContentLength
	}

	out.Header["X-Request-Id"] = ex.idHeader()
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		// Every hop the client's proxies listed, in however many lines they wrote them (a
		// chain of proxies may add a line each), then the client's address.
		if prior := out.Header["X-Forwarded-For"]; len(prior) > 0 {
			host = strings.Join(prior, ", ") + ", " + host
		}
		at.xff[0] = host
		out.Header["X-Forwarded-For"] = at.xff[:1:1]
	}
	if r.TLS != nil {
		out.Header["X-Forwarded-Proto"] = protoHTTPS
	} else {
		out.Header["X-Forwarded-Proto"] = protoHTTP
	}
	h.srv.tel.Inject(ctx, out.Header)
	return out, nil
}

// outboundHeaders is the size an outbound request's header map is made at: the client's
// headers, less its Content-Length (the request's own is written), plus the three the
// gateway sets. A Go map of up to eight is one group; a hint of nine makes a table of four
// allocations, as the five headers of a plain client plus four did.
func outboundHeaders(r *http.Request) int {
	n := len(r.Header) + 3
	if r.ContentLength > 0 {
		n--
	}
	return n
}

// replayBody is an outbound request's body held whole: read once a send, and made again for
// a send on another connection (GetBody). One allocation where io.NopCloser over a
// bytes.Reader is two.
type replayBody struct {
	bytes.Reader
	b []byte
}

func newReplayBody(b []byte) *replayBody {
	rb := new(replayBody)
	rb.set(b)
	return rb
}

// set makes rb b's, read from its start.
func (rb *replayBody) set(b []byte) {
	rb.b = b
	rb.Reset(b)
}

func (rb *replayBody) Close() error { return nil }

// again is the body from its start, for GetBody.
func (rb *replayBody) again() (io.ReadCloser, error) { return newReplayBody(rb.b), nil }

// The X-Forwarded-Proto values, shared.
var protoHTTP, protoHTTPS = headerValue("http"), headerValue("https")

// overriding reports the request headers that never reach a model server, from an attempt
// or a mirrored copy: Sluice's own (the admin token, chaos faults), and headers some servers
// and proxies read as the URL to serve or the host the client asked for, which would let a
// client reach what its path does not name.
func overriding(k string) bool {
	switch k {
	case faultHeader, faultHeaderToken,
		"X-Original-Url", "X-Rewrite-Url", "X-Forwarded-Host", "X-Forwarded-Server", "X-Host", "X-Http-Method-Override":
		return true
	}
	return false
}

// neverForwarded reports the client's headers an attempt leaves out: the overriding ones,
// the length (the request's own is written) and the trace context (the gateway's is
// written: Telemetry.Inject).
func neverForwarded(k string) bool {
	switch k {
	case "Content-Length", "Traceparent", "Tracestate":
		return true
	}
	return overriding(k)
}

// neverForwardedWithBody is neverForwarded for a request whose body the gateway sends (and
// whose answer the tap reads as the model server wrote it): no Accept-Encoding either.
func neverForwardedWithBody(k string) bool {
	return k == "Accept-Encoding" || neverForwarded(k)
}

// The chaos headers' canonical names (fault.Header and fault.HeaderToken are lower case).
var faultHeader, faultHeaderToken = http.CanonicalHeaderKey(fault.Header), http.CanonicalHeaderKey(fault.HeaderToken)

// watchdog enforces the TTFT and idle time-outs of one attempt with a single alarm: armed with
// the TTFT time-out, re-armed with the idle time-out on every beat (each event or read). An
// alarm, not a time.Timer: moving it on every event is an atomic store, and arming it per
// attempt makes the runtime wake no thread (it fires up to alarm.Grain late).
type watchdog struct {
	t       alarm.Alarm
	armed   bool // t was started (by startWatchdog or the first beat)
	idle    time.Duration
	started atomic.Bool
	cancel  ender
}

// ender ends an attempt with a cause: the attempt's *scope.Scope (an interface, not its
// Cancel method as a func value, which would be an allocation an attempt).
type ender interface{ Cancel(cause error) }

// attemptScope is what an attempt makes of its own, in one allocation: its scope, its
// watchdog, and its upstream request's URL, body and X-Forwarded-For value.
type attemptScope struct {
	scope scope.Scope
	wd    watchdog
	url   url.URL    // the upstream request's
	body  replayBody // the upstream request's body when the gateway holds it whole
	xff   [1]string  // its X-Forwarded-For value (capacity 1: an Add copies it)
}

// start arms a zero watchdog with the TTFT time-out (none when ttft is 0).
func (w *watchdog) start(ttft, idle time.Duration, cancel ender) {
	w.idle, w.cancel = idle, cancel
	if ttft > 0 {
		w.armed = true
		alarm.StartFirer(&w.t, ttft, w)
	}
}

// Fire ends the attempt: its alarm came due (alarm.Firer).
func (w *watchdog) Fire() {
	if w.started.Load() {
		w.cancel.Cancel(errIdleTimeout)
	} else {
		w.cancel.Cancel(errTTFTTimeout)
	}
}

// beat records progress: the first beat ends the TTFT phase.
func (w *watchdog) beat() { w.beatAt(time.Time{}) }

// beatAt is beat for a caller that read the clock at now (time.Now's; zero: not read): the
// stream relay, for every event.
func (w *watchdog) beatAt(now time.Time) {
	if !w.started.Load() {
		w.started.Store(true)
	}
	switch {
	case w.idle <= 0:
		w.stop()
	case !w.armed:
		w.armed = true
		alarm.StartFirer(&w.t, w.idle, w)
	case now.IsZero():
		w.t.Reset(w.idle)
	default:
		w.t.ResetFrom(now, w.idle)
	}
}

func (w *watchdog) stop() {
	if w.armed {
		w.t.Stop()
	}
}
