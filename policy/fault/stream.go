package fault

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// ErrInjected is wrapped by every error a fault makes up (a cut's reset).
var ErrInjected = errors.New("fault injected")

// fstate is one stream fault's state within one stream.
type fstate struct {
	a     *active
	ev    eventFault
	phase phase
	done  bool // it is finished with this stream: later events skip it
	state any  // the kind's own state in this stream (an opener's)
}

func (st *fstate) spec() *Spec { return &st.a.f.spec }

// eventStep is the event at hand as the stream's faults have left it so far: each fault
// reads it and adds its wait, edit, drop or end.
type eventStep struct {
	ev      openai.Event  // as it came
	n       int           // its number among the events with data (from 1)
	tokens  int           // the token events before it
	data    []byte        // its data as edited, once changed (payload)
	changed bool          // a fault edited its data
	drop    bool          // it is dropped
	end     bool          // the stream ends in its place (an ender's doing)
	wait    time.Duration // to wait before sending it
	rng     *rand.Rand    // the stream's generator
}

// stream applies stream faults to a sequence of SSE events.
type stream struct {
	in      *Injection
	fs      []fstate // in phase order (stable: the faults' order within a phase)
	rng     *rand.Rand
	n       int // events with data so far
	tokens  int // token events so far
	needTap bool
	tap     openai.Tap
	endBy   *fault    // the fault that ended the stream
	e       eventStep // the event at hand (a field, so a step allocates nothing)
}

// forget drops the last event's bytes (a Write must not keep its p).
func (s *stream) forget() { s.e.ev, s.e.data = openai.Event{}, nil }

// newStream returns the stream faults of faults on side (nil when there are none).
func (in *Injection) newStream(faults []*active, side Side, idx uint64) *stream {
	var s *stream
	for _, a := range faults {
		if a.f.side != side || a.f.ev == nil {
			continue
		}
		if s == nil {
			s = &stream{in: in, rng: in.rng(idx)}
			s.e.rng = s.rng
		}
		s.fs = append(s.fs, fstate{a: a, ev: a.f.ev, phase: a.f.impl.phase()})
		if o, ok := a.f.ev.(opener); ok {
			o.open(s, &s.fs[len(s.fs)-1])
		}
	}
	if s != nil {
		slices.SortStableFunc(s.fs, func(x, y fstate) int { return cmp.Compare(x.phase, y.phase) })
	}
	return s
}

// step takes one event: it returns the bytes to send in its place appended to dst
// (nothing when it is dropped), how long to wait before sending them, and whether the
// stream must end here instead (endUpstream, endDownstream).
func (s *stream) step(ev openai.Event, dst []byte) (out []byte, wait time.Duration, end bool) {
	if ev.Data == nil || !s.in.live() {
		return append(dst, ev.Raw...), 0, false
	}
	s.n++
	before := s.tokens
	if s.needTap {
		s.tap.Observe(ev, time.Time{})
		s.tokens = s.tap.TokenEvents
	}
	// Field by field, and only what a fault reads before it writes: this runs per event.
	e := &s.e
	e.ev, e.n, e.tokens = ev, s.n, before
	e.changed, e.drop, e.end, e.wait = false, false, false, 0
	for i := range s.fs {
		st := &s.fs[i]
		if st.done || !st.ev.event(e, st) {
			continue
		}
		s.in.fire(st.a)
		if e.end {
			s.endBy = st.a.f
			break
		}
	}
	switch {
	case e.end:
		out = dst
	case e.drop:
		out, wait = dst, e.wait
	case !e.changed:
		out, wait = append(dst, ev.Raw...), e.wait
	default:
		out, wait = appendEvent(dst, ev.Name, e.data), e.wait
	}
	return out, wait, e.end
}

// payload returns the event's data as the faults so far left it.
func (e *eventStep) payload() []byte {
	if e.changed {
		return e.data
	}
	return e.ev.Data
}

// edit replaces the event's data.
func (e *eventStep) edit(data []byte) { e.data, e.changed = data, true }

// body applies the body faults (drift, corrupt, malformed) to a whole non-streaming JSON
// body.
func (s *stream) body(data []byte) []byte {
	if !s.in.live() {
		return data
	}
	for i := range s.fs {
		st := &s.fs[i]
		if bf, ok := st.ev.(bodyFault); ok {
			if d, fired := bf.body(data, st); fired {
				s.in.fire(st.a)
				data = d
			}
		}
	}
	return data
}

// endUpstream returns dst with what the gateway reads last appended, and the read error
// after it, once the stream has ended.
func (s *stream) endUpstream(dst []byte) ([]byte, error) {
	return s.endBy.impl.(ender).endUpstream(dst, s.endBy)
}

// endDownstream returns dst with what the client gets last appended, once the stream has
// ended; reset: abort the handler instead.
func (s *stream) endDownstream(dst []byte) ([]byte, bool) {
	return s.endBy.impl.(ender).endDownstream(dst, s.endBy)
}

// appendEvent appends an event: its name, then one data: line per line of data.
func appendEvent(dst, name, data []byte) []byte {
	if name != nil {
		dst = append(dst, "event: "...)
		dst = append(dst, name...)
		dst = append(dst, '\n')
	}
	for {
		dst = append(dst, "data: "...)
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			dst = append(dst, data...)
			break
		}
		dst = append(dst, data[:i]...)
		dst = append(dst, '\n')
		data = data[i+1:]
	}
	return append(dst, "\n\n"...)
}

// maxBody bounds a non-streaming body held to be rewritten; a longer one passes unchanged.
const maxBody = 32 << 20

// WrapUpstream returns body with the attempt's stream faults applied, as the gateway reads
// it from the model server (body itself when none applies). streaming says whether body is
// an SSE stream (Content-Type text/event-stream); for a non-streaming JSON body only drift,
// corrupt and malformed apply. Waits end early with ctx (the read then fails with ctx's
// cause), so pass the attempt's context. A cut ends the stream: eof with io.EOF, reset and
// h2reset with a *CutError, sse_error with an `event: error` event and io.EOF. Wrap only
// successful (2xx) answers.
func (a *Attempt) WrapUpstream(ctx context.Context, body io.ReadCloser, streaming bool) io.ReadCloser {
	if a == nil || body == nil {
		return body
	}
	s := a.in.newStream(a.faults, Upstream, a.stream)
	if s == nil {
		return body
	}
	r := &upReader{ctx: ctx, body: body, s: s, streaming: streaming}
	if streaming {
		r.rd = openai.NewReader(body, 0)
	}
	return r
}

type upReader struct {
	ctx       context.Context
	body      io.ReadCloser
	s         *stream
	rd        *openai.Reader
	streaming bool
	pass      bool // a long non-streaming body: the rest passes through
	out       []byte
	off       int
	err       error
}

func (r *upReader) Read(p []byte) (int, error) {
	for r.off == len(r.out) {
		if r.err != nil {
			return 0, r.err
		}
		if r.pass {
			return r.body.Read(p)
		}
		r.out, r.off = r.out[:0], 0
		if !r.streaming {
			r.readBody()
			continue
		}
		ev, err := r.rd.Next()
		if err != nil {
			// The end, or a partial event with the error: those bytes go out as they came.
			r.out = append(r.out, ev.Raw...)
			r.err = err
			continue
		}
		out, w, end := r.s.step(ev, r.out)
		if w > 0 {
			if err := r.s.in.sleep(r.ctx, w); err != nil {
				r.err = err
				continue
			}
		}
		if end {
			r.out, r.err = r.s.endUpstream(out)
			continue
		}
		r.out = out
	}
	n := copy(p, r.out[r.off:])
	r.off += n
	return n, nil
}

func (r *upReader) readBody() {
	data, err := io.ReadAll(io.LimitReader(r.body, maxBody+1))
	switch {
	case err != nil:
		r.out, r.err = data, err
	case len(data) > maxBody:
		r.out, r.pass = data, true
	default:
		r.out, r.err = r.s.body(data), io.EOF
	}
}

func (r *upReader) Close() error { return r.body.Close() }

// WrapDownstream returns w with the downstream stream faults applied to what the gateway
// writes to the client (w itself when none applies). The gateway writes the headers first
// (WriteHeader), then one SSE event per Write (several in one Write are handled too); a
// 2xx text/event-stream answer gets every stream fault, a 2xx JSON answer drift, corrupt
// and malformed (Content-Length is dropped), anything else passes unchanged. Waits end
// early with ctx (Write then fails with ctx's cause). A cut ends the stream: eof swallows
// every later Write (the client sees the stream end without [DONE]), sse_error writes an
// error event first, reset and h2reset panic with http.ErrAbortHandler (net/http then
// resets the HTTP/2 stream or closes the HTTP/1 connection). The result implements
// http.Flusher and Unwrap (for http.ResponseController).
func (in *Injection) WrapDownstream(ctx context.Context, w http.ResponseWriter) http.ResponseWriter {
	if in == nil {
		return w
	}
	s := in.newStream(in.faults, Downstream, in.streams.Add(1))
	if s == nil {
		return w
	}
	return &downWriter{ctx: ctx, w: w, s: s}
}

const (
	modeUnset = iota
	modeSSE
	modeJSON
	modePass
)

type downWriter struct {
	ctx     context.Context
	w       http.ResponseWriter
	s       *stream
	mode    int
	swallow bool
	buf     []byte
	scratch []byte
}

func (d *downWriter) Header() http.Header { return d.w.Header() }

// Unwrap returns the wrapped ResponseWriter.
func (d *downWriter) Unwrap() http.ResponseWriter { return d.w }

// Flush flushes the wrapped writer when it can.
func (d *downWriter) Flush() {
	if f, ok := d.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (d *downWriter) decide(code int) {
	if d.mode != modeUnset {
		return
	}
	ct := d.w.Header().Get("Content-Type")
	switch {
	case code < 200 || code >= 300:
		d.mode = modePass
	case strings.HasPrefix(ct, "text/event-stream"):
		d.mode = modeSSE
	case strings.Contains(ct, "json"):
		d.mode = modeJSON
		d.w.Header().Del("Content-Length")
	default:
		d.mode = modePass
	}
}

func (d *downWriter) WriteHeader(code int) {
	if code >= 200 {
		d.decide(code)
	}
	d.w.WriteHeader(code)
}

func (d *downWriter) Write(p []byte) (int, error) {
	d.decide(http.StatusOK)
	switch {
	case d.swallow:
		return len(p), nil
	case d.mode == modePass:
		return d.w.Write(p)
	case d.mode == modeJSON:
		if !bytes.HasPrefix(bytes.TrimLeft(p, " \t\r\n"), []byte("{")) || skipValue(p, skipWS(p, 0), 0) < 0 {
			return d.w.Write(p) // not one whole JSON object: leave it
		}
		if _, err := d.w.Write(d.s.body(p)); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	out := d.buf[:0]
	var err error
	splitEvents(p, &d.scratch, func(ev openai.Event) bool {
		var w time.Duration
		var end bool
		start := len(out)
		out, w, end = d.s.step(ev, out)
		if w > 0 {
			// Send what came before this event, then wait.
			if err = d.send(out[:start]); err != nil {
				return false
			}
			out = append(out[:0], out[start:]...)
			if err = d.s.in.sleep(d.ctx, w); err != nil {
				return false
			}
		}
		if !end {
			return true
		}
		if err = d.send(out); err != nil {
			return false
		}
		var reset bool
		if out, reset = d.s.endDownstream(out[:0]); reset {
			d.Flush()
			panic(http.ErrAbortHandler)
		}
		d.swallow = true
		return false
	})
	d.buf = out[:0]
	d.s.forget()
	if err != nil {
		return 0, err
	}
	if err := d.send(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (d *downWriter) send(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := d.w.Write(b)
	if err == nil && d.mode == modeSSE {
		d.Flush()
	}
	return err
}

// splitEvents calls fn with each event of p, until fn returns false: an event ends with a
// blank line ("\n", "\r\n" or "\r" line ends); bytes after the last one go as an event
// without data.
func splitEvents(p []byte, scratch *[]byte, fn func(openai.Event) bool) {
	var ev openai.Event
	start, pos, nData := 0, 0, 0
	for pos < len(p) {
		eol := pos
		for eol < len(p) && p[eol] != '\n' && p[eol] != '\r' {
			eol++
		}
		if eol == len(p) {
			break
		}
		next := eol + 1
		if p[eol] == '\r' && next < len(p) && p[next] == '\n' {
			next++
		}
		line := p[pos:eol:eol]
		pos = next
		if len(line) == 0 {
			ev.Raw = p[start:next:next]
			if !fn(ev) {
				return
			}
			ev, start, nData = openai.Event{}, next, 0
			continue
		}
		if line[0] == ':' {
			continue
		}
		name, val := line, line[len(line):]
		if c := bytes.IndexByte(line, ':'); c >= 0 {
			name, val = line[:c], line[c+1:]
			if len(val) > 0 && val[0] == ' ' {
				val = val[1:]
			}
		}
		switch string(name) {
		case "data":
			nData++
			switch nData {
			case 1:
				ev.Data = val
			case 2:
				*scratch = append((*scratch)[:0], ev.Data...)
				fallthrough
			default:
				*scratch = append(*scratch, '\n')
				*scratch = append(*scratch, val...)
				ev.Data = *scratch
			}
		case "event":
			ev.Name = val
		}
	}
	if start < len(p) {
		fn(openai.Event{Raw: p[start:]})
	}
}
