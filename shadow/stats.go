package shadow

import (
	"errors"
	"math"
	"sort"
)

// MWResult is the outcome of a two-sided Mann-Whitney U test of x against y.
type MWResult struct {
	N1, N2 int
	// U is U₁, the U statistic of x: the number of (x, y) pairs with x > y,
	// counting ties as one half. U₂ = N1*N2 - U.
	U float64
	// Z is the standardised U₁ with tie and continuity corrections; positive
	// when x tends to be larger than y.
	Z float64
	// P is the two-sided p-value from the normal approximation.
	P float64
	// CLES is the common-language effect size P(X > Y) + ½P(X = Y) = U/(N1*N2).
	CLES float64
	// RankBiserial is 2*CLES - 1, in [-1, 1]; positive when x tends larger.
	RankBiserial float64
	// MedianX, MedianY are the sample medians; MedianRatio is MedianY/MedianX
	// (Kayenta-style effect; NaN when MedianX is 0).
	MedianX, MedianY, MedianRatio float64
}

// ErrEmptySample is returned when a test is given an empty sample.
var ErrEmptySample = errors.New("shadow: empty sample")

// ErrNonFinite is returned when a sample holds NaN or ±Inf.
var ErrNonFinite = errors.New("shadow: sample holds NaN or Inf")

// MannWhitney runs a two-sided Mann-Whitney U test on independent samples x
// and y. It uses the normal approximation with tie correction and a
// continuity correction of ½, which is adequate for at least 8 values per
// side. When all values are tied the variance is zero and P is 1.
func MannWhitney(x, y []float64) (MWResult, error) {
	n1, n2 := len(x), len(y)
	if n1 == 0 || n2 == 0 {
		return MWResult{}, ErrEmptySample
	}
	type obs struct {
		v     float64
		fromX bool
	}
	all := make([]obs, 0, n1+n2)
	for _, v := range x {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return MWResult{}, ErrNonFinite
		}
		all = append(all, obs{v, true})
	}
	for _, v := range y {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return MWResult{}, ErrNonFinite
		}
		all = append(all, obs{v, false})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v < all[j].v })

	n := float64(n1 + n2)
	var r1, tieSum float64
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j].v == all[i].v {
			j++
		}
		// positions i..j-1 share the average rank of ranks i+1..j.
		avg := float64(i+1+j) / 2
		t := float64(j - i)
		tieSum += t*t*t - t
		for k := i; k < j; k++ {
			if all[k].fromX {
				r1 += avg
			}
		}
		i = j
	}
	f1, f2 := float64(n1), float64(n2)
	u := r1 - f1*(f1+1)/2
	mean := f1 * f2 / 2
	variance := f1 * f2 / 12 * ((n + 1) - tieSum/(n*(n-1)))
	res := MWResult{N1: n1, N2: n2, U: u, P: 1}
	if variance > 0 {
		d := u - mean
		switch {
		case d > 0.5:
			d -= 0.5
		case d < -0.5:
			d += 0.5
		default:
			d = 0
		}
		res.Z = d / math.Sqrt(variance)
		res.P = math.Min(1, math.Erfc(math.Abs(res.Z)/math.Sqrt2))
	}
	res.CLES = u / (f1 * f2)
	res.RankBiserial = 2*res.CLES - 1
	res.MedianX = Median(x)
	res.MedianY = Median(y)
	if res.MedianX != 0 {
		res.MedianRatio = res.MedianY / res.MedianX
	} else {
		res.MedianRatio = math.NaN()
	}
	return res, nil
}

// PropResult is the outcome of a two-sided two-proportion z-test.
type PropResult struct {
	P1, P2 float64 // observed rates k1/n1 and k2/n2
	Diff   float64 // P2 - P1
	Z      float64 // (P2-P1)/SE with the pooled standard error
	P      float64 // two-sided p-value; 1 when the pooled rate is 0 or 1
}

// TwoProportion tests whether k1 of n1 and k2 of n2 come from the same rate,
// with a pooled-variance z-test. It needs n1, n2 > 0 and 0 ≤ k ≤ n.
func TwoProportion(k1, n1, k2, n2 int) (PropResult, error) {
	if n1 <= 0 || n2 <= 0 {
		return PropResult{}, ErrEmptySample
	}
	if k1 < 0 || k2 < 0 || k1 > n1 || k2 > n2 {
		return PropResult{}, errors.New("shadow: counts must satisfy 0 <= k <= n")
	}
	f1, f2 := float64(n1), float64(n2)
	r := PropResult{P1: float64(k1) / f1, P2: float64(k2) / f2, P: 1}
	r.Diff = r.P2 - r.P1
	pool := float64(k1+k2) / (f1 + f2)
	se := math.Sqrt(pool * (1 - pool) * (1/f1 + 1/f2))
	if se > 0 {
		r.Z = r.Diff / se
		r.P = math.Min(1, math.Erfc(math.Abs(r.Z)/math.Sqrt2))
	}
	return r, nil
}

// Median returns the median of xs (mean of the two middle values for an even
// count), or NaN for an empty slice. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// Mean returns the arithmetic mean of xs, or NaN for an empty slice.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, v := range xs {
		s += v
	}
	return s / float64(len(xs))
}

// FisherExact returns the two-sided p-value of Fisher's exact test for the
// 2×2 table {k1, n1-k1; k2, n2-k2}: the total probability, under the
// hypergeometric null with fixed margins, of tables no more likely than the
// observed one. It needs n1, n2 > 0 and 0 ≤ k ≤ n.
func FisherExact(k1, n1, k2, n2 int) (float64, error) {
	if n1 <= 0 || n2 <= 0 {
		return 0, ErrEmptySample
	}
	if k1 < 0 || k2 < 0 || k1 > n1 || k2 > n2 {
		return 0, errors.New("shadow: counts must satisfy 0 <= k <= n")
	}
	n, k := n1+n2, k1+k2
	logP := func(x int) float64 {
		return lchoose(k, x) + lchoose(n-k, n1-x) - lchoose(n, n1)
	}
	obs := logP(k1)
	var p float64
	for x := max(0, k-n2); x <= min(k, n1); x++ {
		if lp := logP(x); lp <= obs+1e-7 {
			p += math.Exp(lp)
		}
	}
	return math.Min(1, p), nil
}

func lchoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}
