package openai

import (
	"bytes"
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
	}
	checkTap(t, tap, want)
}

func checkTap(t *testing.T, got *Tap, want Tap) {
	t.Helper()
	g := *got
	g.weight = 0
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
