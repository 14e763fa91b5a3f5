package fault

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// KindAbort answers with an HTTP error (status, Retry-After), before forwarding: upstream in
// the model server's place (retries, fallback and breakers react), downstream to the client.
const KindAbort Kind = "abort"

// DefaultAbortStatus is an abort's status when none is set.
const DefaultAbortStatus = 503

type abortKind struct{}

func (abortKind) kind() Kind       { return KindAbort }
func (abortKind) phase() phase     { return beforeForwarding }
func (abortKind) params() []string { return []string{"status", "retry_after", "message"} }

func (abortKind) check(s Spec) (c checker) {
	if s.Status != 0 && (s.Status < 400 || s.Status > 599) {
		c.add("status", "must be an HTTP error status (400..599), not %d", s.Status)
	}
	return c
}

// before chooses this abort, unless an earlier fault chose one.
func (abortKind) before(b beforeStep, f *fault) (beforeStep, bool) {
	if b.abort != nil {
		return b, false
	}
	b.abort = newAbort(f, b.side)
	return b, true
}

// Abort is an injected error answer.
type Abort struct {
	// Side tells how to treat it: Upstream is the model server's answer (the gateway's
	// retries, fallback and breakers react to it: use Response in place of the round trip);
	// Downstream goes straight to the client (openai.WriteError).
	Side    Side
	FaultID string
	Err     *openai.Error // status, OpenAI error body, Retry-After
}

// Response returns the abort as the model server's HTTP answer to req: the status,
// Content-Type application/json, Retry-After when set, and the OpenAI error body.
func (a *Abort) Response(req *http.Request) *http.Response {
	body := a.Err.Body()
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Sluice-Fault", a.FaultID)
	if a.Err.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((a.Err.RetryAfter+time.Second-1)/time.Second), 10))
	}
	return &http.Response{
		Status:        strconv.Itoa(a.Err.Status) + " " + http.StatusText(a.Err.Status),
		StatusCode:    a.Err.Status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

func newAbort(f *fault, side Side) *Abort {
	status := f.spec.Status
	if status == 0 {
		status = DefaultAbortStatus
	}
	typ := "server_error"
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case status < 500:
		typ = "invalid_request_error"
	}
	msg := f.spec.Message
	if msg == "" {
		msg = "injected fault: abort " + strconv.Itoa(status)
	}
	e := openai.NewError(status, typ, "fault_injected", msg)
	e.RetryAfter = f.spec.RetryAfter.D()
	return &Abort{Side: side, FaultID: f.id, Err: e}
}
