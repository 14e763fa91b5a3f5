package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// answerBuffers bounds the bytes of non-streaming answers the gateway holds at once
// (limits.max_buffered_total): an answer that does not get its room is streamed through as
// it comes, and can no longer be retried.
type answerBuffers struct{ used atomic.Int64 }

// take reserves n bytes within limit, or reports false.
func (b *answerBuffers) take(n, limit int64) bool {
	for {
		u := b.used.Load()
		if u+n > limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *answerBuffers) give(n int64) { b.used.Add(-n) }

// hold is one answer's share of the answer buffers: at most max bytes, taken as it grows
// and given back when the request ends (exchange.release).
type hold struct {
	all        *answerBuffers
	max, total int64 // this answer's bound, and every answer's
	held       *int64
}

// grow reserves room for a buffer of n bytes more.
func (h *hold) grow(n int) bool {
	if h == nil {
		return true
	}
	if !h.all.take(int64(n), h.total) {
		return false
	}
	*h.held += int64(n)
	return true
}

// maxHeldBeforeFirstEvent bounds the data-less events (keep-alive comments) held back until a
// stream's first event; past it they are dropped.
const maxHeldBeforeFirstEvent = 16 << 10

// maxHeldPreamble bounds the Responses preamble events held back until the first token; past
// it the stream is relayed (committed) as it comes.
const maxHeldPreamble = 1 << 20

// responsesTerminal reports whether an event (by its name) ends a Responses stream.
func responsesTerminal(name []byte) bool {
	switch string(name) {
	case "response.completed", "response.incomplete", "response.failed":
		return true
	}
	return false
}

// responsesPreamble reports whether an event (by its name) is a Responses stream's preamble:
// it says the response exists, not that the model produced anything.
func responsesPreamble(name []byte) bool {
	switch n := string(name); n {
	case "response.created", "response.in_progress", "response.queued":
		return true
	default:
		return strings.HasPrefix(n, "response.") && strings.HasSuffix(n, ".added")
	}
}

// firstEvent reads up to a stream's first event. Comments and blank lines before the first
// event with data (keep-alives of a server still queueing the request) are not the first
// byte: they neither end the TTFT phase nor commit the answer. They are held (bounded) and
// sent ahead of the first event. So is a Responses stream's preamble (response.created,
// response.in_progress, the first …added events), which a server sends before it has run
// the request at all: a failure up to the first token can still move to the next candidate.
func firstEvent(rd *openai.Reader) (ev openai.Event, held []byte, err error) {
	ev, err = rd.Next()
	for err == nil && (ev.Data == nil || (responsesPreamble(ev.Name) && wellFormed(ev) && len(held)+len(ev.Raw) <= maxHeldPreamble)) {
		if len(held)+len(ev.Raw) <= maxHeldBeforeFirstEvent || ev.Data != nil {
			held = append(held, ev.Raw...)
		}
		ev, err = rd.Next()
	}
	return ev, held, err
}

// relayStream relays an SSE answer event by event, flushing as soon as no further event is
// already buffered (so each event reaches the client the moment it arrived). The first event is read
// before anything is sent to the client, so a failure up to then can still be retried. After
// that, a failure leaves res.inband: the forward loop resumes the stream on the next candidate
// (resume: true) or ends it with that in-band SSE error event.
//
// An error the model server reports in the stream (an `error` event, or a chunk with an
// "error" object, as vLLM sends one) is not relayed as it arrives: as the first event it
// becomes the request's error answer (an HTTP status, retried like any upstream error); later
// it ends the relay and is the one in-band error the client gets (never followed by a second
// of Sluice's own), unless the stream is resumed elsewhere. A stream whose every choice
// reported its finish_reason is complete even if the connection breaks before [DONE]: the
// client gets the [DONE] it expects.
func (h *Handler) relayStream(ctx context.Context, cancel ender, ex *exchange, resp *http.Response, wd *watchdog, ep *upstream.Endpoint, res *result) {
	rd := openai.NewReader(resp.Body, int(h.srv.state.Load().snap.Config.MaxEventBytes))
	tap := &res.tap

	t0 := time.Now()
	ev, held, err := firstEvent(rd)
	t1 := time.Now()
	res.wait += t1.Sub(t0)
	// The tap's scan of each event is also its check: a chunk the client cannot decode is
	// never relayed (and not counted).
	marks := markTap(tap)
	if err == nil && !tap.ObserveChunk(ev, t1) {
		err = errMalformedEvent
	}
	if err != nil {
		h.failBeforeFirstByte(ctx, err, ep, res)
		return
	}
	wd.beatAt(t1)
	// A resumed stream continues one the client already has: no new headers, and its events
	// before the first token (the role chunk) are not relayed.
	resumed := ex.committed
	skip := resumed
	res.status = resp.StatusCode
	watch := ex.watchStream()
	if len(watch) > 0 {
		defer func() { ex.endWatch(watch) }()
	}
	for {
		if tap.ErrorSeen && !marks.errored {
			if !ex.committed {
				// The model server's first word is an error: answer it as one.
				streamErrorAnswer(ev, ep, res)
				return
			}
			res.upstreamErr = append([]byte(nil), ev.Raw...)
			err = errUpstreamStreamError
			break
		}
		if !ex.committed {
			ex.commit(resp.StatusCode, resp.Header, res)
			ex.sse = true
			if len(held) > 0 {
				if _, werr := ex.w.Write(held); werr != nil {
					cancel.Cancel(errClientWrite)
					res.failWith(writeFailed(werr))
					return
				}
			}
		}
		// A continuation's events before its first token (its role chunk) are not relayed:
		// the client has them. Anything more is: a token, a finish (a continuation may end at
		// once), its usage, its [DONE].
		if skip && (tap.TokenEvents > marks.tokens || tap.Finished > marks.finished || tap.HaveUsage != marks.usage || ev.IsDone()) {
			skip = false
		}
		if !skip {
			raw, replaced := ev.Raw, false
			if len(watch) > 0 {
				var cut *policy.StreamCut
				if raw, replaced, cut = watchEvent(watch, ev); cut != nil {
					h.cutStream(cancel, ex, cut, ep, res)
					return
				}
			}
			if resumed {
				raw = withStreamID(raw, replaced, ev, ex.streamID)
			}
			if len(raw) == 0 {
				// dropped by a stream filter
			} else if _, werr := ex.w.Write(raw); werr != nil {
				cancel.Cancel(errClientWrite)
				res.failWith(writeFailed(werr))
				return
			}
			// Flush unless the next event already arrived with this one: a burst goes out
			// in one write, and no event ever waits for another.
			if !rd.Pending() {
				ex.flush()
			}
		}
		// One clock read an event: the relay of the last event (mostly its write to the
		// client) and the wait for this one are both time on the network.
		ev, err = rd.Next()
		t := time.Now()
		res.wait += t.Sub(t1)
		t1 = t
		marks = markTap(tap)
		if err == nil && !tap.ObserveChunk(ev, t1) {
			err = errMalformedEvent // never relay a chunk the client cannot decode
		}
		if err != nil {
			break
		}
		if (ev.IsDone() || responsesTerminal(ev.Name)) && (wd.idle <= 0 || wd.idle > time.Second) {
			// Only the end of the body should follow; do not wait long for it.
			wd.idle = time.Second
		}
		wd.beatAt(t1)
	}
	h.endStream(ctx, ex, err, ep, res)
}

// tapMarks are what the tap had counted before an event: what the event added tells the
// relay whether it is an error, a token, a finish or a usage.
type tapMarks struct {
	tokens, finished int
	errored, usage   bool
}

func markTap(t *openai.Tap) tapMarks {
	return tapMarks{tokens: t.TokenEvents, finished: t.Finished, errored: t.ErrorSeen, usage: t.HaveUsage}
}

// endStream ends an attempt's stream the relay stopped reading with err (io.EOF at its
// end): a complete stream is a success; a stream whose every choice finished gets the
// [DONE] it lost; anything else is a failure in the stream, which the forward loop resumes
// elsewhere or sends in-band.
func (h *Handler) endStream(ctx context.Context, ex *exchange, err error, ep *upstream.Endpoint, res *result) {
	tap := &res.tap
	if tap.Done && !errors.Is(err, errUpstreamStreamError) { // response.failed is an end, not a success
		ep.Report(true)
		return
	}
	class := policy.ClassStreamCut
	if ctx.Err() != nil {
		class = causeClass(ctx)
	}
	if class == policy.ClassClientCancel {
		res.failWith(attemptFailure(class, err))
		return
	}
	if !errors.Is(err, errUpstreamStreamError) && finished(tap, ex.preq.Request) {
		// Every choice finished: the answer is whole, only its end marker was lost.
		h.endFinishedStream(ex, tap, ep, res)
		return
	}
	// The stream broke after it started: say so in-band, never hang or end silently.
	var f *policy.Failure
	switch {
	case errors.Is(err, errUpstreamStreamError):
		ep.Report(false)
		f = policy.Failf(policy.ClassStreamError, err, "")
	case class == policy.ClassStreamCut && errors.Is(err, openai.ErrEventTooLarge):
		// The gateway's own bound, not an endpoint failure: do not report it.
		f = eventTooLarge(err)
	case class == policy.ClassStreamCut && errors.Is(err, errMalformedEvent):
		ep.Report(false)
		f = malformedFailure(err)
	default:
		if class == policy.ClassStreamCut || class == policy.ClassIdleTimeout {
			ep.Report(false)
		}
		f = attemptFailure(class, err)
	}
	// The forward loop either resumes the stream elsewhere or sends this in-band.
	f.Phase = policy.InStream
	res.failWith(f)
}

// finished reports whether every choice of a chat or completions stream reported its finish
// reason (a Responses stream ends with its terminal event, which sets Done).
func finished(tap *openai.Tap, req *openai.Request) bool {
	if req == nil || (req.Kind != openai.KindChat && req.Kind != openai.KindCompletion) {
		return false
	}
	return tap.Finished > 0 && tap.Finished >= max(req.N, 1)
}

// doneEvent is the end marker of a chat or completions stream.
var doneEvent = []byte("data: [DONE]\n\n")

// endFinishedStream ends a stream whose answer is complete but whose [DONE] was lost: the
// client gets it, and the attempt counts as a success.
func (h *Handler) endFinishedStream(ex *exchange, tap *openai.Tap, ep *upstream.Endpoint, res *result) {
	if _, err := ex.w.Write(doneEvent); err != nil {
		res.failWith(writeFailed(err))
		return
	}
	ex.flush()
	if ex.mirror != nil {
		ex.mirror.Capture(doneEvent, false)
	}
	tap.Done = true
	tap.Events++
	ep.Report(true)
}

// streamErrorAnswer turns a stream whose first event is the model server's error into that
// error as a plain answer: the status its code names (else 502) and an OpenAI error body,
// which the forward loop retries or relays like any upstream error answer.
func streamErrorAnswer(ev openai.Event, ep *upstream.Endpoint, res *result) {
	status, body := openai.StreamErrorBody(ev.Data)
	res.pending = &pending{status: status, header: http.Header{"Content-Type": {"application/json"}}, body: body}
	reportStatus(ep, status)
	res.failWith(upstreamFailure(status)) // status is 400–599
}

// errUpstreamStreamError: the model server reported an error in the stream.
var errUpstreamStreamError = errors.New("the model server reported an error in the stream")

// errMalformedEvent: the model server sent a data event that is not JSON (nor [DONE]).
var errMalformedEvent = errors.New("the model server sent a malformed stream chunk")

// wellFormed reports whether an event can be relayed: no data, [DONE], or a whole JSON object.
func wellFormed(ev openai.Event) bool {
	return ev.Data == nil || ev.IsDone() || openai.WellFormedChunk(ev.Data)
}

// malformedFailure is a stream chunk that is not JSON: the stream is cut there (its class),
// and the client reads that the chunk was malformed (its code).
func malformedFailure(err error) *policy.Failure {
	f := policy.Failf(policy.ClassStreamCut, err, "the model server sent a malformed stream chunk (not valid JSON); the stream was ended")
	f.Code = string(policy.ClassUpstreamMalformed)
	return f
}

// chunkID is the raw JSON "id" of a stream chunk (nil when it has none).
func chunkID(data []byte) json.RawMessage {
	var c struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(data, &c) != nil || len(c.ID) == 0 || c.ID[0] != '"' {
		return nil
	}
	return c.ID
}

// withStreamID returns a resumed stream's event raw (ev's, or what a stream filter put in its
// place: replaced) carrying the id of the stream the client already has, so that the client sees one
// completion (clients such as openai-go's stream accumulator drop chunks whose id differs
// from the first one's).
func withStreamID(raw []byte, replaced bool, ev openai.Event, id json.RawMessage) []byte {
	if id == nil || len(raw) == 0 || ev.Name != nil || ev.IsDone() || len(ev.Data) == 0 || ev.Data[0] != '{' {
		return raw
	}
	data := ev.Data
	if replaced {
		// A filter's replacement: one plain data event, or left as it is.
		d, plain := bytes.CutPrefix(raw, []byte("data: "))
		d, whole := bytes.CutSuffix(d, []byte("\n\n"))
		if !plain || !whole || len(d) == 0 || d[0] != '{' || bytes.ContainsAny(d, "\r\n") {
			return raw
		}
		data = d
	}
	d, err := openai.SetField(data, "id", id)
	if err != nil || bytes.ContainsAny(d, "\r\n") {
		return raw
	}
	out := make([]byte, 0, len(d)+8)
	out = append(out, "data: "...)
	out = append(out, d...)
	return append(out, "\n\n"...)
}

// relayBody relays a non-streaming answer. Answers up to limits.max_buffered_answer are read whole before
// anything is sent, so a 5xx or a broken body can still be retried elsewhere.
func (h *Handler) relayBody(ctx context.Context, ex *exchange, resp *http.Response, wd *watchdog, ep *upstream.Endpoint, res *result) {
	wd.beat() // headers arrived: the TTFT phase is over for a non-streaming answer
	res.status = resp.StatusCode
	lm := h.srv.state.Load().snap.Config.Limits
	hd := &hold{all: &h.srv.buffers, max: int64(lm.MaxBufferedAnswer), total: int64(lm.MaxBufferedTotal), held: &ex.held}
	body, complete, err := readBounded(resp.Body, int(hd.max), resp.ContentLength, hd, wd, res)
	if err != nil {
		if ctx.Err() == nil {
			// The headers came and the body broke (short, bad chunking, reset): the server
			// answered and may have done the work; not a connection failure.
			ep.Report(false)
			res.failWith(protocolError(err))
			return
		}
		h.failBeforeFirstByte(ctx, err, ep, res)
		return
	}
	now := time.Now()
	observed := false // the tap's scan of the body was its JSON check
	if resp.StatusCode < 300 && complete {
		f, wantJSON := unpromisedBody(ex.preq.Request, resp)
		if f == nil && wantJSON {
			if observed = res.tap.ObserveWholeBody(body, now); !observed {
				f = malformedAnswer("the body is not whole JSON (" + strconv.Itoa(len(body)) + " bytes)")
			}
		}
		if f != nil {
			ep.Report(false)
			res.failWith(f)
			return
		}
	}
	reportStatus(ep, resp.StatusCode)
	if resp.StatusCode >= 400 {
		res.failWith(upstreamFailure(resp.StatusCode))
	} else {
		if !observed {
			res.tap.ObserveBody(body, now)
		}
		res.tap.FirstToken = now
	}
	if complete {
		res.pending = &pending{status: resp.StatusCode, header: resp.Header, body: body}
		if resp.StatusCode < 300 && len(ex.bodies) > 0 {
			ex.watchBody(res.pending)
		}
		return
	}
	// Too large to hold: relay what we have and stream the rest through.
	ex.commit(resp.StatusCode, resp.Header, res)
	if _, err := ex.w.Write(body); err != nil {
		res.failWith(writeFailed(err))
		return
	}
	buf := make([]byte, 64<<10)
	for {
		t0 := time.Now()
		n, rerr := resp.Body.Read(buf)
		res.wait += time.Since(t0)
		if n > 0 {
			wd.beat()
			if _, err := ex.w.Write(buf[:n]); err != nil {
				res.failWith(writeFailed(err))
				return
			}
			ex.flush()
		}
		if rerr == io.EOF {
			return
		}
		if rerr != nil {
			// The answer's status stands (it went out with the headers); its class says how
			// the body ended.
			class := policy.ClassStreamCut
			if ctx.Err() != nil {
				class = causeClass(ctx)
			}
			res.fail = attemptFailure(class, rerr)
			res.fail.Phase = policy.InStream
			return
		}
	}
}

// failBeforeFirstByte classifies a failure that happened before anything reached the client.
func (h *Handler) failBeforeFirstByte(ctx context.Context, err error, ep *upstream.Endpoint, res *result) {
	var class policy.Class
	switch {
	case ctx.Err() != nil:
		class = causeClass(ctx)
	case errors.Is(err, openai.ErrEventTooLarge):
		// The first event is over the gateway's bound: the endpoint answered, nothing to
		// report against it, and it is not a connection failure.
		res.failWith(eventTooLarge(err))
		return
	case errors.Is(err, errMalformedEvent):
		ep.Report(false)
		res.failWith(malformedFailure(err))
		return
	case errors.Is(err, io.EOF):
		class = policy.ClassEmptyResponse
	default:
		class = policy.ClassConnect
	}
	if class == policy.ClassConnect || class == policy.ClassEmptyResponse {
		ep.Report(false)
	}
	res.failWith(attemptFailure(class, err))
}

// protocolError is the error of an answer whose body broke off or was malformed after its
// headers (a short body, bad chunking, a reset).
func protocolError(err error) *policy.Failure {
	return policy.Failf(policy.ClassUpstreamProtocol, err, "the model server's answer broke off or was malformed: "+truncate(err.Error(), 200))
}

// unpromisedBody checks a successful non-streaming answer's head against what the client was
// promised: never an encoding Sluice did not ask for (it asks for none), an event stream for
// a streaming request. wantJSON: the body must also be whole JSON (the JSON endpoints), which
// the caller checks with the tap's scan. The failure is nil when the head is as promised.
func unpromisedBody(req *openai.Request, resp *http.Response) (f *policy.Failure, wantJSON bool) {
	if ce := httphead.Get(resp.Header, "Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return malformedAnswer("Content-Encoding " + truncate(ce, 40) + ", which was not asked for"), false
	}
	if req == nil || !req.Kind.HasModel() {
		return nil, false // a passthrough answer is the server's business
	}
	if req.Stream {
		return malformedAnswer("a streaming request was answered with Content-Type " + strconv.Quote(truncate(resp.Header.Get("Content-Type"), 60)) + ", not an event stream"), false
	}
	return nil, true
}

// malformedAnswer is the failure of a successful answer that is not what was promised.
func malformedAnswer(why string) *policy.Failure {
	return policy.Fail(policy.ClassUpstreamMalformed, "the model server sent an invalid response: "+why)
}

// eventTooLarge is the error for an upstream SSE event over max_event_bytes.
func eventTooLarge(err error) *policy.Failure {
	return policy.Failf(policy.ClassUpstreamError, err, err.Error())
}

// readBounded reads up to limit bytes, beating the watchdog on each read. complete is false
// when the body is longer than limit, or when hd refuses room to grow (what was read is
// returned). A known length (size > 0) sizes the buffer at once.
func readBounded(r io.Reader, limit int, size int64, hd *hold, wd *watchdog, res *result) (body []byte, complete bool, err error) {
	initial := 4096
	if size > 0 {
		initial = int(min(size+1, int64(limit))) // +1: the read that sees EOF needs room
	}
	if !hd.grow(initial) {
		initial = 0
	}
	buf := make([]byte, 0, initial)
	for {
		if len(buf) >= limit {
			return buf, false, nil
		}
		if len(buf) == cap(buf) {
			// Double, within the bound and the room the buffers give.
			next := min(max(2*cap(buf), 4096), limit)
			if !hd.grow(next - cap(buf)) {
				return buf, false, nil
			}
			nb := make([]byte, len(buf), next)
			copy(nb, buf)
			buf = nb
		}
		t0 := time.Now()
		n, rerr := r.Read(buf[len(buf):min(cap(buf), limit)])
		res.wait += time.Since(t0)
		buf = buf[:len(buf)+n]
		if n > 0 {
			wd.beat()
		}
		if rerr == io.EOF {
			return buf, true, nil
		}
		if rerr != nil {
			return nil, false, rerr
		}
	}
}
