package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

var scheduled = Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond, ITLPerRunning: 100 * time.Microsecond, TimeScale: 0.5}

func TestStreamMatchesNonStream(t *testing.T) {
	weather := []map[string]any{{"type": "function", "function": map[string]any{
		"name": "get_weather", "parameters": map[string]any{"type": "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"}},
			"required":   []string{"city"}}}}}
	cases := []struct {
		name string
		cfg  Config
		body map[string]any
	}{
		{"fast", Config{}, chatBody("Tell me about rivers.", nil)},
		{"fast max_tokens", Config{}, chatBody("Tell me about rivers.", map[string]any{"max_tokens": 7})},
		{"tokens per event", Config{TokensPerEvent: 3}, chatBody("Hello there", map[string]any{"max_tokens": 20})},
		{"scheduled", scheduled, chatBody("Hello there", map[string]any{"max_tokens": 12})},
		{"scheduled tokens per event", func() Config { c := scheduled; c.TokensPerEvent = 4; return c }(),
			chatBody("Hello there", map[string]any{"max_tokens": 13, "ignore_eos": true})},
		{"markers", Config{}, chatBody("remember [[mem:a1]] and [[mem:b-2]]", nil)},
		{"tools", Config{}, chatBody("weather?", map[string]any{"tools": weather})},
		{"tools scheduled", func() Config { c := scheduled; c.TokensPerEvent = 2; return c }(),
			chatBody("weather?", map[string]any{"tools": weather})},
		{"tools cut by max_tokens", Config{}, chatBody("weather?", map[string]any{"tools": weather, "max_tokens": 3})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := start(t, tc.cfg)
			plain := chat(t, ts, tc.body, false)
			streamed := chat(t, ts, tc.body, true)
			if plain.text[0] != streamed.text[0] || plain.finish[0] != streamed.finish[0] {
				t.Fatalf("non-stream %q (%s) != stream %q (%s)", plain.text[0], plain.finish[0], streamed.text[0], streamed.finish[0])
			}
			if plain.toolID != streamed.toolID || plain.toolName != streamed.toolName || plain.toolArgs != streamed.toolArgs {
				t.Fatalf("tool call differs: %q %q %q vs %q %q %q", plain.toolID, plain.toolName, plain.toolArgs,
					streamed.toolID, streamed.toolName, streamed.toolArgs)
			}
			if *plain.usage != *streamed.usage {
				t.Fatalf("usage %+v vs %+v", *plain.usage, *streamed.usage)
			}
			if u := plain.usage; u.TotalTokens != u.PromptTokens+u.CompletionTokens || u.CompletionTokens < 1 {
				t.Fatalf("usage %+v", *u)
			}
			if plain.toolName == "" {
				if n := len(strings.Fields(plain.text[0])); n != plain.usage.CompletionTokens {
					t.Fatalf("%d words but completion_tokens %d", n, plain.usage.CompletionTokens)
				}
			}
			if tpe := tc.cfg.TokensPerEvent; tpe > 1 && plain.toolName == "" {
				// role chunk + ceil(n/tpe) content chunks + finish + usage + [DONE]
				want := 1 + (plain.usage.CompletionTokens+tpe-1)/tpe + 3
				if streamed.events != want {
					t.Errorf("%d events, want %d", streamed.events, want)
				}
			}
		})
	}
}

func TestDeterminism(t *testing.T) {
	_, ts := start(t, Config{})
	base := chatBody("Describe a quiet garden.", nil)
	first := chat(t, ts, base, false).text[0]
	for i := range 3 {
		if got := chat(t, ts, base, false).text[0]; got != first {
			t.Fatalf("run %d: %q != %q", i, got, first)
		}
	}
	withTemp0 := chatBody("Describe a quiet garden.", map[string]any{"temperature": 0})
	if got := chat(t, ts, withTemp0, false).text[0]; got != first {
		t.Fatalf("temperature 0 changed the answer: %q", got)
	}
	seeded := func(seed int, temp float64) string {
		return chat(t, ts, chatBody("Describe a quiet garden.", map[string]any{"seed": seed, "temperature": temp}), false).text[0]
	}
	if a, b := seeded(7, 0.8), seeded(7, 0.8); a != b {
		t.Fatalf("same seed, different answers: %q vs %q", a, b)
	}
	if seeded(1, 0) == seeded(2, 0) && seeded(2, 0) == seeded(3, 0) {
		t.Fatalf("the seed parameter does not change the answer")
	}
	other := chat(t, ts, chatBody("Describe a loud market.", nil), false).text[0]
	if other == first {
		t.Fatalf("different prompts, same answer %q", first)
	}
	// A different model name (same prompt) on another server changes the answer.
	_, ts2 := start(t, Config{Model: "other-model"})
	b2 := chatBody("Describe a quiet garden.", nil)
	b2["model"] = "other-model"
	if got := chat(t, ts2, b2, false).text[0]; got == first {
		t.Fatalf("model name not part of the hash")
	}
}

func TestLength(t *testing.T) {
	_, ts := start(t, Config{MaxTokensDefault: 10})
	stops := 0
	for i := range 40 {
		a := chat(t, ts, chatBody(fmt.Sprintf("prompt number %d", i), map[string]any{"max_tokens": 16}), false)
		n := a.usage.CompletionTokens
		if n < 8 || n > 16 {
			t.Fatalf("prompt %d: %d tokens, want within [8, 16]", i, n)
		}
		want := "stop"
		if n == 16 {
			want = "length"
		}
		if a.finish[0] != want {
			t.Fatalf("prompt %d: %d tokens, finish %q want %q", i, n, a.finish[0], want)
		}
		if want == "stop" {
			stops++
		}
		exact := chat(t, ts, chatBody(fmt.Sprintf("prompt number %d", i), map[string]any{"max_tokens": 16, "ignore_eos": true}), false)
		if exact.usage.CompletionTokens != 16 || exact.finish[0] != "length" {
			t.Fatalf("ignore_eos: %d tokens, finish %q", exact.usage.CompletionTokens, exact.finish[0])
		}
		if !strings.HasPrefix(exact.text[0], a.text[0]) {
			t.Fatalf("EOS answer %q is not a prefix of the ignore_eos answer %q", a.text[0], exact.text[0])
		}
	}
	if stops == 0 {
		t.Fatalf("no answer ended at EOS")
	}
	def := chat(t, ts, chatBody("x", map[string]any{"ignore_eos": true}), false)
	if def.usage.CompletionTokens != 10 {
		t.Fatalf("default length %d, want MaxTokensDefault 10", def.usage.CompletionTokens)
	}
	mct := chat(t, ts, chatBody("x", map[string]any{"ignore_eos": true, "max_completion_tokens": 5, "max_tokens": 9}), false)
	if mct.usage.CompletionTokens != 5 {
		t.Fatalf("max_completion_tokens: %d tokens, want 5", mct.usage.CompletionTokens)
	}
}

func TestMarkers(t *testing.T) {
	_, ts := start(t, Config{})
	body := map[string]any{
		"model": "sim-llama",
		"messages": []map[string]any{
			{"role": "system", "content": "Keep [[mem:alpha]] in mind. Not markers: [[mem:]] [[mem:bad!]] [[mem:" + strings.Repeat("x", 33) + "]]"},
			{"role": "user", "content": []map[string]any{
				{"type": "text", "text": "first [[mem:beta_2]]"},
				{"type": "text", "text": "again [[mem:alpha]]"},
			}},
			{"role": "assistant", "content": "noted [[mem:" + strings.Repeat("Z", 32) + "]]"},
			{"role": "user", "content": "and [[mem:beta_2]][[mem:g-3]]"},
		},
	}
	want := []string{"[[mem:alpha]]", "[[mem:beta_2]]", "[[mem:" + strings.Repeat("Z", 32) + "]]", "[[mem:g-3]]"}
	for _, stream := range []bool{false, true} {
		a := chat(t, ts, body, stream)
		got := strings.Fields(a.text[0])
		if len(got) < len(want) || strings.Join(got[:len(want)], " ") != strings.Join(want, " ") {
			t.Fatalf("stream=%v: answer %q does not start with %v", stream, a.text[0], want)
		}
		for _, w := range got[len(want):] {
			if strings.Contains(w, "[[") {
				t.Fatalf("marker %q repeated or invalid marker emitted in %q", w, a.text[0])
			}
		}
	}
	body["max_tokens"] = 2
	a := chat(t, ts, body, false)
	if a.text[0] != "[[mem:alpha]] [[mem:beta_2]]" || a.finish[0] != "length" {
		t.Fatalf("max_tokens 2: %q %q", a.text[0], a.finish[0])
	}
	// Completions see markers in the prompt too.
	c := run(t, ts, "/v1/completions", map[string]any{"model": "sim-llama", "prompt": "x [[mem:q]] y"}, false, false)
	if !strings.HasPrefix(c.text[0], "[[mem:q]]") {
		t.Fatalf("completion %q", c.text[0])
	}
}

var weatherSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"city":     map[string]any{"type": "string", "minLength": 3},
		"days":     map[string]any{"type": "integer", "minimum": 1, "maximum": 7},
		"unit":     map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}},
		"detailed": map[string]any{"type": "boolean"},
		"score":    map[string]any{"type": "number", "minimum": 0.5, "maximum": 2.5},
		"tags":     map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "minItems": 2, "maxItems": 4},
		"location": map[string]any{"type": "object", "required": []string{"lat", "lon"}, "properties": map[string]any{
			"lat": map[string]any{"type": "number"}, "lon": map[string]any{"type": "number"},
			"label": map[string]any{"type": "object", "properties": map[string]any{"text": map[string]any{"type": "string"}}},
		}},
		"note":  map[string]any{"type": []string{"string", "null"}},
		"when":  map[string]any{"type": "string", "format": "date-time"},
		"kind":  map[string]any{"anyOf": []any{map[string]any{"type": "integer"}, map[string]any{"type": "string"}}},
		"fixed": map[string]any{"const": "yes"},
	},
	"required": []string{"city", "days", "unit", "location", "tags"},
}

// validate checks v against the subset of JSON Schema the simulator claims to honour.
func validate(schema map[string]any, v any, path string) error {
	if c, ok := schema["const"]; ok {
		if fmt.Sprint(c) != fmt.Sprint(v) {
			return fmt.Errorf("%s: %v, want const %v", path, v, c)
		}
		return nil
	}
	if e, ok := schema["enum"].([]string); ok {
		for _, x := range e {
			if x == v {
				return nil
			}
		}
		return fmt.Errorf("%s: %v not in enum %v", path, v, e)
	}
	if alts, ok := schema["anyOf"].([]any); ok {
		for _, a := range alts {
			if validate(a.(map[string]any), v, path) == nil {
				return nil
			}
		}
		return fmt.Errorf("%s: %v matches no anyOf branch", path, v)
	}
	var types []string
	switch ty := schema["type"].(type) {
	case string:
		types = []string{ty}
	case []string:
		types = ty
	}
	var errs []string
	for _, ty := range types {
		err := validateType(schema, ty, v, path)
		if err == nil {
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("%s", strings.Join(errs, "; "))
}

func validateType(schema map[string]any, ty string, v any, path string) error {
	switch ty {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %T, want object", path, v)
		}
		if req, ok := schema["required"].([]string); ok {
			for _, k := range req {
				if _, ok := obj[k]; !ok {
					return fmt.Errorf("%s: required property %q missing", path, k)
				}
			}
		}
		props, _ := schema["properties"].(map[string]any)
		for k, val := range obj {
			ps, ok := props[k]
			if !ok {
				return fmt.Errorf("%s: unexpected property %q", path, k)
			}
			if err := validate(ps.(map[string]any), val, path+"."+k); err != nil {
				return err
			}
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: %T, want array", path, v)
		}
		if mi, ok := schema["minItems"].(int); ok && len(arr) < mi {
			return fmt.Errorf("%s: %d items, want >= %d", path, len(arr), mi)
		}
		if ma, ok := schema["maxItems"].(int); ok && len(arr) > ma {
			return fmt.Errorf("%s: %d items, want <= %d", path, len(arr), ma)
		}
		for i, x := range arr {
			if err := validate(schema["items"].(map[string]any), x, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case "string":
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: %T, want string", path, v)
		}
		if mi, ok := schema["minLength"].(int); ok && len(s) < mi {
			return fmt.Errorf("%s: %q shorter than %d", path, s, mi)
		}
		if schema["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339, s); err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
		}
	case "integer", "number":
		f, ok := v.(float64)
		if !ok {
			return fmt.Errorf("%s: %T, want %s", path, v, ty)
		}
		if ty == "integer" && f != math.Trunc(f) {
			return fmt.Errorf("%s: %v is not an integer", path, f)
		}
		if mi, ok := toFloat(schema["minimum"]); ok && f < mi {
			return fmt.Errorf("%s: %v < minimum %v", path, f, mi)
		}
		if ma, ok := toFloat(schema["maximum"]); ok && f > ma {
			return fmt.Errorf("%s: %v > maximum %v", path, f, ma)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: %T, want boolean", path, v)
		}
	case "null":
		if v != nil {
			return fmt.Errorf("%s: %v, want null", path, v)
		}
	default:
		return fmt.Errorf("%s: schema type %q unknown to the test", path, ty)
	}
	return nil
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

func TestToolCalls(t *testing.T) {
	tools := []map[string]any{
		{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{
			"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}, "required": []string{"q"}}}},
		{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": weatherSchema}},
	}
	named := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}
	cases := []struct {
		name     string
		messages []map[string]any
		choice   any
		wantTool string // "" = text answer
	}{
		{"auto picks the first tool", []map[string]any{{"role": "user", "content": "hi"}}, nil, "lookup"},
		{"required", []map[string]any{{"role": "user", "content": "hi"}}, "required", "lookup"},
		{"named", []map[string]any{{"role": "user", "content": "weather in Paris?"}}, named, "get_weather"},
		{"none", []map[string]any{{"role": "user", "content": "hi"}}, "none", ""},
		{"after a tool result", []map[string]any{
			{"role": "user", "content": "weather in Paris?"},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "call_1", "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
			{"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
		}, named, ""},
	}
	_, ts := start(t, Config{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"model": "sim-llama", "messages": tc.messages, "tools": tools}
			if tc.choice != nil {
				body["tool_choice"] = tc.choice
			}
			for _, stream := range []bool{false, true} {
				a := chat(t, ts, body, stream)
				if tc.wantTool == "" {
					if a.toolName != "" || a.text[0] == "" || a.finish[0] == "tool_calls" {
						t.Fatalf("stream=%v: want text, got tool %q text %q finish %q", stream, a.toolName, a.text[0], a.finish[0])
					}
					continue
				}
				if a.toolName != tc.wantTool || a.finish[0] != "tool_calls" || !strings.HasPrefix(a.toolID, "call_") || a.text[0] != "" {
					t.Fatalf("stream=%v: tool %q id %q finish %q text %q", stream, a.toolName, a.toolID, a.finish[0], a.text[0])
				}
				var args map[string]any
				if err := json.Unmarshal([]byte(a.toolArgs), &args); err != nil {
					t.Fatalf("arguments %q: %v", a.toolArgs, err)
				}
				schema := tools[0]["function"].(map[string]any)["parameters"].(map[string]any)
				if tc.wantTool == "get_weather" {
					schema = weatherSchema
				}
				if err := validate(schema, args, "args"); err != nil {
					t.Fatalf("arguments %s do not validate: %v", a.toolArgs, err)
				}
			}
		})
	}
	t.Run("deterministic", func(t *testing.T) {
		body := map[string]any{"model": "sim-llama", "messages": cases[2].messages, "tools": tools, "tool_choice": named}
		a, b := chat(t, ts, body, false), chat(t, ts, body, false)
		if a.toolID != b.toolID || a.toolArgs != b.toolArgs {
			t.Fatalf("tool call not deterministic: %q %q vs %q %q", a.toolID, a.toolArgs, b.toolID, b.toolArgs)
		}
	})
	t.Run("unknown named function", func(t *testing.T) {
		body := map[string]any{"model": "sim-llama", "messages": cases[0].messages, "tools": tools,
			"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}
		if resp, raw := post(t, ts, "/v1/chat/completions", body, nil); resp.StatusCode != 400 {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
	})
}

func TestCompletions(t *testing.T) {
	_, ts := start(t, Config{})
	prompts := []string{"once upon a time", "the river", "in the morning"}
	for _, stream := range []bool{false, true} {
		multi := run(t, ts, "/v1/completions", map[string]any{"model": "sim-llama", "prompt": prompts, "max_tokens": 9}, stream, false)
		if len(multi.text) != len(prompts) {
			t.Fatalf("stream=%v: %d choices for %d prompts", stream, len(multi.text), len(prompts))
		}
		total := 0
		for i, p := range prompts {
			single := run(t, ts, "/v1/completions", map[string]any{"model": "sim-llama", "prompt": p, "max_tokens": 9}, stream, false)
			if multi.text[i] != single.text[0] || multi.finish[i] != single.finish[0] || multi.finish[i] == "" {
				t.Fatalf("stream=%v: choice %d %q (%s) != single prompt answer %q (%s)", stream, i, multi.text[i], multi.finish[i], single.text[0], single.finish[0])
			}
			total += single.usage.CompletionTokens
		}
		if multi.usage.CompletionTokens != total {
			t.Fatalf("completion_tokens %d, want %d", multi.usage.CompletionTokens, total)
		}
	}
	ids := run(t, ts, "/v1/completions", map[string]any{"model": "sim-llama", "prompt": [][]int{{1, 2, 3}, {4, 5}}, "max_tokens": 3}, false, false)
	if len(ids.text) != 2 || ids.usage.PromptTokens != 5 {
		t.Fatalf("token-id prompts: %d choices, usage %+v", len(ids.text), *ids.usage)
	}
	flat := run(t, ts, "/v1/completions", map[string]any{"model": "sim-llama", "prompt": []int{1, 2, 3}, "max_tokens": 3}, false, false)
	if len(flat.text) != 1 || flat.usage.PromptTokens != 3 || flat.text[0] != ids.text[0] {
		t.Fatalf("flat token-id prompt: %+v", flat)
	}
	_, raw := post(t, ts, "/v1/completions", map[string]any{"model": "sim-llama", "prompt": "hi"}, nil)
	if body := decode[completionBody](t, raw); body.Object != "text_completion" || !strings.HasPrefix(body.ID, "cmpl-") || body.Created == 0 || body.Model != "sim-llama" {
		t.Fatalf("completion envelope %+v", body)
	}
	_, raw = post(t, ts, "/v1/chat/completions", chatBody("hi", nil), nil)
	if body := decode[completionBody](t, raw); body.Object != "chat.completion" || !strings.HasPrefix(body.ID, "chatcmpl-") || body.Choices[0].Message.Role != "assistant" {
		t.Fatalf("chat envelope %+v", body)
	}
}

type embeddingResponse struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage usage `json:"usage"`
}

func TestEmbeddings(t *testing.T) {
	_, ts := start(t, Config{})
	vectors := func(body map[string]any) [][]float64 {
		t.Helper()
		resp, raw := post(t, ts, "/v1/embeddings", body, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
		r := decode[embeddingResponse](t, raw)
		if r.Object != "list" || r.Model != "sim-llama" || r.Usage.PromptTokens < 1 || r.Usage.TotalTokens != r.Usage.PromptTokens {
			t.Fatalf("envelope %s", raw)
		}
		var out [][]float64
		for i, d := range r.Data {
			if d.Object != "embedding" || d.Index != i {
				t.Fatalf("item %d: %s", i, raw)
			}
			var v []float64
			if d.Embedding[0] == '"' {
				var s string
				_ = json.Unmarshal(d.Embedding, &s)
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil || len(b)%4 != 0 {
					t.Fatalf("base64 %q: %v", s, err)
				}
				for k := 0; k < len(b); k += 4 {
					v = append(v, float64(math.Float32frombits(binary.LittleEndian.Uint32(b[k:]))))
				}
			} else if err := json.Unmarshal(d.Embedding, &v); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		return out
	}
	norm := func(v []float64) float64 {
		var s float64
		for _, x := range v {
			s += x * x
		}
		return math.Sqrt(s)
	}
	vs := vectors(map[string]any{"model": "sim-llama", "input": []string{"hello", "world", "hello"}})
	if len(vs) != 3 || len(vs[0]) != DefaultEmbeddingDim {
		t.Fatalf("%d vectors of %d", len(vs), len(vs[0]))
	}
	for i, v := range vs {
		if n := norm(v); math.Abs(n-1) > 1e-4 {
			t.Fatalf("vector %d norm %v", i, n)
		}
	}
	if fmt.Sprint(vs[0]) != fmt.Sprint(vs[2]) || fmt.Sprint(vs[0]) == fmt.Sprint(vs[1]) {
		t.Fatalf("same text must give the same vector, different text a different one")
	}
	again := vectors(map[string]any{"model": "sim-llama", "input": "hello"})
	if fmt.Sprint(again[0]) != fmt.Sprint(vs[0]) {
		t.Fatalf("embedding not deterministic")
	}
	small := vectors(map[string]any{"input": "hello", "dimensions": 16})
	if len(small[0]) != 16 || math.Abs(norm(small[0])-1) > 1e-4 {
		t.Fatalf("dimensions 16: len %d norm %v", len(small[0]), norm(small[0]))
	}
	b64 := vectors(map[string]any{"input": []string{"hello", "world"}, "encoding_format": "base64"})
	for i := range b64 {
		for k := range b64[i] {
			if float32(b64[i][k]) != float32(vs[i][k]) {
				t.Fatalf("base64 vector %d differs at %d: %v vs %v", i, k, b64[i][k], vs[i][k])
			}
		}
	}
	ids := vectors(map[string]any{"input": [][]int{{1, 2}, {3}}})
	if len(ids) != 2 {
		t.Fatalf("token-id inputs: %d vectors", len(ids))
	}
}

func TestModelsAndHealth(t *testing.T) {
	_, ts := start(t, Config{Model: "my-model", MaxModelLen: 4096})
	resp, raw := get(t, ts, "/v1/models")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d %s: %v", resp.StatusCode, raw, err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "my-model" || list.Data[0].Object != "model" || list.Data[0].MaxModelLen != 4096 {
		t.Fatalf("models %s", raw)
	}
	if resp, _ := get(t, ts, "/v1/models/my-model"); resp.StatusCode != 200 {
		t.Fatalf("GET /v1/models/my-model: %d", resp.StatusCode)
	}
	if resp, _ := get(t, ts, "/v1/models/other"); resp.StatusCode != 404 {
		t.Fatalf("GET /v1/models/other: %d", resp.StatusCode)
	}
	if resp, _ := get(t, ts, "/health"); resp.StatusCode != 200 {
		t.Fatalf("health %d", resp.StatusCode)
	}
}

func TestErrors(t *testing.T) {
	long := strings.Repeat("word ", 1000) // ~1250 tokens
	cases := []struct {
		name   string
		cfg    Config
		method string
		path   string
		body   any
		hdr    map[string]string
		status int
		code   string
	}{
		{"bad json", Config{}, "POST", "/v1/chat/completions", `{"model":`, nil, 400, "invalid_json"},
		{"empty body", Config{}, "POST", "/v1/chat/completions", ``, nil, 400, "invalid_json"},
		{"wrong type", Config{}, "POST", "/v1/chat/completions", `{"messages":"hi"}`, nil, 400, "invalid_type"},
		{"bad content", Config{}, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, nil, 400, "invalid_json"},
		{"no messages", Config{}, "POST", "/v1/chat/completions", `{"model":"sim-llama","messages":[]}`, nil, 400, "invalid_value"},
		{"bad role", Config{}, "POST", "/v1/chat/completions", `{"messages":[{"role":"robot","content":"x"}]}`, nil, 400, "invalid_value"},
		{"unknown model", Config{}, "POST", "/v1/chat/completions", chatBody("hi", map[string]any{"model": "gpt-9"}), nil, 404, "model_not_found"},
		{"unknown model completions", Config{}, "POST", "/v1/completions", `{"model":"x","prompt":"hi"}`, nil, 404, "model_not_found"},
		{"unknown model embeddings", Config{}, "POST", "/v1/embeddings", `{"model":"x","input":"hi"}`, nil, 404, "model_not_found"},
		{"max_tokens over context", Config{MaxModelLen: 100}, "POST", "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 99}), nil, 400, "context_length_exceeded"},
		{"prompt over context", Config{MaxModelLen: 1000}, "POST", "/v1/chat/completions", chatBody(long, nil), nil, 400, "context_length_exceeded"},
		{"prompt over context completions", Config{MaxModelLen: 1000}, "POST", "/v1/completions", map[string]any{"prompt": long}, nil, 400, "context_length_exceeded"},
		{"max_tokens zero", Config{}, "POST", "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 0}), nil, 400, "invalid_value"},
		{"never fits the KV cache", Config{KVTokens: 50}, "POST", "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 60}), nil, 400, "kv_cache_exceeded"},
		{"empty prompt array", Config{}, "POST", "/v1/completions", `{"prompt":[]}`, nil, 400, "invalid_value"},
		{"missing input", Config{}, "POST", "/v1/embeddings", `{"model":"sim-llama"}`, nil, 400, "invalid_value"},
		{"bad encoding_format", Config{}, "POST", "/v1/embeddings", `{"input":"x","encoding_format":"hex"}`, nil, 400, "invalid_value"},
		{"bad dimensions", Config{}, "POST", "/v1/embeddings", `{"input":"x","dimensions":0}`, nil, 400, "invalid_value"},
		{"unknown path", Config{}, "POST", "/v1/nope", `{}`, nil, 404, "not_found"},
		{"unknown path GET", Config{}, "GET", "/", nil, nil, 404, "not_found"},
		{"GET on chat", Config{}, "GET", "/v1/chat/completions", nil, nil, 405, "method_not_allowed"},
		{"POST on models", Config{}, "POST", "/v1/models", `{}`, nil, 405, "method_not_allowed"},
		{"x-sim-status 429", Config{}, "POST", "/v1/chat/completions", chatBody("hi", nil), map[string]string{"x-sim-status": "429"}, 429, "rate_limit_exceeded"},
		{"x-sim-status 503", Config{}, "POST", "/v1/completions", `{"prompt":"x"}`, map[string]string{"x-sim-status": "503"}, 503, "service_unavailable"},
		{"x-sim-status 401", Config{}, "POST", "/v1/embeddings", `{"input":"x"}`, map[string]string{"x-sim-status": "401"}, 401, "invalid_api_key"},
		{"bad knob", Config{}, "POST", "/v1/chat/completions", chatBody("hi", nil), map[string]string{"x-sim-die-after": "soon"}, 400, "invalid_header"},
		{"bad status knob", Config{}, "POST", "/v1/chat/completions", chatBody("hi", nil), map[string]string{"x-sim-status": "200"}, 400, "invalid_header"},
		{"stall-after without stall-for", Config{}, "POST", "/v1/chat/completions", chatBody("hi", nil), map[string]string{"x-sim-stall-after": "1"}, 400, "invalid_header"},
		{"error rate 429", Config{ErrorRate429: 1}, "POST", "/v1/chat/completions", chatBody("hi", nil), nil, 429, "rate_limit_exceeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, ts := start(t, tc.cfg)
			var resp *http.Response
			var raw []byte
			if tc.method == "GET" {
				resp, raw = get(t, ts, tc.path)
			} else {
				resp, raw = post(t, ts, tc.path, tc.body, tc.hdr)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			e := decode[errorBody](t, raw)
			if e.Error == nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == nil || *e.Error.Code != tc.code {
				t.Fatalf("error body %s, want code %q", raw, tc.code)
			}
			if tc.status == 429 && resp.Header.Get("Retry-After") != "1" {
				t.Errorf("429 without Retry-After: 1")
			}
			if strings.HasPrefix(tc.path, "/v1/") && tc.status != 405 && tc.path != "/v1/nope" {
				if st := s.Stats(); st.Errors != 1 || st.Requests != 1 {
					t.Errorf("stats %+v, want 1 request, 1 error", st)
				}
			}
		})
	}
	t.Run("error rate 5xx", func(t *testing.T) {
		_, ts := start(t, Config{ErrorRate5xx: 1, Seed: 3})
		seen := map[int]bool{}
		for range 40 {
			resp, _ := post(t, ts, "/v1/chat/completions", chatBody("hi", nil), nil)
			seen[resp.StatusCode] = true
		}
		if len(seen) != 2 || !seen[500] || !seen[503] {
			t.Fatalf("statuses %v, want 500 and 503", seen)
		}
	})
	t.Run("error rates share", func(t *testing.T) {
		s, ts := start(t, Config{ErrorRate5xx: 0.25, ErrorRate429: 0.25, Seed: 11})
		counts := map[int]int{}
		for range 200 {
			resp, _ := post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":1}`, nil)
			counts[resp.StatusCode]++
		}
		if ok := counts[200]; ok < 60 || ok > 140 {
			t.Fatalf("counts %v: want about half 200", counts)
		}
		if counts[429] < 20 || counts[500]+counts[503] < 20 {
			t.Fatalf("counts %v", counts)
		}
		if st := s.Stats(); st.Errors != int64(200-counts[200]) || st.Completed != int64(counts[200]) {
			t.Fatalf("stats %+v vs counts %v", st, counts)
		}
	})
}

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if err := scheduled.Validate(); err != nil {
		t.Fatalf("scheduled config: %v", err)
	}
	bad := Config{
		Model: "two words", TTFT: -1, PrefillPerToken: -1, ITL: -1, ITLPerRunning: -1, MaxRunning: -1,
		KVTokens: -1, TokensPerEvent: -1, MaxTokensDefault: 100, MaxModelLen: 50, ErrorRate5xx: 1.5, ErrorRate429: math.NaN(),
		Delay: -1, DelayJitter: -1, TimeScale: -2, EmbeddingDim: maxEmbeddingDim + 1, LeakKVPerRequest: -1, Slowdown: math.NaN(),
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, field := range []string{"Model", "TTFT", "PrefillPerToken", "ITL:", "ITLPerRunning", "MaxRunning", "KVTokens",
		"TokensPerEvent", "MaxTokensDefault (100): must be <= MaxModelLen (50)", "ErrorRate5xx", "ErrorRate429", "Delay:", "DelayJitter",
		"TimeScale", "EmbeddingDim", "LeakKVPerRequest", "Slowdown"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not mention %s:\n%v", field, err)
		}
	}
	if err := (Config{ErrorRate5xx: 0.6, ErrorRate429: 0.6}).Validate(); err == nil || !strings.Contains(err.Error(), "<= 1") {
		t.Errorf("rates summing over 1: %v", err)
	}
	// New still builds a working server from a bad config (defaults replace bad values).
	s := New(bad)
	defer s.Close()
	c := s.Config()
	if c.MaxRunning != DefaultMaxRunning || c.TimeScale != 1 || c.ErrorRate5xx != 1 || c.ErrorRate429 != 0 || c.EmbeddingDim != maxEmbeddingDim ||
		c.LeakKVPerRequest != 0 || c.Slowdown != 1 {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestMetricsExposition(t *testing.T) {
	_, ts := start(t, scheduled)
	chat(t, ts, chatBody("hi", map[string]any{"max_tokens": 5, "ignore_eos": true}), true)
	post(t, ts, "/v1/embeddings", `{"input":["a","b"]}`, nil)
	resp, raw := get(t, ts, "/metrics")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	text := string(raw)
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
		"vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
	} {
		if !strings.Contains(text, name+"{") || !strings.Contains(text, `model_name="sim-llama"`) {
			t.Errorf("exposition lacks %s with model_name", name)
		}
	}
	for _, want := range []string{
		`vllm:time_to_first_token_seconds_count{model_name="sim-llama"} 1`,
		`vllm:e2e_request_latency_seconds_count{model_name="sim-llama"} 3`,
		`vllm:request_queue_time_seconds_count{model_name="sim-llama"} 3`,
		`vllm:inter_token_latency_seconds_count{model_name="sim-llama"} 4`,
		`vllm:num_requests_running{model_name="sim-llama"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
}
