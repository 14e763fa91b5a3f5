package shadow

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// bruteSignedRank computes the signed-rank statistics of the differences d
// from their definitions, independently of signedRank: ranks by counting
// (rank of |d_i| = 1 + #smaller + #ties/2), and the exact tails by
// enumerating all 2^N sign assignments of the ranks.
func bruteSignedRank(d []float64) (n int, wPlus, pGE, pLE, z float64) {
	var nz []float64
	for _, v := range d {
		if v != 0 {
			nz = append(nz, v)
		}
	}
	n = len(nz)
	rank := make([]float64, n)
	var tie float64
	for i, v := range nz {
		smaller, equal := 0, 0
		for _, w := range nz {
			switch {
			case math.Abs(w) < math.Abs(v):
				smaller++
			case math.Abs(w) == math.Abs(v):
				equal++
			}
		}
		rank[i] = 1 + float64(smaller) + float64(equal-1)/2
		if v > 0 {
			wPlus += rank[i]
		}
		tie += float64(equal*equal - 1) // Σ over groups of t³−t is Σ over values of t²−1
	}
	if n == 0 {
		return 0, 0, 1, 1, 0
	}
	ge, le := 0, 0
	for mask := 0; mask < 1<<n; mask++ {
		var s float64
		for i := range n {
			if mask&(1<<i) != 0 {
				s += rank[i]
			}
		}
		if s >= wPlus-1e-9 {
			ge++
		}
		if s <= wPlus+1e-9 {
			le++
		}
	}
	f := float64(n)
	mean := f * (f + 1) / 4
	sd := math.Sqrt(f*(f+1)*(2*f+1)/24 - tie/48)
	switch dev := wPlus - mean; {
	case dev > 0.5:
		z = (dev - 0.5) / sd
	case dev < -0.5:
		z = (dev + 0.5) / sd
	}
	return n, wPlus, float64(ge) / float64(int(1)<<n), float64(le) / float64(int(1)<<n), z
}

func diffs(x, y []float64) []float64 {
	d := make([]float64, len(x))
	for i := range x {
		d[i] = y[i] - x[i]
	}
	return d
}

// TestWilcoxonTextbook: the depression-scale example of Hollander & Wolfe,
// Nonparametric Statistical Methods (1973), p. 29, as in R's ?wilcox.test:
// Hamilton scores of nine patients at the first (x) and second (y) visit
// after tranquilliser therapy. R:
//
//	wilcox.test(x, y, paired = TRUE, alternative = "greater")
//	V = 40, p-value = 0.01953
//
// The differences x−y are 0.952, −0.147, 1.022, 0.43, 0.62, 0.59, 0.49,
// −0.08, 0.01: ranked by size the negative ones are 2 and 3, so W+ = 45−5 =
// 40, and P(W+ ≥ 40) = #{subsets of 1..9 with sum ≤ 5}/2⁹ = 10/512. The
// normal approximation (R with exact = FALSE, correct = TRUE): z =
// (40 − 22.5 − ½)/√71.25 = 2.01399, one-sided p = 0.022005, two-sided
// p = 0.044010.
func TestWilcoxonTextbook(t *testing.T) {
	x := []float64{1.83, 0.50, 1.62, 2.48, 1.68, 1.88, 1.55, 3.06, 1.30}
	y := []float64{0.878, 0.647, 0.598, 2.05, 1.06, 1.29, 1.06, 3.14, 1.29}
	// Wilcoxon(a, b) tests b − a: R's x − y is Wilcoxon(y, x).
	r, err := Wilcoxon(y, x)
	if err != nil {
		t.Fatal(err)
	}
	wantZ := 17 / math.Sqrt(71.25)
	if r.N != 9 || r.Zeros != 0 || r.WPlus != 40 || r.WMinus != 5 || !r.Exact ||
		!near(r.PGreater, 10.0/512, 1e-15) || !near(r.P, 20.0/512, 1e-15) ||
		!near(r.Z, wantZ, 1e-12) || !near(r.RankBiserial, 35.0/45, 1e-15) {
		t.Errorf("got %+v", r)
	}
	if !near(wantZ, 2.01399, 1e-5) {
		t.Errorf("z = %v", wantZ)
	}
	// The normal approximation, as used above WilcoxonExactMaxN.
	a := signedRank(diffs(y, x), 0)
	if a.Exact || !near(a.PGreater, 0.022005, 1e-6) || !near(a.P, 0.044010, 1e-6) || a.Z != r.Z {
		t.Errorf("approximate: %+v", a)
	}
	// Brute force over the 512 sign assignments.
	n, w, ge, le, z := bruteSignedRank(diffs(y, x))
	if n != 9 || w != 40 || ge != r.PGreater || !near(r.P, 2*math.Min(ge, le), 1e-15) || !near(z, r.Z, 1e-12) {
		t.Errorf("brute force: n=%d W+=%v ge=%v le=%v z=%v", n, w, ge, le, z)
	}
	// Mirrored: the candidate faster.
	m, _ := Wilcoxon(x, y)
	if m.WPlus != 5 || m.WMinus != 40 || m.Z != -r.Z || m.P != r.P || !near(m.PGreater, 1-7.0/512, 1e-15) {
		t.Errorf("mirrored: %+v", m)
	}
}

// TestWilcoxonTiesAndZeros: the worked example of Wikipedia's "Wilcoxon
// signed-rank test" article (ten pairs, one zero difference, one tie):
// differences 15, −7, 5, 20, 0, −9, 17, −12, 5, −10; the zero is dropped
// (N = 9), the two 5s share rank 1.5, W+ = 27, W− = 18, signed-rank sum
// W = 9.
func TestWilcoxonTiesAndZeros(t *testing.T) {
	x1 := []float64{110, 122, 125, 120, 140, 124, 123, 137, 135, 145}
	x2 := []float64{125, 115, 130, 140, 140, 115, 140, 125, 140, 135}
	r, err := Wilcoxon(x1, x2)
	if err != nil {
		t.Fatal(err)
	}
	n, w, ge, le, z := bruteSignedRank(diffs(x1, x2))
	// Variance 9·10·19/24 − (2³−2)/48 = 71.125; z = (27−22.5−½)/√71.125.
	if r.N != 9 || r.Zeros != 1 || r.WPlus != 27 || r.WMinus != 18 || n != 9 || w != 27 ||
		!near(r.Z, 4/math.Sqrt(71.125), 1e-12) || !near(z, r.Z, 1e-12) ||
		!near(r.PGreater, ge, 1e-14) || !near(r.P, math.Min(1, 2*math.Min(ge, le)), 1e-14) {
		t.Errorf("got %+v; brute force W+=%v ge=%v le=%v z=%v", r, w, ge, le, z)
	}
	if r.P < 0.4 { // far from significant, as the article concludes
		t.Errorf("p = %v", r.P)
	}
}

// TestWilcoxonBruteForce compares the exact p-values and statistics with
// enumeration on random small samples of integers (many ties and zeros).
func TestWilcoxonBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := range 400 {
		n := 1 + rng.IntN(16)
		x, y := make([]float64, n), make([]float64, n)
		spread := 1 + rng.IntN(8)
		for i := range x {
			x[i] = float64(rng.IntN(spread))
			y[i] = float64(rng.IntN(spread) + rng.IntN(2)) // a slight shift
		}
		r, err := Wilcoxon(x, y)
		if err != nil {
			t.Fatal(err)
		}
		bn, w, ge, le, z := bruteSignedRank(diffs(x, y))
		if r.N != bn || r.Zeros != n-bn || r.WPlus != w || !near(r.Z, z, 1e-12) ||
			!near(r.PGreater, math.Min(1, ge), 1e-12) || !near(r.P, math.Min(1, 2*math.Min(ge, le)), 1e-12) ||
			r.WPlus+r.WMinus != float64(bn*(bn+1))/2 {
			t.Fatalf("iter %d x=%v y=%v: got %+v; brute N=%d W+=%v ge=%v le=%v z=%v", iter, x, y, r, bn, w, ge, le, z)
		}
		if bn > 0 && !r.Exact {
			t.Fatalf("N=%d not exact", bn)
		}
	}
}

func TestWilcoxonEdges(t *testing.T) {
	// All pairs equal: nothing to rank.
	r, err := Wilcoxon([]float64{1, 2, 3}, []float64{1, 2, 3})
	if err != nil || r.N != 0 || r.Zeros != 3 || r.P != 1 || r.PGreater != 1 || r.Z != 0 || r.RankBiserial != 0 {
		t.Errorf("all zero: %+v %v", r, err)
	}
	// One pair: W+ is 0 or 1 with probability ½ each.
	r, _ = Wilcoxon([]float64{1}, []float64{2})
	if r.N != 1 || r.WPlus != 1 || r.PGreater != 0.5 || r.P != 1 {
		t.Errorf("one pair: %+v", r)
	}
	// All differences tied: W+ = N(N+1)/2 = 28 when all positive; the
	// tie-corrected variance 7·8·15/24 − (7³−7)/48 = 28 is still positive.
	x := []float64{1, 2, 3, 4, 5, 6, 7}
	y := []float64{2, 3, 4, 5, 6, 7, 8}
	r, _ = Wilcoxon(x, y)
	if r.WPlus != 28 || !near(r.PGreater, 1.0/128, 1e-15) || !near(r.Z, 13.5/math.Sqrt(28), 1e-12) || r.RankBiserial != 1 {
		t.Errorf("all tied: %+v", r)
	}
	// Shift and scale invariance of the raw test; power-of-two scaling of the
	// log-ratio test (exact in floating point).
	a, _ := Wilcoxon([]float64{3, 1, 4, 1, 5, 9, 2, 6}, []float64{2, 7, 1, 8, 2, 8, 1, 8})
	b, _ := Wilcoxon([]float64{103, 101, 104, 101, 105, 109, 102, 106}, []float64{102, 107, 101, 108, 102, 108, 101, 108})
	if a != b {
		t.Errorf("shift: %+v vs %+v", a, b)
	}
	lx := []float64{120, 80, 300, 95, 210, 150, 60, 75, 400, 33}
	ly := []float64{130, 70, 330, 100, 250, 140, 66, 80, 390, 40}
	l1, _ := WilcoxonLogRatio(lx, ly)
	for i := range lx {
		lx[i], ly[i] = lx[i]/1024, ly[i]/1024
	}
	l2, _ := WilcoxonLogRatio(lx, ly)
	if l1 != l2 {
		t.Errorf("scale: %+v vs %+v", l1, l2)
	}
	// Equal ratios tie exactly: 100→110 and 200→220 and 50→55.
	lr, _ := WilcoxonLogRatio([]float64{100, 200, 50, 70}, []float64{110, 220, 55, 70})
	if lr.N != 3 || lr.Zeros != 1 || lr.WPlus != 6 {
		t.Errorf("log-ratio ties: %+v", lr)
	}
	// Quotients that overflow or underflow.
	lr, err = WilcoxonLogRatio([]float64{1e-300, 1e300}, []float64{1e300, 1e-300})
	if err != nil || lr.N != 2 || lr.WPlus != 1.5 {
		t.Errorf("extreme quotients: %+v %v", lr, err)
	}
}

func TestWilcoxonErrors(t *testing.T) {
	tests := []struct {
		name string
		x, y []float64
		want error
		log  bool
	}{
		{"empty", nil, nil, ErrEmptySample, false},
		{"empty y", []float64{1}, nil, ErrEmptySample, false},
		{"mismatch", []float64{1, 2}, []float64{1}, ErrLengthMismatch, false},
		{"NaN", []float64{1, math.NaN()}, []float64{1, 2}, ErrNonFinite, false},
		{"Inf", []float64{1, 2}, []float64{math.Inf(1), 2}, ErrNonFinite, false},
		{"overflowing difference", []float64{-math.MaxFloat64}, []float64{math.MaxFloat64}, ErrNonFinite, false},
		{"log empty", nil, []float64{1}, ErrEmptySample, true},
		{"log mismatch", []float64{1}, []float64{1, 2}, ErrLengthMismatch, true},
		{"log zero", []float64{1, 0}, []float64{1, 2}, ErrNonPositive, true},
		{"log negative", []float64{1, 2}, []float64{-1, 2}, ErrNonPositive, true},
		{"log NaN", []float64{1, 2}, []float64{math.NaN(), 2}, ErrNonFinite, true},
	}
	for _, tt := range tests {
		f := Wilcoxon
		if tt.log {
			f = WilcoxonLogRatio
		}
		if _, err := f(tt.x, tt.y); !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v want %v", tt.name, err, tt.want)
		}
	}
}

// TestWilcoxonLargeN: the exact distribution and the normal approximation
// with continuity correction agree more closely as N grows, and the switch
// at WilcoxonExactMaxN moves p by little.
func TestWilcoxonLargeN(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for _, tc := range []struct {
		n, runs int
		tol     float64
	}{{20, 30, 0.01}, {50, 30, 0.004}, {150, 20, 0.0015}, {400, 4, 0.0006}} { // exact costs O(n³)
		worst := 0.0
		for range tc.runs {
			d := make([]float64, tc.n)
			for i := range d {
				d[i] = rng.NormFloat64() + 0.15
			}
			ex := signedRank(slices.Clone(d), math.MaxInt)
			ap := signedRank(slices.Clone(d), 0)
			if !ex.Exact || ap.Exact || ex.WPlus != ap.WPlus || ex.Z != ap.Z {
				t.Fatalf("n=%d: %+v vs %+v", tc.n, ex, ap)
			}
			worst = max(worst, math.Abs(ex.P-ap.P), math.Abs(ex.PGreater-ap.PGreater))
		}
		t.Logf("n=%d: largest |exact − normal| p difference %.2g", tc.n, worst)
		if worst > tc.tol {
			t.Errorf("n=%d: exact and normal p differ by %v > %v", tc.n, worst, tc.tol)
		}
	}
	// The public functions switch at WilcoxonExactMaxN.
	for _, n := range []int{WilcoxonExactMaxN, WilcoxonExactMaxN + 1} {
		x, y := make([]float64, n), make([]float64, n)
		for i := range x {
			x[i], y[i] = 1, 1+rng.NormFloat64()
		}
		r, _ := Wilcoxon(x, y)
		if r.Exact != (n <= WilcoxonExactMaxN) {
			t.Errorf("n=%d: Exact=%v", n, r.Exact)
		}
	}
}

func TestWilcoxonAllocs(t *testing.T) {
	x, y := make([]float64, 2000), make([]float64, 2000)
	for i := range x {
		x[i], y[i] = float64(i%97+1), float64(i%89+1)
	}
	for _, n := range []int{40, 2000} {
		// The differences, and for the exact p the distribution.
		if a := testing.AllocsPerRun(20, func() { _, _ = WilcoxonLogRatio(x[:n], y[:n]) }); a > 2 {
			t.Errorf("n=%d: %v allocations", n, a)
		}
	}
}

func TestPairedRatioBasics(t *testing.T) {
	x := []float64{1, 2, 3, 4, 5}
	y := []float64{2, 4, 6, 8, 10}
	r, err := PairedRatio(x, y, 0.95, 1, 500)
	if err != nil {
		t.Fatal(err)
	}
	// y = 2x: every resample has the same pairs at its medians.
	if r.N != 5 || r.MedianX != 3 || r.MedianY != 6 || r.Ratio != 2 || r.Lo != 2 || r.Hi != 2 ||
		r.PairRatio != 2 || r.PairLo != 2 || r.PairHi != 2 || r.Conf != 0.95 || r.Resamples != 500 {
		t.Errorf("got %+v", r)
	}
	// Even n: medians are midpoints, as Median's.
	x = []float64{10, 40, 20, 30}
	y = []float64{12, 50, 26, 33}
	r, _ = PairedRatio(x, y, 0.9, 1, 0)
	if r.MedianX != Median(x) || r.MedianY != Median(y) || r.Ratio != Median(y)/Median(x) ||
		r.PairRatio != (1.2+1.25)/2 || r.PairLo != 1.1 || r.PairHi != 1.3 || // too few pairs: the range
		r.Resamples != DefaultResamples || !(r.Lo <= r.Ratio && r.Ratio <= r.Hi) {
		t.Errorf("even: %+v", r)
	}
	// MannWhitney's MedianRatio is the same ratio of medians.
	mw, _ := MannWhitney(x, y)
	if mw.MedianRatio != r.Ratio {
		t.Errorf("MedianRatio %v vs %v", mw.MedianRatio, r.Ratio)
	}
}

func TestPairedRatioDeterministic(t *testing.T) {
	x, y := lognormalPairs(rand.New(rand.NewPCG(1, 1)), 80, 1.2)
	a, _ := PairedRatio(x, y, 0.95, 42, 1000)
	b, _ := PairedRatio(x, y, 0.95, 42, 1000)
	c, _ := PairedRatio(x, y, 0.95, 43, 1000)
	if a != b {
		t.Errorf("same seed: %+v vs %+v", a, b)
	}
	if a.Lo == c.Lo && a.Hi == c.Hi {
		t.Errorf("seeds 42 and 43 gave the same interval %v–%v", a.Lo, a.Hi)
	}
	if a.Ratio != c.Ratio || a.PairRatio != c.PairRatio {
		t.Error("point estimates depend on the seed")
	}
	// Inputs are not modified.
	x2, y2 := lognormalPairs(rand.New(rand.NewPCG(1, 1)), 80, 1.2)
	if !slices.Equal(x, x2) || !slices.Equal(y, y2) {
		t.Error("PairedRatio modified its input")
	}
	// A wider level gives a wider interval from the same resamples.
	w, _ := PairedRatio(x, y, 0.99, 42, 1000)
	if !(w.Lo <= a.Lo && a.Hi <= w.Hi) {
		t.Errorf("99%% %v–%v inside 95%% %v–%v", w.Lo, w.Hi, a.Lo, a.Hi)
	}
}

func TestPairedRatioErrors(t *testing.T) {
	one := []float64{1}
	for _, tt := range []struct {
		name string
		x, y []float64
		conf float64
		want error
	}{
		{"empty", nil, nil, 0.95, ErrEmptySample},
		{"mismatch", []float64{1, 2}, one, 0.95, ErrLengthMismatch},
		{"zero", []float64{0}, one, 0.95, ErrNonPositive},
		{"negative", one, []float64{-2}, 0.95, ErrNonPositive},
		{"Inf", one, []float64{math.Inf(1)}, 0.95, ErrNonFinite},
	} {
		if _, err := PairedRatio(tt.x, tt.y, tt.conf, 1, 10); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	for _, conf := range []float64{0, 1, -0.5, 1.5, math.NaN()} {
		if _, err := PairedRatio(one, one, conf, 1, 10); err == nil {
			t.Errorf("conf %v accepted", conf)
		}
	}
}

func TestResampleCount(t *testing.T) {
	for _, tt := range []struct{ asked, n, want int }{
		{0, 100, DefaultResamples},
		{-1, 100, DefaultResamples},
		{5000, 100, 5000},
		{2000, 10000, 2000}, // the default window: not capped
		{2000, MaxBootstrapDraws / 1000, 1000},
		{2000, MaxBootstrapDraws, MinBootstrapResamples},
		{50, MaxBootstrapDraws, 50},
	} {
		if got := resampleCount(tt.asked, tt.n); got != tt.want {
			t.Errorf("resampleCount(%d, %d) = %d want %d", tt.asked, tt.n, got, tt.want)
		}
	}
}

// TestHDMedian checks the counting Harrell-Davis median against the
// estimate computed from its definition on the expanded, sorted resample.
func TestHDMedian(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for iter := range 600 {
		n := 1 + rng.IntN(12)
		if iter%10 == 0 {
			n = 300 + rng.IntN(600) // wide enough for the cut-off tails
		}
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(rng.IntN(6)) + rng.Float64() // some ties
		}
		counts := make([]int32, n)
		var sample []float64
		for range n {
			i := rng.IntN(n)
			counts[i]++
			sample = append(sample, v[i])
		}
		slices.Sort(sample)
		a := float64(n+1) / 2
		var want float64
		for k, x := range sample {
			want += (betaInc(a, a, float64(k+1)/float64(n)) - betaInc(a, a, float64(k)/float64(n))) * x
		}
		if got := newHDWeights(n).median(v, sortedOrder(v), counts); !near(got, want, 1e-12*want) {
			t.Fatalf("n=%d: %v want %v", n, got, want)
		}
	}
	// Harrell-Davis of 1, 2, 3: weights I_{1/3}(2,2), …: 7/27, 13/27, 7/27.
	if got := newHDWeights(3).median([]float64{3, 1, 2}, []int32{1, 2, 0}, []int32{1, 1, 1}); !near(got, 2, 1e-15) {
		t.Errorf("HD(1,2,3) = %v", got)
	}
	if got := newHDWeights(3).median([]float64{0, 0, 27}, []int32{0, 1, 2}, []int32{1, 1, 1}); !near(got, 7, 1e-13) {
		t.Errorf("HD(0,0,27) = %v want 7", got)
	}
}

func TestBetaInc(t *testing.T) {
	for _, x := range []float64{0, 1e-9, 0.1, 0.25, 0.5, 0.6, 0.9, 1 - 1e-9, 1} {
		for _, tc := range []struct {
			a, want float64
		}{
			{1, x},
			{2, 3*x*x - 2*x*x*x},
			{3, 10*math.Pow(x, 3) - 15*math.Pow(x, 4) + 6*math.Pow(x, 5)},
		} {
			if got := betaInc(tc.a, tc.a, x); !near(got, tc.want, 1e-14) {
				t.Errorf("I_%v(%v,%v) = %v want %v", x, tc.a, tc.a, got, tc.want)
			}
		}
	}
	// I_x(2,5) = 1 − (1−x)^5 (1 + 5x)... checked at x = 0.3 against
	// Σ_{j≥2} C(6,j) x^j (1−x)^(6−j).
	want := 0.0
	for j := 2; j <= 6; j++ {
		want += math.Exp(lchoose(6, j)) * math.Pow(0.3, float64(j)) * math.Pow(0.7, float64(6-j))
	}
	if got := betaInc(2, 5, 0.3); !near(got, want, 1e-14) {
		t.Errorf("I_0.3(2,5) = %v want %v", got, want)
	}
	// Large symmetric a: close to the normal, ½ at the centre.
	for _, a := range []float64{50.5, 5000.5} {
		sd := 1 / (2 * math.Sqrt(2*a+1))
		// Γ-function cancellation costs digits for large a: 1e-12 at 5000.
		if got := betaInc(a, a, 0.5); !near(got, 0.5, 1e-11) {
			t.Errorf("I_0.5(%v,%v) = %v", a, a, got)
		}
		if got, phi := betaInc(a, a, 0.5+sd), 0.5*math.Erfc(-1/math.Sqrt2); !near(got, phi, 0.01) {
			t.Errorf("I(%v, %v) at +1 sd = %v, normal %v", a, a, got, phi)
		}
	}
}

func TestQuantile(t *testing.T) {
	s := []float64{1, 2, 3, 4, 5}
	for _, tt := range []struct{ q, want float64 }{{0, 1}, {1, 5}, {0.5, 3}, {0.125, 1.5}, {0.025, 1.1}} {
		if got := quantile(s, tt.q); !near(got, tt.want, 1e-12) {
			t.Errorf("q=%v: %v want %v", tt.q, got, tt.want)
		}
	}
	if quantile([]float64{7}, 0.3) != 7 {
		t.Error("single value")
	}
}

// lognormalPairs simulates n requests: each has its own latency scale
// (lognormal, σ = 1, as prompt and answer length give), and each side its
// own noise (lognormal, σ = 0.3); the candidate is effect× slower. The
// medians of the two sides' distributions are 100 and 100·effect.
func lognormalPairs(rng *rand.Rand, n int, effect float64) (x, y []float64) {
	x, y = make([]float64, n), make([]float64, n)
	for i := range x {
		scale := 100 * math.Exp(rng.NormFloat64())
		x[i] = scale * math.Exp(0.3*rng.NormFloat64())
		y[i] = effect * scale * math.Exp(0.3*rng.NormFloat64())
	}
	return x, y
}

// TestPairedRatioCoverage: over 200 simulated datasets the 95% interval
// holds the true ratio of medians about 95% of the time. With 200 datasets
// the standard error of the coverage is 1.5 points; the bounds allow for it
// and for the percentile bootstrap of a median erring a little on the
// short side.
func TestPairedRatioCoverage(t *testing.T) {
	const datasets = 200
	rng := rand.New(rand.NewPCG(2024, 1))
	for _, tc := range []struct {
		n, resamples int
		effect       float64
	}{{100, 1000, 1.25}, {300, 500, 1.0}} {
		hit, pairHit := 0, 0
		var width float64
		for k := range datasets {
			x, y := lognormalPairs(rng, tc.n, tc.effect)
			r, err := PairedRatio(x, y, 0.95, uint64(k), tc.resamples)
			if err != nil {
				t.Fatal(err)
			}
			if r.Lo <= tc.effect && tc.effect <= r.Hi {
				hit++
			}
			// The per-pair ratios' median is effect too (log y/x symmetric).
			if r.PairLo <= tc.effect && tc.effect <= r.PairHi {
				pairHit++
			}
			width += r.Hi - r.Lo
		}
		cov, pcov := float64(hit)/datasets, float64(pairHit)/datasets
		t.Logf("n=%d ratio %.2f: 95%% interval of the ratio of medians covered %d/%d = %.3f (mean width %.3f); "+
			"of the median pair ratio %.3f", tc.n, tc.effect, hit, datasets, cov, width/datasets, pcov)
		if cov < 0.90 || cov > 0.99 {
			t.Errorf("n=%d: coverage %.3f outside [0.90, 0.99]", tc.n, cov)
		}
		if pcov < 0.92 || pcov > 0.995 {
			t.Errorf("n=%d: pair-ratio coverage %.3f outside [0.92, 0.995]", tc.n, pcov)
		}
	}
}

// TestPairedEffectPrecision: with requests of varied size, the median of
// the per-pair ratios estimates a uniform slowdown far more tightly than
// the ratio of the two medians, whose sides each carry the spread of request
// sizes. For a 15% slower candidate it lists how often each estimate clears
// the default 10% bound, the effect a verdict compares with it.
func TestPairedEffectPrecision(t *testing.T) {
	const datasets, effect = 300, 1.15
	rng := rand.New(rand.NewPCG(77, 1))
	for _, n := range []int{50, 200} {
		var lr, lp []float64
		over, pover := 0, 0
		for range datasets {
			x, y := lognormalPairs(rng, n, effect)
			r, err := PairedRatio(x, y, 0.99, 1, 1)
			if err != nil {
				t.Fatal(err)
			}
			lr, lp = append(lr, math.Log(r.Ratio)), append(lp, math.Log(r.PairRatio))
			if r.Ratio > 1.1 {
				over++
			}
			if r.PairRatio > 1.1 {
				pover++
			}
		}
		sd := func(v []float64) float64 {
			m := Mean(v)
			var s float64
			for _, x := range v {
				s += (x - m) * (x - m)
			}
			return math.Sqrt(s / float64(len(v)-1))
		}
		t.Logf("n=%d, +15%%: sd of log Ratio %.3f, of log PairRatio %.3f; estimate above 1.10 in %d/%d (Ratio) and %d/%d (PairRatio)",
			n, sd(lr), sd(lp), over, datasets, pover, datasets)
		if sd(lp) > 0.8*sd(lr) || pover < over {
			t.Errorf("n=%d: PairRatio no more precise than Ratio", n)
		}
	}
}

// TestPairedPower compares the paired tests with Mann-Whitney on the same
// simulated latencies (lognormalPairs: per-request scale σ = 1, per-side
// noise σ = 0.3), rejecting at two-sided p < 0.01. Run it with
//
//	go test -run TestPairedPower -v ./shadow/
//
// for a table to copy. The paired tests see only the per-side noise, the
// unpaired one the per-request spread as well.
func TestPairedPower(t *testing.T) {
	const alpha = 0.01
	runs := 1000
	if testing.Short() {
		runs = 200
	}
	rng := rand.New(rand.NewPCG(99, 1))
	var tab strings.Builder
	fmt.Fprintf(&tab, "Share of %d simulated windows rejected at two-sided p < %v (candidate k× slower per request; "+
		"per-request lognormal scale σ=1, per-side noise σ=0.3):\n\n", runs, alpha)
	tab.WriteString("| pairs | candidate | Wilcoxon log-ratio (paired) | Wilcoxon y−x (paired) | Mann-Whitney (same pairs) | Mann-Whitney (independent samples) |\n")
	tab.WriteString("|------:|----------:|----------------------------:|----------------------:|--------------------------:|-----------------------------------:|\n")
	for _, n := range []int{50, 100, 200} {
		for _, effect := range []float64{1.3, 1.1, 1.0} {
			var lr, raw, mw, ind int
			for range runs {
				x, y := lognormalPairs(rng, n, effect)
				_, y2 := lognormalPairs(rng, n, effect) // other requests
				w, err1 := WilcoxonLogRatio(x, y)
				d, err2 := Wilcoxon(x, y)
				m, err3 := MannWhitney(x, y)
				mi, err4 := MannWhitney(x, y2)
				if err := errors.Join(err1, err2, err3, err4); err != nil {
					t.Fatal(err)
				}
				if mi.P < alpha {
					ind++
				}
				if w.P < alpha {
					lr++
				}
				if d.P < alpha {
					raw++
				}
				if m.P < alpha {
					mw++
				}
			}
			share := func(k int) float64 { return float64(k) / float64(runs) }
			fmt.Fprintf(&tab, "| %d | %+.0f%% | %.3f | %.3f | %.3f | %.3f |\n", n, 100*(effect-1), share(lr), share(raw), share(mw), share(ind))
			if effect > 1 {
				if lr < max(mw, ind, raw) {
					t.Errorf("n=%d +%.0f%%: paired log-ratio power %.3f below raw %.3f or unpaired %.3f, %.3f",
						n, 100*(effect-1), share(lr), share(raw), share(mw), share(ind))
				}
				continue
			}
			// False positives: α plus three binomial standard errors.
			slack := 3 * math.Sqrt(alpha*(1-alpha)/float64(runs))
			for name, k := range map[string]int{"log-ratio": lr, "raw": raw, "Mann-Whitney": mw, "independent Mann-Whitney": ind} {
				if share(k) > alpha+slack {
					t.Errorf("n=%d, no effect: %s false-positive rate %.3f > %.3f", n, name, share(k), alpha+slack)
				}
			}
		}
	}
	t.Log("\n" + tab.String())
}

func BenchmarkWilcoxonLogRatio(b *testing.B) {
	for _, n := range []int{50, 1000, 10000} {
		x, y := lognormalPairs(rand.New(rand.NewPCG(1, 2)), n, 1.1)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = WilcoxonLogRatio(x, y)
			}
		})
	}
}

func BenchmarkPairedRatio(b *testing.B) {
	for _, n := range []int{50, 1000, 10000} {
		x, y := lognormalPairs(rand.New(rand.NewPCG(1, 2)), n, 1.1)
		b.Run(fmt.Sprintf("n=%d/B=1000", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = PairedRatio(x, y, 0.99, 1, 1000)
			}
		})
	}
}

// TestSignRank: the order statistics of the distribution-free interval of a
// median, against the usual table (e.g. Conover, Practical Nonparametric
// Statistics, table A3): n = 10 at 95% is [x(2), x(9)] (1-based), with
// coverage 1 − 2·11/1024.
func TestSignRank(t *testing.T) {
	for _, tc := range []struct {
		n    int
		conf float64
		want int // 0-based
	}{
		{10, 0.95, 1}, {10, 0.99, 0}, {20, 0.95, 5}, {20, 0.99, 3}, {5, 0.95, 0}, {7, 0.99, 0}, {8, 0.99, 0}, {1, 0.5, 0},
	} {
		got := signRank(tc.n, tc.conf)
		if got != tc.want {
			t.Errorf("signRank(%d, %v) = %d want %d", tc.n, tc.conf, got, tc.want)
		}
	}
	// Against a direct binomial sum: the largest k with P(Bin ≤ k) ≤ α/2.
	for _, n := range []int{9, 30, 50, 101, 1000, 10000} {
		for _, conf := range []float64{0.9, 0.95, 0.99} {
			k := signRank(n, conf)
			cdf := func(j int) float64 {
				var p float64
				for i := 0; i <= j; i++ {
					p += math.Exp(lchoose(n, i) - float64(n)*math.Ln2)
				}
				return p
			}
			if cdf(k) > (1-conf)/2+1e-12 || cdf(k+1) <= (1-conf)/2 {
				t.Errorf("n=%d conf=%v: k=%d, P(≤k)=%v P(≤k+1)=%v", n, conf, k, cdf(k), cdf(k+1))
			}
		}
	}
}
