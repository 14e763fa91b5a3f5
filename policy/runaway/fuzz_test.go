package runaway

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// FuzzDetector: whatever the text and the thresholds, the detector does not panic, keeps the
// memory it was built with, finds the same however the text is cut, and a loop it reports
// meets the thresholds.
func FuzzDetector(f *testing.F) {
	f.Add([]byte("hello world"), uint16(3), uint8(1), uint8(16), uint8(3), uint8(8), true)
	f.Add([]byte(strings.Repeat("I cannot do that. ", 40)), uint16(100), uint8(1), uint8(64), uint8(3), uint8(8), true)
	f.Add([]byte(strings.Repeat("1. go\n2. go\n", 30)), uint16(7), uint8(2), uint8(8), uint8(2), uint8(8), true)
	f.Add([]byte(strings.Repeat("大语言🎉\xff\xc3", 50)), uint16(5), uint8(1), uint8(32), uint8(2), uint8(8), false)
	f.Add([]byte(strings.Repeat("\n", 3000)), uint16(0), uint8(1), uint8(4), uint8(2), uint8(8), false)
	f.Fuzz(func(t *testing.T, text []byte, split uint16, minP, maxP, repeats, minWords uint8, counters bool) {
		th := Thresholds{MinPeriod: int(minP), MaxPeriod: int(maxP), Repeats: int(repeats), MinWords: int(minWords), Counters: counters}
		whole := NewDetector(th)
		ringLen, tableLen := len(whole.ring), len(whole.table)
		whole.Feed(text)

		cut := NewDetector(th)
		at := min(int(split), len(text))
		cut.Feed(text[:at])
		cut.Feed(text[at:])

		bytewise := NewDetector(th)
		for i := range text {
			bytewise.Feed(text[i : i+1])
		}
		for _, d := range []*Detector{whole, cut, bytewise} {
			if len(d.ring) != ringLen || len(d.table) != tableLen {
				t.Fatalf("memory grew: ring %d → %d, table %d → %d", ringLen, len(d.ring), tableLen, len(d.table))
			}
			if d.period < 0 || d.period > d.th.MaxPeriod || d.run > d.pos || d.weight > 4*d.run || 4*d.soft > d.run+3 {
				t.Fatalf("state out of bounds: %+v", d)
			}
			l, found := d.Found()
			lw, fw := whole.Found()
			if found != fw || l != lw || d.Tokens() != whole.Tokens() {
				t.Fatalf("cut at %d: %v %+v %d tokens; whole: %v %+v %d tokens", at, found, l, d.Tokens(), fw, lw, whole.Tokens())
			}
			if !found {
				continue
			}
			need := 4 * d.th.MinWords
			if l.Period < d.th.MinPeriod || l.Period > d.th.MaxPeriod || l.Start < 0 || l.At >= d.Tokens() ||
				l.At-l.Start+1 < (d.th.Repeats-1)*l.Period || l.Weight < need {
				t.Fatalf("loop %+v does not meet %+v", l, d.th)
			}
		}
	})
}

// FuzzWatcher: whatever a stream's events hold, the watcher does not panic, and a tail it cuts
// with is whole SSE events whose data are JSON objects (or [DONE]).
func FuzzWatcher(f *testing.F) {
	f.Add(uint8(0), []byte(chatStream(strings.Repeat("I cannot do that. ", 60), 1)))
	f.Add(uint8(1), []byte(completionStream(strings.Repeat("again ", 300))))
	f.Add(uint8(2), []byte(responsesStream(strings.Repeat("Wait, let me think. ", 80))))
	f.Add(uint8(0), []byte("data: {\"choices\":[{\"index\":63,\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"\\\"x\\\"\"}}]}}]}\n\n"))
	f.Fuzz(func(t *testing.T, kind uint8, stream []byte) {
		k := []openai.Kind{openai.KindChat, openai.KindCompletion, openai.KindResponses}[kind%3]
		p, err := New(Params{MinWords: 8, Repeats: 2, MaxChoices: 64}, policy.Env{Route: "r"})
		if err != nil {
			t.Fatal(err)
		}
		w := p.WatchStream(streamRequest(t, k, "t", 2))
		r := openai.NewReader(bytes.NewReader(stream), 1<<16)
		for range 10000 {
			ev, err := r.Next()
			if err != nil {
				break
			}
			a := w.Event(policy.StreamEvent{Raw: ev.Raw, Name: ev.Name, Data: ev.Data})
			if a.Replace != nil {
				t.Fatal("the runaway watcher never replaces an event")
			}
			if a.Cut != nil {
				checkTail(t, a.Cut.Tail)
				break
			}
		}
		w.End()
		if w.End() != nil {
			t.Fatal("a second End flagged again")
		}
	})
}

// checkTail checks that tail is whole SSE events, each a comment or data that is a JSON
// object or [DONE].
func checkTail(t *testing.T, tail []byte) {
	t.Helper()
	if len(tail) == 0 || !bytes.HasSuffix(tail, []byte("\n\n")) {
		t.Fatalf("tail %q does not end an event", tail)
	}
	r := openai.NewReader(bytes.NewReader(tail), 1<<20)
	for n := 0; ; n++ {
		ev, err := r.Next()
		if err != nil {
			if n == 0 {
				t.Fatalf("tail %q: %v", tail, err)
			}
			return
		}
		if ev.Data == nil {
			if !bytes.HasPrefix(ev.Raw, []byte(":")) {
				t.Fatalf("tail event %q has no data and is no comment", ev.Raw)
			}
			continue
		}
		var v map[string]any
		if !ev.IsDone() && json.Unmarshal(ev.Data, &v) != nil {
			t.Fatalf("tail event data %q is not a JSON object", ev.Data)
		}
	}
}
