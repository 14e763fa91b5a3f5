package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/admin"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/proxy/procs"
	"github.com/sluicegw/sluice/proxy/telemetry"
)

// Handler is the request path. ServeHTTP reads top-down, one step per block, numbered as in
// the design's picture: 1 parse, 2 identify, 3 match, 4 admit, 5 plan, 6 mirror, then the
// attempt loop (7 pick, 8 send, 9 relay, 10 retry), 11 settle and record. Everything an
// attempt does is in attempt.go; the SSE relay is in relay.go.
type Handler struct {
	srv *Server
}

// arrived reports whether a request's body is in its server's buffer whole (the own
// HTTP/1.1 server's bodies say so): reading it waits for nobody.
func arrived(b io.Reader) bool {
	a, ok := b.(interface{ Arrived() bool })
	return ok && a.Arrived()
}

// ServeHTTP serves one client request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := h.srv.state.Load()
	c := st.snap.Config
	if r.Method == http.MethodOptions {
		if d := c.Timeouts.Write.D(); d > 0 {
			// Bounds the server's flush of the answer after the handler returns.
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		}
		st.cors.preflight(w, r) // Sluice's answer, never a model server's
		return
	}
	procs.Begin() // a burst on one processor gets its processors within milliseconds
	defer procs.End()
	if f := h.srv.heapFloor; f != nil {
		f.request() // and a load after a quiet time its heap floor
	}
	ex := newExchange(w, r, c.Timeouts.Write.D())
	defer ex.release(&h.srv.buffers)
	if d := c.Timeouts.Body.D(); d > 0 && r.Body != nil && r.Body != http.NoBody && !arrived(r.Body) {
		// The body must arrive within the body time-out (the total time-out starts after
		// parsing): a client that sends part of one holds nothing longer. The deadline is
		// lifted once the body is read (the server then watches the connection for the
		// client going away, which a deadline would fake). A body the own server holds
		// whole already (most: it came with the head) needs none.
		_ = ex.rc.SetReadDeadline(ex.start.Add(d))
		ex.bodyv = bodyDeadline{ReadCloser: r.Body, rc: &ex.rc}
		ex.body = &ex.bodyv
		r.Body = ex.body
	}
	if o := httphead.Get(r.Header, "Origin"); st.cors.allows(o) {
		ex.corsOrigin = o
		setCORS(w.Header(), o)
	}
	tel := h.srv.tel
	ctx, span := tel.StartServer(r.Context(), r, "")
	defer span.End()

	// 1. parse: the body once, bounded; 413 past the limit, 400 when malformed.
	kind := openai.KindOf(r.Method, r.URL.Path)
	req, perr := h.parse(ex.w, r, kind, st)
	if perr != nil {
		h.finish(ctx, ex, st, nil, span, failed(perr))
		return
	}

	// 2. identify: request id, tenant (API key), session, gray flag.
	ex.preqv = policy.Request{
		Request: req, ID: ex.id, Header: r.Header, Arrival: ex.start,
		Session: sessionOf(r, req), GrayFlag: httphead.Get(r.Header, "X-Gray-Flag"),
	}
	preq := &ex.preqv // in the exchange's allocation
	preq.Client, preq.ClientKnown = st.trust.clientOf(r)
	if st.tenants != nil {
		preq.Tenant, _ = st.tenants.Identify(r.Header)
	}
	ex.preq = preq
	if req.Model == "" && kind.HasModel() {
		// vLLM serves its default model to a request that names none: so does a route
		// that serves one.
		if e := h.fillModel(ctx, st, r, req); e != nil {
			h.finish(ctx, ex, st, nil, span, failed(e))
			return
		}
	}

	// 3. match: the first route whose path prefix, model and headers match.
	rt := st.snap.Route(r.URL.Path, req.Model, r.Header)
	if rt == nil {
		if kind == openai.KindModels && (st.tenants == nil || preq.Tenant != "") {
			// The model list is Sluice's own, over every route and cluster.
			res, _ := h.serveModels(ctx, ex, st, false)
			h.finish(ctx, ex, st, nil, span, res)
			return
		}
		h.finish(ctx, ex, st, nil, span, failed(policy.Fail(policy.ClassNoRoute,
			"no route matches "+r.Method+" "+r.URL.Path+modelSuffix(req.Model))))
		return
	}
	preq.Route = rt.Name
	ex.filters, ex.bodies = st.filters[rt.Name], st.bodies[rt.Name]
	preq.ContextWindow = st.contextWindow(rt, req.Model)
	telemetry.SetServerRequest(span, telemetry.ServerRequest{
		Method: r.Method, Route: rt.Name, Operation: kind.Operation(), Model: req.Model,
		MaxTokens: req.MaxTokens, Temperature: req.Temperature, Seed: req.Seed,
	})
	tel.InFlight(ctx, rt.Name, 1)
	defer tel.InFlight(ctx, rt.Name, -1)

	// The request's scope, which the total time-out ends (the whole request, retries
	// included); each attempt's scope is made in it. It ends with the client's request
	// (r.Context()) and serves ctx's values (the incoming trace context).
	var total time.Time
	if t := rt.Timeouts.Total.D(); t > 0 {
		total = time.Now().Add(t)
	}
	ex.scope.Init(r.Context(), ctx, total, errTotalTimeout)
	defer ex.scope.Cancel(nil)
	ctx = &ex.scope

	// 4. admit: the route's policy chain (rate limits, guard, concurrency) in order.
	adm := h.admit(ctx, st, ex, preq)
	defer func() {
		for _, d := range adm.done {
			d(ex.outcome)
		}
	}()
	if adm.reject == nil && adm.capMaxTokens > 0 {
		adm.reject = capMaxTokens(preq, adm.capMaxTokens)
	}
	if adm.reject == nil && len(adm.setFields) > 0 {
		adm.reject = setFields(preq, adm.setFields)
	}
	if adm.reject != nil {
		h.finish(ctx, ex, st, rt, span, failed(adm.reject))
		return
	}
	if kind == openai.KindModels {
		if res, handled := h.serveModels(ctx, ex, st, true); handled {
			h.finish(ctx, ex, st, rt, span, res)
			return
		}
	}

	// 5. plan: the ordered candidates (primary, then fallbacks), or where a policy rerouted.
	plan := st.plan(ctx, rt, preq)
	if adm.reroute != "" {
		plan = []policy.Candidate{{Cluster: adm.reroute}}
	}
	// A follow-up of a stored Responses answer goes where the answer lives.
	if p, ep, ok := st.homePlan(h.srv.homes, rt, preq, r.URL.Path, plan); ok {
		plan, ex.home = p, ep
	}

	// 6. mirror: a copy to the route's sandbox when the session is sampled (never waits).
	// Batched requests are not mirrored: their answer is a share of a merged one.
	var res result
	bt := st.batchers[rt.Index]
	batched := bt != nil && bt.Batchable(req)
	if !batched {
		if mj := h.srv.shadow.offer(st, rt, preq, r, ex, plan); mj != nil {
			defer mirrorDone(mj, ex, &res) // after finish, on every path
		}
	}

	// Chaos (when enabled) wraps steps 8 and 9: downstream faults wrap the client's writer,
	// upstream faults ride on the attempts (send is wrapped by fault).
	inj, rej := h.injectFaults(ctx, r, ex, st, rt, preq)
	if inj != nil {
		defer func() { inj.Done(faultOutcome(ex.outcome, rt)) }()
	}
	if rej != nil {
		h.finish(ctx, ex, st, rt, span, failed(rej))
		return
	}

	// 7–10. pick, send, relay, retry: the retry loop and the pick in attempt.go, the one
	// sender in send.go, the relay (through the route's stream filters, filters.go) in
	// relay.go. Failures before the first byte move to the next candidate. A batched
	// request is sent merged with others.
	if batched {
		res = h.batched(ctx, ex, st, rt, plan, bt) // merged with others into one upstream request
	} else {
		res = h.forward(ctx, ex, st, rt, plan)
	}

	// 11. settle and record (then the mirror gets the primary's answer to compare).
	h.finish(ctx, ex, st, rt, span, res)
}

// parse reads and parses the body of the OpenAI endpoints that carry a model (chat,
// completions, embeddings, responses); other /v1/ paths pass through.
func (h *Handler) parse(w http.ResponseWriter, r *http.Request, kind openai.Kind, st *state) (*openai.Request, *policy.Failure) {
	if p := r.URL.Path; !underV1(p) {
		return nil, policy.Fail(policy.ClassUnknownURL,
			"unknown path "+truncate(p, 256)+": Sluice serves the OpenAI API under /v1/")
	}
	if hasDotSegment(r.URL.Path) || hasDotSegment(r.URL.EscapedPath()) {
		return nil, policy.Fail(policy.ClassInvalidPath,
			"invalid path: it must not contain . or .. segments, empty segments (//), backslashes or ..; (servers behind Sluice could read them as another path)")
	}
	if !kind.HasModel() {
		return &openai.Request{Kind: kind}, nil
	}
	if !jsonContentType(httphead.Get(r.Header, "Content-Type")) {
		// Browsers send text/plain and form bodies without asking (a "simple request"): a
		// page must not be able to make a visitor's browser call the API.
		return nil, policy.Fail(policy.ClassUnsupportedType,
			"the request body must be JSON: send Content-Type: application/json")
	}
	body, err := openai.ReadBodySized(r.Body, int64(st.snap.Config.MaxBodyBytes), r.ContentLength)
	if err != nil {
		var oe *openai.Error
		if errors.As(err, &oe) {
			return nil, policy.FromOpenAI(oe)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// (The server may have cancelled the request's context on the failed read: the
			// body time-out is what happened.)
			return nil, bodyTimeout(w, st.snap.Config.Timeouts.Body.D())
		}
		if r.Context().Err() != nil {
			return nil, policy.Failf(policy.ClassClientCancel, err, "")
		}
		return nil, policy.Failf(policy.ClassBodyRead, err, "reading the request body failed: "+err.Error())
	}
	req, err := openai.ParseRequest(kind, body)
	if err != nil {
		var oe *openai.Error
		if errors.As(err, &oe) {
			return nil, policy.FromOpenAI(oe)
		}
		return nil, policy.Failf(policy.ClassInvalidRequest, err, err.Error())
	}
	return req, nil
}

// bodyTimeout is the answer to a body that did not arrive within the body time-out d. The
// connection is closed after it: the rest of the body will not be waited for.
func bodyTimeout(w http.ResponseWriter, d time.Duration) *policy.Failure {
	w.Header().Set("Connection", "close")
	return policy.Fail(policy.ClassBodyTimeout,
		"the request body did not arrive within the body time-out ("+d.String()+")")
}

// injectFaults plans the request's chaos faults, wraps the client's writer with the downstream
// ones and applies a downstream delay or abort. It returns the injection (nil when none) and
// the answer that ends the request early, if any.
func (h *Handler) injectFaults(ctx context.Context, r *http.Request, ex *exchange, st *state, rt *config.CompiledRoute, preq *policy.Request) (*fault.Injection, *policy.Failure) {
	if !h.srv.chaos.Enabled() {
		return nil, nil
	}
	inj, rej := h.faults(r, st, rt, preq)
	if inj == nil || rej != nil {
		return nil, rej
	}
	ex.inj = inj
	ex.w = inj.WrapDownstream(ctx, ex.w)
	ex.flusher, _ = ex.w.(http.Flusher)
	ab, err := inj.Before(ctx)
	switch {
	case err != nil:
		return inj, attemptFailure(causeClass(ctx), err)
	case ab != nil:
		return inj, policy.FromOpenAI(ab.Err)
	}
	return inj, nil
}

// faults plans the chaos faults of a request. The x-sluice-fault header is honoured only with
// the admin token (x-sluice-admin-token) or from an allowed network: an outside client must
// never fault someone else's traffic.
func (h *Handler) faults(r *http.Request, st *state, rt *config.CompiledRoute, preq *policy.Request) (*fault.Injection, *policy.Failure) {
	var hs []fault.Spec
	if v := r.Header.Get(fault.Header); v != "" {
		if !admin.TokenIs(r.Header.Get(fault.HeaderToken), st.snap.Config.Admin.TokenEnv) && !h.srv.chaos.AllowsNetwork(net.ParseIP(preq.Client)) {
			return nil, policy.Fail(policy.ClassFaultNotAllowed,
				fault.Header+" needs the admin token in "+fault.HeaderToken+" or a client from chaos.allowed_networks")
		}
		var err error
		if hs, err = fault.ParseHeader(v); err != nil {
			return nil, policy.Failf(policy.ClassInvalidFault, err, err.Error())
		}
	}
	return h.srv.chaos.Plan(preq, rt.Name, hs), nil
}

// faultOutcome tells the chaos engine what became of a faulted request.
func faultOutcome(o policy.Outcome, rt *config.CompiledRoute) fault.Outcome {
	return fault.Outcome{
		Status: o.Status, ErrorClass: string(o.ErrorClass), Cluster: o.Cluster, Attempts: o.Attempts,
		ClientSawError: o.Status >= 400 || (o.ErrorClass != "" && o.ErrorClass != policy.ClassClientCancel),
		Fallback:       o.Attempts > 1 || (o.Cluster != "" && o.Cluster != rt.Cluster),
	}
}

// admission is what the route's Admitters decided together.
type admission struct {
	done         []func(policy.Outcome) // Done callbacks of those that admitted
	reject       *policy.Failure        // the first rejection
	capMaxTokens int                    // the lowest max_tokens cap asked for
	setFields    map[string][]byte      // fields set on the body (the first policy to ask for one wins)
	reroute      string                 // the first reroute asked for
}

// admit runs the route's Admitters in order, stopping at the first rejection. Headers a
// policy sets (x-ratelimit-*) go on the response whatever happens next.
func (h *Handler) admit(ctx context.Context, st *state, ex *exchange, r *policy.Request) admission {
	a := admission{done: ex.dones[:0]}
	for _, p := range st.admitters[r.Route] {
		d, err := p.Admit(ctx, r)
		if err != nil {
			if ctx.Err() != nil {
				a.reject = attemptFailure(causeClass(ctx), err)
			} else {
				a.reject = policy.Failf(policy.ClassPolicyError, err, err.Error())
			}
			return a
		}
		for k, vs := range d.Header {
			ex.w.Header()[k] = vs
			if ex.policyHeader == nil {
				ex.policyHeader = make(http.Header, len(d.Header))
			}
			ex.policyHeader[k] = vs
		}
		if d.Done != nil {
			a.done = append(a.done, d.Done)
		}
		if d.Reject != nil {
			a.reject = d.Reject
			return a
		}
		if d.CapMaxTokens > 0 && (a.capMaxTokens == 0 || d.CapMaxTokens < a.capMaxTokens) {
			a.capMaxTokens = d.CapMaxTokens
		}
		if a.reroute == "" {
			a.reroute = d.Reroute
		}
		for k, v := range d.SetFields {
			if _, taken := a.setFields[k]; !taken {
				if a.setFields == nil {
					a.setFields = make(map[string][]byte, len(d.SetFields))
				}
				a.setFields[k] = v
			}
		}
	}
	return a
}

// capMaxTokens lowers the request's output budget (staged degradation), rewriting the body
// (max_tokens, and max_completion_tokens when present; max_output_tokens for the Responses API).
func capMaxTokens(r *policy.Request, limit int) *policy.Failure {
	if r.Body == nil || (r.MaxTokens > 0 && r.MaxTokens <= limit) {
		return nil
	}
	v := []byte(strconv.Itoa(limit))
	var body []byte
	var err error
	if r.Kind == openai.KindResponses {
		body, err = openai.SetField(r.Body, "max_output_tokens", v)
	} else {
		body, err = openai.SetField(r.Body, "max_tokens", v)
		if err == nil && bytes.Contains(body, []byte(`"max_completion_tokens"`)) {
			body, err = openai.SetField(body, "max_completion_tokens", v)
		}
	}
	if err != nil {
		return policy.Failf(policy.ClassInvalidJSON, err, err.Error())
	}
	r.Body, r.MaxTokens = body, limit
	return nil
}

// setFields sets the fields the policies ask the upstream for on the body, in key order; a
// field the client set stays as the client set it.
func setFields(r *policy.Request, fields map[string][]byte) *policy.Failure {
	if r.Body == nil {
		return nil
	}
	body := r.Body
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if openai.HasField(body, k) {
			continue
		}
		b, err := openai.SetField(body, k, fields[k])
		if err != nil {
			return policy.Failf(policy.ClassPolicyError, err, "a policy's field could not be set on the request: "+err.Error())
		}
		body = b
	}
	r.Body = body
	return nil
}

// finish settles the request: writes the error if nothing reached the client, tells the
// observers, records metrics and span attributes, and logs failures.
func (h *Handler) finish(ctx context.Context, ex *exchange, st *state, rt *config.CompiledRoute, span trace.Span, res result) {
	if f := res.fail; f != nil && !ex.committed {
		// The failure's one rendering: its status and OpenAI error body (nothing to a client
		// that is gone).
		res.status = f.Status
		if !clientSide(f.Class) {
			openai.WriteError(ex.w, f.OpenAI())
		}
	}
	if res.class() == policy.ClassClientCancel && ex.write != nil && ex.write.expired.Load() {
		// HTTP/2: the write time-out reset the stream, which cancels the request's context:
		// the client stopped reading, it did not go away.
		res.fail.Class = policy.ClassClientStalled
	}
	dur := time.Since(ex.start)
	out := policy.Outcome{
		Status: res.status, ErrorClass: res.class(), Cluster: res.cluster, Endpoint: res.endpoint,
		Attempts: res.attempts, Duration: dur, TTFT: res.tap.TTFT(), TPOT: res.tap.TPOT(),
		InputTokens: res.tap.Usage.PromptTokens, OutputTokens: res.tap.Tokens, Flags: ex.flags,
	}
	if out.ErrorClass == "" {
		out.ErrorClass = res.cut // a stream a filter ended: whole for the client, not a success
	}
	if out.InputTokens == 0 && ex.preq != nil {
		out.InputTokens = ex.preq.PromptTokens
	}
	ex.outcome = out
	if ex.preq != nil && res.status == http.StatusOK && res.fail == nil && res.tap.ID != "" && res.cluster != "" && stores(ex.preq) {
		h.srv.homes.put(res.tap.ID, home{cluster: res.cluster, endpoint: res.endpoint})
	}
	if ex.preq != nil && rt != nil {
		for _, o := range st.observers[ex.preq.Route] {
			o.Observe(ctx, ex.preq, out)
		}
	}
	rec := telemetry.RequestRecord{
		Cluster: res.cluster, Endpoint: res.endpoint, Status: out.Status, ErrorClass: string(out.ErrorClass),
		Duration: dur, TTFT: out.TTFT, TPOT: out.TPOT, InputTokens: out.InputTokens,
		OutputTokens: out.OutputTokens, Attempts: res.attempts,
		Overhead:     max(0, dur-res.wait),
		FinishReason: res.tap.FinishReason, ResponseID: res.tap.ID,
	}
	if ex.preq != nil {
		rec.Route = ex.preq.Route
		rec.Operation = ex.preq.Kind.Operation()
		// Client-given names are bounded: the config's and the servers' stand, others are "other".
		if out.Status < 300 && out.ErrorClass == "" && res.attempts > 0 {
			h.srv.served.learn(res.model) // a server answered for it: a real model
		}
		rec.RequestModel = st.modelLabel(&h.srv.served, ex.preq.Model)
		rec.ResponseModel = rec.RequestModel
		if res.model != ex.preq.Model { // a split or fallback step that rewrote the model
			rec.ResponseModel = st.modelLabel(&h.srv.served, res.model)
		}
		rec.Stream = ex.preq.Stream
	}
	h.srv.tel.RecordRequest(ctx, rec)
	telemetry.SetGenAIResult(span, rec)
	// Upstream failures are logged; a policy's own rejections (no upstream attempt) are counted
	// in metrics only, so a burst of refused requests does not flood the log.
	if out.ErrorClass != "" && out.Status >= 500 && out.Status != statusClientClosed && res.attempts > 0 {
		h.srv.log.LogAttrs(ctx, slog.LevelWarn, "request failed",
			slog.String("request_id", ex.id), slog.String("route", rec.Route),
			slog.String("cluster", rec.Cluster), slog.String("endpoint", rec.Endpoint),
			slog.Int("status", out.Status), slog.String("class", string(out.ErrorClass)),
			slog.Int("attempts", res.attempts))
	}
}
