package runaway

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// chunkings are the ways the tests cut a text into deltas: one byte at a time, token-sized
// pieces, odd sizes that split words, UTF-8 characters and escapes, and the whole text.
var chunkings = [][]int{{1}, {3, 5, 2, 7}, {4}, {13, 1, 29}, {1 << 20}}

// TestCorpusHasNoLoops: no ordinary answer is a loop, however it is cut into deltas, at the
// defaults and at half the default min_words (the margin the defaults keep).
func TestCorpusHasNoLoops(t *testing.T) {
	half := defaults()
	half.MinWords /= 2
	for _, th := range []Thresholds{defaults(), half} {
		for _, c := range loadCorpus(t) {
			for _, sizes := range chunkings {
				d := NewDetector(th)
				if feedChunks(d, c.text, sizes) {
					l, _ := d.Found()
					toks := tokensOf(t, c.text)
					t.Errorf("%s (min_words %d, chunks %v): loop found %+v in %d tokens", c.name, th.MinWords, sizes, l, len(toks))
				}
			}
		}
	}
}

// plant is a planted loop: prefix, then the block copies times (the first copy is the
// block's own first generation), each copy made by vary (nil: the block as it is), then
// suffix.
type plant struct {
	name   string
	prefix string
	block  string
	copies int
	vary   func(block string, i int) string
	suffix string
	th     *Thresholds // nil: defaults
	// want: whether it is a loop under the thresholds (false for what the rule excludes)
	want bool
}

func (p plant) text() (text string, loopStart string) {
	var b strings.Builder
	b.WriteString(p.prefix)
	for i := range p.copies {
		if i == 1 {
			loopStart = b.String()
		}
		blk := p.block
		if p.vary != nil {
			blk = p.vary(p.block, i)
		}
		b.WriteString(blk)
	}
	b.WriteString(p.suffix)
	return b.String(), loopStart
}

func paragraph(t *testing.T, file string, n int) string {
	t.Helper()
	paras := strings.Split(readCorpus(t, file), "\n\n")
	return paras[n] + "\n\n"
}

// distinct is n distinct words.
func distinct(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d ", i)
	}
	return b.String()
}

func counter(block string, i int) string { return strings.ReplaceAll(block, "#", strconv.Itoa(i+1)) }

func plants(t *testing.T) []plant {
	prose := paragraph(t, "prose-tcp.txt", 0)
	essay := paragraph(t, "essay.md", 2)
	long := paragraph(t, "essay.md", 1) + paragraph(t, "essay.md", 3)
	code := readCorpus(t, "go-switch.go.txt")
	code = code[:strings.Index(code, "case Monday:")]
	exact := func(p Thresholds) *Thresholds { p.Counters = false; return &p }
	return []plant{
		{name: "apology", prefix: prose, block: "I apologize, but I cannot continue with that request. ", copies: 200, want: true},
		{name: "one word", prefix: prose, block: "the ", copies: 1000, want: true},
		{name: "two words", prefix: prose, block: "very much ", copies: 1000, want: true},
		{name: "line breaks", prefix: strings.TrimRight(prose, "\n"), block: "\n", copies: 8000, want: true},
		{name: "exclamation marks", prefix: prose, block: "!", copies: 8000, want: true},
		{name: "dots and spaces", prefix: prose, block: ". ", copies: 2000, want: true},
		{name: "long word", prefix: prose, block: "a", copies: 20000, want: true},
		{name: "paragraph", prefix: prose, block: essay, copies: 8, want: true},
		{name: "long paragraph", prefix: prose, block: long, copies: 6, want: true},
		{name: "reasoning", prefix: "Let me work out the total. 3 boxes of 12 is 36. ", block: "Wait, let me reconsider the problem from the beginning. ", copies: 200, want: true},
		{name: "list item", prefix: "Shopping list:\n", block: "- Buy milk and bread\n", copies: 300, want: true},
		{name: "table row", prefix: strings.Join(strings.SplitAfter(readCorpus(t, "table-status.md"), "\n")[:6], ""), block: "| db-09 | ap-south-1 | down | 0 | 0 | 0 | 15.6 |\n", copies: 200, want: true},
		{name: "code line", prefix: code, block: "\t\treturn \"Sunday\"\n", copies: 300, want: true},
		{name: "closing braces", prefix: code, block: "}\n", copies: 3000, want: true},
		{name: "json objects", prefix: `{"items": [`, block: `{"name": "widget", "qty": 1, "ok": true}, `, copies: 300, want: true},
		{name: "zeros", prefix: "array([", block: "0., ", copies: 3000, want: true},
		{name: "cjk", prefix: paragraph(t, "chinese-prose.txt", 0), block: "我们需要进一步分析这个问题。", copies: 300, want: true},
		{name: "cyrillic", prefix: paragraph(t, "russian-prose.txt", 0), block: "Это очень важный вопрос. ", copies: 300, want: true},
		{name: "emoji", prefix: "Party time ", block: "🎉 ", copies: 2000, want: true},
		{name: "counter", prefix: "Here are the steps:\n", block: "#. Click the button and wait for the page to load.\n", copies: 300, vary: counter, want: true},
		{name: "counter in prose", prefix: prose, block: "On day # the system was still running smoothly. ", copies: 300, vary: counter, want: true},
		{name: "json ids", prefix: `[`, block: `{"id": #, "status": "pending", "owner": "nobody"}, `, copies: 400, vary: counter, want: true},
		{name: "max period", prefix: prose, block: distinct(256), copies: 4, want: true},

		// Ordinary requests whose answers really repeat themselves past the bound read as
		// loops (documented: put such routes on flag, or raise min_words).
		{name: "lines asked for", prefix: "Here you go:\n", block: "I will not talk in class.\n", copies: 50, want: true},
		{name: "99 bottles", prefix: "Here are the lyrics:\n\n", copies: 99, want: true,
			block: "# bottles of beer on the wall, # bottles of beer.\nTake one down and pass it around, # bottles of beer on the wall.\n\n",
			vary:  func(b string, i int) string { return strings.ReplaceAll(b, "#", strconv.Itoa(99-i)) }},
		{name: "16x16 zeros", prefix: ">>> np.zeros((16, 16))\n", block: "[" + strings.Repeat("0., ", 15) + "0.],\n       ", copies: 16, want: true},

		// What the rule leaves alone.
		{name: "two copies of a paragraph", prefix: prose, block: essay, copies: 2, suffix: prose, want: false},
		{name: "short repetition", prefix: prose, block: "very ", copies: 40, suffix: "important.", want: false},
		{name: "a word changes every copy", prefix: "Here are the steps:\n", block: "Step #: open the door.\n", copies: 300,
			vary: func(b string, i int) string { return strings.Replace(b, "#", "w"+strconv.Itoa(i), 1) }, want: false},
		{name: "counter, counters off", prefix: "Here are the steps:\n", block: "#. Click the button and wait for the page to load.\n", copies: 300,
			vary: counter, th: exact(defaults()), want: false},
		{name: "numbers change too often", prefix: "Readings:\n", block: "#, #, #\n", copies: 300, vary: counter, want: false},
		{name: "block longer than max period", prefix: prose, block: distinct(257), copies: 4, want: false},
		{name: "period below min_period", prefix: prose, block: "the ", copies: 1000, th: func() *Thresholds { th := defaults(); th.MinPeriod = 2; return &th }(), want: false},
	}
}

// TestPlantedLoops: every planted loop is found, however the text is cut, where the rule run
// with an exact table finds it (at most 4 tokens later: what a hash collision in the
// detector's table may cost), with its period; nothing the rule leaves alone is found.
func TestPlantedLoops(t *testing.T) {
	for _, pl := range plants(t) {
		t.Run(pl.name, func(t *testing.T) {
			th := defaults()
			if pl.th != nil {
				th = *pl.th
			}
			text, before := pl.text()
			toks := tokensOf(t, text)
			s := len(tokensOf(t, before))
			p := s - len(tokensOf(t, pl.prefix))
			ref := refFire(toks, th)
			for _, sizes := range chunkings {
				d := NewDetector(th)
				found := feedChunks(d, text, sizes)
				l, _ := d.Found()
				if !pl.want {
					if found || ref >= 0 {
						t.Fatalf("chunks %v: loop found %+v (the rule: at %d), want none", sizes, l, ref)
					}
					continue
				}
				switch {
				case ref < 0:
					t.Fatalf("the rule finds no loop: the plant is too short (period %d, %d tokens)", p, len(toks))
				case !found:
					t.Fatalf("chunks %v: no loop found (period %d from token %d of %d; the rule: at %d)", sizes, p, s, len(toks), ref)
				case l.At > ref+4 || l.At < s-p:
					t.Fatalf("chunks %v: found at token %d (period %d), want within [%d, %d] (the loop starts at %d)", sizes, l.At, l.Period, s-p, ref+4, s)
				case l.Period%p != 0 && p%l.Period != 0:
					t.Fatalf("chunks %v: period %d, want a divisor or multiple of %d", sizes, l.Period, p)
				}
			}
		})
	}
}

// TestDetectionBound checks the documented bound on the tokens after a loop's start:
// max((repeats−1)·p, W) + p + 4, with W between min_words (a loop of words) and 4·min_words
// (of punctuation), and up to 8/3 times that with a counter; p for the lock (a 4-gram the
// block holds once, after any shorter repetition inside the block has ended), 4 for a
// collision.
func TestDetectionBound(t *testing.T) {
	th := defaults()
	for _, pl := range plants(t) {
		if !pl.want || pl.th != nil {
			continue
		}
		text, before := pl.text()
		d := NewDetector(th)
		if !d.Feed([]byte(text)) {
			t.Fatalf("%s: not found", pl.name)
		}
		l, _ := d.Found()
		s := len(tokensOf(t, before))
		p := s - len(tokensOf(t, pl.prefix))
		w := 4 * th.MinWords
		if pl.vary != nil {
			w = 8 * th.MinWords * 4 / 3 // soft tokens weigh nothing, at most a quarter of the run
		}
		if bound := max((th.Repeats-1)*p, w) + p + 4; l.At-s+1 > bound {
			t.Errorf("%s: found %d tokens after the loop's start, bound %d", pl.name, l.At-s+1, bound)
		}
	}
}

// TestChunkingInvariance: the tokens and the detection do not depend on how the text is cut.
func TestChunkingInvariance(t *testing.T) {
	texts := []string{readCorpus(t, "chinese-prose.txt"), readCorpus(t, "emoji.md"), readCorpus(t, "quote-repeated-string.md")}
	for _, pl := range plants(t)[:6] {
		text, _ := pl.text()
		texts = append(texts, text)
	}
	for i, text := range texts {
		var ref Loop
		var refFound bool
		var refTokens int
		for j, sizes := range chunkings {
			d := NewDetector(defaults())
			found := feedChunks(d, text, sizes)
			l, _ := d.Found()
			if j == 0 {
				ref, refFound, refTokens = l, found, d.Tokens()
				continue
			}
			if found != refFound || l != ref || d.Tokens() != refTokens {
				t.Errorf("text %d, chunks %v: %v %+v %d tokens; one byte at a time: %v %+v %d", i, sizes, found, l, d.Tokens(), refFound, ref, refTokens)
			}
		}
	}
}

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		text  string
		n     int
		flags []uint32 // of the first tokens
	}{
		{"hello world", 2, []uint32{flagWord, flagWord}},
		{"x = 42;\n", 5, []uint32{flagWord, 0, flagNum, 0, 0}},
		{"v2 2024-01", 4, []uint32{flagWord, flagNum, 0, flagNum}},
		{"---|---", 3, []uint32{0, 0, 0}},
		{strings.Repeat("=", 20), 3, nil},               // 8 + 8 + 4
		{strings.Repeat("a", 70), 3, nil},               // 32 + 32 + 6
		{"\n\n\n\n", 1, []uint32{0}},                    // one run of line breaks
		{"café crème", 2, []uint32{flagWord, flagWord}}, // 2-byte characters stay in the word
		{"大语言", 3, []uint32{flagWord, flagWord, flagWord}},
		{"🎉🎉", 2, []uint32{flagWord, flagWord}},
		{"  \t\r ", 0, nil},
		{"\xff\xfe", 2, nil}, // bytes that are not UTF-8: a wide token each, read on
	} {
		toks := tokensOf(t, tc.text)
		if len(toks) != tc.n {
			t.Errorf("%q: %d tokens, want %d", tc.text, len(toks), tc.n)
			continue
		}
		for i, f := range tc.flags {
			if toks[i]&flagMask != f {
				t.Errorf("%q: token %d has flags %d, want %d", tc.text, i, toks[i]&flagMask, f)
			}
		}
	}
	if a, b := tokensOf(t, "x ="), tokensOf(t, "x=="); a[1] == b[1] {
		t.Error("= and == are the same token")
	}
	if a, b := tokensOf(t, "the"), tokensOf(t, "The"); a[0] == b[0] {
		t.Error("tokens are case-sensitive")
	}
}

// TestReset: a detector reused for another stream finds the same as a fresh one, whatever
// the stream before left in its ring and table.
func TestReset(t *testing.T) {
	pl := plants(t)[0]
	text, _ := pl.text()
	fresh := NewDetector(defaults())
	fresh.Feed([]byte(text))
	want, _ := fresh.Found()

	d := NewDetector(defaults())
	for i := range 3 {
		d.Reset()
		d.Feed([]byte(readCorpus(t, "essay.md")))
		if _, found := d.Found(); found {
			t.Fatal("the essay is a loop")
		}
		d.Reset()
		if d.Tokens() != 0 {
			t.Fatal("Reset kept the token count")
		}
		d.Feed([]byte(text))
		if got, found := d.Found(); !found || got != want {
			t.Fatalf("round %d: %+v %v, fresh detector %+v", i, got, found, want)
		}
	}
	// Once found, the detector reads no more.
	n := d.Tokens()
	if !d.Feed([]byte("more text to read")) || d.Tokens() != n {
		t.Fatal("a detector that found a loop read on")
	}
}

func TestNewDetectorClampsThresholds(t *testing.T) {
	for _, th := range []Thresholds{{}, {MinPeriod: -3, MaxPeriod: 1 << 30, Repeats: -1, MinWords: -5}, {MinPeriod: 50, MaxPeriod: 10}} {
		d := NewDetector(th)
		if d.th.MinPeriod < 1 || d.th.MaxPeriod > maxPeriodLimit || d.th.MinPeriod > d.th.MaxPeriod || d.th.Repeats < 2 || d.th.MinWords < 1 {
			t.Errorf("%+v: thresholds %+v", th, d.th)
		}
		if len(d.ring) <= d.th.MaxPeriod+kgram {
			t.Errorf("%+v: ring of %d for max period %d", th, len(d.ring), d.th.MaxPeriod)
		}
		d.Feed([]byte(strings.Repeat("ab ", 100)))
	}
}

func ExampleDetector() {
	d := NewDetector(Thresholds{MinPeriod: 1, MaxPeriod: 256, Repeats: 3, MinWords: 96, Counters: true})
	d.Feed([]byte("Sure! Here is the answer. "))
	for range 100 {
		if d.Feed([]byte("I cannot help with that. ")) {
			break
		}
	}
	l, found := d.Found()
	fmt.Println(found, l.Period, l.Start, l.At)
	// Output: true 6 13 122
}
