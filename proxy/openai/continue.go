package openai

import (
	"encoding/json"
	"fmt"
)

// AppendChatContent appends the text of a chat stream chunk's first choice
// (choices[0].delta.content) to dst. It is used only where a stream may have to be resumed
// (it decodes the chunk, so it allocates); other data is ignored.
func AppendChatContent(dst, data []byte) []byte {
	var c struct {
		Choices []struct {
			Index int `json:"index"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &c) != nil {
		return dst
	}
	for _, ch := range c.Choices {
		if ch.Index == 0 {
			dst = append(dst, ch.Delta.Content...)
		}
	}
	return dst
}

// ContinuationBody turns a chat request into one that continues a partial answer: the text
// streamed so far becomes a final assistant message that the model server continues
// (vLLM's "continue_final_message": true, "add_generation_prompt": false), and maxTokens,
// when > 0, is the output budget left. The body is re-encoded (key order is not kept).
func ContinuationBody(body []byte, prefix string, maxTokens int) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("continuation: %w", err)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(top["messages"], &msgs); err != nil {
		return nil, fmt.Errorf("continuation: messages: %w", err)
	}
	prev, err := json.Marshal(map[string]string{"role": "assistant", "content": prefix})
	if err != nil {
		return nil, err
	}
	msgs = append(msgs, prev)
	set := func(k string, v any) {
		b, _ := json.Marshal(v)
		top[k] = b
	}
	set("messages", msgs)
	set("continue_final_message", true)
	set("add_generation_prompt", false)
	if maxTokens > 0 {
		delete(top, "max_completion_tokens")
		set("max_tokens", maxTokens)
	}
	return json.Marshal(top)
}
