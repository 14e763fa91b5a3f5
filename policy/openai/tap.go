package openai

import (
	"encoding/json"
	"time"
)

// Usage is the token usage a model server reports.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	TotalTokens      int
}

// Tap watches an answer on its way to the client and counts tokens and timing, without
// copying it: Observe each SSE event (or ObserveBody once for a non-streaming answer). The
// zero Tap is ready; set Start when the upstream request is sent.
//
// A token event is an event whose choices carry non-empty content, text, reasoning, a
// refusal or a tool-call delta (or, in a non-streaming embeddings answer, data).
// Definitions follow vLLM's `bench serve`: TTFT is Start to the first token event; the
// inter-token gaps are between successive token events; TPOT is
// (LastToken-FirstToken)/(Tokens-1).
//
// The Tap also reads the Responses API (POST /v1/responses), told apart by the data's
// top-level "type" ("response.*" or "error"), so chat and completion chunks cost nothing
// more. There a token event is a "response.*.delta" event with a non-empty "delta" string
// (output_text, function_call_arguments, reasoning_text, reasoning_summary_text,
// refusal...; a function call's name arrives in response.output_item.added, which is not
// one). The terminal event (response.completed, response.incomplete or response.failed)
// sets Done and carries the usage (response.usage: input_tokens, output_tokens,
// total_tokens) and the finish reason, mapped to chat's by ResponsesFinishReason;
// response.failed and an "error" event set ErrorSeen. A non-streaming Responses body
// ({"object":"response","status",...,"output":[...],"usage":{...}}) is read by
// ObserveBody the same way.
type Tap struct {
	Start        time.Time     // set by the caller when the upstream request was sent
	FirstToken   time.Time     // first token event
	LastToken    time.Time     // last token event
	Events       int           // events with data (including [DONE])
	TokenEvents  int           // token events
	Tokens       int           // output tokens: usage.completion_tokens (Responses: output_tokens) once seen, else an estimate (see Observe)
	Usage        Usage         // the last usage reported
	HaveUsage    bool          // a usage object was seen
	Done         bool          // the stream's end marker was seen: data: [DONE], or a Responses terminal event
	FinishReason string        // last non-empty finish_reason (Responses: see ResponsesFinishReason)
	MaxGap       time.Duration // largest gap between token events
	GapSum       time.Duration // sum of gaps between token events
	Gaps         int           // number of gaps
	ErrorSeen    bool          // an in-band error from upstream: an "error" key, an event named error, a Responses "error" event or response.failed

	// Finished counts the finish reasons reported: each choice's non-null, non-empty
	// finish_reason (a choice reports once, so an n=2 stream that ran to its end has 2),
	// and 1 for a Responses answer that completed or stopped incomplete. A failed
	// Responses answer reports none (ErrorSeen is set instead).
	Finished int
	// ID is the answer's id as the server named it (a chat chunk's or body's "id", a
	// Responses event's response.id), the first seen; copied once per answer.
	ID string
	// Seq is one more than the largest sequence_number seen in a Responses stream: the
	// sequence_number the gateway's own next event must carry (see Error.ResponsesSSE).
	// 0 when none was seen (the first event of a stream is number 0).
	Seq int

	weight int // token-estimate weight of the output text (see EstimateTextTokens)

	// shape is the last plain stream chunk read in full: a chat or completion chunk of at
	// most maxShapeBytes whose only effect on the tap was one choice's text string (delta
	// content, reasoning or refusal, or a completion's text), which spans
	// shape[shapeStart:shapeEnd] (its quotes included). A chunk made of the same bytes
	// around another valid string has the same effect but that string's: the scan's path
	// through the bytes before a string and after it does not depend on the string, and
	// those bytes are the ones that read nothing else the first time. So observe reads only
	// the string of such a chunk: a stream's chunks are mostly their predecessor with
	// another token. A string, so that copies of a Tap share it safely; at most maxShapes
	// an answer, each copies a chunk.
	shape                string
	shapeStart, shapeEnd int
	shapes               int
}

// maxShapes bounds the chunks a Tap copies as its shape (one allocation each): a stream's
// role chunk and its first token chunk make two, and a stream whose chunks differ in more
// than their content is read in full without copying each.
const maxShapes = 4

// maxShapeBytes bounds a shape: a stream chunk, not a whole answer.
const maxShapeBytes = 4 << 10

// ResponsesFinishReason maps the end of a Responses API answer to the chat finish_reason
// the rest of the gateway speaks: status "completed" is "stop", or "tool_calls" when the
// output holds a function call (toolCall); "incomplete" is "length" for the reason
// "max_output_tokens", "content_filter" for "content_filter", another reason as it is, or
// "incomplete" when none is given; any other status ("failed", "cancelled", "queued",
// "in_progress") has none ("").
func ResponsesFinishReason(status, reason string, toolCall bool) string {
	switch status {
	case "completed":
		if toolCall {
			return "tool_calls"
		}
		return "stop"
	case "incomplete":
		return incompleteReason(reason)
	}
	return ""
}

func incompleteReason(reason string) string {
	switch reason {
	case "max_output_tokens":
		return "length"
	case "content_filter":
		return "content_filter"
	case "":
		return "incomplete"
	}
	return reason
}

// Observe takes one event into account at time now. It scans the data once, allocates
// nothing (except copying finish_reason when it changes, and the id, once per stream), and ignores
// events without data and data that is not a JSON object.
//
// Until a usage object arrives (stream_options.include_usage), Tokens is an estimate: the
// larger of the number of token events (model servers send about one token an event) and
// the EstimateTextTokens weight of the output text decoded from the JSON strings (which
// catches events carrying several tokens). A usage object sets Tokens to its
// completion_tokens (in a Responses stream, the terminal event's output_tokens).
func (t *Tap) Observe(ev Event, now time.Time) {
	if ev.Data == nil {
		return
	}
	t.count(ev)
	if ev.IsDone() {
		t.Done = true
		return
	}
	if !t.shaped(ev.Data, now) {
		t.observe(ev.Data, now, true)
	}
}

// count counts an event with data, and an event named error as an error.
func (t *Tap) count(ev Event) {
	t.Events++
	if string(ev.Name) == "error" {
		t.ErrorSeen = true
	}
}

// ObserveChunk is Observe for a stream event the caller relays only if it can be: no data,
// [DONE], or a whole JSON object (WellFormedChunk). It reports whether the event can be
// relayed; one that cannot leaves the tap as it was. The tap's own scan validates as it
// reads, so a whole object costs that one scan: WellFormedChunk runs only on data the scan
// did not read to its end as JSON (it is more lenient about the spelling of numbers and
// literals, such as a NaN).
func (t *Tap) ObserveChunk(ev Event, now time.Time) bool {
	if ev.Data == nil || ev.IsDone() {
		t.Observe(ev, now)
		return true
	}
	if t.shaped(ev.Data, now) {
		t.count(ev) // a shaped chunk is whole: nothing to save for a restore
		return true
	}
	saved := *t
	t.count(ev)
	if t.observe(ev.Data, now, true) || WellFormedChunk(ev.Data) {
		return true
	}
	*t = saved
	return false
}

// ObserveBody takes a complete non-streaming answer into account at time now: usage,
// finish_reason, and the content for the estimate when there is no usage. It counts as one
// event, and as a token event at now if the answer has content.
func (t *Tap) ObserveBody(body []byte, now time.Time) {
	t.Events++
	t.observe(body, now, false)
}

// ObserveWholeBody is ObserveBody for an answer that must be whole JSON: it reports whether
// body is (encoding/json's verdict: the tap's scan, which accepts only what json.Valid does,
// decides where it accepts, json.Valid where it refuses) and takes body into account only if
// it is. The scan is then the only pass over a valid answer.
func (t *Tap) ObserveWholeBody(body []byte, now time.Time) bool {
	saved := *t
	t.Events++
	if t.observe(body, now, false) {
		return true
	}
	*t = saved
	if !json.Valid(body) {
		return false
	}
	t.ObserveBody(body, now)
	return true
}

// TTFT returns the time to the first token, or 0 if there was none (or Start is unset).
func (t *Tap) TTFT() time.Duration {
	if t.Start.IsZero() || t.FirstToken.IsZero() {
		return 0
	}
	return t.FirstToken.Sub(t.Start)
}

// TPOT returns the time per output token after the first: (LastToken-FirstToken)/(Tokens-1),
// or 0 if Tokens < 2.
func (t *Tap) TPOT() time.Duration {
	if t.Tokens < 2 || t.FirstToken.IsZero() || t.LastToken.IsZero() {
		return 0
	}
	return t.LastToken.Sub(t.FirstToken) / time.Duration(t.Tokens-1)
}

// Kinds of Responses API data, from the top-level "type" (or "object" of a body).
const (
	rNone       = iota // not Responses data (a chat or completion chunk, or a body)
	rOther             // another response.* event
	rDelta             // response.*.delta
	rCompleted         // response.completed
	rIncomplete        // response.incomplete
	rFailed            // response.failed
	rError             // error
)

// responsesKind classifies a top-level "type" string (raw JSON contents).
func responsesKind(raw []byte, esc bool) int {
	var buf [64]byte
	v := keyText(raw, esc, buf[:])
	switch string(v) {
	case "response.completed":
		return rCompleted
	case "response.incomplete":
		return rIncomplete
	case "response.failed":
		return rFailed
	case "error":
		return rError
	}
	const prefix, suffix = "response.", ".delta"
	switch {
	case len(v) < len(prefix) || string(v[:len(prefix)]) != prefix:
		if esc && v == nil && len(raw) > len(prefix) && string(raw[:len(prefix)]) == prefix {
			return rOther // too long to decode here: some response.* event
		}
		return rNone
	case len(v) > len(prefix)+len(suffix) && string(v[len(v)-len(suffix):]) == suffix:
		return rDelta
	}
	return rOther
}

// responseInfo is what a Responses answer says of its end: its status, the reason it is
// incomplete, whether its output holds a function call, its usage. Slices point into the
// data.
type responseInfo struct {
	status, reason       []byte
	statusEsc, reasonEsc bool
	call                 bool
	usage                Usage
	haveUsage            bool
	id                   []byte // the response's "id"
	idEsc                bool
}

// finish applies the end of a Responses answer of kind k (rCompleted, rIncomplete or
// rFailed) to the tap.
func (t *Tap) finish(k int, r *responseInfo) {
	switch k {
	case rCompleted:
		t.Finished++
		if r.call {
			t.setFinishString("tool_calls")
		} else {
			t.setFinishString("stop")
		}
	case rIncomplete:
		t.Finished++
		var buf [64]byte
		v := keyText(r.reason, r.reasonEsc, buf[:])
		if v == nil && r.reasonEsc {
			v = r.reason // too long to decode here: taken as it is
		}
		switch string(v) { // as incompleteReason, without copying the known reasons
		case "max_output_tokens":
			t.setFinishString("length")
		case "content_filter":
			t.setFinishString("content_filter")
		case "":
			t.setFinishString("incomplete")
		default:
			t.setFinish(r.reason, r.reasonEsc)
		}
	case rFailed:
		t.ErrorSeen = true
	}
}

// maxIDLen bounds the id a Tap keeps (a longer one is not an id a client can use).
const maxIDLen = 256

// setID keeps the answer's id (raw JSON string contents).
func (t *Tap) setID(raw []byte, esc bool) {
	if len(raw) == 0 || len(raw) > maxIDLen {
		return
	}
	t.ID = string(decoded(raw, esc))
}

func (t *Tap) setFinishString(s string) {
	if t.FinishReason != s {
		t.FinishReason = s
	}
}

// statusKind maps a Responses body's status to the kind of its end (rNone for one that has
// not ended, or was cancelled).
func statusKind(raw []byte, esc bool) int {
	var buf [16]byte
	switch string(keyText(raw, esc, buf[:])) {
	case "completed":
		return rCompleted
	case "incomplete":
		return rIncomplete
	case "failed":
		return rFailed
	}
	return rNone
}

// observe walks a chunk or a response body: {"choices":[...],"usage":{...},"error":...};
// or a Responses event ({"type":...,"delta":...,"sequence_number":...,"response":{...}})
// or body ({"object":"response","status":...,"output":[...],"usage":{...}}). The type of
// a Responses event may come after its other fields (vLLM sends the fields in
// alphabetical order), so what they say is kept and applied at the end.
//
// It reports whether data is one whole JSON object (white space around it aside), valid as
// encoding/json would have it. A stream event (not a whole answer) that is plain becomes the
// tap's shape (see Tap.shape): c.effect marks every member that could change the tap but
// through a choice's text, those too that change it only beside a Responses "type" (itself
// marked) or only on a first read (error, response.id): one rule, not a case for each.
func (t *Tap) observe(data []byte, now time.Time, stream bool) (whole bool) {
	c := cur{b: data}
	if c.peek() != '{' {
		return false
	}
	c.i++
	var (
		st     textStats
		output bool // a tool call, or embeddings data

		kind  = rNone      // Responses: the event's type
		delta textStats    // Responses: the event's "delta", counted if it is a delta event
		seq   = -1         // Responses: sequence_number
		ended responseInfo // Responses: the terminal event's "response"
		body  responseInfo // Responses: a body's own status, incomplete_details, output
		btext textStats    // Responses: the text of a body's output
		isRsp bool         // a body with "object": "response"
	)
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "choices":
			t.choices(&c, &st, &output)
		case "usage":
			c.effect = true
			t.usage(&c)
		case "type":
			c.effect = true
			if c.peek() == '"' {
				if raw, esc, ok := c.str(); ok {
					kind = responsesKind(raw, esc)
				}
				continue
			}
			kind = rNone
			c.skip(nil)
		case "delta":
			c.effect = true
			delta = textStats{}
			stringStats(&c, &delta)
		case "sequence_number":
			c.effect = true
			seq = readCount(&c)
		case "response":
			c.effect = true
			ended = responseInfo{}
			responseObject(&c, &ended)
		case "id":
			if c.peek() == '"' {
				if raw, esc, ok := c.str(); ok && t.ID == "" {
					t.setID(raw, esc)
				}
				continue
			}
			c.skip(nil)
		case "object":
			if c.peek() == '"' {
				if raw, esc, ok := c.str(); ok {
					isRsp = equalString(raw, esc, "response")
				}
				continue
			}
			c.skip(nil)
		case "status", "incomplete_details", "output":
			c.effect = true
			responseMember(&c, key, esc, &body, &btext)
		case "error":
			if c.peek() != 'n' {
				c.effect = true
				t.ErrorSeen = true
			}
			c.skip(nil)
		case "data":
			c.effect = true
			if c.peek() == '[' {
				start := c.i
				c.skip(nil)
				if c.ok() && skipSpace(data, start+1) < c.i-1 {
					output = true
				}
				continue
			}
			c.skip(nil)
		default:
			c.skip(nil)
		}
	}
	whole = c.ok() && skipSpace(data, c.i) == len(data)
	switch kind {
	case rNone:
		if isRsp {
			if k := statusKind(body.status, body.statusEsc); k != rNone {
				t.finish(k, &body)
			}
			st.chars += btext.chars
			st.weight += btext.weight
			output = output || body.call
		}
	case rDelta:
		st.chars += delta.chars
		st.weight += delta.weight
	case rCompleted, rIncomplete, rFailed:
		t.Done = true
		if ended.haveUsage {
			t.Usage, t.HaveUsage = ended.usage, true
			t.Tokens = ended.usage.CompletionTokens
		}
		t.finish(kind, &ended)
	case rError:
		t.ErrorSeen = true
	}
	if stream && whole && !c.effect && c.contents == 1 && t.shapes < maxShapes && len(data) <= maxShapeBytes {
		t.shape, t.shapeStart, t.shapeEnd = string(data), c.cs, c.ce
		t.shapes++
	}
	if t.ID == "" && ended.id != nil {
		t.setID(ended.id, ended.idEsc)
	}
	if kind != rNone && seq >= 0 {
		t.Seq = max(t.Seq, seq+1)
	}
	t.tokenEvent(st, output, now)
	return whole
}

// shaped takes data in at now if it is the tap's shape around another string, reading that
// string alone; otherwise it reports false and has taken nothing.
func (t *Tap) shaped(data []byte, now time.Time) bool {
	if t.shape == "" {
		return false
	}
	s, e := t.shapeStart, t.shapeEnd
	suffix := t.shape[e:]
	if len(data) < s+2+len(suffix) || data[s] != '"' || string(data[:s]) != t.shape[:s] {
		return false
	}
	var st textStats
	end, _, msg := scanStringStats(data, s, &st, nil)
	if msg != "" || string(data[end:]) != suffix {
		return false
	}
	t.tokenEvent(st, false, now)
	return true
}

// tokenEvent counts an event's text st (and output: a tool call or embeddings) and, if
// it has any, the event as a token event at now.
func (t *Tap) tokenEvent(st textStats, output bool, now time.Time) {
	if st.chars == 0 && !output {
		return
	}
	t.TokenEvents++
	t.weight += st.weight
	if t.FirstToken.IsZero() {
		t.FirstToken = now
	}
	if !t.LastToken.IsZero() {
		gap := max(now.Sub(t.LastToken), 0)
		t.GapSum += gap
		t.Gaps++
		t.MaxGap = max(t.MaxGap, gap)
	}
	t.LastToken = now
	if !t.HaveUsage {
		t.Tokens = max(t.TokenEvents, (t.weight+unitsPT-1)/unitsPT)
	}
}

func (t *Tap) choices(c *cur, st *textStats, output *bool) {
	if c.peek() != '[' {
		c.skip(nil)
		return
	}
	c.i++
	for first := true; c.elem(&first); {
		if c.peek() != '{' {
			c.skip(nil)
			continue
		}
		c.i++
		for f2 := true; ; {
			key, esc, ok := c.member(&f2)
			if !ok {
				break
			}
			var kb [32]byte
			switch string(keyText(key, esc, kb[:])) {
			case "delta", "message":
				t.delta(c, st, output)
			case "text":
				textStringStats(c, st)
			case "finish_reason":
				if c.peek() == '"' {
					c.effect = true
					if raw, esc, ok := c.str(); ok {
						t.setFinish(raw, esc)
						if len(raw) > 0 {
							t.Finished++
						}
					}
					continue
				}
				c.skip(nil)
			default:
				c.skip(nil)
			}
		}
	}
}

// delta reads a chat delta (or message): content, reasoning, refusal, tool calls.
func (t *Tap) delta(c *cur, st *textStats, output *bool) {
	if c.peek() != '{' {
		c.skip(nil)
		return
	}
	c.i++
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "content", "reasoning_content", "reasoning", "refusal":
			textStringStats(c, st)
		case "tool_calls":
			c.effect = true
			if c.peek() != '[' {
				c.skip(nil)
				continue
			}
			c.i++
			for f2 := true; c.elem(&f2); {
				*output = true
				functionStats(c, st, true)
			}
		case "function_call":
			c.effect = true
			if c.peek() == '{' {
				*output = true
			}
			functionStats(c, st, false)
		default:
			c.skip(nil)
		}
	}
}

// functionStats counts the name and arguments of a tool call ({"function":{...}}, when
// wrapped) or of a function call ({"name":...,"arguments":...}).
func functionStats(c *cur, st *textStats, wrapped bool) {
	if c.peek() != '{' {
		c.skip(nil)
		return
	}
	c.i++
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return
		}
		switch {
		case wrapped && equalString(key, esc, "function"):
			functionStats(c, st, false)
		case !wrapped && (equalString(key, esc, "name") || equalString(key, esc, "arguments")):
			stringStats(c, st)
		default:
			c.skip(nil)
		}
	}
}

// textStringStats is stringStats for a choice's text (delta content, reasoning or refusal, a
// completion's text): a string is also noted for the tap's shapes, its span in c.
func textStringStats(c *cur, st *textStats) {
	if c.peek() != '"' {
		c.skip(nil)
		return
	}
	c.contents++
	c.cs = c.i
	c.strStats(st)
	c.ce = c.i
}

// stringStats counts the string at the cursor, if it is one, and skips any other value.
func stringStats(c *cur, st *textStats) {
	if c.peek() != '"' {
		c.skip(nil)
		return
	}
	c.strStats(st)
}

func (t *Tap) setFinish(raw []byte, esc bool) {
	if len(raw) == 0 {
		return
	}
	var buf [64]byte
	v := raw
	if esc {
		if v = keyText(raw, esc, buf[:]); len(v) == 0 {
			return
		}
	}
	if string(v) != t.FinishReason {
		t.FinishReason = finishReason(v)
	}
}

// finishReason is v as a string, the common reasons without an allocation.
func finishReason(v []byte) string {
	switch string(v) {
	case "stop":
		return "stop"
	case "length":
		return "length"
	case "tool_calls":
		return "tool_calls"
	case "content_filter":
		return "content_filter"
	case "function_call":
		return "function_call"
	}
	return string(v)
}

func (t *Tap) usage(c *cur) {
	if u, ok := readUsage(c); ok {
		t.Usage, t.HaveUsage = u, true
		t.Tokens = u.CompletionTokens
	}
}

// readUsage reads a usage object: prompt_tokens, completion_tokens, total_tokens, or the
// Responses API's input_tokens and output_tokens. ok is false for anything but a whole
// object.
func readUsage(c *cur) (u Usage, ok bool) {
	if c.peek() != '{' {
		c.skip(nil)
		return u, false
	}
	c.i++
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		var dst *int
		switch string(keyText(key, esc, kb[:])) {
		case "prompt_tokens", "input_tokens":
			dst = &u.PromptTokens
		case "completion_tokens", "output_tokens":
			dst = &u.CompletionTokens
		case "total_tokens":
			dst = &u.TotalTokens
		default:
			c.skip(nil)
			continue
		}
		if v := readCount(c); v >= 0 {
			*dst = v
		}
	}
	return u, c.ok()
}

// readCount reads a count (an integer within 0..2^40) at the cursor; -1 for anything else,
// which is skipped.
func readCount(c *cur) int {
	if ch := c.peek(); ch == '-' || (ch >= '0' && ch <= '9') {
		if s, ok := c.number(); ok {
			if v, ok := parseInt(s); ok && v >= 0 && v <= 1<<40 {
				return int(v)
			}
		}
		return -1
	}
	c.skip(nil)
	return -1
}

// responseObject reads a Responses response object (the "response" of an event) into r:
// its status, incomplete_details, output (for function calls only: the text is counted
// from the deltas) and usage.
func responseObject(c *cur, r *responseInfo) {
	if c.peek() != '{' {
		c.skip(nil)
		return
	}
	c.i++
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return
		}
		if equalString(key, esc, "usage") {
			r.usage, r.haveUsage = readUsage(c)
			continue
		}
		if equalString(key, esc, "id") && c.peek() == '"' {
			r.id, r.idEsc, _ = c.str()
			continue
		}
		responseMember(c, key, esc, r, nil)
	}
}

// responseMember reads one member of a response object into r: "status",
// "incomplete_details" ({"reason":...}) or "output" (the items: whether one is a function
// call and, when st is not nil, the text of output_text and refusal parts, of reasoning
// parts, and function calls' names and arguments). Other members are skipped.
func responseMember(c *cur, key []byte, esc bool, r *responseInfo, st *textStats) {
	var kb [32]byte
	switch string(keyText(key, esc, kb[:])) {
	case "status":
		if c.peek() == '"' {
			r.status, r.statusEsc, _ = c.str()
			return
		}
		r.status = nil
	case "incomplete_details":
		r.reason = nil
		if c.peek() != '{' {
			break
		}
		c.i++
		for first := true; ; {
			key, kesc, ok := c.member(&first)
			if !ok {
				return
			}
			if equalString(key, kesc, "reason") && c.peek() == '"' {
				r.reason, r.reasonEsc, _ = c.str()
				continue
			}
			c.skip(nil)
		}
	case "output":
		if c.peek() != '[' {
			break
		}
		c.i++
		for first := true; c.elem(&first); {
			if outputItem(c, st) {
				r.call = true
			}
		}
		return
	}
	c.skip(nil)
}

// outputItem reads one item of a response's output and reports whether it is a function
// call; with st, it counts the item's text.
func outputItem(c *cur, st *textStats) (call bool) {
	if c.peek() != '{' {
		c.skip(nil)
		return false
	}
	c.i++
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return call
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "type":
			if c.peek() == '"' {
				if raw, esc, ok := c.str(); ok {
					call = equalString(raw, esc, "function_call")
				}
				continue
			}
			c.skip(nil)
		case "content", "summary":
			if st == nil || c.peek() != '[' {
				c.skip(nil)
				continue
			}
			c.i++
			for f2 := true; c.elem(&f2); {
				if c.peek() != '{' {
					c.skip(nil)
					continue
				}
				c.i++
				for f3 := true; ; {
					key, esc, ok := c.member(&f3)
					if !ok {
						break
					}
					if equalString(key, esc, "text") || equalString(key, esc, "refusal") {
						stringStats(c, st)
						continue
					}
					c.skip(nil)
				}
			}
		case "name", "arguments", "input":
			if st == nil {
				c.skip(nil)
				continue
			}
			stringStats(c, st)
		default:
			c.skip(nil)
		}
	}
}
