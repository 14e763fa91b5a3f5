package openai

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// refTokens is the reference reading of an answer's logprobs, through encoding/json and the
// definitions written out directly (no running sums): what the scanner must agree with.
func refTokens(t *testing.T, data []byte, body bool) []TokenLogprob {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("reference: %v", err)
	}
	var out []TokenLogprob
	num := func(v any) (float64, bool) { f, ok := v.(float64); return min(f, 0), ok }
	token := func(choice int, m map[string]any) TokenLogprob {
		tl := TokenLogprob{Choice: choice, Logprob: math.NaN()}
		if f, ok := num(m["logprob"]); ok {
			tl.Logprob = f
		}
		var ls []float64
		if tops, ok := m["top_logprobs"].([]any); ok {
			for _, e := range tops {
				if em, ok := e.(map[string]any); ok {
					if f, ok := num(em["logprob"]); ok {
						ls = append(ls, f)
					}
				}
			}
		}
		refFill(&tl, ls)
		return tl
	}
	list := func(choice int, v any) {
		items, _ := v.([]any)
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				out = append(out, token(choice, m))
			}
		}
	}
	if chs, ok := doc["choices"].([]any); ok {
		for pos, ch := range chs {
			m, ok := ch.(map[string]any)
			if !ok {
				continue
			}
			idx := pos
			if f, ok := m["index"].(float64); ok {
				idx = int(f)
			}
			lp, ok := m["logprobs"].(map[string]any)
			if !ok {
				continue
			}
			list(idx, lp["content"])
			list(idx, lp["refusal"])
			toks, _ := lp["token_logprobs"].([]any)
			tops, _ := lp["top_logprobs"].([]any)
			for i := range max(len(toks), len(tops)) {
				tl := TokenLogprob{Choice: idx, Logprob: math.NaN()}
				if i < len(toks) {
					if f, ok := num(toks[i]); ok {
						tl.Logprob = f
					}
				}
				var ls []float64
				if i < len(tops) {
					if mm, ok := tops[i].(map[string]any); ok {
						for _, v := range mm {
							if f, ok := num(v); ok {
								ls = append(ls, f)
							}
						}
					}
				}
				refFill(&tl, ls)
				out = append(out, tl)
			}
		}
	}
	if !body && doc["type"] == "response.output_text.delta" {
		list(0, doc["logprobs"])
	}
	if body {
		items, _ := doc["output"].([]any)
		for _, it := range items {
			m, _ := it.(map[string]any)
			parts, _ := m["content"].([]any)
			for _, p := range parts {
				pm, _ := p.(map[string]any)
				list(0, pm["logprobs"])
			}
		}
	}
	return out
}

// refFill computes Alts, Entropy and Margin from the alternatives' logprobs by the
// definitions: q_i = p_i/Σp, H = −Σ q ln q; p_(1) − p_(2).
func refFill(t *TokenLogprob, ls []float64) {
	t.Alts = len(ls)
	if len(ls) < 2 {
		return
	}
	var sum float64
	for _, l := range ls {
		sum += math.Exp(l)
	}
	for _, l := range ls {
		if q := math.Exp(l) / sum; q > 0 {
			t.Entropy -= q * math.Log(q)
		}
	}
	s := slices.Clone(ls)
	slices.Sort(s)
	t.Margin = math.Exp(s[len(s)-1]) - math.Exp(s[len(s)-2])
}

func scanAllLogprobs(data []byte, body bool) (toks []TokenLogprob, sc *LogprobScanner) {
	sc = &LogprobScanner{}
	visit := func(t TokenLogprob) { toks = append(toks, t) }
	var n int
	if body {
		n = sc.ScanBody(data, visit)
	} else {
		n = sc.ScanChunk(data, visit)
	}
	if n != len(toks) {
		panic("count and visits disagree")
	}
	return toks, sc
}

func sameTokens(t *testing.T, got, want []TokenLogprob) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d tokens, want %d:\n got %+v\nwant %+v", len(got), len(want), got, want)
	}
	near := func(a, b float64) bool {
		return math.IsNaN(a) && math.IsNaN(b) || math.Abs(a-b) <= 1e-9*max(1, math.Abs(b))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Choice != w.Choice || g.Alts != w.Alts || !near(g.Logprob, w.Logprob) || !near(g.Entropy, w.Entropy) || !near(g.Margin, w.Margin) {
			t.Errorf("token %d: got %+v, want %+v", i, g, w)
		}
	}
}

// sseData returns the data of every event of an SSE fixture.
func sseData(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rd := NewReader(bytes.NewReader(b), 0)
	var out [][]byte
	for range 1000 {
		ev, err := rd.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Data != nil && !ev.IsDone() {
			out = append(out, bytes.Clone(ev.Data))
		}
	}
	t.Fatal("fixture too long")
	return nil
}

func TestLogprobScanFixtures(t *testing.T) {
	for _, tc := range []struct {
		file   string
		tokens int
	}{
		{"testdata/logprobs_chat.sse", 4},
		{"testdata/logprobs_completion.sse", 2},
		{"testdata/logprobs_responses.sse", 2}, // the done event repeats the deltas' tokens: not read
	} {
		t.Run(tc.file, func(t *testing.T) {
			total := 0
			for _, d := range sseData(t, tc.file) {
				got, _ := scanAllLogprobs(d, false)
				sameTokens(t, got, refTokens(t, d, false))
				total += len(got)
			}
			if total != tc.tokens {
				t.Errorf("%d tokens in the stream, want %d", total, tc.tokens)
			}
		})
	}
}

// TestLogprobValues checks values worked out by hand.
func TestLogprobValues(t *testing.T) {
	chunks := sseData(t, "testdata/logprobs_chat.sse")
	toks, _ := scanAllLogprobs(chunks[3], false) // " is" (sure) and " blue" (two equal alternatives)
	if len(toks) != 2 {
		t.Fatalf("tokens %+v", toks)
	}
	sure, even := toks[0], toks[1]
	if sure.Entropy > 1e-3 || sure.Margin < 0.9999 || sure.Alts != 3 || math.Abs(sure.Logprob+0.0000138) > 1e-12 {
		t.Errorf("a sure token: %+v", sure)
	}
	// Two alternatives of ½ each (the third floored at -9999): entropy ln 2, margin 0.
	if math.Abs(even.Entropy-math.Ln2) > 1e-6 || even.Margin > 1e-6 || even.Alts != 3 {
		t.Errorf("an even token: %+v", even)
	}
	// Completions: five alternatives of about equal probability, the sampled one not the most
	// probable (vLLM lists the sampled token first).
	comp := sseData(t, "testdata/logprobs_completion.sse")
	ct, _ := scanAllLogprobs(comp[1], false)
	if len(ct) != 1 || ct[0].Alts != 5 || ct[0].Entropy < 1.55 || ct[0].Entropy > math.Log(5) || ct[0].Logprob != -2.1 {
		t.Errorf("a flat completion token: %+v", ct)
	}
	if want := math.Exp(-1.9) - math.Exp(-2.0); math.Abs(ct[0].Margin-want) > 1e-12 {
		t.Errorf("margin %v, want %v (the two most probable, not the first two)", ct[0].Margin, want)
	}
}

func TestLogprobScanShapes(t *testing.T) {
	tok := func(lp string, alts ...string) string {
		var tops []string
		for _, a := range alts {
			tops = append(tops, `{"token":"x","logprob":`+a+`,"bytes":[120]}`)
		}
		return `{"token":"x","logprob":` + lp + `,"bytes":[120],"top_logprobs":[` + strings.Join(tops, ",") + `]}`
	}
	for _, tc := range []struct {
		name      string
		data      string
		body      bool
		tokens    int
		strip     bool
		stripped  string // "" when the same as data
		wantAlts0 int
	}{
		{name: "no logprobs", data: `{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}`},
		{name: "role chunk", data: `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null}]}`},
		{name: "usage chunk", data: `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`},
		{name: "not an object", data: `[1,2]`},
		{name: "done", data: `[DONE]`},
		{name: "chat", data: `{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[` + tok("-0.1", "-0.1", "-2.4") + `]},"finish_reason":null}]}`,
			tokens: 1, strip: true, stripped: `{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}`, wantAlts0: 2},
		{name: "top_logprobs 0", data: `{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":-0.2,"bytes":[120],"top_logprobs":[]}]},"finish_reason":null}]}`,
			tokens: 1, strip: true, stripped: `{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}`},
		{name: "refusal", data: `{"choices":[{"index":0,"delta":{"refusal":"no"},"logprobs":{"content":null,"refusal":[` + tok("-0.5", "-0.5", "-1") + `]},"finish_reason":null}]}`,
			tokens: 1, strip: true, stripped: `{"choices":[{"index":0,"delta":{"refusal":"no"},"logprobs":null,"finish_reason":null}]}`, wantAlts0: 2},
		{name: "index after logprobs", data: `{"choices":[{"logprobs":{"content":[` + tok("-1", "-1", "-1") + `]},"index":3}]}`,
			tokens: 1, strip: true, stripped: `{"choices":[{"logprobs":null,"index":3}]}`, wantAlts0: 2},
		{name: "two choices", data: `{"choices":[{"index":0,"logprobs":{"content":[` + tok("-1", "-1", "-2") + `]}},{"index":1,"logprobs":{"content":[` + tok("-1", "-1", "-3") + `,` + tok("-1", "-1", "-3") + `]}}]}`,
			tokens: 3, strip: true, stripped: `{"choices":[{"index":0,"logprobs":null},{"index":1,"logprobs":null}]}`, wantAlts0: 2},
		{name: "escaped keys", data: `{"ch\u006fices":[{"index":0,"l\u006fgprobs":{"c\u006fntent":[{"t\u006fken":"x","l\u006fgprob":-1,"t\u006fp_logprobs":[{"l\u006fgprob":-1},{"l\u006fgprob":-2}]}]}}]}`,
			tokens: 1, strip: true, stripped: `{"ch\u006fices":[{"index":0,"l\u006fgprobs":null}]}`, wantAlts0: 2},
		{name: "white space", data: " {\n \"choices\" : [ { \"index\" : 0 , \"logprobs\" : { \"content\" : [ " + tok("-1", "-1", "-2") + " ] } } ] } ",
			tokens: 1, strip: true, stripped: " {\n \"choices\" : [ { \"index\" : 0 , \"logprobs\" : null } ] } ", wantAlts0: 2},
		{name: "completions echo", data: `{"choices":[{"index":0,"text":"a b","logprobs":{"text_offset":[0,1],"token_logprobs":[null,-0.7],"tokens":["a"," b"],"top_logprobs":[null,{" b":-0.7," c":-0.9}]}}]}`,
			tokens: 2, strip: true, stripped: `{"choices":[{"index":0,"text":"a b","logprobs":null}]}`},
		{name: "completions top only", data: `{"choices":[{"index":0,"logprobs":{"top_logprobs":[{"a":-0.1,"b":-3}]}}]}`,
			tokens: 1, strip: true, stripped: `{"choices":[{"index":0,"logprobs":null}]}`, wantAlts0: 2},
		{name: "chat body", body: true, data: `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x y"},"logprobs":{"content":[` + tok("-0.1", "-0.1", "-2.4") + `,` + tok("-0.3", "-0.3", "-1.4") + `]},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
			tokens: 2, strip: true, stripped: `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x y"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, wantAlts0: 2},
		{name: "responses body", body: true, data: `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"t"}]},{"type":"message","content":[{"type":"output_text","text":"x","annotations":[],"logprobs":[` + tok("-0.2", "-0.2", "-1.8") + `]}]}],"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2}}`,
			tokens: 1, wantAlts0: 2},
		{name: "responses body as a chunk", data: `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","logprobs":[` + tok("-0.2", "-0.2", "-1.8") + `]}]}]}`},
		{name: "responses completed event", data: `{"type":"response.completed","response":{"output":[{"type":"message","content":[{"type":"output_text","logprobs":[` + tok("-0.2", "-0.2", "-1.8") + `]}]}]}}`},
		{name: "responses default", data: `{"content_index":0,"delta":" blue","item_id":"m","logprobs":[],"output_index":0,"sequence_number":7,"type":"response.output_text.delta"}`},
		{name: "huge and tiny numbers", data: `{"choices":[{"index":0,"logprobs":{"content":[{"logprob":-1e999,"top_logprobs":[{"logprob":-1e999},{"logprob":1e999},{"logprob":-1e-999}]}]}}]}`,
			tokens: 1, strip: true, stripped: `{"choices":[{"index":0,"logprobs":null}]}`, wantAlts0: 3},
		{name: "wrong types", data: `{"choices":[{"index":"0","logprobs":{"content":[{"logprob":"-1","top_logprobs":[{"logprob":null},{"logprob":-1},7]}]}}]}`,
			tokens: 1, strip: true, stripped: `{"choices":[{"index":"0","logprobs":null}]}`, wantAlts0: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, sc := scanAllLogprobs([]byte(tc.data), tc.body)
			if len(got) != tc.tokens {
				t.Fatalf("%d tokens, want %d: %+v", len(got), tc.tokens, got)
			}
			if json.Valid([]byte(tc.data)) && strings.HasPrefix(tc.data, "{") && !strings.Contains(tc.name, "huge") {
				sameTokens(t, got, refTokens(t, []byte(tc.data), tc.body))
			}
			if len(got) > 0 && got[0].Alts != tc.wantAlts0 && tc.wantAlts0 > 0 {
				t.Errorf("first token's alternatives %d, want %d", got[0].Alts, tc.wantAlts0)
			}
			for _, tk := range got {
				checkToken(t, tk)
			}
			if sc.Strippable() != tc.strip {
				t.Fatalf("strippable %v, want %v", sc.Strippable(), tc.strip)
			}
			want := tc.stripped
			if want == "" {
				want = tc.data
			}
			if s := string(sc.AppendStripped(nil, []byte(tc.data))); s != want {
				t.Errorf("stripped\n%s\nwant\n%s", s, want)
			}
		})
	}
}

func checkToken(t *testing.T, tk TokenLogprob) {
	t.Helper()
	if tk.Alts < 0 || math.IsNaN(tk.Entropy) || math.IsNaN(tk.Margin) || tk.Entropy < 0 || tk.Margin < 0 || tk.Margin > 1 ||
		(tk.Alts >= 2 && tk.Entropy > math.Log(float64(tk.Alts))+1e-9) || (tk.Alts < 2 && (tk.Entropy != 0 || tk.Margin != 0)) ||
		tk.Logprob > 0 || tk.Choice < 0 || tk.Choice > MaxN {
		t.Errorf("token out of range: %+v", tk)
	}
}

// TestLogprobEntropyLowerBound checks the bound the estimator is documented with: given the
// k most probable tokens of a distribution, the renormalised entropy never exceeds the
// distribution's own.
func TestLogprobEntropyLowerBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		v := 2 + rng.IntN(300)
		p := make([]float64, v)
		sharp := math.Exp(rng.Float64()*6 - 3)
		var sum float64
		for i := range p {
			p[i] = math.Exp(-sharp * rng.ExpFloat64() * float64(i%17+1))
			sum += p[i]
		}
		var h float64
		for i := range p {
			p[i] /= sum
			if p[i] > 0 {
				h -= p[i] * math.Log(p[i])
			}
		}
		slices.Sort(p)
		slices.Reverse(p)
		k := min(v, 1+rng.IntN(20))
		var a alts
		a.reset()
		for _, x := range p[:k] {
			a.add(math.Log(x))
		}
		var tk TokenLogprob
		a.fill(&tk)
		if tk.Entropy > h+1e-9 {
			t.Fatalf("trial %d: top-%d entropy %v exceeds the distribution's %v", trial, k, tk.Entropy, h)
		}
		if k == v && math.Abs(tk.Entropy-h) > 1e-9 && k >= 2 {
			t.Fatalf("trial %d: all %d tokens given: entropy %v, want %v", trial, k, tk.Entropy, h)
		}
	}
}

func TestLogprobScanNoAllocs(t *testing.T) {
	chunks := sseData(t, "testdata/logprobs_chat.sse")
	var sc LogprobScanner
	var sum float64
	visit := func(tk TokenLogprob) { sum += tk.Entropy }
	buf := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(200, func() {
		for _, d := range chunks {
			sc.ScanChunk(d, visit)
			if sc.Strippable() {
				buf = sc.AppendStripped(buf[:0], d)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per stream", allocs)
	}
	if sum == 0 {
		t.Error("nothing visited")
	}
}

func TestParseRequestLogprobs(t *testing.T) {
	for _, tc := range []struct {
		kind               Kind
		body               string
		asked, named, echo bool
	}{
		{KindChat, `{"messages":[{"role":"user","content":"x"}]}`, false, false, false},
		{KindChat, `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":5}`, true, true, false},
		{KindChat, `{"messages":[{"role":"user","content":"x"}],"logprobs":false}`, false, true, false},
		{KindChat, `{"messages":[{"role":"user","content":"x"}],"logprobs":null}`, false, true, false},
		{KindChat, `{"messages":[{"role":"user","content":"x"}],"top_logprobs":null}`, false, true, false},
		{KindChat, `{"messages":[{"role":"user","content":"x"}],"logprobs":"yes"}`, false, true, false},
		{KindChat, `{"messages":[{"role":"user","content":"x"}],"echo":true}`, false, false, false},
		{KindCompletion, `{"prompt":"x","logprobs":3}`, true, true, false},
		{KindCompletion, `{"prompt":"x","logprobs":0,"echo":true}`, true, true, true},
		{KindCompletion, `{"prompt":"x","logprobs":null}`, false, true, false},
		{KindCompletion, `{"prompt":"x","top_logprobs":3}`, false, false, false},
		{KindResponses, `{"input":"x","top_logprobs":5,"include":["message.output_text.logprobs"]}`, true, true, false},
		{KindResponses, `{"input":"x","include":["reasoning.encrypted_content"]}`, false, false, false},
		{KindResponses, `{"input":"x","include":["message.output_text.logprobs"]}`, true, false, false},
		{KindResponses, `{"input":"x","top_logprobs":0}`, false, true, false},
		{KindResponses, `{"input":"x","logprobs":true}`, false, false, false},
		{KindEmbedding, `{"input":"x","logprobs":true}`, false, false, false},
	} {
		r, err := ParseRequest(tc.kind, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if r.Logprobs != tc.asked || r.LogprobsNamed != tc.named || r.Echo != tc.echo {
			t.Errorf("%v %s: asked %v named %v echo %v, want %v %v %v", tc.kind, tc.body, r.Logprobs, r.LogprobsNamed, r.Echo, tc.asked, tc.named, tc.echo)
		}
	}
}

func FuzzLogprobScan(f *testing.F) {
	for _, file := range []string{"testdata/logprobs_chat.sse", "testdata/logprobs_completion.sse", "testdata/logprobs_responses.sse", "testdata/chat_usage.sse", "testdata/responses_text.sse"} {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				f.Add([]byte(d), false)
			}
		}
	}
	f.Add([]byte(`{"object":"response","output":[{"content":[{"logprobs":[{"logprob":-1,"top_logprobs":[{"logprob":-1},{"logprob":-2}]}]}]}]}`), true)
	f.Add([]byte(`{"choices":[{"logprobs":{"token_logprobs":[-1,null,-2],"top_logprobs":[{"a":-1,"b":-2}]}}]}`), false)
	f.Fuzz(func(t *testing.T, data []byte, body bool) {
		var toks []TokenLogprob
		var sc LogprobScanner
		visit := func(tk TokenLogprob) { toks = append(toks, tk) }
		var n int
		if body {
			n = sc.ScanBody(data, visit)
		} else {
			n = sc.ScanChunk(data, visit)
		}
		if n != len(toks) {
			t.Fatalf("count %d, visits %d", n, len(toks))
		}
		for _, tk := range toks {
			checkToken(t, tk)
		}
		stripped := sc.AppendStripped(nil, data)
		if !sc.Strippable() {
			if !bytes.Equal(stripped, data) {
				t.Fatal("nothing to strip, yet the data changed")
			}
			return
		}
		if json.Valid(data) && !json.Valid(stripped) {
			t.Fatalf("stripping broke valid JSON:\n%s\n%s", data, stripped)
		}
		var again LogprobScanner
		if body {
			again.ScanBody(stripped, nil)
		} else {
			again.ScanChunk(stripped, nil)
		}
		if again.Strippable() {
			t.Fatalf("still strippable after stripping:\n%s", stripped)
		}
	})
}

// benchChatChunk is a vLLM chat chunk of one token with top_logprobs 5 (bytes included).
func benchChatChunk(tokens int) []byte {
	words := []string{" blue", " sky", " river", " stone", " quiet", " early"}
	var b strings.Builder
	b.WriteString(`{"id":"chatcmpl-3f2a1b0c9d8e7f6a","object":"chat.completion.chunk","created":1718041200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" blue"},"logprobs":{"content":[`)
	entry := func(w string, lp string) string {
		var bs []string
		for _, c := range []byte(w) {
			bs = append(bs, strconv.Itoa(int(c)))
		}
		return `{"token":"` + w + `","logprob":` + lp + `,"bytes":[` + strings.Join(bs, ",") + `]`
	}
	for i := range tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(entry(words[0], "-0.31326166") + `,"top_logprobs":[`)
		for k, lp := range []string{"-0.31326166", "-1.3132616", "-3.3132617", "-4.0546513", "-5.7715487"} {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(entry(words[k], lp) + `}`)
		}
		b.WriteString(`]}`)
	}
	b.WriteString(`]},"finish_reason":null}]}`)
	return []byte(b.String())
}

// BenchmarkLogprobScan is the cost per token of reading logprobs (top_logprobs 5, vLLM's
// shape with bytes): one token a chunk as streamed, a 256-token body, and a chunk read and
// stripped (what a sampled stream costs).
func BenchmarkLogprobScan(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tokens int
		strip  bool
	}{{"chunk", 1, false}, {"chunk_strip", 1, true}, {"body256", 256, false}} {
		b.Run(bc.name, func(b *testing.B) {
			data := benchChatChunk(bc.tokens)
			var sc LogprobScanner
			var sum float64
			visit := func(tk TokenLogprob) { sum += tk.Entropy + tk.Margin }
			buf := make([]byte, 0, len(data))
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if sc.ScanBody(data, visit) != bc.tokens {
					b.Fatal("tokens missed")
				}
				if bc.strip {
					buf = sc.AppendStripped(buf[:0], data)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*bc.tokens), "ns/token")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*bc.tokens), "cpu-ns/token")
			if sum == 0 {
				b.Fatal("nothing read")
			}
		})
	}
}

func TestParseDecimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cases := []string{"0", "-0", "-0.0", "-9999.0", "-9999", "-1.2e-05", "-1.2E-5", "-0.31326165795326233", "-1e-22", "-12345678901234567890",
		"-0.000000000000000000000000001", "-5e+2", "-1e22", "-1e23", "-1e-23", "-123.456e-7", "-0.1e1", "-99999999999999999999.5"}
	for range 5000 {
		v := -math.Exp(rng.NormFloat64() * 6)
		cases = append(cases, strconv.FormatFloat(v, 'g', -1, 64), strconv.FormatFloat(float64(float32(v)), 'g', -1, 64),
			strconv.FormatFloat(v, 'f', -1, 64), strconv.FormatFloat(v, 'e', 3, 64))
	}
	// What model servers write is read by the fast path.
	for _, c := range []string{"-9999.0", "-1.2e-05", "-0.31326165795326233", "-0.0031", "-12.5", "0", "-3.0517578125e-05"} {
		if _, ok := parseDecimal([]byte(c)); !ok {
			t.Errorf("%s: not on the fast path", c)
		}
	}
	for _, c := range cases {
		want, err := strconv.ParseFloat(c, 64)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := parseDecimal([]byte(c))
		if !ok {
			continue // ParseFloat reads it
		}
		if math.Abs(got-want) > 1e-14*math.Abs(want) {
			t.Errorf("%s: %v, want %v", c, got, want)
		}
	}
}
