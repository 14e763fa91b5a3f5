package sim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// appendID appends a fresh response id: prefix + 16 hex digits.
func (s *Server) appendID(b []byte, prefix string) []byte {
	b = append(b, prefix...)
	v := mix64(s.idBase ^ s.idSeq.Add(1))
	for i := 60; i >= 0; i -= 4 {
		b = append(b, hexDigits[(v>>uint(i))&0xf])
	}
	return b
}

// appendTokens appends the text of tokens [from, to) of a text choice (no quotes: the words
// and markers need no escaping).
func (c *choice) appendTokens(b []byte, from, to int) []byte {
	for i := from; i < to; i++ {
		b = c.text.next(b)
	}
	return b
}

// writeResponse writes the non-streaming answer.
func (s *Server) writeResponse(w http.ResponseWriter, p *plan, arrival time.Time) error {
	bp := getBuf()
	defer putBuf(bp)
	b := *bp
	switch p.ep {
	case epEmbeddings:
		b = s.appendEmbeddings(b, p)
	case epResponses:
		s.storeResponse(p)
		b = s.appendResponse(b, p, true)
	default:
		b = s.appendCompletion(b, p, arrival.Unix())
	}
	*bp = b
	if err := writeJSON(w, b); err != nil {
		return errGone
	}
	return nil
}

func (s *Server) appendCompletion(b []byte, p *plan, created int64) []byte {
	chat := p.ep == epChat
	if chat {
		b = s.appendID(append(b, `{"id":"`...), "chatcmpl-")
		b = append(b, `","object":"chat.completion","created":`...)
	} else {
		b = s.appendID(append(b, `{"id":"`...), "cmpl-")
		b = append(b, `","object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, s.modelJSON...)
	b = append(b, `,"choices":[`...)
	completion := 0
	for i := range p.choices {
		c := &p.choices[i]
		completion += c.n
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		switch {
		case c.tool != nil:
			b = append(b, `,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"`...)
			b = append(b, c.tool.id...)
			b = append(b, `","type":"function","function":{"name":`...)
			b = openai.AppendString(b, c.tool.name)
			b = append(b, `,"arguments":`...)
			b = openai.AppendString(b, c.tool.emittedArgs())
			b = append(b, `}}]}`...)
		case chat:
			b = append(b, `,"message":{"role":"assistant","content":"`...)
			b = c.appendTokensLP(b, c.lp, 0, c.n)
			b = append(b, `"}`...)
		default:
			b = append(b, `,"text":"`...)
			b = c.appendTokensLP(b, c.lp, 0, c.n)
			b = append(b, '"')
		}
		b = append(b, `,"logprobs":`...)
		b = c.lp.appendTo(b)
		b = append(b, `,"finish_reason":"`...)
		b = append(b, c.finish...)
		b = append(b, `"}`...)
	}
	b = append(b, `],"usage":`...)
	b = appendUsage(b, p.promptTokens, completion, true)
	return append(b, '}')
}

// embed fills v with the deterministic unit vector of text.
func embed(v []float32, text string) {
	h := newHasher()
	h.str(text)
	r := splitmix(h.sum())
	var norm float64
	for i := range v {
		x := float64(r.next()>>11)/(1<<52) - 1 // uniform in [-1, 1)
		v[i] = float32(x)
		norm += float64(v[i]) * float64(v[i])
	}
	if norm == 0 {
		v[0], norm = 1, 1
	}
	inv := 1 / math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) * inv)
	}
}

func (s *Server) appendEmbeddings(b []byte, p *plan) []byte {
	vec := make([]float32, p.dims)
	var raw []byte
	if p.base64 {
		raw = make([]byte, 4*p.dims)
	}
	b = append(b, `{"object":"list","data":[`...)
	for i := range p.choices {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"object":"embedding","index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"embedding":`...)
		embed(vec, p.choices[i].input)
		if p.base64 {
			for k, f := range vec {
				binary.LittleEndian.PutUint32(raw[4*k:], math.Float32bits(f))
			}
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, raw)
			b = append(b, '"')
		} else {
			b = append(b, '[')
			for k, f := range vec {
				if k > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	b = append(b, `],"model":`...)
	b = append(b, s.modelJSON...)
	b = append(b, `,"usage":`...)
	b = appendUsage(b, p.promptTokens, 0, false)
	return append(b, '}')
}

// streamer writes one SSE response: `data: {json}\n\n` per event, flushed per event, with
// the per-request knobs applied between events.
type streamer struct {
	s      *Server
	w      http.ResponseWriter
	rc     *http.ResponseController
	ctx    context.Context
	p      *plan
	kn     knobs
	bp     *[]byte
	prefix []byte // `data: {"id":...,"choices":[`
	events int
	abort  bool // the connection could not be hijacked: abort the handler at its end
}

func (s *Server) newStreamer(ctx context.Context, w http.ResponseWriter, p *plan, kn knobs, arrival time.Time) *streamer {
	st := &streamer{s: s, w: w, rc: http.NewResponseController(w), ctx: ctx, p: p, kn: kn, bp: getBuf()}
	if p.ep == epResponses {
		return st // events are built whole: see revent
	}
	pre := make([]byte, 0, 128+len(s.modelJSON))
	if p.ep == epChat {
		pre = s.appendID(append(pre, `data: {"id":"`...), "chatcmpl-")
		pre = append(pre, `","object":"chat.completion.chunk","created":`...)
	} else {
		pre = s.appendID(append(pre, `data: {"id":"`...), "cmpl-")
		pre = append(pre, `","object":"text_completion","created":`...)
	}
	pre = strconv.AppendInt(pre, arrival.Unix(), 10)
	pre = append(pre, `,"model":`...)
	pre = append(pre, s.modelJSON...)
	pre = append(pre, `,"choices":[`...)
	st.prefix = pre
	return st
}

func (st *streamer) release() { putBuf(st.bp) }

// start sends the response headers and applies x-sim-stall-first; a Responses stream then
// sends response.created and response.in_progress.
func (st *streamer) start() error {
	h := st.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	st.w.WriteHeader(http.StatusOK)
	if err := st.flush(); err != nil {
		return err
	}
	if !sleepCtx(st.ctx, st.s.stop, st.kn.stallFirst) {
		if st.ctx.Err() != nil {
			return errGone
		}
		return errClosed
	}
	if st.p.ep == epResponses {
		return st.respOpen()
	}
	return nil
}

// send writes the event in *st.bp, applying the stall-after, die-after and error-after knobs
// first (in that order: a stall, then a kill wins over an error at the same count).
func (st *streamer) send() error {
	if st.events == st.kn.stallAfter && !sleepCtx(st.ctx, st.s.stop, st.kn.stallFor) {
		if st.ctx.Err() != nil {
			return errGone
		}
		return errClosed
	}
	if st.events == st.kn.dieAfter {
		st.abort = !kill(st.w)
		return errKilled
	}
	if st.events == st.kn.errorAfter {
		return st.sendError()
	}
	st.events++
	if _, err := st.w.Write(*st.bp); err != nil {
		return errGone
	}
	return st.flush()
}

// sendError ends the stream with an error the way vLLM does: for chat and completions
// `data: {"error":{...,"code":500}}` (after an `event: error` line with x-sim-error-event)
// then `data: [DONE]`; for the Responses API an `event: error` event with the next
// sequence number, and no [DONE]. The handler then ends the response normally.
func (st *streamer) sendError() error {
	b := (*st.bp)[:0]
	if st.p.ep == epResponses {
		b = st.revent("error")
		b = append(b, `,"code":"server_error","message":`...)
		b = openai.AppendString(b, engineErrorMessage(st.events))
		b = append(b, `,"param":null}`+"\n\n"...)
	} else {
		if st.kn.errorEvent {
			b = append(b, "event: error\n"...)
		}
		b = append(b, "data: "...)
		b = engineError(st.events).appendJSON(b)
		b = append(b, "\n\ndata: [DONE]\n\n"...)
	}
	*st.bp = b
	st.events++
	if _, err := st.w.Write(b); err != nil {
		return errGone
	}
	if err := st.flush(); err != nil {
		return err
	}
	return errInjected
}

func (st *streamer) flush() error {
	if err := st.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return errGone
	}
	return nil
}

// begin starts a chunk event in the buffer; end closes its single choice with finish.
func (st *streamer) begin() []byte { return append((*st.bp)[:0], st.prefix...) }

func (st *streamer) end(b []byte, finish string) error { return st.endLP(b, nil, finish) }

// endLP is end with the logprobs of the chunk's tokens, when w holds any.
func (st *streamer) endLP(b []byte, w *lpWriter, finish string) error {
	b = append(b, `,"logprobs":`...)
	b = w.appendTo(b)
	b = append(b, `,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = append(b, finish...)
		b = append(b, '"')
	}
	b = append(b, "}]}\n\n"...)
	*st.bp = b
	return st.send()
}

func appendIndex(b []byte, i int) []byte {
	b = append(b, `{"index":`...)
	return strconv.AppendInt(b, int64(i), 10)
}

// emit sends the events for the tokens of choice i that are available (the first avail
// tokens) and not sent yet, TokensPerEvent tokens per event (fewer only for the last event
// of a finished choice). done means the choice has all its tokens; its finish chunk follows.
func (st *streamer) emit(i, avail int, done bool) error {
	if st.p.ep == epResponses {
		return st.emitResponses(avail, done)
	}
	c := &st.p.choices[i]
	chat := st.p.ep == epChat
	tpe := st.s.cfg.TokensPerEvent
	avail = min(avail, c.n)
	for c.emitted < avail {
		if !c.started {
			c.started = true
			if c.tool != nil {
				b := appendIndex(st.begin(), i)
				b = append(b, `,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"`...)
				b = append(b, c.tool.id...)
				b = append(b, `","type":"function","function":{"name":`...)
				b = openai.AppendString(b, c.tool.name)
				b = append(b, `,"arguments":""}}]}`...)
				c.emitted = 1
				if err := st.end(b, ""); err != nil {
					return err
				}
				continue
			}
			if chat {
				b := appendIndex(st.begin(), i)
				b = append(b, `,"delta":{"role":"assistant","content":""}`...)
				if err := st.end(b, ""); err != nil {
					return err
				}
			}
		}
		k := min(tpe, avail-c.emitted)
		if k < tpe && !done {
			break
		}
		from, to := c.emitted, c.emitted+k
		b := appendIndex(st.begin(), i)
		switch {
		case c.tool != nil:
			b = append(b, `,"delta":{"tool_calls":[{"index":0,"function":{"arguments":`...)
			b = openai.AppendString(b, c.tool.fragment(from, to))
			b = append(b, `}}]}`...)
		case chat:
			b = append(b, `,"delta":{"content":"`...)
			b = c.appendTokensLP(b, c.lp, from, to)
			b = append(b, `"}`...)
		default:
			b = append(b, `,"text":"`...)
			b = c.appendTokensLP(b, c.lp, from, to)
			b = append(b, '"')
		}
		c.emitted = to
		if err := st.endLP(b, c.lp, ""); err != nil {
			return err
		}
	}
	if done && c.emitted >= c.n && !c.closed {
		c.closed = true
		b := appendIndex(st.begin(), i)
		if chat {
			b = append(b, `,"delta":{}`...)
		} else {
			b = append(b, `,"text":""`...)
		}
		return st.end(b, c.finish)
	}
	return nil
}

// finish sends the usage chunk (when asked for) and [DONE], or a Responses stream's last event.
func (st *streamer) finish() error {
	if st.p.ep == epResponses {
		return st.finishResponses()
	}
	if st.p.includeUsage {
		completion := 0
		for i := range st.p.choices {
			completion += st.p.choices[i].n
		}
		b := append(st.begin(), `],"usage":`...)
		b = appendUsage(b, st.p.promptTokens, completion, true)
		b = append(b, "}\n\n"...)
		*st.bp = b
		if err := st.send(); err != nil {
			return err
		}
	}
	*st.bp = append((*st.bp)[:0], "data: [DONE]\n\n"...)
	return st.send()
}
