package openai

import (
	"math"
	"strconv"
)

// Log probabilities as signals of the model's confidence.
//
// Where the answers carry them (the client asked, or the gateway asked and strips them again):
//
//	chat         choices[i].logprobs {content: [token], refusal: [token] | null}
//	             token: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}
//	completions  choices[i].logprobs {tokens: [..], token_logprobs: [..], top_logprobs: [{token: logprob}], text_offset: [..]}
//	Responses    stream: response.output_text.delta's logprobs [token] (token: {token, logprob, top_logprobs: [{token, logprob}]});
//	             body: output[i].content[j].logprobs of its output_text parts
//
// A chat or completions answer has the same shape streamed (one chunk's choices) or not (the
// body's choices); a choice without logprobs says "logprobs": null. The Responses API sends
// logprobs only when the request names "message.output_text.logprobs" in include (with
// top_logprobs for the alternatives); its delta events then carry their tokens', and its
// output_text.done event, output_item.done item and terminal response repeat all of them, so
// a stream is read from its deltas only. Without them a Responses answer says "logprobs": [].
//
// Per token, from the alternatives given (its top_logprobs, 0 to 20 of them):
//
//   - Entropy, in nats, of the alternatives' probabilities renormalised to sum to 1:
//     H_k = −Σ q_i ln q_i with q_i = p_i / Σ_j p_j. It is a lower bound of the entropy H of
//     the model's whole next-token distribution whenever the alternatives are its k most
//     probable tokens: with S the alternatives' mass and every other token at most as
//     probable as the least of them (p ≤ S/k), H ≥ S·H_k + (1−S)·ln(k/S) − S ln S ≥ H_k
//     (since H_k ≤ ln k). The bound is tight when the alternatives hold nearly all the mass,
//     which a confident token's do, and caps at ln k: a flat distribution over many tokens
//     reads as ln k (1.61 nats for k = 5). vLLM lists the sampled token first, then the most
//     probable others, so where the sampled token is outside the top k the set is not quite
//     the top k (and the bound may not hold for that token).
//   - Margin: the difference of the two most probable alternatives' probabilities,
//     p_(1) − p_(2), not renormalised: both are exact probabilities whatever k, and the
//     difference lies in [0, 1] (a difference of logprobs is unbounded where p_(2) is tiny,
//     and vLLM floors logprobs at −9999).
//
// A token given with fewer than two alternatives (top_logprobs 0 or 1) has neither: Alts < 2.

// TokenLogprob is what one output token's logprobs say of the model's confidence.
type TokenLogprob struct {
	Choice  int     // the choice's index (0 for the Responses API)
	Logprob float64 // the sampled token's log probability, NaN when not given
	// Alts is the number of alternatives given with a numeric logprob.
	Alts int
	// Entropy (nats) and Margin (probability difference), as the file's comment defines
	// them; both 0 when Alts < 2.
	Entropy, Margin float64
}

// HasAlts reports whether the token came with the two alternatives or more that Entropy and
// Margin need.
func (t TokenLogprob) HasAlts() bool { return t.Alts >= 2 }

// LogprobScanner reads the logprobs of answers without allocating (in steady state) and
// keeps where the last scanned data's logprobs values are, to strip them. The zero value is
// ready; one scanner serves one goroutine.
type LogprobScanner struct {
	spans []span // the non-null choices[i].logprobs values of the last scan, in order
}

type span struct{ start, end int }

// ScanChunk reads the logprobs of one stream event's data: a chat or completions chunk
// (choices[i].logprobs), or a Responses API event (the logprobs of
// response.output_text.delta; other events repeat the deltas' and are not read). It calls
// visit (which may be nil) for every output token in order and returns how many there were.
// Data that is not a JSON object gives 0; a syntax error ends the scan where it is.
func (s *LogprobScanner) ScanChunk(data []byte, visit func(TokenLogprob)) int {
	return s.scan(data, visit, false)
}

// ScanBody reads the logprobs of a whole non-streaming answer: a chat or completions body
// (choices[i].logprobs), or a Responses body (output[i].content[j].logprobs).
func (s *LogprobScanner) ScanBody(body []byte, visit func(TokenLogprob)) int {
	return s.scan(body, visit, true)
}

// Strippable reports whether the last scan found a chat or completions choice whose
// logprobs are not null.
func (s *LogprobScanner) Strippable() bool { return len(s.spans) > 0 }

// AppendStripped appends to dst the data of the last scan with every non-null
// choices[i].logprobs value replaced by null, as the answer reads when logprobs were not
// asked for; every other byte is kept. data must be what was scanned last.
func (s *LogprobScanner) AppendStripped(dst, data []byte) []byte {
	last := 0
	for _, sp := range s.spans {
		if sp.start < last || sp.end > len(data) {
			break // not the data scanned
		}
		dst = append(dst, data[last:sp.start]...)
		dst = append(dst, "null"...)
		last = sp.end
	}
	return append(dst, data[last:]...)
}

func (s *LogprobScanner) scan(data []byte, visit func(TokenLogprob), body bool) int {
	s.spans = s.spans[:0]
	c := cur{b: data}
	if c.peek() != '{' {
		return 0
	}
	c.i++
	n := 0
	var (
		delta   bool // Responses: the event is response.output_text.delta
		lpStart = -1 // Responses: the event's own "logprobs" value
		lpEnd   int
	)
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			break
		}
		var kb [16]byte
		switch string(keyText(key, esc, kb[:])) {
		case "choices":
			n += s.choices(&c, visit)
		case "type":
			delta = false
			if c.peek() == '"' {
				if raw, esc, ok := c.str(); ok {
					delta = equalString(raw, esc, "response.output_text.delta")
				}
				continue
			}
			c.skip(nil)
		case "logprobs":
			at := c.i
			if c.skip(nil); c.ok() {
				lpStart, lpEnd = at, c.i
			}
		case "output":
			if body {
				n += responsesOutput(&c, visit)
				continue
			}
			c.skip(nil)
		default:
			c.skip(nil)
		}
	}
	if delta && !body && lpStart >= 0 && lpStart < lpEnd {
		v := cur{b: data[:lpEnd], i: lpStart}
		n += tokenList(&v, 0, visit)
	}
	return n
}

// choices reads a choices array: each choice's logprobs, once its index is known (vLLM sends
// index first, but a choice's members may come in any order).
func (s *LogprobScanner) choices(c *cur, visit func(TokenLogprob)) int {
	if !c.enter('[') {
		return 0
	}
	n := 0
	for first, pos := true, 0; c.elem(&first); pos++ {
		if c.peek() != '{' {
			c.skip(nil)
			continue
		}
		c.i++
		index, haveIndex, start, end := pos, false, -1, 0
		for f2 := true; ; {
			key, esc, ok := c.member(&f2)
			if !ok {
				break
			}
			switch {
			case equalString(key, esc, "index"):
				if v := readCount(c); v >= 0 && v <= MaxN {
					index = v
				}
				haveIndex = true
			case equalString(key, esc, "logprobs"):
				if c.peek() == 'n' {
					c.skip(nil)
					continue
				}
				at := c.i
				if haveIndex && c.peek() == '{' {
					// The index came first (as vLLM sends it): read the value in place.
					n += choiceLogprobs(c, index, visit)
					if c.ok() {
						s.spans = append(s.spans, span{at, c.i})
					}
					start = -1
					continue
				}
				if c.skip(nil); c.ok() {
					start, end = at, c.i
				}
			default:
				c.skip(nil)
			}
		}
		if start < 0 {
			continue
		}
		s.spans = append(s.spans, span{start, end})
		v := cur{b: c.b[:end], i: start}
		n += choiceLogprobs(&v, index, visit)
	}
	return n
}

// choiceLogprobs reads one choice's logprobs object: chat's content and refusal token lists,
// or completions' token_logprobs and top_logprobs, read in step.
func choiceLogprobs(c *cur, choice int, visit func(TokenLogprob)) int {
	if c.peek() != '{' {
		return 0
	}
	c.i++
	n := 0
	tokStart, topStart := -1, -1 // completions: the two parallel arrays
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			break
		}
		var kb [16]byte
		switch string(keyText(key, esc, kb[:])) {
		case "content", "refusal":
			n += tokenList(c, choice, visit)
		case "token_logprobs":
			tokStart = c.i
			c.skip(nil)
		case "top_logprobs":
			topStart = c.i
			c.skip(nil)
		default:
			c.skip(nil)
		}
	}
	if (tokStart >= 0 || topStart >= 0) && c.ok() {
		n += completionLogprobs(c.b, tokStart, topStart, choice, visit)
	}
	return n
}

// completionLogprobs reads completions' token_logprobs (numbers, null for an echoed prompt's
// first token) and top_logprobs (objects of token: logprob, or null) in step: the i-th of
// each is the i-th token's. Either may be missing (-1); the longer one sets the count.
func completionLogprobs(b []byte, tokStart, topStart, choice int, visit func(TokenLogprob)) int {
	tok, top := cur{b: b, i: tokStart}, cur{b: b, i: topStart}
	var tokOn, topOn, tokFirst, topFirst = tokStart >= 0 && tok.peek() == '[', topStart >= 0 && top.peek() == '[', true, true
	if tokOn {
		tok.i++
	}
	if topOn {
		top.i++
	}
	n := 0
	for {
		tokOn = tokOn && tok.elem(&tokFirst)
		topOn = topOn && top.elem(&topFirst)
		if !tokOn && !topOn {
			return n
		}
		t := TokenLogprob{Choice: choice, Logprob: math.NaN()}
		if tokOn {
			if v, ok := readLogprob(&tok); ok {
				t.Logprob = v
			}
		}
		if topOn {
			var a alts
			a.reset()
			if top.peek() == '{' {
				top.i++
				for f2 := true; ; {
					if _, _, ok := top.member(&f2); !ok {
						break
					}
					if v, ok := readLogprob(&top); ok {
						a.add(v)
					}
				}
			} else {
				top.skip(nil)
			}
			a.fill(&t)
		}
		n++
		if visit != nil {
			visit(t)
		}
	}
}

// tokenList reads a list of token objects ({token, logprob, bytes, top_logprobs}: chat's
// content and refusal, the Responses API's logprobs) and visits each token.
func tokenList(c *cur, choice int, visit func(TokenLogprob)) int {
	if !c.enter('[') {
		return 0
	}
	n := 0
	for first := true; c.nextObject(&first); {
		t := TokenLogprob{Choice: choice, Logprob: math.NaN()}
		var a alts
		a.reset()
		for f2 := true; ; {
			key, esc, ok := c.member(&f2)
			if !ok {
				break
			}
			switch {
			case equalString(key, esc, "logprob"):
				if v, ok := readLogprob(c); ok {
					t.Logprob = v
				}
			case equalString(key, esc, "top_logprobs"):
				a.reset()
				topList(c, &a)
			default:
				skipBytes(c)
			}
		}
		a.fill(&t)
		n++
		if visit != nil {
			visit(t)
		}
	}
	return n
}

// topList reads a token's top_logprobs ([{token, logprob, bytes}]) into a.
func topList(c *cur, a *alts) {
	if !c.enter('[') {
		return
	}
	for first := true; c.nextObject(&first); {
		for f2 := true; ; {
			key, esc, ok := c.member(&f2)
			if !ok {
				break
			}
			if equalString(key, esc, "logprob") {
				if v, ok := readLogprob(c); ok {
					a.add(v)
				}
				continue
			}
			skipBytes(c)
		}
	}
}

// skipBytes skips the value at the cursor, fast when it is an array of small integers (a
// token's "bytes", most of what a logprobs entry weighs): digits, commas and spaces up to
// the closing bracket. Anything else is skipped by the strict scanner.
func skipBytes(c *cur) {
	if c.peek() == '[' {
		b := c.b
	scan:
		for j := c.i + 1; j < len(b); j++ {
			switch ch := b[j]; {
			case ch >= '0' && ch <= '9', ch == ',', ch == ' ':
			case ch == ']' && j > c.i+1 && b[j-1] >= '0' && b[j-1] <= '9':
				c.i = j + 1
				return
			default:
				break scan
			}
		}
	}
	c.skip(nil)
}

// responsesOutput reads a Responses body's output items: the logprobs of their content
// parts (output_text parts carry them; other parts and items have none).
func responsesOutput(c *cur, visit func(TokenLogprob)) int {
	if !c.enter('[') {
		return 0
	}
	n := 0
	for first := true; c.nextObject(&first); {
		for f2 := true; ; {
			key, esc, ok := c.member(&f2)
			if !ok {
				break
			}
			if !equalString(key, esc, "content") {
				c.skip(nil)
				continue
			}
			if !c.enter('[') {
				continue
			}
			for f3 := true; c.nextObject(&f3); {
				for f4 := true; ; {
					key, esc, ok := c.member(&f4)
					if !ok {
						break
					}
					if equalString(key, esc, "logprobs") {
						n += tokenList(c, 0, visit)
						continue
					}
					c.skip(nil)
				}
			}
		}
	}
	return n
}

// readLogprob reads a logprob (a JSON number) at the cursor; anything else is skipped. A
// positive value (not a log probability) counts as 0; one beyond float64's range as what
// ParseFloat rounds it to (−Inf: probability 0).
func readLogprob(c *cur) (float64, bool) {
	if ch := c.peek(); ch != '-' && (ch < '0' || ch > '9') {
		c.skip(nil)
		return 0, false
	}
	s, ok := c.number()
	if !ok {
		return 0, false
	}
	if v, ok := parseDecimal(s); ok {
		return min(v, 0), true
	}
	// A number of up to 32 bytes converts on the stack: the conversion does not escape
	// (ParseFloat copies the text into its error, when it makes one).
	v, err := strconv.ParseFloat(string(s), 64)
	if err != nil && !math.IsInf(v, 0) && v != 0 {
		return 0, false
	}
	return min(v, 0), true
}

// pow10 are the powers of ten a float64 holds exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
	1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// parseDecimal is the fast path of readLogprob for the numbers model servers write
// (-0.31326165795326233, -1.2e-05, -9999.0): the first 15 significant digits as an integer
// m, so that m and the power of ten are exact and m/10^k is m/10^k correctly rounded. The
// digits past the 15th are dropped, an error below 10^-14 relative, far finer than what
// entropy and margin are read for. It reports false for a number it cannot do exactly
// this way (an exponent out of reach), which ParseFloat then reads. s is a valid JSON
// number.
func parseDecimal(s []byte) (float64, bool) {
	const maxDigits = 15
	i, neg := 0, false
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	var m uint64
	nd, exp := 0, 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		switch {
		case m == 0 && s[i] == '0':
		case nd < maxDigits:
			m = m*10 + uint64(s[i]-'0')
			nd++
		default:
			exp++
		}
	}
	if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			switch {
			case m == 0 && s[i] == '0':
				exp--
			case nd < maxDigits:
				m = m*10 + uint64(s[i]-'0')
				nd++
				exp--
			}
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		e := 0
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			if e > 1000 {
				return 0, false
			}
			e = e*10 + int(s[i]-'0')
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	if i != len(s) {
		return 0, false
	}
	v := float64(m)
	switch {
	case m == 0:
	case exp < 0 && exp >= -len(pow10)+1:
		v /= pow10[-exp]
	case exp >= 0 && exp < len(pow10):
		v *= pow10[exp]
	default:
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

// alts accumulates a token's alternatives in one pass: the entropy of their renormalised
// probabilities by a running log-sum-exp (m the largest logprob so far, s0 = Σ e^(l−m),
// s1 = Σ e^(l−m)·(l−m), rescaled when m grows; H = ln s0 − s1/s0), and the two largest
// logprobs for the margin.
type alts struct {
	n      int
	m      float64
	s0, s1 float64
	l1, l2 float64
}

func (a *alts) reset() { *a = alts{l1: math.Inf(-1), l2: math.Inf(-1)} }

func (a *alts) add(l float64) {
	a.n++
	switch {
	case l > a.l1:
		a.l1, a.l2 = l, a.l1
	case l > a.l2:
		a.l2 = l
	}
	switch {
	case math.IsInf(l, -1):
		// probability 0: no part of either sum
	case a.s0 == 0:
		a.m, a.s0, a.s1 = l, 1, 0
	case l > a.m:
		d := a.m - l // < 0
		r := math.Exp(d)
		a.s1 = r * (a.s1 + d*a.s0)
		a.s0 = r*a.s0 + 1
		a.m = l
	default:
		d := l - a.m
		w := math.Exp(d)
		a.s0 += w
		a.s1 += w * d
	}
}

// fill sets t's Alts, Entropy and Margin.
func (a *alts) fill(t *TokenLogprob) {
	t.Alts = a.n
	if a.n < 2 {
		return
	}
	if a.s0 > 0 {
		t.Entropy = max(math.Log(a.s0)-a.s1/a.s0, 0)
	}
	t.Margin = max(math.Exp(a.l1)-math.Exp(a.l2), 0)
}
