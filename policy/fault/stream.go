package fault

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/sluicegw/sluice/proxy/openai"
)

// ErrInjected is wrapped by every error a fault makes up (a cut's reset).
var ErrInjected = errors.New("fault injected")

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

// fstate is one stream fault's state within one stream.
type fstate struct {
	a       *active
	done    bool
	corrupt *corrupter
}

// stream applies stream faults to a sequence of SSE events.
type stream struct {
	in      *Injection
	fs      []fstate
	rng     *rand.Rand
	n       int // events with data so far
	tokens  int // token events so far
	needTap bool
	tap     openai.Tap
	cutBy   *fault
}

// newStream returns the stream faults of faults on side (nil when there are none).
func (in *Injection) newStream(faults []*active, side Side, idx uint64) *stream {
	var s *stream
	for _, a := range faults {
		if a.f.side != side || a.f.kind.request() {
			continue
		}
		if s == nil {
			s = &stream{in: in, rng: in.rng(idx)}
		}
		st := fstate{a: a}
		switch a.f.kind {
		case KindStall:
			s.needTap = s.needTap || a.f.spec.AfterTokens > 0
		case KindCorrupt:
			rate := a.f.spec.Rate
			if rate == 0 {
				rate = DefaultCorruptRate
			}
			var rng *rand.Rand
			if a.f.spec.Seed != 0 {
				rng = rand.New(rand.NewPCG(uint64(a.f.spec.Seed), 0))
			} else {
				rng = rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64()))
			}
			st.corrupt = &corrupter{rate: rate, rng: rng}
		}
		s.fs = append(s.fs, st)
	}
	return s
}

// step takes one event: it returns the bytes to send in its place appended to dst
// (nothing when it is dropped), how long to wait before sending them, and the mode of a
// cut when the stream must end here instead.
func (s *stream) step(ev openai.Event, dst []byte) (out []byte, wait time.Duration, cut string) {
	if ev.Data == nil || !s.in.live() {
		return append(dst, ev.Raw...), 0, ""
	}
	s.n++
	before := s.tokens
	if s.needTap {
		s.tap.Observe(ev, time.Time{})
		s.tokens = s.tap.TokenEvents
	}
	for i := range s.fs {
		st := &s.fs[i]
		sp := &st.a.f.spec
		if st.a.f.kind == KindCut && s.n > sp.AfterEvents {
			s.in.fire(st.a)
			s.cutBy = st.a.f
			mode := sp.Mode
			if mode == "" {
				mode = CutEOF
			}
			return dst, 0, mode
		}
	}
	data, changed, drop := ev.Data, false, false
	for i := range s.fs {
		st := &s.fs[i]
		sp := &st.a.f.spec
		switch st.a.f.kind {
		case KindTTFT:
			if s.n == 1 {
				s.in.fire(st.a)
				wait += sp.For.D()
			}
		case KindDrip:
			s.in.fire(st.a)
			wait += waitOf(s.rng, sp.Gap.D(), sp.Jitter.D(), sp.Shape, sp.Scale.D())
		case KindStall:
			if st.done {
				continue
			}
			if (sp.AfterTokens > 0 && before >= sp.AfterTokens) || (sp.AfterTokens == 0 && s.n > sp.AfterEvents) {
				st.done = true
				s.in.fire(st.a)
				wait += sp.For.D()
			}
		case KindDrop:
			if sp.Mode == DropDone {
				if ev.IsDone() || isResponsesTerminal(ev.Name) {
					s.in.fire(st.a)
					drop = true
				}
				continue
			}
			if d, dropIt, ch := dropUsage(data); ch {
				s.in.fire(st.a)
				data, changed, drop = d, true, drop || dropIt
			}
		case KindDrift:
			if d, ch := st.a.f.drift.apply(data); ch {
				s.in.fire(st.a)
				data, changed = d, true
			}
		case KindCorrupt:
			paths := contentPaths
			if string(ev.Name) == "response.output_text.delta" {
				paths = responsesDeltaPath
			}
			if d, ch := corruptPaths(data, st.corrupt, paths); ch {
				s.in.fire(st.a)
				data, changed = d, true
			}
		}
	}
	for i := range s.fs {
		// Malformed last, so that it is what the event ends up as.
		st := &s.fs[i]
		if st.a.f.kind == KindMalformed && s.n == max(st.a.f.spec.At, 1) && !drop {
			s.in.fire(st.a)
			data, changed = malform(data, st.a.f.spec.Mode), true
		}
	}
	switch {
	case drop:
		return dst, wait, ""
	case !changed:
		return append(dst, ev.Raw...), wait, ""
	}
	return appendEvent(dst, ev.Name, data), wait, ""
}

// body applies drift, corrupt and malformed to a whole non-streaming JSON body.
func (s *stream) body(data []byte) []byte {
	if !s.in.live() {
		return data
	}
	for i := range s.fs {
		st := &s.fs[i]
		switch st.a.f.kind {
		case KindDrift:
			if d, ch := st.a.f.drift.apply(data); ch {
				s.in.fire(st.a)
				data = d
			}
		case KindCorrupt:
			if d, ch := corruptJSON(data, st.corrupt); ch {
				s.in.fire(st.a)
				data = d
			}
		}
	}
	for i := range s.fs {
		if st := &s.fs[i]; st.a.f.kind == KindMalformed {
			s.in.fire(st.a)
			data = malform(data, st.a.f.spec.Mode)
		}
	}
	return data
}

// waitOf is wait without a generator when there is nothing random to draw.
func waitOf(rng *rand.Rand, fixed, jitter time.Duration, shape float64, scale time.Duration) time.Duration {
	if jitter <= 0 && shape <= 0 {
		return fixed
	}
	return wait(rng, fixed, jitter, shape, scale)
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

// cutFault returns the fault that cut the stream.
func (s *stream) cutFault() *fault { return s.cutBy }

// cutEvent is the in-band error of a cut in sse_error mode.
func cutEvent(f *fault) []byte {
	msg := ""
	if f != nil {
		msg = f.spec.Message
	}
	if msg == "" {
		msg = "injected fault: stream cut"
	}
	return openai.NewError(http.StatusBadGateway, "server_error", "fault_injected", msg).SSE()
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
		out, w, cut := r.s.step(ev, r.out)
		if w > 0 {
			if err := r.s.in.sleep(r.ctx, w); err != nil {
				r.err = err
				continue
			}
		}
		switch cut {
		case "":
			r.out = out
		case CutEOF:
			r.err = io.EOF
		case CutSSEError:
			r.out = append(r.out, cutEvent(r.s.cutFault())...)
			r.err = io.EOF
		default:
			r.err = &CutError{Mode: cut}
		}
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
		var cut string
		start := len(out)
		out, w, cut = d.s.step(ev, out)
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
		if cut == "" {
			return true
		}
		if err = d.send(out); err != nil {
			return false
		}
		out = out[:0]
		switch cut {
		case CutReset, CutH2Reset:
			d.Flush()
			panic(http.ErrAbortHandler)
		case CutSSEError:
			out = append(out, cutEvent(d.s.cutFault())...)
		}
		d.swallow = true
		return false
	})
	d.buf = out[:0]
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
