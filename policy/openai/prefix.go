package openai

import (
	"encoding/binary"
	"math/bits"
)

// Request.PrefixHash is a 64-bit hash of the beginning of the prompt text, for prefix-cache
// affinity: requests whose prompts begin alike (the same system prompt, tools and first
// turns) get the same hash, and the endpoint picker sends them to the same model server so
// its prefix cache hits.
//
// What is hashed, in body order, as JSON-escaped bytes exactly as sent (no decoding, so the
// same text escaped differently hashes differently; one client escapes consistently):
//
//   - chat: the text of every message's content (string content, and the "text" and
//     "refusal" of content parts), tool-call names and arguments, each piece followed by a
//     separator byte; plus, hashed separately and combined, the JSON of the tool
//     declarations ("tools", "functions"), which chat templates render near the start of
//     the prompt and which may come before or after "messages" in the body. Roles, images
//     and other fields are not hashed.
//   - completions: the text prompts, in order. Token-ID prompts are not hashed.
//   - embeddings: nothing (PrefixHash is 0: embeddings have no prefix cache to hit).
//   - Responses: the input's text as chat's messages (message content, function_call names
//     and arguments, tool outputs, in body order), the tool declarations as chat's, and the
//     instructions, hashed apart and combined like the tools: the instructions are rendered
//     first (the system message), but clients send them before or after "input" (the
//     Python SDK sends "input" first), and the hash must not depend on which. Instructions
//     that fill PrefixHashBytes make the hash alone, as a long system message does in
//     chat; shorter ones are combined with the input's first PrefixHashBytes bytes. The
//     minimum and PrefixLen count the instructions' bytes and the input's together
//     (PrefixLen at most PrefixHashBytes).
//
// Each part is cut at PrefixHashBytes bytes. PrefixHash is 0 when the hashed message or
// prompt text (separators included, tools not) is shorter than PrefixHashMinBytes: a short
// prompt gains nothing from affinity. Request.PrefixLen is that length (0 with no hash), for
// the picker's own minimum (upstream.Hint.PrefixLen). The hash is deterministic (no per-process seed), so
// every gateway replica computes the same hash for the same prompt. It is computed in the
// same pass as the rest of ParseRequest, without allocating.
const (
	PrefixHashBytes    = 2048 // at most this many bytes of each part are hashed
	PrefixHashMinBytes = 256  // below this many bytes of text, PrefixHash is 0
)

// prefixHasher hashes a bounded stream of bytes 32 at a time in four independent lanes
// (the shape of xxHash64, so the multiplications overlap), without buffering the stream:
// at most 31 pending bytes are carried between writes.
type prefixHasher struct {
	v   [4]uint64
	buf [32]byte // pending bytes
	nb  int      // pending byte count, 0..31
	n   int      // bytes taken so far, at most PrefixHashBytes
}

const (
	phP1 = 0x9e3779b185ebca87
	phP2 = 0xc2b2ae3d27d4eb4f
	phP3 = 0x165667b19e3779f9
	phP4 = 0x85ebca77c2b2ae63
)

func phRound(v, w uint64) uint64 { return bits.RotateLeft64(v+w*phP2, 31) * phP1 }

func (p *prefixHasher) block(b []byte) {
	p.v[0] = phRound(p.v[0], binary.LittleEndian.Uint64(b))
	p.v[1] = phRound(p.v[1], binary.LittleEndian.Uint64(b[8:]))
	p.v[2] = phRound(p.v[2], binary.LittleEndian.Uint64(b[16:]))
	p.v[3] = phRound(p.v[3], binary.LittleEndian.Uint64(b[24:]))
}

// full reports whether the hasher takes no more bytes.
func (p *prefixHasher) full() bool { return p.n >= PrefixHashBytes }

// write hashes b (as much of it as the bound leaves room for).
func (p *prefixHasher) write(b []byte) {
	if room := PrefixHashBytes - p.n; len(b) > room {
		b = b[:room]
	}
	p.n += len(b)
	if p.nb > 0 {
		k := copy(p.buf[p.nb:], b)
		b = b[k:]
		if p.nb += k; p.nb < len(p.buf) {
			return
		}
		p.block(p.buf[:])
		p.nb = 0
	}
	if len(b) >= 32 {
		v0, v1, v2, v3 := p.v[0], p.v[1], p.v[2], p.v[3]
		for ; len(b) >= 32; b = b[32:] {
			v0 = phRound(v0, binary.LittleEndian.Uint64(b))
			v1 = phRound(v1, binary.LittleEndian.Uint64(b[8:]))
			v2 = phRound(v2, binary.LittleEndian.Uint64(b[16:]))
			v3 = phRound(v3, binary.LittleEndian.Uint64(b[24:32]))
		}
		p.v = [4]uint64{v0, v1, v2, v3}
	}
	p.nb = copy(p.buf[:], b)
}

// sep ends one piece of text, so that ["ab","c"] and ["a","bc"] hash differently. The
// separator byte 0x00 cannot occur unescaped in a JSON string.
func (p *prefixHasher) sep() {
	if p.n < PrefixHashBytes {
		p.n++
		if p.nb < len(p.buf) {
			p.buf[p.nb] = 0
			p.nb++
		}
		if p.nb == len(p.buf) {
			p.block(p.buf[:])
			p.nb = 0
		}
	}
}

// sum returns the hash, or 0 when fewer than minBytes bytes were written.
func (p *prefixHasher) sum(minBytes int) uint64 {
	if p.n < minBytes || p.n == 0 {
		return 0
	}
	v := p.v // lanes start at zero: phRound(0, w) is a bijection of w
	h := bits.RotateLeft64(v[0], 1) + bits.RotateLeft64(v[1], 7) +
		bits.RotateLeft64(v[2], 12) + bits.RotateLeft64(v[3], 18)
	h += uint64(p.n)
	for i := 0; i+8 <= p.nb; i += 8 {
		h ^= phRound(0, binary.LittleEndian.Uint64(p.buf[i:]))
		h = bits.RotateLeft64(h, 27)*phP1 + phP4
	}
	for _, c := range p.buf[p.nb&^7 : p.nb] {
		h ^= uint64(c) * 0x27d4eb2f165667c5
		h = bits.RotateLeft64(h, 11) * phP1
	}
	// xxHash64's avalanche.
	h ^= h >> 33
	h *= phP2
	h ^= h >> 29
	h *= phP3
	h ^= h >> 32
	if h == 0 {
		h = 1 // 0 means "no prefix hash"
	}
	return h
}

// prefixHash combines the text hash with the tools hash (when tools were declared).
func prefixHash(text, tools *prefixHasher) uint64 {
	h := text.sum(PrefixHashMinBytes)
	if h == 0 || tools.n == 0 {
		return h
	}
	return phCombine(h, tools.sum(1))
}

// phCombine mixes the hash t of another part into h; never 0.
func phCombine(h, t uint64) uint64 {
	h = bits.RotateLeft64(h^(t*phP2), 31) * phP1
	h ^= h >> 32
	if h == 0 {
		h = 1
	}
	return h
}

// prefixHashWith is prefixHash for a prompt with a part hashed apart that comes before its
// text (a Responses request's instructions): when that part fills PrefixHashBytes it is
// the whole prefix; else both parts count. The minimum applies to their bytes together,
// and the length returned is theirs, at most PrefixHashBytes.
func prefixHashWith(first, text, tools *prefixHasher) (uint64, int) {
	n := first.n + text.n
	if first.full() {
		n = first.n
	}
	if n < PrefixHashMinBytes || n == 0 {
		return 0, 0
	}
	var h uint64
	switch {
	case first.n == 0:
		h = text.sum(1)
	case text.n == 0 || first.full():
		h = first.sum(1)
	default:
		h = phCombine(first.sum(1), text.sum(1))
	}
	if tools.n > 0 {
		h = phCombine(h, tools.sum(1))
	}
	return h, min(n, PrefixHashBytes)
}
