package runaway

// The detector: degenerate repetition in one stream of text, found as the text arrives.
//
// Tokens. The text is cut into tokens as it is fed, whatever the pieces it comes in: a word
// (a run of ASCII letters, digits and '_' and of 2-byte UTF-8 characters: accented Latin,
// Greek, Cyrillic, Hebrew, Arabic), at most 32 bytes (a longer run is several tokens); a
// character of 3 or 4 bytes (CJK, Thai, emoji: scripts without spaces, where a character is
// about a model token); a run of one punctuation character or of line breaks, at most 8 long
// ("---" and "\n\n" are one token, a line of 80 '=' is 10). Spaces, tabs and carriage
// returns separate tokens and are none. These tokens follow the model's own within a small
// factor (a model token is a word or a piece of one), and no model's tokenizer is needed.
// A token is kept as a 32-bit hash plus two flags: a number (only digits), a word (letters).
//
// What is a loop. A loop of period p is a run of tokens each equal to the token p before it:
// the same p tokens generated again and again, from a short n-gram (p = 1: "the the the",
// "\n\n\n") to a paragraph regenerated (p up to max_period). The copies must be exact, token
// for token, with one exception: with counters on, a number may stand where the copy before
// had another number ("Step 7: … Step 8: …", an id that counts up), for at most a quarter of
// the run's tokens. Anything else that differs (a word changed, a line added) ends the run,
// and a new one has to start. White space never differs: it is no token.
//
// It fires when the run is long enough on both counts:
//
//	tokens   run ≥ (repeats − 1) × p      the block was generated repeats times (its first
//	                                      copy, before the run, included)
//	weight   Σ weight ≥ 4 × min_words     a word weighs 4, a number or punctuation 1, a
//	                                      number that changed (a counter) 0; a run with a
//	                                      counter needs twice the weight
//
// The weight keeps structure from reading as a loop: a table's or a grid's frame, a matrix of
// zeros, a CSV of numbers, closing brackets, a row of "| --- |" are punctuation and numbers,
// which repeat in ordinary answers, and must run four times as long as prose to count.
//
// Bound. A loop's start is the first token of its second copy. The detector locks onto the
// period when 4 tokens in a row equal the copy before and the last time those 4 were seen is
// p tokens back (a table of recent 4-grams gives the distance): at the loop's start, for a
// block that holds its first 4-gram once; later for a copy that starts with a counter (past
// it), or while a shorter repetition inside the block runs on (a row of a matrix), at most
// about one period later. It fires once the run meets both counts: within
// max((repeats−1) × p, weight_tokens) + p + 4 tokens of the loop's start, where weight_tokens
// is the tokens the loop needs to weigh enough (min_words for a loop of words, up to
// 4 × min_words for one of punctuation, up to 8/3 of that with a counter), and 4 is what a
// hash collision in the 4-gram table (a slot taken by another 4-gram since) may add by
// delaying the lock. The tests plant loops of every kind and assert the bound, and that the
// detector fires where the same rule with an exact table does (within those 4).
//
// Cost. Per byte, a table lookup and a multiply; per token, a ring write, one comparison, a
// 4-gram hash and a table slot, and, while no period is locked, the 4 comparisons that check
// a candidate: O(1), whatever the answer's length. Memory is fixed when the detector is
// built: a ring of the last ring tokens (a power of two above max_period + 4) and a table of
// twice as many 16-bit positions, 8 bytes a ring slot (about 4 KiB at the default
// max_period of 256).

// Thresholds say what counts as a loop (see the file comment).
type Thresholds struct {
	MinPeriod int  // shortest period, in tokens (≥ 1)
	MaxPeriod int  // longest period, in tokens (≤ maxPeriodLimit)
	Repeats   int  // copies of the block, the first included (≥ 2)
	MinWords  int  // weight the run must reach, in words (a word 1, punctuation or a number ¼)
	Counters  bool // a number may change from copy to copy
}

const (
	kgram          = 4     // tokens of the n-grams that find a period
	maxWordBytes   = 32    // a longer word is several tokens
	maxPunctRun    = 8     // a longer run of one punctuation character is several tokens
	maxPeriodLimit = 16384 // positions in the table are 16 bits: periods stay well below
)

// Token flags, the low bits of a token's hash.
const (
	flagNum  = 1 // only digits
	flagWord = 2 // has a letter (or is a wide character)
	flagMask = flagNum | flagWord
	nonZero  = 4 // set in every token, so that no token is 0
)

// Byte classes.
const (
	cSpace  = iota // ' ', '\t', '\r', '\v', '\f': separates tokens
	cLetter        // ASCII letters, '_', bytes of 2-byte UTF-8 characters
	cDigit         // '0'-'9'
	cPunct         // other ASCII, '\n' included
	cCont          // UTF-8 continuation byte
	cWide          // lead byte of a 3- or 4-byte UTF-8 character
)

var byteClass [256]uint8

func init() {
	for b := range 256 {
		var k uint8
		switch {
		case b == ' ' || b == '\t' || b == '\r' || b == '\v' || b == '\f':
			k = cSpace
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b == '_':
			k = cLetter
		case b >= '0' && b <= '9':
			k = cDigit
		case b < 0x80:
			k = cPunct
		case b < 0xc0:
			k = cCont
		case b < 0xe0:
			k = cLetter // lead of a 2-byte character: part of a word
		default:
			k = cWide // 0xe0-0xff (bytes that cannot start UTF-8 read as one, harmlessly)
		}
		byteClass[b] = k
	}
}

// Token states: what the token being read is.
const (
	tNone  = iota
	tWord  // a word: letters, digits, continuation bytes of its 2-byte characters
	tPunct // a run of punct
	tWide  // a wide character, need more continuation bytes
)

const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// Loop is what a detector found.
type Loop struct {
	Period int // tokens of the repeated block
	Start  int // the token the run started at (counting from 0)
	At     int // the token at which it was detected: the detector had read At+1 tokens
	Weight int // the run's weight, in quarter words
}

// Detector finds a loop in one stream of text (see the file comment). The zero value is not
// usable: build one with NewDetector, and reuse it for another stream with Reset.
type Detector struct {
	th    Thresholds
	ring  []uint32 // the last len(ring) tokens, by position & mask
	mask  int
	table []uint16 // 4-gram hash -> last position (low 16 bits)
	tbits uint     // log2(len(table))
	pos   int      // tokens read

	// the token being read
	state uint8
	h     uint32 // its FNV-1a hash so far
	n     int    // its bytes so far
	punct byte   // tPunct: the character
	need  int    // tWide: continuation bytes still expected
	word  bool   // tWord: has a letter
	digit bool   // tWord: has a digit

	// the run at the period locked onto
	period int
	run    int // tokens matched in a row
	weight int // their weight, in quarter words
	soft   int // of them, numbers that changed
	start  int

	found bool
	loop  Loop
}

// NewDetector builds a detector for th. Thresholds out of range are brought within it: a
// period within [1, maxPeriodLimit], repeats at least 2, min words at least 1.
func NewDetector(th Thresholds) *Detector {
	th.MaxPeriod = min(max(th.MaxPeriod, 1), maxPeriodLimit)
	th.MinPeriod = min(max(th.MinPeriod, 1), th.MaxPeriod)
	th.Repeats = max(th.Repeats, 2)
	th.MinWords = max(th.MinWords, 1)
	size := 16
	for size < th.MaxPeriod+kgram+1 {
		size <<= 1
	}
	d := &Detector{th: th, ring: make([]uint32, size), mask: size - 1, table: make([]uint16, 2*size)}
	for 1<<d.tbits < len(d.table) {
		d.tbits++
	}
	d.Reset()
	return d
}

// Reset readies the detector for a new stream (its memory is kept: the ring and the table
// need no clearing, every position read is checked against the stream's own tokens).
func (d *Detector) Reset() {
	d.pos, d.state, d.h, d.n = 0, tNone, fnvOffset32, 0
	d.period, d.run, d.weight, d.soft, d.start = 0, 0, 0, 0, 0
	d.found, d.loop = false, Loop{}
}

// Tokens is the number of tokens read so far.
func (d *Detector) Tokens() int { return d.pos }

// Found returns the loop, once one was detected.
func (d *Detector) Found() (Loop, bool) { return d.loop, d.found }

// Feed reads the next piece of the text and reports whether a loop has been found (in this
// piece or before: once found, the detector reads no more).
func (d *Detector) Feed(p []byte) bool {
	if d.found {
		return true
	}
	for i := 0; i < len(p) && !d.found; i++ {
		b := p[i]
		k := byteClass[b]
		switch d.state {
		case tWord:
			if (k == cLetter || k == cDigit || k == cCont) && d.n < maxWordBytes {
				d.add(b)
				d.word = d.word || k == cLetter || k == cCont
				d.digit = d.digit || k == cDigit
				continue
			}
			d.endWord()
		case tPunct:
			if b == d.punct && d.n < maxPunctRun {
				d.add(b)
				continue
			}
			d.emit(d.h, 0)
		case tWide:
			if k == cCont {
				d.add(b)
				if d.need--; d.need == 0 {
					d.emit(d.h, flagWord)
				}
				continue
			}
			d.emit(d.h, flagWord)
		}
		d.begin(b, k)
	}
	return d.found
}

func (d *Detector) add(b byte) {
	d.h = (d.h ^ uint32(b)) * fnvPrime32
	d.n++
}

// begin starts a token at b (of class k), after the one before ended.
func (d *Detector) begin(b byte, k uint8) {
	d.h, d.n = fnvOffset32, 0
	switch k {
	case cSpace:
		d.state = tNone
		return
	case cLetter, cDigit, cCont:
		d.state, d.word, d.digit = tWord, k != cDigit, k == cDigit
	case cPunct:
		d.state, d.punct = tPunct, b
		d.h = (d.h ^ 0x80) * fnvPrime32 // punctuation never hashes like a word
	case cWide:
		d.state, d.need = tWide, 2
		if b >= 0xf0 {
			d.need = 3
		}
	}
	d.add(b)
}

func (d *Detector) endWord() {
	var f uint32
	if d.word {
		f = flagWord
	} else if d.digit {
		f = flagNum
	}
	d.emit(d.h, f)
}

// tokenWeight is a matched token's weight in quarter words.
func tokenWeight(t uint32) int {
	if t&flagWord != 0 {
		return 4
	}
	return 1
}

// emit takes in one token (its hash and flags).
func (d *Detector) emit(h, flags uint32) {
	d.state = tNone
	// Finalise the hash (murmur3's mixer), make room for the flags.
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	t := h&^(flagMask|nonZero) | flags | nonZero
	i := d.pos
	d.ring[i&d.mask] = t
	d.pos++

	if d.period > 0 {
		prev := d.ring[(i-d.period)&d.mask]
		switch {
		case prev == t:
			d.run++
			d.weight += tokenWeight(t)
		case d.th.Counters && t&prev&flagNum != 0 && (d.soft+1)*4 <= d.run+1:
			d.run++
			d.soft++
		default:
			d.period, d.run, d.weight, d.soft = 0, 0, 0, 0
		}
	}
	if i < kgram-1 {
		return
	}
	g := d.gram(i)
	slot := g >> (32 - d.tbits)
	if d.period == 0 {
		dist := int(uint16(i) - d.table[slot])
		if dist >= d.th.MinPeriod && dist <= d.th.MaxPeriod && i-dist >= kgram-1 && d.sameGram(i, i-dist) {
			d.period, d.run, d.soft, d.start = dist, kgram, 0, i-kgram+1
			d.weight = 0
			for j := range kgram {
				d.weight += tokenWeight(d.ring[(i-j)&d.mask])
			}
		}
	}
	d.table[slot] = uint16(i)
	if d.period > 0 && d.run >= (d.th.Repeats-1)*d.period {
		need := 4 * d.th.MinWords
		if d.soft > 0 {
			need *= 2
		}
		if d.weight >= need {
			d.found = true
			d.loop = Loop{Period: d.period, Start: d.start, At: i, Weight: d.weight}
		}
	}
}

// gram is the hash of the 4-gram that ends at token i.
func (d *Detector) gram(i int) uint32 {
	m := d.mask
	g := d.ring[(i-3)&m]
	g = g*0x9e3779b1 ^ d.ring[(i-2)&m]
	g = g*0x9e3779b1 ^ d.ring[(i-1)&m]
	g = g*0x9e3779b1 ^ d.ring[i&m]
	g ^= g >> 15
	g *= 0x2c1b3c6d
	g ^= g >> 12
	return g
}

// sameGram reports whether the 4-grams ending at tokens i and j are the same.
func (d *Detector) sameGram(i, j int) bool {
	m := d.mask
	for k := range kgram {
		if d.ring[(i-k)&m] != d.ring[(j-k)&m] {
			return false
		}
	}
	return true
}
