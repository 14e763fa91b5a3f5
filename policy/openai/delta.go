package openai

// The text deltas of a stream: what the model generated, event by event, for the filters that
// watch an answer as it streams (policy.StreamFilter). ScanDeltas reads one event's data once,
// in place, with the package's scanner: it yields each piece of text as the raw contents of its
// JSON string (a slice of the data, escapes not decoded) and allocates nothing.

// DeltaField is what a piece of streamed text is.
type DeltaField uint8

// The fields ScanDeltas yields.
const (
	// FieldContent: a chat chunk's choices[].delta.content, a completions chunk's
	// choices[].text, a Responses response.output_text.delta's delta.
	FieldContent DeltaField = iota + 1
	// FieldReasoning: choices[].delta.reasoning_content and choices[].delta.reasoning (vLLM's
	// and others' reasoning output), a Responses response.reasoning_text.delta or
	// response.reasoning_summary_text.delta.
	FieldReasoning
	// FieldRefusal: choices[].delta.refusal, a Responses response.refusal.delta.
	FieldRefusal
	// FieldArguments: a tool call's arguments, choices[].delta.tool_calls[].function.arguments
	// (and the legacy choices[].delta.function_call.arguments), a Responses
	// response.function_call_arguments.delta (and any other response.*_arguments.delta).
	FieldArguments
	// FieldFinish: a chat or completions choice's non-empty finish_reason (Raw is the
	// reason). A Responses stream ends with its terminal event instead.
	FieldFinish
)

// String names the field for logs and metrics: content, reasoning, refusal, arguments,
// finish.
func (f DeltaField) String() string {
	switch f {
	case FieldContent:
		return "content"
	case FieldReasoning:
		return "reasoning"
	case FieldRefusal:
		return "refusal"
	case FieldArguments:
		return "arguments"
	case FieldFinish:
		return "finish"
	}
	return "unknown"
}

// TextDelta is one piece of streamed text. Raw points into the event's data: it is valid only
// as long as the data is.
type TextDelta struct {
	// Choice is the choice the text belongs to: its "index" (wherever it is in the choice
	// object), else its position in the choices array. A Responses answer is one choice, 0:
	// its output items follow one another.
	Choice int
	Field  DeltaField
	Raw    []byte // the JSON string's contents as they are in the data, escapes not decoded
	Esc    bool   // Raw has escapes (AppendText decodes them)
}

// AppendText appends the decoded text of d to dst (Raw itself when it has no escapes).
func (d TextDelta) AppendText(dst []byte) []byte {
	if !d.Esc {
		return append(dst, d.Raw...)
	}
	return appendUnescape(dst, d.Raw)
}

// DeltaMeta is what ScanDeltas read of an event besides its text: enough for a filter to write
// an event of its own in the stream's words (a final chunk with the stream's id, model and
// created; a Responses event numbered after the last one). Slices point into the data.
type DeltaMeta struct {
	// ID and Model are the raw contents of the chunk's top-level "id" and "model" strings,
	// or, in a Responses event that carries the response object (response.created,
	// response.in_progress, the terminal events), its "id" and "model". Nil when absent.
	ID, Model       []byte
	IDEsc, ModelEsc bool
	// Created is the chunk's "created", or the response object's "created_at"; -1 when
	// absent or not a count.
	Created int64
	// Seq is a Responses event's sequence_number, -1 when absent.
	Seq int
	// Responses reports a Responses API event: a top-level "type" that is "error" or starts
	// with "response.".
	Responses bool
	// OK reports that the data is one JSON object (and white space), scanned to its end
	// without a syntax error, and that yield never stopped the scan.
	OK bool
}

// ScanDeltas reads one stream event's data (a chat or completions chunk, or a Responses API
// event) and calls yield for each piece of generated text in it, in order: per choice, the
// content, reasoning, refusal and tool-call arguments of its delta (or its text) and its
// finish_reason; for a Responses event, its delta when the event's type is one of the
// FieldContent, FieldReasoning, FieldRefusal or FieldArguments kinds (the type may come after
// the delta: vLLM writes the members in alphabetical order). Empty strings and null values are
// not yielded. yield returning false stops the scan.
//
// The data is scanned once, in place (a choice whose "index" comes after its delta is looked
// ahead into), and nothing is allocated as long as yield allocates nothing. Data that is not a
// JSON object yields nothing; a syntax error stops the scan where it is (what was yielded
// before it stands), with OK false.
func ScanDeltas(data []byte, yield func(TextDelta) bool) DeltaMeta {
	m := DeltaMeta{Created: -1, Seq: -1}
	c := cur{b: data}
	if c.peek() != '{' {
		return m
	}
	c.i++
	var (
		typ      DeltaField // Responses: the field the event's type names, 0 for none
		delta    []byte     // Responses: the event's "delta" string
		deltaEsc bool
		haveDel  bool
		stopped  bool
	)
	for first := true; !stopped; {
		key, esc, ok := c.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "choices":
			stopped = !deltaChoices(&c, yield)
		case "id":
			m.ID, m.IDEsc = optString(&c)
		case "model":
			m.Model, m.ModelEsc = optString(&c)
		case "created":
			m.Created = int64(readCount(&c))
		case "type":
			if c.peek() != '"' {
				c.skip(nil)
				continue
			}
			raw, esc, ok := c.str()
			if ok {
				k := responsesKind(raw, esc)
				m.Responses = k != rNone
				typ = 0
				if k == rDelta {
					typ = responsesDeltaField(raw, esc)
				}
			}
		case "delta":
			if c.peek() == '"' {
				delta, deltaEsc, haveDel = c.str()
				continue
			}
			haveDel = false
			c.skip(nil)
		case "sequence_number":
			m.Seq = readCount(&c)
		case "response":
			responseMeta(&c, &m)
		default:
			c.skip(nil)
		}
	}
	if !stopped && m.Responses && typ != 0 && haveDel && len(delta) > 0 {
		stopped = !yield(TextDelta{Choice: 0, Field: typ, Raw: delta, Esc: deltaEsc})
	}
	m.OK = c.ok() && !stopped && skipSpace(data, c.i) == len(data)
	return m
}

// responsesDeltaField is the field of a response.*.delta event type (raw contents), 0 for a
// delta that is not generated text (audio bytes, a code interpreter's code, ...).
func responsesDeltaField(raw []byte, esc bool) DeltaField {
	var buf [64]byte
	v := keyText(raw, esc, buf[:])
	switch string(v) {
	case "response.output_text.delta":
		return FieldContent
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta", "response.reasoning.delta":
		return FieldReasoning
	case "response.refusal.delta":
		return FieldRefusal
	}
	const suffix = "_arguments.delta"
	if len(v) > len(suffix) && string(v[len(v)-len(suffix):]) == suffix {
		return FieldArguments
	}
	return 0
}

// optString reads the string at the cursor (nil for any other value, which is skipped).
func optString(c *cur) ([]byte, bool) {
	if c.peek() != '"' {
		c.skip(nil)
		return nil, false
	}
	raw, esc, _ := c.str()
	return raw, esc
}

// responseMeta reads a Responses event's response object for its id, model and created_at.
func responseMeta(c *cur, m *DeltaMeta) {
	if !c.enter('{') {
		return
	}
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "id":
			m.ID, m.IDEsc = optString(c)
		case "model":
			m.Model, m.ModelEsc = optString(c)
		case "created_at":
			m.Created = int64(readCount(c))
		default:
			c.skip(nil)
		}
	}
}

// deltaChoices reads a chunk's choices array; false when yield stopped the scan.
func deltaChoices(c *cur, yield func(TextDelta) bool) bool {
	if !c.enter('[') {
		return true
	}
	for pos, first := 0, true; c.elem(&first); pos++ {
		if c.peek() != '{' {
			c.skip(nil)
			continue
		}
		c.i++
		index, known := pos, false
		for f2 := true; ; {
			key, esc, ok := c.member(&f2)
			if !ok {
				break
			}
			var kb [32]byte
			k := keyText(key, esc, kb[:])
			switch string(k) {
			case "index":
				if v := readCount(c); v >= 0 {
					index = v
				}
				known = true
				continue
			case "delta", "text", "finish_reason":
			default:
				c.skip(nil)
				continue
			}
			if !known {
				// The index comes after the text (or not at all): look ahead for it.
				if v, ok := lookAheadIndex(*c); ok {
					index = v
				}
				known = true
			}
			switch string(k) {
			case "delta":
				if !chatDelta(c, index, yield) {
					return false
				}
			case "text":
				if !yieldString(c, index, FieldContent, yield) {
					return false
				}
			case "finish_reason":
				if !yieldString(c, index, FieldFinish, yield) {
					return false
				}
			}
		}
	}
	return true
}

// lookAheadIndex finds the "index" member among the rest of a choice object, from a copy of
// the cursor at the value of another member.
func lookAheadIndex(c cur) (int, bool) {
	c.skip(nil)
	for first := false; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return 0, false
		}
		if equalString(key, esc, "index") {
			v := readCount(&c)
			return v, v >= 0
		}
		c.skip(nil)
	}
}

// yieldString yields the string at the cursor as field f of choice index (any other value is
// skipped); false when yield stopped the scan.
func yieldString(c *cur, index int, f DeltaField, yield func(TextDelta) bool) bool {
	if c.peek() != '"' {
		c.skip(nil)
		return true
	}
	raw, esc, ok := c.str()
	if !ok || len(raw) == 0 {
		return true
	}
	return yield(TextDelta{Choice: index, Field: f, Raw: raw, Esc: esc})
}

// chatDelta reads a chat delta: content, reasoning, refusal, tool calls' arguments.
func chatDelta(c *cur, index int, yield func(TextDelta) bool) bool {
	if !c.enter('{') {
		return true
	}
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return true
		}
		var kb [32]byte
		var cont bool
		switch string(keyText(key, esc, kb[:])) {
		case "content":
			cont = yieldString(c, index, FieldContent, yield)
		case "reasoning_content", "reasoning":
			cont = yieldString(c, index, FieldReasoning, yield)
		case "refusal":
			cont = yieldString(c, index, FieldRefusal, yield)
		case "tool_calls":
			if !c.enter('[') {
				continue
			}
			cont = true
			for f2 := true; cont && c.elem(&f2); {
				cont = callArguments(c, index, true, yield)
			}
		case "function_call":
			cont = callArguments(c, index, false, yield)
		default:
			c.skip(nil)
			continue
		}
		if !cont {
			return false
		}
	}
}

// callArguments yields the arguments of a tool call ({"function":{...}} when wrapped) or of a
// function call ({"name":...,"arguments":...}).
func callArguments(c *cur, index int, wrapped bool, yield func(TextDelta) bool) bool {
	if !c.enter('{') {
		return true
	}
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return true
		}
		switch {
		case wrapped && equalString(key, esc, "function"):
			if !callArguments(c, index, false, yield) {
				return false
			}
		case !wrapped && equalString(key, esc, "arguments"):
			if !yieldString(c, index, FieldArguments, yield) {
				return false
			}
		default:
			c.skip(nil)
		}
	}
}
