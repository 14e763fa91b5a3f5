package openai

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// plainTap is a Tap's state without its shape: what observe's reading of a chunk in full
// and its reading of the chunk's string alone must agree on.
func plainTap(t Tap) Tap {
	t.shape, t.shapeStart, t.shapeEnd, t.shapes = "", 0, 0, 0
	return t
}

// shapeCheck feeds each event's data to a tap as the relay does and to a reference tap
// that never uses a shape (it is cleared before each event), and fails at the first event
// after which they differ, or whose verdict (relayable or not) differs.
func shapeCheck(t *testing.T, name string, datas [][]byte) {
	t.Helper()
	start := time.Unix(1000, 0)
	got, ref := &Tap{Start: start}, &Tap{Start: start}
	for i, d := range datas {
		now := start.Add(time.Duration(i+1) * 7 * time.Millisecond)
		ev := Event{Data: d, Raw: d}
		ref.shape = ""
		okGot, okRef := got.ObserveChunk(ev, now), ref.ObserveChunk(ev, now)
		if okGot != okRef {
			t.Fatalf("%s: event %d %q: relayable %v with shapes, %v without", name, i, d, okGot, okRef)
		}
		if plainTap(*got) != plainTap(*ref) {
			t.Fatalf("%s: event %d %q:\n with shapes %+v\n without    %+v", name, i, d, plainTap(*got), plainTap(*ref))
		}
	}
}

// chunk renders a chat chunk the way vLLM does, with delta's members as given.
func chunk(id, delta, finish string) []byte {
	return fmt.Appendf(nil, `{"id":"%s","object":"chat.completion.chunk","created":1718041200,"model":"sim-llama","choices":[{"index":0,"delta":{%s},"logprobs":null,"finish_reason":%s}]}`, id, delta, finish)
}

func TestTapShapeAgreesWithFullScan(t *testing.T) {
	id := "chatcmpl-1"
	c := func(content string) []byte { return chunk(id, `"content":`+content, "null") }
	cases := map[string][][]byte{
		"plain stream": {
			chunk(id, `"role":"assistant","content":""`, "null"),
			c(`"Hello"`), c(`" world"`), c(`""`), c(`"!"`), c(`" \u00e9t\u00e9 \"quoted\" \n"`),
			c(`"日本語"`), c(`"😀"`),
			chunk(id, `"content":"."`, `"stop"`),
			[]byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718041200,"model":"sim-llama","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`),
		},
		"length finish after shaped tokens": {c(`"a"`), c(`"b"`), chunk(id, `"content":"c"`, `"length"`), c(`"d"`)},
		"tool call after content": {
			c(`"Let me look."`), c(`" Now."`),
			chunk(id, `"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":""}}]`, "null"),
			chunk(id, `"tool_calls":[{"index":0,"function":{"arguments":"{\"q\":1}"}}]`, "null"),
			c(`"after"`),
		},
		"content beside a tool call":      {c(`"x"`), chunk(id, `"content":"y","tool_calls":[{"index":0,"function":{"arguments":"{}"}}]`, "null"), c(`"z"`)},
		"content beside reasoning":        {c(`"x"`), chunk(id, `"reasoning_content":"think","content":"y"`, "null"), chunk(id, `"content":"y","reasoning_content":"think"`, "null"), c(`"z"`)},
		"null, number and object content": {c(`"x"`), c(`null`), c(`12`), c(`{"a":"b"}`), c(`"y"`)},
		"invalid strings keep the shape's verdict": {
			c(`"x"`), c(`"y"`), []byte(strings.Replace(string(c(`"ab"`)), "ab", "a\x01", 1)),
			c(`"bad \q escape"`), c(`"open`), c(`"y"`),
		},
		"truncated and trailing bytes":  {c(`"x"`), c(`"y"`)[:60], append(c(`"y"`), '}'), append(c(`"y"`), ' ', '\n'), c(`"z"`)},
		"another id (a resumed stream)": {c(`"x"`), chunk("chatcmpl-2", `"content":"y"`, "null"), chunk("chatcmpl-2", `"content":"z"`, "null")},
		"first chunk without id": {
			[]byte(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}`),
			[]byte(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"y"}}]}`),
			[]byte(`{"id":"late","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"z"}}]}`),
		},
		"two choices (n=2)": {
			[]byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}`),
			[]byte(`{"id":"c","choices":[{"index":0,"delta":{"content":"c"}},{"index":1,"delta":{"content":"d"}}]}`),
			[]byte(`{"id":"c","choices":[{"index":1,"delta":{"content":"e"},"finish_reason":"stop"}]}`),
		},
		"an error object, and a null one": {c(`"x"`), []byte(`{"id":"chatcmpl-1","error":null,"choices":[{"index":0,"delta":{"content":"y"}}]}`), []byte(`{"id":"chatcmpl-1","error":{"message":"boom"},"choices":[{"index":0,"delta":{"content":"y"}}]}`), c(`"z"`)},
		"spaces around the string": {
			[]byte(`{"id": "s", "choices": [{"index": 0, "delta": {"content": "a"}}]}`),
			[]byte(`{"id": "s", "choices": [{"index": 0, "delta": {"content": "bcd"}}]}`),
			[]byte(`{"id": "s", "choices": [{"index": 0, "delta": {"content":"e"}}]}`),
		},
		"a message (non-streaming shape) and text": {
			[]byte(`{"id":"m","choices":[{"index":0,"message":{"content":"a"}}]}`),
			[]byte(`{"id":"m","choices":[{"index":0,"message":{"content":"b"}}]}`),
			[]byte(`{"id":"m","choices":[{"index":0,"text":"a"}]}`),
			[]byte(`{"id":"m","choices":[{"index":0,"text":"b"}]}`),
		},
		"a completion stream": {
			[]byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":null,"stop_reason":null}]}`),
			[]byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" b","logprobs":null,"finish_reason":null,"stop_reason":null}]}`),
			[]byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null}]}`),
			[]byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" c","logprobs":null,"finish_reason":"length","stop_reason":null}]}`),
		},
		"a reasoning stream, then its answer": {
			chunk(id, `"role":"assistant","content":null,"reasoning_content":""`, "null"),
			chunk(id, `"reasoning_content":"Let"`, "null"), chunk(id, `"reasoning_content":" me"`, "null"),
			chunk(id, `"content":"x","reasoning_content":null`, "null"), chunk(id, `"content":"y"`, "null"),
			chunk(id, `"content":"y","reasoning_content":"z"`, "null"), chunk(id, `"content":"w"`, "null"),
			chunk(id, `"refusal":"no"`, "null"), chunk(id, `"refusal":"pe"`, "null"),
		},
		// Each of these repeats, around another string, a member that changes the tap every
		// time it is read: a chunk carrying one is never a shape.
		"a finish reason repeated": {c(`"x"`), chunk(id, `"content":"a"`, `"stop"`), chunk(id, `"content":"b"`, `"stop"`)},
		"a tool call repeated beside content": {
			chunk(id, `"content":"a","tool_calls":[{"index":0,"function":{"arguments":"{}"}}]`, "null"),
			chunk(id, `"content":"b","tool_calls":[{"index":0,"function":{"arguments":"{}"}}]`, "null"),
		},
		"a function call repeated beside content": {
			chunk(id, `"content":"a","function_call":{"name":"f","arguments":"x"}`, "null"),
			chunk(id, `"content":"b","function_call":{"name":"f","arguments":"x"}`, "null"),
		},
		"embeddings data beside an empty text": {
			[]byte(`{"id":"e","data":[1],"choices":[{"index":0,"delta":{"content":""}}]}`),
			[]byte(`{"id":"e","data":[1],"choices":[{"index":0,"delta":{"content":""}}]}`),
		},
		"a Responses terminal type beside choices": {
			[]byte(`{"type":"response.completed","choices":[{"index":0,"delta":{"content":"a"}}]}`),
			[]byte(`{"type":"response.completed","choices":[{"index":0,"delta":{"content":"b"}}]}`),
		},
		"a Responses body's status beside choices": {
			[]byte(`{"object":"response","status":"completed","choices":[{"index":0,"delta":{"content":"a"}}]}`),
			[]byte(`{"object":"response","status":"completed","choices":[{"index":0,"delta":{"content":"b"}}]}`),
		},
		"usage that changes after the shapes ran out": usageRun(),
		"usage in every chunk": {
			[]byte(`{"id":"u","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`),
			[]byte(`{"id":"u","choices":[{"index":0,"delta":{"content":"b"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`),
		},
	}
	for name, datas := range cases {
		shapeCheck(t, name, datas)
	}
}

// usageRun is five chunks with another usage each, then the fourth's bytes around another
// string: had a chunk with usage been kept as a shape (the first four would be, the fifth
// not, maxShapes reached), the last would keep the fifth's usage.
func usageRun() [][]byte {
	var out [][]byte
	u := func(n int, text string) []byte {
		return fmt.Appendf(nil, `{"id":"u","choices":[{"index":0,"delta":{"content":"%s"}}],"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}}`, text, n, n+1)
	}
	for n := 1; n <= 5; n++ {
		out = append(out, u(n, "t"))
	}
	return append(out, u(4, "other"))
}

// TestTapShapeIsUsed checks that a stream's token chunks are read by their string alone
// after the first two chunks, and that a stream whose chunks all differ beyond their
// content stops copying chunks after maxShapes.
func TestTapShapeIsUsed(t *testing.T) {
	id := "chatcmpl-1"
	tap := &Tap{}
	now := time.Unix(1, 0)
	tap.ObserveChunk(Event{Data: chunk(id, `"role":"assistant","content":""`, "null")}, now)
	for i := range 50 {
		tap.ObserveChunk(Event{Data: chunk(id, fmt.Sprintf(`"content":"tok%d"`, i), "null")}, now)
	}
	if tap.shapes != 2 || tap.TokenEvents != 50 {
		t.Fatalf("shapes %d, token events %d: want 2 shapes (role chunk, first token) and 50", tap.shapes, tap.TokenEvents)
	}
	d := chunk(id, `"content":"tok"`, "null")
	if allocs := testing.AllocsPerRun(100, func() { tap.ObserveChunk(Event{Data: d}, now) }); allocs != 0 {
		t.Errorf("a shaped chunk allocates %v times", allocs)
	}
	if !tap.shaped(d, now) {
		t.Error("a chunk of the stream's shape is not read as one")
	}

	completion := &Tap{}
	for i := range 20 {
		completion.ObserveChunk(Event{Data: fmt.Appendf(nil, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" t%d","logprobs":null,"finish_reason":null,"stop_reason":null}]}`, i)}, now)
	}
	if completion.shapes != 1 || completion.TokenEvents != 20 {
		t.Errorf("completion stream: shapes %d, token events %d: want 1 and 20", completion.shapes, completion.TokenEvents)
	}

	varying := &Tap{}
	for i := range 20 {
		varying.ObserveChunk(Event{Data: fmt.Appendf(nil, `{"id":"v","created":%d,"choices":[{"index":0,"delta":{"content":"x"}}]}`, i)}, now)
	}
	if varying.shapes != maxShapes || varying.TokenEvents != 20 {
		t.Errorf("shapes %d, token events %d: want %d and 20", varying.shapes, varying.TokenEvents, maxShapes)
	}
}

// TestTapShapeTestdata runs every recorded stream through both taps.
func TestTapShapeTestdata(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.sse"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata streams: %v", err)
	}
	for _, f := range files {
		in, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		shapeCheck(t, f, sseDatas(t, in))
	}
}

func sseDatas(t testing.TB, in []byte) [][]byte {
	r := NewReader(bytes.NewReader(in), 0)
	var out [][]byte
	for {
		e, err := r.Next()
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Data != nil && !e.IsDone() {
			out = append(out, bytes.Clone(e.Data))
		}
	}
}

// FuzzTapShape: a chunk, then two more made from it by the fuzzer: the taps with and
// without shapes agree after each.
func FuzzTapShape(f *testing.F) {
	id := "chatcmpl-9"
	f.Add(chunk(id, `"content":"a"`, "null"), chunk(id, `"content":"b"`, "null"), chunk(id, `"content":"c"`, `"stop"`))
	f.Add(chunk(id, `"role":"assistant","content":""`, "null"), chunk(id, `"content":"\u0041"`, "null"), chunk(id, `"content":"x","tool_calls":[]`, "null"))
	f.Add([]byte(`{"id":"s","choices":[{"delta":{"content":"a"}}]}`), []byte(`{"id":"s","choices":[{"delta":{"content":"a\"}}]}`), []byte(`{"id":"s","choices":[{"delta":{"content":"a"}}]}x`))
	f.Add([]byte(`{"id":"c","choices":[{"index":0,"text":"a","finish_reason":null}]}`), []byte(`{"id":"c","choices":[{"index":0,"text":"b","finish_reason":null}]}`), []byte(`{"id":"c","choices":[{"index":0,"reasoning_content":"b","finish_reason":null}]}`))
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		if len(a)+len(b)+len(c) > 1<<14 {
			return
		}
		shapeCheck(t, "fuzz", [][]byte{a, b, c, a, b})
	})
}

// TestTapShapeBounded: an answer larger than a chunk is not kept as a shape.
func TestTapShapeBounded(t *testing.T) {
	big := chunk("b", `"content":"`+strings.Repeat("x", maxShapeBytes)+`"`, "null")
	tap := &Tap{}
	tap.ObserveBody(big, time.Unix(1, 0))
	if tap.shape != "" || tap.TokenEvents != 1 {
		t.Errorf("a %d-byte answer: shape of %d bytes, %d token events; want none and 1", len(big), len(tap.shape), tap.TokenEvents)
	}
}
