package sim

import (
	"strings"
	"testing"
)

// TestContinueFinalMessage: an answer cut after k tokens and continued from its prefix (vLLM's
// continue_final_message) reads exactly as the uncut answer.
func TestContinueFinalMessage(t *testing.T) {
	_, ts := start(t, Config{})
	const content = "tell me a story [[mem:k1]]"
	full := chat(t, ts, chatBody(content, map[string]any{"max_tokens": 24, "ignore_eos": true}), false)
	words := strings.Fields(full.text[0])
	if len(words) != 24 {
		t.Fatalf("uncut answer has %d tokens: %q", len(words), full.text[0])
	}
	for _, k := range []int{1, 7, 23} {
		for _, stream := range []bool{false, true} {
			body := map[string]any{
				"model": "sim-llama",
				"messages": []map[string]any{
					{"role": "user", "content": content},
					{"role": "assistant", "content": strings.Join(words[:k], " ")},
				},
				"max_tokens": 24 - k, "ignore_eos": true,
				"continue_final_message": true, "add_generation_prompt": false,
			}
			rest := chat(t, ts, body, stream)
			if got := strings.Join(words[:k], " ") + rest.text[0]; got != full.text[0] {
				t.Errorf("k=%d stream=%v: prefix+continuation = %q, want %q", k, stream, got, full.text[0])
			}
		}
	}
}
