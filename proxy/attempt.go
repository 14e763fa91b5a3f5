package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/openai"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// forward is the retry/fallback loop, the one place where attempts are repeated. A failure
// before anything reached the client moves on: a connection failure to another endpoint of
// the same cluster (once), any pre-first-byte failure to the plan's next candidate. After
// the first byte the attempt's own relay ends the stream.
func (h *Handler) forward(ctx context.Context, ex *exchange, st *state, rt *config.CompiledRoute, plan []policy.Candidate) result {
	var res result
	attempts := 0
	replayable := ex.preq.Body != nil || ex.r.Body == nil || ex.r.Body == http.NoBody
	for ci := 0; ci < len(plan); ci++ {
		cand := plan[ci]
		cl := st.clusters[cand.Cluster]
		var prev *upstream.Endpoint
		for try := 0; ; try++ {
			if cl == nil {
				res = failure(classError(classNoEndpoint, 0))
				res.cluster = cand.Cluster
				break
			}
			ep, err := cl.Pick(prev)
			if err != nil {
				h.srv.tel.UpstreamError(ctx, cand.Cluster, classNoEndpoint)
				res = failure(classError(classNoEndpoint, time.Second))
				res.cluster = cand.Cluster
				break
			}
			attempts++
			res = h.attempt(ctx, ex, rt, cand, cl, ep, attempts)
			if res.class != "" && res.class != classClientCancel {
				h.srv.tel.UpstreamError(ctx, cand.Cluster, res.class)
			}
			if ex.committed || !res.retryable || !replayable || ctx.Err() != nil {
				return h.settlePending(ex, res)
			}
			// A connection failure: nothing reached the model server, so another endpoint
			// of the same cluster may serve it.
			if res.class == classConnect && try == 0 && len(cl.Endpoints()) > 1 {
				prev = ep
				continue
			}
			break
		}
		if ctx.Err() != nil || !replayable {
			break
		}
	}
	return h.settlePending(ex, res)
}

// settlePending relays a buffered upstream answer that no retry replaced, or ends a broken
// stream with its in-band error.
func (h *Handler) settlePending(ex *exchange, res result) result {
	if res.pending != nil && !ex.committed {
		ex.writePending(res.pending, &res)
		res.pending = nil
		res.err = nil
	}
	if res.inband != nil && ex.committed {
		_, _ = ex.w.Write(res.inband.SSE())
		ex.flush()
		res.inband = nil
	}
	return res
}

// attempt sends the request to one endpoint and relays the answer.
func (h *Handler) attempt(ctx context.Context, ex *exchange, rt *config.CompiledRoute, cand policy.Candidate, cl *clusterState, ep *upstream.Endpoint, n int) (res result) {
	res.cluster, res.endpoint, res.attempts = cand.Cluster, ep.String(), n
	res.model = ex.preq.Model
	ep.Begin()
	defer ep.End()

	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if d := rt.Route.Timeouts.Connect.D(); d > 0 {
		actx = upstream.WithConnectTimeout(actx, d) // the route's own, else the cluster's pool default
	}
	actx, span := h.srv.tel.StartClient(actx, ex.preq.Kind.Operation(), ex.preq.Model, cand.Cluster, res.endpoint, n)
	defer span.End()

	out, err := h.outbound(actx, ex, cand, cl, ep, &res)
	if err != nil {
		res.err = openai.NewError(http.StatusBadRequest, "invalid_request_error", "invalid_request", err.Error())
		res.status, res.class = res.err.Status, "bad_request"
		return res
	}

	wd := startWatchdog(rt.Timeouts.TTFT.D(), rt.Timeouts.Idle.D(), cancel)
	defer wd.stop()
	sent := time.Now()
	if ex.carryTap != nil {
		res.tap = *ex.carryTap // a resumed stream: the client's TTFT and tokens go on
	} else {
		res.tap.Start = sent
	}
	resp, err := cl.Transport().RoundTrip(out)
	res.wait += time.Since(sent)
	if err != nil {
		res.class = transportClass(actx)
		if res.class == classConnect {
			ep.Report(false)
		}
		res.err = classError(res.class, 0)
		res.status = res.err.Status
		res.retryable = res.class == classConnect || res.class == classTTFTTimeout
		return res
	}
	defer resp.Body.Close()

	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") && resp.StatusCode < 300 {
		h.relayStream(actx, cancel, ex, resp, wd, ep, &res)
	} else {
		h.relayBody(actx, ex, resp, wd, ep, &res)
	}
	return res
}

// outbound builds the upstream request: same method, path and query on the endpoint's base
// URL; the client's headers minus hop-by-hop ones; request id and trace context; the
// cluster's credential; the body (with the model rewritten if the candidate says so).
func (h *Handler) outbound(ctx context.Context, ex *exchange, cand policy.Candidate, cl *clusterState, ep *upstream.Endpoint, res *result) (*http.Request, error) {
	r := ex.r
	u := *ep.URL()
	// Keep the path as the client escaped it (a model id "org/name" is one segment,
	// /v1/models/org%2Fname); RawPath is used only where it is a valid encoding of Path.
	raw := strings.TrimSuffix(u.EscapedPath(), "/") + r.URL.EscapedPath()
	u.Path = strings.TrimSuffix(u.Path, "/") + r.URL.Path
	u.RawPath = raw
	u.RawQuery = r.URL.RawQuery

	out := (&http.Request{
		Method:     r.Method,
		URL:        &u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, len(r.Header)+4),
		Host:       u.Host,
	}).WithContext(ctx)
	copyHeaders(out.Header, r.Header)
	out.Header.Del("Content-Length")

	body := ex.preq.Body
	if ex.body != nil {
		body = ex.body
	}
	if cand.Model != "" && cand.Model != ex.preq.Model && body != nil {
		b, err := openai.SetModel(body, cand.Model)
		if err != nil {
			return nil, err
		}
		body, res.model = b, cand.Model
	}
	switch {
	case body != nil:
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		// The tap needs the bytes as the model server wrote them.
		out.Header.Del("Accept-Encoding")
	case r.Body != nil && r.Body != http.NoBody:
		out.Body = r.Body
		out.ContentLength = r.ContentLength
	}

	out.Header.Set("X-Request-Id", ex.id)
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := out.Header.Get("X-Forwarded-For"); prior != "" {
			host = prior + ", " + host
		}
		out.Header.Set("X-Forwarded-For", host)
	}
	if r.TLS != nil {
		out.Header.Set("X-Forwarded-Proto", "https")
	} else {
		out.Header.Set("X-Forwarded-Proto", "http")
	}
	if cl.apiKey != "" {
		out.Header.Set("Authorization", "Bearer "+cl.apiKey)
	}
	h.srv.tel.Inject(ctx, out.Header)
	return out, nil
}

// watchdog enforces the TTFT and idle time-outs of one attempt with a single timer: armed with
// the TTFT time-out, re-armed with the idle time-out on every beat (each event or read).
type watchdog struct {
	t       *time.Timer
	idle    time.Duration
	started atomic.Bool
	cancel  context.CancelCauseFunc
}

func startWatchdog(ttft, idle time.Duration, cancel context.CancelCauseFunc) *watchdog {
	w := &watchdog{idle: idle, cancel: cancel}
	if ttft > 0 {
		w.t = time.AfterFunc(ttft, w.fire)
	}
	return w
}

func (w *watchdog) fire() {
	if w.started.Load() {
		w.cancel(errIdleTimeout)
	} else {
		w.cancel(errTTFTTimeout)
	}
}

// beat records progress: the first beat ends the TTFT phase.
func (w *watchdog) beat() {
	w.started.Store(true)
	switch {
	case w.idle <= 0:
		w.stop()
	case w.t == nil:
		w.t = time.AfterFunc(w.idle, w.fire)
	default:
		w.t.Reset(w.idle)
	}
}

func (w *watchdog) stop() {
	if w.t != nil {
		w.t.Stop()
	}
}
