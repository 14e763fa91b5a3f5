package shadow

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// gen draws synthetic observations for one arm.
type gen struct {
	n                int
	ttftScale        float64 // multiplies the TTFT median (1 = baseline)
	errRate, finRate float64
	toolBroken       float64
	schemaBroken     float64
	simMean          float64 // mean similarity of this arm's pairs
}

func lognormal(r *rand.Rand, median, sigma float64) float64 {
	return median * math.Exp(sigma*r.NormFloat64())
}

func bern(r *rand.Rand, n int, p float64) int {
	k := 0
	for range n {
		if r.Float64() < p {
			k++
		}
	}
	return k
}

func (g gen) arm(r *rand.Rand) (Arm, []float64) {
	a := Arm{Requests: g.n, ToolCallChecked: g.n, SchemaChecked: g.n / 2}
	sims := make([]float64, g.n)
	for i := range g.n {
		a.TTFT = append(a.TTFT, lognormal(r, 0.200*g.ttftScale, 0.25))
		a.ITL = append(a.ITL, lognormal(r, 0.020, 0.2))
		a.E2E = append(a.E2E, lognormal(r, 2.0, 0.25))
		sims[i] = math.Max(0, math.Min(1, g.simMean+0.1*r.NormFloat64()))
	}
	a.Errors = bern(r, g.n, g.errRate)
	a.AbnormalFinish = bern(r, g.n, g.finRate)
	a.ToolCallBroken = bern(r, a.ToolCallChecked, g.toolBroken)
	a.SchemaBroken = bern(r, a.SchemaChecked, g.schemaBroken)
	return a, sims
}

var baseline = gen{n: 200, ttftScale: 1, errRate: 0.02, finRate: 0.05, toolBroken: 0.01, schemaBroken: 0.01, simMean: 0.8}

func input(seed uint64, primary, candidate gen) Input {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	p, noise := primary.arm(r)
	c, sims := candidate.arm(r)
	return Input{Primary: p, Candidate: c, NoiseFloor: noise, CandidateSimilarity: sims}
}

func evidence(t *testing.T, v Verdict, metric string) Evidence {
	t.Helper()
	for _, e := range v.Evidence {
		if e.Metric == metric {
			return e
		}
	}
	t.Fatalf("no evidence for %s", metric)
	return Evidence{}
}

func TestEvaluateIdenticalPromotes(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		v, err := Evaluate(Config{}, input(seed, baseline, baseline))
		if err != nil {
			t.Fatal(err)
		}
		if v.Decision == Rollback {
			t.Errorf("seed %d: false rollback: %s", seed, v.Reason)
		} else if v.Decision != Promote {
			t.Errorf("seed %d: %s: %s", seed, v.Decision, v.Reason)
		}
	}
}

func TestEvaluatePlanted(t *testing.T) {
	slow := baseline
	slow.ttftScale = 1.3
	tools := baseline
	tools.toolBroken = 0.2
	schema := baseline
	schema.schemaBroken = 0.3
	errs := baseline
	errs.errRate = 0.15
	fin := baseline
	fin.finRate = 0.25
	drift := baseline
	drift.simMean = 0.6
	tests := []struct {
		name     string
		cand     gen
		metric   string
		critical bool
	}{
		{"ttft 30% slower", slow, MetricTTFT, false},
		{"tool calls broken", tools, MetricToolBreakage, true},
		{"schema broken", schema, MetricSchemaBreakage, true},
		{"more errors", errs, MetricErrorRate, false},
		{"more abnormal finishes", fin, MetricFinishRate, false},
		{"similarity below noise floor", drift, MetricSimilarity, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 20; seed++ {
				v, err := Evaluate(DefaultConfig(), input(seed, baseline, tt.cand))
				if err != nil {
					t.Fatal(err)
				}
				if v.Decision != Rollback {
					t.Fatalf("seed %d: %s: %s", seed, v.Decision, v.Reason)
				}
				e := evidence(t, v, tt.metric)
				if e.Verdict != Regression || e.Critical != tt.critical || e.P >= 0.05 || e.Effect <= 0 {
					t.Errorf("seed %d: evidence %+v", seed, e)
				}
				if tt.critical && !strings.HasPrefix(v.Reason, "critical regression") {
					t.Errorf("seed %d: reason %q", seed, v.Reason)
				}
				for _, o := range v.Evidence {
					if o.Metric != tt.metric && o.Verdict == Regression {
						t.Errorf("seed %d: unexpected regression in %s: %+v", seed, o.Metric, o)
					}
				}
			}
		})
	}
}

func TestEvaluateTooFewSamplesHolds(t *testing.T) {
	small := baseline
	small.n = 20
	slow := small
	slow.ttftScale = 1.3
	for _, cand := range []gen{small, slow} {
		v, err := Evaluate(DefaultConfig(), input(7, small, cand))
		if err != nil {
			t.Fatal(err)
		}
		if v.Decision != Hold {
			t.Fatalf("%s: %s", v.Decision, v.Reason)
		}
		if e := evidence(t, v, MetricTTFT); e.Verdict != Insufficient {
			t.Errorf("ttft %+v", e)
		}
	}
	// No traffic at all holds too.
	if v, _ := Evaluate(DefaultConfig(), Input{}); v.Decision != Hold {
		t.Errorf("empty input: %s", v.Decision)
	}
}

func TestEvaluateEffectBound(t *testing.T) {
	// 5% slower with 5000 samples a side: significant but within the 10%
	// bound, so it passes (Kayenta's effect-size bound).
	big := baseline
	big.n = 5000
	slower := big
	slower.ttftScale = 1.05
	v, err := Evaluate(DefaultConfig(), input(3, big, slower))
	if err != nil {
		t.Fatal(err)
	}
	e := evidence(t, v, MetricTTFT)
	if v.Decision != Promote || e.Verdict != Pass || e.P >= 0.01 || !near(e.Effect, 0.05, 0.02) {
		t.Errorf("%s: %+v", v.Decision, e)
	}
}

func TestEvaluateInconclusiveHolds(t *testing.T) {
	// Candidate median 13% above the primary's but Mann-Whitney p ≈ 0.22.
	var p, c []float64
	for i := 1; i <= 60; i++ {
		p = append(p, float64(i))
		c = append(c, float64(i+4))
	}
	arm := func(lat []float64) Arm { return Arm{TTFT: lat, Requests: 60} }
	v, err := Evaluate(DefaultConfig(), Input{Primary: arm(p), Candidate: arm(c)})
	if err != nil {
		t.Fatal(err)
	}
	e := evidence(t, v, MetricTTFT)
	if v.Decision != Hold || e.Verdict != Inconclusive || e.P < 0.1 || !near(e.Effect, 4/30.5, 1e-9) {
		t.Errorf("%s %s: %+v", v.Decision, v.Reason, e)
	}
	// ITL and E2E have no samples: skipped, not insufficient.
	if e := evidence(t, v, MetricITL); e.Verdict != Skipped {
		t.Errorf("itl %+v", e)
	}
}

func TestEvaluateNoNoiseFloorSkipsSimilarity(t *testing.T) {
	in := input(5, baseline, baseline)
	in.NoiseFloor = nil
	v, err := Evaluate(DefaultConfig(), in)
	if err != nil {
		t.Fatal(err)
	}
	if e := evidence(t, v, MetricSimilarity); e.Verdict != Skipped || v.Decision != Promote {
		t.Errorf("%s: %+v", v.Decision, e)
	}
}

func TestConfig(t *testing.T) {
	if got := (Config{}).WithDefaults(); got != DefaultConfig() {
		t.Errorf("WithDefaults = %+v", got)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default invalid: %v", err)
	}
	bad := Config{MinSamples: 3, Alpha: 1.5, MaxRegression: -1, MaxRateIncrease: 2, SimilarityMargin: math.NaN(), CriticalAlpha: -0.1}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad config validated")
	}
	for _, name := range []string{"min_samples", "alpha", "max_regression", "max_rate_increase", "similarity_margin", "critical_alpha"} {
		if !strings.Contains(err.Error(), name+" ") {
			t.Errorf("missing %s in %v", name, err)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 6 {
		t.Errorf("%d problems listed, want 6: %v", n, err)
	}
	if _, err := Evaluate(bad, Input{}); err == nil {
		t.Error("Evaluate accepted a bad config")
	}
}

func TestFinite(t *testing.T) {
	got := finite([]float64{1, math.NaN(), 2, math.Inf(1), 3})
	if len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Errorf("finite = %v", got)
	}
}
