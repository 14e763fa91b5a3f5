package sim

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// toolCall is a planned tool-call answer. Token 0 is the call header (id, name); tokens
// 1..n-1 are fragments of the arguments string of at most 4 bytes each (cut on rune
// boundaries), the way a model streams them.
type toolCall struct {
	id     string
	name   string
	args   string
	cuts   []int // cuts[k] is the end offset in args of fragment k
	n      int   // tokens to produce: 1 + fragments, capped by max_tokens
	finish string
}

const toolFragmentBytes = 4

func newToolCall(h uint64, name string, params json.RawMessage, maxTokens int) *toolCall {
	hn := newHasher()
	hn.u64(h)
	hn.str(name)
	seed := hn.sum()
	args := genArguments(params, seed)
	tc := &toolCall{
		id:   "call_" + strconv.FormatUint(seed|1<<63, 16)[:16],
		name: name,
		args: args,
	}
	for off := 0; off < len(args); {
		end := min(off+toolFragmentBytes, len(args))
		for end < len(args) && !utf8.RuneStart(args[end]) {
			end++
		}
		tc.cuts = append(tc.cuts, end)
		off = end
	}
	tc.n, tc.finish = 1+len(tc.cuts), "tool_calls"
	if tc.n > maxTokens {
		tc.n, tc.finish = maxTokens, "length"
	}
	return tc
}

// fragment returns the argument text of tokens [from, to) (token indexes, token 0 = header).
func (tc *toolCall) fragment(from, to int) string {
	from, to = max(from, 1), min(to, tc.n)
	if from >= to {
		return ""
	}
	start := 0
	if from >= 2 {
		start = tc.cuts[from-2]
	}
	return tc.args[start:tc.cuts[to-2]]
}

// emittedArgs returns the arguments as far as the answer goes (all of them unless cut by
// max_tokens).
func (tc *toolCall) emittedArgs() string { return tc.fragment(1, tc.n) }

// Argument generation from a JSON Schema. Only the structural keywords matter: type, enum,
// const, properties, required, items, anyOf/oneOf/allOf (first branch), minimum/maximum,
// exclusiveMinimum/exclusiveMaximum, minLength/maxLength, minItems/maxItems and a few
// string formats. $ref is not resolved (a string is produced).
const (
	schemaMaxDepth = 5
	schemaMaxItems = 16
)

func genArguments(params json.RawMessage, seed uint64) string {
	trimmed := bytes.TrimSpace(params)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return "{}"
	}
	var schema map[string]any
	if err := json.Unmarshal(trimmed, &schema); err != nil || schema == nil {
		return "{}" // not an object schema: an empty argument object
	}
	r := splitmix(seed)
	v := genValue(schema, &r, 0, "object")
	out, err := json.Marshal(v)
	if err != nil {
		return "{}"
	}
	return string(out)
}

func schemaType(m map[string]any, fallback string) string {
	switch t := m["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok && s != "null" {
				return s
			}
		}
		if len(t) > 0 {
			return "null"
		}
	}
	if _, ok := m["properties"]; ok {
		return "object"
	}
	if _, ok := m["items"]; ok {
		return "array"
	}
	return fallback
}

func num(m map[string]any, key string) (float64, bool) {
	f, ok := m[key].(float64)
	if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

func genValue(schema any, r *splitmix, depth int, fallback string) any {
	m, ok := schema.(map[string]any)
	if !ok {
		return vocab[r.intn(len(vocab))]
	}
	if c, ok := m["const"]; ok {
		return c
	}
	if e, ok := m["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	if _, typed := m["type"]; !typed {
		for _, k := range [...]string{"anyOf", "oneOf", "allOf"} {
			if alts, ok := m[k].([]any); ok && len(alts) > 0 && depth < 64 {
				return genValue(alts[0], r, depth+1, fallback)
			}
		}
	}
	switch schemaType(m, fallback) {
	case "object":
		obj := map[string]any{}
		props, _ := m["properties"].(map[string]any)
		if depth < schemaMaxDepth {
			for _, k := range slices.Sorted(maps.Keys(props)) {
				obj[k] = genValue(props[k], r, depth+1, "string")
			}
		}
		if req, ok := m["required"].([]any); ok {
			for _, k := range req {
				if ks, ok := k.(string); ok {
					if _, done := obj[ks]; !done {
						if ps, ok := props[ks]; ok {
							obj[ks] = genValue(ps, r, schemaMaxDepth, "string")
						} else {
							obj[ks] = vocab[r.intn(len(vocab))]
						}
					}
				}
			}
		}
		return obj
	case "array":
		n := 1
		if mi, ok := num(m, "minItems"); ok && mi > 1 {
			n = int(min(mi, schemaMaxItems))
		}
		if ma, ok := num(m, "maxItems"); ok && float64(n) > ma {
			n = max(int(ma), 0)
		}
		if depth >= schemaMaxDepth {
			n = min(n, 1)
		}
		arr := make([]any, 0, n)
		for range n {
			arr = append(arr, genValue(m["items"], r, depth+1, "string"))
		}
		return arr
	case "integer":
		lo, hi := numRange(m, true)
		return int64(lo) + int64(r.next()%uint64(int64(hi)-int64(lo)+1))
	case "number":
		lo, hi := numRange(m, false)
		if hi-lo >= 1 {
			return lo + float64(r.next()%uint64(hi-lo)) + 0.5
		}
		return lo
	case "boolean":
		return r.next()&1 == 1
	case "null":
		return nil
	default:
		return genString(m, r)
	}
}

// numRange returns the bounds to draw a number from; integer bounds are whole numbers.
func numRange(m map[string]any, integer bool) (lo, hi float64) {
	const limit = 1 << 50
	lo, hi = 0, 99
	hasLo, hasHi := false, false
	if v, ok := num(m, "minimum"); ok {
		lo, hasLo = v, true
	}
	if v, ok := num(m, "exclusiveMinimum"); ok {
		lo, hasLo = v+1, true
	}
	if v, ok := num(m, "maximum"); ok {
		hi, hasHi = v, true
	}
	if v, ok := num(m, "exclusiveMaximum"); ok {
		hi, hasHi = v-1, true
	}
	lo, hi = max(min(lo, limit), -limit), max(min(hi, limit), -limit)
	if integer {
		lo, hi = math.Ceil(lo), math.Floor(hi)
	}
	switch {
	case hasLo && !hasHi:
		hi = lo + 99
	case hasHi && !hasLo:
		lo = hi - 99
		if hi >= 0 && lo < 0 {
			lo = 0
		}
	}
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

func genString(m map[string]any, r *splitmix) string {
	var s string
	switch f, _ := m["format"].(string); f {
	case "date-time":
		s = "2024-01-02T03:04:05Z"
	case "date":
		s = "2024-01-02"
	case "time":
		s = "03:04:05Z"
	case "email":
		s = vocab[r.intn(len(vocab))] + "@example.com"
	case "uri", "url":
		s = "https://example.com/" + vocab[r.intn(len(vocab))]
	case "uuid":
		s = "6f1c2a9e-3b4d-4c5e-8f70-" + strconv.FormatUint(r.next()|1<<47, 16)[:12]
	default:
		s = vocab[r.intn(len(vocab))]
	}
	if mi, ok := num(m, "minLength"); ok {
		if n, have := int(min(mi, 4096)), utf8.RuneCountInString(s); have < n {
			s += strings.Repeat("x", n-have)
		}
	}
	if ma, ok := num(m, "maxLength"); ok && ma >= 0 && float64(utf8.RuneCountInString(s)) > ma {
		s = string([]rune(s)[:int(ma)])
	}
	return s
}
