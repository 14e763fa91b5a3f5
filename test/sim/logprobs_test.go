package sim

import (
	"context"
	"encoding/json"
	"math"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	sopenai "github.com/sluicegw/sluice/policy/openai"
)

type wireTop struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type wireLP struct {
	wireTop
	TopLogprobs []wireTop `json:"top_logprobs"`
}

type wireCompLP struct {
	TextOffset    []int                `json:"text_offset"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	Tokens        []string             `json:"tokens"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
}

type lpChoice struct {
	Index   int `json:"index"`
	Message *struct {
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Content *string `json:"content"`
	} `json:"delta"`
	Text     *string         `json:"text"`
	Logprobs json.RawMessage `json:"logprobs"`
}

type lpBody struct {
	Choices []lpChoice `json:"choices"`
}

// lpAnswer is the text and the logprobs of an answer, streamed or not.
type lpAnswer struct {
	text   string
	chat   []wireLP
	comp   wireCompLP
	chunks int // chunks whose logprobs were not null
}

func lpRun(t *testing.T, ts *httptest.Server, path string, body map[string]any, stream bool) lpAnswer {
	t.Helper()
	b := map[string]any{"stream": stream}
	for k, v := range body {
		b[k] = v
	}
	resp, raw := post(t, ts, path, b, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var datas []string
	if stream {
		evs, err := readSSE(strings.NewReader(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.data != "[DONE]" {
				datas = append(datas, e.data)
			}
		}
	} else {
		datas = []string{string(raw)}
	}
	var a lpAnswer
	for _, d := range datas {
		cb := decode[lpBody](t, []byte(d))
		for _, c := range cb.Choices {
			switch {
			case c.Message != nil:
				a.text += c.Message.Content
			case c.Delta != nil && c.Delta.Content != nil:
				a.text += *c.Delta.Content
			case c.Text != nil:
				a.text += *c.Text
			}
			if string(c.Logprobs) == "null" || len(c.Logprobs) == 0 {
				continue
			}
			a.chunks++
			if strings.Contains(path, "chat") {
				var lp struct {
					Content []wireLP `json:"content"`
				}
				if err := json.Unmarshal(c.Logprobs, &lp); err != nil {
					t.Fatal(err)
				}
				a.chat = append(a.chat, lp.Content...)
				continue
			}
			lp := decode[wireCompLP](t, c.Logprobs)
			a.comp.TextOffset = append(a.comp.TextOffset, lp.TextOffset...)
			a.comp.TokenLogprobs = append(a.comp.TokenLogprobs, lp.TokenLogprobs...)
			a.comp.Tokens = append(a.comp.Tokens, lp.Tokens...)
			a.comp.TopLogprobs = append(a.comp.TopLogprobs, lp.TopLogprobs...)
		}
	}
	return a
}

func TestLogprobsChat(t *testing.T) {
	for _, tpe := range []int{1, 3} {
		_, ts := start(t, Config{TokensPerEvent: tpe})
		for _, k := range []int{0, 1, 5, 20} {
			body := chatBody("tell me about [[mem:ab12]] rivers", map[string]any{"logprobs": true, "top_logprobs": k, "max_tokens": 40})
			streamed := lpRun(t, ts, "/v1/chat/completions", body, true)
			whole := lpRun(t, ts, "/v1/chat/completions", body, false)
			if streamed.text != whole.text || len(streamed.chat) != len(whole.chat) || whole.chunks != 1 {
				t.Fatalf("k=%d: streamed and whole answers differ: %q (%d tokens) vs %q (%d)", k, streamed.text, len(streamed.chat), whole.text, len(whole.chat))
			}
			if want := (len(streamed.chat) + tpe - 1) / tpe; streamed.chunks != want {
				t.Errorf("k=%d tpe=%d: %d chunks carry logprobs, want %d", k, tpe, streamed.chunks, want)
			}
			var text strings.Builder
			for i, tok := range streamed.chat {
				if w := whole.chat[i]; w.Token != tok.Token || w.Logprob != tok.Logprob || len(w.TopLogprobs) != len(tok.TopLogprobs) {
					t.Fatalf("k=%d token %d: streamed %+v, whole %+v", k, i, tok, w)
				}
				text.WriteString(tok.Token)
				if string(runes(tok.Bytes)) != tok.Token {
					t.Errorf("token %q: bytes %v", tok.Token, tok.Bytes)
				}
				if len(tok.TopLogprobs) != k {
					t.Fatalf("token %d: %d alternatives, want %d", i, len(tok.TopLogprobs), k)
				}
				if tok.Logprob > 0 || tok.Logprob < -9999 {
					t.Errorf("token %d: logprob %v", i, tok.Logprob)
				}
				seen := map[string]bool{}
				sum := 0.0
				for r, alt := range tok.TopLogprobs {
					if r == 0 && (alt.Token != tok.Token || alt.Logprob != tok.Logprob) {
						t.Errorf("token %d: the first alternative %+v is not the sampled token %+v", i, alt, tok.wireTop)
					}
					if r > 0 && alt.Logprob > tok.TopLogprobs[r-1].Logprob {
						t.Errorf("token %d: alternatives not in order", i)
					}
					if seen[alt.Token] {
						t.Errorf("token %d: %q twice", i, alt.Token)
					}
					seen[alt.Token] = true
					sum += math.Exp(alt.Logprob)
				}
				if sum > 1+1e-6 {
					t.Errorf("token %d: alternatives sum to %v", i, sum)
				}
			}
			if text.String() != streamed.text || !strings.HasPrefix(streamed.text, "[[mem:ab12]]") {
				t.Errorf("k=%d: the tokens %q do not spell the text %q", k, text.String(), streamed.text)
			}
		}
	}
}

func runes(b []int) []byte {
	out := make([]byte, len(b))
	for i, v := range b {
		out[i] = byte(v)
	}
	return out
}

func TestLogprobsCompletions(t *testing.T) {
	_, ts := start(t, Config{TokensPerEvent: 2})
	for _, k := range []int{0, 3} {
		body := map[string]any{"model": "sim-llama", "prompt": "once upon a time", "logprobs": k, "max_tokens": 30}
		streamed := lpRun(t, ts, "/v1/completions", body, true)
		whole := lpRun(t, ts, "/v1/completions", body, false)
		for _, a := range []lpAnswer{streamed, whole} {
			c := a.comp
			n := len(c.Tokens)
			if n == 0 || len(c.TokenLogprobs) != n || len(c.TopLogprobs) != n || len(c.TextOffset) != n {
				t.Fatalf("k=%d: parallel lists of %d, %d, %d, %d", k, n, len(c.TokenLogprobs), len(c.TopLogprobs), len(c.TextOffset))
			}
			off := 0
			for i, tok := range c.Tokens {
				if c.TextOffset[i] != off {
					t.Errorf("token %d: text_offset %d, want %d", i, c.TextOffset[i], off)
				}
				off += len(tok)
				if len(c.TopLogprobs[i]) != max(k, 1) || c.TopLogprobs[i][tok] != c.TokenLogprobs[i] {
					t.Errorf("token %d %q: top %v, logprob %v", i, tok, c.TopLogprobs[i], c.TokenLogprobs[i])
				}
			}
			if strings.Join(c.Tokens, "") != a.text {
				t.Errorf("tokens %q, text %q", c.Tokens, a.text)
			}
		}
		if streamed.text != whole.text || len(streamed.comp.Tokens) != len(whole.comp.Tokens) {
			t.Errorf("streamed and whole answers differ")
		}
	}
}

func TestLogprobsRefused(t *testing.T) {
	_, ts := start(t, Config{})
	for _, tc := range []struct {
		path  string
		body  map[string]any
		param string
	}{
		{"/v1/chat/completions", chatBody("x", map[string]any{"top_logprobs": 2}), "top_logprobs"},
		{"/v1/chat/completions", chatBody("x", map[string]any{"logprobs": false, "top_logprobs": 2}), "top_logprobs"},
		{"/v1/chat/completions", chatBody("x", map[string]any{"logprobs": true, "top_logprobs": 21}), "top_logprobs"},
		{"/v1/chat/completions", chatBody("x", map[string]any{"logprobs": true, "top_logprobs": -1}), "top_logprobs"},
		{"/v1/completions", map[string]any{"prompt": "x", "logprobs": 21}, "logprobs"},
		{"/v1/completions", map[string]any{"prompt": "x", "logprobs": -2}, "logprobs"},
	} {
		resp, raw := post(t, ts, tc.path, tc.body, nil)
		if resp.StatusCode != 400 || !strings.Contains(string(raw), `"param":"`+tc.param+`"`) {
			t.Errorf("%v: %d %s", tc.body, resp.StatusCode, raw)
		}
	}
	// Not asked: "logprobs": null as before; a tool call carries none either.
	for _, body := range []map[string]any{
		chatBody("x", map[string]any{"logprobs": false}),
		chatBody("x", map[string]any{"logprobs": true, "top_logprobs": 3, "tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}}}),
	} {
		for _, stream := range []bool{false, true} {
			if a := lpRun(t, ts, "/v1/chat/completions", body, stream); a.chunks != 0 {
				t.Errorf("stream %v: %d chunks with logprobs", stream, a.chunks)
			}
		}
	}
}

// meanConfidence is the mean entropy and margin of the logprobs of answers to n prompts,
// read with the gateway's scanner.
func meanConfidence(t *testing.T, ts *httptest.Server, n int) (entropy, margin float64) {
	t.Helper()
	var sc sopenai.LogprobScanner
	tokens := 0
	for i := range n {
		body := chatBody("question number "+string(rune('a'+i%26))+strings.Repeat(" more", i), map[string]any{"logprobs": true, "top_logprobs": 5, "max_tokens": 64})
		resp, raw := post(t, ts, "/v1/chat/completions", body, nil)
		if resp.StatusCode != 200 {
			t.Fatal(string(raw))
		}
		sc.ScanBody(raw, func(tk sopenai.TokenLogprob) {
			if tk.HasAlts() {
				entropy += tk.Entropy
				margin += tk.Margin
				tokens++
			}
		})
	}
	if tokens == 0 {
		t.Fatal("no tokens with alternatives")
	}
	return entropy / float64(tokens), margin / float64(tokens)
}

// TestLogprobTemperature: the knob makes a model less sure of itself, deterministically.
func TestLogprobTemperature(t *testing.T) {
	_, sure := start(t, Config{})
	_, same := start(t, Config{LogprobTemperature: 1})
	_, unsure := start(t, Config{LogprobTemperature: 2})
	h1, m1 := meanConfidence(t, sure, 40)
	h1b, m1b := meanConfidence(t, same, 40)
	h2, m2 := meanConfidence(t, unsure, 40)
	if h1 != h1b || m1 != m1b {
		t.Errorf("not deterministic: %v %v, then %v %v", h1, m1, h1b, m1b)
	}
	if !(h2 > h1+0.1) || !(m2 < m1-0.05) {
		t.Errorf("temperature 2: entropy %.3f margin %.3f; temperature 1: %.3f %.3f", h2, m2, h1, m1)
	}
	if h1 <= 0 || h1 > math.Log(5) || m1 <= 0 || m1 >= 1 {
		t.Errorf("temperature 1: entropy %.3f margin %.3f out of range", h1, m1)
	}
	if err := (Config{LogprobTemperature: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "LogprobTemperature") {
		t.Errorf("a negative temperature: %v", err)
	}
	if err := (Config{LogprobTemperature: math.NaN()}).Validate(); err == nil {
		t.Error("NaN accepted")
	}
}

// TestLogprobsOpenAIClient: the official client decodes the logprobs, streamed and not.
func TestLogprobsOpenAIClient(t *testing.T) {
	_, ts := start(t, Config{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"),
		option.WithHTTPClient(ts.Client()), option.WithMaxRetries(0))
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:       "sim-llama",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		MaxTokens:   openai.Int(10),
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(4),
	}
	res, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	lp := res.Choices[0].Logprobs.Content
	if len(lp) == 0 || len(lp[0].TopLogprobs) != 4 || lp[0].Token == "" {
		t.Fatalf("logprobs %+v", res.Choices[0].Logprobs)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	n := 0
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			for _, tok := range c.Logprobs.Content {
				if len(tok.TopLogprobs) != 4 || tok.Token != lp[n].Token || tok.Logprob != lp[n].Logprob {
					t.Fatalf("streamed token %d %+v, whole %+v", n, tok, lp[n])
				}
				n++
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	if n != len(lp) {
		t.Errorf("%d streamed tokens, %d whole", n, len(lp))
	}
	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model: "sim-llama", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once")},
		MaxTokens: openai.Int(8), Logprobs: openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := comp.Choices[0].Logprobs; len(c.Tokens) == 0 || len(c.TopLogprobs[0]) != 2 || len(c.TokenLogprobs) != len(c.Tokens) {
		t.Errorf("completion logprobs %+v", c)
	}
}
