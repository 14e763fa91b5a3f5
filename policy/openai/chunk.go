package openai

// WellFormedChunk reports whether a stream chunk's data can be relayed: a JSON object whose
// structure is whole. It is a single pass over the bytes, several times cheaper than
// json.Valid, and catches what breaks real streams: a chunk cut short, unbalanced braces or
// brackets, an unterminated string, separators out of place (`,}` `[,` `,,` `{:`). It does not
// check the spelling of numbers and literals.
func WellFormedChunk(data []byte) bool {
	i, n := 0, len(data)
	for i < n && isSpace(data[i]) {
		i++
	}
	for n > i && isSpace(data[n-1]) {
		n--
	}
	if i >= n || data[i] != '{' || data[n-1] != '}' {
		return false
	}
	var stack [64]byte // open containers; deeper chunks fall back to counting only
	depth := 0
	prev := byte(0) // the last structural byte seen outside strings
	for ; i < n; i++ {
		c := data[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			if prev == '}' || prev == ']' || prev == '"' {
				return false // a value right after a value
			}
			if i = stringEnd(data[:n], i+1); i < 0 {
				return false
			}
		case '{', '[':
			if prev == '}' || prev == ']' || prev == '"' {
				return false
			}
			if depth < len(stack) {
				stack[depth] = c
			}
			depth++
		case '}', ']':
			if prev == ',' || prev == ':' || depth == 0 {
				return false
			}
			depth--
			if depth < len(stack) && stack[depth] != c-2 { // '{'+2 == '}', '['+2 == ']'
				return false
			}
			if depth == 0 && i != n-1 {
				return false
			}
		case ',', ':':
			if prev == ',' || prev == ':' || prev == '{' || prev == '[' || prev == 0 {
				return false
			}
		default:
			// a number or literal: it counts as a value for what may follow
			if prev == '}' || prev == ']' || prev == '"' {
				return false
			}
			for i+1 < n && !isDelim(data[i+1]) {
				i++
			}
			c = '"'
		}
		prev = c
	}
	return depth == 0
}

// stringEnd is the index of the quote closing the string whose contents start at b[i], -1
// when the string holds a control byte or does not end within b. Plain bytes are skipped
// eight at a time (strings are most of a chunk's bytes: ids, model names, text).
func stringEnd(b []byte, i int) int {
	for {
		i = nextSpecial(b, i)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case '"':
			return i
		case '\\':
			i += 2 // the escaped byte, whatever it is (as the byte loop always did)
		default:
			return -1 // a control byte
		}
	}
}

func isDelim(c byte) bool {
	switch c {
	case ',', ':', '}', ']', '{', '[', '"', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}
