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
	// NotComparable: without a baseline, the candidate and the primary served different
	// loads, so their latencies say nothing about the candidate.
	NotComparable MetricVerdict = "not_comparable"
	// NotExercised: a critical check too rarely exercised to judge, where the candidate never
	// broke without its reference breaking too (it does not hold the decision).
	NotExercised MetricVerdict = "not_exercised"
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
	// MetricEntropy is the answers' mean token entropy (nats), MetricLowMargin their share of
	// tokens with a top-1/top-2 margin below LowMarginBelow: higher is a model less sure of
	// itself (see confidence.go).
	MetricEntropy   = "mean_entropy"
	MetricLowMargin = "low_margin_share"
)

// Tests named in Evidence.
const (
	StatMannWhitney   = "mann-whitney-u"
	StatWilcoxon      = "wilcoxon-signed-rank"
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
	// MaxLoadDifference: without a baseline, latencies against the primary are judged only
	// when the two sides' loads (requests a second per endpoint each served over the last
	// interval) differ by at most this share of the larger (or by at most half a request a
	// second); otherwise they are not comparable.
	MaxLoadDifference float64 `json:"max_load_difference" yaml:"max_load_difference"`
	// MaxEntropyIncrease is the largest tolerated increase of an answer's mean token entropy
	// over its reference's on the same request, in nats (the mean of the differences);
	// MaxLowMarginIncrease that of its share of low-margin tokens (0.02 = two points).
	MaxEntropyIncrease   float64 `json:"max_entropy_increase" yaml:"max_entropy_increase"`
	MaxLowMarginIncrease float64 `json:"max_low_margin_increase" yaml:"max_low_margin_increase"`
}

// DefaultConfig returns the default thresholds.
func DefaultConfig() Config {
	return Config{
		MinSamples:        50,
		Alpha:             0.01,
		MaxRegression:     0.10,
		MaxRateIncrease:   0.02,
		SimilarityMargin:  0.05,
		CriticalAlpha:     0.01,
		MaxLoadDifference: 0.25,
		// A candidate whose typical answer is 0.05 nats less sure (a fifth more than an
		// ordinary model's mean of about 0.25 at top 5) or has two points more low-margin
		// tokens.
		MaxEntropyIncrease:   0.05,
		MaxLowMarginIncrease: 0.02,
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
	if c.MaxLoadDifference == 0 {
		c.MaxLoadDifference = d.MaxLoadDifference
	}
	if c.MaxEntropyIncrease == 0 {
		c.MaxEntropyIncrease = d.MaxEntropyIncrease
	}
	if c.MaxLowMarginIncrease == 0 {
		c.MaxLowMarginIncrease = d.MaxLowMarginIncrease
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
	nonneg("max_load_difference", c.MaxLoadDifference, 1)
	nonneg("max_entropy_increase", c.MaxEntropyIncrease, 10)
	nonneg("max_low_margin_increase", c.MaxLowMarginIncrease, 1)
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
	// Primary holds the primary's answers (what the clients got), Candidate the
	// candidate's, Baseline the baseline's when the route has one (the primary's version in
	// a sandbox, asked at the same moment as the candidate): then the baseline, not the
	// primary, is the reference of the latency, error and finish verdicts.
	Primary, Candidate Arm
	Baseline           *Arm
	// Paired holds the (baseline, candidate) latencies of the same requests (with a
	// baseline): the latency verdicts are judged on them.
	Paired Paired
	// Load holds, per pair, the load the reference and the candidate served (requests in
	// flight per endpoint when sent). Without a baseline, latencies are judged only when
	// the loads are alike (Config.MaxLoadDifference).
	Load LoadSample
	// CandidateSimilarity holds per-pair similarities of candidate to primary
	// output (for example RougeL); NoiseFloor holds per-pair similarities of
	// primary to baseline (or replica) output. Similarity is judged only when NoiseFloor is
	// non-empty.
	CandidateSimilarity []float64
	NoiseFloor          []float64
	// SchemaBrokeAlone and ToolBrokeAlone count the pairs where the candidate broke a
	// critical check its reference passed on the same request.
	SchemaBrokeAlone, ToolBrokeAlone int
	// Confidence holds the (reference, candidate) confidence of the same requests, where
	// both answers carried logprobs.
	Confidence PairedConfidence
}

// Paired are (baseline, candidate) latency pairs, in milliseconds.
type Paired struct {
	TTFT, ITL, E2E [][2]float64
}

// LoadSample is the reference's and the candidate's load per pair (requests in flight per
// endpoint when each was sent) and, when measured (not zero), their request rates per
// endpoint (requests begun per second) over the last interval.
type LoadSample struct {
	Reference, Candidate         []float64
	ReferenceRate, CandidateRate float64
}

// reference is the arm the candidate is judged against.
func (in Input) reference() Arm {
	if in.Baseline != nil {
		return *in.Baseline
	}
	return in.Primary
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
	// Reference is what the candidate was judged against: "baseline" or "primary".
	Reference string `json:"reference,omitempty"`
	// Ratio, Low and High (paired latencies): the median of the per-request ratios
	// candidate/baseline, with its confidence interval at 1 − Alpha (the sign test's,
	// from order statistics; Primary and Cand keep the two medians).
	Ratio float64 `json:"ratio,omitempty"`
	Low   float64 `json:"ratio_low,omitempty"`
	High  float64 `json:"ratio_high,omitempty"`
	// EffectLow and EffectHigh (paired shifts: the confidence metrics) bound the mean
	// per-request difference Effect at confidence 1 − Alpha (normal interval).
	EffectLow  float64 `json:"effect_low,omitempty"`
	EffectHigh float64 `json:"effect_high,omitempty"`
}

// Verdict is the overall decision with the evidence behind it.
type Verdict struct {
	Decision Decision   `json:"decision"`
	Reason   string     `json:"reason"`
	Evidence []Evidence `json:"evidence"`
}

// Evaluate judges the candidate against its reference: the baseline when the input has
// one, else the primary. cfg is completed with WithDefaults and must then pass Validate.
//
// Rules, per metric:
//   - TTFT, ITL, E2E (Skipped when neither side has samples, as ITL of non-streaming
//     traffic). With a baseline, on the (baseline, candidate) pairs of the same requests:
//     the Wilcoxon signed-rank test of the log ratios (per-request variance such as the
//     prompt's length cancels out), the effect the median of the per-request ratios with its
//     confidence interval; Regression if p < Alpha and the ratio exceeds
//     1 + MaxRegression, Inconclusive if it does without significance. Without a baseline,
//     Mann-Whitney U against the primary, and only when both served alike loads
//     (MaxLoadDifference): otherwise NotComparable, with the two loads, which holds.
//   - Error and abnormal-finish rates (required, counted over Requests):
//     two-proportion z-test, with Fisher's exact p-value instead when any
//     expected cell count is below 5 (also for the critical checks): the p reported
//     decides; Regression if p < Alpha and the candidate rate exceeds the reference's by
//     more than MaxRateIncrease.
//   - Similarity (optional): Regression if the candidate's mean similarity to the
//     primary is below the noise floor's (primary against baseline or replica) by more
//     than SimilarityMargin and Mann-Whitney p < Alpha; Inconclusive if below by more than
//     the margin without significance.
//   - Mean entropy and low-margin share (optional: judged on the requests whose reference
//     and candidate answers both carried logprobs; higher is worse): the Wilcoxon
//     signed-rank test of the per-request differences candidate − reference; Regression if
//     p < Alpha and their mean exceeds MaxEntropyIncrease (MaxLowMarginIncrease),
//     Inconclusive if it does without significance; fewer than MinSamples pairs is
//     NotExercised (it does not hold the decision), none Skipped.
//   - Schema and tool-call breakage (critical, optional: judged when the
//     candidate has checked responses): Regression if the candidate rate is
//     higher and p < CriticalAlpha, whatever the size of the increase. Too few checked
//     responses to judge: NotExercised (it does not hold the decision), unless the
//     candidate broke at least once where its reference did not (Insufficient, which
//     holds).
//
// Any Regression gives Rollback (critical ones first in Reason). Otherwise
// any Insufficient, Inconclusive or NotComparable metric gives Hold; else Promote. The
// rates over Requests are always judged, so an input without requests holds.
func Evaluate(cfg Config, in Input) (Verdict, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Verdict{}, err
	}
	ref := in.reference()
	refName := "primary"
	if in.Baseline != nil {
		refName = "baseline"
	}
	var ev []Evidence
	load := loadComparable(cfg, in)
	for _, m := range []struct {
		name   string
		p, c   []float64
		paired [][2]float64
	}{
		{MetricTTFT, in.Primary.TTFT, in.Candidate.TTFT, in.Paired.TTFT},
		{MetricITL, in.Primary.ITL, in.Candidate.ITL, in.Paired.ITL},
		{MetricE2E, in.Primary.E2E, in.Candidate.E2E, in.Paired.E2E},
	} {
		var e Evidence
		if in.Baseline != nil {
			e = pairedLatency(cfg, m.name, finitePairs(m.paired))
		} else {
			e = latency(cfg, m.name, finite(m.p), finite(m.c))
			if load != "" && e.Verdict != Skipped && e.Verdict != Insufficient {
				e.Verdict, e.Note = NotComparable, load
			}
		}
		e.Reference = refName
		ev = append(ev, e)
	}
	for _, e := range []Evidence{
		rate(cfg, MetricErrorRate, ref.Errors, ref.Requests, in.Candidate.Errors, in.Candidate.Requests, false),
		rate(cfg, MetricFinishRate, ref.AbnormalFinish, ref.Requests, in.Candidate.AbnormalFinish, in.Candidate.Requests, false),
	} {
		e.Reference = refName
		ev = append(ev, e)
	}
	sim := similarity(cfg, finite(in.NoiseFloor), finite(in.CandidateSimilarity))
	sim.Reference = "noise floor (primary against " + map[bool]string{true: "baseline", false: "replica"}[in.Baseline != nil] + ")"
	ev = append(ev, sim)
	for _, e := range []Evidence{
		critical(cfg, MetricSchemaBreakage, ref.SchemaBroken, ref.SchemaChecked, in.Candidate.SchemaBroken, in.Candidate.SchemaChecked, in.SchemaBrokeAlone),
		critical(cfg, MetricToolBreakage, ref.ToolCallBroken, ref.ToolCallChecked, in.Candidate.ToolCallBroken, in.Candidate.ToolCallChecked, in.ToolBrokeAlone),
	} {
		e.Reference = refName
		ev = append(ev, e)
	}
	for _, e := range []Evidence{
		pairedShift(cfg, MetricEntropy, finiteConfidencePairs(in.Confidence.Entropy), cfg.MaxEntropyIncrease),
		pairedShift(cfg, MetricLowMargin, finiteConfidencePairs(in.Confidence.LowMargin), cfg.MaxLowMarginIncrease),
	} {
		e.Reference = refName
		ev = append(ev, e)
	}
	return decide(ev), nil
}

// loadComparable says why the primary's and the candidate's latencies cannot be compared
// (they served different loads), or "" when they can. The load is the request rate per
// endpoint each side served: a candidate slower at the same rate holds more requests in
// flight, which is its own slowness, not a difference of load, so the in-flight counts are
// reported but do not decide. With a baseline it is "": the baseline and the candidate get
// the same copies at the same moment.
func loadComparable(cfg Config, in Input) string {
	l := in.Load
	if in.Baseline != nil || !(l.ReferenceRate > 0 && l.CandidateRate > 0) {
		return ""
	}
	diff := math.Abs(l.ReferenceRate - l.CandidateRate)
	if diff <= 0.5 || diff <= cfg.MaxLoadDifference*math.Max(l.ReferenceRate, l.CandidateRate) {
		return ""
	}
	why := fmt.Sprintf("the primary served %.1f requests a second per endpoint, the candidate %.1f", l.ReferenceRate, l.CandidateRate)
	if len(l.Reference) > 0 && len(l.Candidate) > 0 {
		why += fmt.Sprintf(" (%.1f and %.1f in flight per endpoint when sent)", Mean(l.Reference), Mean(l.Candidate))
	}
	return fmt.Sprintf("loads differ by more than %.0f%%: %s; their latencies measure the load, not the candidate: add a mirror.baseline",
		100*cfg.MaxLoadDifference, why)
}

func decide(ev []Evidence) Verdict {
	v := Verdict{Decision: Promote, Reason: "no metric regressed", Evidence: ev}
	var crit, reg, hold []string
	comparable := true
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
		case NotComparable:
			hold = append(hold, fmt.Sprintf("%s %s", e.Metric, e.Verdict))
			comparable = false
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
		if !comparable {
			v.Reason += "; the candidate and the primary served different loads: add a mirror.baseline (the primary's version in a sandbox) to compare them"
		}
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

// pairedLatency judges (baseline, candidate) pairs of the same requests.
func pairedLatency(cfg Config, name string, pairs [][2]float64) Evidence {
	e := Evidence{Metric: name, Test: StatWilcoxon, NPrimary: len(pairs), NCandidate: len(pairs),
		Bound: cfg.MaxRegression, P: 1}
	if len(pairs) == 0 {
		e.Verdict, e.Note = Skipped, "no pairs"
		return e
	}
	if len(pairs) < cfg.MinSamples {
		e.Verdict = Insufficient
		e.Note = fmt.Sprintf("need %d pairs", cfg.MinSamples)
		return e
	}
	b, c := make([]float64, len(pairs)), make([]float64, len(pairs))
	for i, p := range pairs {
		b[i], c[i] = p[0], p[1]
	}
	w, err := WilcoxonLogRatio(b, c)
	if err != nil {
		e.Verdict, e.Note = Insufficient, err.Error()
		return e
	}
	// The effect is the typical request's slowdown: the median of the per-request ratios
	// candidate/baseline, with its interval (the ratio of the two medians mixes in how the
	// requests differ from each other, which pairing removes; Primary and Cand keep them).
	// (No bootstrap: the verdict does not use the interval of the ratio of medians.)
	rr, _, _, _ := pairedMedians(b, c, 1-cfg.Alpha) // b and c passed WilcoxonLogRatio's checks
	e.Statistic, e.Z, e.P = w.WPlus, w.Z, w.P
	e.Primary, e.Cand = rr.MedianX, rr.MedianY
	e.Ratio, e.Low, e.High = rr.PairRatio, rr.PairLo, rr.PairHi
	e.Effect = e.Ratio - 1
	e.Verdict = judge(e.Effect > cfg.MaxRegression, w.P, cfg.Alpha)
	return e
}

// critical judges a critical check: rate with NotExercised when there is too little to
// judge and the candidate never broke where its reference did not.
func critical(cfg Config, name string, k1, n1, k2, n2, alone int) Evidence {
	e := rate(cfg, name, k1, n1, k2, n2, true)
	if e.Verdict == Insufficient {
		if alone == 0 {
			e.Verdict = NotExercised
			e.Note = fmt.Sprintf("%d checked (need %d to judge); the candidate never broke where its reference did not", n2, cfg.MinSamples)
		} else {
			e.Note = fmt.Sprintf("%d checked (need %d to judge); the candidate broke %d times where its reference did not", n2, cfg.MinSamples, alone)
		}
	}
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
	if r.Diff > e.Bound && e.P < alpha { // the p reported (Fisher's when shown) decides
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

// finitePairs returns the pairs whose two values are finite and positive.
func finitePairs(ps [][2]float64) [][2]float64 {
	out := ps[:0:0]
	for _, p := range ps {
		if p[0] > 0 && p[1] > 0 && !math.IsInf(p[0], 0) && !math.IsInf(p[1], 0) {
			out = append(out, p)
		}
	}
	return out
}
