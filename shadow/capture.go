package shadow

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

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

// maxBody bounds what is read of a sandbox's JSON answer (past the capture, it is discarded).
const maxBody = 32 << 20

// ReadAnswer reads a sandbox's whole answer to the job's copy (resp, an SSE stream when sse)
// and measures it as the gateway's relay measures the primary's; start is when the copy was
// sent. The answer is kept within the job's capture bounds while it is parsed. ctx is the
// copy's: an answer cut when it ended is a time-out. The caller closes resp.Body.
func (j *Job) ReadAnswer(ctx context.Context, resp *http.Response, sse bool, start time.Time) Answer {
	s := j.settings
	var tap openai.Tap
	tap.Start = start
	capt := capture{limit: s.CaptureBytes, sse: sse && resp.StatusCode < 300, budget: &j.mirror.captured, total: s.CaptureTotal}
	defer capt.release() // the parsed answer is what is kept
	cut := false
	if capt.sse {
		rd := openai.NewReader(resp.Body, s.MaxEventBytes)
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
		_, err := io.Copy(&capt, io.LimitReader(resp.Body, maxBody))
		cut = err != nil
		now := time.Now()
		tap.FirstToken = now // the end of the body, as the relay records it
		if !capt.truncated {
			tap.ObserveBody(capt.buf, now)
		}
	}
	a, perr := answerOf(capt.sse, capt.buf)
	a.Status, a.Truncated = resp.StatusCode, capt.truncated
	a.ErrorClass = string(policy.UpstreamClass(resp.StatusCode))
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
	return a
}

// answerOf parses a captured answer (an SSE stream or a JSON body).
func answerOf(sse bool, b []byte) (Answer, error) {
	if len(b) == 0 {
		return Answer{}, nil
	}
	if sse {
		return AnswerFromSSE(b)
	}
	return AnswerFromChat(b)
}

// fillTimes sets an answer's latencies the same way for both sides, from the tap the relay
// (primary) or ReadAnswer (copies) kept: TTFT from the request's send to its first token
// event, ITL the mean gap between token events, E2E to the last token; for a JSON body, E2E
// to the end of the body (which the tap records as its first token).
func fillTimes(a *Answer, tap *openai.Tap, sse bool) {
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
