package openai

import (
	"encoding/json"
	"testing"
)

func TestAppendChatContent(t *testing.T) {
	var got []byte
	for _, d := range []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"Hello"}}]}`,
		`{"choices":[{"index":1,"delta":{"content":"other choice"}}]}`,
		`{"choices":[{"index":0,"delta":{"content":" w\u00f6rld"}}]}`,
		`{"choices":[],"usage":{"completion_tokens":2}}`,
		`[DONE]`,
	} {
		got = AppendChatContent(got, []byte(d))
	}
	if string(got) != "Hello wörld" {
		t.Fatalf("got %q", got)
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
