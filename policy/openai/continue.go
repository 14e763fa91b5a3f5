package openai

import (
	"encoding/json"
	"fmt"
)

// StreamText collects what a chat stream has sent so far, for resuming it elsewhere if it is
// cut: the text of the first choice, and whether anything was sent that a continuation
// cannot carry. vLLM's continue_final_message continues an assistant message's text; a
// tool call half sent, reasoning (reasoning_content), a refusal or audio would be restarted
// or garbled by a continuation (the client would get the same call id twice and arguments
// that no longer parse), so once one of them was relayed the stream is not resumable. It is
// used only where a stream may be resumed (it decodes each chunk, so it allocates).
type StreamText struct {
	Text []byte
	// Unresumable names what was relayed that a continuation cannot carry ("tool_calls",
	// "function_call", "reasoning", "refusal", "audio", "choices" for a choice other than
	// the first); "" while the stream can be resumed.
	Unresumable string
}

// Add takes one stream chunk (the data of an SSE event) into account; other data is ignored.
func (s *StreamText) Add(data []byte) {
	var c struct {
		Choices []struct {
			Index int `json:"index"`
			Delta struct {
				Content          string          `json:"content"`
				ReasoningContent string          `json:"reasoning_content"`
				Reasoning        string          `json:"reasoning"`
				Refusal          string          `json:"refusal"`
				ToolCalls        json.RawMessage `json:"tool_calls"`
				FunctionCall     json.RawMessage `json:"function_call"`
				Audio            json.RawMessage `json:"audio"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if len(data) == 0 || data[0] != '{' || json.Unmarshal(data, &c) != nil {
		return
	}
	for _, ch := range c.Choices {
		d := &ch.Delta
		switch {
		case s.Unresumable != "":
		case ch.Index != 0 && (d.Content != "" || present(d.ToolCalls) || d.ReasoningContent != "" || d.Reasoning != ""):
			s.Unresumable = "choices"
		case present(d.ToolCalls):
			s.Unresumable = "tool_calls"
		case present(d.FunctionCall):
			s.Unresumable = "function_call"
		case d.ReasoningContent != "" || d.Reasoning != "":
			s.Unresumable = "reasoning"
		case d.Refusal != "":
			s.Unresumable = "refusal"
		case present(d.Audio):
			s.Unresumable = "audio"
		}
		if ch.Index == 0 {
			s.Text = append(s.Text, d.Content...)
		}
	}
}

// present reports whether a raw JSON value is there and not null or empty.
func present(v json.RawMessage) bool {
	switch string(v) {
	case "", "null", "[]", "{}":
		return false
	}
	return true
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
	if prefill, ok := clientPrefill(top, msgs); ok {
		// The client already asked to continue its own final assistant message: the text
		// streamed so far continues that message.
		prefix = prefill + prefix
		msgs = msgs[:len(msgs)-1]
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

// clientPrefill returns the text of the request's final assistant message when the request
// itself asks to continue it (continue_final_message: true) and its content is a string.
func clientPrefill(top map[string]json.RawMessage, msgs []json.RawMessage) (string, bool) {
	var cont bool
	if json.Unmarshal(top["continue_final_message"], &cont) != nil || !cont || len(msgs) == 0 {
		return "", false
	}
	var last struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(msgs[len(msgs)-1], &last) != nil || last.Role != "assistant" {
		return "", false
	}
	var text string
	if json.Unmarshal(last.Content, &text) != nil {
		return "", false
	}
	return text, true
}
