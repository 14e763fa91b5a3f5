package guard

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/sluicegw/sluice/policy/openai"
)

// segment is one piece of the text the model sees, as a sub-slice of the request body: the
// contents of a JSON string (without its quotes; esc when it holds escapes), or raw JSON (the
// tool declarations, which chat templates render as JSON).
type segment struct {
	b   []byte
	esc bool
}

// promptText is the text of a request, extracted from its body once.
type promptText struct {
	segs     []segment
	tokenIDs int // prompt tokens given as token IDs (completions, embeddings)
}

// extractText collects the text the model sees, the same text openai.ParseRequest counts in
// PromptChars: message content (string content, and the "text" and "refusal" of content
// parts), tool-call names and arguments (tool_calls and the legacy function_call), the JSON of
// the tool declarations (tools, functions), and prompts and inputs given as text; for the
// Responses API the instructions, the input (a string, or items: messages, function calls'
// names and arguments, function call outputs) and the tools. The body
// has been validated by ParseRequest, so the walker does not re-check the JSON grammar; it
// never reads past the body whatever the bytes are. Keys written with escapes are decoded
// before they are compared, so "\u0063ontent" is content as it is for the model server.
func extractText(kind openai.Kind, body []byte, pt *promptText) {
	w := walker{b: body}
	w.ws()
	if w.peek() != '{' {
		return
	}
	w.i++
	for w.member() {
		key := w.key()
		switch {
		case kind == openai.KindChat && string(key) == "messages":
			w.array(func() { w.message(pt) })
		case kind == openai.KindChat && (string(key) == "tools" || string(key) == "functions"):
			start := w.i
			w.skip()
			if v := body[start:w.i]; !bytes.Equal(v, []byte("null")) {
				pt.segs = append(pt.segs, segment{b: v})
			}
		case kind == openai.KindCompletion && string(key) == "prompt", kind == openai.KindEmbedding && string(key) == "input":
			w.prompts(pt)
		case kind == openai.KindResponses && string(key) == "instructions":
			w.text(pt)
		case kind == openai.KindResponses && string(key) == "input":
			if w.peek() == '"' {
				w.text(pt)
			} else {
				w.array(func() { w.item(pt) })
			}
		case kind == openai.KindResponses && string(key) == "tools":
			start := w.i
			w.skip()
			if v := body[start:w.i]; !bytes.Equal(v, []byte("null")) {
				pt.segs = append(pt.segs, segment{b: v})
			}
		default:
			w.skip()
		}
	}
}

type walker struct {
	b    []byte
	i    int
	kbuf [32]byte
}

func (w *walker) ws() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *walker) peek() byte {
	w.ws()
	if w.i < len(w.b) {
		return w.b[w.i]
	}
	return 0
}

// member moves to the next member of the current object (after '{' or a value) and reports
// whether there is one; the cursor is then on its key.
func (w *walker) member() bool {
	switch w.peek() {
	case ',':
		w.i++
		return w.peek() == '"'
	case '"':
		return true
	case '}':
		w.i++
	}
	return false
}

// elem moves to the next element of the current array and reports whether there is one.
func (w *walker) elem(first *bool) bool {
	c := w.peek()
	if c == ']' || c == 0 {
		if c == ']' {
			w.i++
		}
		return false
	}
	if !*first {
		if c != ',' {
			return false
		}
		w.i++
	}
	*first = false
	return w.peek() != 0
}

// key reads a key and its colon. Keys with escapes are decoded (short ones only; a long key
// is none of those the walker looks for). The result is valid until the next key.
func (w *walker) key() []byte {
	raw, esc := w.str()
	if w.peek() == ':' {
		w.i++
	}
	if !esc {
		return raw
	}
	if len(raw) > len(w.kbuf) {
		return nil
	}
	return unescape(w.kbuf[:0], raw)
}

// str reads a string at the cursor and returns its raw contents.
func (w *walker) str() (raw []byte, esc bool) {
	if w.peek() != '"' {
		w.skip()
		return nil, false
	}
	start := w.i + 1
	j := start
	for {
		k := bytes.IndexByte(w.b[j:], '"')
		if k < 0 {
			w.i = len(w.b)
			return w.b[start:], bytes.IndexByte(w.b[start:], '\\') >= 0
		}
		j += k
		// Count the backslashes before the quote: an odd number escapes it.
		n := 0
		for m := j - 1; m >= start && w.b[m] == '\\'; m-- {
			n++
		}
		if n%2 == 0 {
			w.i = j + 1
			raw = w.b[start:j]
			return raw, bytes.IndexByte(raw, '\\') >= 0
		}
		j++
	}
}

// skip skips one value.
func (w *walker) skip() {
	switch w.peek() {
	case '"':
		w.str()
	case '{', '[':
		depth := 0
		for w.i < len(w.b) {
			switch w.b[w.i] {
			case '"':
				w.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					w.i++
					return
				}
			}
			w.i++
		}
	default:
		for w.i < len(w.b) {
			switch w.b[w.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return
			}
			w.i++
		}
	}
}

// array calls f for each element of the array at the cursor (and skips anything else).
func (w *walker) array(f func()) {
	if w.peek() != '[' {
		w.skip()
		return
	}
	w.i++
	for first := true; w.elem(&first); {
		start := w.i
		f()
		if w.i == start { // f did not move: skip the element
			w.skip()
		}
	}
}

// object calls f with each key of the object at the cursor; f must consume the value.
func (w *walker) object(f func(key []byte)) {
	if w.peek() != '{' {
		w.skip()
		return
	}
	w.i++
	for w.member() {
		f(w.key())
	}
}

func (w *walker) text(pt *promptText) {
	if w.peek() != '"' {
		w.skip()
		return
	}
	raw, esc := w.str()
	if len(raw) > 0 {
		pt.segs = append(pt.segs, segment{b: raw, esc: esc})
	}
}

// content reads message content: a string, or parts whose "text" and "refusal" count.
func (w *walker) content(pt *promptText) {
	switch w.peek() {
	case '"':
		w.text(pt)
	case '[':
		w.array(func() {
			w.object(func(k []byte) {
				if string(k) == "text" || string(k) == "refusal" {
					w.text(pt)
				} else {
					w.skip()
				}
			})
		})
	default:
		w.skip()
	}
}

func (w *walker) message(pt *promptText) {
	w.object(func(key []byte) {
		switch string(key) {
		case "content":
			w.content(pt)
		case "tool_calls":
			w.array(func() {
				w.object(func(k []byte) {
					if string(k) == "function" {
						w.function(pt)
					} else {
						w.skip()
					}
				})
			})
		case "function_call":
			w.function(pt)
		default:
			w.skip()
		}
	})
}

// item reads one Responses input item: a message ({role, content}, content a string or
// parts with "text"), a function call (name, arguments) or a function call's output.
func (w *walker) item(pt *promptText) {
	w.object(func(k []byte) {
		switch string(k) {
		case "content":
			w.content(pt)
		case "name", "arguments", "output":
			w.text(pt)
		default:
			w.skip()
		}
	})
}

func (w *walker) function(pt *promptText) {
	w.object(func(k []byte) {
		if string(k) == "name" || string(k) == "arguments" {
			w.text(pt)
		} else {
			w.skip()
		}
	})
}

// prompts reads string | []string | []int | [][]int.
func (w *walker) prompts(pt *promptText) {
	switch w.peek() {
	case '"':
		w.text(pt)
	case '[':
		w.array(func() {
			switch c := w.peek(); {
			case c == '"':
				w.text(pt)
			case c == '[':
				w.array(func() { pt.tokenIDs++; w.skip() })
			case c == '-' || (c >= '0' && c <= '9'):
				pt.tokenIDs++
				w.skip()
			default:
				w.skip()
			}
		})
	default:
		w.skip()
	}
}

// unescape appends the decoded contents of a JSON string to dst. Invalid escapes are kept
// as they are (the body was validated, so there are none).
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		k := bytes.IndexByte(raw[i:], '\\')
		if k < 0 {
			return append(dst, raw[i:]...)
		}
		dst = append(dst, raw[i:i+k]...)
		i += k
		if i+1 >= len(raw) {
			return append(dst, raw[i:]...)
		}
		c := raw[i+1]
		switch c {
		case 'n':
			dst = append(dst, '\n')
		case 't':
			dst = append(dst, '\t')
		case 'r':
			dst = append(dst, '\r')
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'u':
			r, n := hexRune(raw[i:])
			if n == 0 {
				dst = append(dst, raw[i:i+2]...)
				i += 2
				continue
			}
			dst = utf8.AppendRune(dst, r)
			i += n
			continue
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
		i += 2
	}
	return dst
}

// hexRune decodes \uXXXX (and a following low surrogate) at the start of s; n is the bytes
// used, 0 if s does not start with a valid escape.
func hexRune(s []byte) (r rune, n int) {
	h := func(s []byte) rune {
		if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
			return -1
		}
		var v rune
		for _, c := range s[2:6] {
			switch {
			case c >= '0' && c <= '9':
				v = v<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				v = v<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				v = v<<4 | rune(c-'A'+10)
			default:
				return -1
			}
		}
		return v
	}
	r = h(s)
	if r < 0 {
		return 0, 0
	}
	if utf16.IsSurrogate(r) {
		if r2 := h(s[6:]); r2 >= 0 {
			if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
				return d, 12
			}
		}
		return utf8.RuneError, 6
	}
	return r, 6
}
