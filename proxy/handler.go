package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/openai"
	"github.com/sluicegw/sluice/proxy/telemetry"
)

// Handler is the request path. ServeHTTP reads top-down, one step per block:
// parse, identify, match, admit, plan, then the attempt loop (pick, send, relay, retry),
// settle and record. Everything an attempt does is in attempt.go; the SSE relay is in relay.go.
type Handler struct {
	srv *Server
}

// ServeHTTP serves one client request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ex := newExchange(w, r)
	st := h.srv.state.Load()
	tel := h.srv.tel
	ctx, span := tel.StartServer(r.Context(), r, "")
	defer span.End()

	// 1. parse: the body once, bounded; 413 past the limit, 400 when malformed.
	kind := openai.KindOf(r.Method, r.URL.Path)
	req, perr := h.parse(r, kind, st)
	if perr != nil {
		h.finish(ctx, ex, st, nil, span, failure(perr))
		return
	}

	// 2. identify: request id, session; tenants arrive with the rate-limit policy.
	preq := &policy.Request{
		Request: req, ID: ex.id, Header: r.Header, Arrival: ex.start,
		Session: sessionOf(r, req),
	}
	ex.preq = preq

	// 3. match: the first route whose path prefix, model and headers match.
	rt := st.snap.Route(r.URL.Path, req.Model, r.Header)
	if rt == nil {
		h.finish(ctx, ex, st, nil, span, failure(openai.NewError(http.StatusNotFound,
			"invalid_request_error", "no_route", "no route matches "+r.Method+" "+r.URL.Path+modelSuffix(req.Model))))
		return
	}
	preq.Route = rt.Name
	tel.InFlight(ctx, rt.Name, 1)
	defer tel.InFlight(ctx, rt.Name, -1)

	// Total time-out for the whole request, retries included.
	if t := rt.Timeouts.Total.D(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, t, errTotalTimeout)
		defer cancel()
	}

	// 4. admit: the route's policy chain (rate limits, guard, concurrency) in order.
	done, rej := h.admit(ctx, st, preq)
	defer func() {
		for _, d := range done {
			d(ex.outcome)
		}
	}()
	if rej != nil {
		h.finish(ctx, ex, st, rt, span, failure(rej))
		return
	}

	// 5. plan: the ordered candidates (primary, then fallbacks).
	plan := st.plan(ctx, rt, preq)

	// 6–9. pick, send, relay, retry: failures before the first byte move to the next try.
	res := h.forward(ctx, ex, st, rt, plan)

	// 10. settle and record.
	h.finish(ctx, ex, st, rt, span, res)
}

// parse reads and parses the body of the four OpenAI endpoints; other /v1/ paths pass through.
func (h *Handler) parse(r *http.Request, kind openai.Kind, st *state) (*openai.Request, *openai.Error) {
	if !isAPIPath(r.URL.Path) {
		return nil, openai.NewError(http.StatusNotFound, "invalid_request_error", "unknown_url",
			"unknown path "+r.URL.Path+": Sluice serves the OpenAI API under /v1/")
	}
	switch kind {
	case openai.KindChat, openai.KindCompletion, openai.KindEmbedding:
	default:
		return &openai.Request{Kind: kind}, nil
	}
	body, err := openai.ReadBody(r.Body, int64(st.snap.Config.MaxBodyBytes))
	if err != nil {
		var oe *openai.Error
		if errors.As(err, &oe) {
			return nil, oe
		}
		if r.Context().Err() != nil {
			return nil, errClientGone
		}
		return nil, openai.NewError(http.StatusBadRequest, "invalid_request_error", "body_read",
			"reading the request body failed: "+err.Error())
	}
	req, err := openai.ParseRequest(kind, body)
	if err != nil {
		var oe *openai.Error
		if errors.As(err, &oe) {
			return nil, oe
		}
		return nil, openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
	}
	return req, nil
}

// admit runs the route's Admitters in order. It returns the Done callbacks of those that
// admitted, and the first rejection.
func (h *Handler) admit(ctx context.Context, st *state, r *policy.Request) ([]func(policy.Outcome), *openai.Error) {
	chain := st.admitters[r.Route]
	if len(chain) == 0 {
		return nil, nil
	}
	var done []func(policy.Outcome)
	for _, a := range chain {
		d, err := a.Admit(ctx, r)
		if err != nil {
			if ctx.Err() != nil {
				return done, classError(causeClass(ctx), 0)
			}
			return done, openai.NewError(http.StatusInternalServerError, "server_error", "policy_error", err.Error())
		}
		if d.Done != nil {
			done = append(done, d.Done)
		}
		if d.Reject != nil {
			return done, d.Reject
		}
	}
	return done, nil
}

// finish settles the request: writes the error if nothing reached the client, tells the
// observers, records metrics and span attributes, and logs failures.
func (h *Handler) finish(ctx context.Context, ex *exchange, st *state, rt *config.CompiledRoute, span trace.Span, res result) {
	if res.err != nil && !ex.committed {
		if res.err == errClientGone {
			res.status = statusClientClosed
		} else {
			res.status = res.err.Status
			openai.WriteError(ex.w, res.err)
		}
	}
	if res.class == "" && res.err != nil {
		res.class = res.err.Code
	}
	dur := time.Since(ex.start)
	out := policy.Outcome{
		Status: res.status, ErrorClass: res.class, Cluster: res.cluster, Endpoint: res.endpoint,
		Attempts: res.attempts, Duration: dur, TTFT: res.tap.TTFT(), TPOT: res.tap.TPOT(),
		InputTokens: res.tap.Usage.PromptTokens, OutputTokens: res.tap.Tokens,
	}
	if out.InputTokens == 0 && ex.preq != nil {
		out.InputTokens = ex.preq.PromptTokens
	}
	ex.outcome = out
	if ex.preq != nil && rt != nil {
		for _, o := range st.observers[ex.preq.Route] {
			o.Observe(ctx, ex.preq, out)
		}
	}
	rec := telemetry.RequestRecord{
		Cluster: res.cluster, Endpoint: res.endpoint, Status: out.Status, ErrorClass: out.ErrorClass,
		Duration: dur, TTFT: out.TTFT, TPOT: out.TPOT, InputTokens: out.InputTokens,
		OutputTokens: out.OutputTokens, Attempts: res.attempts,
		Overhead: max(0, dur-res.wait),
	}
	if ex.preq != nil {
		rec.Route = ex.preq.Route
		rec.Operation = ex.preq.Kind.Operation()
		rec.RequestModel = ex.preq.Model
		rec.ResponseModel = res.model
		rec.Stream = ex.preq.Stream
	}
	h.srv.tel.RecordRequest(ctx, rec)
	telemetry.SetGenAIResult(span, rec)
	if out.ErrorClass != "" && out.Status >= 500 && out.Status != statusClientClosed {
		h.srv.log.LogAttrs(ctx, slog.LevelWarn, "request failed",
			slog.String("request_id", ex.id), slog.String("route", rec.Route),
			slog.String("cluster", rec.Cluster), slog.String("endpoint", rec.Endpoint),
			slog.Int("status", out.Status), slog.String("class", out.ErrorClass),
			slog.Int("attempts", res.attempts))
	}
}
