package fault

import "bytes"

// KindMalformed turns event N (at, default 1) into invalid JSON, as its mode says; a
// non-streaming JSON body likewise. It acts after the other faults on the event.
const KindMalformed Kind = "malformed"

// Modes of malformed.
const (
	MalformedTruncate = "truncate" // the first half of the event's JSON
	MalformedInvalid  = "invalid"  // the JSON with a trailing comma before its closing brace
)

type malformedKind struct{}

func (malformedKind) kind() Kind       { return KindMalformed }
func (malformedKind) phase() phase     { return lastOnEvents }
func (malformedKind) params() []string { return []string{"at", "mode"} }

func (malformedKind) check(s Spec) (c checker) {
	if s.At < 0 {
		c.add("at", "must not be negative")
	}
	switch s.Mode {
	case "", MalformedTruncate, MalformedInvalid:
	default:
		c.add("mode", "must be truncate or invalid, not %q", s.Mode)
	}
	return c
}

func (malformedKind) event(e *eventStep, st *fstate) bool {
	sp := st.spec()
	if e.drop || e.n != max(sp.At, 1) {
		return false
	}
	e.edit(malform(e.payload(), sp.Mode))
	return true
}

func (malformedKind) body(data []byte, st *fstate) ([]byte, bool) {
	return malform(data, st.spec().Mode), true
}

// malform returns the data made invalid JSON: its first half (truncate), or a trailing
// comma before its closing brace (invalid).
func malform(data []byte, mode string) []byte {
	t := bytes.TrimRight(data, " \t\r\n")
	if mode == MalformedInvalid {
		if n := len(t); n > 0 && (t[n-1] == '}' || t[n-1] == ']') {
			out := append([]byte(nil), t[:n-1]...)
			return append(append(out, ','), t[n-1])
		}
		return append([]byte("{,"), t...)
	}
	if len(t) < 2 {
		return []byte(`{"`)
	}
	return append([]byte(nil), t[:len(t)/2]...)
}
