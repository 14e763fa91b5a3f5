package fault

import (
	"io"
	"net/http"
	"syscall"

	"github.com/sluicegw/sluice/policy/openai"
)

// KindCut ends the stream in place of event N+1 (after_events, default 0: before the
// first), as its mode says.
const KindCut Kind = "cut"

// Modes of a cut.
const (
	CutEOF      = "eof"       // a clean end of stream without [DONE]
	CutReset    = "reset"     // a TCP reset
	CutH2Reset  = "h2reset"   // an HTTP/2 stream reset
	CutSSEError = "sse_error" // an in-band `event: error` event, then the end
)

type cutKind struct{}

func (cutKind) kind() Kind       { return KindCut }
func (cutKind) phase() phase     { return endsStream }
func (cutKind) params() []string { return []string{"after_events", "mode", "message"} }

func (cutKind) check(s Spec) (c checker) {
	if s.AfterEvents < 0 {
		c.add("after_events", "must not be negative")
	}
	switch s.Mode {
	case "", CutEOF, CutReset, CutH2Reset, CutSSEError:
	default:
		c.add("mode", "must be eof, reset, h2reset or sse_error, not %q", s.Mode)
	}
	return c
}

func (cutKind) event(e *eventStep, st *fstate) bool {
	if e.n <= st.spec().AfterEvents {
		return false
	}
	e.end = true
	return true
}

func cutMode(f *fault) string {
	if f.spec.Mode == "" {
		return CutEOF
	}
	return f.spec.Mode
}

// endUpstream: eof ends the read with io.EOF, sse_error with an `event: error` event and
// io.EOF, reset and h2reset with a *CutError.
func (cutKind) endUpstream(dst []byte, f *fault) ([]byte, error) {
	switch mode := cutMode(f); mode {
	case CutEOF:
		return dst, io.EOF
	case CutSSEError:
		return append(dst, cutEvent(f)...), io.EOF
	default:
		return dst, &CutError{Mode: mode}
	}
}

// endDownstream: sse_error writes an `event: error` event, eof nothing more (the writer
// swallows every later Write), reset and h2reset abort the handler.
func (cutKind) endDownstream(dst []byte, f *fault) ([]byte, bool) {
	switch cutMode(f) {
	case CutReset, CutH2Reset:
		return dst, true
	case CutSSEError:
		return append(dst, cutEvent(f)...), false
	}
	return dst, false
}

// cutEvent is the in-band error of a cut in sse_error mode.
func cutEvent(f *fault) []byte {
	msg := f.spec.Message
	if msg == "" {
		msg = "injected fault: stream cut"
	}
	return openai.NewError(http.StatusBadGateway, "server_error", "fault_injected", msg).SSE()
}

// CutError is the read error of an upstream stream cut by a reset or h2reset: like the
// transport's own, it is not io.EOF. A reset wraps syscall.ECONNRESET; both wrap ErrInjected.
type CutError struct{ Mode string }

func (e *CutError) Error() string {
	if e.Mode == CutH2Reset {
		return "stream error: stream ID 1; INTERNAL_ERROR; received from peer (injected fault)"
	}
	return "read: connection reset by peer (injected fault)"
}

// Unwrap returns ErrInjected, and syscall.ECONNRESET for a reset.
func (e *CutError) Unwrap() []error {
	if e.Mode == CutH2Reset {
		return []error{ErrInjected}
	}
	return []error{ErrInjected, syscall.ECONNRESET}
}
