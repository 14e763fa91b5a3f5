package fault

// A faultKind is one kind of fault: the parameters it takes and their problems, the phase
// it acts in, and what it does there. Each lives in its own file, kind_<name>.go, and is
// listed in registry; the machinery (spec.go, injection.go, stream.go, engine.go) knows the
// kinds only through this interface and the phase ones below.
type faultKind interface {
	// kind is its name.
	kind() Kind
	// params lists the Spec parameters it takes besides the common keys, in the order the
	// "not a parameter of" problem names them.
	params() []string
	// check returns the problems of its own parameters, each under its field (Spec.Validate
	// adds the spec's path; it has checked the common keys already, and that no other
	// kind's parameter is set).
	check(s Spec) checker
	// phase is when it acts: before forwarding (a requestFault) or on the answer (an
	// eventFault).
	phase() phase
}

// phase is when a fault acts.
type phase uint8

const (
	// beforeForwarding: in Before, once per request (downstream) or per upstream attempt,
	// before the request goes on (delay, abort).
	beforeForwarding phase = iota
	// endsStream: on each event, before the other faults: it may end the stream in the
	// event's place (cut, an ender).
	endsStream
	// onEvents: on each event, in the faults' order: waits, edits, drops (ttft, stall,
	// drip, drop, corrupt, drift).
	onEvents
	// lastOnEvents: on each event, after the others: what the event ends up as
	// (malformed).
	lastOnEvents
)

// requestFault is a kind that acts before forwarding (phase beforeForwarding).
type requestFault interface {
	// before acts on the step (asks for a wait, chooses the abort) and returns it, and
	// whether the fault took effect.
	before(b beforeStep, f *fault) (beforeStep, bool)
}

// eventFault is a kind that acts on the events of the answer (phases endsStream to
// lastOnEvents).
type eventFault interface {
	// event acts on the event at hand (e: payload and edit for its data, wait, drop, end)
	// with the fault's state in the stream (st), and reports whether the fault took
	// effect. It runs per event and fault: it allocates nothing but its edit.
	event(e *eventStep, st *fstate) bool
}

// bodyFault is an eventFault that acts on a whole non-streaming JSON body too.
type bodyFault interface {
	// body returns data with the fault applied, and whether the fault took effect.
	body(data []byte, st *fstate) ([]byte, bool)
}

// ender is an eventFault that ends the stream (phase endsStream, by setting e.end): how
// the stream then ends on each side.
type ender interface {
	// endUpstream returns dst with what the gateway reads last appended, and the read
	// error that follows it.
	endUpstream(dst []byte, f *fault) ([]byte, error)
	// endDownstream returns dst with what the client gets last appended; reset: the
	// handler must instead flush and abort (panic(http.ErrAbortHandler)).
	endDownstream(dst []byte, f *fault) (out []byte, reset bool)
}

// opener is an eventFault with state of its own in each stream: open sets st.state (and
// what the stream must track for it).
type opener interface {
	open(s *stream, st *fstate)
}

// compiler is a kind that prepares its parameters once per fault, when the fault is built
// (on Set and Add; per request for a header fault), not per stream: compile returns what
// fault.compiled holds.
type compiler interface {
	compile(s *Spec) any
}

// registry is every fault kind, in the order of Kinds. A new kind is a file kind_<name>.go
// and a line here (see the package doc).
var registry = [...]faultKind{
	abortKind{},
	delayKind{},
	ttftKind{},
	stallKind{},
	cutKind{},
	dripKind{},
	malformedKind{},
	dropKind{},
	corruptKind{},
	driftKind{},
}

// numKinds sizes the engine's counters (a constant: registry is an array).
const numKinds = len(registry)

// Kinds lists every fault kind: abort, delay, ttft, stall, cut, drip, malformed, drop,
// corrupt, drift.
var Kinds = kindNames()

func kindNames() []Kind {
	out := make([]Kind, len(registry))
	for i, k := range registry {
		out[i] = k.kind()
	}
	return out
}

// byKind maps a kind's name to the kind; duplicates lists the names registry has twice (a
// programming error, caught by TestRegistry).
var byKind, duplicates = indexKinds(registry[:])

// params lists the parameters of each kind.
var params = func() map[Kind][]string {
	m := make(map[Kind][]string, len(byKind))
	for k, fk := range byKind {
		m[k] = fk.params()
	}
	return m
}()

// indexKinds maps kinds by name; dup lists the names found more than once (the first one
// counts).
func indexKinds(kinds []faultKind) (m map[Kind]faultKind, dup []Kind) {
	m = make(map[Kind]faultKind, len(kinds))
	for _, k := range kinds {
		if _, ok := m[k.kind()]; ok {
			dup = append(dup, k.kind())
			continue
		}
		m[k.kind()] = k
	}
	return m, dup
}

// index returns the kind's position in Kinds (its row of the engine's counters), or -1.
func (k Kind) index() int {
	for i, x := range Kinds {
		if x == k {
			return i
		}
	}
	return -1
}
