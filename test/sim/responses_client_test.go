package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// TestResponsesOpenAIClient checks that the official client parses every Responses shape:
// text and function calls, streamed and not.
func TestResponsesOpenAIClient(t *testing.T) {
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{{"fast", Config{}}, {"scheduled", scheduled}, {"scheduled 3 tokens per event", func() Config { c := scheduled; c.TokensPerEvent = 3; return c }()}} {
		t.Run(cfg.name, func(t *testing.T) {
			_, ts := start(t, cfg.cfg)
			testResponsesClient(t, ts)
		})
	}
}

func responsesClient(ts *httptest.Server) openai.Client {
	return openai.NewClient(option.WithBaseURL(ts.URL+"/v1/"), option.WithAPIKey("x"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))
}

// sdkStream reads a Responses stream with the SDK and checks its framing: sequence numbers
// from 0, strictly increasing; the terminal event last; deltas adding up to the final output.
func sdkStream(t *testing.T, client openai.Client, params responses.ResponseNewParams) (*responses.Response, []string) {
	t.Helper()
	stream := client.Responses.NewStreaming(context.Background(), params)
	defer stream.Close()
	var types []string
	var final *responses.Response
	var text, args strings.Builder
	next := int64(0)
	for stream.Next() {
		ev := stream.Current()
		if final != nil {
			t.Fatalf("event %s after the terminal event", ev.Type)
		}
		if ev.SequenceNumber != next {
			t.Fatalf("event %d (%s): sequence_number %d", len(types), ev.Type, ev.SequenceNumber)
		}
		next++
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.function_call_arguments.delta":
			args.WriteString(ev.AsResponseFunctionCallArgumentsDelta().Delta)
		case "response.output_item.added":
			if it := ev.AsResponseOutputItemAdded().Item; it.Status != "in_progress" {
				t.Fatalf("item added: %s", ev.RawJSON())
			}
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			final = &r
		case "response.incomplete":
			r := ev.AsResponseIncomplete().Response
			final = &r
		case "error":
			t.Fatalf("error event %s", ev.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if final == nil {
		t.Fatalf("no terminal event: %v", types)
	}
	if got := final.OutputText(); text.String() != got {
		t.Fatalf("deltas %q, final text %q", text.String(), got)
	}
	if out := final.Output[0]; out.Type == "function_call" && out.AsFunctionCall().Arguments != args.String() {
		t.Fatalf("argument deltas %q, final %q", args.String(), out.AsFunctionCall().Arguments)
	}
	return final, types
}

func testResponsesClient(t *testing.T, ts *httptest.Server) {
	ctx := context.Background()
	client := responsesClient(ts)

	params := responses.ResponseNewParams{
		Model:           "sim-llama",
		Instructions:    openai.String("be brief [[mem:k1]]"),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
		MaxOutputTokens: openai.Int(12),
	}
	res, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	text := res.OutputText()
	words := len(strings.Fields(text))
	if !strings.HasPrefix(res.ID, "resp_") || res.Object != "response" || res.Model != "sim-llama" ||
		!strings.HasPrefix(text, "[[mem:k1]]") || res.Usage.OutputTokens != int64(words) ||
		res.Usage.TotalTokens != res.Usage.InputTokens+res.Usage.OutputTokens || res.Usage.InputTokens < 2 {
		t.Fatalf("response %s", res.RawJSON())
	}
	if want := map[bool]responses.ResponseStatus{true: "incomplete", false: "completed"}[words == 12]; res.Status != want {
		t.Fatalf("%d words, status %q", words, res.Status)
	}
	for name, f := range map[string]bool{
		"parallel_tool_calls": res.JSON.ParallelToolCalls.Valid(), "tool_choice": res.JSON.ToolChoice.Valid(),
		"tools": res.JSON.Tools.Valid(), "temperature": res.JSON.Temperature.Valid(), "top_p": res.JSON.TopP.Valid(),
		"text": res.JSON.Text.Valid(), "usage": res.JSON.Usage.Valid(), "created_at": res.JSON.CreatedAt.Valid(),
		"instructions": res.JSON.Instructions.Valid(), "metadata": res.JSON.Metadata.Valid(),
	} {
		if !f {
			t.Errorf("response field %s missing or invalid", name)
		}
	}
	if res.Output[0].Type != "message" || res.Output[0].AsMessage().Content[0].Type != "output_text" ||
		res.TopP != 1 || res.Temperature != 1 || res.Text.Format.Type != "text" || res.ToolChoice.OfToolChoiceMode != "auto" || res.Instructions.OfString != "be brief [[mem:k1]]" {
		t.Fatalf("response %s", res.RawJSON())
	}

	sres, types := sdkStream(t, client, params)
	if sres.OutputText() != text || sres.Usage.TotalTokens != res.Usage.TotalTokens || sres.Status != res.Status || sres.ID == res.ID {
		t.Fatalf("streamed %q %+v %s, non-streamed %q %+v %s", sres.OutputText(), sres.Usage, sres.Status, text, res.Usage, res.Status)
	}
	if types[0] != "response.created" || types[1] != "response.in_progress" || types[2] != "response.output_item.added" ||
		types[3] != "response.content_part.added" || types[4] != "response.output_text.delta" {
		t.Fatalf("event types %v", types)
	}

	// Function calls.
	tparams := responses.ResponseNewParams{
		Model: "sim-llama",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather in Paris?")},
		Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather", weatherSchema, false)},
	}
	tres, err := client.Responses.New(ctx, tparams)
	if err != nil {
		t.Fatal(err)
	}
	if len(tres.Output) != 1 || tres.Output[0].Type != "function_call" || tres.Status != "completed" {
		t.Fatalf("function call response %s", tres.RawJSON())
	}
	call := tres.Output[0].AsFunctionCall()
	if call.Name != "get_weather" || !strings.HasPrefix(call.CallID, "call_") || !strings.HasPrefix(call.ID, "fc_") || call.Status != "completed" {
		t.Fatalf("function call %s", tres.Output[0].RawJSON())
	}
	var args map[string]any
	if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil {
		t.Fatalf("arguments %q: %v", call.Arguments, err)
	}
	if err := validate(weatherSchema, args, "args"); err != nil {
		t.Fatalf("arguments %s do not validate: %v", call.Arguments, err)
	}
	if len(tres.Tools) != 1 || tres.Tools[0].Type != "function" || tres.Tools[0].Name != "get_weather" {
		t.Fatalf("tools echo %s", tres.RawJSON())
	}
	stres, ttypes := sdkStream(t, client, tparams)
	scall := stres.Output[0].AsFunctionCall()
	if scall.Arguments != call.Arguments || scall.CallID != call.CallID || scall.Name != call.Name {
		t.Fatalf("streamed call %+v, non-streamed %+v", scall, call)
	}
	if ttypes[2] != "response.output_item.added" || ttypes[3] != "response.function_call_arguments.delta" ||
		ttypes[len(ttypes)-3] != "response.function_call_arguments.done" || ttypes[len(ttypes)-2] != "response.output_item.done" ||
		ttypes[len(ttypes)-1] != "response.completed" {
		t.Fatalf("function call event types %v", ttypes)
	}

	// The tool's result, after previous_response_id: a text answer, as for the whole
	// conversation sent at once.
	out := responses.ResponseInputItemParamOfFunctionCallOutput("sunny")
	out.OfFunctionCallOutput.CallID = openai.String(call.CallID)
	follow, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model:              "sim-llama",
		PreviousResponseID: openai.String(tres.ID),
		Input:              responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{out}},
		Tools:              tparams.Tools,
	})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim-llama",
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("weather in Paris?", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfFunctionCall(call.Arguments, call.CallID, call.Name),
			out,
		}},
		Tools: tparams.Tools,
	})
	if err != nil {
		t.Fatal(err)
	}
	if follow.Output[0].Type != "message" || follow.OutputText() == "" || follow.OutputText() != whole.OutputText() || follow.PreviousResponseID != tres.ID {
		t.Fatalf("follow-up %q, whole conversation %q", follow.OutputText(), whole.OutputText())
	}

	_, err = client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim-llama", PreviousResponseID: openai.String("resp_unknown"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "previous_response_not_found" || apiErr.Param != "previous_response_id" {
		t.Fatalf("unknown previous response: %v", err)
	}
	_, err = client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "sim-llama", MaxOutputTokens: openai.Int(0), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")},
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "max_output_tokens" {
		t.Fatalf("max_output_tokens 0: %v", err)
	}
}
