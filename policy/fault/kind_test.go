package fault

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRegistry(t *testing.T) {
	if len(duplicates) > 0 {
		t.Fatalf("registered twice: %v", duplicates)
	}
	// The order of Kinds is API (Stats, the "known:" list of errors).
	want := []Kind{"abort", "delay", "ttft", "stall", "cut", "drip", "malformed", "drop", "corrupt", "drift"}
	if !slices.Equal(Kinds, want) {
		t.Errorf("Kinds %v, want %v", Kinds, want)
	}
	if len(byKind) != len(registry) || len(Kinds) != len(registry) {
		t.Errorf("byKind %d, Kinds %d, registry %d", len(byKind), len(Kinds), len(registry))
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	// Every parameter a kind may take: the names Spec.set reports.
	all := Spec{Status: 1, RetryAfter: 1, Message: "m", For: 1, Shape: 1, Scale: 1, Gap: 1, Jitter: 1, AfterEvents: 1,
		AfterTokens: 1, At: 1, Mode: "m", Rate: 1, Seed: 1, Rename: map[string]string{"a": "b"}, Remove: []string{"c"}}
	known := all.set()
	for i, k := range Kinds {
		fk := byKind[k]
		if fk == nil {
			t.Errorf("%s: not registered", k)
			continue
		}
		if k.index() != i || string(k) != strings.ToLower(string(k)) {
			t.Errorf("%s: index %d, want %d; names are lower case", k, k.index(), i)
		}
		if _, err := os.Stat("kind_" + string(k) + ".go"); err != nil {
			t.Errorf("%s: no file of its own: %v", k, err)
		}
		if !strings.Contains(string(doc), "\n//\t"+string(k)+" ") {
			t.Errorf("%s: no line in the package doc's table of kinds", k)
		}
		for _, p := range fk.params() {
			if !slices.Contains(known, p) || headerParams[p] == nil {
				t.Errorf("%s: parameter %q is not in Spec.set and headerParams", k, p)
			}
		}
		_, req := fk.(requestFault)
		_, ev := fk.(eventFault)
		_, body := fk.(bodyFault)
		_, end := fk.(ender)
		_, open := fk.(opener)
		switch ph := fk.phase(); {
		case ph == beforeForwarding && (!req || ev || open):
			t.Errorf("%s: acts before forwarding, so it is a requestFault only", k)
		case ph != beforeForwarding && (req || !ev):
			t.Errorf("%s: acts on the answer (phase %d), so it is an eventFault, not a requestFault", k, ph)
		case ph > lastOnEvents:
			t.Errorf("%s: unknown phase %d", k, ph)
		case end != (ph == endsStream):
			t.Errorf("%s: an ender is what ends streams (phase endsStream), phase %d ender %v", k, ph, end)
		case body && !ev:
			t.Errorf("%s: a bodyFault acts on the answer", k)
		}
	}
}

func TestIndexKindsCatchesDuplicates(t *testing.T) {
	m, dup := indexKinds([]faultKind{abortKind{}, delayKind{}, abortKind{}})
	if len(m) != 2 || !slices.Equal(dup, []Kind{KindAbort}) {
		t.Errorf("map %v, duplicates %v", m, dup)
	}
}

// TestKindsReportEveryProblem: each kind's own problems, all at once, after the common
// ones, each under the spec's path.
func TestKindsReportEveryProblem(t *testing.T) {
	sec := Duration(time.Second)
	tests := []struct {
		spec Spec
		want []string // prefixes of the problems, in order
	}{
		{Spec{Kind: KindAbort, Status: 302, For: sec}, []string{
			"f.for: not a parameter of abort (its parameters: status, retry_after, message)",
			"f.status: must be an HTTP error status (400..599), not 302"}},
		{Spec{Kind: KindDelay, Scale: sec, Mode: "x"}, []string{
			"f.mode: not a parameter of delay (its parameters: for, shape, scale)",
			"f.shape: shape and scale go together (a Gamma(shape, scale) wait)",
			"f.for: a delay needs a duration (for) or shape and scale"}},
		{Spec{Kind: KindTTFT, For: -sec}, []string{"f.for: must not be negative", "f.for: required: how long to hold the first event"}},
		{Spec{Kind: KindStall, AfterEvents: -1, AfterTokens: -2}, []string{
			"f.for: required: how long to pause", "f.after_events: must not be negative", "f.after_tokens: must not be negative"}},
		{Spec{Kind: KindStall, For: sec, AfterEvents: 1, AfterTokens: 2}, []string{"f.after_tokens: set after_events or after_tokens, not both"}},
		{Spec{Kind: KindCut, AfterEvents: -1, Mode: "explode"}, []string{
			"f.after_events: must not be negative", `f.mode: must be eof, reset, h2reset or sse_error, not "explode"`}},
		{Spec{Kind: KindDrip, Scale: sec}, []string{
			"f.shape: shape and scale go together", "f.gap: a drip needs a gap, a jitter, or shape and scale"}},
		{Spec{Kind: KindMalformed, At: -1, Mode: "x"}, []string{"f.at: must not be negative", `f.mode: must be truncate or invalid, not "x"`}},
		{Spec{Kind: KindDrop, Mode: "x", At: 1}, []string{"f.at: not a parameter of drop (its parameters: mode)", `f.mode: must be usage or done, not "x"`}},
		{Spec{Kind: KindCorrupt, Rate: 2}, []string{"f.rate: must be within (0, 1], not 2"}},
		{Spec{Kind: KindDrift}, []string{"f.rename: a drift needs rename or remove paths"}},
		{Spec{Kind: KindDrift, Rename: map[string]string{"b": "", "a..b": "x"}, Remove: []string{"usage", "x[]"}}, []string{
			`f.rename["a..b"]: invalid path`, `f.rename["b"]: the new name must be non-empty`, "f.remove[1]: invalid path"}},
	}
	covered := map[Kind]bool{}
	for _, tc := range tests {
		covered[tc.spec.Kind] = true
		got := tc.spec.problems("f.")
		if len(got) != len(tc.want) {
			t.Errorf("%s: %d problems, want %d:\n%s", tc.spec.Kind, len(got), len(tc.want), strings.Join(got, "\n"))
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(got[i], w) {
				t.Errorf("%s: problem %d is %q, want %q...", tc.spec.Kind, i, got[i], w)
			}
		}
	}
	for _, k := range Kinds {
		if !covered[k] {
			t.Errorf("%s: no case", k)
		}
	}
}

func TestValidSpecAllocatesNothing(t *testing.T) {
	for _, s := range []Spec{{Kind: KindDrop}, {Kind: KindCut}, {Kind: KindMalformed, Side: Downstream}} {
		if n := testing.AllocsPerRun(100, func() { _ = s.Validate() }); n != 0 {
			t.Errorf("%s: %v allocs", s.Kind, n)
		}
	}
}

// TestPhaseOrderNotListOrder: a cut acts before the other faults of the event, malformed
// after them, whatever the order the faults are listed in.
func TestPhaseOrderNotListOrder(t *testing.T) {
	chat := readFile(t, "chat.sse")
	ev := events(t, chat)
	e, _, _ := newEngine(t, specs(t, "malformed(at=2); stall(after=1,for=1s); cut(after=1)")...)
	if out, err := upstream(t, e, chat, true); out != strings.Join(ev[:2], "") || err != nil {
		t.Errorf("got %q, %v", out, err)
	}
	for _, r := range e.Log() {
		if (r.Verdict == VerdictNotTriggered) == (r.Kind == KindCut) {
			t.Errorf("%s: %s", r.Kind, r.Verdict)
		}
	}

	e, _, _ = newEngine(t, specs(t, "corrupt(rate=1,seed=7)")...)
	corrupted, _ := upstream(t, e, chat, true)
	e, _, _ = newEngine(t, specs(t, "malformed(at=1); corrupt(rate=1,seed=7)")...)
	both, _ := upstream(t, e, chat, true)
	c, b := dataEvents(t, corrupted), dataEvents(t, both)
	if len(c) != len(b) || b[0] != c[0][:len(c[0])/2] || strings.Join(b[1:], "|") != strings.Join(c[1:], "|") {
		t.Errorf("malformed did not act on the corrupted event:\n%q\n%q", c[0], b[0])
	}
}

// FuzzParseHeader: any header either parses into faults that validate, or fails with an
// error that names the header; it never panics.
func FuzzParseHeader(f *testing.F) {
	for _, s := range []string{
		"stall(after=10,for=2s); cut(after=20,mode=eof)", "abort(status=429,retry_after=2s)",
		"delay(shape=2.1,scale=120ms)", "drop(usage)", "drift(rename=choices[].delta.content:text,remove=usage)",
		"corrupt(rate=0.5,seed=9,percent=50)", "malformed(at=2,invalid)", "cut(after=3,reset,cluster=x,attempts=2)",
		"drip(gap=5ms,jitter=5ms); ttft(for=1s)", "stall(aftr=1); cut(mode=x); ttft", "cut(after=1", "boom", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got, err := ParseHeader(h)
		if err != nil {
			if got != nil || !strings.Contains(err.Error(), Header) {
				t.Fatalf("%q: %v, %v", h, got, err)
			}
			return
		}
		if len(got) == 0 || len(got) > maxHeaderFaults {
			t.Fatalf("%q: %d faults", h, len(got))
		}
		for _, s := range got {
			if err := s.Validate(); err != nil {
				t.Fatalf("%q: parsed %+v does not validate: %v", h, s, err)
			}
		}
	})
}
