package fault

// KindDelay waits before forwarding: for, plus a Gamma(shape, scale) draw when set.
const KindDelay Kind = "delay"

type delayKind struct{}

func (delayKind) kind() Kind       { return KindDelay }
func (delayKind) phase() phase     { return beforeForwarding }
func (delayKind) params() []string { return []string{"for", "shape", "scale"} }

func (delayKind) check(s Spec) (c checker) {
	c.gammaPair(&s)
	if s.For <= 0 && s.Shape <= 0 {
		c.add("for", "a delay needs a duration (for) or shape and scale")
	}
	return c
}

func (delayKind) before(b beforeStep, f *fault) (beforeStep, bool) {
	b.wait = wait(b.rand(), f.spec.For.D(), 0, f.spec.Shape, f.spec.Scale.D())
	return b, true
}
