package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func FuzzParseRequest(f *testing.F) {
	seeds := []struct {
		kind Kind
		body string
	}{
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"Hello"}]}`},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"{\"a\":[1]}"},{"type":"image_url","image_url":{"url":"x"}}]}],"stream":true,"stream_options":{"include_usage":true}}`},
		{KindChat, `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}},"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"x\":{\"y\":1}}"}}]},{"role":"tool","content":"[1,[2]]"}]}`},
		{KindChat, `{"mod\u0065l":"\ud83d\ude00","messages":[{"role":"user","content":"\u005b[]]"}],"max_tokens":1e2,"n":2,"seed":-1,"temperature":0.5,"user":"u","response_format":{"type":"json_schema"}}`},
		{KindChat, `{"model":"m","messages":[]}`},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"model":"n"}`},
		{KindChat, `{"model":5}`},
		{KindChat, `[1]`},
		{KindChat, `{"model":"m",`},
		{KindCompletion, `{"model":"m","prompt":"once"}`},
		{KindCompletion, `{"model":"m","prompt":[[1,2],[3]]}`},
		{KindCompletion, `{"model":"m","prompt":[1,2,3],"max_tokens":-1}`},
		{KindEmbedding, `{"model":"m","input":["a","b"]}`},
		{KindEmbedding, `{"model":"m","input":""}`},
		{KindModels, ``},
		{KindChat, `{"messages":[{"role":"user","content":"no model"}]}`},
		{KindEmbedding, `{"model":null,"input":"x"}`},
		{KindResponses, `{"model":"m","input":"Hello"}`},
		{KindResponses, `{"input":"no model","instructions":"Be brief.","max_output_tokens":16,"stream":true}`},
		{KindResponses, `{"model":"m","instructions":"\u005b[1]]","tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"web_search_preview"}],"tool_choice":{"type":"function","name":"f"},"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"},"strict":true}},"input":[{"role":"user","content":[{"type":"input_text","text":"{\"a\":[1]}"},{"type":"input_image","image_url":"https://x"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{\"x\":{\"y\":1}}"},{"type":"function_call_output","call_id":"c","output":"[1,[2]]"},{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"t"}]}]}`},
		{KindResponses, `{"model":"m","input":[{"content":"x","role":"user","type":"message"},{"output":{"type":"computer_screenshot"},"type":"computer_call_output"}],"previous_response_id":"resp_1","store":false,"background":true,"input":[]}`},
		{KindResponses, `{"model":"m","input":[{"content":"no role"}]}`},
		{KindResponses, `{"model":"m","input":[{"type":"function_call_output","output":5}]}`},
		{KindResponses, `{"model":"m","input":[1,2]}`},
		{KindResponses, `{"model":"m","input":[{"role":"user","content":"x"}],"input":null}`},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_to\u212aens":100000}`},
		{KindChat, "{\"model\":\"m\",\"me\u017f\u017fages\":[],\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_call\u017f\":[]}]}"},
	}
	for _, s := range seeds {
		f.Add(uint8(s.kind), []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k % 6)
		r, err := ParseRequest(kind, body)
		if kind != KindChat && kind != KindCompletion && kind != KindEmbedding && kind != KindResponses {
			if err != nil || r.Kind != kind || !bytes.Equal(r.Body, body) {
				t.Fatalf("kind %v: %+v %v", kind, r, err)
			}
			return
		}
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("error %T is not *Error", err)
		}
		valid := json.Valid(body)
		if (e != nil && e.Code == codeInvalidJSON) == valid {
			t.Fatalf("invalid_json = %v but json.Valid = %v (%v)", e != nil && e.Code == codeInvalidJSON, valid, err)
		}
		if err != nil {
			if e.Status != 400 || e.Message == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		if r.N < 1 || r.MaxTokens < 0 || r.PromptChars < 0 || r.PromptTokens < 0 || r.Depth < 0 || r.Tools < 0 ||
			(kind == KindChat && r.Messages < 1) || ((kind == KindCompletion || kind == KindEmbedding) && r.Inputs < 1) ||
			(kind == KindResponses && (r.Messages < 0 || r.Inputs != 0 || r.N != 1 || r.IncludeUsage)) {
			t.Fatalf("inconsistent %+v", r)
		}
		if r.PromptChars > len(body) {
			t.Fatalf("%d chars in %d bytes", r.PromptChars, len(body))
		}

		// encoding/json reads the same top level (its map decoding is case-sensitive and
		// keeps the last duplicate, like ParseRequest).
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		// No key that encoding/json would read as a measured field (case folded) passed
		// under another spelling.
		for k := range top {
			for _, m := range topKeys {
				if k != m && strings.EqualFold(k, m) {
					t.Fatalf("key %q (read as %q by encoding/json) accepted", k, m)
				}
			}
		}
		// The model may be absent or null (Model ""), never "".
		var model *string
		if raw, ok := top["model"]; ok && json.Unmarshal(raw, &model) != nil {
			t.Fatalf("model %s accepted", raw)
		}
		if (model == nil && r.Model != "") || (model != nil && (*model == "" || (utf8.ValidString(r.Model) && *model != r.Model))) {
			t.Fatalf("model %q, encoding/json says %v", r.Model, model)
		}
		if raw, ok := top["stream"]; ok {
			var s *bool
			_ = json.Unmarshal(raw, &s)
			if (s != nil && *s) != r.Stream {
				t.Fatalf("stream %v, encoding/json says %s", r.Stream, raw)
			}
		}
		if kind == KindChat {
			var msgs []json.RawMessage
			if err := json.Unmarshal(top["messages"], &msgs); err != nil || len(msgs) != r.Messages {
				t.Fatalf("%d messages, encoding/json says %d (%v)", r.Messages, len(msgs), err)
			}
		}
		if kind == KindResponses {
			// input is a string (one item) or an array of objects; a message item has a role.
			var s string
			var items []map[string]json.RawMessage
			switch {
			case json.Unmarshal(top["input"], &s) == nil:
				if r.Messages != 1 {
					t.Fatalf("string input: %d items", r.Messages)
				}
			case json.Unmarshal(top["input"], &items) == nil:
				if len(items) != r.Messages {
					t.Fatalf("%d items, encoding/json says %d", r.Messages, len(items))
				}
				for i, it := range items {
					var typ *string
					_ = json.Unmarshal(it["type"], &typ)
					var role *string
					_ = json.Unmarshal(it["role"], &role)
					if (typ == nil || *typ == "message") && role == nil {
						t.Fatalf("item %d has no role", i)
					}
				}
			default:
				t.Fatalf("input %s accepted", top["input"])
			}
			var prev *string
			_ = json.Unmarshal(top["previous_response_id"], &prev)
			want := ""
			if prev != nil {
				want = *prev // an empty id continues nothing, as an absent one
			}
			if want != r.PreviousResponseID && utf8.ValidString(r.PreviousResponseID) {
				t.Fatalf("previous_response_id %q, encoding/json says %q", r.PreviousResponseID, want)
			}
		}

		// Rewriting the model changes the model and nothing else.
		nb, err := SetModel(body, "fuzz/model\"é")
		if err != nil {
			t.Fatalf("SetModel: %v", err)
		}
		r2, err := ParseRequest(kind, nb)
		if err != nil {
			t.Fatalf("after SetModel: %v\n%s", err, nb)
		}
		if r2.Model != "fuzz/model\"é" {
			t.Fatalf("model after SetModel = %q", r2.Model)
		}
		a, b := *r, *r2
		a.Body, b.Body, a.Model, b.Model = nil, nil, "", ""
		if !equalRequest(a, b) {
			t.Fatalf("SetModel changed more than the model:\n%+v\n%+v", show(a), show(b))
		}
	})
}

// FuzzTap: whatever a model server sends, the Tap's counts stay consistent, and observing
// an event never allocates more than the copy of a changed finish reason.
func FuzzTap(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.sse"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`data: {"type":"response.completed","response":{"status":"completed","output":[{"type":"function_call"}],"usage":{"input_tokens":1,"output_tokens":2,"total_tokens":3}},"sequence_number":4}` + "\n\n"))
	f.Add([]byte(`{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		var stream, body Tap
		r := NewReader(bytes.NewReader(in), 1<<16)
		for {
			e, err := r.Next()
			if err != nil {
				break
			}
			stream.Observe(e, time.Unix(int64(stream.Events), 0))
		}
		body.ObserveBody(in, time.Unix(0, 0))
		for _, tap := range []*Tap{&stream, &body} {
			if tap.TokenEvents > tap.Events || tap.Tokens < 0 || tap.Finished < 0 || tap.Seq < 0 || tap.Gaps > tap.TokenEvents ||
				(tap.TokenEvents > 0) != !tap.FirstToken.IsZero() {
				t.Fatalf("inconsistent %+v", tap)
			}
		}
	})
}

func FuzzSSEReader(f *testing.F) {
	for _, s := range []string{
		"data: a\n\n",
		"data: a\r\nevent: x\r\n\r\ndata: [DONE]\r\n\r\n",
		"data: a\rdata: b\r\r",
		": ping\n\ndata:x\ndata\n\n\n",
		"\xef\xbb\xbfdata: x\n\n",
		"data: truncated",
		"id: 1\nretry: 5\nevent: error\ndata: {\"error\":{}}\n\n",
	} {
		f.Add([]byte(s), uint8(1))
		f.Add([]byte(s), uint8(7))
	}
	// The captured streams, too.
	files, _ := filepath.Glob(filepath.Join("testdata", "*.sse"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(0))
	}
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		const max = 1 << 16
		whole := readEvents(t, bytes.NewReader(in), max)
		chunked := readEvents(t, &chunkReader{b: in, sizes: []int{int(chunk%13) + 1, int(chunk%5) + 1, 1}}, max)
		ref := referenceSSE(in)

		for _, got := range [][]ev{whole.events, chunked.events} {
			// Raws add up to the input.
			var cat []byte
			for _, e := range got {
				cat = append(cat, e.raw...)
				if len(e.raw) > max {
					t.Fatalf("event of %d bytes over the bound", len(e.raw))
				}
				if strings.ContainsAny(e.data, "\r") || strings.ContainsAny(e.name, "\r\n") {
					t.Fatalf("line break in data %q or name %q", e.data, e.name)
				}
			}
			if len(in) <= max/2 && !bytes.Equal(cat, in) {
				t.Fatalf("Raws add up to %q, want %q", cat, in)
			}
		}
		if whole.err != chunked.err {
			t.Fatalf("whole read ends with %v, chunked with %v", whole.err, chunked.err)
		}
		if len(in) > max/2 {
			return
		}
		// Data and names match a straightforward reading of the spec.
		want := ref.events
		for _, got := range []readResult{whole, chunked} {
			evs := got.events
			if got.err == io.ErrUnexpectedEOF {
				evs = evs[:len(evs)-1]
			}
			var dn []ev
			for _, e := range evs {
				if e.raw == "\n" && e.data == null && e.name == null && len(dn) == len(want) {
					continue // the '\n' of a final "\r\n" split from its '\r'
				}
				dn = append(dn, ev{"", e.data, e.name})
			}
			if len(dn) != len(want) {
				t.Fatalf("%d events, reference has %d:\n%q\n%q", len(dn), len(want), dn, want)
			}
			for i := range dn {
				if dn[i] != want[i] {
					t.Fatalf("event %d = %q, reference %q", i, dn[i], want[i])
				}
			}
			if (got.err == io.ErrUnexpectedEOF) != ref.partial {
				t.Fatalf("err %v, reference partial = %v", got.err, ref.partial)
			}
		}
	})
}

type readResult struct {
	events []ev
	err    error
}

func readEvents(t *testing.T, r io.Reader, max int) readResult {
	t.Helper()
	evs, err := readAll(NewReader(r, max))
	if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("unexpected error %v", err)
	}
	return readResult{evs, err}
}

// chunkReader returns b in reads of the given sizes, cycling.
type chunkReader struct {
	b     []byte
	sizes []int
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), c.sizes[c.i%len(c.sizes)], len(c.b))
	c.i++
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

type reference struct {
	events  []ev // data and name only
	partial bool
}

// referenceSSE parses a whole stream the simple way: split into lines, one event per blank
// line.
func referenceSSE(in []byte) reference {
	in = bytes.TrimPrefix(in, []byte("\xef\xbb\xbf"))
	var (
		out         reference
		data        []string
		name        *string
		pendingLine bool
	)
	for len(in) > 0 {
		n := bytes.IndexAny(in, "\r\n")
		if n < 0 {
			out.partial = true
			break
		}
		line := string(in[:n])
		if in[n] == '\r' && n+1 < len(in) && in[n+1] == '\n' {
			n++
		}
		in = in[n+1:]
		if line == "" {
			e := ev{data: null, name: null}
			if data != nil {
				e.data = strings.Join(data, "\n")
			}
			if name != nil {
				e.name = *name
			}
			out.events = append(out.events, e)
			data, name, pendingLine = nil, nil, false
			continue
		}
		pendingLine = true
		if line[0] == ':' {
			continue
		}
		field, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "data":
			data = append(data, value)
		case "event":
			v := value
			name = &v
		}
	}
	if pendingLine {
		out.partial = true
	}
	return out
}

// quoteRaw spells text as the contents of a JSON string: '"', '\\' and control characters
// escaped, the bytes chosen by spell (bit i%8 for byte i) as \u00XX, everything else as it is
// (invalid UTF-8 included, which ParseRequest tolerates).
func quoteRaw(text []byte, spell uint8) []byte {
	const hex = "0123456789abcdef"
	var out []byte
	for i, c := range text {
		switch {
		case c < 0x20 || c == '"' || c == '\\' || (c < 0x80 && spell>>(i%8)&1 == 1):
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			out = append(out, c)
		}
	}
	return out
}

// FuzzTextDepth checks the streaming depth measurement against refDepth, the rule written
// the plain way, for text as message content, as tool-call arguments and inside a value.
func FuzzTextDepth(f *testing.F) {
	for _, s := range []string{
		"hello", `{"a":1}`, `Process this: {"a":{"b":[1]}} thanks`, "```json\n{\"a\":[[1]]}\n```",
		`{"a":1} and more`, `{not json}`, `[[[`, `[x[x[x`, `[1, 2, {"a": [[[[1]]]]} oops`,
		`{"a": "see {\"b\":[1]}"}`, `{"a":"{\"b\":\"{\\\"c\\\":[1]}\"}"}`, `[01]`, `[1.5e+3, -0, true, null, false]`,
		`["\u005b[1]]", "\ud83d\ude00", "a\qb"]`, "[\"line\nbreak\"]", `{"k": [1, 2,]}`, `[tru`, `{"a" x {"b":{"c":1}}}`,
		"func f() {\n\tif x {\n\t\treturn []int{1}\n\t}\n}", `| a | [b](c) |`, `$[a, [b, c]]$`,
		`["["["["["["["["["[1]"]"]"]"]"]"]"]"]"]`,
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(0x5a))
	}
	// Strings in strings past the levels that are followed.
	deep := `[1]`
	for range textLevels + 1 {
		q, _ := json.Marshal(deep)
		deep = "[" + string(q) + "]"
	}
	f.Add([]byte(deep), uint8(0))
	f.Fuzz(func(t *testing.T, text []byte, spell uint8) {
		want, whole := refDepth(text, 0)
		raw := quoteRaw(text, spell)
		var ts textScanner
		if d, w := ts.measure(raw); d != want || w != whole {
			t.Fatalf("measure %q = %d, %v; the rule says %d, %v", text, d, w, want, whole)
		}
		r, err := ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":"`+string(raw)+`"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if r.Depth != want {
			t.Fatalf("content %q: Depth %d, the rule says %d", text, r.Depth, want)
		}
		args := want
		if whole {
			args = max(want-1, 1)
		}
		r, err = ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"`+string(raw)+`"}}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if r.Depth != args {
			t.Fatalf("arguments %q: Depth %d, the rule says %d", text, r.Depth, args)
		}
		// As a string in another field of a part, one level down in an object.
		r, err = ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x","meta":{"k":"`+string(raw)+`"}}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if r.Depth != 1+want {
			t.Fatalf("string in a part's field %q: Depth %d, the rule says %d", text, r.Depth, 1+want)
		}
	})
}

// FuzzAppendString: whatever the bytes, AppendString appends a JSON string that encoding/json
// reads back as the input, invalid UTF-8 replaced.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\s/", "\x00\x1f\x7f", "é😀", "bad\xffutf8\xc3", "\u2028\u2029", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendString([]byte("x"), s)
		if out[0] != 'x' {
			t.Fatalf("AppendString overwrote dst: %q", out)
		}
		var back string
		if err := json.Unmarshal(out[1:], &back); err != nil {
			t.Fatalf("%q: %s is not a JSON string: %v", s, out[1:], err)
		}
		// Each byte of invalid UTF-8 becomes one U+FFFD, as ranging over the string reads it.
		if want := strings.Map(func(r rune) rune { return r }, s); back != want {
			t.Errorf("%q: read back as %q, want %q", s, back, want)
		}
	})
}
