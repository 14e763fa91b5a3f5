package sim

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOpenAIClient checks that the official client decodes every response shape.
func TestOpenAIClient(t *testing.T) {
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{{"fast", Config{}}, {"scheduled", scheduled}} {
		t.Run(cfg.name, func(t *testing.T) { testOpenAIClient(t, cfg.cfg) })
	}
}

func testOpenAIClient(t *testing.T, cfg Config) {
	_, ts := start(t, cfg)
	ctx := context.Background()
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))

	params := openai.ChatCompletionNewParams{
		Model:     "sim-llama",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief [[mem:k1]]"), openai.UserMessage("hello")},
		MaxTokens: openai.Int(12),
	}
	res, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || !strings.HasPrefix(res.Choices[0].Message.Content, "[[mem:k1]]") ||
		res.Usage.CompletionTokens < 6 || res.Object != "chat.completion" || res.Model != "sim-llama" {
		t.Fatalf("chat completion %+v", res)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("accumulator rejected chunk %s", stream.Current().RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if got := acc.Choices[0].Message.Content; got != res.Choices[0].Message.Content {
		t.Fatalf("streamed %q, non-streamed %q", got, res.Choices[0].Message.Content)
	}
	if acc.Choices[0].FinishReason != res.Choices[0].FinishReason || acc.Usage.TotalTokens != res.Usage.TotalTokens {
		t.Fatalf("stream finish %q usage %+v; non-stream %q %+v", acc.Choices[0].FinishReason, acc.Usage, res.Choices[0].FinishReason, res.Usage)
	}

	tool := openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name: "get_weather",
		Parameters: openai.FunctionParameters{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}},
			"required":   []string{"city", "days"},
		},
	})
	tparams := openai.ChatCompletionNewParams{
		Model:    "sim-llama",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather in Paris?")},
		Tools:    []openai.ChatCompletionToolUnionParam{tool},
	}
	tres, err := client.Chat.Completions.New(ctx, tparams)
	if err != nil {
		t.Fatal(err)
	}
	calls := tres.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" || tres.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("tool call %+v", tres.Choices[0])
	}
	var args struct {
		City *string `json:"city"`
		Days *int    `json:"days"`
	}
	if err := json.Unmarshal([]byte(calls[0].Function.Arguments), &args); err != nil || args.City == nil || args.Days == nil {
		t.Fatalf("arguments %q: %v", calls[0].Function.Arguments, err)
	}
	tstream := client.Chat.Completions.NewStreaming(ctx, tparams)
	var tacc openai.ChatCompletionAccumulator
	finished := false
	for tstream.Next() {
		tacc.AddChunk(tstream.Current())
		if tc, ok := tacc.JustFinishedToolCall(); ok {
			finished = tc.Name == "get_weather" && tc.Arguments == calls[0].Function.Arguments
		}
	}
	if err := tstream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = tstream.Close()
	if !finished || tacc.Choices[0].Message.ToolCalls[0].ID != calls[0].ID {
		t.Fatalf("streamed tool call %+v, want %+v", tacc.Choices[0].Message.ToolCalls, calls)
	}

	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "sim-llama",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"a", "b"}},
		MaxTokens: openai.Int(4),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(comp.Choices) != 2 || comp.Choices[1].Index != 1 || comp.Choices[0].Text == "" {
		t.Fatalf("completion %+v", comp)
	}
	cstream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model: "sim-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("a")}, MaxTokens: openai.Int(4),
	})
	text := ""
	for cstream.Next() {
		for _, c := range cstream.Current().Choices {
			text += c.Text
		}
	}
	if err := cstream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = cstream.Close()
	if text != comp.Choices[0].Text {
		t.Fatalf("streamed completion %q, want %q", text, comp.Choices[0].Text)
	}

	for _, format := range []openai.EmbeddingNewParamsEncodingFormat{openai.EmbeddingNewParamsEncodingFormatFloat, openai.EmbeddingNewParamsEncodingFormatBase64} {
		emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model:          "sim-llama",
			Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"x", "y"}},
			Dimensions:     openai.Int(32),
			EncodingFormat: format,
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(emb.Data) != 2 || len(emb.Data[1].Embedding) != 32 {
			t.Fatalf("%s embeddings %+v", format, emb)
		}
		var n float64
		for _, x := range emb.Data[0].Embedding {
			n += x * x
		}
		if math.Abs(n-1) > 1e-4 {
			t.Fatalf("%s: squared norm %v", format, n)
		}
	}

	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "sim-llama" {
		t.Fatalf("models %+v: %v", models, err)
	}

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-unknown", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
}
