package runaway

import (
	"strings"
	"testing"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
)

// BenchmarkDetector is the detector's cost per token of ordinary text (the corpus' prose and
// code, fed a piece of about a token at a time, as deltas arrive): ns/token is the number to
// read (ns/op is per piece).
func BenchmarkDetector(b *testing.B) {
	var ps []string
	for _, name := range []string{"essay.md", "go-switch.go.txt", "table-comparison.md", "chinese-prose.txt"} {
		ps = append(ps, pieces(readCorpus(b, name))...)
	}
	bs := make([][]byte, len(ps))
	for i, p := range ps {
		bs[i] = []byte(p)
	}
	d := NewDetector(defaults())
	tokens, i := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		if i == len(bs) {
			tokens += d.Tokens()
			d.Reset()
			i = 0
		}
		if d.Feed(bs[i]) {
			b.Fatal("a loop in the corpus")
		}
		i++
	}
	tokens += d.Tokens()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(tokens, 1)), "ns/token")
}

// BenchmarkWatcherEvent is the watcher's cost per event of a vLLM chat stream (one token an
// event): scanning the chunk, feeding its text to the detector.
func BenchmarkWatcherEvent(b *testing.B) {
	for _, bc := range []struct {
		name   string
		kind   openai.Kind
		stream string
	}{
		{"chat", openai.KindChat, chatStream(readCorpus(b, "essay.md"), 1)},
		{"tool_call", openai.KindChat, toolStream(readCorpus(b, "tool-create-events.args.txt"))},
		{"responses", openai.KindResponses, responsesStream(readCorpus(b, "essay.md"))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var evs []policy.StreamEvent
			r := openai.NewReader(strings.NewReader(bc.stream), 0)
			for {
				ev, err := r.Next()
				if err != nil {
					break
				}
				evs = append(evs, policy.StreamEvent{Raw: []byte(string(ev.Raw)), Name: []byte(string(ev.Name)), Data: []byte(string(ev.Data))})
			}
			p := newPolicy(b, Params{})
			req := streamRequest(b, bc.kind, "acme", 1)
			w := p.WatchStream(req)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				if i == len(evs) {
					w.End()
					w = p.WatchStream(req)
					i = 0
				}
				if w.Event(evs[i]).Cut != nil {
					b.Fatal("cut")
				}
				i++
			}
			w.End()
		})
	}
}
