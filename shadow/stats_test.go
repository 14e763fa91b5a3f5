package shadow

import (
	"errors"
	"math"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/test/pgtest"
)

// pgShared is the PostgreSQL server of the package's tests that run against one (started
// when first asked for, closed after the tests).
var pgShared pgtest.Shared

func TestMain(m *testing.M) { goleak.VerifyTestMain(closeAfter{m}) }

// closeAfter runs the tests, then stops the shared server (before the leak check).
type closeAfter struct{ m *testing.M }

func (c closeAfter) Run() int {
	defer pgShared.Close()
	return c.m.Run()
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestMannWhitney(t *testing.T) {
	seq := func(lo, hi float64) []float64 {
		var s []float64
		for v := lo; v <= hi; v++ {
			s = append(s, v)
		}
		return s
	}
	tests := []struct {
		name    string
		x, y    []float64
		u, z, p float64
		cles    float64
		ratio   float64
	}{
		// SciPy's mannwhitneyu documentation example (method="asymptotic"):
		// statistic 17.0, pvalue 0.11134688653314041.
		{"scipy males/females", []float64{19, 22, 16, 29, 24}, []float64{20, 11, 17, 12},
			17, 1.592168, 0.11134688653314041, 17.0 / 20, 14.5 / 22},
		// Completely separated, n=8 each: U=0, z=-(32-0.5)/sqrt(64*17/12).
		{"separated", seq(1, 8), seq(9, 16), 0, -3.308161698516173, 0.0009391056991171905, 0, 12.5 / 4.5},
		// Ties: ranks of x are 1, 3, 3, 6 → R=13, U=3; tie term 48.
		{"ties", []float64{1, 2, 2, 3}, []float64{2, 3, 3, 4}, 3, -1.365698202000489, 0.17203370892182296, 3.0 / 16, 3.0 / 2},
		{"identical", seq(1, 10), seq(1, 10), 50, 0, 1, 0.5, 1},
		{"all tied", []float64{5, 5, 5, 5, 5, 5, 5, 5}, []float64{5, 5, 5, 5, 5, 5, 5, 5}, 32, 0, 1, 0.5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := MannWhitney(tt.x, tt.y)
			if err != nil {
				t.Fatal(err)
			}
			if r.U != tt.u || !near(r.Z, tt.z, 1e-5) || !near(r.P, tt.p, 1e-9) || !near(r.CLES, tt.cles, 1e-12) ||
				!near(r.MedianRatio, tt.ratio, 1e-12) || !near(r.RankBiserial, 2*tt.cles-1, 1e-12) {
				t.Errorf("got U=%v z=%v p=%v cles=%v ratio=%v; want U=%v z=%v p=%v cles=%v ratio=%v",
					r.U, r.Z, r.P, r.CLES, r.MedianRatio, tt.u, tt.z, tt.p, tt.cles, tt.ratio)
			}
			// Swapping the samples mirrors U and z and keeps p.
			s, _ := MannWhitney(tt.y, tt.x)
			if s.U != float64(len(tt.x)*len(tt.y))-r.U || !near(s.Z, -r.Z, 1e-12) || !near(s.P, r.P, 1e-12) {
				t.Errorf("swap: U=%v z=%v p=%v", s.U, s.Z, s.P)
			}
		})
	}
}

func TestMannWhitneyErrors(t *testing.T) {
	if _, err := MannWhitney(nil, []float64{1}); !errors.Is(err, ErrEmptySample) {
		t.Errorf("empty: %v", err)
	}
	if _, err := MannWhitney([]float64{1, math.NaN()}, []float64{1}); !errors.Is(err, ErrNonFinite) {
		t.Errorf("NaN: %v", err)
	}
}

func TestTwoProportion(t *testing.T) {
	tests := []struct {
		name           string
		k1, n1, k2, n2 int
		z, p, diff     float64
		wantErr        bool
	}{
		// pooled 0.505, SE sqrt(.505*.495*.02), z = .11/SE.
		{"45/100 vs 56/100", 45, 100, 56, 100, 1.555712706190452, 0.11977642377972303, 0.11, false},
		{"reversed", 56, 100, 45, 100, -1.555712706190452, 0.11977642377972303, -0.11, false},
		{"equal", 10, 200, 10, 200, 0, 1, 0, false},
		{"all zero", 0, 200, 0, 200, 0, 1, 0, false},
		{"all one", 50, 50, 80, 80, 0, 1, 0, false},
		{"empty", 0, 0, 1, 10, 0, 0, 0, true},
		{"k>n", 11, 10, 1, 10, 0, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := TwoProportion(tt.k1, tt.n1, tt.k2, tt.n2)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if tt.wantErr {
				return
			}
			if !near(r.Z, tt.z, 1e-9) || !near(r.P, tt.p, 1e-9) || !near(r.Diff, tt.diff, 1e-12) {
				t.Errorf("got z=%v p=%v diff=%v", r.Z, r.P, r.Diff)
			}
		})
	}
}

func TestMedianMean(t *testing.T) {
	if m := Median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("odd median %v", m)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("even median %v", m)
	}
	if !math.IsNaN(Median(nil)) || !math.IsNaN(Mean(nil)) {
		t.Error("empty should be NaN")
	}
	if m := Mean([]float64{1, 2, 3, 6}); m != 3 {
		t.Errorf("mean %v", m)
	}
}

func TestFisherExact(t *testing.T) {
	tests := []struct {
		name           string
		k1, n1, k2, n2 int
		p              float64
		wantErr        bool
	}{
		// Fisher's lady tasting tea, table [[3,1],[1,3]]: p = 34/70.
		{"tea", 3, 4, 1, 4, 34.0 / 70, false},
		// [[0,10],[5,5]]: 2*C(15,10)/C(20,10) = 2*3003/184756.
		{"0/10 vs 5/10", 0, 10, 5, 10, 2 * 3003.0 / 184756, false},
		{"equal", 2, 200, 2, 200, 1, false},
		{"all zero", 0, 50, 0, 50, 1, false},
		{"empty", 0, 0, 0, 1, 0, true},
		{"k>n", 2, 1, 0, 1, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := FisherExact(tt.k1, tt.n1, tt.k2, tt.n2)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if !tt.wantErr && !near(p, tt.p, 1e-9) {
				t.Errorf("p = %v want %v", p, tt.p)
			}
		})
	}
}
