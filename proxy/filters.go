package proxy

import (
	"errors"
	"log/slog"
	"slices"
	"strconv"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// The route's stream filters (policy.StreamFilter) watch each attempt's stream on its way to
// the client: relayStream asks each for a watcher at the first event, shows every relayed
// event to the watchers before it is written, and ends them when the stream ends. The
// captures are watchers too, ahead of the filters: the resume capture (resumeCapture: the
// text relayed so far, for a continuation) and a mirrored request's (shadow.Job). The tap
// (tokens, TTFT, the end of the stream) stays the relay's own: the relay decides on it
// (commit, the first token, resume, the in-band error) before and after the watchers run.
// Stream faults stand in for the model server, so they act at the sender (send.go), on the
// bytes the relay reads.

// errFilterCut is the attempt context's cause when a stream filter ended the stream: the
// upstream request is cancelled so that the model server frees the sequence.
var errFilterCut = errors.New("a stream filter ended the stream")

// watchStream starts the watchers of one attempt's stream: the resume capture and the
// mirrored copy's capture first (they keep each event as the model server sent it), then the
// route's stream filters.
func (ex *exchange) watchStream() []policy.StreamWatcher {
	if len(ex.filters) == 0 && ex.mirror == nil && !ex.capture {
		return nil
	}
	var ws []policy.StreamWatcher
	if ex.capture {
		ws = append(ws, resumeCapture{ex: ex, first: !ex.committed})
	}
	if ex.mirror != nil {
		ws = append(ws, ex.mirror)
	}
	for _, f := range ex.filters {
		if w := f.WatchStream(ex.preq); w != nil {
			ws = append(ws, w)
		}
	}
	return ws
}

// resumeCapture keeps what a resumable stream relayed (the text, whether a continuation can
// carry it) and the first stream's chunk id, which a continuation's chunks are given. Only
// the first stream's id: a continuation's own never is, even when the first had none.
type resumeCapture struct {
	ex    *exchange
	first bool // the attempt's stream is the first the client gets (not a continuation)
}

func (c resumeCapture) Event(ev policy.StreamEvent) policy.StreamAction {
	c.ex.streamed.Add(ev.Data)
	if c.first && c.ex.streamID == nil {
		c.ex.streamID = chunkID(ev.Data)
	}
	return policy.StreamAction{}
}

func (resumeCapture) End() []policy.Class { return nil }

// endWatch ends the watchers and keeps what they flagged for the Outcome.
func (ex *exchange) endWatch(ws []policy.StreamWatcher) {
	for _, w := range ws {
		ex.flag(w.End())
	}
}

// flag keeps classes a filter raised for the Outcome, each once.
func (ex *exchange) flag(cs []policy.Class) {
	for _, c := range cs {
		if c != "" && !slices.Contains(ex.flags, c) {
			ex.flags = append(ex.flags, c)
		}
	}
}

// watchBody shows a whole successful answer to the route's body filters: the first
// replacement is what the client gets (its Content-Length follows), their flags go to the
// Outcome.
func (ex *exchange) watchBody(p *pending) {
	for _, f := range ex.bodies {
		rep, flags := f.WatchBody(ex.preq, p.body)
		ex.flag(flags)
		if rep != nil && p.orig == nil {
			p.orig, p.body = p.body, rep
		}
	}
	if p.orig != nil && p.header.Get("Content-Length") != "" {
		p.header = p.header.Clone()
		p.header.Set("Content-Length", strconv.Itoa(len(p.body)))
	}
}

// watchEvent shows one event to the watchers, in order. Each sees the event as the model
// server sent it; the first replacement is what the client gets (replaced). The first cut
// ends the stream (the watchers after it do not see the event).
func watchEvent(ws []policy.StreamWatcher, ev openai.Event) (raw []byte, replaced bool, cut *policy.StreamCut) {
	se := policy.StreamEvent{Raw: ev.Raw, Name: ev.Name, Data: ev.Data}
	raw = ev.Raw
	for _, w := range ws {
		a := w.Event(se)
		if a.Cut != nil {
			return nil, false, a.Cut
		}
		if a.Replace != nil && !replaced {
			raw, replaced = a.Replace, true
		}
	}
	return raw, replaced, nil
}

// cutStream ends a stream on a filter's word: the upstream request is cancelled, the client
// gets the filter's tail (a whole end of stream) and the attempt is not a failure; the
// request's Outcome carries the filter's class.
func (h *Handler) cutStream(cancel ender, ex *exchange, cut *policy.StreamCut, ep *upstream.Endpoint, res *result) {
	cancel.Cancel(errFilterCut)
	if len(cut.Tail) > 0 {
		if _, err := ex.w.Write(cut.Tail); err != nil {
			res.failWith(writeFailed(err))
			return
		}
		ex.flush()
		if ex.mirror != nil {
			ex.mirror.Capture(cut.Tail, false)
		}
	}
	res.tap.Done = true
	res.cut = cut.Class
	if res.cut == "" {
		res.cut = policy.ClassPolicyError
	}
	ep.Report(true) // the endpoint answered; what it said is the filter's concern
	// Counted in metrics (the Outcome's class); the filter logs what it saw.
	h.srv.log.LogAttrs(ex.r.Context(), slog.LevelDebug, "stream ended by a policy",
		slog.String("request_id", ex.id), slog.String("route", ex.preq.Route),
		slog.String("class", string(res.cut)), slog.String("reason", cut.Reason),
		slog.String("endpoint", res.endpoint))
}
