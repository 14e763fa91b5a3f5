package fault

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"

	"github.com/sluicegw/sluice/policy/openai"
)

// KindCorrupt replaces words, numbers and punctuation of the output text
// (choices[].delta.content, .message.content, .text; a Responses delta or output text) at
// rate with plausible alternatives from a built-in vocabulary (vocab.go); the JSON stays
// valid. Repeatable given seed.
const KindCorrupt Kind = "corrupt"

// DefaultCorruptRate is corrupt's rate when none is set.
const DefaultCorruptRate = 0.002

type corruptKind struct{}

func (corruptKind) kind() Kind       { return KindCorrupt }
func (corruptKind) phase() phase     { return onEvents }
func (corruptKind) params() []string { return []string{"rate", "seed"} }

func (corruptKind) check(s Spec) (c checker) {
	if math.IsNaN(s.Rate) || s.Rate < 0 || s.Rate > 1 {
		c.add("rate", "must be within (0, 1], not %v", s.Rate)
	}
	return c
}

// open gives the stream its corrupter: seeded by seed, else drawn from the stream's
// generator.
func (corruptKind) open(s *stream, st *fstate) {
	sp := st.spec()
	rate := sp.Rate
	if rate == 0 {
		rate = DefaultCorruptRate
	}
	var rng *rand.Rand
	if sp.Seed != 0 {
		rng = rand.New(rand.NewPCG(uint64(sp.Seed), 0))
	} else {
		rng = rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64()))
	}
	st.state = &corrupter{rate: rate, rng: rng}
}

func (corruptKind) event(e *eventStep, st *fstate) bool {
	paths := contentPaths
	if string(e.ev.Name) == "response.output_text.delta" {
		paths = responsesDeltaPath
	}
	d, changed := corruptPaths(e.payload(), st.state.(*corrupter), paths)
	if changed {
		e.edit(d)
	}
	return changed
}

func (corruptKind) body(data []byte, st *fstate) ([]byte, bool) {
	return corruptPaths(data, st.state.(*corrupter), contentPaths)
}

// contentPaths are the output text fields that corrupt rewrites: chat stream deltas, chat
// messages and completion texts.
var contentPaths = [][]seg{
	{{key: "choices", each: true}, {key: "delta"}, {key: "content"}},
	{{key: "choices", each: true}, {key: "message"}, {key: "content"}},
	{{key: "choices", each: true}, {key: "text"}},
	{{key: "output", each: true}, {key: "content", each: true}, {key: "text"}}, // a Responses body
}

// responsesDeltaPath is the text of a Responses API response.output_text.delta event.
var responsesDeltaPath = [][]seg{{{key: "delta"}}}

// corruptPaths replaces tokens of the strings at paths of data.
func corruptPaths(data []byte, c *corrupter, paths [][]seg) ([]byte, bool) {
	changed := false
	for _, p := range paths {
		nd, ch := editPath(data, p, func(dst, obj []byte, m member) ([]byte, bool) {
			val := obj[m.valStart:m.end]
			if len(val) < 3 || val[0] != '"' {
				return nil, false
			}
			text := val[1 : len(val)-1]
			if bytes.IndexByte(text, '\\') >= 0 {
				// Escapes: decode first (rare in token-sized chunks).
				var s string
				if json.Unmarshal(val, &s) != nil {
					return nil, false
				}
				text = []byte(s)
			}
			nt, ch := c.text(text)
			if !ch {
				return nil, false
			}
			dst = append(dst, obj[m.start:m.valStart]...)
			return openai.AppendString(dst, string(nt)), true
		})
		data, changed = nd, changed || ch
	}
	return data, changed
}
