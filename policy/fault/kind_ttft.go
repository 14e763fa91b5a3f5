package fault

// KindTTFT holds the first event for `for` (time to first token).
const KindTTFT Kind = "ttft"

type ttftKind struct{}

func (ttftKind) kind() Kind       { return KindTTFT }
func (ttftKind) phase() phase     { return onEvents }
func (ttftKind) params() []string { return []string{"for"} }

func (ttftKind) check(s Spec) (c checker) {
	if s.For <= 0 {
		c.add("for", "required: how long to hold the first event")
	}
	return c
}

func (ttftKind) event(e *eventStep, st *fstate) bool {
	if e.n != 1 {
		return false
	}
	e.wait += st.spec().For.D()
	return true
}
