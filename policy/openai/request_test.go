package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func ptrF(f float64) *float64 { return &f }
func ptrI(i int64) *int64     { return &i }
func ptrB(b bool) *bool       { return &b }

// sizes says which of the size fields a case checks; -1 leaves one unchecked.
type sizes struct{ chars, tokens, depth int }

func TestParseRequestValid(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		body string
		want Request // Kind and Body are filled in
		size sizes
	}{
		{
			name: "chat string content",
			kind: KindChat,
			body: `{"model":"llama-3","messages":[{"role":"user","content":"Hello"}]}`,
			want: Request{Model: "llama-3", N: 1, Messages: 1},
			// 5 letters = 10/8 → 2 tokens, + 4 for the message + 3 priming.
			size: sizes{chars: 5, tokens: 2 + 4 + 3, depth: 1},
		},
		{
			name: "chat all scalars",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],
				"stream":true,"stream_options":{"include_usage":true},"max_tokens":128,"max_completion_tokens":64,
				"n":2,"user":"alice","temperature":0.7,"seed":-42,"response_format":{"type":"json_object"},
				"tool_choice":"none","top_p":1,"logit_bias":{"50256":-100},"stop":["\n"]}`,
			want: Request{Model: "m", Stream: true, IncludeUsage: true, MaxTokens: 128, N: 2, Messages: 2,
				User: "alice", Temperature: ptrF(0.7), Seed: ptrI(-42), ResponseFormat: "json_object", ToolChoice: "none"},
			size: sizes{chars: 11, tokens: -1, depth: 1},
		},
		{
			name: "max_completion_tokens when no max_tokens",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":64,"max_tokens":null}`,
			want: Request{Model: "m", MaxTokens: 64, N: 1, Messages: 1},
			size: sizes{-1, -1, -1},
		},
		{
			name: "integral float accepted for an integer",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.0e2,"n":1.0}`,
			want: Request{Model: "m", MaxTokens: 100, N: 1, Messages: 1},
			size: sizes{-1, -1, -1},
		},
		{
			name: "nulls are absent",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"user","content":null}],"stream":null,"n":null,"temperature":null,
				"seed":null,"user":null,"tools":null,"tool_choice":null,"response_format":null,"stream_options":null}`,
			want: Request{Model: "m", N: 1, Messages: 1},
			size: sizes{chars: 0, tokens: 7, depth: 0},
		},
		{
			name: "chat content parts",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"user","content":[
				{"type":"text","text":"What is in this image?"},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}}]}]}`,
			want: Request{Model: "m", N: 1, Messages: 1},
			size: sizes{chars: 22, tokens: -1, depth: 1},
		},
		{
			name: "type after payload",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"user","content":[{"image_url":{"url":"u"},"type":"image_url"},{"text":"hi","type":"text"}]}]}`,
			want: Request{Model: "m", N: 1, Messages: 1},
			size: sizes{chars: 2, tokens: -1, depth: 1},
		},
		{
			name: "escaped keys and values",
			kind: KindChat,
			body: `{"mod\u0065l":"a\"b","messages":[{"r\u006fle":"user","c\u006fntent":"\u00e9\n\ud83d\ude00"}],"str\u0065am":true}`,
			want: Request{Model: `a"b`, Stream: true, N: 1, Messages: 1},
			// é (2-byte: 4) + \n (2) + 😀 (4-byte: 16) = 22/8 → 3, + 7.
			size: sizes{chars: 3, tokens: 3 + 7, depth: 1},
		},
		{
			name: "tools and tool calls",
			kind: KindChat,
			body: `{"model":"m","tool_choice":{"type":"function","function":{"name":"get_weather"}},
				"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
				         {"type":"function","function":{"name":"get_time"}}],
				"messages":[
				 {"role":"user","content":"Weather in Paris?"},
				 {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
				 {"role":"tool","tool_call_id":"c1","content":"{\"temp\":21,\"sky\":\"clear\"}"}]}`,
			want: Request{Model: "m", N: 1, Messages: 3, Tools: 2, ToolChoice: "get_weather"},
			size: sizes{chars: -1, tokens: -1, depth: 2},
		},
		{
			name: "legacy functions and function_call",
			kind: KindChat,
			body: `{"model":"m","functions":[{"name":"f"}],"messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{\"a\":{\"b\":[1]}}"}}]}`,
			want: Request{Model: "m", N: 1, Messages: 1, Tools: 1},
			size: sizes{chars: -1, tokens: -1, depth: 3},
		},
		{
			name: "completion string prompt",
			kind: KindCompletion,
			body: `{"model":"m","prompt":"Once upon a time","max_tokens":16,"echo":false}`,
			want: Request{Model: "m", MaxTokens: 16, N: 1, Inputs: 1},
			// 16 letters/spaces = 32/8 = 4 tokens, no chat overhead.
			size: sizes{chars: 16, tokens: 4, depth: 1},
		},
		{
			name: "completion string array",
			kind: KindCompletion,
			body: `{"model":"m","prompt":["a","bb","ccc"]}`,
			want: Request{Model: "m", N: 1, Inputs: 3},
			size: sizes{chars: 6, tokens: 2, depth: 1},
		},
		{
			name: "completion token IDs",
			kind: KindCompletion,
			body: `{"model":"m","prompt":[1, 2, 3, 4]}`,
			want: Request{Model: "m", N: 1, Inputs: 1},
			size: sizes{chars: 0, tokens: 4, depth: 1},
		},
		{
			name: "completion token ID arrays",
			kind: KindCompletion,
			body: `{"model":"m","prompt":[[1,2],[3],[]]}`,
			want: Request{Model: "m", N: 1, Inputs: 3},
			size: sizes{chars: 0, tokens: 3, depth: 1},
		},
		{
			name: "embedding string",
			kind: KindEmbedding,
			body: `{"model":"e","input":"The food was delicious","encoding_format":"float"}`,
			want: Request{Model: "e", N: 1, Inputs: 1},
			size: sizes{chars: 22, tokens: 6, depth: 1},
		},
		{
			name: "embedding strings",
			kind: KindEmbedding,
			body: `{"model":"e","input":["a","b"]}`,
			want: Request{Model: "e", N: 1, Inputs: 2},
			size: sizes{chars: 2, tokens: 1, depth: 1},
		},
		{
			name: "embedding token IDs",
			kind: KindEmbedding,
			body: `{"model":"e","input":[101,2023,102]}`,
			want: Request{Model: "e", N: 1, Inputs: 1},
			size: sizes{chars: 0, tokens: 3, depth: 1},
		},
		{
			name: "embedding token ID arrays",
			kind: KindEmbedding,
			body: `{"model":"e","input":[[101],[102,103]]}`,
			want: Request{Model: "e", N: 1, Inputs: 2},
			size: sizes{chars: 0, tokens: 3, depth: 1},
		},
		{
			name: "fields of other kinds are skipped",
			kind: KindEmbedding,
			body: `{"model":"e","input":"x","messages":5,"prompt":{}}`,
			want: Request{Model: "e", N: 1, Inputs: 1},
			size: sizes{-1, -1, -1},
		},
		{
			name: "chat without a model",
			kind: KindChat,
			body: `{"messages":[{"role":"user","content":"x"}]}`,
			want: Request{N: 1, Messages: 1},
			size: sizes{-1, -1, -1},
		},
		{
			name: "null model",
			kind: KindChat,
			body: `{"model":null,"messages":[{"role":"user","content":"x"}]}`,
			want: Request{N: 1, Messages: 1},
			size: sizes{-1, -1, -1},
		},
		{
			name: "completion without a model",
			kind: KindCompletion,
			body: `{"prompt":"x"}`,
			want: Request{N: 1, Inputs: 1},
			size: sizes{-1, -1, -1},
		},
		{
			name: "embedding without a model",
			kind: KindEmbedding,
			body: `{"input":["a","b"],"model":null}`,
			want: Request{N: 1, Inputs: 2},
			size: sizes{-1, -1, -1},
		},
		{
			name: "chat skips the Responses fields",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"input":{},"instructions":5,"max_output_tokens":"x",
				"text":1,"previous_response_id":2,"store":"y","background":3}`,
			want: Request{Model: "m", N: 1, Messages: 1},
			size: sizes{chars: 1, tokens: 8, depth: 1},
		},
		{
			name: "chat tool_choice does not take the Responses form",
			kind: KindChat,
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","name":"f"}}`,
			want: Request{Model: "m", N: 1, Messages: 1, ToolChoice: "function"},
			size: sizes{-1, -1, -1},
		},
		{
			name: "responses string input",
			kind: KindResponses,
			body: `{"model":"gpt-oss","input":"Hello"}`,
			want: Request{Model: "gpt-oss", N: 1, Messages: 1},
			// 5 letters = 10/8 → 2 tokens, + 4 for the message + 3 priming.
			size: sizes{chars: 5, tokens: 2 + 4 + 3, depth: 1},
		},
		{
			name: "responses without a model",
			kind: KindResponses,
			body: `{"input":"Hello"}`,
			want: Request{N: 1, Messages: 1},
			size: sizes{chars: 5, tokens: 9, depth: 1},
		},
		{
			name: "responses all scalars",
			kind: KindResponses,
			body: `{"model":"m","input":"Hi","instructions":"Be brief.","stream":true,"max_output_tokens":128,"temperature":0.5,
				"seed":7,"user":"alice","tool_choice":"required","parallel_tool_calls":false,"metadata":{"k":"v"},
				"text":{"format":{"type":"json_schema","name":"person","schema":{"type":"object","properties":{"a":{"type":"string"}}},"strict":true},"verbosity":"low"},
				"previous_response_id":"resp_123","store":false,"background":true,"reasoning":{"effort":"low"},"truncation":"auto",
				"include":["reasoning.encrypted_content"],"top_p":1}`,
			want: Request{Model: "m", Stream: true, MaxTokens: 128, N: 1, Messages: 1, User: "alice", Temperature: ptrF(0.5),
				Seed: ptrI(7), ToolChoice: "required", ResponseFormat: "json_schema", PreviousResponseID: "resp_123",
				Store: ptrB(false), Background: true},
			// "Hi" (4) + "Be brief." (8 letters and spaces: 16, a period: 5) = 25/8 → 4 tokens,
			// + 4 for the input message + 4 for the instructions + 3 priming.
			size: sizes{chars: 11, tokens: 4 + 8 + 3, depth: 1},
		},
		{
			name: "responses skip the other APIs' fields",
			kind: KindResponses,
			body: `{"model":"m","input":"x","max_tokens":"5","max_completion_tokens":5,"n":3,"response_format":{"type":"json_object"},
				"stream_options":{"include_usage":true},"messages":5,"prompt":1,"functions":"f"}`,
			want: Request{Model: "m", N: 1, Messages: 1},
			size: sizes{chars: 1, tokens: 8, depth: 1},
		},
		{
			name: "responses input items",
			kind: KindResponses,
			body: `{"model":"m","tool_choice":{"type":"function","name":"get_weather"},
				"tools":[{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true},{"type":"web_search_preview"}],
				"input":[
				 {"role":"user","content":"Weather in Paris?"},
				 {"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"Let me check.","annotations":[]}]},
				 {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
				 {"type":"function_call_output","call_id":"c1","output":"{\"temp\":21,\"sky\":\"clear\"}"},
				 {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Think"}],"encrypted_content":"gAAAA"},
				 {"type":"item_reference","id":"msg_0"},
				 {"role":"user","content":[{"type":"input_text","text":"And tomorrow?"},{"type":"input_image","image_url":"https://x/y.png","detail":"low"}]}]}`,
			want: Request{Model: "m", N: 1, Messages: 7, Tools: 2, ToolChoice: "get_weather"},
			// The tool output is {"temp":...} (2); the arguments' object is an envelope (1).
			size: sizes{chars: -1, tokens: -1, depth: 2},
		},
		{
			name: "responses fields before the item type",
			kind: KindResponses,
			body: `{"input":[{"content":"x","role":"user","type":"message"},{"arguments":"{\"a\":{\"b\":1}}","name":"f","call_id":"c","type":"function_call"},
				{"output":{"type":"computer_screenshot","image_url":"data:"},"call_id":"c","type":"computer_call_output"}],"model":"m"}`,
			want: Request{Model: "m", N: 1, Messages: 3},
			size: sizes{chars: -1, tokens: -1, depth: 2},
		},
		{
			name: "responses tool outputs as content parts, custom tools",
			kind: KindResponses,
			body: `{"model":"m","input":[{"type":"custom_tool_call","call_id":"c","name":"sh","input":"ls"},
				{"type":"custom_tool_call_output","call_id":"c","output":"a b"},
				{"type":"function_call_output","call_id":"d","output":[{"type":"input_text","text":"ok"},{"type":"input_image","image_url":"u"}]},
				{"type":"function_call_output","call_id":"e","output":null}]}`,
			want: Request{Model: "m", N: 1, Messages: 4},
			// "sh" "ls" "a b" "ok": 9 characters.
			size: sizes{chars: 9, tokens: -1, depth: 1},
		},
		{
			name: "responses tool_choice does not take the chat form",
			kind: KindResponses,
			body: `{"model":"m","input":"x","tool_choice":{"type":"function","function":{"name":"f"}}}`,
			want: Request{Model: "m", N: 1, Messages: 1, ToolChoice: "function"},
			size: sizes{-1, -1, -1},
		},
		{
			name: "responses hosted tool choice",
			kind: KindResponses,
			body: `{"model":"m","input":"x","tool_choice":{"type":"web_search_preview"},"tools":[{"type":"web_search_preview"}]}`,
			want: Request{Model: "m", N: 1, Messages: 1, Tools: 1, ToolChoice: "web_search_preview"},
			size: sizes{-1, -1, -1},
		},
		{
			name: "responses empty input",
			kind: KindResponses,
			body: `{"model":"m","input":[],"previous_response_id":"resp_1"}`,
			want: Request{Model: "m", N: 1, PreviousResponseID: "resp_1"},
			size: sizes{chars: 0, tokens: 0, depth: 0},
		},
		{
			name: "responses empty input with instructions",
			kind: KindResponses,
			body: `{"model":"m","input":[],"instructions":"abcd"}`,
			want: Request{Model: "m", N: 1},
			// "abcd" 1 token, + 4 for the instructions + 3 priming.
			size: sizes{chars: 4, tokens: 1 + 4 + 3, depth: 1},
		},
		{
			name: "white space everywhere",
			kind: KindChat,
			body: " \r\n\t{ \"model\" : \"m\" , \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"x\" } ] } \n",
			want: Request{Model: "m", N: 1, Messages: 1},
			size: sizes{-1, -1, -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(tt.kind, []byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if !bytes.Equal(got.Body, []byte(tt.body)) {
				t.Errorf("Body is not the input")
			}
			want := tt.want
			want.Kind, want.Body = tt.kind, got.Body
			g := *got
			for _, f := range []struct {
				want int
				got  *int
			}{{tt.size.chars, &g.PromptChars}, {tt.size.tokens, &g.PromptTokens}, {tt.size.depth, &g.Depth}} {
				if f.want < 0 {
					*f.got = 0
				}
			}
			want.PromptChars, want.PromptTokens, want.Depth = max(tt.size.chars, 0), max(tt.size.tokens, 0), max(tt.size.depth, 0)
			if !equalRequest(g, want) {
				t.Errorf("got  %+v\nwant %+v", show(g), show(want))
			}
		})
	}
}

func equalRequest(a, b Request) bool {
	ja, _ := json.Marshal(show(a))
	jb, _ := json.Marshal(show(b))
	return bytes.Equal(ja, jb)
}

// show drops Body and dereferences pointers for comparison and printing.
func show(r Request) any {
	type view struct {
		Request
		Body        bool     `json:"-"`
		Temperature *float64 `json:",omitempty"`
		Seed        *int64   `json:",omitempty"`
	}
	return view{Request: r, Temperature: r.Temperature, Seed: r.Seed}
}

func TestParseRequestOtherKinds(t *testing.T) {
	for _, k := range []Kind{KindModels, KindOther} {
		r, err := ParseRequest(k, []byte("not json"))
		if err != nil || r.Kind != k || r.N != 1 || string(r.Body) != "not json" {
			t.Errorf("%v: %+v, %v", k, r, err)
		}
	}
}

func TestParseRequestErrors(t *testing.T) {
	chat := func(extra string) string {
		return `{"model":"m","messages":[{"role":"user","content":"x"}]` + extra + `}`
	}
	tests := []struct {
		name    string
		kind    Kind
		body    string
		code    string
		param   string
		message string // substring
	}{
		// Malformed JSON.
		{"empty body", KindChat, ``, codeInvalidJSON, "", "offset 0: unexpected end"},
		{"truncated", KindChat, `{"model":"m"`, codeInvalidJSON, "", "offset 12: unexpected end"},
		{"trailing comma", KindChat, `{"model":"m",}`, codeInvalidJSON, "", "offset 13"},
		{"single quotes", KindChat, `{'model':'m'}`, codeInvalidJSON, "", "offset 1"},
		{"bad literal", KindChat, `{"model":"m","stream":tru}`, codeInvalidJSON, "", "offset 25"},
		{"bad number", KindChat, `{"model":"m","n":01}`, codeInvalidJSON, "", "offset 18"},
		{"bad escape", KindChat, `{"model":"\x"}`, codeInvalidJSON, "", "escape"},
		{"control character", KindChat, "{\"model\":\"a\nb\"}", codeInvalidJSON, "", "control character"},
		{"missing comma", KindChat, `{"model":"m" "n":1}`, codeInvalidJSON, "", "offset 13: expected ',' or '}'"},
		{"missing colon", KindChat, `{"model" "m"}`, codeInvalidJSON, "", "offset 9: expected ':'"},
		{"trailing data", KindChat, chat("") + `{}`, codeInvalidJSON, "", "unexpected data"},
		{"not an object", KindChat, `[1,2]`, codeInvalidType, "", "expected an object, but got an array"},
		{"syntax error wins over a type error", KindChat, `{"model":5,"messages":[}`, codeInvalidJSON, "", ""},
		{"syntax error deep in content", KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"]}]}`, codeInvalidJSON, "", ""},

		// Wrong types.
		{"model", KindChat, `{"model":5,"messages":[{"role":"user","content":"x"}]}`, codeInvalidType, "model", "expected a string or null, but got a number"},
		{"stream", KindChat, chat(`,"stream":"yes"`), codeInvalidType, "stream", "expected a boolean"},
		{"stream_options", KindChat, chat(`,"stream_options":true`), codeInvalidType, "stream_options", "an object"},
		{"include_usage", KindChat, chat(`,"stream_options":{"include_usage":1}`), codeInvalidType, "stream_options.include_usage", "a boolean"},
		{"max_tokens string", KindChat, chat(`,"max_tokens":"10"`), codeInvalidType, "max_tokens", "an integer"},
		{"max_tokens decimal", KindChat, chat(`,"max_tokens":1.5`), codeInvalidType, "max_tokens", "decimal"},
		{"max_completion_tokens", KindChat, chat(`,"max_completion_tokens":[]`), codeInvalidType, "max_completion_tokens", "an integer"},
		{"n", KindChat, chat(`,"n":true`), codeInvalidType, "n", "an integer"},
		{"user", KindChat, chat(`,"user":{}`), codeInvalidType, "user", "a string"},
		{"temperature", KindChat, chat(`,"temperature":"hot"`), codeInvalidType, "temperature", "a number"},
		{"seed", KindChat, chat(`,"seed":0.5`), codeInvalidType, "seed", "integer"},
		{"response_format", KindChat, chat(`,"response_format":"json"`), codeInvalidType, "response_format", "an object"},
		{"response_format.type", KindChat, chat(`,"response_format":{"type":1}`), codeInvalidType, "response_format.type", "a string"},
		{"tools", KindChat, chat(`,"tools":{}`), codeInvalidType, "tools", "an array"},
		{"tools element", KindChat, chat(`,"tools":[{},1]`), codeInvalidType, "tools[1]", "an object"},
		{"functions", KindChat, chat(`,"functions":"f"`), codeInvalidType, "functions", "an array"},
		{"tool_choice", KindChat, chat(`,"tool_choice":3`), codeInvalidType, "tool_choice", "a string or an object"},
		{"messages", KindChat, `{"model":"m","messages":{}}`, codeInvalidType, "messages", "an array"},
		{"message", KindChat, `{"model":"m","messages":["hi"]}`, codeInvalidType, "messages[0]", "an object"},
		{"role", KindChat, `{"model":"m","messages":[{"role":1,"content":"x"}]}`, codeInvalidType, "messages[0].role", "a string"},
		{"content", KindChat, `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":42}]}`, codeInvalidType, "messages[1].content", "a string, an array of content parts, or null"},
		{"content part", KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"},"y"]}]}`, codeInvalidType, "messages[0].content[1]", "an object"},
		{"tool_calls", KindChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":{}}]}`, codeInvalidType, "messages[0].tool_calls", "an array"},
		{"tool_call", KindChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[1]}]}`, codeInvalidType, "messages[0].tool_calls[0]", "an object"},
		{"tool_call function", KindChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":"f"}]}]}`, codeInvalidType, "messages[0].tool_calls[0].function", "an object"},
		{"tool_call arguments", KindChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{}}}]}]}`, codeInvalidType, "messages[0].tool_calls[0].function.arguments", "a string"},
		{"function_call", KindChat, `{"model":"m","messages":[{"role":"assistant","function_call":[]}]}`, codeInvalidType, "messages[0].function_call", "an object"},
		{"prompt", KindCompletion, `{"model":"m","prompt":5}`, codeInvalidType, "prompt", promptTypes},
		{"prompt element", KindCompletion, `{"model":"m","prompt":[true]}`, codeInvalidType, "prompt[0]", promptTypes},
		{"prompt mixed", KindCompletion, `{"model":"m","prompt":["a",1]}`, codeInvalidType, "prompt[1]", "a string"},
		{"prompt token ID", KindCompletion, `{"model":"m","prompt":[1,2.5]}`, codeInvalidType, "prompt[1]", "token ID"},
		{"prompt nested", KindCompletion, `{"model":"m","prompt":[[1],["a"]]}`, codeInvalidType, "prompt[1][0]", "an integer"},
		{"input", KindEmbedding, `{"model":"m","input":{"text":"x"}}`, codeInvalidType, "input", promptTypes},
		{"input mixed", KindEmbedding, `{"model":"m","input":[[1],2]}`, codeInvalidType, "input[1]", "an array of integers"},
		{"first type error wins", KindChat, `{"model":"m","n":"2","stream":1,"messages":[{"role":"user","content":"x"}]}`, codeInvalidType, "n", ""},

		// Missing fields.
		{"no messages", KindChat, `{"model":"m"}`, codeMissingField, "messages", "'messages'"},
		{"null messages", KindChat, `{"model":"m","messages":null}`, codeMissingField, "messages", ""},
		{"no role", KindChat, `{"model":"m","messages":[{"content":"x"}]}`, codeMissingField, "messages[0].role", ""},
		{"no prompt", KindCompletion, `{"model":"m"}`, codeMissingField, "prompt", ""},
		{"no input", KindEmbedding, `{"model":"m","prompt":"x"}`, codeMissingField, "input", ""},

		// Invalid values.
		{"empty model", KindChat, `{"model":"","messages":[{"role":"user","content":"x"}]}`, codeInvalidValue, "model", "empty"},
		{"empty model", KindChat, `{"model":"","messages":[{"role":"user","content":"x"}]}`, codeInvalidValue, "model", "empty"},
		// Keys that collide with measured fields, by duplication or by case: servers disagree
		// on them, so the gateway and the server would read different requests.
		{"n over the bound", KindChat, `{"model":"m","n":200000000,"max_tokens":4096,"messages":[{"role":"user","content":"x"}]}`, codeInvalidValue, "n", "at most 128"},
		{"duplicate model", KindChat, `{"model":"a","messages":[{"role":"user","content":"x"}],"model":null}`, codeInvalidValue, "model", "Duplicate key 'model'"},
		{"case-variant model", KindChat, `{"MODEL":"x","model":"m","messages":[{"role":"user","content":"x"}]}`, codeInvalidValue, "MODEL", "differs from 'model' only by case"},
		{"prompt hidden in MESSAGES", KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"MESSAGES":[{"role":"user","content":"huge"}]}`, codeInvalidValue, "MESSAGES", "only by case"},
		{"MAX_TOKENS", KindChat, `{"model":"m","max_tokens":1,"MAX_TOKENS":3000,"messages":[{"role":"user","content":"x"}]}`, codeInvalidValue, "MAX_TOKENS", "only by case"},
		{"escaped case variant", KindChat, `{"model":"m","\u004dessages":[],"messages":[{"role":"user","content":"x"}]}`, codeInvalidValue, "Messages", "only by case"},
		{"duplicate messages", KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"messages":[{"role":"user","content":"y"}]}`, codeInvalidValue, "messages", "Duplicate"},
		{"message CONTENT", KindChat, `{"model":"m","messages":[{"role":"user","content":"x","CONTENT":"huge"}]}`, codeInvalidValue, "messages[0].CONTENT", "only by case"},
		{"message content twice", KindChat, `{"model":"m","messages":[{"role":"user","content":"x","content":"huge"}]}`, codeInvalidValue, "messages[0].content", "Duplicate"},
		{"responses duplicate input", KindResponses, `{"model":"m","input":"x","input":"y"}`, codeInvalidValue, "input", "Duplicate"},
		{"responses Max_Output_Tokens", KindResponses, `{"model":"m","input":"x","max_output_tokens":1,"Max_Output_Tokens":9999}`, codeInvalidValue, "Max_Output_Tokens", "only by case"},
		{"empty completion model", KindCompletion, `{"model":"","prompt":"x"}`, codeInvalidValue, "model", "empty"},
		{"empty embedding model", KindEmbedding, `{"model":"","input":"x"}`, codeInvalidValue, "model", "empty"},
		{"empty messages", KindChat, `{"model":"m","messages":[]}`, codeInvalidValue, "messages", "at least one"},
		{"negative max_tokens", KindChat, chat(`,"max_tokens":-1`), codeInvalidValue, "max_tokens", "at least 0, got -1"},
		{"negative max_completion_tokens", KindChat, chat(`,"max_completion_tokens":-5`), codeInvalidValue, "max_completion_tokens", "got -5"},
		{"huge max_tokens", KindChat, chat(`,"max_tokens":99999999999999999999`), codeInvalidValue, "max_tokens", "out of range"},
		{"n zero", KindChat, chat(`,"n":0`), codeInvalidValue, "n", "at least 1"},
		{"tool_choice word", KindChat, chat(`,"tool_choice":"always"`), codeInvalidValue, "tool_choice", "auto"},
		{"empty prompt array", KindCompletion, `{"model":"m","prompt":[]}`, codeInvalidValue, "prompt", "empty"},
		{"empty input array", KindEmbedding, `{"model":"m","input":[]}`, codeInvalidValue, "input", "empty"},
		{"empty input string", KindEmbedding, `{"model":"m","input":""}`, codeInvalidValue, "input", "empty string"},
		{"temperature overflow", KindChat, chat(`,"temperature":1e999`), codeInvalidValue, "temperature", "out of range"},

		// Responses.
		{"responses syntax error in an item", KindResponses, `{"model":"m","input":[{"type":"function_call","arguments":"{"}`, codeInvalidJSON, "", ""},
		{"responses syntax error wins", KindResponses, `{"model":5,"input":[{"role":"user","content":[}]}`, codeInvalidJSON, "", ""},
		{"responses not an object", KindResponses, `"hi"`, codeInvalidType, "", "expected an object"},
		{"responses model", KindResponses, `{"model":["m"],"input":"x"}`, codeInvalidType, "model", "a string"},
		{"responses input number", KindResponses, `{"model":"m","input":5}`, codeInvalidType, "input", "a string or an array of input items"},
		{"responses input object", KindResponses, `{"input":{"role":"user","content":"x"}}`, codeInvalidType, "input", "a string or an array of input items"},
		{"responses token IDs", KindResponses, `{"model":"m","input":[1,2,3]}`, codeInvalidType, "input[0]", "an object"},
		{"responses item string", KindResponses, `{"model":"m","input":[{"role":"user","content":"x"},"y"]}`, codeInvalidType, "input[1]", "an object"},
		{"responses item type", KindResponses, `{"model":"m","input":[{"type":5,"role":"user"}]}`, codeInvalidType, "input[0].type", "a string"},
		{"responses role", KindResponses, `{"model":"m","input":[{"role":1,"content":"x"}]}`, codeInvalidType, "input[0].role", "a string"},
		{"responses content", KindResponses, `{"model":"m","input":[{"role":"user","content":5}]}`, codeInvalidType, "input[0].content", "a string, an array of content parts, or null"},
		{"responses content part", KindResponses, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"},"y"]}]}`, codeInvalidType, "input[0].content[1]", "an object"},
		{"responses arguments", KindResponses, `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":{"a":1}}]}`, codeInvalidType, "input[0].arguments", "a string"},
		{"responses output object", KindResponses, `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":{"a":1}}]}`, codeInvalidType, "input[0].output", "a string or an array of content parts, but got an object"},
		{"responses output before its type", KindResponses, `{"model":"m","input":[{"output":5,"call_id":"c","type":"function_call_output"}]}`, codeInvalidType, "input[0].output", "but got a number"},
		{"responses custom output", KindResponses, `{"model":"m","input":[{"type":"custom_tool_call_output","call_id":"c","output":true}]}`, codeInvalidType, "input[0].output", "a boolean"},
		{"responses output part", KindResponses, `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":[1]}]}`, codeInvalidType, "input[0].output[0]", "an object"},
		{"responses instructions", KindResponses, `{"model":"m","input":"x","instructions":["a"]}`, codeInvalidType, "instructions", "a string or null"},
		{"responses max_output_tokens", KindResponses, `{"model":"m","input":"x","max_output_tokens":"100"}`, codeInvalidType, "max_output_tokens", "an integer"},
		{"responses max_output_tokens decimal", KindResponses, `{"model":"m","input":"x","max_output_tokens":1.5}`, codeInvalidType, "max_output_tokens", "decimal"},
		{"responses stream", KindResponses, `{"model":"m","input":"x","stream":"true"}`, codeInvalidType, "stream", "a boolean"},
		{"responses temperature", KindResponses, `{"model":"m","input":"x","temperature":"0"}`, codeInvalidType, "temperature", "a number"},
		{"responses seed", KindResponses, `{"model":"m","input":"x","seed":"1"}`, codeInvalidType, "seed", "an integer"},
		{"responses user", KindResponses, `{"model":"m","input":"x","user":7}`, codeInvalidType, "user", "a string"},
		{"responses text", KindResponses, `{"model":"m","input":"x","text":"json"}`, codeInvalidType, "text", "an object or null"},
		{"responses text.format", KindResponses, `{"model":"m","input":"x","text":{"format":"json_object"}}`, codeInvalidType, "text.format", "an object or null"},
		{"responses text.format.type", KindResponses, `{"model":"m","input":"x","text":{"format":{"type":1}}}`, codeInvalidType, "text.format.type", "a string"},
		{"responses previous_response_id", KindResponses, `{"model":"m","input":"x","previous_response_id":1}`, codeInvalidType, "previous_response_id", "a string"},
		{"responses store", KindResponses, `{"model":"m","input":"x","store":"no"}`, codeInvalidType, "store", "a boolean"},
		{"responses background", KindResponses, `{"model":"m","input":"x","background":1}`, codeInvalidType, "background", "a boolean"},
		{"responses tools", KindResponses, `{"model":"m","input":"x","tools":{"type":"function","name":"f"}}`, codeInvalidType, "tools", "an array"},
		{"responses tools element", KindResponses, `{"model":"m","input":"x","tools":[{"type":"function","name":"f"},"web_search"]}`, codeInvalidType, "tools[1]", "an object"},
		{"responses tool_choice", KindResponses, `{"model":"m","input":"x","tool_choice":true}`, codeInvalidType, "tool_choice", "a string or an object"},
		{"responses no input", KindResponses, `{"model":"m","instructions":"x"}`, codeMissingField, "input", "'input'"},
		{"responses null input", KindResponses, `{"model":"m","input":null}`, codeMissingField, "input", ""},
		{"responses input null", KindResponses, `{"model":"m","input":null}`, codeMissingField, "input", ""},
		{"responses no role", KindResponses, `{"model":"m","input":[{"content":"x"}]}`, codeMissingField, "input[0].role", "'input[0].role'"},
		{"responses message without role", KindResponses, `{"model":"m","input":[{"role":"user","content":"x"},{"content":"y","type":"message"}]}`, codeMissingField, "input[1].role", ""},
		{"responses null role", KindResponses, `{"model":"m","input":[{"role":null,"content":"x"}]}`, codeMissingField, "input[0].role", ""},
		{"responses empty model", KindResponses, `{"model":"","input":"x"}`, codeInvalidValue, "model", "empty"},
		{"responses negative max_output_tokens", KindResponses, `{"model":"m","input":"x","max_output_tokens":-1}`, codeInvalidValue, "max_output_tokens", "at least 0"},
		{"responses tool_choice word", KindResponses, `{"model":"m","input":"x","tool_choice":"any"}`, codeInvalidValue, "tool_choice", "auto"},
		{"responses first error wins", KindResponses, `{"model":"m","store":1,"input":[{"role":2}]}`, codeInvalidType, "store", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(tt.kind, []byte(tt.body))
			if err == nil {
				t.Fatalf("no error; got %+v", r)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *Error", err)
			}
			if e.Status != http.StatusBadRequest || e.Type != "invalid_request_error" || e.Code != tt.code || e.Param != tt.param {
				t.Errorf("got status %d type %q code %q param %q (%s), want 400 invalid_request_error %q %q",
					e.Status, e.Type, e.Code, e.Param, e.Message, tt.code, tt.param)
			}
			if !strings.Contains(e.Message, tt.message) {
				t.Errorf("message %q does not contain %q", e.Message, tt.message)
			}
			if (tt.code == codeInvalidJSON) == json.Valid([]byte(tt.body)) {
				t.Errorf("invalid_json disagrees with json.Valid")
			}
		})
	}
}

func TestDepth(t *testing.T) {
	msg := func(content string) string {
		return `{"model":"m","messages":[{"role":"user","content":` + content + `}]}`
	}
	call := func(args string) string {
		a, _ := json.Marshal(args)
		return `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":` + string(a) + `}}]}]}`
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	tests := []struct {
		name string
		body string
		want int
	}{
		{"no content", msg(`null`), 0},
		{"text", msg(`"hello"`), 1},
		{"empty text", msg(`""`), 1},
		{"text part", msg(`[{"type":"text","text":"hello"}]`), 1},
		{"image part", msg(`[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]`), 1},
		{"audio part", msg(`[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]`), 1},
		{"extra field in a part", msg(`[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]`), 2},
		{"nested payload", msg(`[{"type":"custom","custom":{"a":{"b":{"c":1}}}}]`), 3},
		{"JSON text object", msg(q(`{"a":1}`)), 2},
		{"JSON text with space", msg(q("  \n[[1]] ")), 3},
		{"JSON text escaped brace", msg(`"\u005b[[1]]]"`), 4},
		{"not JSON text", msg(q(`{not json}`)), 1},
		{"JSON text with trailing words", msg(q(`{"a":1} and more`)), 2},
		{"JSON in JSON text", msg(q(`{"a":` + q(`{"b":{"c":1}}`) + `}`)), 4},
		{"JSON in JSON in JSON", msg(q(`[` + q(`[`+q(`[1]`)+`]`) + `]`)), 4},
		{"JSON text in a text part", msg(`[{"type":"text","text":` + q(`{"a":[1,2]}`) + `}]`), 3},
		{"empty object text", msg(q(`{}`)), 1},
		{"flat arguments", call(`{"city":"Paris"}`), 1},
		{"nested arguments", call(`{"q":{"a":1}}`), 2},
		{"deep arguments", call(`{"a":[[[[1]]]]}`), 5},
		{"arguments with JSON text", call(`{"a":` + q(`{"b":1}`) + `}`), 2},
		{"arguments not JSON", call(`city=Paris`), 1},
		{"empty arguments", call(``), 1},
		{"tool result", `{"model":"m","messages":[{"role":"tool","tool_call_id":"1","content":` + q(`{"r":{"s":[1]}}`) + `}]}`, 4},
		{"max over messages", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":` + q(`[[1]]`) + `},{"role":"user","content":"b"}]}`, 3},
		{"completion prompt JSON text", `{"model":"m","prompt":` + q(`{"a":{"b":1}}`) + `}`, 3},
		{"embedding tokens", `{"model":"m","input":[[1,2]]}`, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind := KindChat
			if strings.Contains(tt.body, `"prompt"`) {
				kind = KindCompletion
			} else if strings.Contains(tt.body, `"input"`) {
				kind = KindEmbedding
			}
			r, err := ParseRequest(kind, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if r.Depth != tt.want {
				t.Errorf("Depth = %d, want %d", r.Depth, tt.want)
			}
		})
	}
}

// nest returns JSON nested d deep: objects and arrays in turn, a number at the bottom.
func nest(d int) string {
	if d <= 1 {
		return "1"
	}
	if d%2 == 0 {
		return `{"k":` + nest(d-1) + `}`
	}
	return "[" + nest(d-1) + "]"
}

func TestDepthInText(t *testing.T) {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	msg := func(role, content string) string {
		return `{"model":"m","messages":[{"role":"` + role + `","content":` + q(content) + `}]}`
	}
	call := func(args string) string {
		return `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":` + q(args) + `}}]}]}`
	}
	deep := nest(10)
	tests := []struct {
		name string
		kind Kind
		body string
		want int
	}{
		// The issue: JSON 10 deep counts the same wherever it is in the content.
		{"whole content", KindChat, msg("user", deep), 10},
		{"in prose", KindChat, msg("user", "Process this: "+deep), 10},
		{"in prose, text after", KindChat, msg("user", "Process this: "+deep+" and tell me what it means."), 10},
		{"in a fence", KindChat, msg("user", "Here:\n```json\n"+deep+"\n```\nThanks"), 10},
		{"in a tool result with prose", KindChat, msg("tool", "Result of the query: "+deep), 10},
		{"in a text part", KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":` + q("see "+deep) + `}]}]}`, 10},
		{"in a system prompt", KindChat, msg("system", "Answer in this schema: "+deep), 10},
		{"arguments: whole JSON, an envelope", KindChat, call(deep), 9},
		{"arguments: JSON with text around is not", KindChat, call("use " + deep), 10},
		{"arguments: white space around is", KindChat, call("\n  " + deep + "  \n"), 9},
		{"completion prompt", KindCompletion, `{"model":"m","prompt":` + q("Q: "+deep+"\nA:") + `}`, 10},
		{"embedding input", KindEmbedding, `{"model":"m","input":[` + q("doc "+deep) + `]}`, 10},
		{"responses string input", KindResponses, `{"model":"m","input":` + q("Process this: "+deep) + `}`, 10},
		{"responses instructions", KindResponses, `{"model":"m","input":"x","instructions":` + q("Schema: "+deep) + `}`, 10},
		{"responses tool output", KindResponses, `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":` + q("ok: "+deep) + `}]}`, 10},
		{"responses function call arguments", KindResponses, `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":` + q(deep) + `}]}`, 9},
		{"responses custom tool input", KindResponses, `{"model":"m","input":[{"type":"custom_tool_call","call_id":"c","name":"f","input":` + q("run "+deep) + `}]}`, 10},

		// How the rule reads text.
		{"the deepest of several values", KindChat, msg("user", `a [1] b {"x":[[1]]} c [[[[1]]]] d`), 5},
		{"open at the end: as far as it reached", KindChat, msg("user", "look: [[[[{\"a\":[1"), 7},
		{"broken off: the next value counts", KindChat, msg("user", `[[[x [[1]]`), 3},
		{"the breaking character starts the next value", KindChat, msg("user", `{{{"a":[[1]]}`), 4},
		{"a key is text", KindChat, msg("user", `{"[[[1]]]":1}`), 5},
		{"a string in a value is text", KindChat, msg("user", `{"a":"see [[1]] here"}`), 4},
		{"JSON text in JSON text in prose", KindChat, msg("user", `log: {"body":"{\"x\":[[1]]}"}`), 5},
		{"escaped brackets decode", KindChat, `{"model":"m","messages":[{"role":"user","content":"x \u005b\u005b1]]"}]}`, 3},
		{"not JSON: code", KindChat, msg("user", "if (ok) { f(a[i]) } else { g({x: 1}) }"), 1},
		{"not JSON: a link", KindChat, msg("user", "[a link](https://x) and [[wiki]]"), 2},
		{"strict numbers", KindChat, msg("user", `[[01]] [[1.]] [[-]] [[1e5]]`), 3},
		{"literals", KindChat, msg("user", `[[true]] [[nul]] [[False]]`), 3},
		{"a newline ends a string", KindChat, msg("user", "[\"a\nb\"] [[[1]]]"), 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(tt.kind, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if r.Depth != tt.want {
				t.Errorf("Depth = %d, want %d", r.Depth, tt.want)
			}
		})
	}
}

// TestDepthOrdinaryText: code in several languages, markdown, math, logs and templates count
// only what in them reads as JSON, which is shallow (testdata/depth, with the expected depth
// of each file in want.json).
func TestDepthOrdinaryText(t *testing.T) {
	raw, err := os.ReadFile("testdata/depth/want.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("testdata/depth/*.txt")
	if len(files) < 8 {
		t.Fatalf("%d files", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			w, ok := want[filepath.Base(f)].(float64)
			if !ok {
				t.Fatal("no expected depth in want.json")
			}
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			q, _ := json.Marshal(string(text))
			for _, body := range []string{
				`{"model":"m","messages":[{"role":"user","content":` + string(q) + `}]}`,
				`{"model":"m","messages":[{"role":"tool","tool_call_id":"1","content":[{"type":"text","text":` + string(q) + `}]}]}`,
			} {
				r, err := ParseRequest(KindChat, []byte(body))
				if err != nil {
					t.Fatal(err)
				}
				if r.Depth != int(w) || r.Depth > 5 {
					t.Errorf("Depth = %d, want %d (and at most 5)", r.Depth, int(w))
				}
			}
		})
	}
}

// TestDepthPathological: text built to make a measurement rescan is read once (the
// benchmark BenchmarkParseRequestPathological shows the time is linear) and still measured.
func TestDepthPathological(t *testing.T) {
	const n = 1 << 20
	tests := []struct {
		name string
		text string
		want int
	}{
		{"a megabyte of [", strings.Repeat("[", n), n},
		{"an object key repeated", strings.Repeat(`{"a":`, n/5), n/5 + 1},
		{"brackets that never form JSON", strings.Repeat("[x", n/2), 1},
		{"a broken bomb counts to the break", strings.Repeat("[", n/2) + "x" + strings.Repeat("]", n/2), n / 2},
		{"values one after another", strings.Repeat("[[1]] ", n/6), 3},
		{"unterminated strings", strings.Repeat(`["a`, n/3), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := json.Marshal(tt.text)
			r, err := ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":`+string(q)+`}]}`))
			if err != nil {
				t.Fatal(err)
			}
			if r.Depth != tt.want {
				t.Errorf("Depth = %d, want %d", r.Depth, tt.want)
			}
		})
	}
	// JSON text in JSON strings past the levels followed counts by its brackets.
	s := "[[[1]]]"
	for range textLevels + 2 {
		b, _ := json.Marshal(s)
		s = "[" + string(b) + "]"
	}
	q, _ := json.Marshal(s)
	r, err := ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":`+string(q)+`}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// Ten arrays, one a level, around [[[1]]] (4): 14, the brackets of the levels past the
	// last one followed counting as their arrays would.
	if want := 14; r.Depth != want {
		t.Errorf("strings in strings: Depth = %d, want %d", r.Depth, want)
	}
}

// TestParseDepthAllocs: measuring the depth of content allocates nothing, JSON tool results,
// escapes and fences included: an agent conversation allocates what a prose one does.
func TestParseDepthAllocs(t *testing.T) {
	for _, tokens := range []int{1000, 32000} {
		body := agentBody(tokens)
		if a := testing.AllocsPerRun(20, func() {
			if r, err := ParseRequest(KindChat, body); err != nil || r.Depth != 9 {
				t.Fatal(r, err)
			}
		}); a > 3 {
			t.Errorf("%d tokens: %v allocations", tokens, a)
		}
	}
}

func TestDepthDeepNesting(t *testing.T) {
	// A million levels must not blow the stack: the scanner is iterative.
	const n = 1 << 20
	text := strings.Repeat("[", n) + strings.Repeat("]", n)
	body := `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
	r, err := ParseRequest(KindChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Depth != n {
		t.Errorf("Depth = %d, want %d", r.Depth, n)
	}
	// As structure rather than text it is a legal (if unwise) unknown field.
	body = `{"model":"m","x":` + text + `,"messages":[{"role":"user","content":"x"}]}`
	if _, err := ParseRequest(KindChat, []byte(body)); err != nil {
		t.Fatal(err)
	}
}

func TestReadBody(t *testing.T) {
	body := strings.Repeat("x", 100)
	for _, tt := range []struct {
		name  string
		r     io.Reader
		limit int64
		ok    bool
	}{
		{"under", strings.NewReader(body), 101, true},
		{"at", strings.NewReader(body), 100, true},
		{"over", strings.NewReader(body), 99, false},
		{"over by one byte reads", iotest.OneByteReader(strings.NewReader(body)), 10, false},
		{"no limit", strings.NewReader(body), 0, true},
		{"MaxBytesReader", http.MaxBytesReader(nil, io.NopCloser(strings.NewReader(body)), 50), 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ReadBody(tt.r, tt.limit)
			if tt.ok {
				if err != nil || string(b) != body {
					t.Fatalf("got %d bytes, %v", len(b), err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Status != http.StatusRequestEntityTooLarge || e.Code != "request_too_large" {
				t.Fatalf("got %v, want a 413 request_too_large", err)
			}
			if tt.limit > 0 && !strings.Contains(e.Message, "limit is "+itoa(tt.limit)+" bytes") {
				t.Errorf("message %q does not state the limit", e.Message)
			}
		})
	}
	// It never reads more than limit+1 bytes.
	cr := &countingReader{r: strings.NewReader(strings.Repeat("x", 1<<20))}
	if _, err := ReadBody(cr, 1000); err == nil {
		t.Fatal("no error")
	}
	if cr.n > 1001 {
		t.Errorf("read %d bytes for a limit of 1000", cr.n)
	}
	// Read errors come back as they are.
	if _, err := ReadBody(iotest.ErrReader(io.ErrClosedPipe), 10); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("got %v", err)
	}
}

// TestReadBodySized: a stated length sizes the buffer, whatever the length says: the body
// read is the body sent (a short or long claim included), the limit holds, a claim larger
// than the body makes no buffer beyond sizedBodyMax, and an exact claim is one allocation.
func TestReadBodySized(t *testing.T) {
	body := strings.Repeat("y", 3000)
	for _, tt := range []struct {
		name        string
		size, limit int64
		ok          bool
	}{
		{"exact", 3000, 0, true},
		{"exact at the limit", 3000, 3000, true},
		{"exact over the limit", 3000, 2999, false},
		{"claimed short", 10, 0, true},
		{"claimed short over the limit", 10, 2000, false},
		{"claimed long", 1 << 30, 0, true},
		{"claimed long under the limit", 1 << 30, 4000, true},
		{"claimed zero", 0, 5000, true},
		{"not stated", -1, 5000, true},
		{"not stated over the limit", -1, 100, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(body), iotest.OneByteReader(strings.NewReader(body)), iotest.DataErrReader(strings.NewReader(body))} {
				b, err := ReadBodySized(r, tt.limit, tt.size)
				if tt.ok {
					if err != nil || string(b) != body {
						t.Fatalf("%T: got %d bytes, %v", r, len(b), err)
					}
					if cap(b) > sizedBodyMax+len(body) {
						t.Errorf("%T: a buffer of %d bytes for %d", r, cap(b), len(body))
					}
					continue
				}
				var e *Error
				if !errors.As(err, &e) || e.Status != http.StatusRequestEntityTooLarge {
					t.Fatalf("%T: got %v, want a 413", r, err)
				}
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := ReadBodySized(strings.NewReader(body), 1<<20, int64(len(body))); err != nil {
			t.Fatal(err)
		}
	}); n > 2 { // the buffer, and the strings.Reader
		t.Errorf("%.0f allocations reading a body of stated length, want the buffer alone", n)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestSetModel(t *testing.T) {
	tests := []struct {
		name, body, model, want string
	}{
		{"present", `{"model":"a","x":1}`, "b", `{"model":"b","x":1}`},
		{"keeps white space", "{ \"model\" :\t\"a\" ,\n \"x\" : [1, 2] }", "bb", "{ \"model\" :\t\"bb\" ,\n \"x\" : [1, 2] }"},
		{"last key", `{"x":{"model":"n"},"model":"a"}`, "b", `{"x":{"model":"n"},"model":"b"}`},
		{"nested keys untouched", `{"messages":[{"model":"keep","content":"\"model\":\"keep\""}],"model":"a","meta":{"model":"keep"}}`, "b",
			`{"messages":[{"model":"keep","content":"\"model\":\"keep\""}],"model":"b","meta":{"model":"keep"}}`},
		{"escaped key", `{"mod\u0065l":"a"}`, "b", `{"mod\u0065l":"b"}`},
		{"escaped value", `{"model":"a\"\u00e9","x":"y"}`, "b", `{"model":"b","x":"y"}`},
		{"non-string value", `{"model":null}`, "b", `{"model":"b"}`},
		{"every duplicate", `{"model":"a","model":"c"}`, "b", `{"model":"b","model":"b"}`},
		{"absent", `{"x":1}`, "b", `{"model":"b","x":1}`},
		{"absent empty", `{}`, "b", `{"model":"b"}`},
		{"absent empty with space", ` { } `, "b", ` {"model":"b" } `},
		{"value needing escapes", `{"model":"a"}`, "q\"\\\n\u2028<", `{"model":"q\"\\\n\u2028<"}`},
		{"similar keys", `{"models":"x","Model":"y","model ":"z"}`, "b", `{"model":"b","models":"x","Model":"y","model ":"z"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.body)
			orig := bytes.Clone(in)
			got, err := SetModel(in, tt.model)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
			if !bytes.Equal(in, orig) {
				t.Errorf("input modified")
			}
			var v map[string]any
			if err := json.Unmarshal(got, &v); err != nil {
				t.Fatalf("result is not JSON: %v", err)
			}
			if v["model"] != tt.model {
				t.Errorf("model = %q", v["model"])
			}
		})
	}
	for _, bad := range []string{``, `[]`, `{"model":}`, `{"model":"a"} x`, `"model"`} {
		if _, err := SetModel([]byte(bad), "b"); err == nil {
			t.Errorf("%q: no error", bad)
		} else if e := (*Error)(nil); !errors.As(err, &e) || e.Code != codeInvalidJSON {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestKind(t *testing.T) {
	tests := []struct {
		method, path string
		want         Kind
		op           string
	}{
		{"POST", "/v1/chat/completions", KindChat, "chat"},
		{"POST", "/v1/completions", KindCompletion, "text_completion"},
		{"POST", "/v1/embeddings", KindEmbedding, "embeddings"},
		{"GET", "/v1/models", KindModels, ""},
		{"GET", "/v1/models/meta-llama/Llama-3.1-8B", KindModels, ""},
		{"GET", "/v1/models/", KindOther, ""},
		{"GET", "/v1/chat/completions", KindOther, ""},
		{"POST", "/v1/models", KindOther, ""},
		{"POST", "/v1/chat/completions/", KindOther, ""},
		{"POST", "/v2/chat/completions", KindOther, ""},
		{"POST", "/v1/responses", KindResponses, "chat"},
		{"GET", "/v1/responses", KindOther, ""},
		{"GET", "/v1/responses/resp_1", KindOther, ""},
		{"POST", "/v1/responses/resp_1/cancel", KindOther, ""},
		{"POST", "/v1/responses/", KindOther, ""},
	}
	for _, tt := range tests {
		k := KindOf(tt.method, tt.path)
		if k != tt.want || k.Operation() != tt.op {
			t.Errorf("%s %s: %v %q, want %v %q", tt.method, tt.path, k, k.Operation(), tt.want, tt.op)
		}
	}
	if KindChat.String() != "chat" || Kind(99).String() != "other" || KindResponses.String() != "responses" {
		t.Error("String")
	}
	// New kinds come last: the existing ones keep their numbers.
	if KindOther != 0 || KindChat != 1 || KindCompletion != 2 || KindEmbedding != 3 || KindModels != 4 || KindResponses != 5 {
		t.Error("Kind values changed")
	}
}

func TestError(t *testing.T) {
	e := NewError(http.StatusTooManyRequests, "rate_limit_error", "rate_limited", "Slow \"down\"\n")
	e.RetryAfter = 1500 * time.Millisecond
	var body struct {
		Error struct {
			Message, Type string
			Param, Code   *string
		}
	}
	if err := json.Unmarshal(e.Body(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Error.Message != e.Message || body.Error.Type != e.Type || body.Error.Param != nil || *body.Error.Code != e.Code {
		t.Errorf("body %s", e.Body())
	}
	if want := `{"error":{"message":"Slow \"down\"\n","type":"rate_limit_error","param":null,"code":"rate_limited"}}`; string(e.Body()) != want {
		t.Errorf("body\n%s\nwant\n%s", e.Body(), want)
	}
	if got := e.Error(); got != "429 rate_limited: Slow \"down\"\n" {
		t.Errorf("Error() = %q", got)
	}

	rec := httptest.NewRecorder()
	WriteError(rec, e)
	if rec.Code != 429 || rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("Retry-After") != "2" {
		t.Errorf("status %d headers %v", rec.Code, rec.Header())
	}
	if !bytes.Equal(rec.Body.Bytes(), e.Body()) {
		t.Errorf("body %s", rec.Body.Bytes())
	}
	rec = httptest.NewRecorder()
	WriteError(rec, &Error{Message: "x", Param: "p"})
	if rec.Code != 500 || rec.Header().Get("Retry-After") != "" || !strings.Contains(rec.Body.String(), `"param":"p"`) {
		t.Errorf("status %d headers %v body %s", rec.Code, rec.Header(), rec.Body)
	}

	// The SSE form is one event whose data is the same body.
	rd := NewReader(bytes.NewReader(e.SSE()), 0)
	ev, err := rd.Next()
	if err != nil || string(ev.Name) != "error" || !bytes.Equal(ev.Data, e.Body()) || !bytes.Equal(ev.Raw, e.SSE()) {
		t.Errorf("SSE %q: %+v %v", e.SSE(), ev, err)
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Errorf("after the event: %v", err)
	}
	var tap Tap
	tap.Observe(ev, time.Now())
	if !tap.ErrorSeen {
		t.Error("Tap did not see the error")
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "q\"b\\s/", "\x00\x01\x1f\x7f", "é😀", "bad\xffutf8\xc3", "\u2028\u2029", "<&>"} {
		got := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%q: %s is not JSON: %v", s, got, err)
		}
		want := strings.ToValidUTF8(s, "\ufffd")
		if back != want {
			t.Errorf("%q: round trip gave %q", s, back)
		}
	}
}

func TestEstimateTokens(t *testing.T) {
	for _, tt := range []struct{ chars, want int }{{0, 0}, {-1, 0}, {1, 1}, {4, 1}, {5, 2}, {400, 100}} {
		if got := EstimateTokens(tt.chars); got != tt.want {
			t.Errorf("EstimateTokens(%d) = %d, want %d", tt.chars, got, tt.want)
		}
	}
	for _, tt := range []struct {
		text string
		want int
	}{
		{"", 0},
		{"abcd", 1},
		{"Hello, world.", 4},   // 11 letters/spaces (22) + 2 punctuation (10) = 32/8
		{"12345", 2},           // 15/8
		{"你好世界", 4},            // a token a character
		{"Привет", 3},          // half a token a character
		{"😀😀", 4},              // two tokens each
		{"if (x != nil) {", 6}, // code counts punctuation
	} {
		if got := EstimateTextTokens([]byte(tt.text)); got != tt.want {
			t.Errorf("EstimateTextTokens(%q) = %d, want %d", tt.text, got, tt.want)
		}
	}
}

func TestScanMatchesEncodingJSON(t *testing.T) {
	cases := []string{
		`0`, `-0`, `-`, `01`, `1.`, `1.5`, `.5`, `1e`, `1e+`, `1E+2`, `1e-2`, `-1.5e10`, `2.`, `+1`, `0x10`, `1_000`,
		`""`, `"\""`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\u00E9"`, `"\u00e"`, `"\uD83D\uDE00"`, `"\ud800"`, `"\x"`, `"\'"`,
		"\"\x01\"", "\"\x7f\"", "\"\xff\"", `"abc`, `"`,
		`true`, `false`, `null`, `tru`, `nul`, `True`, `NaN`, `Infinity`,
		`[]`, `[1,]`, `[,1]`, `[1 2]`, `[[[]]]`, `[`, `]`, `{}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{1:2}`, `{"a":1 "b":2}`,
		`{"a":[{"b":null}]}`, " \t\r\n[ 1 , 2 ] \t\r\n", "\v[]", "[]\f", `[] []`, `{} x`, ``, ` `,
	}
	for _, c := range cases {
		end, _, msg := scanValue([]byte(c), 0, nil)
		ok := msg == "" && skipSpace([]byte(c), end) == len(c)
		if ok != json.Valid([]byte(c)) {
			t.Errorf("%q: scanner says %v (%s), encoding/json %v", c, ok, msg, !ok)
		}
		body := []byte(`{"model":"m","x":` + c + `,"messages":[{"role":"user","content":"x"}]}`)
		_, err := ParseRequest(KindChat, body)
		var e *Error
		if isJSON := !(errors.As(err, &e) && e.Code == codeInvalidJSON); isJSON != json.Valid(body) {
			t.Errorf("%q as a field: ParseRequest %v, encoding/json %v", c, err, json.Valid(body))
		}
	}
}

func TestParseRequestAllocs(t *testing.T) {
	// The request and the temperature, whatever the prompt's size: the model's string was
	// made by an earlier request naming it (modelName).
	for _, tokens := range []int{100, 32000} {
		body := chatBody(tokens)
		if a := testing.AllocsPerRun(20, func() {
			if _, err := ParseRequest(KindChat, body); err != nil {
				t.Fatal(err)
			}
		}); a > 2 {
			t.Errorf("%d tokens: %v allocations", tokens, a)
		}
	}
}

// TestModelName: a model name is the bytes' string, made once for a name requests repeat,
// whatever other names meet it in its slot; long names are not kept.
func TestModelName(t *testing.T) {
	names := []string{"sim-llama", "meta-llama/Llama-3.1-8B-Instruct", "gpt-4o", "m", "Qwen/Qwen2.5-7B", "x\u00e9"}
	for i := range 40 {
		names = append(names, fmt.Sprintf("model-%d", i))
	}
	for round := range 3 {
		for _, n := range names {
			if got := modelName([]byte(n)); got != n {
				t.Fatalf("round %d: modelName(%q) = %q", round, n, got)
			}
		}
	}
	b := []byte("sim-llama")
	modelName(b)
	if a := testing.AllocsPerRun(50, func() { _ = modelName(b) }); a != 0 {
		t.Errorf("a repeated name: %v allocations", a)
	}
	// The bytes are the caller's (the request body): the string must not alias them.
	s := modelName(b)
	b[0] = 'X'
	if s != "sim-llama" {
		t.Errorf("the name changed with its bytes: %q", s)
	}
	long := bytes.Repeat([]byte("a"), modelNameMax+1)
	if got := modelName(long); got != string(long) {
		t.Errorf("a long name: %q", got)
	}
	for i := range modelNames {
		if p := modelNames[i].Load(); p != nil && len(*p) > modelNameMax {
			t.Errorf("a slot holds a %d-byte name", len(*p))
		}
	}
	if got := modelName(nil); got != "" {
		t.Errorf("no bytes: %q", got)
	}
}

// TestParseResponsesSizes: a Responses request counts the text the model sees as chat does
// (instructions, message text, function names and arguments, tool outputs, reasoning
// summaries, the tool declarations' JSON) and its overhead per item, plus the instructions.
func TestParseResponsesSizes(t *testing.T) {
	tools := `[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]`
	body := `{"model":"m","input":[
		{"role":"user","content":"Weather in Paris?"},
		{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call_output","call_id":"c1","output":"{\"temp\":21}"},
		{"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"Think"}],"content":[{"type":"reasoning_text","text":"hmm"}]},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sunny."},{"type":"refusal","refusal":"No."},{"type":"input_file","file_data":"QUFBQQ=="}]}],
		"tools":` + tools + `,"instructions":"Be brief."}`
	r, err := ParseRequest(KindResponses, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	text := "Be brief." + "Weather in Paris?" + "get_weather" + `{"city":"Paris"}` + `{"temp":21}` + "Think" + "hmm" + "Sunny." + "No." + tools
	if r.PromptChars != len(text) {
		t.Errorf("PromptChars = %d, want %d", r.PromptChars, len(text))
	}
	if want := EstimateTextTokens([]byte(text)) + 4*(5+1) + 3; r.PromptTokens != want {
		t.Errorf("PromptTokens = %d, want %d", r.PromptTokens, want)
	}
	if r.Messages != 5 || r.Tools != 1 || r.Depth != 2 {
		t.Errorf("Messages %d Tools %d Depth %d", r.Messages, r.Tools, r.Depth)
	}
	// The same conversation as chat counts the same text (the tool declaration aside,
	// which is spelt differently) and the same overhead.
	chat := `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"{\"temp\":21}"}]}`
	rsp := `{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":"Weather in Paris?"},
		{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call_output","call_id":"c1","output":"{\"temp\":21}"}]}`
	rc, err1 := ParseRequest(KindChat, []byte(chat))
	rr, err2 := ParseRequest(KindResponses, []byte(rsp))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if rc.PromptChars != rr.PromptChars || rc.PromptTokens != rr.PromptTokens || rc.Depth != rr.Depth {
		t.Errorf("chat %d chars %d tokens depth %d; responses %d %d %d", rc.PromptChars, rc.PromptTokens, rc.Depth,
			rr.PromptChars, rr.PromptTokens, rr.Depth)
	}
}

func TestDepthResponses(t *testing.T) {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	item := func(s string) string { return `{"model":"m","input":[` + s + `]}` }
	tests := []struct {
		name string
		body string
		want int
	}{
		{"string input", `{"model":"m","input":"hello"}`, 1},
		{"string input that is JSON", `{"model":"m","input":` + q(`{"a":{"b":1}}`) + `}`, 3},
		{"no content", item(`{"role":"user","content":null}`), 0},
		{"text parts", item(`{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"https://x","detail":"low"}]}`), 1},
		{"JSON text in a part", item(`{"role":"user","content":[{"type":"input_text","text":` + q(`[[1]]`) + `}]}`), 3},
		{"extra field in a part", item(`{"role":"assistant","content":[{"type":"output_text","text":"x","annotations":[{"type":"url_citation","url":"u"}]}]}`), 3},
		{"flat arguments", item(`{"type":"function_call","call_id":"c","name":"f","arguments":` + q(`{"city":"Paris"}`) + `}`), 1},
		{"nested arguments", item(`{"type":"function_call","call_id":"c","name":"f","arguments":` + q(`{"q":{"a":[1]}}`) + `}`), 3},
		{"arguments not JSON", item(`{"type":"function_call","call_id":"c","name":"f","arguments":"x=1"}`), 1},
		{"tool output JSON", item(`{"type":"function_call_output","call_id":"c","output":` + q(`{"r":{"s":[1]}}`) + `}`), 4},
		{"tool output text", item(`{"type":"function_call_output","call_id":"c","output":"done"}`), 1},
		{"tool output parts", item(`{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":` + q(`{"a":{"b":1}}`) + `}]}`), 3},
		{"instructions JSON", `{"model":"m","input":"x","instructions":` + q(`[[[1]]]`) + `}`, 4},
		{"max over items", item(`{"role":"user","content":"a"},{"role":"user","content":` + q(`[[1]]`) + `},{"role":"user","content":"b"}`), 3},
		{"unknown items do not count", item(`{"type":"local_shell_call","call_id":"c","action":{"type":"exec","command":["ls"],"env":{"a":{"b":"c"}}}}`), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(KindResponses, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if r.Depth != tt.want {
				t.Errorf("Depth = %d, want %d", r.Depth, tt.want)
			}
		})
	}
	// Deep nesting as text does not blow the stack.
	const n = 1 << 18
	text := strings.Repeat("[", n) + strings.Repeat("]", n)
	r, err := ParseRequest(KindResponses, []byte(item(`{"type":"function_call_output","call_id":"c","output":"`+text+`"}`)))
	if err != nil || r.Depth != n {
		t.Fatalf("Depth %v, %v", r, err)
	}
}

func TestParseResponsesAllocs(t *testing.T) {
	// The request, the model string and the temperature, whatever the input's size; the
	// known text formats are not copied.
	for _, tokens := range []int{100, 32000} {
		body := responsesBody(tokens)
		if a := testing.AllocsPerRun(20, func() {
			if r, err := ParseRequest(KindResponses, body); err != nil || r.ResponseFormat != "json_object" {
				t.Fatal(err)
			}
		}); a > 3 {
			t.Errorf("%d tokens: %v allocations", tokens, a)
		}
	}
}

// responsesBody is chatBody's conversation as a Responses request.
func responsesBody(tokens int) []byte {
	var chat struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(chatBody(tokens), &chat)
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type item struct {
		Role    string `json:"role"`
		Content []part `json:"content"`
	}
	var input []item
	for _, m := range chat.Messages[1:] {
		typ := "input_text"
		if m.Role == "assistant" {
			typ = "output_text"
		}
		input = append(input, item{m.Role, []part{{typ, m.Content}}})
	}
	body, _ := json.Marshal(map[string]any{
		"model":             "meta-llama/Llama-3.1-8B-Instruct",
		"stream":            true,
		"max_output_tokens": 512,
		"temperature":       0.7,
		"instructions":      chat.Messages[0].Content,
		"input":             input,
		"text":              map[string]any{"format": map[string]any{"type": "json_object"}},
	})
	return body
}

func TestErrorResponsesSSE(t *testing.T) {
	type object struct {
		Message, Type string
		Param, Code   *string
	}
	type event struct {
		Type           string
		Code           *string
		Message        string
		Param          *string
		SequenceNumber *int `json:"sequence_number"`
		Error          *object
	}
	str := func(p *string) string {
		if p == nil {
			return "<null>"
		}
		return *p
	}
	for _, tt := range []struct {
		name              string
		e                 *Error
		seq, wantSeq      int
		code, param       string // top level
		innerCode, inType string
	}{
		{"full", &Error{Status: 502, Type: "server_error", Code: "stream_cut", Param: "input[0]", Message: "The stream \"broke\"\n"},
			17, 17, "stream_cut", "input[0]", "stream_cut", "server_error"},
		{"no code: the type stands in at the top level", NewError(500, "server_error", "", "boom"), 0, 0, "server_error", "<null>", "<null>", "server_error"},
		{"nothing but a message", &Error{Message: "x"}, -3, 0, "server_error", "<null>", "<null>", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			raw := tt.e.ResponsesSSE(tt.seq)
			rd := NewReader(bytes.NewReader(raw), 0)
			ev, err := rd.Next()
			if err != nil || string(ev.Name) != "error" || !bytes.Equal(ev.Raw, raw) || !bytes.HasSuffix(raw, []byte("}\n\n")) {
				t.Fatalf("event %q: %+v %v", raw, ev, err)
			}
			if _, err := rd.Next(); err != io.EOF {
				t.Errorf("after the event: %v", err)
			}
			var got event
			if err := json.Unmarshal(ev.Data, &got); err != nil {
				t.Fatalf("data %s: %v", ev.Data, err)
			}
			if got.Type != "error" || got.Code == nil || *got.Code != tt.code || got.Message != tt.e.Message ||
				str(got.Param) != tt.param || got.SequenceNumber == nil || *got.SequenceNumber != tt.wantSeq {
				t.Errorf("top level %s", ev.Data)
			}
			// The "error" object is Body's, so that clients keying on it see the same error.
			if got.Error == nil || got.Error.Message != tt.e.Message || got.Error.Type != tt.inType ||
				str(got.Error.Code) != tt.innerCode || str(got.Error.Param) != str(got.Param) {
				t.Errorf("error object %s", ev.Data)
			}
			var inner, body struct{ Error json.RawMessage }
			_ = json.Unmarshal(ev.Data, &inner)
			_ = json.Unmarshal(tt.e.Body(), &body)
			if !bytes.Equal(inner.Error, body.Error) {
				t.Errorf("error object %s, Body's %s", inner.Error, body.Error)
			}
			var tap Tap
			tap.Seq = 5
			tap.Observe(ev, time.Now())
			if !tap.ErrorSeen || tap.Done || tap.Seq != max(5, tt.wantSeq+1) {
				t.Errorf("Tap: %+v", tap)
			}
		})
	}
}

// TestUnicodeFoldedKeysRefused: encoding/json matches keys to fields with Unicode case
// folding, under which the Kelvin sign K (U+212A) is a k and the long s ſ (U+017F) an s:
// a Go model server reads "max_to\u212aens" as max_tokens. Such a key differs from a
// measured one only by case and is refused, escaped or not, at the top level and in a message.
func TestUnicodeFoldedKeysRefused(t *testing.T) {
	tests := []struct {
		name  string
		kind  Kind
		body  string
		param string
	}{
		{"escaped Kelvin sign", KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_to\u212aens":100000}`, "max_to\u212aens"},
		{"raw Kelvin sign", KindChat, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_to\u212aens\":100000}", "max_to\u212aens"},
		{"escaped long s", KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"me\u017f\u017fages":[{"role":"user","content":"huge"}]}`, "me\u017f\u017fages"},
		{"raw long s", KindResponses, "{\"model\":\"m\",\"input\":\"x\",\"in\u017ftructions\":\"huge\"}", "in\u017ftructions"},
		{"long s in max_completion_tokens", KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_to\u212aen\u017f":9}`, "max_completion_to\u212aen\u017f"},
		{"message content", KindChat, `{"model":"m","messages":[{"role":"user","content":"x","content\u017f":1,"tool_call\u017f":[]}]}`, "messages[0].tool_call\u017f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The premise: Go's decoder reads the key as the measured field.
			var probe map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tt.body), &probe); err != nil {
				t.Fatal(err)
			}
			r, err := ParseRequest(tt.kind, []byte(tt.body))
			if err == nil {
				t.Fatalf("accepted: max_tokens %d, %d messages", r.MaxTokens, r.Messages)
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != codeInvalidValue || !strings.Contains(e.Message, "only by case") {
				t.Fatalf("got %v, want 400 invalid_value (only by case)", err)
			}
			if tt.name != "message content" && e.Param != tt.param {
				t.Errorf("param %q, want %q", e.Param, tt.param)
			}
		})
	}
	// encoding/json really does read them so.
	var v struct {
		MaxTokens int `json:"max_tokens"`
	}
	if err := json.Unmarshal([]byte(`{"max_to\u212aens":100000}`), &v); err != nil || v.MaxTokens != 100000 {
		t.Fatalf("premise: encoding/json read max_tokens %d (%v)", v.MaxTokens, err)
	}
}

// TestFoldEqual: foldEqual agrees with bytes.EqualFold (encoding/json's matching, for a lower
// case ASCII field name) on keys of every length around the name's, ASCII or not.
func TestFoldEqual(t *testing.T) {
	names := []string{"model", "max_tokens", "n", "stream", "messages", "s", "k"}
	keys := []string{"", "model", "MODEL", "Model", "mode", "models", "max_tokens", "MAX_TOKENS", "max_to\u212aens",
		"max_to\u212aen", "\u017ftream", "\u017fTREAM", "stream\u017f", "n", "N", "\u017f", "\u212a", "K", "k", "é", "modél",
		"max_tokenſ", "messageſ", "mess\u00e4ges", "\xff\xfe", "s\xff"}
	for _, name := range names {
		for _, k := range keys {
			if got, want := foldEqual([]byte(k), name, !ascii([]byte(k))), bytes.EqualFold([]byte(k), []byte(name)); got != want {
				t.Errorf("foldEqual(%q, %q) = %v, bytes.EqualFold says %v", k, name, got, want)
			}
		}
	}
}
