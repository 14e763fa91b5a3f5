package guard

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// nested returns message content whose depth is d (a JSON array text nested d-1 deep).
func nested(d int) string {
	return strings.Repeat("[", d-1) + "1" + strings.Repeat("]", d-1)
}

func TestShapeSignals(t *testing.T) {
	tests := []struct {
		name   string
		p      Params
		r      func(t *testing.T) *policy.Request
		status int
		code   policy.Class
		msg    []string
	}{
		{"depth below", Params{}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, nested(63)) }, 0, "", nil},
		{"depth at", Params{}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, nested(64)) }, 0, "", nil},
		{"depth above", Params{}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, nested(65)) },
			400, CodePromptTooDeep, []string{"nested 65 levels deep", "limit is 64"}},
		{"depth in prose", Params{}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, "Process this: "+nested(65)+" thanks") },
			400, CodePromptTooDeep, []string{"nested 65 levels deep", "limit is 64"}},
		{"depth custom limit", Params{MaxDepth: 2}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, nested(3)) },
			400, CodePromptTooDeep, []string{"nested 3 levels", "limit is 2"}},
		{"depth disabled", Params{Disable: []string{SignalDepth}}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, nested(30)) }, 0, "", nil},
		{"messages below", Params{MaxMessages: 3}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, "x", "y") }, 0, "", nil},
		{"messages at", Params{MaxMessages: 3}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, "x", "y", "z") }, 0, "", nil},
		{"messages above", Params{MaxMessages: 3}, func(t *testing.T) *policy.Request { return chat(t, "a", 0, "x", "y", "z", "w") },
			400, CodeTooManyMessages, []string{"4 messages", "limit is 3"}},
		{"messages off by default", Params{}, func(t *testing.T) *policy.Request {
			return chat(t, "a", 0, strings.Split(strings.Repeat("x,", 500), ",")[:500]...)
		}, 0, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, tc.p, newClock())
			d := admit(t, g, tc.r(t))
			if tc.code == "" {
				if d.Reject != nil {
					t.Fatalf("rejected: %v", d.Reject)
				}
				d.Done(ok200)
				return
			}
			wantReject(t, d, tc.status, tc.code, tc.msg...)
			if got := g.Stats().Rejected[tc.code]; got != 1 {
				t.Errorf("Stats().Rejected[%s] = %d, want 1", tc.code, got)
			}
		})
	}
}

func TestRepetition(t *testing.T) {
	unique := chat(t, "a", 0, words(400, 1))
	para := words(40, 2)
	repeated := chat(t, "a", 0, strings.TrimSpace(strings.Repeat(para+" ", 10)))
	p := Params{MaxRepetition: 0.5, RepetitionMinWords: 50}
	var pt promptText
	extractText(repeated.Kind, repeated.Body, &pt)
	rep := repetition(pt.segs, 8, 50, 32<<10)
	if rep < 0.85 || rep > 0.95 {
		t.Fatalf("repetition of a paragraph pasted 10 times = %.3f, want about 0.9", rep)
	}
	pt = promptText{}
	extractText(unique.Kind, unique.Body, &pt)
	if u := repetition(pt.segs, 8, 50, 32<<10); u != 0 {
		t.Fatalf("repetition of distinct words = %.3f, want 0", u)
	}
	tests := []struct {
		name   string
		limit  float64
		r      *policy.Request
		reject bool
	}{
		{"unique text", 0.5, unique, false},
		{"below", rep + 0.01, repeated, false},
		{"at", rep, repeated, false},
		{"above", rep - 0.01, repeated, true},
		{"short prompts are not measured", 0.01, chat(t, "a", 0, strings.Repeat("spam ", 40)), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p.MaxRepetition = tc.limit
			g := newGuard(t, p, newClock())
			d := admit(t, g, tc.r)
			if !tc.reject {
				if d.Reject != nil {
					t.Fatalf("rejected: %v", d.Reject)
				}
				return
			}
			wantReject(t, d, 400, CodeRepetitive, fmt.Sprintf("%.0f%%", 100*rep), "8-word", fmt.Sprintf("limit is %.0f%%", 100*tc.limit))
		})
	}
}

func TestRepetitionSampled(t *testing.T) {
	// A 400 KB prompt: distinct text with one paragraph pasted many times at its end. Only
	// 32 KB are read, and the repetition is still seen.
	text := words(30000, 3) + " " + strings.Repeat(words(50, 4)+" ", 600)
	r := chat(t, "a", 0, text)
	var pt promptText
	extractText(r.Kind, r.Body, &pt)
	rep := repetition(pt.segs, 8, 50, 32<<10)
	if rep < 0.3 {
		t.Fatalf("sampled repetition = %.3f, want the repeated half seen", rep)
	}
	if u := repetition([]segment{{b: []byte(words(60000, 5))}}, 8, 50, 32<<10); u != 0 {
		t.Fatalf("sampled repetition of distinct text = %.3f", u)
	}
}

func TestPromptTokens(t *testing.T) {
	r := chat(t, "a", 0, prose(1000))
	exact := exactOf(t, r)
	if exact == r.PromptTokens {
		t.Fatalf("exact %d equals the estimate; the test needs them apart", exact)
	}
	tests := []struct {
		name      string
		limit     int
		reject    bool
		exactRuns uint64
		shown     int
	}{
		{"far below: estimate", r.PromptTokens * 3, false, 0, 0},
		{"below: exact", exact + 1, false, 1, 0},
		{"at: exact", exact, false, 1, 0},
		{"above: exact", exact - 1, true, 1, exact},
		{"far above: estimate", r.PromptTokens / 3, true, 0, r.PromptTokens},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, Params{MaxPromptTokens: tc.limit}, newClock())
			d := admit(t, g, r)
			if got := g.Stats().ExactCounts; got != tc.exactRuns {
				t.Errorf("exact counts = %d, want %d", got, tc.exactRuns)
			}
			if !tc.reject {
				if d.Reject != nil {
					t.Fatalf("rejected: %v", d.Reject)
				}
				return
			}
			wantReject(t, d, http.StatusRequestEntityTooLarge, CodePromptTooLarge,
				fmt.Sprintf("prompt is %d tokens, the route's limit is %d", tc.shown, tc.limit))
		})
	}
}

func TestExactSkippedWhenBusy(t *testing.T) {
	r := chat(t, "a", 0, prose(1000))
	g := newGuard(t, Params{MaxPromptTokens: r.PromptTokens - 1, ExactConcurrency: 1}, newClock())
	g.exactSem <- struct{}{} // the one slot is taken
	d := admit(t, g, r)
	<-g.exactSem
	wantReject(t, d, 413, CodePromptTooLarge, fmt.Sprintf("prompt is %d tokens", r.PromptTokens))
	if s := g.Stats(); s.ExactCounts != 0 || s.ExactSkipped != 1 {
		t.Fatalf("stats %+v, want one skipped exact count", s)
	}
}

func TestContextWindow(t *testing.T) {
	r0 := chat(t, "a", 0, prose(1000))
	exact := exactOf(t, r0)
	const window = 8000
	p := Params{ContextWindows: map[string]int{"m*": window, "other": 100}}
	tests := []struct {
		name      string
		maxTokens int
		reject    bool
		msg       []string
	}{
		{"no max_tokens: prompt only", 0, false, nil},
		{"below", window - exact - 1, false, nil},
		{"at", window - exact, false, nil},
		{"above", window - exact + 1, true, []string{fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", window, window+1, exact, window-exact+1)}},
		{"max_tokens alone", window, true, []string{fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested", window)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, p, newClock())
			d := admit(t, g, chat(t, "a", tc.maxTokens, prose(1000)))
			if !tc.reject {
				if d.Reject != nil {
					t.Fatalf("rejected: %v", d.Reject)
				}
				return
			}
			wantReject(t, d, 400, CodeContextLength, tc.msg...)
			if d.Reject.Param != "messages" {
				t.Errorf("param %q, want messages", d.Reject.Param)
			}
		})
	}
	t.Run("prompt alone over the window", func(t *testing.T) {
		g := newGuard(t, Params{ContextWindow: exact - 1}, newClock())
		wantReject(t, admit(t, g, r0), 400, CodeContextLength, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", exact-1, exact))
	})
	t.Run("advertised window wins over the defaults", func(t *testing.T) {
		// The built-in table says 8192 for *llama-3-*; the server advertises 32768.
		g := newGuard(t, Params{}, newClock())
		r := chat(t, "a", 12000, prose(1000))
		r.Model = "meta-llama-3-8b"
		wantReject(t, admit(t, g, r), 400, CodeContextLength, "maximum context length is 8192 tokens")
		r = chat(t, "a", 12000, prose(1000))
		r.Model, r.ContextWindow = "meta-llama-3-8b", 32768
		if d := admit(t, g, r); d.Reject != nil {
			t.Fatalf("advertised 32768: rejected %v", d.Reject)
		}
		r = chat(t, "a", 40000, prose(1000))
		r.Model, r.ContextWindow = "meta-llama-3-8b", 32768
		wantReject(t, admit(t, g, r), 400, CodeContextLength, "maximum context length is 32768 tokens")
		// The operator's per-model window still wins over what the server says.
		g = newGuard(t, Params{ContextWindows: map[string]int{"*llama-3-*": 16000}}, newClock())
		r = chat(t, "a", 20000, prose(1000))
		r.Model, r.ContextWindow = "meta-llama-3-8b", 32768
		wantReject(t, admit(t, g, r), 400, CodeContextLength, "maximum context length is 16000 tokens")
	})
	t.Run("lookup order", func(t *testing.T) {
		g := newGuard(t, Params{ContextWindow: 5000, ContextWindows: map[string]int{"llama-*": 9000, "llama-3.1-*": 100000, "gpt-4o-mini": 0}}, newClock())
		for model, want := range map[string]int{"llama-3-8b": 9000, "LLaMA-3.1-70b": 100000, "mistral": 5000, "gpt-4o-mini": 0} {
			if got := g.ContextWindow(model); got != want {
				t.Errorf("ContextWindow(%q) = %d, want %d", model, got, want)
			}
		}
		d := newGuard(t, Params{}, newClock())
		for model, want := range map[string]int{"gpt-4o-2024-08-06": 128000, "gpt-4": 8192, "gpt-4-32k-0613": 32768,
			"meta-llama/Llama-3.1-8B-Instruct": 131072, "unknown-model": 0} {
			if got := d.ContextWindow(model); got != want {
				t.Errorf("default ContextWindow(%q) = %d, want %d", model, got, want)
			}
		}
		if e := d.Encoding("gpt-4o-mini"); e != "o200k_base" {
			t.Errorf("Encoding(gpt-4o-mini) = %s", e)
		}
		if e := d.Encoding("llama-3"); e != "cl100k_base" {
			t.Errorf("Encoding(llama-3) = %s", e)
		}
	})
}

// feed admits n requests of about tokens each and settles them with o.
func feed(t *testing.T, g *Guard, n, tokens int, o policy.Outcome) {
	t.Helper()
	r := chat(t, "feeder", 0, prose(tokens))
	for range n {
		admitOK(t, g, r, o)
	}
}

func TestSurge(t *testing.T) {
	clk := newClock()
	p := Params{SurgeMinRequests: 20, SurgeWindow: policy.Duration(time.Minute), SurgeBuckets: 6,
		SurgeFloorTokens: 1, Disable: []string{SignalBreaker}}
	g := newGuard(t, p, clk)
	big := chat(t, "feeder", 0, prose(2000))

	// Warm-up: 19 prompts in the window, the signal does not apply.
	feed(t, g, 19, 100, ok200)
	admitOK(t, g, big, policy.Outcome{Status: 500, ErrorClass: "upstream_5xx"})  // not fed: it failed
	feed(t, g, 1, 100, policy.Outcome{Status: 499, ErrorClass: "client_cancel"}) // not fed
	if _, n := baselineOf(g, "feeder", clk.Now()); n != 19 {
		t.Fatalf("baseline holds %d prompts, want 19 (only successes)", n)
	}
	// The 20th success ends the warm-up.
	feed(t, g, 1, 100, ok200)
	p95, _ := baselineOf(g, "feeder", clk.Now())
	small := chat(t, "feeder", 0, prose(100))
	if p95 < small.PromptTokens || p95 > small.PromptTokens*5/4 {
		t.Fatalf("p95 = %d, want about %d", p95, small.PromptTokens)
	}
	d := admit(t, g, big)
	limit := int(3 * float64(p95))
	wantReject(t, d, 413, CodeSurge, fmt.Sprintf("prompt is %d tokens, the surge limit is %d (3 × the p95 of this tenant's recent prompts on the route, %d tokens, and never below 1)", big.PromptTokens, limit, p95))
	// Rejections do not feed the baseline: a burst cannot raise its own limit.
	for range 50 {
		wantReject(t, admit(t, g, big), 413, CodeSurge)
	}
	if _, n := baselineOf(g, "feeder", clk.Now()); n != 20 {
		t.Fatalf("baseline holds %d prompts after rejections, want 20", n)
	}
	// At and just below the limit pass (exact count near the limit: pick sizes by it).
	admitOK(t, g, small, ok200)

	// Sliding: half the window later the old prompts are still in; after the whole window
	// they have expired and the warm-up starts again.
	clk.Advance(30 * time.Second)
	wantReject(t, admit(t, g, big), 413, CodeSurge)
	clk.Advance(31 * time.Second)
	if _, n := baselineOf(g, "feeder", clk.Now()); n != 0 {
		t.Fatalf("baseline holds %d prompts after the window, want 0", n)
	}
	admitOK(t, g, big, ok200)
}

func TestSurgeAtLimit(t *testing.T) {
	clk := newClock()
	g := newGuard(t, Params{SurgeMinRequests: 10, SurgeFloorTokens: 1, Disable: []string{SignalBreaker}}, clk)
	feed(t, g, 10, 300, ok200)
	p95, _ := baselineOf(g, "feeder", clk.Now())
	limit := 3 * p95
	// Prompts whose exact count is just below, at and just above the limit: each word of
	// prose is one cl100k token, so a few corrections of the word count land on it.
	sized := func(target int) *policy.Request {
		k := target
		for range 8 {
			r := chat(t, "feeder", 0, prose(k))
			e := exactOf(t, r)
			if e == target {
				return r
			}
			k += target - e
		}
		t.Fatalf("no prompt of exactly %d tokens", target)
		return nil
	}
	below, at, above := sized(limit-1), sized(limit), sized(limit+1)
	admitOK(t, g, below, policy.Outcome{Status: 400}) // settle without feeding
	admitOK(t, g, at, policy.Outcome{Status: 400})
	wantReject(t, admit(t, g, above), 413, CodeSurge, fmt.Sprintf("surge limit is %d", limit))
}

func TestHistogramBins(t *testing.T) {
	prev := -1
	for v := range 1 << 16 {
		b := binOf(v)
		if b < prev {
			t.Fatalf("binOf(%d) = %d < %d", v, b, prev)
		}
		prev = b
		if up := binUpper(b); v > up || (b > 0 && v <= binUpper(b-1)) {
			t.Fatalf("v %d in bin %d with upper %d (previous upper %d)", v, b, up, binUpper(b-1))
		}
		if v >= 8 && float64(binUpper(b)) > 1.25*float64(v)+1 {
			t.Fatalf("bin of %d too wide: upper %d", v, binUpper(b))
		}
	}
	if binOf(1<<40) != numBins-1 || binOf(-3) != 0 {
		t.Fatal("out of range values not clamped")
	}
}

func TestExtractText(t *testing.T) {
	body := `{"model":"m","messages":[
		{"role":"system","content":"Be \"brief\".\nOK"},
		{"role":"user","\u0063ontent":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"http://x/y.png"}},{"type":"text","refusal":"no"}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"get","arguments":"{\"q\":1}"}}]},
		{"role":"tool","content":"42","tool_call_id":"1"}],
		"tools":[{"type":"function","function":{"name":"get"}}],"temperature":0.5}`
	r := request(t, openai.KindChat, "a", body)
	var pt promptText
	extractText(r.Kind, r.Body, &pt)
	var got []string
	chars := 0
	for _, s := range pt.segs {
		if s.esc {
			got = append(got, string(unescape(nil, s.b)))
		} else {
			got = append(got, string(s.b))
		}
		chars += len([]rune(got[len(got)-1]))
	}
	want := []string{"Be \"brief\".\nOK", "look", "no", "get", `{"q":1}`, "42", `[{"type":"function","function":{"name":"get"}}]`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("segments\n got %q\nwant %q", got, want)
	}
	if chars != r.PromptChars {
		t.Errorf("extracted %d characters, ParseRequest counted %d", chars, r.PromptChars)
	}

	c := request(t, openai.KindCompletion, "a", `{"model":"m","prompt":[[1,2,3],[4,5]]}`)
	pt = promptText{}
	extractText(c.Kind, c.Body, &pt)
	if pt.tokenIDs != 5 || len(pt.segs) != 0 {
		t.Fatalf("token-ID prompt: %+v", pt)
	}
	e := request(t, openai.KindEmbedding, "a", `{"model":"m","input":["a b","c\u00e9"]}`)
	pt = promptText{}
	extractText(e.Kind, e.Body, &pt)
	if len(pt.segs) != 2 || string(unescape(nil, pt.segs[1].b)) != "cé" {
		t.Fatalf("embedding inputs: %v", pt.segs)
	}
	// The Responses API: instructions, input items, tools; the same characters ParseRequest counts.
	rs := request(t, openai.KindResponses, "a", `{"model":"m","instructions":"Be brief.","input":[
		{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"http://x/y.png"}]},
		{"type":"function_call","call_id":"c1","name":"get","arguments":"{\"q\":1}"},
		{"type":"function_call_output","call_id":"c1","output":"42"},
		{"role":"assistant","content":"ok"}],
		"tools":[{"type":"function","name":"get","parameters":{}}]}`)
	pt = promptText{}
	extractText(rs.Kind, rs.Body, &pt)
	got, chars = nil, 0
	for _, s := range pt.segs {
		v := string(s.b)
		if s.esc {
			v = string(unescape(nil, s.b))
		}
		got = append(got, v)
		chars += len([]rune(v))
	}
	want = []string{"Be brief.", "look", "get", `{"q":1}`, "42", "ok", `[{"type":"function","name":"get","parameters":{}}]`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Responses segments\n got %q\nwant %q", got, want)
	}
	if chars != rs.PromptChars {
		t.Errorf("Responses: extracted %d characters, ParseRequest counted %d", chars, rs.PromptChars)
	}
	if s := string(unescape(nil, []byte(`a\ud83d\ude00b\u00`))); s != "a😀b\\u00" {
		t.Fatalf("unescape = %q", s)
	}
}

func TestEncoderConcurrent(t *testing.T) {
	tk, err := encoder("cl100k_base")
	if err != nil {
		t.Fatal(err)
	}
	text := prose(300)
	want := len(tk.EncodeOrdinary(text))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				if got := len(tk.EncodeOrdinary(text)); got != want {
					t.Errorf("concurrent encode: %d tokens, want %d", got, want)
				}
			}
		})
	}
	wg.Wait()
	if _, err := encoder("nope"); err == nil {
		t.Fatal("unknown encoding accepted")
	}
}

func TestDoneSettlesOnce(t *testing.T) {
	clk := newClock()
	g := newGuard(t, Params{}, clk)
	r := chat(t, "a", 0, "hi")
	d := admit(t, g, r)
	if g.Stats().InFlight != 1 {
		t.Fatal("not in flight")
	}
	d.Done(ok200)
	d.Done(ok200)
	if s := g.Stats(); s.InFlight != 0 || s.Admitted != 1 {
		t.Fatalf("stats %+v", s)
	}
	if _, n := baselineOf(g, "a", clk.Now()); n != 1 {
		t.Fatalf("baseline fed %d times, want 1", n)
	}
	// Requests the guard does not inspect pass untouched.
	other := &policy.Request{Request: &openai.Request{Kind: openai.KindModels}}
	if d := admit(t, g, other); d.Reject != nil || d.Done != nil {
		t.Fatalf("models request: %+v", d)
	}
}

func TestValidate(t *testing.T) {
	if err := (Params{}).Validate(); err != nil {
		t.Fatalf("zero params: %v", err)
	}
	if err := Defaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := Params{
		MaxPromptTokens: -1, ContextWindow: -2, ContextWindows: map[string]int{"": 5, "x": -1},
		MaxDepth: -1, MaxMessages: -1, MaxRepetition: 1.5, RepetitionNgram: 100, RepetitionSampleBytes: 10,
		SurgeFactor: 0.5, SurgeWindow: -1, SurgeBuckets: -1, SurgeMinRequests: -1, SurgeFloorTokens: -1, SurgeMaxBaselines: -1,
		ExactMargin: 2, ExactConcurrency: -1,
		Encodings: map[string]string{"gpt*": "nope"}, Disable: []string{"sizes"},
		Breaker: BreakerParams{Anonymous: "sometimes", Window: -1, Buckets: 2, BucketPeriod: policy.Duration(time.Second), MinRequests: -1,
			FailureRatio: 1.5, OpenFor: -1, HalfOpenProbes: -1, MaxBreakers: -1},
		Degrade: DegradeParams{Level1MaxTokens: -1, Level1SurgeFactor: 0.5, CoolDown: -1},
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad params accepted")
	}
	for _, want := range []string{"max_prompt_tokens", "context_window must", `context_windows: empty`, `context_windows["x"]`,
		"max_depth", "max_messages", "max_repetition", "repetition_ngram", "repetition_sample_bytes", "surge_factor",
		"surge_window", "surge_buckets", "surge_min_requests", "surge_floor_tokens", "surge_max_baselines", "exact_margin",
		"exact_concurrency", `encodings["gpt*"]`, `breaker.anonymous: unknown mode "sometimes"`,
		`disable: unknown signal "sizes"`, "breaker.window", "buckets or bucket_period", "breaker.min_requests",
		"breaker.failure_ratio", "breaker.open_for", "breaker.half_open_probes", "breaker.max_breakers",
		"degrade.level1_max_tokens", "degrade.level1_surge_factor", "degrade.cool_down", "degrade: set trips_per_minute"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if _, err := New(bad, policy.Env{}); err == nil {
		t.Fatal("New accepted bad params")
	}
}

func TestRegistry(t *testing.T) {
	p, err := policy.Build(policy.Spec{Type: "guard", Params: map[string]any{
		"max_depth": 3, "max_prompt_tokens": 32000, "surge_window": "2m",
		"breaker": map[string]any{"open_for": 10, "min_requests": 20},
		"degrade": map[string]any{"trips_per_minute": 5, "long_context_cluster": "long"},
	}}, policy.Env{Route: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	g, ok := p.(*Guard)
	if !ok {
		t.Fatalf("built %T", p)
	}
	var _ policy.Admitter = g
	gp := g.Params()
	if gp.MaxDepth != 3 || gp.MaxPromptTokens != 32000 || gp.SurgeWindow.D() != 2*time.Minute ||
		gp.Breaker.OpenFor.D() != 10*time.Second || gp.Breaker.MinRequests != 20 || gp.SurgeFactor != 3 ||
		gp.Degrade.CoolDown.D() != 2*time.Minute || gp.Degrade.LongContextCluster != "long" {
		t.Fatalf("params %+v", gp)
	}
	p, err = policy.Build(policy.Spec{Type: "guard", Params: map[string]any{
		"surge_floor_tokens": 4096, "surge_max_baselines": 50, "breaker": map[string]any{"anonymous": "client"},
	}}, policy.Env{Route: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if gp := p.(*Guard).Params(); gp.SurgeFloorTokens != 4096 || gp.SurgeMaxBaselines != 50 || gp.Breaker.Anonymous != AnonymousClient || gp.MaxDepth != 64 {
		t.Fatalf("params %+v", gp)
	}
	if d := Defaults(); d.MaxDepth != 64 || d.SurgeFloorTokens != 32768 || d.SurgeMaxBaselines != 1000 || d.Breaker.Anonymous != AnonymousAuto {
		t.Fatalf("defaults %+v", d)
	}
	for _, params := range []map[string]any{
		{"max_dpth": 3},
		{"breaker": map[string]any{"open": "10s"}},
		{"max_depth": "five"},
		{"surge_floor": 100},
		{"breaker": map[string]any{"anonymous": "sometimes"}},
	} {
		if _, err := policy.Build(policy.Spec{Type: "guard", Params: params}, policy.Env{}); err == nil {
			t.Errorf("params %v accepted", params)
		}
	}
	_, err = policy.Build(policy.Spec{Type: "guard", Params: map[string]any{"max_depth": -1, "surge_factor": 0.1}}, policy.Env{})
	if err == nil || !strings.Contains(err.Error(), "max_depth") || !strings.Contains(err.Error(), "surge_factor") {
		t.Fatalf("invalid params: %v", err)
	}
	if _, err := Default(policy.Env{}); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(Defaults())
	if !strings.Contains(string(b), `"surge_window":"5m0s"`) {
		t.Errorf("defaults JSON: %s", b)
	}
}

func TestConcurrentUse(t *testing.T) {
	clk := newClock()
	p := breakerParams()
	p.MaxRepetition = 0.9
	p.RepetitionMinWords = 10
	p.SurgeMinRequests = 5
	p.Degrade = DegradeParams{TripsPerMinute: 1, SaturationInflight: 3, Level1MaxTokens: 64}
	g := newGuard(t, p, clk)
	g.SetPriorities(map[string]int{"t0": 2})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			tenant := fmt.Sprintf("t%d", w)
			for i := range 200 {
				r := chat(t, tenant, 100, prose(50+i%7))
				if i%10 == w {
					r = deep(t, tenant)
				}
				d := admit(t, g, r)
				if d.Reject == nil {
					if i%2 == 0 {
						d.Done(ok200) // twice: the second is a no-op
					}
					d.Done(ok200)
				}
				if i%50 == 0 {
					clk.Advance(time.Second)
					g.Snapshot()
					g.Stats()
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			g.ResetTenant("t1")
			g.SetPriorities(map[string]int{"t1": 3})
			time.Sleep(time.Millisecond)
		}
	})
	wg.Wait()
	if s := g.Stats(); s.InFlight != 0 {
		t.Fatalf("in flight %d after all settled", s.InFlight)
	}
}

// TestWindowMemo: the memo answers as the lookups it saves, whatever the order and number of
// models (more than its slots, so that slots are taken over), for names too long to keep,
// and from several goroutines at once.
func TestWindowMemo(t *testing.T) {
	cfg := []pattern[int]{{"m*", 1000}, {"other", 100}, {"*llama-3.1*", 7}}
	models := []string{"gpt-4o", "gpt-4", "meta-llama-3.1-8b", "m1", "other", "sim-llama", "", "GPT-4O-MINI",
		"Meta-Llama-3-70B", "o3-mini", strings.Repeat("x", maxMemoModel+1), strings.Repeat("m", maxMemoModel+5)}
	for i := range 40 {
		models = append(models, fmt.Sprintf("model-%d", i))
	}
	var m windowMemo
	m.seed = maphash.MakeSeed()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for round := range 5 {
				for i := range models {
					model := models[(i*(w+1)+round)%len(models)]
					got := m.get(model, cfg)
					cv, cok := lookup(cfg, model)
					bv, _ := lookup(builtinContextWindows, model)
					if got.cfg != cv || got.cfgOK != cok || got.builtin != bv {
						t.Errorf("%q: memo %+v, lookups %d %v %d", model, got, cv, cok, bv)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for i := range m.slots {
		if h := m.slots[i].Load(); h != nil && len(h.model) > maxMemoModel {
			t.Errorf("a model of %d bytes is kept", len(h.model))
		}
	}
}
