package shadow

import (
	"errors"
	"fmt"
	"math"
)

// Decision is the overall outcome of an evaluation.
type Decision string

const (
	Promote  Decision = "promote"  // no metric regressed and every required metric had enough data
	Hold     Decision = "hold"     // not enough samples, or an inconclusive metric
	Rollback Decision = "rollback" // a metric regressed significantly
)

// MetricVerdict is the outcome for one metric.
type MetricVerdict string

const (
	Pass         MetricVerdict = "pass"         // no significant regression beyond the bound
	Regression   MetricVerdict = "regression"   // significant and beyond the bound
	Inconclusive MetricVerdict = "inconclusive" // observed effect beyond the bound but not significant
	Insufficient MetricVerdict = "insufficient" // fewer than MinSamples on a side
	Skipped      MetricVerdict = "skipped"      // no data supplied for an optional metric
)

// Metric names used in Evidence.
const (
	MetricTTFT           = "ttft"
	MetricITL            = "itl"
	MetricE2E            = "e2e"
	MetricErrorRate      = "error_rate"
	MetricFinishRate     = "abnormal_finish_rate"
	MetricSimilarity     = "similarity"
	MetricSchemaBreakage = "schema_breakage"
	MetricToolBreakage   = "tool_call_breakage"
)

// Tests named in Evidence.
const (
	StatMannWhitney   = "mann-whitney-u"
	StatTwoProportion = "two-proportion-z"
	StatFisherExact   = "fisher-exact"
)

// Config holds the thresholds of Evaluate. Zero fields are filled from
// DefaultConfig by WithDefaults.
type Config struct {
	// MinSamples is the minimum number of observations per side for a metric
	// to be judged; fewer gives Insufficient and, for a required metric, Hold.
	MinSamples int `json:"min_samples" yaml:"min_samples"`
	// Alpha is the significance level for latency, rate and similarity tests.
	Alpha float64 `json:"alpha" yaml:"alpha"`
	// MaxRegression is the largest tolerated relative increase of a latency
	// median (0.10 = candidate median may be up to 10% above the primary's).
	MaxRegression float64 `json:"max_regression" yaml:"max_regression"`
	// MaxRateIncrease is the largest tolerated absolute increase of the error
	// and abnormal-finish rates (0.02 = two percentage points).
	MaxRateIncrease float64 `json:"max_rate_increase" yaml:"max_rate_increase"`
	// SimilarityMargin is how far the candidate's mean similarity may fall
	// below the noise floor's mean before it counts as a regression.
	SimilarityMargin float64 `json:"similarity_margin" yaml:"similarity_margin"`
	// CriticalAlpha is the significance level for critical checks (schema and
	// tool-call breakage); any significant increase is a regression.
	CriticalAlpha float64 `json:"critical_alpha" yaml:"critical_alpha"`
}

// DefaultConfig returns the default thresholds.
func DefaultConfig() Config {
	return Config{
		MinSamples:       50,
		Alpha:            0.01,
		MaxRegression:    0.10,
		MaxRateIncrease:  0.02,
		SimilarityMargin: 0.05,
		CriticalAlpha:    0.01,
	}
}

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.MinSamples == 0 {
		c.MinSamples = d.MinSamples
	}
	if c.Alpha == 0 {
		c.Alpha = d.Alpha
	}
	if c.MaxRegression == 0 {
		c.MaxRegression = d.MaxRegression
	}
	if c.MaxRateIncrease == 0 {
		c.MaxRateIncrease = d.MaxRateIncrease
	}
	if c.SimilarityMargin == 0 {
		c.SimilarityMargin = d.SimilarityMargin
	}
	if c.CriticalAlpha == 0 {
		c.CriticalAlpha = d.CriticalAlpha
	}
	return c
}

// Validate reports every problem with c, joined, or nil.
func (c Config) Validate() error {
	var errs []error
	if c.MinSamples < 8 {
		errs = append(errs, fmt.Errorf("shadow: min_samples %d < 8 (the normal approximation needs at least 8 per side)", c.MinSamples))
	}
	prob := func(name string, v float64) {
		if !(v > 0 && v < 1) {
			errs = append(errs, fmt.Errorf("shadow: %s %v not in (0, 1)", name, v))
		}
	}
	prob("alpha", c.Alpha)
	prob("critical_alpha", c.CriticalAlpha)
	nonneg := func(name string, v float64, max float64) {
		if math.IsNaN(v) || v < 0 || v > max {
			errs = append(errs, fmt.Errorf("shadow: %s %v not in [0, %v]", name, v, max))
		}
	}
	nonneg("max_regression", c.MaxRegression, math.MaxFloat64)
	nonneg("max_rate_increase", c.MaxRateIncrease, 1)
	nonneg("similarity_margin", c.SimilarityMargin, 1)
	return errors.Join(errs...)
}

// Arm holds the observations of one side (primary or candidate) of the
// mirrored pairs. Latencies may be in any unit, the same for both arms;
// ITL may be per-request means or individual gaps, the same for both arms.
// Counts are of requests: Errors of Requests failed, AbnormalFinish of
// Requests ended with an unexpected finish_reason (such as "length" or
// "content_filter"), SchemaBroken of SchemaChecked responses that asked for
// JSON broke it, ToolCallBroken of ToolCallChecked responses dropped or broke
// tool calls.
type Arm struct {
	TTFT, ITL, E2E  []float64
	Requests        int
	Errors          int
	AbnormalFinish  int
	SchemaChecked   int
	SchemaBroken    int
	ToolCallChecked int
	ToolCallBroken  int
}

// Input is what Evaluate judges.
type Input struct {
	Primary, Candidate Arm
	// CandidateSimilarity holds per-pair similarities of candidate to primary
	// output (for example RougeL); NoiseFloor holds per-pair similarities of
	// primary to replica output. Similarity is judged only when NoiseFloor is
	// non-empty.
	CandidateSimilarity []float64
	NoiseFloor          []float64
}

// Evidence is the test result for one metric.
type Evidence struct {
	Metric     string  `json:"metric"`
	Test       string  `json:"test"`
	Critical   bool    `json:"critical,omitempty"`
	NPrimary   int     `json:"n_primary"`
	NCandidate int     `json:"n_candidate"`
	Statistic  float64 `json:"statistic"` // U for Mann-Whitney; z for rates (P may be Fisher's, see Test)
	Z          float64 `json:"z"`
	P          float64 `json:"p"`
	// Effect is the observed change, positive when the candidate is worse:
	// relative median change for latency, absolute rate increase for rates,
	// noise-floor mean minus candidate mean for similarity.
	Effect  float64       `json:"effect"`
	Bound   float64       `json:"bound"`     // the effect bound the metric is judged against
	Primary float64       `json:"primary"`   // median, rate or mean of the primary/noise floor
	Cand    float64       `json:"candidate"` // the same for the candidate
	Verdict MetricVerdict `json:"verdict"`
	Note    string        `json:"note,omitempty"`
}

// Verdict is the overall decision with the evidence behind it.
type Verdict struct {
	Decision Decision   `json:"decision"`
	Reason   string     `json:"reason"`
	Evidence []Evidence `json:"evidence"`
}

// Evaluate judges the candidate against the primary. cfg is completed with
// WithDefaults and must then pass Validate.
//
// Rules, per metric:
//   - TTFT, ITL, E2E: Mann-Whitney U (Skipped when neither side has samples,
//     as for ITL of non-streaming traffic); Regression if p < Alpha and
//     the candidate median exceeds the primary's by more than MaxRegression;
//     Inconclusive if it exceeds it without significance.
//   - Error and abnormal-finish rates (required, counted over Requests):
//     two-proportion z-test, with Fisher's exact p-value instead when any
//     expected cell count is below 5 (also for the critical checks); Regression if p < Alpha and the candidate rate
//     exceeds the primary's by more than MaxRateIncrease.
//   - Similarity (optional): Regression if the candidate's mean similarity is
//     below the noise floor's mean by more than SimilarityMargin and
//     Mann-Whitney p < Alpha; Inconclusive if below by more than the margin
//     without significance.
//   - Schema and tool-call breakage (critical, optional: judged when the
//     candidate has checked responses): Regression if the candidate rate is
//     higher and p < CriticalAlpha, whatever the size of the increase.
//
// Any Regression gives Rollback (critical ones first in Reason). Otherwise
// any Insufficient or Inconclusive metric gives Hold; else Promote. The rates
// over Requests are always judged, so an input without requests holds.
func Evaluate(cfg Config, in Input) (Verdict, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Verdict{}, err
	}
	var ev []Evidence
	for _, m := range []struct {
		name string
		p, c []float64
	}{
		{MetricTTFT, in.Primary.TTFT, in.Candidate.TTFT},
		{MetricITL, in.Primary.ITL, in.Candidate.ITL},
		{MetricE2E, in.Primary.E2E, in.Candidate.E2E},
	} {
		ev = append(ev, latency(cfg, m.name, finite(m.p), finite(m.c)))
	}
	ev = append(ev,
		rate(cfg, MetricErrorRate, in.Primary.Errors, in.Primary.Requests, in.Candidate.Errors, in.Candidate.Requests, false),
		rate(cfg, MetricFinishRate, in.Primary.AbnormalFinish, in.Primary.Requests, in.Candidate.AbnormalFinish, in.Candidate.Requests, false),
	)
	ev = append(ev, similarity(cfg, finite(in.NoiseFloor), finite(in.CandidateSimilarity)))
	ev = append(ev,
		rate(cfg, MetricSchemaBreakage, in.Primary.SchemaBroken, in.Primary.SchemaChecked, in.Candidate.SchemaBroken, in.Candidate.SchemaChecked, true),
		rate(cfg, MetricToolBreakage, in.Primary.ToolCallBroken, in.Primary.ToolCallChecked, in.Candidate.ToolCallBroken, in.Candidate.ToolCallChecked, true),
	)
	return decide(ev), nil
}

func decide(ev []Evidence) Verdict {
	v := Verdict{Decision: Promote, Reason: "no metric regressed", Evidence: ev}
	var crit, reg, hold []string
	for _, e := range ev {
		switch e.Verdict {
		case Regression:
			if e.Critical {
				crit = append(crit, e.Metric)
			} else {
				reg = append(reg, e.Metric)
			}
		case Insufficient, Inconclusive:
			hold = append(hold, fmt.Sprintf("%s %s", e.Metric, e.Verdict))
		}
	}
	switch {
	case len(crit) > 0:
		v.Decision = Rollback
		v.Reason = fmt.Sprintf("critical regression: %v", crit)
		if len(reg) > 0 {
			v.Reason += fmt.Sprintf("; regression: %v", reg)
		}
	case len(reg) > 0:
		v.Decision = Rollback
		v.Reason = fmt.Sprintf("regression: %v", reg)
	case len(hold) > 0:
		v.Decision = Hold
		v.Reason = fmt.Sprintf("not decided: %v", hold)
	}
	return v
}

func latency(cfg Config, name string, p, c []float64) Evidence {
	e := Evidence{Metric: name, Test: StatMannWhitney, NPrimary: len(p), NCandidate: len(c),
		Bound: cfg.MaxRegression, P: 1}
	if len(p) == 0 && len(c) == 0 {
		e.Verdict, e.Note = Skipped, "no samples on either side"
		return e
	}
	if len(p) < cfg.MinSamples || len(c) < cfg.MinSamples {
		e.Verdict = Insufficient
		e.Note = fmt.Sprintf("need %d samples per side", cfg.MinSamples)
		return e
	}
	r, err := MannWhitney(p, c)
	if err != nil { // unreachable: both non-empty and finite
		e.Verdict, e.Note = Insufficient, err.Error()
		return e
	}
	e.Statistic, e.Z, e.P = r.U, r.Z, r.P
	e.Primary, e.Cand = r.MedianX, r.MedianY
	switch {
	case r.MedianX > 0:
		e.Effect = r.MedianY/r.MedianX - 1
	case r.MedianY > r.MedianX:
		e.Effect = math.Inf(1)
	}
	worse := e.Effect > cfg.MaxRegression
	e.Verdict = judge(worse, r.P, cfg.Alpha)
	return e
}

func rate(cfg Config, name string, k1, n1, k2, n2 int, critical bool) Evidence {
	e := Evidence{Metric: name, Test: StatTwoProportion, Critical: critical, NPrimary: n1, NCandidate: n2, P: 1}
	alpha := cfg.Alpha
	if critical {
		alpha = cfg.CriticalAlpha
	} else {
		e.Bound = cfg.MaxRateIncrease
	}
	if critical && n1 == 0 && n2 == 0 {
		e.Verdict, e.Note = Skipped, "no checked responses"
		return e
	}
	if n1 < cfg.MinSamples || n2 < cfg.MinSamples {
		e.Verdict = Insufficient
		e.Note = fmt.Sprintf("need %d samples per side", cfg.MinSamples)
		return e
	}
	r, err := TwoProportion(k1, n1, k2, n2)
	if err != nil {
		e.Verdict, e.Note = Insufficient, err.Error()
		return e
	}
	e.Statistic, e.Z, e.P, e.Effect = r.Z, r.Z, r.P, r.Diff
	e.Primary, e.Cand = r.P1, r.P2
	if smallExpected(k1, n1, k2, n2) {
		// The normal approximation is anti-conservative for rare events.
		if p, err := FisherExact(k1, n1, k2, n2); err == nil {
			e.Test, e.P = StatFisherExact, p
		}
	}
	if r.Diff > e.Bound && r.P < alpha {
		e.Verdict = Regression
	} else {
		e.Verdict = Pass
	}
	return e
}

func similarity(cfg Config, noise, cand []float64) Evidence {
	e := Evidence{Metric: MetricSimilarity, Test: StatMannWhitney, NPrimary: len(noise), NCandidate: len(cand),
		Bound: cfg.SimilarityMargin, P: 1}
	if len(noise) == 0 {
		e.Verdict, e.Note = Skipped, "no noise floor (replica) samples"
		return e
	}
	if len(noise) < cfg.MinSamples || len(cand) < cfg.MinSamples {
		e.Verdict = Insufficient
		e.Note = fmt.Sprintf("need %d samples per side", cfg.MinSamples)
		return e
	}
	r, err := MannWhitney(noise, cand)
	if err != nil {
		e.Verdict, e.Note = Insufficient, err.Error()
		return e
	}
	e.Primary, e.Cand = Mean(noise), Mean(cand)
	e.Statistic, e.Z, e.P = r.U, r.Z, r.P
	e.Effect = e.Primary - e.Cand
	worse := e.Effect > cfg.SimilarityMargin
	e.Verdict = judge(worse, r.P, cfg.Alpha)
	return e
}

// judge is a metric's verdict: worse beyond its bound and significant is a regression, worse
// but not significant is inconclusive, otherwise it passes.
func judge(worse bool, p, alpha float64) MetricVerdict {
	switch {
	case worse && p < alpha:
		return Regression
	case worse:
		return Inconclusive
	default:
		return Pass
	}
}

// smallExpected reports whether any expected cell count of the 2×2 table is
// below 5, the usual limit of the two-proportion z-test.
func smallExpected(k1, n1, k2, n2 int) bool {
	n, k := float64(n1+n2), float64(k1+k2)
	for _, m := range []float64{float64(n1), float64(n2)} {
		if m*k/n < 5 || m*(n-k)/n < 5 {
			return true
		}
	}
	return false
}

// finite returns xs without NaN and ±Inf values (xs itself when it has none).
func finite(xs []float64) []float64 {
	for i, v := range xs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			out := append([]float64(nil), xs[:i]...)
			for _, w := range xs[i+1:] {
				if !math.IsNaN(w) && !math.IsInf(w, 0) {
					out = append(out, w)
				}
			}
			return out
		}
	}
	return xs
}
