package shadow

import (
	"fmt"
	"math"
	"strconv"

	"github.com/sluicegw/sluice/policy/openai"
)

// Confidence as a verdict metric. An answer that carries logprobs says how sure the model was
// of each token (policy/openai's logprobs.go: the entropy of its top-k alternatives,
// renormalised, and the margin between the two most probable). A candidate less sure of
// itself than its reference on the same requests is a regression signal even when its text
// reads alike: it is closer to saying something else. Each answer is summarised by its mean
// token entropy and its share of tokens whose margin is below LowMarginBelow; the verdict
// compares the candidate's with its reference's (the baseline, else the primary) on the same
// requests, as the paired latencies are: the Wilcoxon signed-rank test of the differences,
// the effect their mean with its interval (see pairedShift).

// LowMarginBelow is the margin (top-1 minus top-2 probability) below which a token counts
// in an answer's low-margin share: the confidence policy's default low_margin.
const LowMarginBelow = 0.1

// MirrorTopLogprobs is the number of alternatives AskLogprobs asks the copies for.
const MirrorTopLogprobs = 5

// Confidence summarises the logprobs of an answer's first choice. Tokens counts its tokens
// that came with two alternatives or more; 0 means the answer carried none (or none usable),
// and the other fields are 0.
type Confidence struct {
	Tokens      int     `json:"tokens,omitempty"`
	MeanEntropy float64 `json:"mean_entropy,omitempty"` // nats
	LowMargin   float64 `json:"low_margin,omitempty"`   // share of the tokens, in [0, 1]
}

// Valid reports whether the answer carried logprobs to compare.
func (c Confidence) Valid() bool {
	return c.Tokens > 0 && !math.IsNaN(c.MeanEntropy) && !math.IsInf(c.MeanEntropy, 0) && c.MeanEntropy >= 0 &&
		c.LowMargin >= 0 && c.LowMargin <= 1
}

// confidenceOf reads answers' logprobs into a Confidence: the first choice's tokens.
type confidenceOf struct {
	sc      openai.LogprobScanner
	visit   func(openai.TokenLogprob)
	n, low  int
	entropy float64
}

func newConfidenceOf() *confidenceOf {
	c := &confidenceOf{}
	c.visit = func(t openai.TokenLogprob) {
		if t.Choice != 0 || !t.HasAlts() {
			return
		}
		c.n++
		c.entropy += t.Entropy
		if t.Margin < LowMarginBelow {
			c.low++
		}
	}
	return c
}

func (c *confidenceOf) chunk(data []byte) { c.sc.ScanChunk(data, c.visit) }
func (c *confidenceOf) body(data []byte)  { c.sc.ScanBody(data, c.visit) }

func (c *confidenceOf) result() Confidence {
	if c.n == 0 {
		return Confidence{}
	}
	return Confidence{Tokens: c.n, MeanEntropy: c.entropy / float64(c.n), LowMargin: float64(c.low) / float64(c.n)}
}

// AskLogprobs returns the body of a mirrored copy asking the model server for logprobs, so
// that the confidence metrics compare the candidate with its reference: chat gets
// "logprobs": true and "top_logprobs": MirrorTopLogprobs, completions "logprobs":
// MirrorTopLogprobs. r is the parsed request; a request that names logprobs or top_logprobs
// itself (its answer then says what the client asked), a completions request with echo
// (whose logprobs would cover the prompt), or another kind is left as it is. body is never
// modified: the result is a copy, or body itself when nothing is added (also when it does
// not parse).
//
// Call it only when a baseline gets the same copy (mirror.baseline): both sandboxes then pay
// the same for the logprobs, so the paired latencies stay fair, while a candidate compared
// with the primary would pay for logprobs the primary was not asked for. The copies' answers
// grow with the logprobs (about 700 bytes a token at top 5 in vLLM's shape), so
// capture_bytes holds proportionally fewer tokens; a truncated answer's confidence is not
// compared.
func AskLogprobs(r *openai.Request, body []byte) []byte {
	if r == nil || r.LogprobsNamed {
		return body
	}
	k := []byte(strconv.Itoa(MirrorTopLogprobs))
	var out []byte
	var err error
	switch r.Kind {
	case openai.KindChat:
		if out, err = openai.SetField(body, "logprobs", []byte("true")); err == nil {
			out, err = openai.SetField(out, "top_logprobs", k)
		}
	case openai.KindCompletion:
		if r.Echo {
			return body
		}
		out, err = openai.SetField(body, "logprobs", k)
	default:
		return body
	}
	if err != nil {
		return body
	}
	return out
}

// confidencePair is one request's (reference, candidate) confidence, kept in the
// Accumulator's window; triple tells a baseline's from a primary's reference.
type confidencePair struct {
	ref, cand Confidence
	triple    bool
}

// PairedConfidence are (reference, candidate) per-answer values of the same requests: mean
// entropies (nats) and low-margin shares.
type PairedConfidence struct {
	Entropy, LowMargin [][2]float64
}

// pairedShift judges (reference, candidate) pairs of a metric where higher is worse: the
// Wilcoxon signed-rank test of the differences candidate − reference for significance, their
// mean for the effect, with its normal interval at 1 − Alpha (the mean, not the median: a
// low-margin share is 0 for most answers of a sure model, and the median difference of such
// answers is 0 whatever the others do). Regression when the mean difference is above bound
// and p < Alpha; Inconclusive when above it without significance. Too few pairs to judge is
// NotExercised (not every answer carries logprobs: a metric that few answers feed does not
// hold the decision), none Skipped. Primary and Cand are the two sides' means.
func pairedShift(cfg Config, name string, pairs [][2]float64, bound float64) Evidence {
	e := Evidence{Metric: name, Test: StatWilcoxon, NPrimary: len(pairs), NCandidate: len(pairs), Bound: bound, P: 1}
	if len(pairs) == 0 {
		e.Verdict, e.Note = Skipped, "no pair of answers that both carried logprobs"
		return e
	}
	if len(pairs) < cfg.MinSamples {
		e.Verdict = NotExercised
		e.Note = fmt.Sprintf("%d pairs of answers carried logprobs (need %d to judge)", len(pairs), cfg.MinSamples)
		return e
	}
	x, y := make([]float64, len(pairs)), make([]float64, len(pairs))
	d := make([]float64, len(pairs))
	for i, p := range pairs {
		x[i], y[i] = p[0], p[1]
		d[i] = p[1] - p[0]
	}
	w, err := Wilcoxon(x, y)
	if err != nil {
		e.Verdict, e.Note = NotExercised, err.Error()
		return e
	}
	n := float64(len(d))
	mean := Mean(d)
	var ss float64
	for _, v := range d {
		ss += (v - mean) * (v - mean)
	}
	half := math.Sqrt2 * math.Erfinv(1-cfg.Alpha) * math.Sqrt(ss/(n-1)/n) // n ≥ MinSamples ≥ 8
	e.Statistic, e.Z, e.P = w.WPlus, w.Z, w.P
	e.Effect, e.EffectLow, e.EffectHigh = mean, mean-half, mean+half
	e.Primary, e.Cand = Mean(x), Mean(y)
	e.Verdict = judge(e.Effect > bound, w.P, cfg.Alpha)
	return e
}

// finiteConfidencePairs returns the pairs whose values are finite.
func finiteConfidencePairs(ps [][2]float64) [][2]float64 {
	out := ps[:0:0]
	for _, p := range ps {
		if !math.IsNaN(p[0]) && !math.IsNaN(p[1]) && !math.IsInf(p[0], 0) && !math.IsInf(p[1], 0) {
			out = append(out, p)
		}
	}
	return out
}
