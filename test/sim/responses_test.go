package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// namedEvent is one SSE event with its optional `event:` name.
type namedEvent struct {
	event string
	data  string
	at    time.Time
}

// readEvents reads SSE events (blocks of `event:` and `data:` lines ended by a blank line)
// until EOF or an error (returned with the events read so far).
func readEvents(r io.Reader) ([]namedEvent, error) {
	br := bufio.NewReader(r)
	var evs []namedEvent
	var cur namedEvent
	for {
		line, err := br.ReadString('\n')
		if strings.HasSuffix(line, "\n") {
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "":
				if cur.data != "" || cur.event != "" {
					cur.at = time.Now()
					evs = append(evs, cur)
				}
				cur = namedEvent{}
			case strings.HasPrefix(line, "event: "):
				cur.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				cur.data = strings.TrimPrefix(line, "data: ")
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return evs, nil
			}
			return evs, err
		}
	}
}

type respUsage struct {
	InputTokens        int `json:"input_tokens"`
	OutputTokens       int `json:"output_tokens"`
	TotalTokens        int `json:"total_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens *int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

type respOutputItem struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Status  string `json:"status"`
	Role    string `json:"role"`
	Content []struct {
		Type        string            `json:"type"`
		Text        string            `json:"text"`
		Annotations []json.RawMessage `json:"annotations"`
	} `json:"content"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type respObject struct {
	ID                string                   `json:"id"`
	Object            string                   `json:"object"`
	CreatedAt         int64                    `json:"created_at"`
	Status            string                   `json:"status"`
	IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
	Model             string                   `json:"model"`
	Output            []respOutputItem         `json:"output"`
	Usage             *respUsage               `json:"usage"`
	PreviousID        *string                  `json:"previous_response_id"`
	Instructions      *string                  `json:"instructions"`
	ParallelToolCalls *bool                    `json:"parallel_tool_calls"`
	ToolChoice        json.RawMessage          `json:"tool_choice"`
	Tools             json.RawMessage          `json:"tools"`
	Temperature       *float64                 `json:"temperature"`
	TopP              *float64                 `json:"top_p"`
	Text              json.RawMessage          `json:"text"`
	Metadata          json.RawMessage          `json:"metadata"`
}

type respEventData struct {
	Type           string          `json:"type"`
	SequenceNumber *int            `json:"sequence_number"`
	Response       *respObject     `json:"response"`
	OutputIndex    *int            `json:"output_index"`
	ContentIndex   *int            `json:"content_index"`
	ItemID         string          `json:"item_id"`
	Item           *respOutputItem `json:"item"`
	Part           *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"part"`
	Delta     *string `json:"delta"`
	Text      *string `json:"text"`
	Arguments *string `json:"arguments"`
	Code      string  `json:"code"`
	Message   string  `json:"message"`
}

// respAnswer is what a client makes of a Responses answer, streamed or not.
type respAnswer struct {
	id       string
	status   string
	text     string
	itemType string
	callID   string
	name     string
	args     string
	usage    respUsage
	events   int
	types    []string
	final    respObject
}

func fromResponse(t testing.TB, r respObject) respAnswer {
	t.Helper()
	a := respAnswer{id: r.ID, status: r.Status, final: r}
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || r.CreatedAt == 0 || r.Model != "sim-llama" {
		t.Fatalf("response envelope %+v", r)
	}
	if (r.Status == "incomplete") != (r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens") {
		t.Fatalf("status %q with incomplete_details %+v", r.Status, r.IncompleteDetails)
	}
	if r.Usage == nil || r.Usage.InputTokensDetails == nil || r.Usage.OutputTokensDetails == nil ||
		r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Fatalf("usage %+v", r.Usage)
	}
	a.usage = *r.Usage
	if len(r.Output) != 1 {
		t.Fatalf("%d output items", len(r.Output))
	}
	it := r.Output[0]
	a.itemType = it.Type
	wantStatus := "completed"
	if r.Status == "incomplete" {
		wantStatus = "incomplete"
	}
	if it.Status != wantStatus {
		t.Fatalf("item status %q, response status %q", it.Status, r.Status)
	}
	switch it.Type {
	case "message":
		if !strings.HasPrefix(it.ID, "msg_") || it.Role != "assistant" || len(it.Content) != 1 ||
			it.Content[0].Type != "output_text" || it.Content[0].Annotations == nil {
			t.Fatalf("message item %+v", it)
		}
		a.text = it.Content[0].Text
	case "function_call":
		if !strings.HasPrefix(it.ID, "fc_") || !strings.HasPrefix(it.CallID, "call_") || it.Name == "" {
			t.Fatalf("function_call item %+v", it)
		}
		a.callID, a.name, a.args = it.CallID, it.Name, it.Arguments
	default:
		t.Fatalf("output item type %q", it.Type)
	}
	return a
}

// parseRespStream checks a Responses stream's framing and assembles its answer.
func parseRespStream(t testing.TB, evs []namedEvent, tpe int) respAnswer {
	t.Helper()
	if len(evs) < 6 {
		t.Fatalf("%d events", len(evs))
	}
	var a respAnswer
	var deltas, doneText, doneArgs string
	var itemID string
	sawDone := false
	for n, ev := range evs {
		if ev.data == "[DONE]" {
			t.Fatalf("event %d: [DONE] in a Responses stream", n)
		}
		d := decode[respEventData](t, []byte(ev.data))
		if d.Type != ev.event || d.Type == "" {
			t.Fatalf("event %d: `event: %s` with data type %q", n, ev.event, d.Type)
		}
		if d.SequenceNumber == nil || *d.SequenceNumber != n {
			t.Fatalf("event %d (%s): sequence_number %v", n, d.Type, d.SequenceNumber)
		}
		a.types = append(a.types, d.Type)
		if d.Item != nil || d.ItemID != "" {
			if d.OutputIndex == nil || *d.OutputIndex != 0 {
				t.Fatalf("event %d (%s): output_index %v", n, d.Type, d.OutputIndex)
			}
		}
		switch d.Type {
		case "response.created", "response.in_progress":
			if n > 1 || d.Response == nil || d.Response.Status != "in_progress" || len(d.Response.Output) != 0 || d.Response.Usage != nil {
				t.Fatalf("event %d: %s", n, ev.data)
			}
			if a.id == "" {
				a.id = d.Response.ID
			} else if a.id != d.Response.ID {
				t.Fatalf("response id changed: %q then %q", a.id, d.Response.ID)
			}
		case "response.output_item.added":
			if d.Item == nil || d.Item.Status != "in_progress" || len(d.Item.Content) != 0 || d.Item.Arguments != "" {
				t.Fatalf("event %d: %s", n, ev.data)
			}
			itemID = d.Item.ID
			a.itemType, a.callID, a.name = d.Item.Type, d.Item.CallID, d.Item.Name
		case "response.content_part.added":
			if d.ItemID != itemID || d.Part == nil || d.Part.Type != "output_text" || d.Part.Text != "" || d.ContentIndex == nil {
				t.Fatalf("event %d: %s", n, ev.data)
			}
		case "response.output_text.delta", "response.function_call_arguments.delta":
			if d.ItemID != itemID || d.Delta == nil || *d.Delta == "" {
				t.Fatalf("event %d: %s", n, ev.data)
			}
			if d.Type == "response.output_text.delta" && (d.ContentIndex == nil || *d.ContentIndex != 0) {
				t.Fatalf("event %d: %s", n, ev.data)
			}
			deltas += *d.Delta
		case "response.output_text.done":
			if d.ItemID != itemID || d.Text == nil {
				t.Fatalf("event %d: %s", n, ev.data)
			}
			doneText = *d.Text
		case "response.content_part.done":
			if d.ItemID != itemID || d.Part == nil || d.Part.Text != doneText {
				t.Fatalf("event %d: %s", n, ev.data)
			}
		case "response.function_call_arguments.done":
			if d.ItemID != itemID || d.Arguments == nil {
				t.Fatalf("event %d: %s", n, ev.data)
			}
			doneArgs = *d.Arguments
		case "response.output_item.done":
			if d.Item == nil || d.Item.ID != itemID {
				t.Fatalf("event %d: %s", n, ev.data)
			}
			sawDone = true
		case "response.completed", "response.incomplete":
			if n != len(evs)-1 {
				t.Fatalf("terminal event %d is not the last of %d", n, len(evs))
			}
			if !sawDone || d.Response == nil || d.Response.ID != a.id {
				t.Fatalf("terminal event: %s", ev.data)
			}
			final := fromResponse(t, *d.Response)
			if (d.Type == "response.incomplete") != (final.status == "incomplete") {
				t.Fatalf("%s with status %q", d.Type, final.status)
			}
			if final.final.Output[0].ID != itemID {
				t.Fatalf("final item id %q, streamed %q", final.final.Output[0].ID, itemID)
			}
			final.events, final.types = len(evs), a.types
			switch final.itemType {
			case "message":
				if deltas != final.text || doneText != final.text {
					t.Fatalf("deltas %q, done %q, final %q", deltas, doneText, final.text)
				}
				// created, in_progress, item added, part added, deltas, text done, part done, item done, completed
				if want := 8 + (final.usage.OutputTokens+tpe-1)/tpe; len(evs) != want {
					t.Fatalf("%d events, want %d: %v", len(evs), want, a.types)
				}
			case "function_call":
				if deltas != final.args || doneArgs != final.args || a.callID != final.callID || a.name != final.name {
					t.Fatalf("deltas %q, done %q, final %q; call %q %q vs %q %q", deltas, doneArgs, final.args, a.callID, a.name, final.callID, final.name)
				}
			}
			return final
		default:
			t.Fatalf("event %d: unexpected type %q", n, d.Type)
		}
	}
	t.Fatalf("no terminal event: %v", a.types)
	return a
}

// respond runs a Responses request, streamed or not, and returns the checked answer.
func respond(t testing.TB, ts *httptest.Server, body map[string]any, stream bool, tpe int) respAnswer {
	t.Helper()
	return respondHeaders(t, ts, body, stream, tpe, nil)
}

// respondHeaders is respond with request headers (the knobs).
func respondHeaders(t testing.TB, ts *httptest.Server, body map[string]any, stream bool, tpe int, hdr map[string]string) respAnswer {
	t.Helper()
	b := map[string]any{"stream": stream}
	for k, v := range body {
		b[k] = v
	}
	resp, err := send(context.Background(), ts, "/v1/responses", b, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	if !stream {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return fromResponse(t, decode[respObject](t, raw))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return parseRespStream(t, evs, max(tpe, 1))
}

var weatherTool = map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": weatherSchema}}
var weatherRespTool = map[string]any{"type": "function", "name": "get_weather", "description": "weather", "parameters": weatherSchema, "strict": false}

// TestResponsesMatchesChat: the Responses answer is the chat answer to the equivalent
// conversation, streamed or not, on the fast path and through the scheduler.
func TestResponsesMatchesChat(t *testing.T) {
	toolRound := []map[string]any{
		{"role": "user", "content": "weather in Paris?"},
		{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": `{"city":"Paris"}`},
		{"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
	}
	chatToolRound := []map[string]any{
		{"role": "user", "content": "weather in Paris?"},
		{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
		{"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
	}
	cases := []struct {
		name    string
		resp    map[string]any
		chat    map[string]any
		tools   bool // prompt tokens differ by the tools JSON
		tool    bool // the answer is a function call
		partial bool // cut by max tokens
	}{
		{name: "string input",
			resp: map[string]any{"input": "Tell me about rivers."},
			chat: chatBody("Tell me about rivers.", nil)},
		{name: "instructions and markers",
			resp: map[string]any{"instructions": "be brief [[mem:k1]]", "input": "hello [[mem:k2]]"},
			chat: map[string]any{"messages": []map[string]any{{"role": "system", "content": "be brief [[mem:k1]]"}, {"role": "user", "content": "hello [[mem:k2]]"}}}},
		{name: "items and parts",
			resp: map[string]any{"input": []map[string]any{
				{"role": "user", "content": []map[string]any{{"type": "input_text", "text": "a [[mem:z]]"}, {"type": "input_image", "image_url": "https://example.com/x.png"}}},
				{"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": []map[string]any{{"type": "output_text", "text": "noted", "annotations": []any{}}}},
				{"role": "developer", "content": "dev"},
				{"type": "message", "role": "user", "content": "again"},
			}},
			chat: map[string]any{"messages": []map[string]any{
				{"role": "user", "content": []map[string]any{{"type": "text", "text": "a [[mem:z]]"}, {"type": "image_url", "image_url": map[string]any{"url": "https://example.com/x.png"}}}},
				{"role": "assistant", "content": "noted"},
				{"role": "developer", "content": "dev"},
				{"role": "user", "content": "again"},
			}}},
		{name: "max tokens and seed",
			resp: map[string]any{"input": "count", "max_output_tokens": 5, "ignore_eos": true, "seed": 9, "temperature": 0.7},
			chat: chatBody("count", map[string]any{"max_tokens": 5, "ignore_eos": true, "seed": 9, "temperature": 0.7}), partial: true},
		{name: "function call",
			resp: map[string]any{"input": "weather in Paris?", "tools": []any{weatherRespTool}},
			chat: chatBody("weather in Paris?", map[string]any{"tools": []any{weatherTool}}), tools: true, tool: true},
		{name: "named function call cut",
			resp: map[string]any{"input": "weather?", "tools": []any{map[string]any{"type": "function", "name": "other"}, weatherRespTool},
				"tool_choice": map[string]any{"type": "function", "name": "get_weather"}, "max_output_tokens": 4},
			chat: chatBody("weather?", map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "other"}}, weatherTool},
				"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}, "max_tokens": 4}),
			tools: true, tool: true, partial: true},
		{name: "tool_choice none",
			resp: map[string]any{"input": "weather?", "tools": []any{weatherRespTool}, "tool_choice": "none"},
			chat: chatBody("weather?", map[string]any{"tools": []any{weatherTool}, "tool_choice": "none"}), tools: true},
		{name: "after a function call output",
			resp: map[string]any{"input": toolRound, "tools": []any{weatherRespTool}, "tool_choice": "required"},
			chat: map[string]any{"messages": chatToolRound, "tools": []any{weatherTool}, "tool_choice": "required"}, tools: true},
	}
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{{"fast", Config{}}, {"scheduled", func() Config { c := scheduled; c.TokensPerEvent = 2; return c }()}} {
		t.Run(cfg.name, func(t *testing.T) {
			_, ts := start(t, cfg.cfg)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					want := chat(t, ts, tc.chat, false)
					for _, stream := range []bool{false, true} {
						got := respond(t, ts, tc.resp, stream, cfg.cfg.TokensPerEvent)
						if got.text != want.text[0] || got.callID != want.toolID || got.name != want.toolName || got.args != want.toolArgs {
							t.Fatalf("stream=%v: responses %q / %q %q %q, chat %q / %q %q %q", stream,
								got.text, got.callID, got.name, got.args, want.text[0], want.toolID, want.toolName, want.toolArgs)
						}
						if got.usage.OutputTokens != want.usage.CompletionTokens {
							t.Fatalf("stream=%v: output_tokens %d, chat completion_tokens %d", stream, got.usage.OutputTokens, want.usage.CompletionTokens)
						}
						if !tc.tools && got.usage.InputTokens != want.usage.PromptTokens {
							t.Fatalf("stream=%v: input_tokens %d, chat prompt_tokens %d", stream, got.usage.InputTokens, want.usage.PromptTokens)
						}
						if (got.itemType == "function_call") != tc.tool || (got.status == "incomplete") != tc.partial ||
							(want.finish[0] == "length") != tc.partial {
							t.Fatalf("stream=%v: item %q status %q, chat finish %q", stream, got.itemType, got.status, want.finish[0])
						}
						if tc.tool && !tc.partial {
							var args map[string]any
							if err := json.Unmarshal([]byte(got.args), &args); err != nil {
								t.Fatalf("arguments %q: %v", got.args, err)
							}
							if err := validate(weatherSchema, args, "args"); err != nil {
								t.Fatalf("arguments %s do not validate: %v", got.args, err)
							}
						}
					}
				})
			}
		})
	}
}

// TestResponsesPrevious: previous_response_id continues the stored conversation, exactly as
// sending the whole conversation would; store false keeps nothing.
func TestResponsesPrevious(t *testing.T) {
	s, ts := start(t, Config{})
	tools := []any{weatherRespTool}
	first := respond(t, ts, map[string]any{"instructions": "be helpful", "input": "weather in Paris?", "tools": tools}, false, 1)
	if first.itemType != "function_call" {
		t.Fatalf("first answer %+v", first)
	}
	output := []map[string]any{{"type": "function_call_output", "call_id": first.callID, "output": "sunny [[mem:w1]]"}}
	for _, stream := range []bool{false, true} {
		second := respond(t, ts, map[string]any{"instructions": "be brief", "previous_response_id": first.id, "input": output, "tools": tools}, stream, 1)
		whole := respond(t, ts, map[string]any{"instructions": "be brief", "tools": tools, "input": []map[string]any{
			{"role": "user", "content": "weather in Paris?"},
			{"type": "function_call", "call_id": first.callID, "name": first.name, "arguments": first.args},
			output[0],
		}}, false, 1)
		if second.itemType != "message" || second.text != whole.text || !strings.HasPrefix(second.text, "[[mem:w1]]") {
			t.Fatalf("stream=%v: continued %q, whole conversation %q", stream, second.text, whole.text)
		}
		if second.final.PreviousID == nil || *second.final.PreviousID != first.id {
			t.Fatalf("previous_response_id not echoed: %v", second.final.PreviousID)
		}
		// A streamed response is stored too: continue from it.
		third := respond(t, ts, map[string]any{"previous_response_id": second.id, "input": "thanks"}, false, 1)
		thirdWhole := respond(t, ts, map[string]any{"input": []map[string]any{
			{"role": "user", "content": "weather in Paris?"},
			{"type": "function_call", "call_id": first.callID, "name": first.name, "arguments": first.args},
			output[0],
			{"role": "assistant", "content": second.text},
			{"role": "user", "content": "thanks"},
		}}, false, 1)
		if third.text != thirdWhole.text {
			t.Fatalf("stream=%v: third %q, whole %q", stream, third.text, thirdWhole.text)
		}
	}
	unstored := respond(t, ts, map[string]any{"input": "forget me", "store": false}, false, 1)
	resp, raw := post(t, ts, "/v1/responses", map[string]any{"previous_response_id": unstored.id, "input": "x"}, nil)
	if resp.StatusCode != 404 || !strings.Contains(string(raw), `"code":"previous_response_not_found"`) || !strings.Contains(string(raw), `"param":"previous_response_id"`) {
		t.Fatalf("store false then previous_response_id: %d %s", resp.StatusCode, raw)
	}
	// A stream whose terminal event an error replaces failed: nothing is stored.
	body := map[string]any{"input": "fail at the end", "stream": true, "max_output_tokens": 3, "ignore_eos": true}
	r, err := send(context.Background(), ts, "/v1/responses", body, map[string]string{"x-sim-error-after": "10"})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readEvents(r.Body)
	r.Body.Close()
	if err != nil || len(evs) != 11 || evs[10].event != "error" || evs[9].event != "response.output_item.done" {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	failed := decode[respEventData](t, []byte(evs[0].data)).Response.ID
	resp, raw = post(t, ts, "/v1/responses", map[string]any{"previous_response_id": failed, "input": "x"}, nil)
	if resp.StatusCode != 404 {
		t.Fatalf("previous_response_id of a failed stream: %d %s", resp.StatusCode, raw)
	}
	if st := s.Stats(); st.Errors != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestResponsesStoreBounded(t *testing.T) {
	var rs respStore
	msg := []chatMessage{{Role: "user", Content: messageContent{text: "x"}}}
	for i := range maxStoredResponses + 10 {
		rs.put("r"+strconv.Itoa(i), msg)
	}
	if len(rs.m) != maxStoredResponses || len(rs.order) != maxStoredResponses {
		t.Fatalf("%d stored, %d in order", len(rs.m), len(rs.order))
	}
	if _, ok := rs.get("r9"); ok {
		t.Fatal("the oldest were not evicted")
	}
	if _, ok := rs.get("r10"); !ok {
		t.Fatal("r10 evicted too early")
	}
	big := []chatMessage{{Role: "user", Content: messageContent{text: strings.Repeat("x", maxStoredBytes/2)}}}
	rs.put("big1", big)
	rs.put("big2", big)
	if _, ok := rs.get("big1"); ok || rs.bytes > maxStoredBytes {
		t.Fatalf("byte bound not kept: %d bytes", rs.bytes)
	}
	if _, ok := rs.get("big2"); !ok {
		t.Fatal("newest entry missing")
	}
	rs.put("huge", []chatMessage{{Role: "user", Content: messageContent{text: strings.Repeat("x", maxStoredBytes+1)}}})
	if _, ok := rs.get("huge"); ok {
		t.Fatal("an entry over the byte bound was stored")
	}
}

type paramErrorBody struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func TestResponsesErrors(t *testing.T) {
	long := strings.Repeat("word ", 1000) // ~1250 tokens
	cases := []struct {
		name   string
		cfg    Config
		body   string
		status int
		code   string
		param  string // "" = null
	}{
		{"bad json", Config{}, `{"input":`, 400, "invalid_json", ""},
		{"empty body", Config{}, ``, 400, "invalid_json", ""},
		{"no input", Config{}, `{"model":"sim-llama"}`, 400, "invalid_value", "input"},
		{"null input", Config{}, `{"input":null}`, 400, "invalid_value", "input"},
		{"input number", Config{}, `{"input":5}`, 400, "invalid_type", "input"},
		{"empty input", Config{}, `{"input":[]}`, 400, "invalid_value", "input"},
		{"item not an object", Config{}, `{"input":["hi"]}`, 400, "invalid_type", "input[0]"},
		{"bad content", Config{}, `{"input":[{"role":"user","content":5}]}`, 400, "invalid_type", "input[0]"},
		{"bad role", Config{}, `{"input":[{"role":"robot","content":"x"}]}`, 400, "invalid_value", "input[0].role"},
		{"tool role", Config{}, `{"input":[{"type":"message","role":"tool","content":"x"}]}`, 400, "invalid_value", "input[0].role"},
		{"no content", Config{}, `{"input":[{"role":"user"}]}`, 400, "invalid_value", "input[0].content"},
		{"no type or role", Config{}, `{"input":[{"content":"x"}]}`, 400, "invalid_value", "input[0].type"},
		{"unknown item type", Config{}, `{"input":[{"type":"item_reference","id":"x"}]}`, 400, "invalid_value", "input[0].type"},
		{"function_call without call_id", Config{}, `{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, 400, "invalid_value", "input[0].call_id"},
		{"function_call without name", Config{}, `{"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}`, 400, "invalid_value", "input[0].name"},
		{"function_call without arguments", Config{}, `{"input":[{"type":"function_call","call_id":"c","name":"f"}]}`, 400, "invalid_value", "input[0].arguments"},
		{"output without call_id", Config{}, `{"input":[{"role":"user","content":"x"},{"type":"function_call_output","output":"x"}]}`, 400, "invalid_value", "input[1].call_id"},
		{"output without output", Config{}, `{"input":[{"type":"function_call_output","call_id":"c"}]}`, 400, "invalid_value", "input[0].output"},
		{"instructions not a string", Config{}, `{"input":"x","instructions":["a"]}`, 400, "invalid_type", "instructions"},
		{"unknown model", Config{}, `{"model":"gpt-9","input":"x"}`, 404, "model_not_found", "model"},
		{"unknown previous response", Config{}, `{"input":"x","previous_response_id":"resp_nope"}`, 404, "previous_response_not_found", "previous_response_id"},
		{"tools not an array", Config{}, `{"input":"x","tools":{}}`, 400, "invalid_value", "tools"},
		{"tool without name", Config{}, `{"input":"x","tools":[{"type":"function","parameters":{}}]}`, 400, "invalid_value", "tools[0].name"},
		{"bad tool_choice", Config{}, `{"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":"sometimes"}`, 400, "invalid_value", "tool_choice"},
		{"chat-style tool_choice", Config{}, `{"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","function":{"name":"f"}}}`, 400, "invalid_value", "tool_choice"},
		{"unknown named function", Config{}, `{"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}}`, 400, "invalid_value", "tool_choice"},
		{"max_output_tokens zero", Config{}, `{"input":"x","max_output_tokens":0}`, 400, "invalid_value", "max_output_tokens"},
		{"max_output_tokens string", Config{}, `{"input":"x","max_output_tokens":"5"}`, 400, "invalid_type", "max_output_tokens"},
		{"max_output_tokens over context", Config{MaxModelLen: 100}, `{"input":"x","max_output_tokens":99}`, 400, "context_length_exceeded", "input"},
		{"input over context", Config{MaxModelLen: 1000}, `{"input":"` + long + `"}`, 400, "context_length_exceeded", "input"},
		{"never fits the KV cache", Config{KVTokens: 50}, `{"input":"x","max_output_tokens":60}`, 400, "kv_cache_exceeded", ""},
		{"metadata not strings", Config{}, `{"input":"x","metadata":{"a":1}}`, 400, "invalid_type", "metadata"},
		{"text not an object", Config{}, `{"input":"x","text":"plain"}`, 400, "invalid_type", "text"},
		{"bad text.format.type", Config{}, `{"input":"x","text":{"format":{"type":"yaml"}}}`, 400, "invalid_value", "text.format.type"},
		{"json_schema without name", Config{}, `{"input":"x","text":{"format":{"type":"json_schema","schema":{}}}}`, 400, "invalid_value", "text.format.name"},
		{"json_schema without schema", Config{}, `{"input":"x","text":{"format":{"type":"json_schema","name":"n"}}}`, 400, "invalid_value", "text.format.schema"},
		{"store not a bool", Config{}, `{"input":"x","store":"yes"}`, 400, "invalid_type", "store"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, ts := start(t, tc.cfg)
			resp, raw := post(t, ts, "/v1/responses", tc.body, nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			e := decode[paramErrorBody](t, raw)
			if e.Error == nil || e.Error.Message == "" || e.Error.Type != "invalid_request_error" || e.Error.Code == nil || *e.Error.Code != tc.code {
				t.Fatalf("error body %s, want code %q", raw, tc.code)
			}
			if got := ""; e.Error.Param != nil && *e.Error.Param != tc.param || e.Error.Param == nil && tc.param != got {
				t.Fatalf("param %v, want %q: %s", e.Error.Param, tc.param, raw)
			}
			if st := s.Stats(); st.Errors != 1 || st.Requests != 1 {
				t.Errorf("stats %+v, want 1 request, 1 error", st)
			}
		})
	}
	t.Run("GET", func(t *testing.T) {
		_, ts := start(t, Config{})
		if resp, _ := get(t, ts, "/v1/responses"); resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
			t.Fatalf("GET /v1/responses: %d", resp.StatusCode)
		}
	})
}

// TestResponsesEcho: the response object echoes the request fields the SDK reads.
func TestResponsesEcho(t *testing.T) {
	_, ts := start(t, Config{})
	body := `{"input":"x","instructions":"inst","temperature":0.5,"top_p":0.9,"parallel_tool_calls":false,"user":"u1",
		"metadata":{"k":"v"},"text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"},"strict":true}},
		"tools":[{"type":"function","name":"f"},{"type":"web_search"}],"tool_choice":"none","store":true}`
	resp, raw := post(t, ts, "/v1/responses", body, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var r map[string]any
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"instructions": `"inst"`, "temperature": `0.5`, "top_p": `0.9`, "parallel_tool_calls": `false`, "user": `"u1"`,
		"metadata": `{"k":"v"}`, "text": `{"format":{"name":"n","schema":{"type":"object"},"strict":true,"type":"json_schema"}}`,
		"tools": `[{"name":"f","type":"function"},{"type":"web_search"}]`, "tool_choice": `"none"`, "store": `true`,
		"previous_response_id": `null`, "max_output_tokens": `null`, "error": `null`, "truncation": `"disabled"`,
	}
	for k, v := range want {
		got, _ := json.Marshal(r[k])
		if string(got) != v {
			t.Errorf("%s: %s, want %s", k, got, v)
		}
	}
	if out := r["output"].([]any)[0].(map[string]any); out["type"] != "message" {
		t.Errorf("tool_choice none: output %v", out)
	}
	// Defaults.
	_, raw = post(t, ts, "/v1/responses", `{"input":"x"}`, nil)
	_ = json.Unmarshal(raw, &r)
	for k, v := range map[string]string{"temperature": `1`, "top_p": `1`, "parallel_tool_calls": `true`, "tools": `[]`,
		"tool_choice": `"auto"`, "text": `{"format":{"type":"text"}}`, "metadata": `{}`, "instructions": `null`, "user": `null`} {
		got, _ := json.Marshal(r[k])
		if string(got) != v {
			t.Errorf("default %s: %s, want %s", k, got, v)
		}
	}
}

// TestResponsesKnobs: the per-request knobs and error injection apply to /v1/responses.
func TestResponsesKnobs(t *testing.T) {
	body := map[string]any{"input": "knobs", "max_output_tokens": 12, "ignore_eos": true, "stream": true}
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{{"fast", Config{}}, {"scheduled", scheduled}} {
		t.Run(cfg.name, func(t *testing.T) {
			s, ts := start(t, cfg.cfg)
			full := respond(t, ts, body, true, 1)
			if full.events != 20 || full.status != "incomplete" || full.types[len(full.types)-1] != "response.incomplete" {
				t.Fatalf("full stream: %d events %v", full.events, full.types)
			}
			for i, n := range []int{0, 1, 2, 5, 19} {
				resp, err := send(context.Background(), ts, "/v1/responses", body, map[string]string{"x-sim-die-after": strconv.Itoa(n)})
				if err != nil {
					t.Fatal(err)
				}
				evs, err := readEvents(resp.Body)
				resp.Body.Close()
				if err == nil || len(evs) != n {
					t.Fatalf("die-after %d: %d events, err %v; want %d events and a broken stream", n, len(evs), err, n)
				}
				for k, ev := range evs {
					if ev.event != full.types[k] {
						t.Fatalf("die-after %d: event %d is %q, want %q", n, k, ev.event, full.types[k])
					}
				}
				waitFor(t, 5*time.Second, "the killed sequence to be removed", func() bool {
					st := s.Stats()
					return st.Aborted == int64(i+1) && st.Running == 0
				})
			}
			nb := map[string]any{"input": "knobs"}
			if resp, err := send(context.Background(), ts, "/v1/responses", nb, map[string]string{"x-sim-die-after": "0"}); err == nil {
				resp.Body.Close()
				t.Fatalf("non-stream die-after: status %d, want a connection error", resp.StatusCode)
			}
			for _, code := range []int{429, 503, 400} {
				resp, raw := post(t, ts, "/v1/responses", nb, map[string]string{"x-sim-status": strconv.Itoa(code)})
				if resp.StatusCode != code || (code != 400) != (resp.Header.Get("Retry-After") == "1") {
					t.Fatalf("x-sim-status %d: %d %v %s", code, resp.StatusCode, resp.Header, raw)
				}
			}
			const stall = 100 * time.Millisecond
			begin := time.Now()
			resp, err := send(context.Background(), ts, "/v1/responses", body, map[string]string{"x-sim-stall-after": "3", "x-sim-stall-for": "100ms"})
			if err != nil {
				t.Fatal(err)
			}
			evs, err := readEvents(resp.Body)
			resp.Body.Close()
			if err != nil || len(evs) != 20 {
				t.Fatalf("stall-after: %d events, err %v", len(evs), err)
			}
			if evs[3].at.Sub(begin) < stall {
				t.Fatalf("event 4 after %v, want >= %v", evs[3].at.Sub(begin), stall)
			}
			begin = time.Now()
			if resp, _ := post(t, ts, "/v1/responses", nb, map[string]string{"x-sim-stall-first": "100ms"}); resp.StatusCode != 200 || time.Since(begin) < stall {
				t.Fatalf("stall-first: %d after %v", resp.StatusCode, time.Since(begin))
			}
		})
	}
	t.Run("error rate", func(t *testing.T) {
		_, ts := start(t, Config{ErrorRate429: 1})
		if resp, raw := post(t, ts, "/v1/responses", `{"input":"x"}`, nil); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
	})
}

// TestResponsesEngine: Responses requests go through the scheduler like chat: they queue for
// a running slot (response.created comes at once, the first token after admission), count
// their tokens, and free their KV cache when the client goes away.
func TestResponsesEngine(t *testing.T) {
	s, ts := start(t, Config{ITL: 5 * time.Millisecond, MaxRunning: 1})
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	resp1, _ := openStream(t, ctx1, ts, chatBody("a long answer", map[string]any{"max_tokens": 5000, "ignore_eos": true}), nil, 3)
	defer resp1.Body.Close()

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	resp2, err := send(ctx2, ts, "/v1/responses", map[string]any{"input": "wait", "stream": true, "max_output_tokens": 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	br := bufio.NewReader(resp2.Body)
	for got := 0; got < 2; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", got, err)
		}
		if strings.HasPrefix(line, "event: response.") {
			got++
		}
	}
	waitFor(t, 5*time.Second, "the Responses request to wait", func() bool { return s.Stats().Waiting == 1 })
	cancel1()
	evs, err := readEvents(br)
	if err != nil || len(evs) < 6 || evs[len(evs)-1].event != "response.completed" && evs[len(evs)-1].event != "response.incomplete" {
		t.Fatalf("rest of the queued stream: %d events, %v", len(evs), err)
	}
	waitFor(t, 5*time.Second, "the engine to drain", func() bool {
		st := s.Stats()
		return st.Running == 0 && st.KVReservedTokens == 0 && st.Completed == 1 && st.Cancelled == 1
	})
	before := s.Stats().GenerationTokens
	a := respond(t, ts, map[string]any{"input": "count me", "max_output_tokens": 7, "ignore_eos": true}, false, 1)
	if st := s.Stats(); st.GenerationTokens-before != 7 || a.usage.OutputTokens != 7 {
		t.Fatalf("generated %d, usage %+v", st.GenerationTokens-before, a.usage)
	}
}
