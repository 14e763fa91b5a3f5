package policy

import (
	"regexp"
	"strings"
	"testing"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"", "", true}, {"", "x", false}, {"*", "", true}, {"*", "anything/at all", true},
		{"gpt-4o*", "gpt-4o-mini", true}, {"gpt-4o*", "GPT-4O", true}, {"gpt-4o*", "gpt-4", false},
		{"*llama-3.1*", "meta-llama/Llama-3.1-8B", true}, {"a?c", "abc", true}, {"a?c", "ac", false},
		{"a*b*c", "axxbyyc", true}, {"a*b*c", "axxbyy", false}, {"gpt-4", "gpt-4-32k", false},
		{"*-8b", "llama-3-8B", true}, {"ab*", "a", false}, {"a**b", "ab", true}, {"*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false},
	} {
		if got := Glob(tc.pattern, tc.name); got != tc.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}

// FuzzGlob checks Glob against the same pattern as an anchored, case-insensitive regexp.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{{"a*c", "abc"}, {"*llama-3.1*", "Llama-3.1-8B"}, {"a?c", "ac"}, {"", ""}, {"**", "x"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		if len(pattern) > 64 || len(name) > 256 {
			return
		}
		var re strings.Builder
		re.WriteString(`(?s)^`)
		for i := 0; i < len(pattern); i++ {
			switch c := pattern[i]; c {
			case '*':
				re.WriteString(`.*`)
			case '?':
				re.WriteString(`.`)
			default:
				if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' {
					re.WriteString("[" + strings.ToUpper(string(c)) + strings.ToLower(string(c)) + "]")
				} else {
					re.WriteString(regexp.QuoteMeta(string(c)))
				}
			}
		}
		re.WriteString(`$`)
		rx, err := regexp.Compile(re.String())
		if err != nil {
			return
		}
		if !isASCII(pattern) || !isASCII(name) {
			return // a regexp matches runes, Glob bytes: compare on ASCII only
		}
		if got, want := Glob(pattern, name), rx.MatchString(name); got != want {
			t.Errorf("Glob(%q, %q) = %v, regexp %s says %v", pattern, name, got, re.String(), want)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
