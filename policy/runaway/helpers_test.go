package runaway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// defaults are the detector's default thresholds.
func defaults() Thresholds { return Params{}.WithDefaults().thresholds() }

// corpusFile is one ordinary answer of testdata/ordinary: an answer's text as the model
// writes it (*.args.txt: a tool call's arguments).
type corpusFile struct {
	name string
	text string
	args bool
}

func loadCorpus(t testing.TB) []corpusFile {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "ordinary", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 40 {
		t.Fatalf("the corpus has %d answers, want at least 40", len(files))
	}
	var out []corpusFile
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		out = append(out, corpusFile{name: name, text: string(b), args: strings.HasSuffix(name, ".args.txt")})
	}
	return out
}

// readCorpus returns one corpus file's text.
func readCorpus(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "ordinary", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tokensOf is the tokens of text as a detector reads them (hash and flags), the last one
// included.
func tokensOf(t testing.TB, text string) []uint32 {
	t.Helper()
	d := NewDetector(Thresholds{MinPeriod: maxPeriodLimit, MaxPeriod: maxPeriodLimit, Repeats: 1000, MinWords: 1 << 30})
	var out []uint32
	for i := 0; i < len(text); {
		j := min(i+1024, len(text))
		d.Feed([]byte(text[i:j]))
		for ; len(out) < d.pos; out = append(out, d.ring[len(out)&d.mask]) {
		}
		i = j
	}
	d.Feed([]byte{' '})
	for ; len(out) < d.pos; out = append(out, d.ring[len(out)&d.mask]) {
	}
	return out
}

// refFire is the token at which the detector's rule, run with an exact table of 4-grams (no
// hash, no collision), finds a loop in toks under th; -1 if it finds none. The detector must
// match it within the few tokens a collision in its hashed table costs.
func refFire(toks []uint32, th Thresholds) int {
	last := map[[kgram]uint32]int{}
	period, run, weight, soft := 0, 0, 0, 0
	for i, cur := range toks {
		if period > 0 {
			prev := toks[i-period]
			switch {
			case prev == cur:
				run++
				weight += tokenWeight(cur)
			case th.Counters && cur&prev&flagNum != 0 && (soft+1)*4 <= run+1:
				run++
				soft++
			default:
				period, run, weight, soft = 0, 0, 0, 0
			}
		}
		if i < kgram-1 {
			continue
		}
		g := [kgram]uint32(toks[i-kgram+1 : i+1])
		if j, ok := last[g]; ok && period == 0 && i-j >= th.MinPeriod && i-j <= th.MaxPeriod {
			period, run, weight, soft = i-j, kgram, 0, 0
			for _, t := range g {
				weight += tokenWeight(t)
			}
		}
		last[g] = i
		need := 4 * th.MinWords
		if soft > 0 {
			need *= 2
		}
		if period > 0 && run >= (th.Repeats-1)*period && weight >= need {
			return i
		}
	}
	return -1
}

// feedChunks feeds text to d in pieces of the sizes sizes gives in turn (bytes), and
// reports whether it found a loop.
func feedChunks(d *Detector, text string, sizes []int) bool {
	for i, k := 0, 0; i < len(text); k++ {
		n := min(max(sizes[k%len(sizes)], 1), len(text)-i)
		if d.Feed([]byte(text[i : i+n])) {
			return true
		}
		i += n
	}
	return false
}
