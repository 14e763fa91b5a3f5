package sim

import (
	"net/http"
	"strings"
	"testing"
)

// loopsAt checks that words, from token after on, repeat their period tokens before after.
func loopsAt(t *testing.T, words []string, after, period int) {
	t.Helper()
	for i := after; i < len(words); i++ {
		if j := after - period + (i-after)%period; words[i] != words[j] {
			t.Fatalf("token %d is %q, token %d is %q: not a loop of %d after %d", i, words[i], j, words[j], period, after)
		}
	}
}

// TestLoopAfter: x-sim-loop-after makes a text answer repeat its own last tokens from token N
// on, to max tokens, the same streamed or not, chat, completions and Responses alike, on the
// fast path and through the scheduler; what comes before the loop is the answer without it.
func TestLoopAfter(t *testing.T) {
	const maxTok, after, period = 120, 30, 7
	hdr := map[string]string{HeaderLoopAfter: "30", HeaderLoopPeriod: "7"}
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{{"fast", Config{}}, {"scheduled", scheduled}} {
		t.Run(cfg.name, func(t *testing.T) {
			_, ts := start(t, cfg.cfg)
			plain := chat(t, ts, chatBody("tell me about rivers", map[string]any{"max_tokens": maxTok}), false)
			var first []string
			for _, stream := range []bool{false, true} {
				answers := map[string]answer{
					"chat":        runHeaders(t, ts, "/v1/chat/completions", chatBody("tell me about rivers", map[string]any{"max_tokens": maxTok}), stream, true, hdr),
					"completions": runHeaders(t, ts, "/v1/completions", map[string]any{"prompt": "tell me about rivers", "max_tokens": maxTok}, stream, false, hdr),
				}
				r := respondHeaders(t, ts, map[string]any{"input": "tell me about rivers", "max_output_tokens": maxTok}, stream, 1, hdr)
				if r.status != "incomplete" {
					t.Fatalf("stream %v: Responses status %q", stream, r.status)
				}
				answers["responses"] = answer{text: []string{r.text}, finish: []string{"length"}}
				for name, a := range answers {
					words := strings.Fields(a.text[0])
					if len(words) != maxTok || a.finish[0] != "length" {
						t.Fatalf("%s stream %v: %d tokens, finish %q", name, stream, len(words), a.finish[0])
					}
					loopsAt(t, words, after, period)
					if a.usage != nil && a.usage.CompletionTokens != maxTok {
						t.Fatalf("%s stream %v: usage %+v", name, stream, a.usage)
					}
				}
				chatWords := strings.Fields(answers["chat"].text[0])
				if first == nil {
					first = chatWords
				} else if strings.Join(first, " ") != strings.Join(chatWords, " ") {
					t.Fatal("the streamed loop differs from the non-streamed one")
				}
				if got, want := strings.Join(chatWords[:after], " "), strings.Join(strings.Fields(plain.text[0])[:after], " "); got != want {
					t.Fatalf("before the loop: %q, want the plain answer's %q", got, want)
				}
				if r.text != answers["chat"].text[0] {
					t.Fatalf("Responses %q, chat %q", r.text, answers["chat"].text[0])
				}
			}
		})
	}
}

func TestLoopAfterEdges(t *testing.T) {
	_, ts := start(t, Config{})
	body := func(maxTok int) map[string]any {
		return chatBody("a short one [[mem:m1]] [[mem:m2]]", map[string]any{"max_tokens": maxTok})
	}
	// The default period is min(16, N); markers repeat like any token.
	a := runHeaders(t, ts, "/v1/chat/completions", body(80), true, true, map[string]string{HeaderLoopAfter: "20"})
	words := strings.Fields(a.text[0])
	if len(words) != 80 || words[0] != "[[mem:m1]]" {
		t.Fatalf("%d tokens: %q", len(words), a.text[0])
	}
	loopsAt(t, words, 20, 16)
	a = runHeaders(t, ts, "/v1/chat/completions", body(60), false, true, map[string]string{HeaderLoopAfter: "2"})
	words = strings.Fields(a.text[0])
	loopsAt(t, words, 2, 2)
	if words[2] != "[[mem:m1]]" || words[3] != "[[mem:m2]]" {
		t.Fatalf("the loop of the markers: %q", a.text[0])
	}
	// An answer that ends before token N does not loop.
	plain := chat(t, ts, body(10), false)
	if a := runHeaders(t, ts, "/v1/chat/completions", body(10), false, true, map[string]string{HeaderLoopAfter: "50"}); a.text[0] != plain.text[0] || a.finish[0] != plain.finish[0] {
		t.Fatalf("%q (%s), want the plain %q (%s)", a.text[0], a.finish[0], plain.text[0], plain.finish[0])
	}
	// A tool call is left as it is.
	tools := chatBody("weather in Paris", map[string]any{"max_tokens": 200, "tools": []any{weatherTool}})
	if a, b := chat(t, ts, tools, false), runHeaders(t, ts, "/v1/chat/completions", tools, false, true, map[string]string{HeaderLoopAfter: "3"}); a.toolArgs != b.toolArgs || b.toolArgs == "" {
		t.Fatalf("tool call arguments %q with the knob, %q without", b.toolArgs, a.toolArgs)
	}
}

// TestLoopAfterContinuation: a looping answer cut after k tokens and continued from its prefix
// reads as the uncut one, loop included.
func TestLoopAfterContinuation(t *testing.T) {
	_, ts := start(t, Config{})
	hdr := map[string]string{HeaderLoopAfter: "12", HeaderLoopPeriod: "5"}
	const content = "tell me a story"
	full := runHeaders(t, ts, "/v1/chat/completions", chatBody(content, map[string]any{"max_tokens": 40}), false, true, hdr)
	words := strings.Fields(full.text[0])
	for _, k := range []int{3, 12, 25} {
		body := map[string]any{
			"model": "sim-llama",
			"messages": []map[string]any{
				{"role": "user", "content": content},
				{"role": "assistant", "content": strings.Join(words[:k], " ")},
			},
			"max_tokens": 40 - k, "continue_final_message": true, "add_generation_prompt": false,
		}
		rest := runHeaders(t, ts, "/v1/chat/completions", body, true, true, hdr)
		if got := strings.Join(words[:k], " ") + rest.text[0]; got != full.text[0] {
			t.Errorf("k=%d: prefix+continuation = %q, want %q", k, got, full.text[0])
		}
	}
}

func TestLoopKnobErrors(t *testing.T) {
	_, ts := start(t, Config{})
	for _, hdr := range []map[string]string{
		{HeaderLoopAfter: "0"},
		{HeaderLoopAfter: "-3"},
		{HeaderLoopAfter: "soon"},
		{HeaderLoopPeriod: "4"},
		{HeaderLoopAfter: "10", HeaderLoopPeriod: "11"},
		{HeaderLoopAfter: "10", HeaderLoopPeriod: "0"},
		{HeaderLoopAfter: "10", HeaderLoopPeriod: "x"},
	} {
		resp, b := post(t, ts, "/v1/chat/completions", chatBody("hi", nil), hdr)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "invalid_header") {
			t.Errorf("%v: %d %s", hdr, resp.StatusCode, b)
		}
	}
}
