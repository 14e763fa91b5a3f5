package openai

import (
	"encoding/json"
	"testing"
)

func TestStreamText(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		text   string
		unres  string
	}{
		{"content", []string{
			`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
			`{"choices":[{"index":0,"delta":{"content":"Hello"}}]}`,
			`{"choices":[{"index":0,"delta":{"content":" w\u00f6rld"},"logprobs":{"content":[]}}]}`,
			`{"choices":[],"usage":{"completion_tokens":2}}`,
			`[DONE]`,
		}, "Hello wörld", ""},
		{"tool call", []string{
			`{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
		}, "", "tool_calls"},
		{"text then tool call", []string{
			`{"choices":[{"index":0,"delta":{"content":"Let me check."}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"content":" more"}}]}`,
		}, "Let me check. more", "tool_calls"},
		{"empty tool_calls is nothing", []string{`{"choices":[{"index":0,"delta":{"content":"a","tool_calls":[]}}]}`}, "a", ""},
		{"reasoning", []string{`{"choices":[{"index":0,"delta":{"reasoning_content":"thinking"}}]}`}, "", "reasoning"},
		{"reasoning (new name)", []string{`{"choices":[{"index":0,"delta":{"reasoning":"thinking"}}]}`}, "", "reasoning"},
		{"legacy function_call", []string{`{"choices":[{"index":0,"delta":{"function_call":{"name":"f","arguments":""}}}]}`}, "", "function_call"},
		{"refusal", []string{`{"choices":[{"index":0,"delta":{"refusal":"I can't"}}]}`}, "", "refusal"},
		{"second choice", []string{`{"choices":[{"index":1,"delta":{"content":"other"}}]}`}, "", "choices"},
		{"not json", []string{`{"choices":`, `hello`}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s StreamText
			for _, d := range tc.chunks {
				s.Add([]byte(d))
			}
			if string(s.Text) != tc.text || s.Unresumable != tc.unres {
				t.Fatalf("text %q unresumable %q, want %q %q", s.Text, s.Unresumable, tc.text, tc.unres)
			}
		})
	}
}

func TestContinuationBodyClientPrefill(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure:"}],"continue_final_message":true,"add_generation_prompt":false}`
	out, err := ContinuationBody([]byte(in), " one two", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Messages) != 2 || got.Messages[1].Content != "Sure: one two" {
		t.Fatalf("continuation of a client prefill = %s, want one assistant message continued", out)
	}
}

func TestContinuationBody(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_completion_tokens":50}`
	out, err := ContinuationBody([]byte(in), "Hello the", 48)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Model    string
		Stream   bool
		Messages []struct{ Role, Content string }
		MaxTok   int   `json:"max_tokens"`
		MaxComp  *int  `json:"max_completion_tokens"`
		Continue bool  `json:"continue_final_message"`
		AddGen   *bool `json:"add_generation_prompt"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got.Model != "m" || !got.Stream || len(got.Messages) != 2 || got.Messages[1].Role != "assistant" ||
		got.Messages[1].Content != "Hello the" || got.MaxTok != 48 || got.MaxComp != nil || !got.Continue ||
		got.AddGen == nil || *got.AddGen {
		t.Fatalf("continuation body = %s", out)
	}
	if _, err := ContinuationBody([]byte(`{"messages":5}`), "x", 1); err == nil {
		t.Fatal("bad messages must be an error")
	}
}
