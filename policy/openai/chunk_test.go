package openai

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWellFormedChunk(t *testing.T) {
	good := []string{
		`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi \"x\" }"},"finish_reason":null}]}`,
		`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`,
		` {"a":[1,2.5e3,-3,true,false,null,{"b":[]}]} `,
		`{"error":{"message":"x","type":"server_error","code":null}}`,
		`{}`,
	}
	bad := []string{
		``, `[1]`, `"x"`, `{`, `{"a":1`, `{"a":"x}`, `{"a":1,}`, `{"a":[1,]}`, `{,"a":1}`, `{"a"::1}`,
		`{"a":1,,"b":2}`, `{"a":[1}`, `{"a":{"b":1]}`, `{"a":1}}`, `{"a":1}{"b":2}`, `{"a":1 "b":2}`,
		`{"a":"x" "b"}`, "{\"a\":\"line\nbreak\"}", `{"a":[1]]}`,
	}
	for _, s := range good {
		if !WellFormedChunk([]byte(s)) {
			t.Errorf("rejected a good chunk: %s", s)
		}
	}
	for _, s := range bad {
		if WellFormedChunk([]byte(s)) {
			t.Errorf("accepted a bad chunk: %q", s)
		}
	}
}

// Every truncation of a real chunk is caught, and every whole chunk of the captured streams
// passes, as json.Valid says.
func TestWellFormedChunkAgreesOnTruncations(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.sse")
	if len(files) == 0 {
		t.Fatal("no testdata/*.sse")
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" || !json.Valid([]byte(data)) {
				continue
			}
			if !WellFormedChunk([]byte(data)) {
				t.Errorf("%s: rejected %s", f, data)
			}
			for k := 1; k < len(data)-1; k++ {
				if WellFormedChunk([]byte(data[:k])) {
					t.Errorf("%s: accepted the truncation %q", f, data[:k])
				}
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no chunk truncated")
	}
}

func FuzzWellFormedChunk(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"c"}]}`))
	f.Add([]byte(`{"a":1,}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Never accept what json.Valid refuses as unbalanced or truncated; a well-formed
		// object must always pass.
		if json.Valid(b) && len(b) > 0 {
			var v any
			if json.Unmarshal(b, &v) == nil {
				if _, isObj := v.(map[string]any); isObj && !WellFormedChunk(b) {
					t.Fatalf("rejected valid JSON object %q", b)
				}
			}
		}
	})
}

// FuzzWellFormedChunkAgrees: the chunk check with its eight-bytes-at-a-time strings says what
// the byte-by-byte check it replaced says, on any input.
func FuzzWellFormedChunkAgrees(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"c"}]}`))
	f.Add([]byte(`{"id":"chatcmpl-0123456789abcdef","x":"a\\"b\\\\","y":"\x01"}`))
	f.Add([]byte(`{"abcdefghijklmnop\\`))
	f.Add([]byte(`{"abcdefgh":"ijklmnopqrstuvwx\t"}  `))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := WellFormedChunk(b), wellFormedBytewise(b); got != want {
			t.Fatalf("WellFormedChunk(%q) = %v, the byte-by-byte check says %v", b, got, want)
		}
	})
}

// wellFormedBytewise is WellFormedChunk as it was, scanning strings a byte at a time: the
// reference the fast one must agree with.
func wellFormedBytewise(data []byte) bool {
	i, n := 0, len(data)
	for i < n && isSpace(data[i]) {
		i++
	}
	for n > i && isSpace(data[n-1]) {
		n--
	}
	if i >= n || data[i] != '{' || data[n-1] != '}' {
		return false
	}
	var stack [64]byte
	depth := 0
	prev := byte(0)
	for ; i < n; i++ {
		c := data[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			if prev == '}' || prev == ']' || prev == '"' {
				return false
			}
			for i++; i < n && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				} else if data[i] < 0x20 {
					return false
				}
			}
			if i >= n {
				return false
			}
		case '{', '[':
			if prev == '}' || prev == ']' || prev == '"' {
				return false
			}
			if depth < len(stack) {
				stack[depth] = c
			}
			depth++
		case '}', ']':
			if prev == ',' || prev == ':' || depth == 0 {
				return false
			}
			depth--
			if depth < len(stack) && stack[depth] != c-2 {
				return false
			}
			if depth == 0 && i != n-1 {
				return false
			}
		case ',', ':':
			if prev == ',' || prev == ':' || prev == '{' || prev == '[' || prev == 0 {
				return false
			}
		default:
			if prev == '}' || prev == ']' || prev == '"' {
				return false
			}
			for i+1 < n && !isDelim(data[i+1]) {
				i++
			}
			c = '"'
		}
		prev = c
	}
	return depth == 0
}

func BenchmarkWellFormedChunk(b *testing.B) {
	d := []byte(`{"id":"chatcmpl-c6dc8118e65dd355","object":"chat.completion.chunk","created":1796039383,"model":"llama-3-8b","choices":[{"index":0,"delta":{"content":" system"},"logprobs":null,"finish_reason":null}]}`)
	for b.Loop() {
		if !WellFormedChunk(d) {
			b.Fatal()
		}
	}
}

func BenchmarkWellFormedChunkBytewise(b *testing.B) {
	d := []byte(`{"id":"chatcmpl-c6dc8118e65dd355","object":"chat.completion.chunk","created":1796039383,"model":"llama-3-8b","choices":[{"index":0,"delta":{"content":" system"},"logprobs":null,"finish_reason":null}]}`)
	for b.Loop() {
		if !wellFormedBytewise(d) {
			b.Fatal()
		}
	}
}
