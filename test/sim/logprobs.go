package sim

import (
	"math"
	"strconv"
)

// Deterministic logprobs (see the package doc, "Logprobs").
//
// Token i of an answer comes from a simulated next-token distribution over the vocabulary
// (len(vocab) tokens, the sampled one the most probable): geometric in the rank r,
// p_r ∝ e^(−s·r), with a sharpness s drawn from the answer's hash. Uncertainty comes in
// stretches, as a real model's does on a hard phrase: every stretch of 8 tokens draws a
// base sharpness in [0.3, 20], e^(ln 0.3 + √u·ln(20/0.3)) for u uniform (median 5.9, a
// sampled token of probability 0.997; one stretch in 12 below 1, under 0.63), each token a
// jitter of ×[0.71, 1.41] around it,
// and the server's LogprobTemperature divides it (above 1: flatter distributions, a model
// less sure of itself). The alternatives after the sampled token are other vocabulary
// words, distinct, in a hash-chosen order.

const (
	lpStretch       = 8    // tokens that share a base sharpness
	lpSharpMin      = 0.3  // base sharpness range: e^(ln(min) + √u·ln(max/min)), u uniform
	lpSharpMax      = 20.0 //
	lpMaxTop        = 20   // the most top_logprobs a request may ask for (vLLM's default max_logprobs)
	lpSeedSalt      = 0x6c6f6770726f6273
	lpAltStep       = 7 // coprime with len(vocab) (191, a prime): the walk visits every word
	defaultLogprobT = 1.0
)

// lpToken is one token's simulated distribution: the sharpness, and the hash that orders
// its alternatives.
type lpToken struct {
	s    float64 // sharpness after the server's temperature
	alts uint64
}

// logprobToken returns the distribution of token i of the answer seeded by seed.
func logprobToken(seed uint64, i int, temperature float64) lpToken {
	u := func(x uint64) float64 { return float64(mix64(x)>>11) / (1 << 53) }
	base := lpSharpMin * math.Exp(math.Sqrt(u(seed^uint64(i/lpStretch)*0x9e3779b97f4a7c15))*math.Log(lpSharpMax/lpSharpMin))
	jitter := math.Exp((u(seed^0x5bd1e995^uint64(i)*0xc2b2ae3d27d4eb4f) - 0.5) * math.Ln2)
	return lpToken{s: base * jitter / temperature, alts: mix64(seed ^ uint64(i) ^ 0x27d4eb2f165667c5)}
}

// logprob is the log probability of rank r: geometric over the vocabulary,
// log((1−e^−s)·e^(−s·r) / (1−e^(−s·V))).
func (t lpToken) logprob(r int) float64 {
	v := float64(len(vocab))
	return -t.s*float64(r) + math.Log(-math.Expm1(-t.s)) - math.Log(-math.Expm1(-t.s*v))
}

// altIter yields the alternatives of a token after the sampled one, in rank order: the
// vocabulary words other than the sampled one, from a hash-chosen start.
type altIter struct {
	start, k int
	sampled  string
}

func (t lpToken) altIter(sampled string) altIter {
	return altIter{start: int(t.alts % uint64(len(vocab))), sampled: sampled}
}

func (a *altIter) next() string {
	for {
		a.k++
		if w := vocab[(a.start+a.k*lpAltStep)%len(vocab)]; w != a.sampled {
			return w
		}
	}
}

// appendLogprobValue appends a logprob as vLLM writes one: a float32 widened to a Python
// float (-0.31326165795326233), floored at -9999.
func appendLogprobValue(b []byte, v float64) []byte {
	v = max(v, -9999)
	return strconv.AppendFloat(b, float64(float32(v)), 'g', -1, 64)
}

// appendTokenBytes appends a token's UTF-8 bytes as a JSON array of numbers.
func appendTokenBytes(b []byte, space bool, word string) []byte {
	b = append(b, '[')
	if space {
		b = append(b, "32"...)
	}
	for i := 0; i < len(word); i++ {
		if space || i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(word[i]), 10)
	}
	return append(b, ']')
}

// appendChatEntry appends {"token","logprob","bytes"} (without its closing brace).
func appendChatEntry(b []byte, space bool, word string, lp float64) []byte {
	b = append(b, `{"token":"`...)
	if space {
		b = append(b, ' ')
	}
	b = append(b, word...)
	b = append(b, `","logprob":`...)
	b = appendLogprobValue(b, lp)
	b = append(b, `,"bytes":`...)
	return appendTokenBytes(b, space, word)
}

// lpWriter builds the logprobs of one answer's tokens, chat's or completions' shape.
type lpWriter struct {
	k       int // top_logprobs (chat) or logprobs (completions) asked
	chat    bool
	temp    float64
	seed    uint64
	n       int // tokens written into the current buffer
	toks    []byte
	offs    []byte // completions: text_offset, token_logprobs, tokens, top_logprobs
	lps     []byte
	tops    []byte
	textOff int // completions: the answer's text so far, in characters
}

// token adds token i (its text as appended: a leading space unless it is the first).
func (w *lpWriter) token(i int, text []byte) {
	space := len(text) > 0 && text[0] == ' '
	word := string(text)
	if space {
		word = word[1:]
	}
	d := logprobToken(w.seed, i, w.temp)
	lp0 := d.logprob(0)
	if w.n > 0 {
		w.toks = append(w.toks, ',')
		if !w.chat {
			w.offs = append(w.offs, ',')
			w.lps = append(w.lps, ',')
			w.tops = append(w.tops, ',')
		}
	}
	w.n++
	if w.chat {
		w.toks = appendChatEntry(w.toks, space, word, lp0)
		w.toks = append(w.toks, `,"top_logprobs":[`...)
		it := d.altIter(word)
		for r := range w.k {
			if r > 0 {
				w.toks = append(w.toks, ',')
			}
			alt := word
			if r > 0 {
				alt = it.next()
			}
			w.toks = appendChatEntry(w.toks, space, alt, d.logprob(r))
			w.toks = append(w.toks, '}')
		}
		w.toks = append(w.toks, "]}"...)
		return
	}
	w.offs = strconv.AppendInt(w.offs, int64(w.textOff), 10)
	w.textOff += len(text)
	w.lps = appendLogprobValue(w.lps, lp0)
	w.toks = append(w.toks, '"')
	w.toks = append(w.toks, text...)
	w.toks = append(w.toks, '"')
	w.tops = append(w.tops, '{')
	it := d.altIter(word)
	for r := range max(w.k, 1) { // logprobs 0: the sampled token alone, as vLLM sends it
		if r > 0 {
			w.tops = append(w.tops, ',')
		}
		w.tops = append(w.tops, '"')
		if space {
			w.tops = append(w.tops, ' ')
		}
		if r == 0 {
			w.tops = append(w.tops, word...)
		} else {
			w.tops = append(w.tops, it.next()...)
		}
		w.tops = append(w.tops, `":`...)
		w.tops = appendLogprobValue(w.tops, d.logprob(r))
	}
	w.tops = append(w.tops, '}')
}

// appendTo appends the logprobs object of the tokens added since the last call and starts
// afresh (a stream sends each chunk's own); null when w is nil or holds none.
func (w *lpWriter) appendTo(b []byte) []byte {
	if w == nil || w.n == 0 {
		return append(b, "null"...)
	}
	if w.chat {
		b = append(b, `{"content":[`...)
		b = append(b, w.toks...)
		b = append(b, "]}"...)
	} else {
		b = append(b, `{"text_offset":[`...)
		b = append(b, w.offs...)
		b = append(b, `],"token_logprobs":[`...)
		b = append(b, w.lps...)
		b = append(b, `],"tokens":[`...)
		b = append(b, w.toks...)
		b = append(b, `],"top_logprobs":[`...)
		b = append(b, w.tops...)
		b = append(b, "]}"...)
	}
	w.n = 0
	w.toks, w.offs, w.lps, w.tops = w.toks[:0], w.offs[:0], w.lps[:0], w.tops[:0]
	return b
}

// appendTokensLP is appendTokens that also adds each token's logprobs to w (when not nil).
func (c *choice) appendTokensLP(b []byte, w *lpWriter, from, to int) []byte {
	if w == nil {
		return c.appendTokens(b, from, to)
	}
	for i := from; i < to; i++ {
		start := len(b)
		b = c.text.next(b)
		w.token(c.text.i-1, b[start:])
	}
	return b
}
