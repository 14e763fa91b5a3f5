package openai

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the JSON scanner the rest of the package is built on. It validates as
// strictly as encoding/json (RFC 8259; invalid UTF-8 is tolerated, as encoding/json does),
// works in place on the caller's bytes, never allocates on valid input (JSON text embedded
// in strings is measured as it is read, not decoded into a copy), and is iterative, so
// nesting depth costs memory (one bit per level) rather than stack.

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
// string scanner: '"', '\\' and control characters; clsOpen marks '{' and '[', which end
// the fast path of text whose depth is measured.
const (
	clsWeight  = 0x1f
	clsChar    = 0x20
	clsOpen    = 0x40
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
		if c == '{' || c == '[' {
			k |= clsOpen
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

// shortString is scanString's common case inline: a string without escapes whose closing
// quote is within the 24 bytes after the opening one (object keys up to 23 bytes:
// "finish_reason", "completion_tokens", "max_tokens"; finish reasons, roles, small tokens),
// eight bytes at a time. ok is false for anything else, which scanString then scans.
func shortString(b []byte, i int) (end int, ok bool) {
	for range 3 {
		if i+9 > len(b) {
			return 0, false
		}
		if m := specialMask(binary.LittleEndian.Uint64(b[i+1:])); m != 0 {
			end = i + 2 + bits.TrailingZeros64(m)>>3
			return end, b[end-1] == '"'
		}
		i += 8
	}
	return 0, false
}

// scanString scans the string starting at b[i] == '"'. It returns the index just past the
// closing quote and whether the string contains escapes; on a syntax error, msg is set and
// end is the offset of the error.
func scanString(b []byte, i int) (end int, esc bool, msg string) {
	i++
	for {
		i = nextSpecial(b, i)
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

// nextSpecial is the index of the first '"', '\\' or control byte of b at or after i (len(b)
// if none): eight bytes at a time, straight to the first special one, the last few bytes one
// at a time.
func nextSpecial(b []byte, i int) int {
	for i+8 <= len(b) {
		if m := specialMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(b) && class[b[i]]&clsSpecial == 0 {
		i++
	}
	return i
}

// specialMask has the high bit of each byte of x (little-endian: the first byte in memory
// is the lowest) that is '"', '\\' or below 0x20 set, and may have false ones above the
// first: its lowest set bit marks the first special byte exactly (a false mark needs a
// borrow, and only a special byte below it borrows).
func specialMask(x uint64) uint64 {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q := x ^ (lo * '"')
	s := x ^ (lo * '\\')
	return ((q-lo)&^q | (s-lo)&^s | (x-lo*0x20)&^x) & hi
}

// scanStringStats is scanString that also counts the decoded text into st, in the same pass.
// When ts is non-nil, the decoded text is also fed to ts (which measures its depth), in the
// same pass: bytes that cannot change ts's state are skipped as fast as without it.
func scanStringStats(b []byte, i int, st *textStats, ts *textScanner) (end int, esc bool, msg string) {
	var add textStats
	end, esc, msg = scanStringCount(b, i, &add, ts)
	st.chars += add.chars
	st.weight += add.weight
	return end, esc, msg
}

// scanStringCount is scanStringStats's scan, counting into its own (zeroed) add.
func scanStringCount(b []byte, i int, add *textStats, ts *textScanner) (end int, esc bool, msg string) {
	i++
	chars, weight := 0, 0
	for {
		switch {
		case ts == nil:
			for i < len(b) {
				k := class[b[i]]
				if k&clsSpecial != 0 {
					break
				}
				weight += int(k & clsWeight)
				chars += int(k>>5) & 1
				i++
			}
		case ts.fast():
			for i < len(b) {
				k := class[b[i]]
				if k&(clsSpecial|clsOpen) != 0 {
					break
				}
				weight += int(k & clsWeight)
				chars += int(k>>5) & 1
				i++
			}
		}
		if i >= len(b) {
			add.chars, add.weight = chars, weight
			return i, esc, errEOF
		}
		switch c := b[i]; {
		case c == '"':
			add.chars, add.weight = chars, weight
			return i + 1, esc, ""
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				add.chars, add.weight = chars, weight
				return i + 1, esc, errEOF
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for k := 2; k < 6; k++ {
					if i+k >= len(b) {
						add.chars, add.weight = chars, weight
						return i + k, esc, errEOF
					}
					if unhex(b[i+k]) < 0 {
						add.chars, add.weight = chars, weight
						return i + k, esc, errEscape
					}
				}
			default:
				add.chars, add.weight = chars, weight
				return i + 1, esc, errEscape
			}
			r, n := decodeEscape(b, i)
			chars++
			weight += runeWeight(r)
			if ts != nil {
				ts.feed(asciiOf(r))
			}
			i = n
		case c < 0x20:
			add.chars, add.weight = chars, weight
			return i, esc, errControl
		default: // only with ts: '{' or '[', or any byte while ts needs every one
			k := class[c]
			weight += int(k & clsWeight)
			chars += int(k>>5) & 1
			ts.feed(c)
			i++
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
// its deepest element, an empty container is 1. When ts is non-nil, every string of the
// value, key or value, is text and counts with its depth as ts measures it (see
// ParseRequest) instead of 1.
func scanValue(b []byte, i int, ts *textScanner) (end, depth int, msg string) {
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
		i, _, msg = scanString(b, i)
		if msg != "" {
			return i, depth, msg
		}
		d := 1
		if ts != nil {
			d, _ = ts.measure(b[start+1 : i-1])
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
	{
		start := i
		i, _, msg = scanString(b, i)
		if msg != "" {
			return i, depth, msg
		}
		if ts != nil {
			d, _ := ts.measure(b[start+1 : i-1])
			depth = max(depth, level+d)
		}
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

// The depth of text (the rule is ParseRequest's). A textScanner reads text one character at
// a time and measures the JSON arrays and objects embedded in it, in one pass and with no
// look-back: each '{' or '[' outside an embedded value starts one, which is read as far as
// the text continues it as JSON (RFC 8259); a character that cannot continue it ends it and
// is read as text again, so every character is read at most twice. A character is a byte; a
// character outside ASCII arrives as 0x80, which JSON only allows inside strings.
//
// The strings of an embedded value (keys and values) are text one level down: level j
// decodes their escapes and hands their characters to level j+1 as they arrive, so JSON
// text in JSON strings is measured with no copy and no second pass. textLevels levels are
// followed; a string of the last one counts by its brackets. A character costs at most one
// step per level, so the work is linear in the text whatever it holds. Memory: the levels,
// and one bit per array or object open (256 inline, then a slice, grown only by text that
// nests that deep).

// textLevels is how many levels of JSON text in JSON strings are followed.
const textLevels = 8

// Modes of a level.
const (
	mText     = iota // outside an embedded value
	mFirst           // after '[': a value or ']'
	mValue           // after ':' or an array's ',': a value
	mKeyFirst        // after '{': a key or '}'
	mKey             // after an object's ',': a key
	mColon           // after a key: ':'
	mNext            // after a value: ',' or the closing bracket
	mString          // in a string (a key when key is set), whose text is the next level's
	mNumber          // in a number, in state num
	mLiteral         // in true, false or null, lit to go
)

// Number states, RFC 8259's grammar: after '-', after a leading 0, in the integer's digits,
// after '.', in the fraction, after 'e', after the exponent's sign, in the exponent.
const (
	nMinus = iota
	nZero
	nInt
	nDot
	nFrac
	nE
	nESign
	nExp
)

// numStep is the number state after c, ok false when c does not continue the number.
func numStep(state uint8, c byte) (next uint8, ok bool) {
	digit := c >= '0' && c <= '9'
	switch state {
	case nMinus:
		switch {
		case c == '0':
			return nZero, true
		case digit:
			return nInt, true
		}
	case nZero, nInt, nFrac:
		switch {
		case digit && state != nZero:
			return state, true
		case c == '.' && state != nFrac:
			return nDot, true
		case c == 'e' || c == 'E':
			return nE, true
		}
	case nDot:
		if digit {
			return nFrac, true
		}
	case nE:
		switch {
		case c == '+' || c == '-':
			return nESign, true
		case digit:
			return nExp, true
		}
	case nESign, nExp:
		if digit {
			return nExp, true
		}
	}
	return state, false
}

// textLevel is one level's text: the embedded value being read, if any, and the depth so far.
type textLevel struct {
	mode   uint8
	esc    uint8 // in mString: 1 after '\\', 2 to 5 after "\\u" and esc-2 hex digits
	num    uint8
	key    bool
	junk   bool  // something besides one complete embedded value and white space was read
	values uint8 // embedded values started, up to 2
	hex    uint16
	lit    string // the rest of the literal
	open   int    // arrays and objects of the embedded value open
	base   int    // where the outermost one is in the stack
	cur    int    // the depth the embedded value reached
	depth  int    // the text's depth so far
	br     int    // the last level: brackets open in a string
	brMax  int    // and their deepest nesting
}

type textScanner struct {
	lv     [textLevels]textLevel
	active int       // the innermost level reading
	pend   int       // levels in the middle of an escape
	top    int       // arrays and objects open, all levels together
	small  [4]uint64 // their kinds, one bit each (1: object), the first 256
	spill  []uint64  // the rest
}

// reset starts a new text.
func (s *textScanner) reset() {
	s.active, s.pend, s.top = 0, 0, 0
	s.lv[0] = textLevel{depth: 1}
}

// fast reports whether the characters other than '{', '[', '"', '\\' and control characters
// leave the scanner as it is, so that a caller may skip them: the innermost level is outside
// an embedded value (for level 0, after its first character other than white space, which
// decides whether the text is one JSON value), and no level is in the middle of an escape.
func (s *textScanner) fast() bool {
	l := &s.lv[s.active]
	return l.mode == mText && s.pend == 0 && (l.junk || s.active > 0)
}

func (s *textScanner) setKind(i int, obj bool) {
	var w *uint64
	if i < 256 {
		w = &s.small[i>>6]
	} else {
		k := (i - 256) >> 6
		for k >= len(s.spill) {
			s.spill = append(s.spill, 0)
		}
		w = &s.spill[k]
	}
	if bit := uint64(1) << (i & 63); obj {
		*w |= bit
	} else {
		*w &^= bit
	}
}

// inObject reports whether the innermost open container is an object.
func (s *textScanner) inObject() bool {
	i := s.top - 1
	w := s.small[(i&255)>>6]
	if i >= 256 {
		w = s.spill[(i-256)>>6]
	}
	return w>>(i&63)&1 == 1
}

// feed reads the next character of level 0's text.
func (s *textScanner) feed(c byte) {
	for j := 0; ; j++ {
		l := &s.lv[j]
		if l.mode != mString {
			s.step(j, c)
			return
		}
		// c is a character of a string of level j: decode it for level j+1.
		switch l.esc {
		case 0:
			switch {
			case c == '"':
				l.cur = max(l.cur, l.open+s.inner(j))
				if l.key {
					l.mode = mColon
				} else {
					l.mode = mNext
				}
				return
			case c == '\\':
				l.esc = 1
				s.pend++
				return
			case c < 0x20:
				s.breakString(j, c)
				return
			}
		case 1:
			switch c {
			case '"', '\\', '/':
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case 'u':
				l.esc, l.hex = 2, 0
				return
			default:
				s.breakString(j, c)
				return
			}
			l.esc = 0
			s.pend--
		default:
			h := unhex(c)
			if h < 0 {
				s.breakString(j, c)
				return
			}
			l.hex = l.hex<<4 | uint16(h)
			if l.esc++; l.esc < 6 {
				return
			}
			l.esc = 0
			s.pend--
			c = asciiOf(rune(l.hex))
		}
		if j == textLevels-1 {
			switch c {
			case '{', '[':
				l.br++
				l.brMax = max(l.brMax, l.br)
			case '}', ']':
				l.br = max(l.br-1, 0)
			}
			return
		}
	}
}

// asciiOf is the character a decoded rune reads as.
func asciiOf(r rune) byte {
	if r < 0x80 {
		return byte(r)
	}
	return 0x80
}

// step reads c at level j, which is not in a string.
func (s *textScanner) step(j int, c byte) {
	l := &s.lv[j]
	for {
		switch l.mode {
		case mText:
			if c == '{' || c == '[' {
				l.values = min(l.values+1, 2)
				l.base, l.cur = s.top, 0
				s.push(l, c)
			} else if !isSpace(c) {
				l.junk = true
			}
			return
		case mFirst, mValue:
			switch {
			case isSpace(c):
				return
			case c == ']' && l.mode == mFirst:
				s.pop(l)
				return
			case c == '{' || c == '[':
				s.push(l, c)
				return
			case c == '"':
				s.startString(j, false)
				return
			case c == '-' || (c >= '0' && c <= '9'):
				l.cur = max(l.cur, l.open+1)
				l.mode, l.num = mNumber, nInt
				if c == '-' {
					l.num = nMinus
				} else if c == '0' {
					l.num = nZero
				}
				return
			case c == 't' || c == 'f' || c == 'n':
				l.cur = max(l.cur, l.open+1)
				l.mode = mLiteral
				switch c {
				case 't':
					l.lit = "rue"
				case 'f':
					l.lit = "alse"
				default:
					l.lit = "ull"
				}
				return
			}
		case mKeyFirst, mKey:
			switch {
			case isSpace(c):
				return
			case c == '}' && l.mode == mKeyFirst:
				s.pop(l)
				return
			case c == '"':
				s.startString(j, true)
				return
			}
		case mColon:
			switch {
			case isSpace(c):
				return
			case c == ':':
				l.mode = mValue
				return
			}
		case mNext:
			if isSpace(c) {
				return
			}
			obj := s.inObject()
			switch {
			case c == ',' && obj:
				l.mode = mKey
				return
			case c == ',':
				l.mode = mValue
				return
			case (c == '}' && obj) || (c == ']' && !obj):
				s.pop(l)
				return
			}
		case mNumber:
			next, ok := numStep(l.num, c)
			if ok {
				l.num = next
				return
			}
			if next == nZero || next == nInt || next == nFrac || next == nExp {
				l.mode = mNext
				continue // c follows the number
			}
		case mLiteral:
			if c == l.lit[0] {
				if l.lit = l.lit[1:]; l.lit == "" {
					l.mode = mNext
				}
				return
			}
		}
		// c cannot continue the embedded value: the value ends before it, and c is text.
		s.fail(l)
	}
}

// push opens an array or an object ('[' or '{').
func (s *textScanner) push(l *textLevel, c byte) {
	s.setKind(s.top, c == '{')
	s.top++
	l.open++
	l.cur = max(l.cur, l.open)
	if c == '{' {
		l.mode = mKeyFirst
	} else {
		l.mode = mFirst
	}
}

// pop closes the innermost array or object; closing the outermost completes the value.
func (s *textScanner) pop(l *textLevel) {
	s.top--
	if l.open--; l.open > 0 {
		l.mode = mNext
		return
	}
	l.depth = max(l.depth, l.cur)
	l.mode = mText
}

// fail ends the embedded value of l before the character at hand, which is not JSON there.
func (s *textScanner) fail(l *textLevel) {
	l.depth = max(l.depth, l.cur)
	l.junk = true
	s.top = l.base
	l.open = 0
	l.mode = mText
}

// startString starts a string at level j; its text is level j+1's.
func (s *textScanner) startString(j int, key bool) {
	l := &s.lv[j]
	l.mode, l.key, l.esc = mString, key, 0
	if j+1 < textLevels {
		s.lv[j+1] = textLevel{depth: 1, base: s.top}
		s.active = j + 1
	} else {
		l.br, l.brMax = 0, 0
	}
}

// breakString ends a string of level j at c, which no JSON string holds there (a control
// character, a bad escape): the string's text counts, the value ends, and c is text.
func (s *textScanner) breakString(j int, c byte) {
	l := &s.lv[j]
	if l.esc != 0 {
		l.esc = 0
		s.pend--
	}
	l.cur = max(l.cur, l.open+s.inner(j))
	s.fail(l)
	s.step(j, c)
}

// inner ends the text of level j's string and returns its depth.
func (s *textScanner) inner(j int) int {
	if j+1 == textLevels {
		return s.lv[j].brMax + 1
	}
	d, _ := s.endLevel(j + 1)
	s.active = j
	return d
}

// endLevel ends level j's text: an embedded value still open counts as far as it reached.
func (s *textScanner) endLevel(j int) (depth int, whole bool) {
	l := &s.lv[j]
	if l.mode == mString {
		if l.esc != 0 {
			l.esc = 0
			s.pend--
		}
		l.cur = max(l.cur, l.open+s.inner(j))
	}
	if l.mode != mText {
		s.fail(l)
	}
	return l.depth, !l.junk && l.values == 1
}

// end ends the text and returns its depth (at least 1) and whether the whole text, but for
// white space around it, is one JSON array or object.
func (s *textScanner) end() (depth int, whole bool) { return s.endLevel(0) }

// measure returns the depth of a JSON string's raw contents (see end).
func (s *textScanner) measure(raw []byte) (depth int, whole bool) {
	s.reset()
	for i := 0; i < len(raw); {
		if s.fast() {
			if i = skipText(raw, i); i >= len(raw) {
				break
			}
		}
		if c := raw[i]; c != '\\' {
			s.feed(c)
			i++
			continue
		}
		r, n := decodeEscape(raw, i)
		s.feed(asciiOf(r))
		i = n
	}
	return s.end()
}

// skipText returns the index of the first '{', '[' or '\\' in b from i (len(b) if none).
func skipText(b []byte, i int) int {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	for i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		o := (x | lo*0x20) ^ (lo * '{') // '[' | 0x20 == '{'
		e := x ^ (lo * '\\')
		if ((o-lo)&^o|(e-lo)&^e)&hi != 0 {
			break
		}
		i += 8
	}
	for i < len(b) && class[b[i]]&clsOpen == 0 && b[i] != '\\' {
		i++
	}
	return i
}

// cur is a cursor for walking a JSON document with a known shape. The first syntax error
// stops the walk: every method then reports nothing more.
type cur struct {
	b   []byte
	i   int
	msg string // first syntax error
	off int    // its offset

	// What a Tap's scan met, for its shapes (Tap.observe): the text strings it counted,
	// the span of the last one ([cs, ce), quotes included), and whether anything else could
	// have changed the tap.
	contents int
	cs, ce   int
	effect   bool
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
	if c.i < len(c.b) && c.b[c.i] > ' ' {
		return c.b[c.i] // compact JSON: no white space to skip
	}
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
	// Compact JSON's common case in one pass: [,]"key":value with a short plain key.
	if b, i := c.b, c.i; i < len(b) {
		if !*first && b[i] == ',' {
			i++
		}
		if i < len(b) && b[i] == '"' && (*first || i > c.i) {
			if end, short := shortString(b, i); short && end+1 < len(b) && b[end] == ':' && b[end+1] > ' ' {
				*first = false
				c.i = end + 1
				return b[i+1 : end-1], false, true
			}
		}
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
	end, short := shortString(c.b, c.i)
	if !short {
		var msg string
		if end, esc, msg = scanString(c.b, c.i); msg != "" {
			c.fail(end, msg)
			return nil, false, false
		}
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
	end, esc, msg := scanStringStats(c.b, c.i, st, nil)
	if msg != "" {
		c.fail(end, msg)
		return nil, false, false
	}
	c.i = end
	return c.b[start+1 : end-1], esc, true
}

// strText is strStats that also measures the text's depth with ts: depth is at least 1,
// whole reports that the text is one JSON array or object and white space (see
// textScanner.end).
func (c *cur) strText(st *textStats, ts *textScanner) (raw []byte, depth int, whole bool, ok bool) {
	start := c.i
	ts.reset()
	end, _, msg := scanStringStats(c.b, c.i, st, ts)
	if msg != "" {
		c.fail(end, msg)
		return nil, 0, false, false
	}
	c.i = end
	depth, whole = ts.end()
	return c.b[start+1 : end-1], depth, whole, true
}

// skip scans past the value at the cursor and returns its depth (see scanValue).
func (c *cur) skip(ts *textScanner) int {
	if c.msg != "" {
		return 0
	}
	if ts == nil && c.i < len(c.b) {
		// A scalar (most skipped values: ids, names, numbers, nulls) without scanValue's
		// container machinery.
		var end int
		var msg string
		switch ch := c.b[c.i]; {
		case ch == '"':
			end, _, msg = scanString(c.b, c.i)
		case ch == '-' || ('0' <= ch && ch <= '9'):
			end, msg = scanNumber(c.b, c.i)
		case ch == 't' || ch == 'f' || ch == 'n':
			end, msg = scanLiteral(c.b, c.i)
		default:
			goto general
		}
		if msg != "" {
			c.fail(end, msg)
			return 0
		}
		c.i = end
		return 1 // a scalar's depth, as scanValue has it
	}
general:
	end, d, msg := scanValue(c.b, c.i, ts)
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

// enter steps into the value at the cursor when it opens with open ('{' or '['); any other
// value is skipped, and enter reports false.
func (c *cur) enter(open byte) bool {
	if c.peek() != open {
		c.skip(nil)
		return false
	}
	c.i++
	return true
}

// nextObject steps into the next element of the array whose '[' has been consumed that is an
// object, skipping elements of any other kind: false at the closing ']' or on a syntax error.
// first must start true for each array.
func (c *cur) nextObject(first *bool) bool {
	for c.elem(first) {
		if c.b[c.i] == '{' { // elem leaves the cursor at the element, white space skipped
			c.i++
			return true
		}
		c.skip(nil)
	}
	return false
}
