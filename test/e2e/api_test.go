package e2e

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/sluicegw/sluice/test/sim"
)

// TestOpenAIClient drives every endpoint the gateway parses with the official client, through
// the gateway to the simulator.
func TestOpenAIClient(t *testing.T) {
	s := startSim(t, sim.Config{})
	g := startGateway(t, oneRoute("", "", s.URL))
	client := newClient(t, g.addr)
	ctx := testCtx(t)

	t.Run("chat: streamed text equals non-streamed text", func(t *testing.T) {
		for _, prompt := range []string{"Tell me about sluices.", "[[mem:alpha_1]] remember me and [[mem:b-2]]"} {
			params := openai.ChatCompletionNewParams{
				Model: "sim-llama",
				Messages: []openai.ChatCompletionMessageParamUnion{
					openai.SystemMessage("You are terse."),
					openai.UserMessage(prompt),
				},
				MaxTokens:   openai.Int(24),
				Temperature: openai.Float(0),
			}
			resp, err := client.Chat.Completions.New(ctx, params)
			if err != nil {
				t.Fatalf("chat: %v", err)
			}
			if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
				t.Fatalf("chat: unexpected answer %+v", resp)
			}
			if resp.Model != "sim-llama" || resp.Usage.CompletionTokens == 0 || resp.Usage.PromptTokens == 0 {
				t.Errorf("chat: model %q usage %+v", resp.Model, resp.Usage)
			}
			want := resp.Choices[0].Message.Content

			stream := client.Chat.Completions.NewStreaming(ctx, params)
			var (
				acc    openai.ChatCompletionAccumulator
				b      strings.Builder
				chunks int
			)
			for stream.Next() {
				c := stream.Current()
				acc.AddChunk(c)
				if len(c.Choices) > 0 {
					b.WriteString(c.Choices[0].Delta.Content)
				}
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("chat stream: %v", err)
			}
			_ = stream.Close()
			if got := b.String(); got != want {
				t.Errorf("streamed %q, non-streamed %q", got, want)
			}
			if chunks < 3 {
				t.Errorf("only %d chunks: not streamed event by event", chunks)
			}
			if len(acc.Choices) != 1 || acc.Choices[0].FinishReason == "" {
				t.Errorf("accumulated stream has no finish_reason: %+v", acc.Choices)
			}
			if strings.Contains(prompt, "[[mem:") && !strings.HasPrefix(want, "[[mem:alpha_1]] [[mem:b-2]]") {
				t.Errorf("context markers did not survive the path: %q", want)
			}
		}
	})

	t.Run("chat: tool call", func(t *testing.T) {
		tool := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:        "get_weather",
			Description: openai.String("Current weather in a city"),
			Parameters: shared.FunctionParameters{
				"type": "object",
				"properties": map[string]any{
					"city": map[string]any{"type": "string"},
					"unit": map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}},
					"days": map[string]any{"type": "integer", "minimum": 1, "maximum": 7},
				},
				"required": []string{"city", "unit", "days"},
			},
		})
		other := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:       "get_time",
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"tz": map[string]any{"type": "string"}}},
		})
		params := openai.ChatCompletionNewParams{
			Model:     "sim-llama",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris?")},
			Tools:     []openai.ChatCompletionToolUnionParam{other, tool},
			MaxTokens: openai.Int(256),
			ToolChoice: openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{
				Name: "get_weather",
			}),
		}
		check := func(t *testing.T, how string, calls []openai.ChatCompletionMessageToolCallUnion, finish string) {
			t.Helper()
			if len(calls) != 1 {
				t.Fatalf("%s: %d tool calls, want 1", how, len(calls))
			}
			fn := calls[0].Function
			if fn.Name != "get_weather" || !strings.HasPrefix(calls[0].ID, "call_") {
				t.Errorf("%s: call %q id %q, want get_weather", how, fn.Name, calls[0].ID)
			}
			var args map[string]any
			if err := json.Unmarshal([]byte(fn.Arguments), &args); err != nil {
				t.Fatalf("%s: arguments are not JSON: %v: %q", how, err, fn.Arguments)
			}
			for _, k := range []string{"city", "unit", "days"} {
				if _, ok := args[k]; !ok {
					t.Errorf("%s: arguments lack required %q: %s", how, k, fn.Arguments)
				}
			}
			if finish != "tool_calls" {
				t.Errorf("%s: finish_reason %q, want tool_calls", how, finish)
			}
		}
		resp, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatalf("chat with tools: %v", err)
		}
		check(t, "non-streamed", resp.Choices[0].Message.ToolCalls, resp.Choices[0].FinishReason)

		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("streamed tools: %v", err)
		}
		_ = stream.Close()
		if len(acc.Choices) != 1 {
			t.Fatalf("streamed tools: %d choices", len(acc.Choices))
		}
		check(t, "streamed", acc.Choices[0].Message.ToolCalls, acc.Choices[0].FinishReason)
		if got, want := acc.Choices[0].Message.ToolCalls[0].Function.Arguments, resp.Choices[0].Message.ToolCalls[0].Function.Arguments; got != want {
			t.Errorf("streamed arguments %q differ from non-streamed %q", got, want)
		}
	})

	t.Run("completions", func(t *testing.T) {
		tests := []struct {
			name    string
			prompt  openai.CompletionNewParamsPromptUnion
			choices int
		}{
			{"string prompt", openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time [[mem:k9]]")}, 1},
			{"array prompt", openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"first [[mem:k9]]", "second", "third"}}, 3},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				params := openai.CompletionNewParams{
					Model:       "sim-llama",
					Prompt:      tt.prompt,
					MaxTokens:   openai.Int(12),
					Temperature: openai.Float(0),
				}
				resp, err := client.Completions.New(ctx, params)
				if err != nil {
					t.Fatalf("completions: %v", err)
				}
				if len(resp.Choices) != tt.choices {
					t.Fatalf("%d choices, want %d", len(resp.Choices), tt.choices)
				}
				seen := map[int64]bool{}
				for _, c := range resp.Choices {
					if c.Text == "" {
						t.Errorf("choice %d: empty text", c.Index)
					}
					seen[c.Index] = true
				}
				if len(seen) != tt.choices {
					t.Errorf("choice indexes not distinct: %+v", resp.Choices)
				}
				if !strings.HasPrefix(resp.Choices[0].Text, "[[mem:k9]]") {
					t.Errorf("marker lost: %q", resp.Choices[0].Text)
				}
				// Streamed, each choice's text equals the non-streamed one.
				stream := client.Completions.NewStreaming(ctx, params)
				got := map[int64]string{}
				for stream.Next() {
					for _, c := range stream.Current().Choices {
						got[c.Index] += c.Text
					}
				}
				if err := stream.Err(); err != nil {
					t.Fatalf("completions stream: %v", err)
				}
				_ = stream.Close()
				for _, c := range resp.Choices {
					if got[c.Index] != c.Text {
						t.Errorf("choice %d: streamed %q, non-streamed %q", c.Index, got[c.Index], c.Text)
					}
				}
			})
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		tests := []struct {
			name  string
			input openai.EmbeddingNewParamsInputUnion
			dims  int64 // requested; 0: the model's
			want  int
			n     int
		}{
			{"one string", openai.EmbeddingNewParamsInputUnion{OfString: openai.String("a sluice gate")}, 0, 64, 1},
			{"array with dimensions", openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"one", "two", "three"}}, 16, 16, 3},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				params := openai.EmbeddingNewParams{Model: "sim-llama", Input: tt.input}
				if tt.dims > 0 {
					params.Dimensions = openai.Int(tt.dims)
				}
				resp, err := client.Embeddings.New(ctx, params)
				if err != nil {
					t.Fatalf("embeddings: %v", err)
				}
				if len(resp.Data) != tt.n {
					t.Fatalf("%d embeddings, want %d", len(resp.Data), tt.n)
				}
				for i, d := range resp.Data {
					if int(d.Index) != i || len(d.Embedding) != tt.want {
						t.Errorf("embedding %d: index %d, dimension %d, want %d", i, d.Index, len(d.Embedding), tt.want)
					}
					var sq float64
					for _, v := range d.Embedding {
						sq += v * v
					}
					if n := math.Sqrt(sq); math.Abs(n-1) > 1e-3 {
						t.Errorf("embedding %d: norm %v, want 1", i, n)
					}
				}
				if resp.Usage.PromptTokens == 0 {
					t.Errorf("no usage: %+v", resp.Usage)
				}
			})
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatalf("models: %v", err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != "sim-llama" {
			t.Fatalf("models: %+v", page.Data)
		}
		m, err := client.Models.Get(ctx, "sim-llama")
		if err != nil || m.ID != "sim-llama" {
			t.Fatalf("model: %v %+v", err, m)
		}
	})

	t.Run("upstream errors reach the client in OpenAI shape", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "no-such-model",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
			t.Fatalf("unknown model: %v", err)
		}
		_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "sim-llama",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		}, option.WithHeader("x-sim-status", "429"))
		if !asAPIError(err, &apiErr) || apiErr.StatusCode != 429 {
			t.Fatalf("x-sim-status 429: %v", err)
		}
		if ra := apiErr.Response.Header.Get("Retry-After"); ra == "" {
			t.Errorf("429 without Retry-After")
		}
	})
}
