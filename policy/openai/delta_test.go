package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// gotDelta is a TextDelta with its text decoded, for comparisons.
type gotDelta struct {
	Choice int
	Field  DeltaField
	Text   string
}

func scanAll(data string) ([]gotDelta, DeltaMeta) {
	var out []gotDelta
	m := ScanDeltas([]byte(data), func(d TextDelta) bool {
		out = append(out, gotDelta{d.Choice, d.Field, string(d.AppendText(nil))})
		return true
	})
	return out, m
}

func TestScanDeltas(t *testing.T) {
	const head = `"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718041200,"model":"llama"`
	for _, tc := range []struct {
		name string
		data string
		want []gotDelta
		meta DeltaMeta // ID and Model compared as strings
	}{
		{"chat content", `{` + head + `,"choices":[{"index":0,"delta":{"content":" blue"},"logprobs":null,"finish_reason":null}]}`,
			[]gotDelta{{0, FieldContent, " blue"}}, DeltaMeta{ID: []byte("chatcmpl-1"), Model: []byte("llama"), Created: 1718041200, Seq: -1, OK: true}},
		{"role chunk", `{` + head + `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
			nil, DeltaMeta{ID: []byte("chatcmpl-1"), Model: []byte("llama"), Created: 1718041200, Seq: -1, OK: true}},
		{"escapes", `{"choices":[{"index":0,"delta":{"content":"line\n\"quoted\" \u00e9\ud83d\ude00"}}]}`,
			[]gotDelta{{0, FieldContent, "line\n\"quoted\" é😀"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"n=2, index after the delta", `{"choices":[{"delta":{"content":"b"},"finish_reason":null,"index":1},{"delta":{"content":"a"},"index":0}]}`,
			[]gotDelta{{1, FieldContent, "b"}, {0, FieldContent, "a"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"no index: the position", `{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}`,
			[]gotDelta{{0, FieldContent, "a"}, {1, FieldContent, "b"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"reasoning, refusal, content", `{"choices":[{"index":0,"delta":{"reasoning_content":"think","reasoning":"more","refusal":"no","content":"yes"}}]}`,
			[]gotDelta{{0, FieldReasoning, "think"}, {0, FieldReasoning, "more"}, {0, FieldRefusal, "no"}, {0, FieldContent, "yes"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"tool calls", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":"}},{"index":1,"function":{"arguments":"[1]"}}]}}]}`,
			[]gotDelta{{0, FieldArguments, `{"a":`}, {0, FieldArguments, "[1]"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"legacy function_call", `{"choices":[{"index":2,"delta":{"function_call":{"name":"f","arguments":"{}"}}}]}`,
			[]gotDelta{{2, FieldArguments, "{}"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"finish", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":1,"delta":{},"finish_reason":null}]}`,
			[]gotDelta{{0, FieldFinish, "stop"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"completions", `{"id":"cmpl-1","object":"text_completion","created":5,"model":"m","choices":[{"index":3,"text":" once","logprobs":null,"finish_reason":"length"}]}`,
			[]gotDelta{{3, FieldContent, " once"}, {3, FieldFinish, "length"}}, DeltaMeta{ID: []byte("cmpl-1"), Model: []byte("m"), Created: 5, Seq: -1, OK: true}},
		{"usage chunk", `{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
			nil, DeltaMeta{ID: []byte("x"), Created: -1, Seq: -1, OK: true}},
		{"null and other values", `{"choices":[{"index":0,"delta":{"content":null,"tool_calls":null,"refusal":5}},7,{"index":"x","text":"t"}]}`,
			[]gotDelta{{2, FieldContent, "t"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"responses text delta, type last", `{"content_index":0,"delta":" blue","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}`,
			[]gotDelta{{0, FieldContent, " blue"}}, DeltaMeta{Created: -1, Seq: 7, Responses: true, OK: true}},
		{"responses arguments", `{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":1,"delta":"{\"x\"","sequence_number":9}`,
			[]gotDelta{{0, FieldArguments, `{"x"`}}, DeltaMeta{Created: -1, Seq: 9, Responses: true, OK: true}},
		{"responses reasoning", `{"type":"response.reasoning_text.delta","delta":"hmm","sequence_number":3}`,
			[]gotDelta{{0, FieldReasoning, "hmm"}}, DeltaMeta{Created: -1, Seq: 3, Responses: true, OK: true}},
		{"responses refusal", `{"type":"response.refusal.delta","delta":"no","sequence_number":3}`,
			[]gotDelta{{0, FieldRefusal, "no"}}, DeltaMeta{Created: -1, Seq: 3, Responses: true, OK: true}},
		{"responses delta that is not text", `{"type":"response.audio.delta","delta":"AAAA","sequence_number":4}`,
			nil, DeltaMeta{Created: -1, Seq: 4, Responses: true, OK: true}},
		{"responses created", `{"response":{"created_at":1718041200,"id":"resp_1","model":"llama","output":[],"status":"in_progress"},"sequence_number":0,"type":"response.created"}`,
			nil, DeltaMeta{ID: []byte("resp_1"), Model: []byte("llama"), Created: 1718041200, Seq: 0, Responses: true, OK: true}},
		{"a delta key in a chat chunk is not text", `{"delta":"x","choices":[]}`, nil, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"escaped keys", `{"ch\u006fices":[{"index":0,"d\u0065lta":{"c\u006fntent":"x"}}]}`,
			[]gotDelta{{0, FieldContent, "x"}}, DeltaMeta{Created: -1, Seq: -1, OK: true}},
		{"not an object", `[1,2]`, nil, DeltaMeta{Created: -1, Seq: -1}},
		{"trailing data", `{"choices":[{"text":"a"}]} 0`, []gotDelta{{0, FieldContent, "a"}}, DeltaMeta{Created: -1, Seq: -1}},
		{"cut short", `{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b`,
			[]gotDelta{{0, FieldContent, "a"}}, DeltaMeta{Created: -1, Seq: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, m := scanAll(tc.data)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("deltas %v, want %v", got, tc.want)
			}
			if string(m.ID) != string(tc.meta.ID) || string(m.Model) != string(tc.meta.Model) || m.Created != tc.meta.Created ||
				m.Seq != tc.meta.Seq || m.Responses != tc.meta.Responses || m.OK != tc.meta.OK {
				t.Errorf("meta %+v (id %q, model %q), want %+v", m, m.ID, m.Model, tc.meta)
			}
		})
	}
}

func TestScanDeltasStops(t *testing.T) {
	data := []byte(`{"choices":[{"index":0,"delta":{"content":"a","tool_calls":[{"function":{"arguments":"1"}},{"function":{"arguments":"2"}}]}},{"index":1,"text":"b"}]}`)
	for stopAt := 1; stopAt <= 4; stopAt++ {
		n := 0
		m := ScanDeltas(data, func(TextDelta) bool { n++; return n < stopAt })
		if n != stopAt || m.OK {
			t.Errorf("stop at %d: %d calls, OK %v", stopAt, n, m.OK)
		}
	}
}

// TestScanDeltasStreams: over the recorded streams of testdata, the deltas put together are
// the answer the stream ends with (the Responses done events' text, the tool call's
// arguments), and every Responses event's sequence number is read.
func TestScanDeltasStreams(t *testing.T) {
	for _, tc := range []struct {
		file  string
		field DeltaField
		want  func(events [][]byte) string
	}{
		{"responses_text.sse", FieldContent, doneText("response.output_text.done", "text")},
		{"responses_tool_call.sse", FieldArguments, doneText("response.function_call_arguments.done", "arguments")},
		{"tool_calls.sse", FieldArguments, func([][]byte) string { return `{"city": "Paris", "unit": "celsius"}` }},
	} {
		b, err := os.ReadFile(filepath.Join("testdata", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		var datas [][]byte
		r := NewReader(bytes.NewReader(b), 0)
		for {
			ev, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.Data != nil && !ev.IsDone() {
				datas = append(datas, bytes.Clone(ev.Data))
			}
		}
		var text strings.Builder
		for i, d := range datas {
			m := ScanDeltas(d, func(d TextDelta) bool {
				if d.Field == tc.field {
					text.Write(d.AppendText(nil))
				}
				return true
			})
			if !m.OK {
				t.Errorf("%s: event %d not OK", tc.file, i)
			}
			if m.Responses && m.Seq != i {
				t.Errorf("%s: event %d has sequence number %d", tc.file, i, m.Seq)
			}
		}
		if want := tc.want(datas); text.String() != want || want == "" {
			t.Errorf("%s: deltas %q, want %q", tc.file, text.String(), want)
		}
	}
}

// doneText is the string member key of the stream's event of type typ.
func doneText(typ, key string) func([][]byte) string {
	return func(events [][]byte) string {
		for _, d := range events {
			var v map[string]any
			if json.Unmarshal(d, &v) == nil && v["type"] == typ {
				s, _ := v[key].(string)
				return s
			}
		}
		return ""
	}
}

// TestScanDeltasAllocs: scanning allocates nothing.
func TestScanDeltasAllocs(t *testing.T) {
	datas := [][]byte{
		[]byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"delta":{"content":"x\n"},"index":0}]}`),
		[]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}}]}}]}`),
		[]byte(`{"content_index":0,"delta":" blue","item_id":"msg_1","output_index":0,"sequence_number":7,"type":"response.output_text.delta"}`),
	}
	n := 0
	yield := func(d TextDelta) bool { n += len(d.Raw); return true }
	if a := testing.AllocsPerRun(100, func() {
		for _, d := range datas {
			ScanDeltas(d, yield)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per scan", a)
	}
	if n == 0 {
		t.Fatal("nothing scanned")
	}
}

func TestDeltaFieldString(t *testing.T) {
	for f, want := range map[DeltaField]string{FieldContent: "content", FieldReasoning: "reasoning", FieldRefusal: "refusal",
		FieldArguments: "arguments", FieldFinish: "finish", 0: "unknown"} {
		if f.String() != want {
			t.Errorf("%d: %q, want %q", f, f.String(), want)
		}
	}
}

func FuzzScanDeltas(f *testing.F) {
	for _, name := range []string{"chat_usage.sse", "tool_calls.sse", "completion.sse", "responses_text.sse", "responses_tool_call.sse", "error.sse"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				f.Add([]byte(d))
			}
		}
	}
	f.Add([]byte(`{"choices":[{"delta":{"content":"b"},"index":1},{"text":"\ud83d"}]}`))
	f.Add([]byte(`{"type":"response.x_arguments.delta","delta":"\u0041","response":{"id":"r","created_at":-1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		calls := 0
		m := ScanDeltas(data, func(d TextDelta) bool {
			calls++
			if d.Choice < 0 || d.Field < FieldContent || d.Field > FieldFinish || len(d.Raw) == 0 || !bytes.Contains(data, d.Raw) {
				t.Fatalf("bad delta %+v", d)
			}
			text := d.AppendText(nil)
			if !d.Esc && !bytes.Equal(text, d.Raw) {
				t.Fatalf("text %q of unescaped %q", text, d.Raw)
			}
			if utf8.Valid(d.Raw) {
				var want string
				if err := json.Unmarshal(append(append([]byte{'"'}, d.Raw...), '"'), &want); err != nil || want != string(text) {
					t.Fatalf("raw %q: text %q, encoding/json %q (%v)", d.Raw, text, want, err)
				}
			}
			return true
		})
		if calls > len(data) {
			t.Fatalf("%d deltas from %d bytes", calls, len(data))
		}
		if m.OK && !json.Valid(data) {
			t.Fatalf("OK for invalid JSON %q", data)
		}
		if !m.OK && json.Valid(data) && bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("{")) {
			t.Fatalf("not OK for valid JSON %q", data)
		}
		if m.Seq < -1 || m.Created < -1 {
			t.Fatalf("meta %+v", m)
		}
	})
}

// FuzzScanDeltasChunk builds chunks with encoding/json, members in either order, and checks
// that exactly their texts come back.
func FuzzScanDeltasChunk(f *testing.F) {
	f.Add("hello", "", "", uint8(0), false)
	f.Add("a\"b\\c\n\u2028", "{\"x\": [1]}", "think", uint8(3), true)
	f.Add("", "", "", uint8(200), true)
	f.Add("0", "0", "\xff\xfe", uint8(3), true) // invalid UTF-8: a U+FFFD a byte
	f.Fuzz(func(t *testing.T, content, args, reasoning string, index uint8, indexLast bool) {
		delta := map[string]any{}
		var want []gotDelta
		if reasoning != "" {
			delta["reasoning_content"] = reasoning
		}
		if content != "" {
			delta["content"] = content
		}
		if args != "" {
			delta["tool_calls"] = []any{map[string]any{"index": 0, "function": map[string]any{"name": "f", "arguments": args}}}
		}
		// encoding/json writes map keys sorted: content, reasoning_content, tool_calls.
		for _, kv := range []struct {
			s string
			f DeltaField
		}{{content, FieldContent}, {reasoning, FieldReasoning}, {args, FieldArguments}} {
			if kv.s != "" {
				b, _ := json.Marshal(kv.s) // invalid UTF-8 comes back as U+FFFD, a byte each
				var text string
				_ = json.Unmarshal(b, &text)
				want = append(want, gotDelta{int(index), kv.f, text})
			}
		}
		d, _ := json.Marshal(delta)
		var chunk string
		if indexLast {
			chunk = fmt.Sprintf(`{"choices":[{"delta":%s,"finish_reason":null,"index":%d}],"model":"m"}`, d, index)
		} else {
			chunk = fmt.Sprintf(`{"model":"m","choices":[{"index":%d,"delta":%s}]}`, index, d)
		}
		got, m := scanAll(chunk)
		if fmt.Sprint(got) != fmt.Sprint(want) || !m.OK || string(m.Model) != "m" {
			t.Fatalf("%s: %v (OK %v), want %v", chunk, got, m.OK, want)
		}
	})
}
