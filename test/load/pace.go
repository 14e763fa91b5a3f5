package load

import (
	"math"
	"math/rand/v2"
	"time"
)

// Arrival processes for open-loop load.
const (
	ArrivalPoisson  = "poisson"
	ArrivalConstant = "constant"
	ArrivalGamma    = "gamma"
)

// Pacer yields arrival offsets from the start of a run, one per call, in order.
type Pacer interface {
	Next() (time.Duration, bool)
}

// RatePacer is an open-loop pacer at Rate req/s: constant gaps, Poisson (exponential gaps),
// or Gamma gaps with shape Burstiness and mean 1/Rate (vLLM's --burstiness: 1 is Poisson,
// below 1 burstier, above 1 more regular). With RampTo > 0 the rate moves linearly from Rate
// to RampTo over RampOver (gaps are drawn in "unit" time and mapped through the inverse of
// the cumulative rate).
type RatePacer struct {
	Rate, RampTo float64
	RampOver     time.Duration
	Arrival      string
	Burstiness   float64
	rng          *rand.Rand
	t            float64 // cumulative arrivals in unit time (expected count)
	n            int
}

// NewRatePacer returns a seeded pacer.
func NewRatePacer(rate float64, arrival string, burstiness float64, seed uint64) *RatePacer {
	return &RatePacer{Rate: rate, Arrival: arrival, Burstiness: burstiness, rng: rand.New(rand.NewPCG(seed, 0xa77))}
}

// Next returns the next arrival offset.
func (p *RatePacer) Next() (time.Duration, bool) {
	if !(p.Rate > 0) {
		return 0, false
	}
	var gap float64 // in expected arrivals (mean 1)
	switch p.Arrival {
	case ArrivalConstant:
		gap = 1
	case ArrivalGamma:
		b := p.Burstiness
		if !(b > 0) {
			b = 1
		}
		gap = gammaRand(p.rng, b) / b
	default:
		gap = p.rng.ExpFloat64()
	}
	if p.n == 0 && p.Arrival == ArrivalConstant {
		gap = 0 // constant: first request at once
	}
	p.n++
	p.t += gap
	return time.Duration(p.secondsAt(p.t) * float64(time.Second)), true
}

// secondsAt maps an expected count n to time: n = r0 t + (r1 − r0) t² / (2T) while ramping.
func (p *RatePacer) secondsAt(n float64) float64 {
	r0 := p.Rate
	if !(p.RampTo > 0) || p.RampOver <= 0 || p.RampTo == r0 {
		return n / r0
	}
	T := p.RampOver.Seconds()
	r1 := p.RampTo
	if full := (r0 + r1) / 2 * T; n > full {
		return T + (n-full)/r1
	}
	a := (r1 - r0) / (2 * T)
	// a t² + r0 t − n = 0
	disc := r0*r0 + 4*a*n
	if disc < 0 {
		return T
	}
	return (-r0 + math.Sqrt(disc)) / (2 * a)
}

// TracePacer replays trace timestamps multiplied by Scale.
type TracePacer struct {
	Items []Item
	Scale float64
	i     int
}

// Next returns the next trace arrival.
func (p *TracePacer) Next() (time.Duration, bool) {
	if p.i >= len(p.Items) {
		return 0, false
	}
	s := p.Scale
	if !(s > 0) {
		s = 1
	}
	at := time.Duration(float64(p.Items[p.i].At) * s)
	p.i++
	return at, true
}

// gammaRand draws Gamma(shape, 1) (Marsaglia and Tsang; shape < 1 by boosting).
func gammaRand(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		u := rng.Float64()
		for u == 0 {
			u = rng.Float64()
		}
		return gammaRand(rng, shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for range 1000 {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
	return shape // practically unreachable
}

// GammaDuration draws Gamma(shape, scale) as a duration (think time).
func GammaDuration(rng *rand.Rand, shape float64, scale time.Duration) time.Duration {
	if scale <= 0 || !(shape > 0) {
		return 0
	}
	return time.Duration(gammaRand(rng, shape) * float64(scale))
}
