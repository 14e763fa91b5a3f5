package shadow

import (
	"strings"
	"unicode"
)

// MaxWords caps the number of tokens per text that RougeL considers; longer
// texts are truncated to their first MaxWords words.
const MaxWords = 4096

// Tokenize lower-cases s and splits it into words: maximal runs of letters,
// digits and marks. Everything else (spaces, punctuation, symbols) separates
// words and is dropped.
func Tokenize(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !(unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r))
	})
}

// RougeL returns the ROUGE-L F1 score of candidate against reference on word
// tokens (see Tokenize), each capped at MaxWords: with L the length of their
// longest common subsequence, precision L/len(candidate), recall
// L/len(reference), F1 their harmonic mean. Two texts without words score 1;
// exactly one without words scores 0. The score is symmetric.
func RougeL(candidate, reference string) float64 {
	c, r := Tokenize(candidate), Tokenize(reference)
	if len(c) > MaxWords {
		c = c[:MaxWords]
	}
	if len(r) > MaxWords {
		r = r[:MaxWords]
	}
	if len(c) == 0 && len(r) == 0 {
		return 1
	}
	if len(c) == 0 || len(r) == 0 {
		return 0
	}
	l := float64(lcsLen(c, r))
	if l == 0 {
		return 0
	}
	p, rec := l/float64(len(c)), l/float64(len(r))
	return 2 * p * rec / (p + rec)
}

// lcsLen is the length of the longest common subsequence of a and b, in
// O(len(a)*len(b)) time and O(min(len(a), len(b))) memory.
func lcsLen(a, b []string) int {
	if len(b) > len(a) {
		a, b = b, a
	}
	row := make([]int, len(b)+1) // row[j]: LCS of a[:i] and b[:j]
	for i := range a {
		diag := 0 // value of row[j-1] from the previous i
		for j := 1; j <= len(b); j++ {
			up := row[j]
			if a[i] == b[j-1] {
				row[j] = diag + 1
			} else if row[j-1] > row[j] {
				row[j] = row[j-1]
			}
			diag = up
		}
	}
	return row[len(b)]
}
