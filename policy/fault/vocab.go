package fault

import (
	"math/rand/v2"
	"strings"
	"unicode"
	"unicode/utf8"
)

// groups are sets of interchangeable words: corrupt replaces a word of a group by another
// word of the same group (a plausible alternative: the sentence still reads, but says
// something else). Other words get a word of the general list.
var groups = [][]string{
	{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "hundred", "thousand", "million"},
	{"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"},
	{"january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"},
	{"red", "green", "blue", "yellow", "black", "white", "orange", "purple", "gray"},
	{"north", "south", "east", "west"},
	{"left", "right"}, {"up", "down"}, {"before", "after"}, {"true", "false"}, {"yes", "no"},
	{"big", "small", "large", "tiny", "huge", "little"},
	{"more", "less", "fewer"}, {"first", "last", "second", "third", "next", "final"},
	{"all", "some", "none", "many", "few", "most", "several"},
	{"always", "never", "often", "rarely", "sometimes", "usually"},
	{"is", "was", "becomes", "seems", "remains"}, {"are", "were", "seem", "remain"},
	{"can", "could", "will", "would", "should", "may", "might", "must"},
	{"he", "she", "it", "they", "we", "you", "i"},
	{"his", "her", "its", "their", "our", "your", "my"},
	{"a", "the", "one", "this", "that", "each", "every"},
	{"of", "in", "on", "at", "for", "with", "from", "to", "by", "about", "near"},
	{"and", "or", "but", "so", "yet"},
	{"paris", "london", "berlin", "madrid", "rome", "tokyo", "lisbon", "vienna", "lyon"},
	{"france", "germany", "spain", "italy", "japan", "portugal", "austria", "canada"},
	{"good", "bad", "great", "poor", "fine", "excellent"},
	{"capital", "city", "town", "village", "region", "port"},
	{"known", "famous", "noted", "remembered", "celebrated"},
	{"tower", "bridge", "castle", "cathedral", "museum", "palace"},
	{"increase", "decrease", "raise", "lower"}, {"increases", "decreases", "raises", "lowers"},
	{"fast", "slow", "quick", "rapid"}, {"hot", "cold", "warm", "cool"},
	{"old", "new", "young", "ancient", "modern"}, {"high", "low"},
	{"open", "close", "start", "stop"}, {"add", "remove", "keep", "drop"},
	{"function", "method", "class", "module", "variable"},
	{"return", "yield", "raise", "print"},
	{"user", "admin", "client", "server"},
}

// general are the words that replace a word of no group.
var general = []string{"thing", "way", "part", "place", "case", "point", "group", "number", "world", "system", "matter", "result", "answer", "reason", "value"}

// punct maps a punctuation mark to a plausible other one.
var punct = map[rune]rune{',': ';', ';': ',', '.': '!', '!': '.', '?': '.', ':': ';', '-': '–', '(': '[', ')': ']', '"': '\'', '\'': '"'}

var wordGroup = func() map[string][]int {
	m := map[string][]int{}
	for i, g := range groups {
		for _, w := range g {
			m[w] = append(m[w], i)
		}
	}
	return m
}()

// corrupter replaces output tokens (words, numbers and punctuation marks) at a rate.
type corrupter struct {
	rate float64
	rng  *rand.Rand
}

// text returns s with tokens replaced, and whether any was. It allocates only when it
// replaces one.
func (c *corrupter) text(s []byte) ([]byte, bool) {
	var out []byte // nil until the first replacement
	keep := func(from, to int) {
		if out != nil {
			out = append(out, s[from:to]...)
		}
	}
	repl := func(at int, w string) {
		if out == nil {
			out = append(make([]byte, 0, len(s)+16), s[:at]...)
		}
		out = append(out, w...)
	}
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRune(s[i:])
		switch {
		case isWordRune(r):
			j := i + n
			for j < len(s) {
				r2, n2 := utf8.DecodeRune(s[j:])
				if !isWordRune(r2) && (r2 != '\'' || j+n2 >= len(s) || !isWordRune(firstRune(s[j+n2:]))) {
					break
				}
				j += n2
			}
			if c.roll() {
				repl(i, c.word(string(s[i:j])))
			} else {
				keep(i, j)
			}
			i = j
		case unicode.IsSpace(r):
			keep(i, i+n)
			i += n
		default:
			if c.roll() {
				alt, ok := punct[r]
				if !ok {
					alt = ','
				}
				repl(i, string(alt))
			} else {
				keep(i, i+n)
			}
			i += n
		}
	}
	if out == nil {
		return s, false
	}
	return out, true
}

func firstRune(s []byte) rune {
	r, _ := utf8.DecodeRune(s)
	return r
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

func (c *corrupter) roll() bool { return c.rate >= 1 || c.rng.Float64() < c.rate }

// word returns a plausible different word for w, in w's case.
func (c *corrupter) word(w string) string {
	if isDigits(w) {
		out := []byte(w)
		for i := range out {
			d := byte(c.rng.IntN(9))
			if d >= out[i]-'0' {
				d++
			}
			out[i] = '0' + d
		}
		return string(out)
	}
	lower := strings.ToLower(w)
	var alt string
	if gs := wordGroup[lower]; len(gs) > 0 {
		g := groups[gs[c.rng.IntN(len(gs))]]
		alt = pickOther(c.rng, g, lower)
	} else {
		alt = pickOther(c.rng, general, lower)
	}
	return matchCase(alt, w)
}

func pickOther(rng *rand.Rand, list []string, not string) string {
	k := rng.IntN(len(list) - 1)
	for _, w := range list {
		if w == not {
			continue
		}
		if k == 0 {
			return w
		}
		k--
	}
	return list[0]
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// matchCase writes alt in the case of w: all upper, capitalized, or lower.
func matchCase(alt, w string) string {
	first, _ := utf8.DecodeRuneInString(w)
	switch {
	case len(w) > 1 && strings.ToUpper(w) == w && strings.ToLower(w) != w:
		return strings.ToUpper(alt)
	case unicode.IsUpper(first):
		r, n := utf8.DecodeRuneInString(alt)
		return string(unicode.ToUpper(r)) + alt[n:]
	}
	return alt
}
