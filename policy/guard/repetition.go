package guard

import (
	"sync"
)

// Repetition
//
// The repetition of a prompt is the share of its word n-grams that are duplicates:
//
//	repetition = duplicated n-grams / n-grams
//
// where a word is a maximal run of bytes other than ASCII white space (the escapes \n, \t and
// \r of the JSON text count as white space, other bytes are taken as they are, so words are
// case-sensitive), an n-gram is n consecutive words within one piece of text (one message's
// content, one tool call's arguments, ...), and an n-gram is a duplicate when the same n-gram
// (by a 64-bit hash) occurred earlier in the prompt, in any piece. A text made of one paragraph
// pasted k times has a repetition close to (k-1)/k; ordinary prose and code are near 0 for
// n = 8. Prompts with fewer than repetition_min_words words are not measured (0).
//
// Cost is bounded: when the text is longer than repetition_sample_bytes, only that many bytes
// are read, as sampleChunks evenly spaced chunks across the text (each starting at a word
// boundary), so a prompt repeated anywhere in it is still seen, and its cost stays near that
// of a prompt of the sample's size.

const sampleChunks = 8

// ngramTable is an open-addressing set of n-gram hashes, pooled between requests.
type ngramTable struct {
	slots []uint64
	mask  uint64
	used  int
	limit int // stop adding at 3/4 full
}

var tablePool = sync.Pool{New: func() any { return new(ngramTable) }}

func (t *ngramTable) reset(n int) {
	size := 64
	for size < 2*n {
		size <<= 1
	}
	if cap(t.slots) >= size {
		t.slots = t.slots[:size]
		clear(t.slots)
	} else {
		t.slots = make([]uint64, size)
	}
	t.mask = uint64(size - 1)
	t.used, t.limit = 0, size*3/4
}

// add inserts h and reports whether it was there already. Once the table is 3/4 full, new
// n-grams are no longer added (only looked up), so probing stays short.
func (t *ngramTable) add(h uint64) (dup bool) {
	h |= 1 // 0 marks an empty slot
	i := h & t.mask
	for {
		switch t.slots[i] {
		case 0:
			if t.used < t.limit {
				t.slots[i] = h
				t.used++
			}
			return false
		case h:
			return true
		}
		i = (i + 1) & t.mask
	}
}

// repetition measures the repetition of the text (see above) with n-grams of n words,
// reading at most sample bytes. It returns 0 when there are fewer than minWords words read.
func repetition(segs []segment, n, minWords, sample int) float64 {
	total := 0
	for _, s := range segs {
		total += len(s.b)
	}
	if total == 0 {
		return 0
	}
	// Which byte ranges of the concatenated text to read.
	chunk, stride := total, total
	if total > sample {
		chunk = sample / sampleChunks
		stride = total / sampleChunks
	}
	read := min(total, sample)
	t := tablePool.Get().(*ngramTable)
	defer tablePool.Put(t)
	t.reset(read / 6) // about a word every 6 bytes in prose; past 3/4 full it stops adding

	var st ngramState
	st.n = n
	st.pn = 1
	for range n {
		st.pn *= prime
	}
	var ngrams, dups, words int
	off := 0 // offset of the current segment in the concatenated text
	for c := 0; c*stride < total && (total <= sample || c < sampleChunks); c++ {
		lo, hi := c*stride, c*stride+chunk
		st.restart()
		for _, s := range segs {
			end := off + len(s.b)
			if end > lo && off < hi {
				a, b := max(lo-off, 0), min(hi-off, len(s.b))
				w, g, d := st.scan(s.b[a:b], s.esc, a > 0, t)
				words += w
				ngrams += g
				dups += d
				st.restart() // n-grams do not span pieces
			}
			off = end
		}
		off = 0
	}
	if words < minWords || ngrams == 0 {
		return 0
	}
	return float64(dups) / float64(ngrams)
}

const prime = 0x100000001b3 // FNV-64 prime, also the base of the rolling n-gram hash

// ngramState is a rolling hash over the last n word hashes.
type ngramState struct {
	n    int
	pn   uint64 // prime^n
	ring [64]uint64
	k    int // words in the ring (up to n)
	pos  int
	h    uint64
}

func (st *ngramState) restart() { st.k, st.pos, st.h = 0, 0, 0 }

// push adds a word hash and reports the n-gram hash once n words are in.
func (st *ngramState) push(w uint64) (uint64, bool) {
	st.h = st.h*prime + w
	if st.k == st.n {
		st.h -= st.ring[st.pos] * st.pn
	} else {
		st.k++
	}
	st.ring[st.pos] = w
	st.pos++
	if st.pos == st.n {
		st.pos = 0
	}
	return st.h, st.k == st.n
}

// scan reads words from b (skipping a partial first word when mid is set) and adds their
// n-grams to t. It returns the words, n-grams and duplicate n-grams seen. Words are hashed
// with djb2 (cheap per byte) and then mixed, which is plenty for telling repeats apart.
func (st *ngramState) scan(b []byte, esc, mid bool, t *ngramTable) (words, ngrams, dups int) {
	i := 0
	if mid { // start at a word boundary
		for i < len(b) && sep(b, i, esc) == 0 {
			i++
		}
	}
	var h uint64
	inWord := false
	for i < len(b) {
		c := b[i]
		if !isSpace[c] && (c != '\\' || !esc) {
			h = h<<5 + h + uint64(c)
			inWord = true
			i++
			continue
		}
		n := sep(b, i, esc)
		if n == 0 { // an escape other than \n, \t, \r: part of the word
			h = h<<5 + h + uint64(c)
			if i+1 < len(b) {
				h = h<<5 + h + uint64(b[i+1])
			}
			inWord = true
			i += 2
			continue
		}
		i += n
		if inWord {
			words++
			if g, ok := st.push(mix(h)); ok {
				ngrams++
				if t.add(g) {
					dups++
				}
			}
			h, inWord = 0, false
		}
	}
	if inWord {
		words++
		if g, ok := st.push(mix(h)); ok {
			ngrams++
			if t.add(g) {
				dups++
			}
		}
	}
	return words, ngrams, dups
}

// mix is the murmur3 64-bit finalizer.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

var isSpace = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

// sep returns the length of the separator at b[i] (0 if none).
func sep(b []byte, i int, esc bool) int {
	switch b[i] {
	case ' ', '\t', '\n', '\r':
		return 1
	case '\\':
		if esc && i+1 < len(b) {
			switch b[i+1] {
			case 'n', 't', 'r':
				return 2
			case '\\', '"', '/', 'u', 'b', 'f':
				return 0
			}
		}
	}
	return 0
}
