package shadow

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// triples simulates n mirrored requests as production sees them: each request has its own
// size (a prompt-length factor shared by its three answers), the primary runs hot (hot× the
// sandboxes' latencies: it also serves unmirrored traffic), and the baseline and the
// candidate answer the same copy at the same moment with their own noise. ttft and e2e
// scale the candidate's medians.
func triples(seed uint64, n int, hot, ttft, e2e float64) Input {
	r := rand.New(rand.NewPCG(seed, seed^0xba5e))
	acc := NewAccumulator(n)
	noise := func() float64 { return math.Exp(0.1 * r.NormFloat64()) }
	d := func(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
	for range n {
		size := math.Exp(0.6 * r.NormFloat64()) // per-request variance: 0.5× to 2× typical
		side := func(scaleT, scaleE float64) SideResult {
			return SideResult{OK: true, TTFT: d(200 * size * scaleT * noise()), ITL: d(20 * scaleE * noise()), E2E: d(2000 * size * scaleE * noise())}
		}
		p, b, c := side(hot, hot), side(1, 1), side(ttft, e2e)
		acc.Add(PairResult{Primary: p, Baseline: &b, Candidate: c, Similarity: 0.8, SimilarityValid: true,
			NoiseSimilarity: 0.8, NoiseValid: true, Loads: Loads{Primary: 12, Baseline: 2, Candidate: 2, Valid: true}})
	}
	return acc.Input()
}

// TestEvaluateBaselinePaired: judged against the baseline on paired differences, the hot
// primary plays no part: an identical candidate is promoted for every seed (no false
// rollback over 20), a 30% slower first token is rolled back on TTFT and a 20% slower end
// on E2E, each with a ratio interval above 1.
func TestEvaluateBaselinePaired(t *testing.T) {
	cfg := Config{MinSamples: 30}
	for seed := uint64(1); seed <= 20; seed++ {
		v, err := Evaluate(cfg, triples(seed, 60, 3, 1, 1))
		if err != nil {
			t.Fatal(err)
		}
		if v.Decision != Promote {
			t.Errorf("seed %d: identical candidate %s: %s", seed, v.Decision, v.Reason)
		}
		for _, m := range []string{MetricTTFT, MetricE2E} {
			e := evidence(t, v, m)
			if e.Test != StatWilcoxon || e.Reference != "baseline" || !(e.Low <= 1 && 1 <= e.High) {
				t.Errorf("seed %d %s: %+v: want a paired test against the baseline whose interval holds 1", seed, m, e)
			}
		}
	}
	for _, tc := range []struct {
		name      string
		ttft, e2e float64
		metric    string
		unaltered string
	}{
		{"ttft +30%", 1.3, 1, MetricTTFT, MetricE2E},
		{"e2e +20%", 1, 1.2, MetricE2E, MetricTTFT},
	} {
		for seed := uint64(1); seed <= 5; seed++ {
			v, _ := Evaluate(cfg, triples(seed, 60, 3, tc.ttft, tc.e2e))
			e := evidence(t, v, tc.metric)
			if v.Decision != Rollback || e.Verdict != Regression || !(e.Low > 1) || math.Abs(e.Ratio-math.Max(tc.ttft, tc.e2e)) > 0.1 {
				t.Errorf("%s seed %d: %s, %s %+v: want a rollback on it with ratio ≈%.1f above 1", tc.name, seed, v.Decision, tc.metric, e, math.Max(tc.ttft, tc.e2e))
			}
			if u := evidence(t, v, tc.unaltered); u.Verdict != Pass {
				t.Errorf("%s seed %d: %s %s, want pass", tc.name, seed, tc.unaltered, u.Verdict)
			}
		}
	}
}

// TestPairedSeesWhatUnpairedMisses: on the same simulated triples, a 20% slower candidate
// is caught by the paired test on 40 pairs, far more often than Mann-Whitney needs, because the
// per-request size (variance shared by both answers) cancels out.
func TestPairedSeesWhatUnpairedMisses(t *testing.T) {
	paired, unpaired := 0, 0
	for seed := uint64(1); seed <= 20; seed++ {
		in := triples(seed, 40, 1, 1.2, 1)
		v, _ := Evaluate(Config{MinSamples: 30}, in)
		if evidence(t, v, MetricTTFT).Verdict == Regression {
			paired++
		}
		in.Primary, in.Baseline = *in.Baseline, nil // the same answers, judged unpaired
		v, _ = Evaluate(Config{MinSamples: 30}, in)
		if evidence(t, v, MetricTTFT).Verdict == Regression {
			unpaired++
		}
	}
	if paired < 19 || unpaired > paired/2 {
		t.Fatalf("20%% slower TTFT caught in %d/20 runs paired, %d/20 unpaired: want paired ≥ 19 and at least twice unpaired", paired, unpaired)
	}
}

// TestEvaluateLoadNotComparable: without a baseline, latencies against the primary are
// judged only when both sides served alike request rates; otherwise they are not
// comparable, never pass, and the decision holds asking for a baseline.
func TestEvaluateLoadNotComparable(t *testing.T) {
	slow := baseline
	slow.ttftScale = 1.3
	for _, tc := range []struct {
		name       string
		cand       gen
		ref, rate  float64
		comparable bool
	}{
		{"half loaded", baseline, 8, 4, false},
		{"half loaded, slower", slow, 8, 4, false},
		{"alike", baseline, 8, 7, true},
		{"small absolute difference", baseline, 1.0, 0.6, true},
		{"unmeasured", baseline, 0, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := input(3, baseline, tc.cand)
			in.Load = LoadSample{Reference: []float64{6, 6}, Candidate: []float64{1, 1}, ReferenceRate: tc.ref, CandidateRate: tc.rate}
			v, err := Evaluate(Config{}, in)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{MetricTTFT, MetricITL, MetricE2E} {
				e := evidence(t, v, m)
				if got := e.Verdict != NotComparable; got != tc.comparable {
					t.Fatalf("%s: %s (%s), comparable=%v wanted", m, e.Verdict, e.Note, tc.comparable)
				}
				if !tc.comparable && !strings.Contains(e.Note, "requests a second") {
					t.Fatalf("%s note %q does not give the loads", m, e.Note)
				}
			}
			if !tc.comparable && (v.Decision != Hold || !strings.Contains(v.Reason, "mirror.baseline")) {
				t.Fatalf("decision %s (%s): want hold asking for a baseline", v.Decision, v.Reason)
			}
			// With a baseline the primary's load does not matter: the same rates, now with
			// paired baseline answers, are judged (paired) and never not comparable.
			wb := triples(3, 60, 3, 1, 1)
			wb.Load = in.Load
			v, err = Evaluate(Config{MinSamples: 30}, wb)
			if err != nil {
				t.Fatal(err)
			}
			if e := evidence(t, v, MetricTTFT); e.Verdict == NotComparable || e.Test != StatWilcoxon || e.Verdict == Skipped {
				t.Fatalf("with a baseline: %s by %s (%s), want a paired judgment", e.Verdict, e.Test, e.Note)
			}
		})
	}
}

// TestEvaluateFisherDecides: when Fisher's exact test is the one reported (few events), its
// p decides, not the z-test's: a rise the z-test calls significant and Fisher does not is
// not a regression.
func TestEvaluateFisherDecides(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinSamples = 10
	found := false
	for n := 20; n <= 400 && !found; n += 10 {
		for k := 1; k <= n/4 && !found; k++ {
			if !smallExpected(0, n, k, n) {
				continue
			}
			z, err := TwoProportion(0, n, k, n)
			if err != nil {
				t.Fatal(err)
			}
			f, err := FisherExact(0, n, k, n)
			if err != nil {
				t.Fatal(err)
			}
			if !(z.P < cfg.Alpha && f >= cfg.Alpha && z.Diff > cfg.MaxRateIncrease) {
				continue
			}
			found = true
			e := rate(cfg, MetricErrorRate, 0, n, k, n, false)
			if e.Test != StatFisherExact || e.P != f || e.Verdict != Pass {
				t.Fatalf("0/%d against %d/%d: %+v; want Fisher's p %.4g reported and deciding (pass; z p = %.4g)", n, k, n, e, f, z.P)
			}
		}
	}
	if !found {
		t.Fatal("no case where the z-test and Fisher's test disagree: the test checks nothing")
	}
}

// TestEvaluateCriticalNotExercised: a critical check with too few samples to judge does not
// hold a promotion, unless the candidate broke where its reference did not.
func TestEvaluateCriticalNotExercised(t *testing.T) {
	in := input(5, baseline, baseline)
	in.Primary.SchemaChecked, in.Primary.SchemaBroken = 3, 0
	in.Candidate.SchemaChecked, in.Candidate.SchemaBroken = 3, 0
	v, _ := Evaluate(Config{}, in)
	if e := evidence(t, v, MetricSchemaBreakage); e.Verdict != NotExercised || v.Decision != Promote {
		t.Fatalf("schema %s, decision %s (%s): want not_exercised and promote", e.Verdict, v.Decision, v.Reason)
	}
	in.Candidate.SchemaBroken, in.SchemaBrokeAlone = 1, 1
	v, _ = Evaluate(Config{}, in)
	if e := evidence(t, v, MetricSchemaBreakage); e.Verdict != Insufficient || v.Decision != Hold || !strings.Contains(e.Note, "broke 1") {
		t.Fatalf("schema %s (%s), decision %s: want insufficient and hold after breaking alone", e.Verdict, e.Note, v.Decision)
	}
}

// TestAbnormalFinish: running into the max_tokens a request set is a normal end; the route's
// list, when given, replaces the defaults.
func TestAbnormalFinish(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		list   []string
		finish string
		trunc  bool
		want   bool
	}{
		{"length with max_tokens", `{"max_tokens":16}`, nil, "length", false, false},
		{"length with max_completion_tokens", `{"max_completion_tokens":16}`, nil, "length", false, false},
		{"length with max_output_tokens", `{"max_output_tokens":16}`, nil, "length", false, false},
		{"length without a bound", `{}`, nil, "length", false, true},
		{"length with a null bound", `{"max_tokens":null}`, nil, "length", false, true},
		{"content_filter", `{"max_tokens":16}`, nil, "content_filter", false, true},
		{"missing", `{}`, nil, "", false, true},
		{"missing but truncated capture", `{}`, nil, "", true, false},
		{"stop", `{}`, nil, "stop", false, false},
		{"tool_calls", `{}`, nil, "tool_calls", false, false},
		{"route list: length counts", `{"max_tokens":16}`, []string{"length"}, "length", false, true},
		{"route list: content_filter does not", `{}`, []string{"length"}, "content_filter", false, false},
		{"route list: missing", `{}`, []string{FinishMissing}, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := RequestFromBody([]byte(tc.body))
			req.AbnormalFinish = tc.list
			a := Answer{Status: 200, FinishReason: tc.finish, Truncated: tc.trunc, Text: "x"}
			if got := req.abnormal(a); got != tc.want {
				t.Fatalf("abnormal = %v, want %v", got, tc.want)
			}
			if s := Compare(req, a, a); s.Candidate.AbnormalFinish != tc.want {
				t.Fatalf("Compare: AbnormalFinish = %v, want %v", s.Candidate.AbnormalFinish, tc.want)
			}
		})
	}
}

// TestCompareTriple: the baseline is checked as the others, and primary against baseline
// is the request's noise-floor sample.
func TestCompareTriple(t *testing.T) {
	p := Answer{Status: 200, Text: "the quick brown fox", FinishReason: "stop", TTFT: time.Second}
	b := Answer{Status: 200, Text: "the quick brown dog", FinishReason: "stop", TTFT: 2 * time.Second}
	c := Answer{Status: 500, ErrorClass: "upstream_5xx"}
	r := NewSchemaCache(8).CompareTriple(Request{}, p, &b, c)
	if r.Baseline == nil || !r.Baseline.OK || r.Baseline.TTFT != 2*time.Second || r.Candidate.OK {
		t.Fatalf("sides: baseline %+v candidate %+v", r.Baseline, r.Candidate)
	}
	if !r.NoiseValid || math.Abs(r.NoiseSimilarity-0.75) > 1e-9 || r.SimilarityValid {
		t.Fatalf("noise %v (%v), similarity valid %v: want 0.75 and no candidate similarity", r.NoiseSimilarity, r.NoiseValid, r.SimilarityValid)
	}
	if r := NewSchemaCache(8).CompareTriple(Request{}, p, nil, p); r.Baseline != nil || r.NoiseValid {
		t.Fatal("a pair without a baseline has baseline results")
	}
}
