package shadow

import (
	"reflect"
	"strings"
	"testing"
)

func TestTokenize(t *testing.T) {
	got := Tokenize("Hello, World! It's 42°C — naïve café.")
	want := []string{"hello", "world", "it", "s", "42", "c", "naïve", "café"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q want %q", got, want)
	}
}

func TestRougeL(t *testing.T) {
	long := strings.Repeat("a ", MaxWords+500)
	tests := []struct {
		name      string
		cand, ref string
		want      float64
	}{
		{"identical", "The cat sat on the mat.", "the cat sat on the mat", 1},
		{"disjoint", "alpha beta gamma", "delta epsilon", 0},
		{"both empty", "", "  ...  ", 1},
		{"one empty", "", "word", 0},
		// LCS "the cat on the mat" = 5 of 6 words each side → F1 5/6.
		{"partial", "the cat is on the mat", "the cat sat on the mat", 5.0 / 6},
		// "killed" ≠ "kill": LCS "police the gunman" = 3 of 4 each side → 0.75
		// (no stemming).
		{"lin", "police killed the gunman", "police kill the gunman", 0.75},
		// P = 2/2, R = 2/4 → F1 = 2*1*0.5/1.5 = 2/3.
		{"subset", "a b", "a x b y", 2.0 / 3},
		// Capped at MaxWords on both sides → identical.
		{"capped", long, long + "b c d", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RougeL(tt.cand, tt.ref); !near(got, tt.want, 1e-12) {
				t.Errorf("RougeL = %v want %v", got, tt.want)
			}
			if got := RougeL(tt.ref, tt.cand); !near(got, tt.want, 1e-12) {
				t.Errorf("symmetric RougeL = %v want %v", got, tt.want)
			}
		})
	}
}

func TestLCSLen(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"a b c d", "a c d", 3},
		{"a b c b d a b", "b d c a b a", 4}, // CLRS example: BCBA
		{"x", "y", 0},
		{"", "a", 0},
	}
	for _, tt := range tests {
		if got := lcsLen(strings.Fields(tt.a), strings.Fields(tt.b)); got != tt.want {
			t.Errorf("lcs(%q,%q) = %d want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
