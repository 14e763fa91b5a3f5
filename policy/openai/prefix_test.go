package openai

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// longText returns n bytes of distinct-looking prose, tagged so different tags differ early.
func longText(tag string, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "%s sentence %d of the shared context. ", tag, i)
	}
	return sb.String()[:n]
}

func chatJSON(t *testing.T, tools string, msgs ...string) []byte {
	t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	m := make([]msg, len(msgs))
	for i, s := range msgs {
		m[i] = msg{Role: []string{"system", "user", "assistant"}[min(i, 1+(i+1)%2)], Content: s}
	}
	b, err := json.Marshal(map[string]any{"model": "m", "messages": m})
	if err != nil {
		t.Fatal(err)
	}
	if tools != "" {
		b = append(b[:len(b)-1], `,"tools":`+tools+`}`...)
	}
	return b
}

func hashOf(t *testing.T, kind Kind, body []byte) uint64 {
	t.Helper()
	r, err := ParseRequest(kind, body)
	if err != nil {
		t.Fatalf("ParseRequest(%s): %v", body, err)
	}
	return r.PrefixHash
}

func TestPrefixHash(t *testing.T) {
	sys := longText("system", 3000)   // longer than PrefixHashBytes
	sysB := longText("another", 3000) // differs from the first byte
	mid := longText("mid", 600)       // system+user of 600+600 spans the bound
	tool := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	tool2 := `[{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}]`

	type tc struct {
		name string
		kind Kind
		a, b string // bodies
		same bool   // want equal hashes (both non-zero)
	}
	j := func(b []byte) string { return string(b) }
	tests := []tc{
		{"shared long system prompt, different questions", KindChat,
			j(chatJSON(t, "", sys, "What is the weather?")), j(chatJSON(t, "", sys, "Tell me a joke.")), true},
		{"different system prompts", KindChat,
			j(chatJSON(t, "", sys, "q")), j(chatJSON(t, "", sysB, "q")), false},
		{"same first 2048 bytes across messages", KindChat,
			j(chatJSON(t, "", mid, mid, mid, mid, "first")), j(chatJSON(t, "", mid, mid, mid, mid, "second")), true},
		{"difference inside the first 2048 bytes", KindChat,
			j(chatJSON(t, "", mid, "x"+mid)), j(chatJSON(t, "", mid, "y"+mid)), false},
		{"message boundaries count", KindChat,
			j(chatJSON(t, "", mid[:300], mid[300:])), j(chatJSON(t, "", mid[:301], mid[301:])), false},
		{"content parts hash like string content", KindChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + mid + `"},{"type":"image_url","image_url":{"url":"http://x/a.png"}}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":"` + mid + `"}]}`, true},
		{"roles and other fields are not hashed", KindChat,
			`{"model":"a","temperature":1,"messages":[{"role":"user","content":"` + mid + `"}]}`,
			`{"model":"b","messages":[{"content":"` + mid + `","role":"system","name":"x"}]}`, true},
		{"tools change the hash", KindChat,
			j(chatJSON(t, tool, sys, "q")), j(chatJSON(t, tool2, sys, "q")), false},
		{"tools without vs with", KindChat,
			j(chatJSON(t, "", sys, "q")), j(chatJSON(t, tool, sys, "q")), false},
		{"tools before or after messages", KindChat,
			`{"tools":` + tool + `,"model":"m","messages":[{"role":"user","content":"` + mid + `"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"` + mid + `"}],"tools":` + tool + `}`, true},
		{"completion prompt", KindCompletion,
			`{"model":"m","prompt":"` + sys + `"}`, `{"model":"m","prompt":"` + sys[:2100] + `"}`, true},
		{"completion prompts array", KindCompletion,
			`{"model":"m","prompt":["` + mid + `","a"]}`, `{"model":"m","prompt":["` + mid + `","b"]}`, false},
		{"tool call arguments are prompt text", KindChat,
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":\"` + mid + `\"}"}}]}]}`,
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"b\":\"` + mid + `\"}"}}]}]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ha, hb := hashOf(t, tt.kind, []byte(tt.a)), hashOf(t, tt.kind, []byte(tt.b))
			if ha == 0 || hb == 0 {
				t.Fatalf("hashes %#x, %#x: want both non-zero", ha, hb)
			}
			for _, b := range []string{tt.a, tt.b} {
				if r, _ := ParseRequest(tt.kind, []byte(b)); r.PrefixLen < PrefixHashMinBytes || r.PrefixLen > PrefixHashBytes {
					t.Errorf("PrefixLen = %d, want within [%d, %d]", r.PrefixLen, PrefixHashMinBytes, PrefixHashBytes)
				}
			}
			if (ha == hb) != tt.same {
				t.Fatalf("hashes %#x, %#x: equal = %v, want %v", ha, hb, ha == hb, tt.same)
			}
		})
	}
}

func TestPrefixHashZero(t *testing.T) {
	long := longText("x", 3000)
	tests := []struct {
		name string
		kind Kind
		body string
	}{
		{"short chat", KindChat, `{"model":"m","messages":[{"role":"user","content":"Hello there"}]}`},
		{"just under the minimum", KindChat,
			`{"model":"m","messages":[{"role":"user","content":"` + long[:PrefixHashMinBytes-2] + `"}]}`},
		{"short chat with long tools", KindChat,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"` + long[:500] + `"}}]}`},
		{"embeddings", KindEmbedding, `{"model":"m","input":"` + long + `"}`},
		{"token-id prompt", KindCompletion, `{"model":"m","prompt":[` + strings.Repeat("1,", 600) + `1]}`},
		{"image only", KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:` + long + `"}}]}]}`},
		{"models", KindModels, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if h := hashOf(t, tt.kind, []byte(tt.body)); h != 0 {
				t.Fatalf("PrefixHash = %#x, want 0", h)
			}
			if r, _ := ParseRequest(tt.kind, []byte(tt.body)); r.PrefixLen != 0 {
				t.Fatalf("PrefixLen = %d, want 0", r.PrefixLen)
			}
		})
	}
	// At the minimum (the text plus its separator) the hash is set.
	body := `{"model":"m","messages":[{"role":"user","content":"` + long[:PrefixHashMinBytes-1] + `"}]}`
	if h := hashOf(t, KindChat, []byte(body)); h == 0 {
		t.Fatal("PrefixHash = 0 at the minimum length")
	}
}

// TestPrefixHasherChunking: the hash depends on the bytes and the separators only, not on
// how the bytes were split across writes.
func TestPrefixHasherChunking(t *testing.T) {
	data := []byte(longText("chunk", 3000))
	var one prefixHasher
	one.write(data)
	want := one.sum(1)
	for _, step := range []int{1, 3, 7, 8, 9, 63, 1000} {
		var h prefixHasher
		for i := 0; i < len(data); i += step {
			h.write(data[i:min(i+step, len(data))])
		}
		if got := h.sum(1); got != want {
			t.Errorf("step %d: %#x, want %#x", step, got, want)
		}
		if h.n != PrefixHashBytes {
			t.Errorf("step %d: took %d bytes, want %d", step, h.n, PrefixHashBytes)
		}
	}
	// Bytes past the bound do not count; bytes before it do.
	var a, b prefixHasher
	a.write(data[:PrefixHashBytes])
	b.write(append(append([]byte(nil), data[:PrefixHashBytes]...), "tail"...))
	if a.sum(1) != b.sum(1) {
		t.Error("bytes past PrefixHashBytes changed the hash")
	}
	var c prefixHasher
	c.write(data[:PrefixHashBytes-1])
	c.write([]byte{'!'})
	if c.sum(1) == a.sum(1) {
		t.Error("the last byte within the bound did not change the hash")
	}
}

func TestPrefixHashDoesNotAllocate(t *testing.T) {
	body := chatBody(1000)
	short := chatBody(10) // the same fields, too short to hash
	base := testing.AllocsPerRun(100, func() {
		if r, err := ParseRequest(KindChat, short); err != nil || r.PrefixHash != 0 {
			t.Fatalf("ParseRequest: %v, hash %#x", err, r.PrefixHash)
		}
	})
	allocs := testing.AllocsPerRun(100, func() {
		r, err := ParseRequest(KindChat, body)
		if err != nil || r.PrefixHash == 0 {
			t.Fatalf("ParseRequest: %v, hash %#x", err, r.PrefixHash)
		}
	})
	if allocs > base {
		t.Fatalf("ParseRequest of a 1,000-token chat allocates %.0f times, a short one %.0f", allocs, base)
	}
	data := []byte(longText("a", 4000))
	if n := testing.AllocsPerRun(100, func() {
		var h prefixHasher
		h.write(data[:100])
		h.sep()
		h.write(data)
		_ = h.sum(1)
	}); n != 0 {
		t.Fatalf("prefixHasher allocates %.0f times", n)
	}
}

// BenchmarkPrefixHasher is the prefix hash's share of ParseRequest: PrefixHashBytes bytes
// in four pieces.
func BenchmarkPrefixHasher(b *testing.B) {
	data := []byte(longText("bench", PrefixHashBytes))
	b.SetBytes(PrefixHashBytes)
	b.ReportAllocs()
	var sum uint64
	for b.Loop() {
		var h prefixHasher
		for i := range 4 {
			h.write(data[i*PrefixHashBytes/4 : (i+1)*PrefixHashBytes/4])
			h.sep()
		}
		sum += h.sum(PrefixHashMinBytes)
	}
	_ = sum
}

func TestPrefixHashResponses(t *testing.T) {
	sys := longText("system", 3000) // fills PrefixHashBytes alone
	sysB := longText("another", 3000)
	mid := longText("mid", 600)
	tool := `[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]`
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	rsp := func(fields ...string) string { return `{"model":"m",` + strings.Join(fields, ",") + `}` }
	in := func(s string) string { return `"input":` + q(s) }
	ins := func(s string) string { return `"instructions":` + q(s) }
	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{"shared long instructions, different questions", rsp(ins(sys), in("What is the weather?")), rsp(ins(sys), in("Tell me a joke.")), true},
		{"instructions before or after the input", rsp(ins(sys), in("q")), rsp(in("q"), ins(sys)), true},
		{"short instructions before or after the input", rsp(ins("Be brief."), in(mid)), rsp(in(mid), ins("Be brief.")), true},
		{"different long instructions", rsp(ins(sys), in("q")), rsp(ins(sysB), in("q")), false},
		{"short instructions: the input counts", rsp(ins("Be brief."), in(mid+"a")), rsp(ins("Be brief."), in(mid+"b")), false},
		{"instructions or none", rsp(ins("Be brief."), in(mid)), rsp(in(mid)), false},
		{"instructions are not input", rsp(ins(mid), in("")), rsp(in(mid)), false},
		{"a string input hashes like a user message", rsp(in(mid)), rsp(`"input":[{"role":"user","content":[{"type":"input_text","text":` + q(mid) + `}]}]`), true},
		{"roles and ids are not hashed", rsp(`"input":[{"role":"user","content":` + q(mid) + `}]`), rsp(`"input":[{"type":"message","id":"x","role":"developer","content":` + q(mid) + `}]`), true},
		{"function call arguments are prompt text",
			rsp(`"input":[{"role":"user","content":` + q(mid) + `},{"type":"function_call","call_id":"1","name":"f","arguments":"{\"a\":1}"}]`),
			rsp(`"input":[{"role":"user","content":` + q(mid) + `},{"type":"function_call","call_id":"1","name":"f","arguments":"{\"a\":2}"}]`), false},
		{"tools change the hash", rsp(ins(sys), in("q"), `"tools":`+tool), rsp(ins(sys), in("q")), false},
		{"tools before or after", rsp(`"tools":`+tool, ins(sys), in("q")), rsp(in("q"), ins(sys), `"tools":`+tool), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ha, hb := hashOf(t, KindResponses, []byte(tt.a)), hashOf(t, KindResponses, []byte(tt.b))
			if ha == 0 || hb == 0 {
				t.Fatalf("hashes %#x, %#x: want both non-zero", ha, hb)
			}
			for _, b := range []string{tt.a, tt.b} {
				if r, _ := ParseRequest(KindResponses, []byte(b)); r.PrefixLen < PrefixHashMinBytes || r.PrefixLen > PrefixHashBytes {
					t.Errorf("PrefixLen = %d, want within [%d, %d]", r.PrefixLen, PrefixHashMinBytes, PrefixHashBytes)
				}
			}
			if (ha == hb) != tt.same {
				t.Fatalf("hashes %#x, %#x: equal = %v, want %v", ha, hb, ha == hb, tt.same)
			}
		})
	}
	// The minimum counts the instructions and the input together.
	half := longText("h", PrefixHashMinBytes/2)
	for _, tt := range []struct {
		name string
		body string
		want bool
	}{
		{"short", rsp(ins("Be brief."), in("hi")), false},
		{"half and half", rsp(ins(half), in(half)), true},
		{"half alone", rsp(ins(half), in("x")), false},
		{"long tools do not count", rsp(in("hi"), `"tools":[{"type":"function","name":`+q(sys)+`}]`), false},
	} {
		r, err := ParseRequest(KindResponses, []byte(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		if (r.PrefixHash != 0) != tt.want || (r.PrefixLen != 0) != tt.want {
			t.Errorf("%s: PrefixHash %#x PrefixLen %d, want set %v", tt.name, r.PrefixHash, r.PrefixLen, tt.want)
		}
	}
	// The hash is computed without allocating.
	body := responsesBody(1000)
	if a := testing.AllocsPerRun(50, func() {
		if r, err := ParseRequest(KindResponses, body); err != nil || r.PrefixHash == 0 {
			t.Fatal(err)
		}
	}); a > 3 {
		t.Errorf("%v allocations", a)
	}
}
