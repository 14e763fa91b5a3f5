package openai

import (
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the JSON scanner the rest of the package is built on. It validates as
// strictly as encoding/json (RFC 8259; invalid UTF-8 is tolerated, as encoding/json does),
// works in place on the caller's bytes, never allocates on valid input except to decode
// JSON text embedded in strings, and is iterative, so nesting depth costs memory (one bit per
// level) rather than stack.

// Syntax error messages. They are constants so that reporting one does not allocate; the
// offset travels next to them.
const (
	errEOF       = "unexpected end of JSON input"
	errChar      = "invalid character"
	errEscape    = "invalid escape sequence in string"
	errControl   = "control character in string"
	errNumber    = "invalid number"
	errLiteral   = "invalid literal"
	errColon     = "expected ':' after object key"
	errObjNext   = "expected ',' or '}' after object member"
	errArrNext   = "expected ',' or ']' after array element"
	errKey       = "expected string for object key"
	errTrailing  = "unexpected data after the top-level value"
	errNotObject = "expected a JSON object"
)

// Byte classes. The low five bits are the token-estimate weight of the byte in eighths of a
// token (see EstimateTextTokens); clsChar marks a byte that starts a character (anything but
// a UTF-8 continuation byte); clsSpecial marks the bytes that end the fast path of the
// string scanner: '"', '\\' and control characters.
const (
	clsWeight  = 0x1f
	clsChar    = 0x20
	clsSpecial = 0x80
)

// Token-estimate weights in eighths of a token. See EstimateTextTokens for the basis.
const (
	wLetter = 2  // ASCII letters and white space: about 4 characters a token
	wDigit  = 3  // digits: tokenizers group at most 3 digits
	wPunct  = 5  // ASCII punctuation: often a token of its own in code and JSON
	wCtrl   = 8  // other control characters
	w2Byte  = 4  // 2-byte UTF-8 (Latin supplements, Greek, Cyrillic, Hebrew, Arabic): half a token
	w3Byte  = 8  // 3-byte UTF-8 (CJK, Indic, Thai, most symbols): a token a character
	w4Byte  = 16 // 4-byte UTF-8 (emoji, rare CJK): two tokens
	wBad    = 8  // bytes that cannot start UTF-8
	unitsPT = 8  // weight units per token
)

var class [256]uint8

func init() {
	for c := 0; c < 256; c++ {
		var k uint8
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			k = wLetter | clsChar
		case c < 0x20 || c == 0x7f:
			k = wCtrl | clsChar
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			k = wLetter | clsChar
		case c >= '0' && c <= '9':
			k = wDigit | clsChar
		case c < 0x80:
			k = wPunct | clsChar
		case c < 0xc0: // continuation byte
			k = 0
		case c < 0xe0:
			k = w2Byte | clsChar
		case c < 0xf0:
			k = w3Byte | clsChar
		case c < 0xf8:
			k = w4Byte | clsChar
		default:
			k = wBad | clsChar
		}
		if c < 0x20 || c == '"' || c == '\\' {
			k |= clsSpecial
		}
		class[c] = k
	}
}

// textStats accumulates the characters and the token-estimate weight of text.
type textStats struct {
	chars  int
	weight int
}

func (s *textStats) tokens() int { return (s.weight + unitsPT - 1) / unitsPT }

// addRaw counts bytes as they are (no JSON decoding).
func (s *textStats) addRaw(b []byte) {
	chars, weight := 0, 0
	for _, c := range b {
		k := class[c]
		weight += int(k & clsWeight)
		chars += int(k>>5) & 1
	}
	s.chars += chars
	s.weight += weight
}

func runeWeight(r rune) int {
	switch {
	case r < 0x80:
		return int(class[r] & clsWeight)
	case r < 0x800:
		return w2Byte
	case r < 0x10000:
		return w3Byte
	default:
		return w4Byte
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// scanString scans the string starting at b[i] == '"'. It returns the index just past the
// closing quote and whether the string contains escapes; on a syntax error, msg is set and
// end is the offset of the error.
func scanString(b []byte, i int) (end int, esc bool, msg string) {
	i++
	for {
		// Fast path: plain bytes, eight at a time, then one at a time up to the special one.
		for i+8 <= len(b) && !hasSpecial(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		for i < len(b) && class[b[i]]&clsSpecial == 0 {
			i++
		}
		if i >= len(b) {
			return i, esc, errEOF
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, esc, ""
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return i + 1, esc, errEOF
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for k := 2; k < 6; k++ {
					if i+k >= len(b) {
						return i + k, esc, errEOF
					}
					if unhex(b[i+k]) < 0 {
						return i + k, esc, errEscape
					}
				}
				i += 6
			default:
				return i + 1, esc, errEscape
			}
		default:
			return i, esc, errControl
		}
	}
}

// hasSpecial reports whether any of the eight bytes in x is '"', '\\' or below 0x20.
func hasSpecial(x uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q := x ^ (lo * '"')
	s := x ^ (lo * '\\')
	return ((q-lo)&^q|(s-lo)&^s|(x-lo*0x20)&^x)&hi != 0
}

// scanStringStats is scanString that also counts the decoded text into st, in the same pass.
func scanStringStats(b []byte, i int, st *textStats) (end int, esc bool, msg string) {
	i++
	chars, weight := 0, 0
	defer func() { st.chars += chars; st.weight += weight }()
	for {
		for i < len(b) {
			k := class[b[i]]
			if k&clsSpecial != 0 {
				break
			}
			weight += int(k & clsWeight)
			chars += int(k>>5) & 1
			i++
		}
		if i >= len(b) {
			return i, esc, errEOF
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, esc, ""
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return i + 1, esc, errEOF
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for k := 2; k < 6; k++ {
					if i+k >= len(b) {
						return i + k, esc, errEOF
					}
					if unhex(b[i+k]) < 0 {
						return i + k, esc, errEscape
					}
				}
			default:
				return i + 1, esc, errEscape
			}
			r, n := decodeEscape(b, i)
			chars++
			weight += runeWeight(r)
			i = n
		default:
			return i, esc, errControl
		}
	}
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func hex4(s []byte, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for k := i; k < i+4; k++ {
		h := unhex(s[k])
		if h < 0 {
			return 0, false
		}
		r = r<<4 | rune(h)
	}
	return r, true
}

// decodeEscape decodes the escape at s[i] == '\\' and returns the rune and the index after
// it. A \u surrogate pair decodes to one rune; a lone surrogate to U+FFFD (as encoding/json).
func decodeEscape(s []byte, i int) (rune, int) {
	if i+1 >= len(s) {
		return utf8.RuneError, len(s)
	}
	switch s[i+1] {
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	case 'u':
		r, ok := hex4(s, i+2)
		if !ok {
			return utf8.RuneError, min(i+2, len(s))
		}
		n := i + 6
		if utf16.IsSurrogate(r) {
			if n+1 < len(s) && s[n] == '\\' && s[n+1] == 'u' {
				if r2, ok := hex4(s, n+2); ok {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						return d, n + 6
					}
				}
			}
			return utf8.RuneError, n
		}
		return r, n
	}
	return rune(s[i+1]), i + 2
}

// appendUnescape appends the decoded contents of a validated JSON string to dst.
func appendUnescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			j := i + 1
			for j < len(raw) && raw[j] != '\\' {
				j++
			}
			dst = append(dst, raw[i:j]...)
			i = j
			continue
		}
		r, n := decodeEscape(raw, i)
		dst = utf8.AppendRune(dst, r)
		i = n
	}
	return dst
}

// equalString reports whether a JSON string's raw contents decode to s, without allocating.
func equalString(raw []byte, esc bool, s string) bool {
	if !esc {
		return string(raw) == s
	}
	j := 0
	for i := 0; i < len(raw); {
		if raw[i] != '\\' {
			if j >= len(s) || s[j] != raw[i] {
				return false
			}
			i++
			j++
			continue
		}
		r, n := decodeEscape(raw, i)
		i = n
		var buf [utf8.UTFMax]byte
		w := utf8.EncodeRune(buf[:], r)
		if j+w > len(s) || string(buf[:w]) != s[j:j+w] {
			return false
		}
		j += w
	}
	return j == len(s)
}

// keyText returns a key's decoded text, using buf (which should be a small array on the
// caller's stack) when the key has escapes. Keys too long to be one the package knows come
// back empty.
func keyText(raw []byte, esc bool, buf []byte) []byte {
	if !esc {
		return raw
	}
	if len(raw) > cap(buf)*6 { // longer than any \uXXXX spelling of a known key
		return nil
	}
	d := appendUnescape(buf[:0], raw)
	if len(d) > cap(buf) {
		return nil
	}
	return d
}

// scanNumber scans the number starting at b[i]. It returns the index just past it.
func scanNumber(b []byte, i int) (end int, msg string) {
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, errEOF
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	default:
		return i, errNumber
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) {
			return i, errEOF
		}
		if b[i] < '0' || b[i] > '9' {
			return i, errNumber
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) {
			return i, errEOF
		}
		if b[i] < '0' || b[i] > '9' {
			return i, errNumber
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	return i, ""
}

func scanLiteral(b []byte, i int) (end int, msg string) {
	var lit string
	switch b[i] {
	case 't':
		lit = "true"
	case 'f':
		lit = "false"
	default:
		lit = "null"
	}
	for k := 0; k < len(lit); k++ {
		if i+k >= len(b) {
			return i + k, errEOF
		}
		if b[i+k] != lit[k] {
			return i + k, errLiteral
		}
	}
	return i + len(lit), ""
}

// scanValue scans one JSON value starting at b[i] (leading white space is skipped) and
// returns the index just past it and its depth: a scalar is 1, a container is one more than
// its deepest element, an empty container is 1. When scratch is non-nil, a string whose
// whole text (ignoring surrounding white space) is a JSON array or object counts with that
// value's depth instead of 1 (recursively); scratch is where such text is decoded.
func scanValue(b []byte, i int, scratch *[]byte) (end, depth int, msg string) {
	var (
		small [8]uint64 // one bit per open container: 1 = object
		stack = small[:]
		level int
	)
	isObj := func() bool { return stack[(level-1)>>6]>>((level-1)&63)&1 == 1 }
value:
	i = skipSpace(b, i)
	if i >= len(b) {
		return i, depth, errEOF
	}
	switch c := b[i]; c {
	case '{', '[':
		level++
		if (level-1)>>6 >= len(stack) {
			stack = append(stack, 0)
		}
		w, bit := (level-1)>>6, uint64(1)<<((level-1)&63)
		if c == '{' {
			stack[w] |= bit
		} else {
			stack[w] &^= bit
		}
		depth = max(depth, level)
		i = skipSpace(b, i+1)
		if i >= len(b) {
			return i, depth, errEOF
		}
		if c == '{' {
			if b[i] == '}' {
				i++
				level--
				goto next
			}
			goto key
		}
		if b[i] == ']' {
			i++
			level--
			goto next
		}
		goto value
	case '"':
		start := i
		var esc bool
		i, esc, msg = scanString(b, i)
		if msg != "" {
			return i, depth, msg
		}
		d := 1
		if scratch != nil {
			d, _ = embeddedDepth(b[start+1:i-1], esc, scratch)
		}
		depth = max(depth, level+d)
	case 't', 'f', 'n':
		i, msg = scanLiteral(b, i)
		if msg != "" {
			return i, depth, msg
		}
		depth = max(depth, level+1)
	default:
		if c != '-' && (c < '0' || c > '9') {
			return i, depth, errChar
		}
		i, msg = scanNumber(b, i)
		if msg != "" {
			return i, depth, msg
		}
		depth = max(depth, level+1)
	}
next:
	if level == 0 {
		return i, depth, ""
	}
	i = skipSpace(b, i)
	if i >= len(b) {
		return i, depth, errEOF
	}
	if isObj() {
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
			goto key
		case '}':
			i++
			level--
			goto next
		}
		return i, depth, errObjNext
	}
	switch b[i] {
	case ',':
		i++
		goto value
	case ']':
		i++
		level--
		goto next
	}
	return i, depth, errArrNext
key:
	if i >= len(b) {
		return i, depth, errEOF
	}
	if b[i] != '"' {
		return i, depth, errKey
	}
	i, _, msg = scanString(b, i)
	if msg != "" {
		return i, depth, msg
	}
	i = skipSpace(b, i)
	if i >= len(b) {
		return i, depth, errEOF
	}
	if b[i] != ':' {
		return i, depth, errColon
	}
	i++
	goto value
}

// firstText returns the first character of a JSON string's decoded text that is not JSON
// white space (0 if there is none or it is not ASCII).
func firstText(raw []byte) byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c == '\\' {
			r, n := decodeEscape(raw, i)
			if r < 0x80 && isSpace(byte(r)) {
				i = n
				continue
			}
			if r < 0x80 {
				return byte(r)
			}
			return 0
		}
		if isSpace(c) {
			i++
			continue
		}
		return c
	}
	return 0
}

// embeddedDepth returns the depth of a string (raw contents): 1 for text, or the depth of
// the JSON array or object the whole text is (isJSON then true).
func embeddedDepth(raw []byte, esc bool, scratch *[]byte) (depth int, isJSON bool) {
	if c := firstText(raw); c != '{' && c != '[' {
		return 1, false
	}
	s := raw
	if esc {
		mark := len(*scratch)
		*scratch = appendUnescape(*scratch, raw)
		s = (*scratch)[mark:]
		// Inner strings decode after s; s itself stays valid even if scratch grows.
		defer func() { *scratch = (*scratch)[:mark] }()
	}
	end, d, msg := scanValue(s, 0, scratch)
	if msg != "" || skipSpace(s, end) != len(s) {
		return 1, false
	}
	return d, true
}

// cur is a cursor for walking a JSON document with a known shape. The first syntax error
// stops the walk: every method then reports nothing more.
type cur struct {
	b   []byte
	i   int
	msg string // first syntax error
	off int    // its offset
}

func (c *cur) fail(off int, msg string) {
	if c.msg == "" {
		c.msg, c.off = msg, off
	}
	c.i = len(c.b)
}

func (c *cur) ok() bool { return c.msg == "" }

// peek skips white space and returns the next byte (0 at the end).
func (c *cur) peek() byte {
	c.i = skipSpace(c.b, c.i)
	if c.i < len(c.b) {
		return c.b[c.i]
	}
	return 0
}

// member moves to the next member of the object whose '{' has been consumed. It returns the
// member's raw key, with the cursor at the value; false at the closing '}' (consumed) or on
// a syntax error. first must start true for each object.
func (c *cur) member(first *bool) (key []byte, esc bool, ok bool) {
	if c.msg != "" {
		return nil, false, false
	}
	ch := c.peek()
	if c.i >= len(c.b) {
		c.fail(c.i, errEOF)
		return nil, false, false
	}
	if *first {
		*first = false
		if ch == '}' {
			c.i++
			return nil, false, false
		}
	} else {
		switch ch {
		case '}':
			c.i++
			return nil, false, false
		case ',':
			c.i++
			ch = c.peek()
			if c.i >= len(c.b) {
				c.fail(c.i, errEOF)
				return nil, false, false
			}
		default:
			c.fail(c.i, errObjNext)
			return nil, false, false
		}
	}
	if ch != '"' {
		c.fail(c.i, errKey)
		return nil, false, false
	}
	start := c.i
	end, esc, msg := scanString(c.b, c.i)
	if msg != "" {
		c.fail(end, msg)
		return nil, false, false
	}
	c.i = end
	if c.peek() != ':' {
		if c.i >= len(c.b) {
			c.fail(c.i, errEOF)
		} else {
			c.fail(c.i, errColon)
		}
		return nil, false, false
	}
	c.i++
	if c.peek(); c.i >= len(c.b) {
		c.fail(c.i, errEOF)
		return nil, false, false
	}
	return c.b[start+1 : end-1], esc, true
}

// elem moves to the next element of the array whose '[' has been consumed: true with the
// cursor at the element, false at the closing ']' (consumed) or on a syntax error.
func (c *cur) elem(first *bool) bool {
	if c.msg != "" {
		return false
	}
	ch := c.peek()
	if c.i >= len(c.b) {
		c.fail(c.i, errEOF)
		return false
	}
	if *first {
		*first = false
		if ch == ']' {
			c.i++
			return false
		}
		return true
	}
	switch ch {
	case ']':
		c.i++
		return false
	case ',':
		c.i++
		if c.peek(); c.i >= len(c.b) {
			c.fail(c.i, errEOF)
			return false
		}
		return true
	}
	c.fail(c.i, errArrNext)
	return false
}

// str reads the string at the cursor (which must be at '"') and returns its raw contents.
func (c *cur) str() (raw []byte, esc bool, ok bool) {
	start := c.i
	end, esc, msg := scanString(c.b, c.i)
	if msg != "" {
		c.fail(end, msg)
		return nil, false, false
	}
	c.i = end
	return c.b[start+1 : end-1], esc, true
}

// strStats is str that also counts the decoded text into st.
func (c *cur) strStats(st *textStats) (raw []byte, esc bool, ok bool) {
	start := c.i
	end, esc, msg := scanStringStats(c.b, c.i, st)
	if msg != "" {
		c.fail(end, msg)
		return nil, false, false
	}
	c.i = end
	return c.b[start+1 : end-1], esc, true
}

// skip scans past the value at the cursor and returns its depth (see scanValue).
func (c *cur) skip(scratch *[]byte) int {
	if c.msg != "" {
		return 0
	}
	end, d, msg := scanValue(c.b, c.i, scratch)
	if msg != "" {
		c.fail(end, msg)
		return 0
	}
	c.i = end
	return d
}

// number scans the number at the cursor and returns its text.
func (c *cur) number() ([]byte, bool) {
	start := c.i
	end, msg := scanNumber(c.b, c.i)
	if msg != "" {
		c.fail(end, msg)
		return nil, false
	}
	c.i = end
	return c.b[start:end], true
}

// parseInt parses JSON number text that has no fraction or exponent. ok is false if the
// text has one or does not fit in an int64.
func parseInt(s []byte) (v int64, ok bool) {
	neg := false
	if len(s) > 0 && s[0] == '-' {
		neg, s = true, s[1:]
	}
	if len(s) == 0 || len(s) > 19 {
		return 0, false
	}
	var u uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}

// typeName names the JSON type of the value starting with c, for error messages.
func typeName(c byte) string {
	switch c {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// appendQuoted appends s as a JSON string.
func appendQuoted(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += n
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += n
			start = i
			continue
		}
		i += n
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
