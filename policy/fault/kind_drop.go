package fault

// KindDrop drops, as its mode says, the usage chunk (a chunk with choices loses only its
// usage field) or the data: [DONE] event (a Responses stream's terminal event).
const KindDrop Kind = "drop"

// Modes of drop.
const (
	DropUsage = "usage" // the usage chunk (or the usage field of a chunk with choices)
	DropDone  = "done"  // the data: [DONE] event
)

type dropKind struct{}

func (dropKind) kind() Kind       { return KindDrop }
func (dropKind) phase() phase     { return onEvents }
func (dropKind) params() []string { return []string{"mode"} }

func (dropKind) check(s Spec) (c checker) {
	switch s.Mode {
	case "", DropUsage, DropDone:
	default:
		c.add("mode", "must be usage or done, not %q", s.Mode)
	}
	return c
}

func (dropKind) event(e *eventStep, st *fstate) bool {
	if st.spec().Mode == DropDone {
		if e.ev.IsDone() || isResponsesTerminal(e.ev.Name) {
			e.drop = true
			return true
		}
		return false
	}
	d, drop, changed := dropUsage(e.payload())
	if changed {
		e.edit(d)
		e.drop = e.drop || drop
	}
	return changed
}

var usagePath = []seg{{key: "usage"}}

// responsesUsagePath is the usage of a Responses API terminal event (response.completed).
var responsesUsagePath = []seg{{key: "response"}, {key: "usage"}}

// isResponsesTerminal reports whether an event ends a Responses API stream (its stand-in for
// chat's [DONE]).
func isResponsesTerminal(name []byte) bool {
	switch string(name) {
	case "response.completed", "response.incomplete", "response.failed":
		return true
	}
	return false
}

// dropUsage handles drop usage on one chunk: a chunk with a usage object and no choices is
// dropped whole (drop true); a chunk that also has choices loses its usage field.
func dropUsage(data []byte) (out []byte, drop, changed bool) {
	if out, changed := editPath(data, responsesUsagePath, removeLeaf); changed {
		return out, false, true // a Responses terminal event keeps its response, without usage
	}
	var buf [16]member
	ms, ok := members(data, buf[:0])
	if !ok {
		return data, false, false
	}
	hasUsage, hasChoices := false, false
	for _, m := range ms {
		switch {
		case keyIs(data[m.start:m.keyEnd], "usage"):
			hasUsage = data[m.valStart] == '{'
		case keyIs(data[m.start:m.keyEnd], "choices"):
			v := data[m.valStart:m.end]
			hasChoices = len(v) > 0 && v[0] == '[' && skipWS(v, 1) < len(v) && v[skipWS(v, 1)] != ']'
		}
	}
	if !hasUsage {
		return data, false, false
	}
	if !hasChoices {
		return nil, true, true
	}
	out, changed = editPath(data, usagePath, removeLeaf)
	return out, false, changed
}
