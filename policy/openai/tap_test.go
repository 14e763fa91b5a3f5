package openai

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"testing/iotest"
	"time"
)

func loadSSE(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// replay reads a captured stream one byte at a time (the worst case for the reader),
// observing event i at start+(i+1)*10ms, and checks that the relayed bytes are the input.
func replay(t *testing.T, name string, start time.Time) *Tap {
	t.Helper()
	in := loadSSE(t, name)
	r := NewReader(iotest.OneByteReader(bytes.NewReader(in)), 0)
	tap := &Tap{Start: start}
	var out bytes.Buffer
	for i := 0; ; i++ {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tap.Observe(e, start.Add(time.Duration(i+1)*10*time.Millisecond))
		out.Write(e.Raw)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Fatal("relayed bytes differ from the input")
	}
	return tap
}

func TestTapChatWithUsage(t *testing.T) {
	start := time.Unix(1718041200, 0)
	tap := replay(t, "chat_usage.sse", start)
	// Events: role, 15 tokens, finish, usage, [DONE].
	want := Tap{
		Start:        start,
		FirstToken:   start.Add(20 * time.Millisecond),
		LastToken:    start.Add(160 * time.Millisecond),
		Events:       19,
		TokenEvents:  15,
		Tokens:       16,
		Usage:        Usage{PromptTokens: 42, CompletionTokens: 16, TotalTokens: 58},
		HaveUsage:    true,
		Done:         true,
		FinishReason: "stop",
		MaxGap:       10 * time.Millisecond,
		GapSum:       140 * time.Millisecond,
		Gaps:         14,
		Finished:     1,
		ID:           "chatcmpl-b2f1c7a0d3e44c1f9a8e6d5c4b3a2910",
	}
	checkTap(t, tap, want)
	if got := tap.TTFT(); got != 20*time.Millisecond {
		t.Errorf("TTFT = %v", got)
	}
	if got := tap.TPOT(); got != 140*time.Millisecond/15 {
		t.Errorf("TPOT = %v", got)
	}
}

func TestTapCompletion(t *testing.T) {
	start := time.Unix(0, 0)
	tap := replay(t, "completion.sse", start)
	// No usage: the estimate is the larger of 8 token events and the text's weight
	// (" there was a little girl who lived in": 37 letters and spaces, 74/8 → 10).
	want := Tap{
		Start:        start,
		FirstToken:   start.Add(10 * time.Millisecond),
		LastToken:    start.Add(80 * time.Millisecond),
		Events:       9,
		TokenEvents:  8,
		Tokens:       10,
		Done:         true,
		FinishReason: "length",
		MaxGap:       10 * time.Millisecond,
		GapSum:       70 * time.Millisecond,
		Gaps:         7,
		Finished:     1,
		ID:           "cmpl-5d0e8f1a2b3c4d5e6f708192a3b4c5d6",
	}
	checkTap(t, tap, want)
}

func TestTapToolCalls(t *testing.T) {
	start := time.Unix(0, 0)
	tap := replay(t, "tool_calls.sse", start)
	// Events: role, tool name, 5 argument pieces, finish, usage, [DONE].
	want := Tap{
		Start:        start,
		FirstToken:   start.Add(20 * time.Millisecond),
		LastToken:    start.Add(70 * time.Millisecond),
		Events:       10,
		TokenEvents:  6,
		Tokens:       21,
		Usage:        Usage{PromptTokens: 230, CompletionTokens: 21, TotalTokens: 251},
		HaveUsage:    true,
		Done:         true,
		FinishReason: "tool_calls",
		MaxGap:       10 * time.Millisecond,
		GapSum:       50 * time.Millisecond,
		Gaps:         5,
		Finished:     1,
		ID:           "chatcmpl-7a6b5c4d3e2f10a9b8c7d6e5f4a3b2c1",
	}
	checkTap(t, tap, want)
}

func TestTapErrorEvent(t *testing.T) {
	start := time.Unix(0, 0)
	tap := replay(t, "error.sse", start)
	want := Tap{
		Start:       start,
		FirstToken:  start.Add(20 * time.Millisecond),
		LastToken:   start.Add(40 * time.Millisecond),
		Events:      6,
		TokenEvents: 3,
		Tokens:      3,
		Done:        true,
		MaxGap:      10 * time.Millisecond,
		GapSum:      20 * time.Millisecond,
		Gaps:        2,
		ErrorSeen:   true,
		ID:          "chatcmpl-e1d2c3b4a5968778695a4b3c2d1e0f9a",
	}
	checkTap(t, tap, want)
}

func checkTap(t *testing.T, got *Tap, want Tap) {
	t.Helper()
	g := *got
	g.weight = 0
	g.shape, g.shapeStart, g.shapeEnd, g.shapes = "", 0, 0, 0
	if g != want {
		t.Errorf("got  %+v\nwant %+v", g, want)
	}
}

func TestTapObserve(t *testing.T) {
	now := time.Unix(100, 0)
	tests := []struct {
		name   string
		data   string
		tokens int // TokenEvents after the event
		check  func(*Tap) bool
	}{
		{"empty content", `{"choices":[{"delta":{"content":""}}]}`, 0, nil},
		{"role only", `{"choices":[{"delta":{"role":"assistant"}}]}`, 0, nil},
		{"content", `{"choices":[{"delta":{"content":"hi"}}]}`, 1, nil},
		{"escaped content", `{"choices":[{"delta":{"content":"\n"}}]}`, 1, nil},
		{"reasoning", `{"choices":[{"delta":{"reasoning_content":"hmm"}}]}`, 1, nil},
		{"refusal", `{"choices":[{"delta":{"refusal":"no"}}]}`, 1, nil},
		{"completion text", `{"choices":[{"text":" x","index":0}]}`, 1, nil},
		{"tool call without arguments", `{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f"}}]}}]}`, 1, nil},
		{"empty tool calls", `{"choices":[{"delta":{"tool_calls":[]}}]}`, 0, nil},
		{"legacy function call", `{"choices":[{"delta":{"function_call":{"arguments":"{"}}}]}`, 1, nil},
		{"content key inside a string is not content", `{"choices":[{"delta":{"role":"\"content\":\"x\""}}]}`, 0, nil},
		{"content key nested elsewhere", `{"x":{"choices":[{"delta":{"content":"x"}}]},"choices":[]}`, 0, nil},
		{"not JSON", `hello`, 0, nil},
		{"truncated JSON keeps what it saw", `{"choices":[{"delta":{"content":"x"}}],"usage":{`, 1, nil},
		{"escaped misspelled key", `{"ch\u006fices":[{"delta":{"c\u006ftent":"x"}}]}`, 0, nil},
		{"escaped key", `{"ch\u006fices":[{"delta":{"\u0063ontent":"x"}}]}`, 1, nil},
		{"finish_reason", `{"choices":[{"delta":{},"finish_reason":"length"}]}`, 0, func(t *Tap) bool { return t.FinishReason == "length" }},
		{"escaped finish_reason", `{"choices":[{"delta":{},"finish_reason":"st\u006fp"}]}`, 0, func(t *Tap) bool { return t.FinishReason == "stop" }},
		{"null finish_reason", `{"choices":[{"finish_reason":null}]}`, 0, func(t *Tap) bool { return t.FinishReason == "" }},
		{"usage", `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8,"prompt_tokens_details":null}}`, 0,
			func(t *Tap) bool { return t.HaveUsage && t.Tokens == 5 && t.Usage == Usage{3, 5, 8} }},
		{"null usage", `{"choices":[],"usage":null}`, 0, func(t *Tap) bool { return !t.HaveUsage }},
		{"in-band error", `{"error":{"message":"x"}}`, 0, func(t *Tap) bool { return t.ErrorSeen }},
		{"null error", `{"error":null}`, 0, func(t *Tap) bool { return !t.ErrorSeen }},
		{"two choices", `{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}`, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tap Tap
			tap.Observe(Event{Data: []byte(tt.data)}, now)
			if tap.TokenEvents != tt.tokens || tap.Events != 1 {
				t.Errorf("TokenEvents %d Events %d, want %d 1", tap.TokenEvents, tap.Events, tt.tokens)
			}
			if tt.tokens > 0 && (tap.FirstToken != now || tap.LastToken != now || tap.Tokens < 1) {
				t.Errorf("token event not timed: %+v", tap)
			}
			if tt.check != nil && !tt.check(&tap) {
				t.Errorf("check failed: %+v", tap)
			}
		})
	}

	var tap Tap
	tap.Observe(Event{Raw: []byte(": ping\n\n")}, now)
	tap.Observe(Event{Raw: []byte("\n")}, now)
	if tap.Events != 0 {
		t.Error("events without data counted")
	}
	tap.Observe(Event{Name: []byte("error"), Data: []byte(`"oops"`)}, now)
	if !tap.ErrorSeen {
		t.Error("event named error not seen")
	}
}

func TestTapEstimateBeforeUsage(t *testing.T) {
	var tap Tap
	now := time.Unix(0, 0)
	// One event carrying several tokens' worth of text.
	tap.Observe(Event{Data: []byte(`{"choices":[{"delta":{"content":"The quick brown fox jumps over the lazy dog"}}]}`)}, now)
	if tap.Tokens != 11 { // 43 letters and spaces: 86/8 → 11
		t.Errorf("Tokens = %d", tap.Tokens)
	}
	// Usage overrides the estimate, and later token events do not change it.
	tap.Observe(Event{Data: []byte(`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":9,"total_tokens":10}}`)}, now)
	tap.Observe(Event{Data: []byte(`{"choices":[{"delta":{"content":"more text here"}}]}`)}, now.Add(time.Second))
	if tap.Tokens != 9 || tap.TokenEvents != 2 {
		t.Errorf("Tokens = %d, TokenEvents = %d", tap.Tokens, tap.TokenEvents)
	}
}

func TestTapObserveBody(t *testing.T) {
	now := time.Unix(50, 0)
	for _, tt := range []struct {
		name, body   string
		tokens       int
		usage        Usage
		finish       string
		first, error bool
	}{
		{"chat", `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}`,
			4, Usage{9, 4, 13}, "stop", true, false},
		{"chat tool call", `{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
			2, Usage{}, "tool_calls", true, false}, // "f{}": 12/8 → 2
		{"completion", `{"object":"text_completion","choices":[{"text":" world","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
			2, Usage{1, 2, 3}, "length", true, false},
		{"embeddings", `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"e","usage":{"prompt_tokens":5,"total_tokens":5}}`,
			0, Usage{5, 0, 5}, "", true, false},
		{"error", `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`,
			0, Usage{}, "", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tap := Tap{Start: now.Add(-time.Second)}
			tap.ObserveBody([]byte(tt.body), now)
			if tap.Tokens != tt.tokens || tap.Usage != tt.usage || tap.FinishReason != tt.finish || tap.ErrorSeen != tt.error || tap.Events != 1 {
				t.Errorf("%+v", tap)
			}
			if tt.first != (tap.FirstToken == now) {
				t.Errorf("FirstToken %v", tap.FirstToken)
			}
			if tt.first && tap.TTFT() != time.Second {
				t.Errorf("TTFT %v", tap.TTFT())
			}
		})
	}
	// The handler may set FirstToken itself before ObserveBody: no phantom gap.
	tap := Tap{FirstToken: now}
	tap.ObserveBody([]byte(`{"choices":[{"message":{"content":"x"}}]}`), now)
	if tap.Gaps != 0 || tap.GapSum != 0 || tap.LastToken != now {
		t.Errorf("%+v", tap)
	}
}

func TestTapTimings(t *testing.T) {
	var tap Tap
	if tap.TTFT() != 0 || tap.TPOT() != 0 {
		t.Error("zero Tap has timings")
	}
	base := time.Unix(0, 0)
	tap.Start = base
	for _, at := range []time.Duration{100, 110, 150, 160} {
		tap.Observe(Event{Data: []byte(`{"choices":[{"delta":{"content":"a"}}]}`)}, base.Add(at*time.Millisecond))
	}
	if tap.TTFT() != 100*time.Millisecond || tap.MaxGap != 40*time.Millisecond || tap.GapSum != 60*time.Millisecond || tap.Gaps != 3 {
		t.Errorf("%+v", tap)
	}
	if tap.Tokens != 4 || tap.TPOT() != 20*time.Millisecond {
		t.Errorf("Tokens %d TPOT %v", tap.Tokens, tap.TPOT())
	}
	// A clock going backwards does not make a negative gap.
	tap.Observe(Event{Data: []byte(`{"choices":[{"delta":{"content":"a"}}]}`)}, base)
	if tap.GapSum != 60*time.Millisecond {
		t.Errorf("GapSum %v", tap.GapSum)
	}
}

func TestTapFinishReasonCopiedOnce(t *testing.T) {
	var tap Tap
	e := Event{Data: []byte(`{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}`)}
	tap.Observe(e, time.Now())
	now := time.Now()
	if a := testing.AllocsPerRun(100, func() { tap.Observe(e, now) }); a != 0 {
		t.Errorf("%v allocations per event", a)
	}
}

// TestTapResponsesText: a vLLM Responses stream (fields in alphabetical order, so "type"
// comes last): created, in_progress, item and part added, 5 text deltas and an empty one,
// text, part and item done, completed.
func TestTapResponsesText(t *testing.T) {
	start := time.Unix(1718041200, 0)
	tap := replay(t, "responses_text.sse", start)
	want := Tap{
		Start:        start,
		FirstToken:   start.Add(50 * time.Millisecond),
		LastToken:    start.Add(90 * time.Millisecond),
		Events:       14,
		TokenEvents:  5,
		Tokens:       6,
		Usage:        Usage{PromptTokens: 12, CompletionTokens: 6, TotalTokens: 18},
		HaveUsage:    true,
		Done:         true,
		FinishReason: "stop",
		MaxGap:       10 * time.Millisecond,
		GapSum:       40 * time.Millisecond,
		Gaps:         4,
		Finished:     1,
		Seq:          14,
		ID:           "resp_6b1e0c7d2a5f4e3b9c8d7a6f5e4d3c2b",
	}
	checkTap(t, tap, want)
	if got := tap.TTFT(); got != 50*time.Millisecond {
		t.Errorf("TTFT = %v", got)
	}
}

// TestTapResponsesToolCall: an OpenAI-ordered stream ("type" first) with reasoning, then a
// function call whose name comes in output_item.added (not a token event) and whose
// arguments come in deltas.
func TestTapResponsesToolCall(t *testing.T) {
	start := time.Unix(0, 0)
	tap := replay(t, "responses_tool_call.sse", start)
	want := Tap{
		Start:        start,
		FirstToken:   start.Add(30 * time.Millisecond),
		LastToken:    start.Add(90 * time.Millisecond),
		Events:       12,
		TokenEvents:  5,
		Tokens:       21,
		Usage:        Usage{PromptTokens: 230, CompletionTokens: 21, TotalTokens: 251},
		HaveUsage:    true,
		Done:         true,
		FinishReason: "tool_calls",
		MaxGap:       30 * time.Millisecond,
		GapSum:       60 * time.Millisecond,
		Gaps:         4,
		Finished:     1,
		Seq:          12,
		ID:           "resp_tool",
	}
	checkTap(t, tap, want)
}

func TestTapResponsesIncomplete(t *testing.T) {
	start := time.Unix(0, 0)
	tap := replay(t, "responses_incomplete.sse", start)
	want := Tap{
		Start:        start,
		FirstToken:   start.Add(20 * time.Millisecond),
		LastToken:    start.Add(40 * time.Millisecond),
		Events:       5,
		TokenEvents:  3,
		Tokens:       3,
		Usage:        Usage{PromptTokens: 5, CompletionTokens: 3, TotalTokens: 8},
		HaveUsage:    true,
		Done:         true,
		FinishReason: "length",
		MaxGap:       10 * time.Millisecond,
		GapSum:       20 * time.Millisecond,
		Gaps:         2,
		Finished:     1,
		Seq:          5,
		ID:           "resp_6b1e0c7d2a5f4e3b9c8d7a6f5e4d3c2b",
	}
	checkTap(t, tap, want)
}

// TestTapResponsesErrorEvent: an error event ends the stream without a terminal event, so
// Done stays false (the relay treats the stream as cut) and ErrorSeen is set.
func TestTapResponsesErrorEvent(t *testing.T) {
	start := time.Unix(0, 0)
	tap := replay(t, "responses_error.sse", start)
	want := Tap{
		Start:       start,
		FirstToken:  start.Add(20 * time.Millisecond),
		LastToken:   start.Add(30 * time.Millisecond),
		Events:      4,
		TokenEvents: 2,
		Tokens:      2, // "Sure,": 13/8
		MaxGap:      10 * time.Millisecond,
		GapSum:      10 * time.Millisecond,
		Gaps:        1,
		ErrorSeen:   true,
		Seq:         4,
		ID:          "resp_tool",
	}
	checkTap(t, tap, want)
}

func TestTapResponsesObserve(t *testing.T) {
	now := time.Unix(100, 0)
	done := func(finish string, finished int) func(*Tap) bool {
		return func(t *Tap) bool {
			return t.Done && t.FinishReason == finish && t.Finished == finished && !t.ErrorSeen
		}
	}
	usage := `"usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":2},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":11}`
	tests := []struct {
		name   string
		data   string
		tokens int // TokenEvents after the event
		check  func(*Tap) bool
	}{
		{"text delta", `{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"hi","sequence_number":4}`, 1,
			func(t *Tap) bool { return t.Seq == 5 && !t.Done }},
		{"type after delta", `{"content_index":0,"delta":"hi","item_id":"m","logprobs":[],"output_index":0,"sequence_number":0,"type":"response.output_text.delta"}`, 1,
			func(t *Tap) bool { return t.Seq == 1 }},
		{"empty delta", `{"type":"response.output_text.delta","delta":"","sequence_number":4}`, 0, func(t *Tap) bool { return t.Seq == 5 }},
		{"escaped type", `{"type":"response.output_text.d\u0065lta","delta":"x"}`, 1, nil},
		{"escaped delta", `{"type":"response.output_text.delta","delta":"\n"}`, 1, nil},
		{"arguments delta", `{"type":"response.function_call_arguments.delta","item_id":"fc","output_index":1,"delta":"{\"a\""}`, 1, nil},
		{"reasoning delta", `{"type":"response.reasoning_text.delta","delta":"hmm"}`, 1, nil},
		{"reasoning summary delta", `{"type":"response.reasoning_summary_text.delta","delta":"hmm"}`, 1, nil},
		{"refusal delta", `{"type":"response.refusal.delta","delta":"no"}`, 1, nil},
		{"delta that is not a string", `{"type":"response.mcp_call_arguments.delta","delta":{"a":1}}`, 0, nil},
		{"text done is not a token event", `{"type":"response.output_text.done","text":"full text","sequence_number":9}`, 0, nil},
		{"item added is not a token event", `{"type":"response.output_item.added","item":{"type":"function_call","name":"f","arguments":""}}`, 0, nil},
		{"a delta key without a type", `{"delta":"x","sequence_number":3}`, 0, func(t *Tap) bool { return t.Seq == 0 }},
		{"another type", `{"type":"message","delta":"x"}`, 0, nil},
		{"response. alone", `{"type":"response.","delta":"x"}`, 0, nil},
		{"bare .delta", `{"type":"response..delta","delta":"x"}`, 0, nil},
		{"created is not the end", `{"type":"response.created","sequence_number":0,"response":{"status":"in_progress","output":[],"usage":null}}`, 0,
			func(t *Tap) bool {
				return !t.Done && !t.HaveUsage && t.FinishReason == "" && t.Finished == 0 && t.Seq == 1
			}},
		{"in_progress", `{"type":"response.in_progress","response":{"status":"in_progress"}}`, 0, func(t *Tap) bool { return !t.Done }},
		{"completed", `{"type":"response.completed","sequence_number":20,"response":{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"not counted"}]}],` + usage + `}}`, 0,
			func(t *Tap) bool {
				return done("stop", 1)(t) && t.HaveUsage && t.Usage == Usage{7, 4, 11} && t.Tokens == 4 && t.Seq == 21
			}},
		{"completed, response before type", `{"response":{"output":[],` + usage + `,"status":"completed"},"sequence_number":2,"type":"response.completed"}`, 0,
			func(t *Tap) bool { return done("stop", 1)(t) && t.Usage == Usage{7, 4, 11} }},
		{"completed with a function call", `{"type":"response.completed","response":{"output":[{"type":"reasoning","summary":[]},{"arguments":"{}","call_id":"c","name":"f","type":"function_call"}]}}`, 0,
			done("tool_calls", 1)},
		{"completed with a custom tool call: not a function call", `{"type":"response.completed","response":{"output":[{"type":"custom_tool_call","name":"f","input":"x"}]}}`, 0,
			done("stop", 1)},
		{"completed with a function call output is not a call", `{"type":"response.completed","response":{"output":[{"type":"function_call_output","output":"x"}]}}`, 0,
			done("stop", 1)},
		{"completed without usage", `{"type":"response.completed","response":{"status":"completed","usage":null}}`, 0,
			func(t *Tap) bool { return done("stop", 1)(t) && !t.HaveUsage }},
		{"incomplete: max_output_tokens", `{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}`, 0,
			done("length", 1)},
		{"incomplete: content_filter", `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"content_filter"}}}`, 0,
			done("content_filter", 1)},
		{"incomplete: escaped reason", `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_output_t\u006fkens"}}}`, 0,
			done("length", 1)},
		{"incomplete: another reason", `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_tool_calls"}}}`, 0,
			done("max_tool_calls", 1)},
		{"incomplete: no reason", `{"type":"response.incomplete","response":{"incomplete_details":null}}`, 0,
			done("incomplete", 1)},
		{"failed", `{"type":"response.failed","sequence_number":3,"response":{"status":"failed","error":{"code":"server_error","message":"x"},"output":[]}}`, 0,
			func(t *Tap) bool {
				return t.Done && t.ErrorSeen && t.FinishReason == "" && t.Finished == 0 && t.Seq == 4
			}},
		{"error event", `{"type":"error","code":"server_error","message":"boom","param":null,"sequence_number":7}`, 0,
			func(t *Tap) bool { return t.ErrorSeen && !t.Done && t.Seq == 8 }},
		{"error event, type last", `{"code":null,"message":"boom","param":null,"sequence_number":7,"type":"error"}`, 0,
			func(t *Tap) bool { return t.ErrorSeen && !t.Done }},
		{"bad sequence_number", `{"type":"response.output_text.delta","delta":"x","sequence_number":-1}`, 1, func(t *Tap) bool { return t.Seq == 0 }},
		{"type not a string", `{"type":5,"delta":"x"}`, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tap Tap
			tap.Observe(Event{Data: []byte(tt.data)}, now)
			if tap.TokenEvents != tt.tokens || tap.Events != 1 {
				t.Errorf("TokenEvents %d Events %d, want %d 1", tap.TokenEvents, tap.Events, tt.tokens)
			}
			if tt.tokens > 0 && (tap.FirstToken != now || tap.LastToken != now || tap.Tokens < 1) {
				t.Errorf("token event not timed: %+v", tap)
			}
			if tt.check != nil && !tt.check(&tap) {
				t.Errorf("check failed: %+v", tap)
			}
		})
	}
	// Seq keeps the largest.
	var tap Tap
	for _, n := range []string{"3", "9", "4"} {
		tap.Observe(Event{Data: []byte(`{"type":"response.output_text.delta","delta":"x","sequence_number":` + n + `}`)}, now)
	}
	if tap.Seq != 10 {
		t.Errorf("Seq = %d", tap.Seq)
	}
}

// TestResponsesFinishReason: the exported mapping, and the Tap's, agree.
func TestResponsesFinishReason(t *testing.T) {
	for _, tt := range []struct {
		status, reason string
		call           bool
		want           string
	}{
		{"completed", "", false, "stop"},
		{"completed", "", true, "tool_calls"},
		{"incomplete", "max_output_tokens", false, "length"},
		{"incomplete", "max_output_tokens", true, "length"},
		{"incomplete", "content_filter", false, "content_filter"},
		{"incomplete", "max_tool_calls", false, "max_tool_calls"},
		{"incomplete", "", false, "incomplete"},
		{"failed", "", false, ""},
		{"cancelled", "", false, ""},
		{"queued", "", false, ""},
		{"in_progress", "", false, ""},
	} {
		if got := ResponsesFinishReason(tt.status, tt.reason, tt.call); got != tt.want {
			t.Errorf("ResponsesFinishReason(%q, %q, %v) = %q, want %q", tt.status, tt.reason, tt.call, got, tt.want)
		}
		output := `[]`
		if tt.call {
			output = `[{"type":"function_call","name":"f","arguments":"{}"}]`
		}
		reason := `null`
		if tt.reason != "" {
			reason = `{"reason":"` + tt.reason + `"}`
		}
		rsp := `{"status":"` + tt.status + `","incomplete_details":` + reason + `,"output":` + output + `}`
		// A terminal event of that status, when there is one, and a body.
		if typ := map[string]string{"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}[tt.status]; typ != "" {
			var tap Tap
			tap.Observe(Event{Data: []byte(`{"type":"` + typ + `","response":` + rsp + `}`)}, time.Now())
			if tap.FinishReason != tt.want {
				t.Errorf("%s event: FinishReason %q, want %q", tt.status, tap.FinishReason, tt.want)
			}
		}
		var tap Tap
		tap.ObserveBody([]byte(`{"object":"response",`+rsp[1:]), time.Now())
		if tap.FinishReason != tt.want {
			t.Errorf("%s body: FinishReason %q, want %q", tt.status, tap.FinishReason, tt.want)
		}
	}
}

func TestTapObserveResponsesBody(t *testing.T) {
	now := time.Unix(50, 0)
	for _, tt := range []struct {
		name, body     string
		tokens         int
		usage          Usage
		finish         string
		finished       int
		first, errSeen bool
	}{
		{"text", `{"id":"resp_1","object":"response","created_at":1,"status":"completed","error":null,"incomplete_details":null,
			"output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello there!","annotations":[]}]}],
			"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":13}}`,
			4, Usage{9, 4, 13}, "stop", 1, true, false},
		{"vLLM order", `{"created_at":1,"error":null,"id":"resp_1","incomplete_details":null,"model":"m","object":"response",
			"output":[{"content":[{"annotations":[],"text":"Hi","type":"output_text"}],"id":"msg_1","role":"assistant","status":"completed","type":"message"}],
			"status":"completed","usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`,
			1, Usage{3, 1, 4}, "stop", 1, true, false},
		{"function call", `{"object":"response","status":"completed","output":[{"type":"reasoning","id":"rs","summary":[],"content":[{"type":"reasoning_text","text":"x"}]},
			{"type":"function_call","id":"fc","call_id":"c","name":"f","arguments":"{}","status":"completed"}]}`,
			2, Usage{}, "tool_calls", 1, true, false}, // "x" "f" "{}": 2+2+10=14/8 → 2
		{"incomplete", `{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},
			"output":[{"type":"message","content":[{"type":"output_text","text":"Once upon"}]}],"usage":{"input_tokens":2,"output_tokens":2,"total_tokens":4}}`,
			2, Usage{2, 2, 4}, "length", 1, true, false},
		{"refusal", `{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"refusal","refusal":"No."}]}]}`,
			2, Usage{}, "stop", 1, true, false}, // "No.": 9/8
		{"failed", `{"object":"response","status":"failed","error":{"code":"server_error","message":"boom"},"output":[]}`,
			0, Usage{}, "", 0, false, true},
		{"queued (background)", `{"object":"response","status":"queued","output":[],"usage":null}`,
			0, Usage{}, "", 0, false, false},
		{"no object: not a Responses body", `{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}]}`,
			0, Usage{}, "", 0, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tap := Tap{Start: now.Add(-time.Second)}
			tap.ObserveBody([]byte(tt.body), now)
			if tap.Tokens != tt.tokens || tap.Usage != tt.usage || tap.FinishReason != tt.finish || tap.Finished != tt.finished ||
				tap.ErrorSeen != tt.errSeen || tap.Events != 1 || tap.Done || tap.Seq != 0 {
				t.Errorf("%+v", tap)
			}
			if tt.first != (tap.FirstToken == now) {
				t.Errorf("FirstToken %v", tap.FirstToken)
			}
		})
	}
}

// TestTapFinished: each choice reports its finish once; an n=2 stream that ran to its end
// has Finished 2, one cut short after the first choice's finish has 1.
func TestTapFinished(t *testing.T) {
	stream := []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null},{"index":1,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`,
		`{"choices":[{"index":1,"delta":{"content":"b"},"finish_reason":null}]}`,
		`{"choices":[{"index":1,"delta":{"content":""},"finish_reason":"length"}]}`,
		`{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
	}
	var tap Tap
	for i, d := range stream {
		tap.Observe(Event{Data: []byte(d)}, time.Now())
		if want := map[bool]int{true: 1, false: 0}[i == 3]; i <= 3 && tap.Finished != want {
			t.Errorf("after event %d: Finished %d, want %d", i, tap.Finished, want)
		}
	}
	tap.Observe(Event{Data: DoneEvent[len("data: ") : len(DoneEvent)-2]}, time.Now())
	if tap.Finished != 2 || tap.FinishReason != "stop" || !tap.Done || tap.Seq != 0 {
		t.Errorf("%+v", tap)
	}
	// Both choices in one chunk, and a non-streaming body with two choices.
	tap = Tap{}
	tap.Observe(Event{Data: []byte(`{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"length"}]}`)}, time.Now())
	if tap.Finished != 2 {
		t.Errorf("one chunk: Finished %d", tap.Finished)
	}
	tap = Tap{}
	tap.ObserveBody([]byte(`{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":"stop"},{"index":1,"message":{"content":"b"},"finish_reason":"stop"}]}`), time.Now())
	if tap.Finished != 2 {
		t.Errorf("body: Finished %d", tap.Finished)
	}
	// A null or empty finish_reason is none.
	tap = Tap{}
	tap.Observe(Event{Data: []byte(`{"choices":[{"index":0,"finish_reason":null},{"index":1,"finish_reason":""}]}`)}, time.Now())
	if tap.Finished != 0 {
		t.Errorf("null: Finished %d", tap.Finished)
	}
}

func TestTapResponsesAllocs(t *testing.T) {
	now := time.Now()
	for _, d := range []string{
		`{"content_index":0,"delta":" blue","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}`,
		`{"type":"response.function_call_arguments.delta","item_id":"fc","output_index":1,"delta":"{\"a\"","sequence_number":8}`,
		`{"type":"response.output_item.done","item":{"type":"function_call","name":"f","arguments":"{}"},"sequence_number":9}`,
		`{"type":"response.completed","response":{"status":"completed","output":[{"type":"function_call","name":"f"}],"usage":{"input_tokens":1,"output_tokens":2,"total_tokens":3}}}`,
		`{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_tool_calls"}}}`,
		`{"type":"error","code":"x","message":"y","sequence_number":3}`,
	} {
		var tap Tap
		e := Event{Data: []byte(d)}
		tap.Observe(e, now) // a finish reason that changes is copied once
		if a := testing.AllocsPerRun(100, func() { tap.Observe(e, now) }); a != 0 {
			t.Errorf("%s: %v allocations per event", d, a)
		}
	}
}

// TestTapObserveChunk: the tap's scan is the relay's chunk check. Each case is an event
// after a role chunk; a refused one leaves the tap as it was (a truncated finish chunk must
// not count as a finish the client never got).
func TestTapObserveChunk(t *testing.T) {
	role := Event{Data: []byte(`{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)}
	for _, tc := range []struct {
		name, data string
		ok, token  bool // relayed; counted as a token event
	}{
		{"token", `{"id":"c1","choices":[{"index":0,"delta":{"content":" blue"},"finish_reason":null}]}`, true, true},
		{"spaced", ` { "choices" : [ { "delta" : { "content" : "x" } } ] } ` + "\r\n", true, true},
		{"finish", `{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, true, false},
		{"JSON inside prose", `{"choices":[{"index":0,"delta":{"content":"Here: {\"a\": [1, \"}\"]} \u00e9\n"},"finish_reason":null}]}`, true, true},
		{"tool call with n=2", `{"choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"city\": \"Par"}}]},"finish_reason":null}],"usage":null}`, true, true},
		{"NaN logprob (lenient: relayed)", `{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":NaN}]}}]}`, true, true},
		{"not an object", `[1,2]`, false, false},
		{"truncated finish", `{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}`, false, false},
		{"truncated usage", `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2`, false, false},
		{"two objects", `{"choices":[]}{"choices":[]}`, false, false},
		{"trailing comma", `{"choices":[{"delta":{"content":"x"}}],}`, false, false},
		{"control byte in a string", "{\"choices\":[{\"delta\":{\"content\":\"a\x01\"}}]}", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tap Tap
			now := time.Unix(100, 0)
			if !tap.ObserveChunk(role, now) {
				t.Fatal("role chunk refused")
			}
			before := tap
			ev := Event{Data: []byte(tc.data)}
			ok := tap.ObserveChunk(ev, now.Add(time.Second))
			if ok != tc.ok {
				t.Fatalf("ObserveChunk = %v, want %v", ok, tc.ok)
			}
			if ok != WellFormedChunk(ev.Data) {
				t.Fatalf("ObserveChunk = %v, WellFormedChunk = %v", ok, !ok)
			}
			if !ok && tap != before {
				t.Fatalf("a refused chunk changed the tap:\n%+v\nwas\n%+v", tap, before)
			}
			if ok && tap.Events != before.Events+1 {
				t.Fatalf("Events %d, want %d", tap.Events, before.Events+1)
			}
			if got := tap.TokenEvents > before.TokenEvents; got != tc.token {
				t.Fatalf("counted as a token event: %v, want %v", got, tc.token)
			}
		})
	}
	var tap Tap
	for _, ev := range []Event{{}, {Data: []byte("[DONE]")}} {
		if !tap.ObserveChunk(ev, time.Unix(1, 0)) {
			t.Fatalf("%q refused", ev.Data)
		}
	}
	if !tap.Done {
		t.Fatal("[DONE] not seen")
	}
}

// FuzzTapObserveChunk: the verdict is WellFormedChunk's on any data (the tap's scan only
// saves the second pass), a chunk the tap's scan reads as whole is valid JSON, and a refused
// chunk leaves the tap as it was.
func FuzzTapObserveChunk(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.sse"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				f.Add(d)
			}
		}
	}
	f.Add([]byte(`{"a":1,}`))
	f.Add([]byte(`{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}],"usage":{"completion_tokens":1e3}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var tap Tap
		whole := tap.observe(data, time.Unix(0, 0), true)
		if whole && !json.Valid(data) {
			t.Fatalf("the tap read %q as whole; json.Valid refuses it", data)
		}
		tap = Tap{}
		tap.ObserveChunk(Event{Data: []byte(`{"id":"x","choices":[]}`)}, time.Unix(0, 0))
		before := tap
		ok := tap.ObserveChunk(Event{Data: data}, time.Unix(1, 0))
		if want := WellFormedChunk(data) || bytes.Equal(data, []byte("[DONE]")); ok != want {
			t.Fatalf("ObserveChunk(%q) = %v, WellFormedChunk says %v", data, ok, want)
		}
		if !ok && tap != before {
			t.Fatalf("refused %q changed the tap", data)
		}
		tap = before
		if got, want := tap.ObserveWholeBody(data, time.Unix(1, 0)), json.Valid(data); got != want {
			t.Fatalf("ObserveWholeBody(%q) = %v, json.Valid says %v", data, got, want)
		}
		if !json.Valid(data) && tap != before {
			t.Fatalf("ObserveWholeBody refused %q and changed the tap", data)
		}
	})
}

func TestTapObserveWholeBody(t *testing.T) {
	now := time.Unix(100, 0)
	for _, tc := range []struct {
		name   string
		body   string
		whole  bool
		tokens int // usage's completion_tokens the tap took
	}{
		{"an answer", `{"id":"c1","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`, true, 2},
		{"an answer with white space around it", " \n{\"usage\":{\"completion_tokens\":5}}\n", true, 5},
		{"JSON, not an object (json.Valid decides)", `[{"usage":{"completion_tokens":5}}]`, true, 0},
		{"a string", `"hello"`, true, 0},
		{"cut short", `{"id":"c1","choices":[{"message":{"content":"hi"`, false, 0},
		{"a trailing comma", `{"usage":{"completion_tokens":5},}`, false, 0},
		{"two objects", `{"usage":{"completion_tokens":5}}{"a":1}`, false, 0},
		{"empty", ``, false, 0},
	} {
		var tap Tap
		tap.Start = now.Add(-time.Second)
		before := tap
		if got := tap.ObserveWholeBody([]byte(tc.body), now); got != tc.whole {
			t.Errorf("%s: ObserveWholeBody = %v, want %v", tc.name, got, tc.whole)
		}
		if got, want := json.Valid([]byte(tc.body)), tc.whole; got != want {
			t.Errorf("%s: json.Valid = %v: the case is wrong", tc.name, got)
		}
		if !tc.whole && tap != before {
			t.Errorf("%s: refused, but the tap changed: %+v", tc.name, tap)
		}
		if tc.whole && (tap.Events != 1 || tap.Usage.CompletionTokens != tc.tokens) {
			t.Errorf("%s: events %d, completion tokens %d; want 1 and %d", tc.name, tap.Events, tap.Usage.CompletionTokens, tc.tokens)
		}
	}
}
