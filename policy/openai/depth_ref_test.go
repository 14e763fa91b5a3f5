package openai

// refDepth is the rule of ParseRequest's Depth for text written the plain way, to check the
// streaming textScanner against: recursive descent over decoded text, every string's text
// decoded into a new slice and measured on its own. It is simple, recursive and allocates;
// test inputs only. t is decoded text (a character outside ASCII may take several bytes;
// each is text, as the scanner's single 0x80 is).
func refDepth(t []byte, level int) (depth int, whole bool) {
	if level == textLevels {
		n, m := 0, 0
		for _, c := range t {
			switch c {
			case '{', '[':
				n++
				m = max(m, n)
			case '}', ']':
				n = max(n-1, 0)
			}
		}
		return m + 1, false
	}
	depth = 1
	values, junk := 0, false
	for i := 0; i < len(t); {
		c := t[i]
		if c == '{' || c == '[' {
			values++
			r := refReader{t: t, level: level}
			end, ok := r.container(i, 0)
			depth = max(depth, r.cur)
			if !ok {
				junk = true // the character at end is text again
			}
			i = end
			continue
		}
		if !isSpace(c) {
			junk = true
		}
		i++
	}
	return depth, !junk && values == 1
}

type refReader struct {
	t     []byte
	level int
	cur   int // the depth the value reached
}

func (r *refReader) ws(i int) int {
	for i < len(r.t) && isSpace(r.t[i]) {
		i++
	}
	return i
}

// container reads the array or object at i inside open others: the index after it (ok), or
// of the character that cannot continue it.
func (r *refReader) container(i, open int) (int, bool) {
	open++
	r.cur = max(r.cur, open)
	obj := r.t[i] == '{'
	closer := byte(']')
	if obj {
		closer = '}'
	}
	i = r.ws(i + 1)
	if i < len(r.t) && r.t[i] == closer {
		return i + 1, true
	}
	for {
		var ok bool
		if obj {
			if i >= len(r.t) || r.t[i] != '"' {
				return i, false
			}
			if i, ok = r.str(i, open); !ok {
				return i, false
			}
			if i = r.ws(i); i >= len(r.t) || r.t[i] != ':' {
				return i, false
			}
			i = r.ws(i + 1)
		}
		if i, ok = r.value(i, open); !ok {
			return i, false
		}
		if i = r.ws(i); i >= len(r.t) {
			return i, false
		}
		switch r.t[i] {
		case ',':
			i = r.ws(i + 1)
			continue
		case closer:
			return i + 1, true
		}
		return i, false
	}
}

func (r *refReader) value(i, open int) (int, bool) {
	if i >= len(r.t) {
		return i, false
	}
	switch c := r.t[i]; {
	case c == '{' || c == '[':
		return r.container(i, open)
	case c == '"':
		return r.str(i, open)
	case c == '-' || (c >= '0' && c <= '9'):
		r.cur = max(r.cur, open+1)
		return r.number(i)
	case c == 't' || c == 'f' || c == 'n':
		r.cur = max(r.cur, open+1)
		lit := map[byte]string{'t': "true", 'f': "false", 'n': "null"}[c]
		for k := range len(lit) {
			if i+k >= len(r.t) || r.t[i+k] != lit[k] {
				return i + k, false
			}
		}
		return i + len(lit), true
	}
	return i, false
}

// number reads a number by RFC 8259's grammar: where it ends, and whether it is complete
// there.
func (r *refReader) number(i int) (int, bool) {
	t := r.t
	digits := func(i int) int {
		for i < len(t) && t[i] >= '0' && t[i] <= '9' {
			i++
		}
		return i
	}
	if t[i] == '-' {
		i++
	}
	switch {
	case i < len(t) && t[i] == '0':
		i++
	case i < len(t) && t[i] >= '1' && t[i] <= '9':
		i = digits(i)
	default:
		return i, false
	}
	if i < len(t) && t[i] == '.' {
		if i++; i >= len(t) || t[i] < '0' || t[i] > '9' {
			return i, false
		}
		i = digits(i)
	}
	if i < len(t) && (t[i] == 'e' || t[i] == 'E') {
		if i++; i < len(t) && (t[i] == '+' || t[i] == '-') {
			i++
		}
		if i >= len(t) || t[i] < '0' || t[i] > '9' {
			return i, false
		}
		i = digits(i)
	}
	return i, true
}

// str reads the string at i: its text, decoded, counts one level down, also when the
// string breaks off (at a control character, a bad escape or the end).
func (r *refReader) str(i, open int) (int, bool) {
	t := r.t
	var dec []byte
	count := func() {
		d, _ := refDepth(dec, r.level+1)
		r.cur = max(r.cur, open+d)
	}
	for j := i + 1; ; {
		if j >= len(t) {
			count()
			return j, false
		}
		switch c := t[j]; {
		case c == '"':
			count()
			return j + 1, true
		case c < 0x20:
			count()
			return j, false
		case c == '\\':
			if j+1 >= len(t) {
				count()
				return j + 1, false
			}
			switch e := t[j+1]; e {
			case '"', '\\', '/':
				dec = append(dec, e)
			case 'b':
				dec = append(dec, '\b')
			case 'f':
				dec = append(dec, '\f')
			case 'n':
				dec = append(dec, '\n')
			case 'r':
				dec = append(dec, '\r')
			case 't':
				dec = append(dec, '\t')
			case 'u':
				var v rune
				for k := 2; k < 6; k++ {
					if j+k >= len(t) || unhex(t[j+k]) < 0 {
						count()
						return j + k, false
					}
					v = v<<4 | rune(unhex(t[j+k]))
				}
				dec = append(dec, asciiOf(v))
				j += 6
				continue
			default:
				count()
				return j + 1, false
			}
			j += 2
		default:
			dec = append(dec, c)
			j++
		}
	}
}
