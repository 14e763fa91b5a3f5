package fault

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// This file edits JSON in place: the bytes outside what an edit touches are kept exactly
// (key order, spacing), so a fault changes only what it says it changes.

const maxDepth = 128

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index past the string starting at b[i] == '"', or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns the index past the value starting at b[i] (no leading space), or -1.
func skipValue(b []byte, i, depth int) int {
	if i >= len(b) || depth > maxDepth {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		close := byte('}')
		if b[i] == '[' {
			close = ']'
		}
		j := skipWS(b, i+1)
		if j < len(b) && b[j] == close {
			return j + 1
		}
		for {
			if close == '}' {
				if j >= len(b) || b[j] != '"' {
					return -1
				}
				if j = skipString(b, j); j < 0 {
					return -1
				}
				if j = skipWS(b, j); j >= len(b) || b[j] != ':' {
					return -1
				}
				j = skipWS(b, j+1)
			}
			if j = skipValue(b, j, depth+1); j < 0 {
				return -1
			}
			j = skipWS(b, j)
			if j >= len(b) {
				return -1
			}
			if b[j] == close {
				return j + 1
			}
			if b[j] != ',' {
				return -1
			}
			j = skipWS(b, j+1)
		}
	default:
		j := i
		for j < len(b) {
			c := b[j]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				break
			}
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// member is one member of an object: b[start:end] is `"key" : value`.
type member struct {
	start, keyEnd, valStart, end int
}

// members lists the members of the object b (which must start with '{'), or false.
func members(b []byte, dst []member) ([]member, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	j := skipWS(b, i+1)
	if j < len(b) && b[j] == '}' {
		return dst, true
	}
	for {
		var m member
		if j >= len(b) || b[j] != '"' {
			return nil, false
		}
		m.start = j
		if j = skipString(b, j); j < 0 {
			return nil, false
		}
		m.keyEnd = j
		if j = skipWS(b, j); j >= len(b) || b[j] != ':' {
			return nil, false
		}
		m.valStart = skipWS(b, j+1)
		if j = skipValue(b, m.valStart, 1); j < 0 {
			return nil, false
		}
		m.end = j
		dst = append(dst, m)
		if j = skipWS(b, j); j >= len(b) {
			return nil, false
		}
		if b[j] == '}' {
			return dst, true
		}
		if b[j] != ',' {
			return nil, false
		}
		j = skipWS(b, j+1)
	}
}

// elements lists the [start, end) spans of the array b's elements, or false.
func elements(b []byte, out [][2]int) ([][2]int, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	j := skipWS(b, i+1)
	if j < len(b) && b[j] == ']' {
		return out, true
	}
	for {
		e := skipValue(b, j, 1)
		if e < 0 {
			return nil, false
		}
		out = append(out, [2]int{j, e})
		if j = skipWS(b, e); j >= len(b) {
			return nil, false
		}
		if b[j] == ']' {
			return out, true
		}
		if b[j] != ',' {
			return nil, false
		}
		j = skipWS(b, j+1)
	}
}

// keyIs reports whether the raw key (with its quotes) is name.
func keyIs(raw []byte, name string) bool {
	if len(raw) < 2 {
		return false
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 {
		return string(in) == name
	}
	var s string
	return json.Unmarshal(raw, &s) == nil && s == name
}

// seg is one step of a path: a key, and whether its value is an array whose every element
// the rest of the path applies to ("key[]").
type seg struct {
	key  string
	each bool
}

// parsePath parses "choices[].delta.tool_calls[].function.arguments".
func parsePath(s string) ([]seg, error) {
	if s == "" {
		return nil, errors.New("empty path")
	}
	parts := strings.Split(s, ".")
	out := make([]seg, 0, len(parts))
	for _, p := range parts {
		var sg seg
		if k, ok := strings.CutSuffix(p, "[]"); ok {
			sg.key, sg.each = k, true
		} else {
			sg.key = p
		}
		if sg.key == "" || strings.ContainsAny(sg.key, "[]\"\\") {
			return nil, fmt.Errorf("invalid path %q: each step is a key, optionally followed by [] (e.g. choices[].delta.content)", s)
		}
		out = append(out, sg)
	}
	if out[len(out)-1].each {
		return nil, fmt.Errorf("invalid path %q: the last step names a field, not [] elements", s)
	}
	return out, nil
}

// leafFn appends the replacement of the member m of obj (nothing to remove it) and reports
// whether it changed anything.
type leafFn func(dst, obj []byte, m member) ([]byte, bool)

// editPath applies fn to the members at path in the JSON value v. It returns v itself when
// nothing changed.
func editPath(v []byte, path []seg, fn leafFn) ([]byte, bool) {
	var buf [16]member
	ms, ok := members(v, buf[:0])
	if !ok {
		return v, false
	}
	var out []byte
	changed := false
	last := 0 // v[last:] not yet copied; members are copied as they are up to the changed one
	for i, m := range ms {
		if !keyIs(v[m.start:m.keyEnd], path[0].key) {
			continue
		}
		var repl []byte
		var ch bool
		switch {
		case len(path) == 1:
			repl, ch = fn(nil, v, m)
		case path[0].each:
			val := v[m.valStart:m.end]
			nv, c := editEach(val, path[1:], fn)
			if c {
				repl = append(append([]byte(nil), v[m.start:m.valStart]...), nv...)
				ch = true
			}
		default:
			val := v[m.valStart:m.end]
			nv, c := editPath(val, path[1:], fn)
			if c {
				repl = append(append([]byte(nil), v[m.start:m.valStart]...), nv...)
				ch = true
			}
		}
		if !ch {
			continue
		}
		changed = true
		if out == nil {
			out = make([]byte, 0, len(v)+16)
		}
		if len(repl) == 0 {
			// Removed: drop the member and one comma next to it.
			switch {
			case i+1 < len(ms):
				out = append(out, v[last:m.start]...)
				last = ms[i+1].start
			case i > 0:
				// The last member: cut back to the comma before it.
				out = append(out, v[last:m.start]...)
				out = bytes.TrimRight(out, " \t\r\n")
				out = bytes.TrimSuffix(out, []byte(","))
				last = m.end
			default:
				out = append(out, v[last:m.start]...)
				last = m.end
			}
		} else {
			out = append(out, v[last:m.start]...)
			out = append(out, repl...)
			last = m.end
		}
	}
	if !changed {
		return v, false
	}
	return append(out, v[last:]...), true
}

// editEach applies the rest of a path to every element of the array v.
func editEach(v []byte, path []seg, fn leafFn) ([]byte, bool) {
	var buf [8][2]int
	els, ok := elements(v, buf[:0])
	if !ok {
		return v, false
	}
	var out []byte
	last := 0
	for _, e := range els {
		nv, ch := editPath(v[e[0]:e[1]], path, fn)
		if !ch {
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(v)+16)
		}
		out = append(out, v[last:e[0]]...)
		out = append(out, nv...)
		last = e[1]
	}
	if out == nil {
		return v, false
	}
	return append(out, v[last:]...), true
}

// removeLeaf is the edit that removes the member (drift's remove, drop's usage).
func removeLeaf(dst, obj []byte, m member) ([]byte, bool) { return dst, true }
