package sim

import (
	"strings"
	"unicode/utf8"
)

// vocab is the built-in vocabulary: every output token is one of these words (or a context
// marker). The words need no JSON escaping, so they are appended to JSON strings verbatim.
var vocab = [...]string{
	"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
	"on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
	"they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
	"more", "when", "will", "would", "who", "so", "no", "she", "other", "its", "may", "these", "about",
	"than", "into", "some", "could", "them", "only", "time", "new", "first", "two", "also", "over",
	"such", "most", "after", "then", "what", "any", "between", "through", "many", "those", "now",
	"where", "being", "each", "before", "very", "both", "under", "system", "model", "request",
	"token", "stream", "server", "cache", "batch", "queue", "latency", "answer", "question", "river",
	"mountain", "garden", "window", "signal", "network", "memory", "paper", "light", "water", "stone",
	"forest", "engine", "market", "letter", "bridge", "island", "planet", "music", "winter", "summer",
	"history", "number", "simple", "quick", "quiet", "bright", "early", "later", "always", "never",
	"often", "every", "small", "large", "green", "blue", "red", "golden", "silver", "ancient", "modern",
	"careful", "gentle", "strong", "clear", "open", "close", "build", "measure", "follow", "explain",
	"consider", "remember", "describe", "balance", "travel", "gather", "shape", "change", "return",
	"report", "result", "reason", "method", "example", "detail", "pattern", "value", "world", "people",
	"morning", "city", "road", "field", "house", "school", "voice", "story", "idea", "point", "line",
	"state", "place", "part", "group", "problem", "fact", "hand", "week", "day", "year", "way", "thing",
}

// Hashing: FNV-1a 64, written by hand so that it never allocates.
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

type hasher uint64

func newHasher() hasher { return hasher(fnvOffset) }

func (h *hasher) str(s string) {
	v := uint64(*h)
	for i := 0; i < len(s); i++ {
		v ^= uint64(s[i])
		v *= fnvPrime
	}
	*h = hasher(v)
}

// sep writes a separator byte that cannot occur in UTF-8 text, so ("ab","c") != ("a","bc").
func (h *hasher) sep() {
	v := uint64(*h)
	v ^= 0xff
	v *= fnvPrime
	*h = hasher(v)
}

func (h *hasher) u64(x uint64) {
	v := uint64(*h)
	for i := 0; i < 8; i++ {
		v ^= x & 0xff
		v *= fnvPrime
		x >>= 8
	}
	*h = hasher(v)
}

func (h hasher) sum() uint64 { return mix64(uint64(h)) }

// mix64 is the splitmix64 finaliser: a good bijective scrambler for hash values.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// splitmix is a tiny deterministic PRNG (splitmix64).
type splitmix uint64

func (s *splitmix) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	return mix64(uint64(*s))
}

// intn returns a value in [0, n) for n > 0.
func (s *splitmix) intn(n int) int { return int(s.next() % uint64(n)) }

// estimateTokens is the simulator's prompt-token estimate: ceil(characters/4), where characters
// are Unicode code points.
func estimateTokens(s string) int {
	return (utf8.RuneCountInString(s) + 3) / 4
}

// textGen produces the tokens of one text answer, one at a time, deterministically.
type textGen struct {
	markers []string // context markers emitted first, in order of first appearance
	n       int      // tokens to produce in total
	max     int      // max tokens (n before EOS)
	finish  string   // "stop" or "length"
	rng     splitmix
	i       int    // index of the next token
	lpSeed  uint64 // seeds the tokens' simulated distributions (logprobs.go)

	// A loop (x-sim-loop-after): from token loopAt on, the answer repeats its tokens
	// [loopAt-period, loopAt) again and again; snap is the generator's state at token
	// loopAt-period, replayed at the start of each copy.
	loopAt, period int
	snap           splitmix
	seed           splitmix // the generator's first state (to start again with a loop)
}

// newTextGen plans an answer of at most maxTokens tokens for a request hashed to h.
// Without ignoreEOS the answer ends at a hash-derived "EOS" point in [ceil(max/2), max]; an
// EOS point equal to max means no EOS was reached (finish "length"). Markers are never cut
// by EOS, only by maxTokens.
func newTextGen(h uint64, markers []string, maxTokens int, ignoreEOS bool) textGen {
	g := textGen{markers: markers, n: maxTokens, max: maxTokens, finish: "length", rng: splitmix(h), seed: splitmix(h), lpSeed: mix64(h ^ lpSeedSalt)}
	if !ignoreEOS && maxTokens > 0 {
		half := (maxTokens + 1) / 2
		eos := half + int(mix64(h^0x5eed)%uint64(maxTokens-half+1))
		eos = max(eos, len(markers))
		if eos < maxTokens {
			g.n, g.finish = eos, "stop"
		}
	}
	return g
}

// next appends the next token's text (with a leading space unless it is the first token).
func (g *textGen) next(dst []byte) []byte {
	if g.i > 0 {
		dst = append(dst, ' ')
	}
	j := g.i // the token whose text this one is
	if g.period > 0 {
		from := g.loopAt - g.period
		switch {
		case g.i == from:
			g.snap = g.rng
		case g.i >= g.loopAt:
			k := (g.i - g.loopAt) % g.period
			if k == 0 {
				g.rng = g.snap
			}
			j = from + k
		}
	}
	if j < len(g.markers) {
		dst = append(dst, g.markers[j]...)
	} else {
		dst = append(dst, vocab[g.rng.intn(len(vocab))]...)
	}
	g.i++
	return dst
}

// loop makes the answer a runaway one: from token after on, it repeats its last period
// tokens again and again (period ≤ after), never reaching EOS, to max tokens (finish
// "length"). An answer that ends before token after is left as it is. The tokens already
// produced (a continuation's prefix) are produced again from the start.
func (g *textGen) loop(after, period int) {
	if after >= g.n || period < 1 || period > after {
		return
	}
	done := g.i
	g.rng, g.i = g.seed, 0
	g.loopAt, g.period = after, period
	g.n, g.finish = g.max, "length"
	for range done {
		_ = g.next(nil)
	}
}

// markerSet collects context-fidelity markers ([[mem:XXXX]]) in order of first appearance.
type markerSet struct {
	list []string
	seen map[string]struct{} // built once list grows past a few entries
}

const markerPrefix = "[[mem:"

func isMarkerChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// scan adds the markers found in s. The strings kept are substrings of s (no copy).
func (m *markerSet) scan(s string) {
	for {
		i := strings.Index(s, markerPrefix)
		if i < 0 {
			return
		}
		rest := s[i+len(markerPrefix):]
		j := 0
		for j < len(rest) && j <= 32 && isMarkerChar(rest[j]) {
			j++
		}
		if j < 1 || j > 32 || !strings.HasPrefix(rest[j:], "]]") {
			s = rest
			continue
		}
		m.add(s[i : i+len(markerPrefix)+j+2])
		s = rest[j+2:]
	}
}

func (m *markerSet) add(k string) {
	if m.seen != nil {
		if _, ok := m.seen[k]; ok {
			return
		}
		m.seen[k] = struct{}{}
		m.list = append(m.list, k)
		return
	}
	for _, x := range m.list {
		if x == k {
			return
		}
	}
	m.list = append(m.list, k)
	if len(m.list) > 16 {
		m.seen = make(map[string]struct{}, 64)
		for _, x := range m.list {
			m.seen[x] = struct{}{}
		}
	}
}
