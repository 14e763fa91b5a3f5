package shadow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

var weatherTool = Tool{Name: "get_weather", Parameters: json.RawMessage(`{
	"type": "object",
	"properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
	"required": ["city"]
}`)}

var timeTool = Tool{Name: "get_time", Parameters: json.RawMessage(`{"type":"object","properties":{"tz":{"type":"string"}}}`)}

const personSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}`

func ans(text string, calls ...ToolCall) Answer {
	fr := "stop"
	if len(calls) > 0 {
		fr = "tool_calls"
	}
	return Answer{Status: 200, TTFT: 100 * time.Millisecond, ITL: 20 * time.Millisecond, E2E: time.Second,
		OutputTokens: 40, FinishReason: fr, Text: text, ToolCalls: calls}
}

func TestCompare(t *testing.T) {
	tools := []Tool{weatherTool, timeTool}
	good := ToolCall{Name: "get_weather", Arguments: `{"city":"Oslo","unit":"c"}`}
	tests := []struct {
		name       string
		req        Request
		p, c       Answer
		simOne     bool
		pSchema    [2]bool // checked, broken
		cSchema    [2]bool
		pTool      [2]bool
		cTool      [2]bool
		namesMatch bool
	}{
		{name: "identical text", req: Request{}, p: ans("the quick brown fox"), c: ans("the quick brown fox"),
			simOne: true, namesMatch: true},
		{name: "identical tool calls", req: Request{Tools: tools}, p: ans("", good), c: ans("", good),
			simOne: true, pTool: [2]bool{true, false}, cTool: [2]bool{true, false}, namesMatch: true},
		{name: "dropped required argument", req: Request{Tools: tools}, p: ans("", good),
			c:     ans("", ToolCall{Name: "get_weather", Arguments: `{"unit":"c"}`}),
			pTool: [2]bool{true, false}, cTool: [2]bool{true, true}, namesMatch: true},
		// Another declared function is a choice, not a breakage (judged by similarity).
		{name: "other declared function", req: Request{Tools: tools}, p: ans("", good),
			c:     ans("", ToolCall{Name: "get_time", Arguments: `{}`}),
			pTool: [2]bool{true, false}, cTool: [2]bool{true, false}},
		{name: "undeclared function", req: Request{Tools: tools}, p: ans("", good),
			c:     ans("", ToolCall{Name: "get_wether", Arguments: `{"city":"Oslo"}`}),
			pTool: [2]bool{true, false}, cTool: [2]bool{true, true}},
		{name: "tool calls announced but dropped", req: Request{Tools: tools}, p: ans("", good),
			c:     Answer{Status: 200, FinishReason: "tool_calls", Text: ""},
			pTool: [2]bool{true, false}, cTool: [2]bool{true, true}},
		{name: "answered in text (auto)", req: Request{Tools: tools}, p: ans("", good), c: ans("It is sunny."),
			pTool: [2]bool{true, false}, cTool: [2]bool{true, false}},
		{name: "required call not made", req: Request{Tools: tools, ToolChoice: "required"}, p: ans("", good), c: ans("It is sunny."),
			pTool: [2]bool{true, false}, cTool: [2]bool{true, true}},
		{name: "truncated answers not checked", req: Request{Tools: tools}, p: ans("", good),
			c:     Answer{Status: 200, FinishReason: "", Text: "", ToolCalls: []ToolCall{{Name: "get_weather", Arguments: `{"ci`}}, Truncated: true},
			pTool: [2]bool{true, false}, cTool: [2]bool{false, false}, namesMatch: true},
		{name: "arguments not JSON", req: Request{Tools: tools}, p: ans("", good),
			c:     ans("", ToolCall{Name: "get_weather", Arguments: `{"city":"Oslo"`}),
			pTool: [2]bool{true, false}, cTool: [2]bool{true, true}, namesMatch: true},
		{name: "order-insensitive names", req: Request{Tools: tools},
			p:     ans("", good, ToolCall{Name: "get_time", Arguments: ``}),
			c:     ans("", ToolCall{Name: "get_time", Arguments: `{"tz":"UTC"}`}, good),
			pTool: [2]bool{true, false}, cTool: [2]bool{true, false}, namesMatch: true},
		{name: "schema conforms", req: Request{ResponseFormat: FormatJSONSchema, Schema: json.RawMessage(personSchema)},
			p: ans(`{"name":"Ada","age":36}`), c: ans(`{"name":"Ada","age":36}`), simOne: true,
			pSchema: [2]bool{true, false}, cSchema: [2]bool{true, false}, namesMatch: true},
		{name: "schema missing required field (OpenAI wrapper)",
			req: Request{ResponseFormat: FormatJSONSchema, Schema: json.RawMessage(`{"name":"person","strict":true,"schema":` + personSchema + `}`)},
			p:   ans(`{"name":"Ada","age":36}`), c: ans(`{"name":"Ada"}`),
			pSchema: [2]bool{true, false}, cSchema: [2]bool{true, true}, namesMatch: true},
		{name: "json_object invalid", req: Request{ResponseFormat: FormatJSONObject},
			p: ans(`{"a":1}`), c: ans(`{"a":1,}`),
			pSchema: [2]bool{true, false}, cSchema: [2]bool{true, true}, namesMatch: true},
		{name: "json_object not an object", req: Request{ResponseFormat: FormatJSONObject},
			p: ans(`{"a":1}`), c: ans(`[1]`),
			pSchema: [2]bool{true, false}, cSchema: [2]bool{true, true}, namesMatch: true},
		{name: "text format not checked", req: Request{ResponseFormat: FormatText},
			p: ans(`{"a":1}`), c: ans(`not json`), namesMatch: true},
		{name: "errored candidate not checked", req: Request{ResponseFormat: FormatJSONObject, Tools: tools},
			p: ans(`{"a":1}`), c: Answer{Status: 503, ErrorClass: "upstream_5xx"},
			pSchema: [2]bool{true, false}, pTool: [2]bool{true, false}, namesMatch: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Compare(tt.req, tt.p, tt.c)
			if tt.simOne && r.Similarity != 1 {
				t.Errorf("similarity = %v, want 1", r.Similarity)
			}
			check := func(what string, got, want [2]bool) {
				if got != want {
					t.Errorf("%s checked/broken = %v, want %v (problems p=%q c=%q notes=%q)",
						what, got, want, r.Primary.Problems, r.Candidate.Problems, r.Notes)
				}
			}
			check("primary schema", [2]bool{r.Primary.SchemaChecked, r.Primary.SchemaBroken}, tt.pSchema)
			check("candidate schema", [2]bool{r.Candidate.SchemaChecked, r.Candidate.SchemaBroken}, tt.cSchema)
			check("primary tool", [2]bool{r.Primary.ToolCallChecked, r.Primary.ToolCallBroken}, tt.pTool)
			check("candidate tool", [2]bool{r.Candidate.ToolCallChecked, r.Candidate.ToolCallBroken}, tt.cTool)
			if r.ToolNamesMatch != tt.namesMatch {
				t.Errorf("ToolNamesMatch = %v, want %v", r.ToolNamesMatch, tt.namesMatch)
			}
			if len(r.Notes) > 0 {
				t.Errorf("unexpected notes %q", r.Notes)
			}
		})
	}
}

func TestCompareDeltas(t *testing.T) {
	p, c := ans("a b c d"), ans("a b x d")
	c.Status, c.TTFT, c.E2E, c.OutputTokens, c.FinishReason = 200, 150*time.Millisecond, 2*time.Second, 50, "length"
	r := Compare(Request{}, p, c)
	if !r.StatusMatch || !r.ErrorClassMatch || r.FinishMatch {
		t.Errorf("matches = %v %v %v", r.StatusMatch, r.ErrorClassMatch, r.FinishMatch)
	}
	if r.TTFTDelta != 50*time.Millisecond || r.E2EDelta != time.Second || r.ITLDelta != 0 || r.TokenDelta != 10 {
		t.Errorf("deltas = %v %v %v %v", r.TTFTDelta, r.E2EDelta, r.ITLDelta, r.TokenDelta)
	}
	if want := RougeL("a b x d", "a b c d"); r.Similarity != want || !r.SimilarityValid {
		t.Errorf("similarity = %v, want %v", r.Similarity, want)
	}
	if !r.Candidate.AbnormalFinish || r.Primary.AbnormalFinish {
		t.Errorf("abnormal finish p=%v c=%v", r.Primary.AbnormalFinish, r.Candidate.AbnormalFinish)
	}
}

func TestCompareBadSchemaIsNote(t *testing.T) {
	r := Compare(Request{ResponseFormat: FormatJSONSchema, Schema: json.RawMessage(`{"type": 5}`)}, ans(`{}`), ans(`{}`))
	if r.Candidate.SchemaChecked || len(r.Notes) != 1 {
		t.Errorf("checked=%v notes=%q", r.Candidate.SchemaChecked, r.Notes)
	}
}

func TestSchemaCacheBounded(t *testing.T) {
	c := NewSchemaCache(3)
	for i := 0; i < 10; i++ {
		for range 2 {
			if _, err := c.Get(json.RawMessage(fmt.Sprintf(`{"maxLength": %d}`, i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if c.Len() != 3 {
		t.Errorf("len = %d, want 3", c.Len())
	}
	a, _ := c.Get(json.RawMessage(`{"maxLength": 9}`))
	b, _ := c.Get(json.RawMessage(`{"maxLength": 9}`))
	if a != b {
		t.Error("schema compiled twice")
	}
}

// A vLLM-style stream: role chunk, tool call name then argument fragments
// for two calls, finish_reason, usage chunk, [DONE].
const vllmStream = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-a","type":"function","index":0,"function":{"name":"get_weather"}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Oslo\"}"}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-b","type":"function","index":1,"function":{"name":"get_time","arguments":""}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"tz\": \"CET\"}"}}]},"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":""},"finish_reason":"tool_calls","stop_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":120,"total_tokens":151,"completion_tokens":31}}

data: [DONE]

`

func TestAnswerFromSSE(t *testing.T) {
	for _, nl := range []string{"\n", "\r\n"} {
		a, err := AnswerFromSSE([]byte(strings.ReplaceAll(vllmStream, "\n", nl)))
		if err != nil {
			t.Fatal(err)
		}
		want := []ToolCall{{"get_weather", `{"city": "Oslo"}`}, {"get_time", `{"tz": "CET"}`}}
		if fmt.Sprint(a.ToolCalls) != fmt.Sprint(want) || a.FinishReason != "tool_calls" || a.OutputTokens != 31 || a.Text != "" {
			t.Errorf("got %+v", a)
		}
		r := Compare(Request{Tools: []Tool{weatherTool, timeTool}}, a, a)
		if r.Candidate.ToolCallBroken || !r.Candidate.ToolCallChecked {
			t.Errorf("assembled calls broken: %q", r.Candidate.Problems)
		}
	}
	text := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n" +
		"data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n" +
		": keep-alive\n\ndata: [DONE]\n\n"
	a, err := AnswerFromSSE([]byte(text))
	if err != nil || a.Text != "Hello" || a.FinishReason != "stop" {
		t.Errorf("got %+v, %v", a, err)
	}
	a, err = AnswerFromSSE([]byte("data: {\"error\":{\"message\":\"boom\"}}\n\n"))
	if err != nil || a.ErrorClass != "stream_error" || a.OK() {
		t.Errorf("error event: %+v, %v", a, err)
	}
	if _, err := AnswerFromSSE([]byte("data: {oops\n\n")); err == nil {
		t.Error("bad event accepted")
	}
}

func TestAnswerFromChat(t *testing.T) {
	body := `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"completion_tokens":12}}`
	a, err := AnswerFromChat([]byte(body))
	if err != nil || len(a.ToolCalls) != 1 || a.ToolCalls[0].Name != "get_weather" || a.ToolCalls[0].Arguments != `{"city":"Oslo"}` ||
		a.FinishReason != "tool_calls" || a.OutputTokens != 12 {
		t.Errorf("got %+v, %v", a, err)
	}
	a, err = AnswerFromChat([]byte(`{"choices":[{"index":0,"message":{"content":"hi"},"finish_reason":"stop"}]}`))
	if err != nil || a.Text != "hi" {
		t.Errorf("got %+v, %v", a, err)
	}
	if a, err = AnswerFromChat([]byte(`{"error":{"message":"x"}}`)); err != nil || a.OK() {
		t.Errorf("error body: %+v, %v", a, err)
	}
	if _, err := AnswerFromChat([]byte(`nope`)); err == nil {
		t.Error("bad body accepted")
	}
}

// jitter returns an answer whose latencies vary with i, the same for both
// arms of identical pairs.
func jitter(a Answer, i int) Answer {
	d := time.Duration(i%17) * time.Millisecond
	a.TTFT += d
	a.ITL += d / 4
	a.E2E += 3 * d
	return a
}

func TestAccumulatorVerdict(t *testing.T) {
	tools := []Tool{weatherTool}
	good := ToolCall{Name: "get_weather", Arguments: `{"city":"Oslo"}`}
	t.Run("broken tool calls roll back", func(t *testing.T) {
		acc := NewAccumulator(0)
		for i := range 100 {
			p := jitter(ans("", good), i)
			c := jitter(ans("", ToolCall{Name: "get_weather", Arguments: `{}`}), i)
			acc.Add(Compare(Request{Tools: tools}, p, c))
		}
		in := acc.Input()
		if in.Candidate.ToolCallBroken != 100 || in.Primary.ToolCallBroken != 0 || in.Candidate.ToolCallChecked != 100 {
			t.Fatalf("counts %+v", in.Candidate)
		}
		v, err := Evaluate(Config{}, in)
		if err != nil {
			t.Fatal(err)
		}
		if v.Decision != Rollback || !strings.Contains(v.Reason, "critical") || !strings.Contains(v.Reason, MetricToolBreakage) {
			t.Errorf("verdict %s: %s", v.Decision, v.Reason)
		}
	})
	t.Run("identical pairs promote", func(t *testing.T) {
		acc := NewAccumulator(0)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w * 25; i < (w+1)*25; i++ {
					p := jitter(ans(fmt.Sprintf("answer number %d is sunny in Oslo", i)), i)
					acc.Add(Compare(Request{}, p, p))
					acc.AddReplica(p, p)
				}
			}()
		}
		wg.Wait()
		if pairs, reps := acc.Counts(); pairs != 100 || reps != 100 {
			t.Fatalf("counts %d %d", pairs, reps)
		}
		v, err := Evaluate(Config{}, acc.Input())
		if err != nil {
			t.Fatal(err)
		}
		if v.Decision != Promote {
			t.Errorf("verdict %s: %s", v.Decision, v.Reason)
		}
	})
	t.Run("window bounds samples", func(t *testing.T) {
		acc := NewAccumulator(10)
		for i := range 25 {
			acc.Add(Compare(Request{}, jitter(ans("x"), i), jitter(ans("x"), i)))
		}
		in := acc.Input()
		if len(in.Primary.TTFT) != 10 || len(in.CandidateSimilarity) != 10 || in.Primary.Requests != 10 {
			t.Errorf("window: %d %d %d", len(in.Primary.TTFT), len(in.CandidateSimilarity), in.Primary.Requests)
		}
	})
}

func TestSchemaDraftAndLocalRef(t *testing.T) {
	s := `{"$schema":"http://json-schema.org/draft-07/schema#","definitions":{"n":{"type":"string"}},
		"type":"object","properties":{"name":{"$ref":"#/definitions/n"}},"required":["name"]}`
	req := Request{ResponseFormat: FormatJSONSchema, Schema: json.RawMessage(s)}
	r := Compare(req, ans(`{"name":"a"}`), ans(`{"name":5}`))
	if len(r.Notes) > 0 || r.Primary.SchemaBroken || !r.Candidate.SchemaBroken {
		t.Errorf("notes=%q p=%v c=%v", r.Notes, r.Primary.Problems, r.Candidate.Problems)
	}
	req.Schema = json.RawMessage(`{"$ref":"https://example.com/remote.json"}`)
	if r := Compare(req, ans(`{}`), ans(`{}`)); len(r.Notes) != 1 || r.Candidate.SchemaChecked {
		t.Errorf("remote ref: notes=%q", r.Notes)
	}
}

// A vLLM Responses stream (fields in alphabetical order, "type" last): reasoning, two
// function calls whose arguments arrive in deltas naming only the item, then completed.
const vllmResponsesToolStream = `event: response.created
data: {"response":{"id":"resp_1","object":"response","output":[],"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}

event: response.output_item.added
data: {"item":{"content":[],"id":"rs_1","summary":[],"type":"reasoning"},"output_index":0,"sequence_number":1,"type":"response.output_item.added"}

event: response.reasoning_text.delta
data: {"content_index":0,"delta":"Two calls.","item_id":"rs_1","output_index":0,"sequence_number":2,"type":"response.reasoning_text.delta"}

event: response.output_item.added
data: {"item":{"arguments":"","call_id":"call_a","id":"fc_a","name":"get_weather","status":"in_progress","type":"function_call"},"output_index":1,"sequence_number":3,"type":"response.output_item.added"}

event: response.function_call_arguments.delta
data: {"delta":"{\"city\": ","item_id":"fc_a","output_index":1,"sequence_number":4,"type":"response.function_call_arguments.delta"}

event: response.output_item.added
data: {"item":{"arguments":"","call_id":"call_b","id":"fc_b","name":"get_time","status":"in_progress","type":"function_call"},"output_index":2,"sequence_number":5,"type":"response.output_item.added"}

event: response.function_call_arguments.delta
data: {"delta":"\"Oslo\"}","item_id":"fc_a","output_index":1,"sequence_number":6,"type":"response.function_call_arguments.delta"}

event: response.function_call_arguments.delta
data: {"delta":"{\"tz\": \"CET\"}","item_id":"fc_b","output_index":2,"sequence_number":7,"type":"response.function_call_arguments.delta"}

event: response.completed
data: {"response":{"id":"resp_1","object":"response","output":[{"content":[{"text":"Two calls.","type":"reasoning_text"}],"id":"rs_1","summary":[],"type":"reasoning"},{"arguments":"{\"city\": \"Oslo\"}","call_id":"call_a","id":"fc_a","name":"get_weather","status":"completed","type":"function_call"},{"arguments":"{\"tz\": \"CET\"}","call_id":"call_b","id":"fc_b","name":"get_time","status":"completed","type":"function_call"}],"status":"completed","usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":0},"output_tokens":31,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":151}},"sequence_number":8,"type":"response.completed"}

`

// An OpenAI-ordered Responses stream of text ("type" first).
const responsesTextStream = "event: response.created\n" +
	`data: {"type":"response.created","sequence_number":0,"response":{"object":"response","status":"in_progress","output":[],"usage":null}}` + "\n\n" +
	"event: response.output_text.delta\n" +
	`data: {"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"{\"name\":"}` + "\n\n" +
	"event: response.refusal.delta\n" +
	`data: {"type":"response.refusal.delta","sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":1,"delta":"not text"}` + "\n\n" +
	"event: response.output_text.delta\n" +
	`data: {"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"\"Ada\",\"age\":36}"}` + "\n\n" +
	"event: response.output_text.done\n" +
	`data: {"type":"response.output_text.done","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"text":"{\"name\":\"Ada\",\"age\":36}"}` + "\n\n" +
	"event: response.completed\n" +
	`data: {"type":"response.completed","sequence_number":5,"response":{"object":"response","status":"completed","output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"{\"name\":\"Ada\",\"age\":36}","annotations":[]}]}],"usage":{"input_tokens":9,"output_tokens":12,"total_tokens":21}}}` + "\n\n"

func TestAnswerFromSSEResponses(t *testing.T) {
	for _, nl := range []string{"\n", "\r\n"} {
		a, err := AnswerFromSSE([]byte(strings.ReplaceAll(vllmResponsesToolStream, "\n", nl)))
		if err != nil {
			t.Fatal(err)
		}
		want := []ToolCall{{"get_weather", `{"city": "Oslo"}`}, {"get_time", `{"tz": "CET"}`}}
		if fmt.Sprint(a.ToolCalls) != fmt.Sprint(want) || a.FinishReason != "tool_calls" || a.OutputTokens != 31 || a.Text != "" || !a.OK() {
			t.Errorf("got %+v", a)
		}
		req := RequestFromBody([]byte(`{"model":"m","input":"Weather and time in Oslo?","tools":[
			{"type":"function","name":"get_weather","parameters":` + string(weatherTool.Parameters) + `},
			{"type":"function","name":"get_time","parameters":` + string(timeTool.Parameters) + `},{"type":"web_search_preview"}],
			"tool_choice":"required"}`))
		if len(req.Tools) != 2 || req.ToolChoice != "required" {
			t.Fatalf("request %+v", req)
		}
		r := Compare(req, a, a)
		if r.Candidate.ToolCallBroken || !r.Candidate.ToolCallChecked || !r.ToolNamesMatch || r.Similarity != 1 {
			t.Errorf("assembled calls broken: %q", r.Candidate.Problems)
		}
	}

	// Text, with a JSON schema asked in text.format: the refusal is not text.
	a, err := AnswerFromSSE([]byte(responsesTextStream))
	if err != nil || a.Text != `{"name":"Ada","age":36}` || a.FinishReason != "stop" || a.OutputTokens != 12 || len(a.ToolCalls) != 0 {
		t.Fatalf("got %+v, %v", a, err)
	}
	req := RequestFromBody([]byte(`{"model":"m","input":"Who?","text":{"format":{"type":"json_schema","name":"person","schema":` + personSchema + `,"strict":true}}}`))
	if req.ResponseFormat != FormatJSONSchema || string(req.Schema) != personSchema {
		t.Fatalf("request %+v", req)
	}
	bad := a
	bad.Text = `{"name":"Ada"}`
	if r := Compare(req, a, bad); !r.Primary.SchemaChecked || r.Primary.SchemaBroken || !r.Candidate.SchemaBroken || len(r.Notes) > 0 {
		t.Errorf("schema: p=%+v c=%+v notes=%q", r.Primary, r.Candidate, r.Notes)
	}

	for _, tt := range []struct {
		name, stream string
		want         Answer
	}{
		{"incomplete", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Once\"}\n\n" +
			"data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"usage\":{\"output_tokens\":1}}}\n\n",
			Answer{Text: "Once", FinishReason: "length", OutputTokens: 1}},
		{"content filter", "data: {\"type\":\"response.incomplete\",\"response\":{\"incomplete_details\":{\"reason\":\"content_filter\"},\"output\":[]}}\n\n",
			Answer{FinishReason: "content_filter"}},
		{"the terminal output when no delta came", "data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}]}}\n\n",
			Answer{Text: "Hi", FinishReason: "stop"}},
		{"arguments done replace the deltas", "data: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"function_call\",\"id\":\"fc\",\"name\":\"f\",\"arguments\":\"\"}}\n\n" +
			"data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":0,\"delta\":\"{\\\"a\\\"\"}\n\n" +
			"data: {\"type\":\"response.function_call_arguments.done\",\"item_id\":\"fc\",\"arguments\":\"{\\\"a\\\":1}\"}\n\n",
			Answer{ToolCalls: []ToolCall{{"f", `{"a":1}`}}}},
		{"error event", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Su\"}\n\n" +
			"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\",\"param\":null,\"sequence_number\":2}\n\n",
			Answer{Text: "Su", ErrorClass: "stream_error"}},
		{"failed", "data: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"x\"},\"output\":[]}}\n\n",
			Answer{ErrorClass: "stream_error"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := AnswerFromSSE([]byte(tt.stream))
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", tt.want) {
				t.Errorf("got  %+v\nwant %+v", a, tt.want)
			}
		})
	}
	// The gateway's own in-band error event (openai.Error.ResponsesSSE) is an error too.
	e := openai.NewError(502, "server_error", "stream_cut", "The stream broke.")
	if a, err := AnswerFromSSE(append([]byte(responsesTextStream[:strings.Index(responsesTextStream, "event: response.completed")]), e.ResponsesSSE(5)...)); err != nil ||
		a.ErrorClass != "stream_error" || a.OK() {
		t.Errorf("gateway error event: %+v, %v", a, err)
	}
	if _, err := AnswerFromSSE([]byte("data: {\"type\":\"response.completed\",\"response\":[]}\n\n")); err == nil {
		t.Error("bad terminal event accepted")
	}
}

func TestAnswerFromChatResponses(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		want       Answer
	}{
		{"text", `{"id":"resp_1","object":"response","status":"completed","error":null,"incomplete_details":null,
			"output":[{"type":"reasoning","id":"rs","summary":[],"content":[{"type":"reasoning_text","text":"hmm"}]},
			{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"Hello ","annotations":[]},{"type":"refusal","refusal":"no"},{"type":"output_text","text":"there"}]}],
			"usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12}}`,
			Answer{Text: "Hello there", FinishReason: "stop", OutputTokens: 7}},
		{"function call", `{"object":"response","status":"completed","output":[{"type":"function_call","id":"fc","call_id":"c","name":"get_weather","arguments":"{\"city\":\"Oslo\"}","status":"completed"}],"usage":{"output_tokens":9}}`,
			Answer{FinishReason: "tool_calls", OutputTokens: 9, ToolCalls: []ToolCall{{"get_weather", `{"city":"Oslo"}`}}}},
		{"vLLM order, no object", `{"created_at":1,"id":"resp_1","incomplete_details":{"reason":"max_output_tokens"},"output":[{"content":[{"text":"Once","type":"output_text"}],"type":"message"}],"status":"incomplete","usage":{"output_tokens":1}}`,
			Answer{Text: "Once", FinishReason: "length", OutputTokens: 1}},
		{"other items shaped otherwise", `{"object":"response","status":"completed","output":[{"type":"web_search_call","content":5},{"type":"message","content":[{"type":"output_text","text":"x"}]}]}`,
			Answer{Text: "x", FinishReason: "stop"}},
		{"failed", `{"object":"response","status":"failed","error":{"code":"server_error","message":"x"},"output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}]}`,
			Answer{ErrorClass: "upstream_error"}},
		{"error object", `{"object":"response","status":"completed","error":{"code":"x","message":"y"},"output":[]}`,
			Answer{ErrorClass: "upstream_error"}},
		{"queued (background)", `{"object":"response","status":"queued","output":[]}`, Answer{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, parse := range []func([]byte) (Answer, error){AnswerFromChat, AnswerFromResponse} {
				a, err := parse([]byte(tt.body))
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", tt.want) {
					t.Errorf("got  %+v\nwant %+v", a, tt.want)
				}
			}
		})
	}
	for _, bad := range []string{`{"object":"response","output":[{"type":"message","content":5}]}`, `{"object":"response","output":{}}`, `[]`} {
		if _, err := AnswerFromChat([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	// A chat body is still a chat body.
	if a, err := AnswerFromChat([]byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"content":"hi"},"finish_reason":"stop"}]}`)); err != nil || a.Text != "hi" {
		t.Errorf("chat: %+v %v", a, err)
	}
}

func TestRequestFromBodyResponses(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		format     string
		schema     string
		tools      []string
		choice     string
	}{
		{"flat tools, built-in tools left out", `{"model":"m","input":"x","tools":[{"type":"function","name":"get_weather","description":"d","parameters":{"type":"object"},"strict":true},{"type":"web_search"},{"type":"file_search","vector_store_ids":["v"]}]}`,
			"", "", []string{"get_weather"}, ""},
		{"json_schema", `{"input":"x","text":{"format":{"type":"json_schema","name":"p","schema":{"type":"object"},"strict":true},"verbosity":"low"}}`,
			FormatJSONSchema, `{"type":"object"}`, nil, ""},
		{"json_object", `{"input":"x","text":{"format":{"type":"json_object"}}}`, FormatJSONObject, "", nil, ""},
		{"text", `{"input":"x","text":{"format":{"type":"text"}}}`, FormatText, "", nil, ""},
		{"text of another shape", `{"input":"x","text":"plain","tools":[{"type":"function","name":"f"}]}`, "", "", []string{"f"}, ""},
		{"forced function", `{"input":"x","tool_choice":{"type":"function","name":"get_weather"},"tools":[{"type":"function","name":"get_weather"}]}`,
			"", "", []string{"get_weather"}, "get_weather"},
		{"forced built-in tool", `{"input":"x","tool_choice":{"type":"web_search_preview"}}`, "", "", nil, ""},
		{"forced custom tool", `{"input":"x","tool_choice":{"type":"custom","name":"sh"}}`, "", "", nil, ""},
		{"allowed tools, required", `{"input":"x","tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"f"}]}}`, "", "", nil, "required"},
		{"chat allowed tools", `{"messages":[],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}}`, "", "", nil, "auto"},
		{"required", `{"input":"x","tool_choice":"required"}`, "", "", nil, "required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := RequestFromBody([]byte(tt.body))
			if r.ResponseFormat != tt.format || string(r.Schema) != tt.schema || len(r.Tools) != len(tt.tools) || r.ToolChoice != tt.choice {
				t.Fatalf("got %+v", r)
			}
			for i, n := range tt.tools {
				if r.Tools[i].Name != n {
					t.Errorf("tool %d = %q, want %q", i, r.Tools[i].Name, n)
				}
			}
		})
	}
	r := RequestFromBody([]byte(`{"tools":[{"type":"function","name":"get_weather","parameters":` + string(weatherTool.Parameters) + `}]}`))
	if len(r.Tools) != 1 || string(r.Tools[0].Parameters) != string(weatherTool.Parameters) {
		t.Errorf("parameters %+v", r.Tools)
	}
}

// TestResponsesAgreeWithTheTap: the shadow's answers of the gateway's captured Responses
// streams end as the gateway's Tap says they do, and the finish mappings agree.
func TestResponsesAgreeWithTheTap(t *testing.T) {
	for _, name := range []string{"responses_text.sse", "responses_tool_call.sse", "responses_incomplete.sse", "responses_error.sse"} {
		b, err := os.ReadFile(filepath.Join("..", "policy", "openai", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		var tap openai.Tap
		rd := openai.NewReader(bytes.NewReader(b), 0)
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			tap.Observe(ev, time.Now())
		}
		a, err := AnswerFromSSE(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if a.FinishReason != tap.FinishReason || (a.ErrorClass != "") != tap.ErrorSeen || (tap.HaveUsage && a.OutputTokens != tap.Usage.CompletionTokens) {
			t.Errorf("%s: answer %+v, tap %+v", name, a, tap)
		}
	}
	for _, status := range []string{"completed", "incomplete", "failed", "cancelled", "queued", "in_progress"} {
		for _, reason := range []string{"", "max_output_tokens", "content_filter", "max_tool_calls"} {
			for _, call := range []bool{false, true} {
				if got, want := responsesFinishReason(status, reason, call), openai.ResponsesFinishReason(status, reason, call); got != want {
					t.Errorf("%s %s %v: %q, the Tap's %q", status, reason, call, got, want)
				}
			}
		}
	}
}
