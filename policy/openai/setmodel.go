package openai

// SetModel returns a copy of body with the top-level "model" value replaced by model. It
// splices bytes: the body is scanned once, the value's span is replaced, and everything
// else stays byte-identical. Every top-level "model" key is rewritten (also one spelled
// with \u escapes), so a body that names the model twice cannot reach the model server with
// the old name; "model" keys nested deeper are not touched. If the body has no top-level
// "model", one is added right after the opening '{'. body itself is never modified. The
// error is a 400 *Error with code "invalid_json" if body is not a JSON object.
func SetModel(body []byte, model string) ([]byte, error) {
	var qb [128]byte
	return SetField(body, "model", AppendString(qb[:0], model))
}

// SetField is SetModel for any top-level key: it sets key to value (raw JSON, e.g. `512` or
// `"x"`), replacing every top-level occurrence, or adding it after the opening '{'.
func SetField(body []byte, key string, value []byte) ([]byte, error) {
	c := cur{b: body}
	if c.peek() != '{' {
		if c.i >= len(body) {
			c.fail(c.i, errEOF)
		} else if c.skip(nil); c.ok() {
			c.fail(0, errNotObject)
		}
		return nil, syntaxError(body, c.off, c.msg)
	}
	open := c.i
	c.i++
	var (
		small [2][2]int // spans of the model values: usually one
		spans = small[:0]
		empty = true
	)
	for first := true; ; {
		k, esc, ok := c.member(&first)
		if !ok {
			break
		}
		empty = false
		if equalString(k, esc, key) {
			start := c.i
			c.skip(nil)
			spans = append(spans, [2]int{start, c.i})
			continue
		}
		c.skip(nil)
	}
	if c.ok() {
		if c.peek(); c.i < len(body) {
			c.fail(c.i, errTrailing)
		}
	}
	if !c.ok() {
		return nil, syntaxError(body, c.off, c.msg)
	}
	q := value
	if len(spans) == 0 {
		out := make([]byte, 0, len(body)+len(key)+4+len(q))
		out = append(out, body[:open+1]...)
		out = AppendString(out, key)
		out = append(out, ':')
		out = append(out, q...)
		if !empty {
			out = append(out, ',')
		}
		return append(out, body[open+1:]...), nil
	}
	n := len(body)
	for _, s := range spans {
		n += len(q) - (s[1] - s[0])
	}
	out := make([]byte, 0, n)
	last := 0
	for _, s := range spans {
		out = append(out, body[last:s[0]]...)
		out = append(out, q...)
		last = s[1]
	}
	return append(out, body[last:]...), nil
}

// HasField reports whether the JSON object body has the top-level key (its escapes decoded,
// matched exactly, as the model servers' JSON parsers match keys). A body that is not a
// valid object has none.
func HasField(body []byte, key string) bool {
	c := cur{b: body}
	if c.peek() != '{' {
		return false
	}
	c.i++
	found := false
	for first := true; ; {
		k, esc, ok := c.member(&first)
		if !ok {
			break
		}
		if equalString(k, esc, key) {
			found = true
		}
		c.skip(nil)
	}
	return found && c.ok()
}
