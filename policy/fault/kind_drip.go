package fault

import (
	"math/rand/v2"
	"time"
)

// KindDrip waits before every event: gap, plus a uniform [0, jitter), plus a Gamma(shape,
// scale) draw when set.
const KindDrip Kind = "drip"

type dripKind struct{}

func (dripKind) kind() Kind       { return KindDrip }
func (dripKind) phase() phase     { return onEvents }
func (dripKind) params() []string { return []string{"gap", "jitter", "shape", "scale"} }

func (dripKind) check(s Spec) (c checker) {
	c.gammaPair(&s)
	if s.Gap <= 0 && s.Jitter <= 0 && s.Shape <= 0 {
		c.add("gap", "a drip needs a gap, a jitter, or shape and scale")
	}
	return c
}

func (dripKind) event(e *eventStep, st *fstate) bool {
	sp := st.spec()
	e.wait += waitOf(e.rng, sp.Gap.D(), sp.Jitter.D(), sp.Shape, sp.Scale.D())
	return true
}

// waitOf is wait without a generator when there is nothing random to draw.
func waitOf(rng *rand.Rand, fixed, jitter time.Duration, shape float64, scale time.Duration) time.Duration {
	if jitter <= 0 && shape <= 0 {
		return fixed
	}
	return wait(rng, fixed, jitter, shape, scale)
}
