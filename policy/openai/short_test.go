package openai

import (
	"strings"
	"testing"
)

// TestShortString: where shortString takes a string, scanString ends it at the same byte,
// without escapes or error; it takes every plain string whose closing quote is within the
// 24 bytes after the opening one, when the eight-byte words up to that quote are all in b.
func TestShortString(t *testing.T) {
	for n := 0; n <= 28; n++ {
		for _, tail := range []string{"", ":1", `,"k":"v"}` + strings.Repeat(" ", 20)} {
			for _, body := range []string{strings.Repeat("a", n), strings.Repeat("a", max(n-1, 0)) + `\"`[:min(n, 2)]} {
				b := []byte(`"` + body + `"` + tail)
				checkShort(t, b)
				words := n/8 + 1 // the words read: up to the one holding the closing quote
				wantOK := !strings.Contains(body, `\`) && n <= 23 && len(b) >= 1+8*words
				if _, ok := shortString(b, 0); ok != wantOK {
					t.Errorf("shortString(%q) ok %v, want %v", b, ok, wantOK)
				}
			}
		}
	}
	checkShort(t, []byte("\"ab\x01cdefghijklmnop\""))
	checkShort(t, []byte(`"abcdefgh\"ijklmnopq"`))
}

func checkShort(t *testing.T, b []byte) {
	t.Helper()
	end, ok := shortString(b, 0)
	if !ok {
		return
	}
	wend, esc, msg := scanString(b, 0)
	if end != wend || esc || msg != "" {
		t.Errorf("shortString(%q) = %d; scanString %d, %v, %q", b, end, wend, esc, msg)
	}
}

// FuzzShortString: whatever the bytes, a string shortString takes is one scanString reads to
// the same end, without escapes or error.
func FuzzShortString(f *testing.F) {
	for _, s := range []string{`"finish_reason":"length"`, `"a"`, `"completion_tokens":1`, `"abc\"def"xxxxxxxxxxxxxxxx`, "\"x\x1fy\"zzzzzzzzzzzzzzzzz"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || b[0] != '"' {
			return
		}
		checkShort(t, b)
	})
}
