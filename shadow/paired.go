package shadow

import (
	"cmp"
	"errors"
	"math"
	"math/bits"
	"slices"
)

// Paired comparisons. In shadow traffic the baseline and the candidate
// answer the same request at the same moment, so their latencies come in
// pairs (x_i, y_i): x the baseline's, y the candidate's. Most of the spread
// of a latency is the request's own (prompt and answer length), which both
// sides share; a paired test sees only the part that differs between the
// sides and so needs far fewer pairs than an unpaired one (TestPairedPower
// has numbers).
//
// For latencies use WilcoxonLogRatio for significance: the signed-rank test
// of log(y_i/x_i), scale-free and weighing short and long requests alike
// (P two-sided, PGreater for "is the candidate slower"). Use PairedRatio for
// the effect: PairRatio (median of y_i/x_i, interval PairLo–PairHi) is "a
// typical request is PairRatio× slower" and goes with the test; Ratio
// (median(y)/median(x), paired bootstrap interval Lo–Hi) is "the median
// latency moved by Ratio×". Under a uniform slowdown both estimate the same
// factor, PairRatio with about half the spread (TestPairedEffectPrecision).

// ErrLengthMismatch is returned when paired samples differ in length.
var ErrLengthMismatch = errors.New("shadow: paired samples differ in length")

// ErrNonPositive is returned when a ratio-based paired statistic is given a
// value ≤ 0.
var ErrNonPositive = errors.New("shadow: sample holds a value <= 0")

// WilcoxonExactMaxN is the largest number of non-zero differences for which
// Wilcoxon and WilcoxonLogRatio compute the exact p-value (as R's wilcox.test
// does below 50); above it they use the normal approximation. The exact
// distribution costs O(N³) time and O(N²) memory: for N = 50, about 64 000
// additions and one 20 KiB slice.
const WilcoxonExactMaxN = 50

// WilcoxonResult is the outcome of a Wilcoxon signed-rank test on paired
// differences d_i (y_i − x_i for Wilcoxon, log(y_i/x_i) for
// WilcoxonLogRatio).
type WilcoxonResult struct {
	// N is the number of non-zero differences, the ones ranked; Zeros the
	// number of zero differences, dropped before ranking (Wilcoxon's
	// method, R's and SciPy's default).
	N, Zeros int
	// WPlus and WMinus are the sums of the ranks of |d_i| over positive and
	// negative d_i; tied |d_i| share their average rank. WPlus+WMinus =
	// N(N+1)/2.
	WPlus, WMinus float64
	// Z is the standardised WPlus of the normal approximation, with the
	// tie-corrected variance and a continuity correction of ½ towards the
	// mean: positive when y tends to be larger. It is given even when P is
	// exact; it is 0 when N is 0.
	Z float64
	// P is the two-sided p-value; PGreater the one-sided p-value against
	// the alternative that y tends to be larger than x (the candidate
	// slower). Both are 1 when N is 0.
	P, PGreater float64
	// Exact reports whether P and PGreater come from the exact permutation
	// distribution of WPlus (N ≤ WilcoxonExactMaxN; with ties, the
	// distribution conditional on the tied ranks) rather than from Z.
	Exact bool
	// RankBiserial is the matched-pairs rank-biserial correlation
	// (WPlus−WMinus)/(WPlus+WMinus), in [-1, 1]; positive when y tends
	// larger, 0 when N is 0.
	RankBiserial float64
}

// Wilcoxon runs the Wilcoxon signed-rank test on the paired differences
// d_i = y_i − x_i: under the null hypothesis each d_i is symmetric about 0
// (for example, x_i and y_i exchangeable within a pair). Zero differences
// are dropped (Wilcoxon's method, not Pratt's), tied |d_i| get average ranks
// and the variance its tie correction Σ(t³−t)/48. For N ≤
// WilcoxonExactMaxN non-zero differences the p-values are exact, otherwise
// from the normal approximation with continuity correction. All pairs equal
// gives N = 0 and P = PGreater = 1, not an error.
//
// For latencies prefer WilcoxonLogRatio: on raw differences the
// longest requests dominate the ranks.
//
// It fails with ErrEmptySample, ErrLengthMismatch, or ErrNonFinite (for a
// NaN or ±Inf value, or a difference that overflows).
func Wilcoxon(x, y []float64) (WilcoxonResult, error) {
	if err := checkPairs(x, y, false); err != nil {
		return WilcoxonResult{}, err
	}
	d := make([]float64, len(x))
	for i := range x {
		d[i] = y[i] - x[i]
		if math.IsInf(d[i], 0) {
			return WilcoxonResult{}, ErrNonFinite
		}
	}
	return signedRank(d, WilcoxonExactMaxN), nil
}

// WilcoxonLogRatio runs the Wilcoxon signed-rank test (as Wilcoxon) on the
// log ratios d_i = log(y_i/x_i) of positive paired values. This is the test
// for latencies: a candidate that is k× slower on every request moves every
// d_i by log k whatever the request's size, so short and long requests weigh
// alike, and the test is scale-free (milliseconds or seconds give the same
// result). A pair with y_i = x_i is a zero difference and is dropped.
//
// It fails as Wilcoxon does, and with ErrNonPositive for a value ≤ 0.
func WilcoxonLogRatio(x, y []float64) (WilcoxonResult, error) {
	if err := checkPairs(x, y, true); err != nil {
		return WilcoxonResult{}, err
	}
	d := make([]float64, len(x))
	for i := range x {
		d[i] = logRatio(y[i], x[i])
	}
	return signedRank(d, WilcoxonExactMaxN), nil
}

// logRatio is log(a/b) for positive finite a and b, exact 0 when a == b and
// equal for pairs with the same correctly rounded quotient.
func logRatio(a, b float64) float64 {
	q := a / b
	if q == 0 || math.IsInf(q, 0) { // the quotient under- or overflowed
		return math.Log(a) - math.Log(b)
	}
	return math.Log(q)
}

func checkPairs(x, y []float64, positive bool) error {
	if len(x) == 0 || len(y) == 0 {
		return ErrEmptySample
	}
	if len(x) != len(y) {
		return ErrLengthMismatch
	}
	for _, s := range [2][]float64{x, y} {
		for _, v := range s {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return ErrNonFinite
			}
			if positive && v <= 0 {
				return ErrNonPositive
			}
		}
	}
	return nil
}

// signedRank is the signed-rank test on the finite differences d, which it
// reorders, with exact p-values up to exactMaxN non-zero differences.
func signedRank(d []float64, exactMaxN int) WilcoxonResult {
	// Drop zeros, then sort by |d|.
	nz := d[:0]
	for _, v := range d {
		if v != 0 {
			nz = append(nz, v)
		}
	}
	r := WilcoxonResult{N: len(nz), Zeros: len(d) - len(nz), P: 1, PGreater: 1}
	if r.N == 0 {
		return r
	}
	d = nz
	slices.SortFunc(d, func(a, b float64) int { return cmp.Compare(math.Abs(a), math.Abs(b)) })

	// Ranks are doubled so that average ranks stay integers: positions
	// i..j-1 (0-based) share the rank (i+1+j)/2, doubled i+1+j.
	var wPlus2 int // doubled W+
	var tieSum float64
	for i := 0; i < len(d); {
		j := i + 1
		for j < len(d) && math.Abs(d[j]) == math.Abs(d[i]) {
			j++
		}
		for k := i; k < j; k++ {
			if d[k] > 0 {
				wPlus2 += i + 1 + j
			}
		}
		t := float64(j - i)
		tieSum += t*t*t - t
		i = j
	}
	n := float64(r.N)
	total := n * (n + 1) / 2
	r.WPlus = float64(wPlus2) / 2
	r.WMinus = total - r.WPlus
	r.RankBiserial = (r.WPlus - r.WMinus) / total

	mean := total / 2
	sd := math.Sqrt(n*(n+1)*(2*n+1)/24 - tieSum/48) // > 0 for N ≥ 1
	dev := r.WPlus - mean
	switch {
	case dev > 0.5:
		r.Z = (dev - 0.5) / sd
	case dev < -0.5:
		r.Z = (dev + 0.5) / sd
	}
	if r.N <= exactMaxN {
		r.Exact = true
		ge, le := signedRankTails(d, wPlus2)
		r.PGreater = math.Min(1, ge)
		r.P = math.Min(1, 2*math.Min(ge, le))
	} else {
		r.P = math.Min(1, math.Erfc(math.Abs(r.Z)/math.Sqrt2))
		r.PGreater = 0.5 * math.Erfc((dev-0.5)/sd/math.Sqrt2)
	}
	return r
}

// signedRankTails returns P(W+ ≥ w) and P(W+ ≤ w) for the doubled rank sum
// w2 = 2w under the null distribution given the ranks of d (sorted by |d|,
// no zeros): each rank independently counted with probability ½. The
// distribution is built by the usual subset-sum recursion over doubled
// ranks, in one slice of N(N+1)+1 probabilities.
func signedRankTails(d []float64, w2 int) (ge, le float64) {
	n := len(d)
	f := make([]float64, n*(n+1)+1) // f[s]: P(doubled W+ = s) over the ranks so far
	f[0] = 1
	top := 0
	for i := 0; i < n; {
		j := i + 1
		for j < n && math.Abs(d[j]) == math.Abs(d[i]) {
			j++
		}
		v := i + 1 + j
		for range j - i {
			top += v
			for s := top; s >= v; s-- {
				f[s] = 0.5 * (f[s] + f[s-v])
			}
			for s := v - 1; s >= 0; s-- {
				f[s] *= 0.5
			}
		}
		i = j
	}
	for s, p := range f[:top+1] {
		if s >= w2 {
			ge += p
		}
		if s <= w2 {
			le += p
		}
	}
	return ge, le
}

// DefaultResamples is the number of bootstrap resamples PairedRatio draws
// when asked for 0 or fewer.
const DefaultResamples = 2000

// MaxBootstrapDraws bounds the work of PairedRatio: it draws at most
// max(MaxBootstrapDraws/n, MinBootstrapResamples) resamples of n pairs,
// fewer than asked when n is large (RatioResult.Resamples says how many).
const MaxBootstrapDraws = 1 << 25

// MinBootstrapResamples is the fewest resamples PairedRatio draws, whatever
// n (see MaxBootstrapDraws).
const MinBootstrapResamples = 200

// RatioResult is the outcome of PairedRatio.
type RatioResult struct {
	N int // number of pairs
	// MedianX, MedianY are the sample medians of each side (as Median);
	// Ratio is MedianY/MedianX, the candidate's median relative to the
	// baseline's (Ratio−1 is the relative change).
	MedianX, MedianY, Ratio float64
	// Lo and Hi bound the paired bootstrap interval of the ratio of medians
	// at confidence Conf, from Resamples resamples of the pairs.
	Lo, Hi    float64
	Conf      float64
	Resamples int
	// PairRatio is the median of the per-pair ratios y_i/x_i: the typical
	// slowdown of one request, rather than that of the typical latency. It
	// is the estimate that goes with WilcoxonLogRatio, and far more precise
	// than Ratio when requests differ in size: each request is its own
	// control. PairLo and PairHi bound its distribution-free interval at
	// confidence at least Conf, order statistics of the per-pair ratios
	// chosen by the binomial (sign-test) distribution; below about
	// log2(2/(1−Conf)) pairs (8 at 0.99) no such interval exists and they
	// are the smallest and largest ratio.
	PairRatio, PairLo, PairHi float64
}

// PairedRatio estimates the ratio of medians median(y)/median(x) of positive
// paired values, with a bootstrap confidence interval at level conf in
// (0, 1). Each resample draws n pair indices with replacement, so a
// request's x and y stay together and the interval reflects the pairing; the
// interval is the percentile interval (R's type-7 quantiles at (1∓conf)/2)
// of the resamples' ratios of Harrell-Davis medians. Plain sample medians of
// resamples jump between a few order statistics, which for strongly paired
// latencies made the percentile interval too wide (99% coverage for a
// nominal 95% at n = 100); the Harrell-Davis median, a beta-weighted mean of
// the order statistics, is smooth and brings coverage to about 96–97% (see
// TestPairedRatioCoverage). Ratio itself stays the ratio of sample medians.
//
// resamples ≤ 0 means DefaultResamples; it is capped as MaxBootstrapDraws
// says. The result depends only on the data, conf, seed and the number of
// resamples: the generator (SplitMix64, indices by multiply-shift) is part
// of this package, not math/rand.
//
// Cost: O(n log n) to sort each side once, then O(n) per resample (its
// medians are read off the two sorted orders by counting how often each pair
// was drawn: no sorting, selection or copying), and O(B log B) for the B
// resample ratios: O(n log n + B·n) time and about 28n + 8·max(B−n, 0)
// bytes. For n = 10 000 and B = 1000, 10⁷ draws: about 0.1 s on one core.
//
// It fails with ErrEmptySample, ErrLengthMismatch, ErrNonFinite,
// ErrNonPositive, or an error for conf outside (0, 1).
func PairedRatio(x, y []float64, conf float64, seed uint64, resamples int) (RatioResult, error) {
	if err := checkPairs(x, y, true); err != nil {
		return RatioResult{}, err
	}
	if !(conf > 0 && conf < 1) {
		return RatioResult{}, errors.New("shadow: confidence level must be in (0, 1)")
	}
	n := len(x)
	r, ox, oy, pr := pairedMedians(x, y, conf)
	r.Resamples = resampleCount(resamples, n)
	resamples = r.Resamples
	r.Ratio = r.MedianY / r.MedianX

	counts := make([]int32, n) // counts[i]: how often the resample drew pair i
	hd := newHDWeights(n)
	ratios := pr[:0]
	if resamples > n {
		ratios = make([]float64, 0, resamples)
	}
	rng := splitMix64(seed)
	for range resamples {
		clear(counts)
		for range n {
			i, _ := bits.Mul64(rng.next(), uint64(n))
			counts[i]++
		}
		ratios = append(ratios, hd.median(y, oy, counts)/hd.median(x, ox, counts))
	}
	slices.Sort(ratios)
	r.Lo = quantile(ratios, (1-conf)/2)
	r.Hi = quantile(ratios, (1+conf)/2)
	return r, nil
}

// pairedMedians is PairedRatio without the bootstrap: both medians, the median of the
// per-pair ratios and its distribution-free interval (what the verdict uses), plus the sort
// orders of x and y and the sorted ratios, which the bootstrap goes on with. x and y are
// checked pairs.
func pairedMedians(x, y []float64, conf float64) (r RatioResult, ox, oy []int32, pr []float64) {
	n := len(x)
	ox, oy = sortedOrder(x), sortedOrder(y)
	r = RatioResult{N: n, Conf: conf}
	r.MedianX = midpoint(x[ox[(n-1)/2]], x[ox[n/2]])
	r.MedianY = midpoint(y[oy[(n-1)/2]], y[oy[n/2]])
	pr = make([]float64, n)
	for i := range x {
		pr[i] = y[i] / x[i]
	}
	slices.Sort(pr)
	r.PairRatio = midpoint(pr[(n-1)/2], pr[n/2])
	k := signRank(n, conf)
	r.PairLo, r.PairHi = pr[k], pr[n-1-k]
	return r, ox, oy, pr
}

// signRank returns k for the distribution-free confidence interval
// [s_(k), s_(n−1−k)] (0-based order statistics) of the median of n values at
// level conf: the largest k with P(Binomial(n, ½) ≤ k) ≤ (1−conf)/2, which
// makes the coverage 1 − 2·P(Binomial(n, ½) ≤ k) ≥ conf for a continuous
// distribution. When not even k = 0 qualifies (n < log2(2/(1−conf))) it
// returns 0, whose coverage is 1 − 2^(1−n).
func signRank(n int, conf float64) int {
	half := (1 - conf) / 2
	ln2n := float64(n) * math.Ln2
	var cdf float64 // P(Binomial(n, ½) ≤ j)
	for j := 0; j < n; j++ {
		cdf += math.Exp(lchoose(n, j) - ln2n)
		if cdf > half {
			return max(j-1, 0)
		}
	}
	return 0 // unreachable: cdf reaches 1 > half
}

// resampleCount is the number of resamples of n pairs PairedRatio draws
// when asked for asked.
func resampleCount(asked, n int) int {
	if asked <= 0 {
		asked = DefaultResamples
	}
	return min(asked, max(MaxBootstrapDraws/n, MinBootstrapResamples))
}

// sortedOrder returns the indices of v in ascending order of value.
func sortedOrder(v []float64) []int32 {
	o := make([]int32, len(v))
	for i := range o {
		o[i] = int32(i)
	}
	slices.SortStableFunc(o, func(a, b int32) int { return cmp.Compare(v[a], v[b]) })
	return o
}

// midpoint is (a+b)/2, exactly a when a == b (Median's even-count rule).
func midpoint(a, b float64) float64 {
	if a == b {
		return a
	}
	return (a + b) / 2
}

// splitMix64 is Steele, Lea and Flood's SplitMix64 generator, kept here so
// that a bootstrap is reproducible across Go releases.
type splitMix64 uint64

func (s *splitMix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// hdWeights holds the Harrell-Davis weights of the median for samples of n:
// the estimate of an ordered sample v_(0) ≤ … ≤ v_(n−1) is
// Σ (w[k+1]−w[k]) v_(k) with w[k] = I_{k/n}((n+1)/2, (n+1)/2), I the
// regularised incomplete beta function. w[k] is 0 for k ≤ lo and 1 for
// k ≥ hi: beyond 14 standard deviations of the beta distribution either side
// of ½ (about 14√n positions in all) the weights are below 1e-40.
type hdWeights struct {
	w      []float64
	lo, hi int
}

func newHDWeights(n int) hdWeights {
	h := hdWeights{w: make([]float64, n+1), lo: 0, hi: n}
	a := float64(n+1) / 2
	sd := 1 / (2 * math.Sqrt(float64(n)+2))
	for k := range h.w {
		q := float64(k) / float64(n)
		switch {
		case q < 0.5-14*sd:
			h.lo = k
		case q > 0.5+14*sd:
			h.w[k] = 1
			h.hi = min(h.hi, k)
		default:
			h.w[k] = betaInc(a, a, q)
		}
	}
	return h
}

// median is the Harrell-Davis median of the resample holding counts[i]
// copies of v[i] (counts summing to len(v)), read off the ascending order o:
// the copies of v[i] at sorted positions cum..cum+c−1 weigh w[cum+c]−w[cum]
// together.
func (h hdWeights) median(v []float64, o []int32, counts []int32) float64 {
	var s float64
	cum := 0
	for _, i := range o {
		next := cum + int(counts[i])
		if next > h.lo {
			s += (h.w[next] - h.w[cum]) * v[i]
			if next >= h.hi {
				break
			}
		}
		cum = next
	}
	return s
}

// betaInc is the regularised incomplete beta function I_x(a, b).
func betaInc(a, b, x float64) float64 {
	if x <= 0 {
		return 0
	}
	if x >= 1 {
		return 1
	}
	la, _ := math.Lgamma(a)
	lb, _ := math.Lgamma(b)
	lab, _ := math.Lgamma(a + b)
	bt := math.Exp(lab - la - lb + a*math.Log(x) + b*math.Log1p(-x))
	if x < (a+1)/(a+b+2) {
		return bt * betaCF(a, b, x) / a
	}
	return 1 - bt*betaCF(b, a, 1-x)/b
}

// betaCF evaluates the continued fraction of betaInc by Lentz's method.
func betaCF(a, b, x float64) float64 {
	const eps, tiny = 1e-16, 1e-300
	fix := func(v float64) float64 {
		if math.Abs(v) < tiny {
			return tiny
		}
		return v
	}
	c, d := 1.0, 1/fix(1-(a+b)*x/(a+1))
	h := d
	for m := 1; m <= 100000; m++ {
		fm := float64(m)
		aa := fm * (b - fm) * x / ((a + 2*fm - 1) * (a + 2*fm))
		d = 1 / fix(1+aa*d)
		c = fix(1 + aa/c)
		h *= d * c
		aa = -(a + fm) * (a + b + fm) * x / ((a + 2*fm) * (a + 2*fm + 1))
		d = 1 / fix(1+aa*d)
		c = fix(1 + aa/c)
		del := d * c
		h *= del
		if math.Abs(del-1) < eps {
			break
		}
	}
	return h
}
