package proxy

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/config"
)

// batched sends a request through the route's batcher: merged with others of the same kind
// (model, encoding, dimensions, tenant) into one upstream request, which goes through the same
// forward loop (picking, retries, fallbacks) as any request; the caller gets its own part of
// the answer back.
func (h *Handler) batched(ctx context.Context, ex *exchange, st *state, rt *config.CompiledRoute, plan []policy.Candidate, bt batcher) result {
	preq := ex.preq
	var served result // the merged request's forward result (cluster, attempts)
	status, hdr, body, err := bt.Do(ctx, preq.Request, preq.Tenant, func(sctx context.Context, merged []byte) (int, http.Header, []byte, error) {
		// Runs on the batcher's goroutine, maybe after this caller is gone: only sub is used.
		rec := &bufferWriter{header: http.Header{}}
		sub := &exchange{w: rec, r: ex.r.WithContext(sctx), id: ex.id, start: time.Now(), preq: preq, contBody: merged}
		res := h.forward(sctx, sub, st, rt, plan)
		sub.giveBack(&h.srv.buffers) // the answer is in rec now
		if !sub.committed && res.fail != nil {
			return 0, nil, nil, res.fail
		}
		served = res
		return rec.status, rec.header, rec.body.Bytes(), nil
	})
	if err != nil {
		var f *policy.Failure
		var oe *openai.Error
		switch {
		case ctx.Err() != nil:
			return failed(attemptFailure(causeClass(ctx), err))
		case errors.As(err, &f):
			return failed(f)
		case errors.As(err, &oe):
			return failed(policy.FromOpenAI(oe))
		default:
			return failed(policy.Failf(policy.ClassUpstreamError, err, "batched request failed: "+err.Error()))
		}
	}
	// Only the caller whose send function carried the batch knows where it went.
	res := result{status: status, cluster: served.cluster, endpoint: served.endpoint, model: served.model, attempts: max(1, served.attempts)}
	if res.cluster == "" && len(plan) > 0 {
		res.cluster = plan[0].Cluster
	}
	res.tap.Start = ex.start
	// The share is answered now, whatever its status: nothing is retried.
	if status >= 400 {
		res.fail = upstreamFailure(status)
	} else {
		now := time.Now()
		res.tap.FirstToken = now
		res.tap.ObserveBody(body, now)
	}
	ex.commit(status, hdr, &res)
	if _, err := ex.w.Write(body); err != nil {
		res.failWith(writeFailed(err))
	}
	return res
}

// bufferWriter collects a whole answer (the merged request's) in memory.
type bufferWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferWriter) Header() http.Header { return b.header }

func (b *bufferWriter) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}
