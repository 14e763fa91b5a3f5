package shadow

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/test/sim"
)

func startSim(t testing.TB, cfg sim.Config) string {
	t.Helper()
	s := sim.New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return ts.URL
}

func postRaw(t testing.TB, url, path string, body []byte) []byte {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s %v", resp.StatusCode, b, err)
	}
	return b
}

// direct is the confidence of an answer's first choice read by the scanner itself.
func direct(raw []byte, sse bool) Confidence {
	var sc openai.LogprobScanner
	n, low := 0, 0
	sum := 0.0
	visit := func(t openai.TokenLogprob) {
		if t.Choice == 0 && t.HasAlts() {
			n++
			sum += t.Entropy
			if t.Margin < LowMarginBelow {
				low++
			}
		}
	}
	if !sse {
		sc.ScanBody(raw, visit)
	} else {
		for _, line := range strings.Split(string(raw), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				sc.ScanChunk([]byte(d), visit)
			}
		}
	}
	if n == 0 {
		return Confidence{}
	}
	return Confidence{Tokens: n, MeanEntropy: sum / float64(n), LowMargin: float64(low) / float64(n)}
}

func TestAnswerConfidence(t *testing.T) {
	url := startSim(t, sim.Config{LogprobTemperature: 1.5, TokensPerEvent: 2})
	chat := `{"model":"sim-llama","messages":[{"role":"user","content":"name three rivers"}],"max_tokens":60,"logprobs":true,"top_logprobs":5`
	comp := `{"model":"sim-llama","prompt":"three rivers are","max_tokens":60,"logprobs":5`
	for _, tc := range []struct {
		name, path, body string
		sse              bool
	}{
		{"chat body", "/v1/chat/completions", chat + `}`, false},
		{"chat stream", "/v1/chat/completions", chat + `,"stream":true}`, true},
		{"completions body", "/v1/completions", comp + `}`, false},
		{"completions stream", "/v1/completions", comp + `,"stream":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := postRaw(t, url, tc.path, []byte(tc.body))
			var a Answer
			var err error
			if tc.sse {
				a, err = AnswerFromSSE(raw)
			} else {
				a, err = AnswerFromChat(raw)
			}
			if err != nil {
				t.Fatal(err)
			}
			want := direct(raw, tc.sse)
			if !a.Confidence.Valid() || a.Confidence != want || a.Confidence.Tokens < 30 {
				t.Errorf("confidence %+v, want %+v", a.Confidence, want)
			}
		})
	}
	// Without logprobs: none.
	raw := postRaw(t, url, "/v1/chat/completions", []byte(`{"model":"sim-llama","messages":[{"role":"user","content":"x"}],"stream":true}`))
	if a, err := AnswerFromSSE(raw); err != nil || a.Confidence.Valid() || a.Confidence != (Confidence{}) {
		t.Errorf("%+v %v", a.Confidence, err)
	}
	// A Responses answer: the stream's deltas, the body's output_text parts.
	stream := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"m\",\"output_index\":0,\"content_index\":0,\"delta\":\"a\",\"logprobs\":[{\"token\":\"a\",\"logprob\":-0.7,\"top_logprobs\":[{\"token\":\"a\",\"logprob\":-0.7},{\"token\":\"b\",\"logprob\":-0.7}]}]}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"r\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"a\",\"logprobs\":[{\"token\":\"a\",\"logprob\":-0.7,\"top_logprobs\":[{\"token\":\"a\",\"logprob\":-0.7},{\"token\":\"b\",\"logprob\":-0.7}]}]}]}],\"usage\":{\"output_tokens\":1}}}\n\n"
	a, err := AnswerFromSSE([]byte(stream))
	if err != nil || a.Confidence.Tokens != 1 || math.Abs(a.Confidence.MeanEntropy-math.Ln2) > 1e-3 || a.Confidence.LowMargin != 1 || a.Text != "a" {
		t.Errorf("responses stream: %+v %v", a, err)
	}
	body := `{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"a","logprobs":[{"token":"a","logprob":-0.01,"top_logprobs":[{"token":"a","logprob":-0.01},{"token":"b","logprob":-4.6}]}]}]}],"usage":{"output_tokens":1}}`
	if a, err := AnswerFromChat([]byte(body)); err != nil || a.Confidence.Tokens != 1 || a.Confidence.LowMargin != 0 {
		t.Errorf("responses body: %+v %v", a, err)
	}
}

func TestAskLogprobs(t *testing.T) {
	for _, tc := range []struct {
		kind       openai.Kind
		body, want string
	}{
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, `{"top_logprobs":5,"logprobs":true,"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false}`, ""},
		{openai.KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":null}`, ""},
		{openai.KindCompletion, `{"model":"m","prompt":"x"}`, `{"logprobs":5,"model":"m","prompt":"x"}`},
		{openai.KindCompletion, `{"model":"m","prompt":"x","echo":true}`, ""},
		{openai.KindCompletion, `{"model":"m","prompt":"x","logprobs":1}`, ""},
		{openai.KindResponses, `{"model":"m","input":"x"}`, ""},
		{openai.KindEmbedding, `{"model":"m","input":"x"}`, ""},
	} {
		r, err := openai.ParseRequest(tc.kind, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		body := []byte(tc.body)
		got := AskLogprobs(r, body)
		want := tc.want
		if want == "" {
			want = tc.body
		}
		if string(got) != want || string(body) != tc.body {
			t.Errorf("%s: %s, want %s", tc.body, got, want)
		}
	}
	if got := AskLogprobs(nil, []byte("{}")); string(got) != "{}" {
		t.Errorf("nil request: %s", got)
	}
}

// pairs draws n (reference, candidate) answer entropies: each request its own difficulty
// (shared by both answers, as the same prompt is), each answer its own noise, the candidate
// shifted by shift.
func pairs(rng *rand.Rand, n int, shift float64) [][2]float64 {
	out := make([][2]float64, n)
	for i := range out {
		req := 0.25 * math.Exp(0.6*rng.NormFloat64())
		out[i] = [2]float64{max(0, req+0.1*rng.NormFloat64()), max(0, req+shift+0.1*rng.NormFloat64())}
	}
	return out
}

func TestConfidenceVerdict(t *testing.T) {
	cfg := DefaultConfig()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		name  string
		in    [][2]float64
		shift float64
		want  MetricVerdict
	}{
		{"planted: 0.1 nats less sure", pairs(rng, 200, 0.1), 0.1, Regression},
		{"A/A", pairs(rng, 200, 0), 0, Pass},
		{"significant but within the bound", pairs(rng, 400, 0.02), 0.02, Pass},
		{"surer", pairs(rng, 200, -0.1), -0.1, Pass},
		{"beyond the bound, too noisy", [][2]float64{{0.1, 0.9}, {0.9, 0.1}, {0.2, 0.8}, {0.5, 0.6}, {0.3, 0.9}, {0.8, 0.2}, {0.1, 0.7}, {0.6, 0.1},
			{0.2, 0.5}, {0.4, 0.9}, {0.9, 0.3}, {0.1, 0.6}, {0.3, 0.1}, {0.5, 0.9}, {0.2, 0.9}, {0.7, 0.2}, {0.1, 0.5}, {0.4, 0.3}, {0.2, 0.7}, {0.6, 0.9},
			{0.3, 0.2}, {0.1, 0.8}, {0.8, 0.9}, {0.2, 0.1}, {0.5, 0.8}, {0.3, 0.7}, {0.9, 0.5}, {0.1, 0.4}, {0.6, 0.5}, {0.2, 0.6},
			{0.4, 0.8}, {0.7, 0.9}, {0.1, 0.3}, {0.5, 0.2}, {0.3, 0.8}, {0.8, 0.3}, {0.2, 0.9}, {0.6, 0.8}, {0.1, 0.9}, {0.4, 0.1},
			{0.9, 0.8}, {0.3, 0.6}, {0.5, 0.1}, {0.2, 0.4}, {0.7, 0.8}, {0.1, 0.2}, {0.6, 0.4}, {0.4, 0.7}, {0.8, 0.5}, {0.3, 0.5}}, 0.1, Inconclusive},
		{"too few pairs", pairs(rng, 20, 0.5), 0.5, NotExercised},
		{"none", nil, 0, Skipped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Primary: Arm{Requests: 60}, Candidate: Arm{Requests: 60}, Confidence: PairedConfidence{Entropy: tc.in}}
			v, err := Evaluate(cfg, in)
			if err != nil {
				t.Fatal(err)
			}
			e := evidence(t, v, MetricEntropy)
			if e.Verdict != tc.want {
				t.Fatalf("verdict %s (%+v), want %s", e.Verdict, e, tc.want)
			}
			if tc.want == Regression && (v.Decision != Rollback || !strings.Contains(v.Reason, MetricEntropy)) {
				t.Errorf("decision %s: %s", v.Decision, v.Reason)
			}
			if (tc.want == NotExercised || tc.want == Skipped) && v.Decision == Hold && strings.Contains(v.Reason, MetricEntropy) {
				t.Errorf("a metric too few answers feed holds the decision: %s", v.Reason)
			}
			if judged(e) && tc.want != Inconclusive && (e.EffectLow > tc.shift || e.EffectHigh < tc.shift) {
				t.Errorf("interval [%v, %v] misses the planted %v", e.EffectLow, e.EffectHigh, tc.shift)
			}
			if lm := evidence(t, v, MetricLowMargin); lm.Verdict != Skipped {
				t.Errorf("low margin without data: %s", lm.Verdict)
			}
		})
	}
	bad := DefaultConfig()
	bad.MaxEntropyIncrease, bad.MaxLowMarginIncrease = -1, 2
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "max_entropy_increase") || !strings.Contains(err.Error(), "max_low_margin_increase") {
		t.Errorf("%v", err)
	}
}

// TestConfidencePower: how often the paired test calls a regression on a candidate less
// sure by 0 (A/A), 0.05 (the default bound), 0.075 and 0.1 nats, and how often its p alone is
// below α (`go test -run TestConfidencePower -v ./shadow/`: 1000 windows a row, α = 0.01;
// each request its own difficulty, lognormal around 0.25 nats with σ = 0.6, shared by both
// answers, each answer its own noise of 0.1 nats).
func TestConfidencePower(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	cfg := DefaultConfig()
	for _, n := range []int{50, 100, 200} {
		for _, shift := range []float64{0, 0.05, 0.075, 0.1} {
			rejected, significant := 0, 0
			for range 1000 {
				e := pairedShift(cfg, MetricEntropy, pairs(rng, n, shift), cfg.MaxEntropyIncrease)
				if e.Verdict == Regression {
					rejected++
				}
				if e.P < cfg.Alpha {
					significant++
				}
			}
			rate := float64(rejected) / 1000
			t.Logf("| %d | %+.3f | %.3f | %.3f |", n, shift, float64(significant)/1000, rate)
			switch {
			case shift == 0 && (rejected > 10 || significant > 25): // at most α of A/A windows
				t.Errorf("A/A: %d regressions, %d significant in 1000 windows of %d pairs", rejected, significant, n)
			case shift == 0.1 && rate < 0.99:
				t.Errorf("0.1 nats less sure caught in %.3f of windows of %d pairs", rate, n)
			}
		}
	}
}

// sendBoth asks the baseline and the candidate the same copy, as the mirror does, and
// returns their answers.
func sendBoth(t *testing.T, base, cand string, body []byte) (Answer, Answer) {
	t.Helper()
	r, err := openai.ParseRequest(openai.KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	body = AskLogprobs(r, body)
	var out [2]Answer
	for i, url := range []string{base, cand} {
		a, err := AnswerFromSSE(postRaw(t, url, "/v1/chat/completions", body))
		if err != nil {
			t.Fatal(err)
		}
		a.Status = 200
		out[i] = a
	}
	return out[0], out[1]
}

// TestConfidenceTriples runs triples through the comparison: a candidate planted less sure
// of itself (the simulator's LogprobTemperature) is a regression on both confidence metrics;
// an A/A candidate (the baseline's version, its own sampling) raises none.
func TestConfidenceTriples(t *testing.T) {
	primary := startSim(t, sim.Config{Seed: 1})
	for _, tc := range []struct {
		name string
		temp float64
		want MetricVerdict
	}{
		{"less confident candidate", 1.6, Regression},
		{"A/A", 1, Pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startSim(t, sim.Config{Seed: 2})
			cand := startSim(t, sim.Config{Seed: 3, LogprobTemperature: tc.temp})
			acc := NewAccumulator(500)
			cache := NewSchemaCache(8)
			for i := range 80 {
				// temperature without a seed: each server samples its own answer, so the
				// A/A answers differ as two runs of one model do.
				body := []byte(fmt.Sprintf(`{"model":"sim-llama","messages":[{"role":"user","content":"question %d"}],"max_tokens":40,"temperature":0.8,"stream":true}`, i))
				b, c := sendBoth(t, base, cand, body)
				p, err := AnswerFromSSE(postRaw(t, primary, "/v1/chat/completions", body))
				if err != nil {
					t.Fatal(err)
				}
				p.Status = 200
				if p.Confidence.Valid() {
					t.Fatal("the primary was not asked for logprobs")
				}
				acc.Add(cache.CompareTriple(Request{}, p, &b, c))
			}
			in := acc.Input()
			if len(in.Confidence.Entropy) != 80 {
				t.Fatalf("%d confidence pairs", len(in.Confidence.Entropy))
			}
			v, err := Evaluate(DefaultConfig(), in)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{MetricEntropy, MetricLowMargin} {
				e := evidence(t, v, m)
				if e.Verdict != tc.want || e.Reference != "baseline" {
					t.Errorf("%s: %s (%+v)", m, e.Verdict, e)
				}
				t.Logf("%s: baseline %.4f candidate %.4f effect %s p %.2g", m, e.Primary, e.Cand, formatEffect(e), e.P)
			}
			if tc.want == Regression && (v.Decision != Rollback || !strings.Contains(v.Reason, MetricEntropy)) {
				t.Errorf("decision %s: %s", v.Decision, v.Reason)
			}
			if tc.want == Pass && strings.Contains(v.Reason, "entropy") {
				t.Errorf("A/A: %s", v.Reason)
			}
		})
	}
}

func TestConfidenceReport(t *testing.T) {
	e := Evidence{Metric: MetricEntropy, Test: StatWilcoxon, Verdict: Regression, Effect: 0.12, EffectLow: 0.1, EffectHigh: 0.14,
		Bound: 0.05, Primary: 0.25, Cand: 0.37, P: 1e-6}
	if got := formatEffect(e); got != "+0.120 nats [+0.100, +0.140]" {
		t.Errorf("effect %q", got)
	}
	if got := formatBound(e); got != "0.050 nats" {
		t.Errorf("bound %q", got)
	}
	if got := formatValue(e, e.Cand); got != "0.370 nats" {
		t.Errorf("value %q", got)
	}
	lm := Evidence{Metric: MetricLowMargin, Test: StatWilcoxon, Verdict: Pass, Effect: 0.01, EffectLow: 0, EffectHigh: 0.02, Bound: 0.02}
	if got := formatEffect(lm); got != "+1.00pp [+0.00, +2.00]" {
		t.Errorf("effect %q", got)
	}
}
