package shadow

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxWords caps the number of tokens per text that RougeL considers; longer
// texts are truncated to their first MaxWords tokens, which bounds a
// comparison to MaxWords² steps of the longest-common-subsequence table and
// its memory to O(MaxWords), however long the texts.
const MaxWords = 4096

// unspaced lists the scripts written without spaces between words. Their
// letters are tokens of one character each (a character-level ROUGE-L, as
// is usual for Chinese and Japanese, since finding their words needs a
// dictionary). Hangul is not among them: Korean puts spaces between words.
var unspaced = []*unicode.RangeTable{
	unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Bopomofo,
	unicode.Thai, unicode.Lao, unicode.Khmer, unicode.Myanmar,
}

// Token classes of a rune.
const (
	sepRune  = iota // separates tokens and is dropped
	wordRune        // part of a run of letters and digits
	markRune        // a combining mark: continues the token before it
	charRune        // a token by itself (a script without spaces)
)

func runeClass(r rune) int {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
			return wordRune
		}
		return sepRune
	}
	switch {
	case unicode.IsMark(r):
		return markRune
	case unicode.IsDigit(r):
		return wordRune
	case !unicode.IsLetter(r) && !unicode.IsNumber(r):
		return sepRune
	// U+30FC and U+FF70, the prolonged sound marks of katakana, are of the
	// Common script.
	case unicode.IsOneOf(unspaced, r) || r == 'ー' || r == 'ｰ':
		return charRune
	case unicode.IsLetter(r):
		return wordRune
	}
	return sepRune // numbers other than digits outside the scripts above
}

// nextToken returns the byte span [start, end) of the first token of s at or
// after offset i, or start = -1 when there is none.
func nextToken(s string, i int) (start, end int) {
	start, in := -1, sepRune // in: class of the token being read
	for i < len(s) {
		r, w := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, w = utf8.DecodeRuneInString(s[i:])
		}
		switch runeClass(r) {
		case sepRune:
			if in != sepRune {
				return start, i
			}
		case markRune:
			if in == sepRune {
				start, in = i, wordRune
			}
		case charRune:
			if in != sepRune {
				return start, i
			}
			start, in = i, charRune
		case wordRune:
			if in == charRune {
				return start, i
			}
			if in == sepRune {
				start, in = i, wordRune
			}
		}
		i += w
	}
	return start, len(s)
}

// Tokenize lower-cases s and splits it into tokens, by script:
//
//   - a letter of a script written without spaces (Han, Hiragana, Katakana
//     with its prolonged sound mark, Bopomofo, Thai, Lao, Khmer, Myanmar) or
//     a non-digit number of those scripts (such as 〇) is a token by itself,
//     with the combining marks that follow it (Thai vowel and tone marks);
//   - any other maximal run of letters, decimal digits (of any script) and
//     combining marks is a word: Latin, Cyrillic, Greek, Arabic, Hangul, …;
//   - everything else (spaces, punctuation, symbols, emoji, invalid UTF-8)
//     separates tokens and is dropped, so "，" against "," or a missing
//     full stop changes nothing.
//
// Text without characters of the scripts above is split as before they were
// added: words only.
func Tokenize(s string) []string {
	return wordTokens(s, -1)
}

// wordTokens is Tokenize keeping at most limit tokens (all when limit < 0):
// only the part of s holding them is lower-cased and the result has exactly
// the length it needs, so at most two allocations.
func wordTokens(s string, limit int) []string {
	n, end := 0, 0
	for i := 0; n != limit; n++ {
		st, e := nextToken(s, i)
		if st < 0 {
			break
		}
		end, i = e, e
	}
	if n == 0 {
		return nil
	}
	low := strings.ToLower(s[:end]) // per rune: keeps token boundaries
	out := make([]string, 0, n)
	for i := 0; len(out) < n; {
		st, e := nextToken(low, i)
		if st < 0 {
			break
		}
		out = append(out, low[st:e])
		i = e
	}
	return out
}

// RougeL returns the ROUGE-L F1 score of candidate against reference on
// tokens (see Tokenize), each capped at MaxWords: with L the length of their
// longest common subsequence, precision L/len(candidate), recall
// L/len(reference), F1 their harmonic mean 2L/(len(candidate)+len(reference)).
// Two texts without tokens score 1; exactly one without tokens scores 0. The
// score is symmetric, in [0, 1], and 1 for a text against itself.
func RougeL(candidate, reference string) float64 {
	c, r := wordTokens(candidate, MaxWords), wordTokens(reference, MaxWords)
	if len(c) == 0 && len(r) == 0 {
		return 1
	}
	if len(c) == 0 || len(r) == 0 {
		return 0
	}
	return 2 * float64(lcsLen(c, r)) / float64(len(c)+len(r))
}

// lcsLen is the length of the longest common subsequence of a and b. It
// strips their common prefix and suffix, numbers the remaining tokens by
// sorting those of the shorter side (tokens of the longer side missing from
// it never match) and runs the dynamic programme on the numbers:
// O(len(a)*len(b)) time, O(len(a)+len(b)) memory in one allocation.
func lcsLen(a, b []string) int {
	if len(b) > len(a) {
		a, b = b, a
	}
	same := 0
	for len(b) > 0 && a[0] == b[0] {
		a, b, same = a[1:], b[1:], same+1
	}
	for len(b) > 0 && a[len(a)-1] == b[len(b)-1] {
		a, b, same = a[:len(a)-1], b[:len(b)-1], same+1
	}
	if len(b) == 0 {
		return same
	}
	buf := make([]int32, len(a)+3*len(b)+1)
	ia, ib, ord, row := buf[:len(a)], buf[len(a):len(a)+len(b)], buf[len(a)+len(b):len(a)+2*len(b)], buf[len(a)+2*len(b):]
	for j := range ord {
		ord[j] = int32(j)
	}
	slices.SortFunc(ord, func(i, j int32) int { return strings.Compare(b[i], b[j]) })
	var id int32
	for k, j := range ord {
		if k > 0 && b[j] != b[ord[k-1]] {
			id++
		}
		ib[j] = id
	}
	for i, t := range a {
		k, ok := slices.BinarySearchFunc(ord, t, func(j int32, t string) int { return strings.Compare(b[j], t) })
		if ok {
			ia[i] = ib[ord[k]]
		} else {
			ia[i] = -1
		}
	}
	// row[j]: LCS of a[:i] and b[:j], for i the tokens of a so far.
	for _, x := range ia {
		if x < 0 {
			continue // matches nothing: the row stays as it is
		}
		var diag int32 // value of row[j-1] from the previous i
		left := row[0] // row[j] of this i, carried in a register
		for j, y := range ib {
			up := row[j+1]
			v := max(left, up)
			if x == y {
				v = diag + 1
			}
			row[j+1], diag, left = v, up, v
		}
	}
	return same + int(row[len(b)])
}
