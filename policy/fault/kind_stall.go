package fault

// KindStall pauses the stream for `for`, once: before the event after the Nth event
// (after_events, default 0: before the first) or after the Nth token event (after_tokens).
const KindStall Kind = "stall"

type stallKind struct{}

func (stallKind) kind() Kind       { return KindStall }
func (stallKind) phase() phase     { return onEvents }
func (stallKind) params() []string { return []string{"for", "after_events", "after_tokens"} }

func (stallKind) check(s Spec) (c checker) {
	if s.For <= 0 {
		c.add("for", "required: how long to pause")
	}
	if s.AfterEvents < 0 {
		c.add("after_events", "must not be negative")
	}
	if s.AfterTokens < 0 {
		c.add("after_tokens", "must not be negative")
	}
	if s.AfterEvents > 0 && s.AfterTokens > 0 {
		c.add("after_tokens", "set after_events or after_tokens, not both")
	}
	return c
}

// open has the stream count token events when the stall waits for them.
func (stallKind) open(s *stream, st *fstate) {
	s.needTap = s.needTap || st.spec().AfterTokens > 0
}

func (stallKind) event(e *eventStep, st *fstate) bool {
	sp := st.spec()
	if (sp.AfterTokens > 0 && e.tokens >= sp.AfterTokens) || (sp.AfterTokens == 0 && e.n > sp.AfterEvents) {
		st.done = true
		e.wait += sp.For.D()
		return true
	}
	return false
}
