package shadow

import (
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode"
)

func TestTokenize(t *testing.T) {
	got := Tokenize("Hello, World! It's 42°C — naïve café.")
	want := []string{"hello", "world", "it", "s", "42", "c", "naïve", "café"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q want %q", got, want)
	}
}

func TestRougeL(t *testing.T) {
	long := strings.Repeat("a ", MaxWords+500)
	tests := []struct {
		name      string
		cand, ref string
		want      float64
	}{
		{"identical", "The cat sat on the mat.", "the cat sat on the mat", 1},
		{"disjoint", "alpha beta gamma", "delta epsilon", 0},
		{"both empty", "", "  ...  ", 1},
		{"one empty", "", "word", 0},
		// LCS "the cat on the mat" = 5 of 6 words each side → F1 5/6.
		{"partial", "the cat is on the mat", "the cat sat on the mat", 5.0 / 6},
		// "killed" ≠ "kill": LCS "police the gunman" = 3 of 4 each side → 0.75
		// (no stemming).
		{"lin", "police killed the gunman", "police kill the gunman", 0.75},
		// P = 2/2, R = 2/4 → F1 = 2*1*0.5/1.5 = 2/3.
		{"subset", "a b", "a x b y", 2.0 / 3},
		// Capped at MaxWords on both sides → identical.
		{"capped", long, long + "b c d", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RougeL(tt.cand, tt.ref); !near(got, tt.want, 1e-12) {
				t.Errorf("RougeL = %v want %v", got, tt.want)
			}
			if got := RougeL(tt.ref, tt.cand); !near(got, tt.want, 1e-12) {
				t.Errorf("symmetric RougeL = %v want %v", got, tt.want)
			}
		})
	}
}

func TestLCSLen(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"a b c d", "a c d", 3},
		{"a b c b d a b", "b d c a b a", 4}, // CLRS example: BCBA
		{"x", "y", 0},
		{"", "a", 0},
	}
	for _, tt := range tests {
		if got := lcsLen(strings.Fields(tt.a), strings.Fields(tt.b)); got != tt.want {
			t.Errorf("lcs(%q,%q) = %d want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

// oldTokenize is Tokenize as it was before scripts without spaces were split
// into characters: runs of letters, digits and marks of the lower-cased text.
func oldTokenize(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !(unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r))
	})
}

// hasUnspaced reports whether s holds a rune Tokenize makes a token by itself.
func hasUnspaced(s string) bool {
	for _, r := range s {
		if runeClass(r) == charRune {
			return true
		}
	}
	return false
}

func TestTokenizeScripts(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
	}{
		{"chinese with latin", "我用Go语言写了sluice v2。", []string{"我", "用", "go", "语", "言", "写", "了", "sluice", "v2"}},
		{"japanese", "東京タワーは333メートルです。", []string{"東", "京", "タ", "ワ", "ー", "は", "333", "メ", "ー", "ト", "ル", "で", "す"}},
		{"halfwidth katakana", "ｶﾀｶﾅｰ", []string{"ｶ", "ﾀ", "ｶ", "ﾅ", "ｰ"}},
		{"kana with combining voiced mark", "か\u3099き", []string{"か\u3099", "き"}},
		{"han numerals", "二〇二四年", []string{"二", "〇", "二", "四", "年"}},
		{"bopomofo", "ㄅㄆ", []string{"ㄅ", "ㄆ"}},
		// Korean writes spaces between words: Hangul runs stay words.
		{"korean", "나는 학교에 갑니다.", []string{"나는", "학교에", "갑니다"}},
		// Thai vowel and tone marks stay with their consonant.
		{"thai", "สวัสดีครับ", []string{"ส", "วั", "ส", "ดี", "ค", "รั", "บ"}},
		// Decimal digits of any script make words.
		{"thai digits", "ปี ๒๕๖๗", []string{"ปี", "๒๕๖๗"}},
		// Character level, marks (coeng U+17D2, vowel sign U+17C2) kept:
		// Khmer clusters are approximated.
		{"khmer", "ខ្មែរ", []string{"ខ្", "មែ", "រ"}},
		{"fullwidth latin", "ＡＢＣ１２３", []string{"ａｂｃ１２３"}},
		{"cyrillic", "Привет, мир!", []string{"привет", "мир"}},
		{"latin combining", "e\u0301cole", []string{"e\u0301cole"}},
		{"mark after han", "漢\u0301字", []string{"漢\u0301", "字"}},
		{"latin then han", "Hello世界!", []string{"hello", "世", "界"}},
		{"chinese punctuation dropped", "你好，世界！「引号」", []string{"你", "好", "世", "界", "引", "号"}},
		{"invalid utf-8", "ab\xffcd\xe4", []string{"ab", "cd"}},
		{"nothing", " ... — ! ", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Tokenize(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Tokenize(%q) = %q want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestTokenizeUnchanged: text without characters of unspaced scripts splits
// exactly as it did when Tokenize split on anything but letters, digits and
// marks.
func TestTokenizeUnchanged(t *testing.T) {
	for _, s := range []string{
		"Hello, World! It's 42°C — naïve café.",
		"Ⅻ roman ½ numerals ² are No/Nl: dropped",
		"Straße ΣΊΣΥΦΟΣ İstanbul ǅemal",
		"  leading\ttabs\nand\r\nnewlines  ",
		"مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "안녕하세요 세계",
		"\u0301leading mark", "x\u200dy", "snake_case kebab-case CamelCase",
		"ab\xffcd", "",
	} {
		if hasUnspaced(s) {
			t.Fatalf("%q holds unspaced characters", s)
		}
		got, want := Tokenize(s), oldTokenize(s)
		if len(got) != 0 || len(want) != 0 {
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Tokenize(%q) = %q, was %q", s, got, want)
			}
		}
	}
}

func TestRougeLScripts(t *testing.T) {
	tests := []struct {
		name      string
		cand, ref string
		want      float64 // exact, or the upper bound when low is set
		low       bool
	}{
		{"chinese identical", "今天天气很好，我们去公园散步。", "今天天气很好，我们去公园散步。", 1, false},
		{"chinese punctuation only", "今天天气很好,我们去公园散步", "今天天气很好，我们去公园散步。", 1, false},
		// 很 → 不: LCS 12 of 13 characters each side. Split on whitespace
		// the two sentences were one word each and scored 0.
		{"chinese one character", "今天天气很好，我们去公园散步。", "今天天气不好，我们去公园散步。", 12.0 / 13, false},
		// One character fewer: LCS 12, lengths 13 and 12 → 24/25.
		{"chinese one character dropped", "今天天气很好，我们去公园散步。", "今天天气好，我们去公园散步。", 24.0 / 25, false},
		{"chinese unrelated", "我们的模型在测试中表现很好。", "这家餐厅的菜非常好吃。", 0.3, true},
		{"japanese identical", "東京は日本の首都です。", "東京は日本の首都です。", 1, false},
		// 都 → 府: 9 of 10.
		{"japanese one character", "東京は日本の首都です。", "東京は日本の首府です。", 0.9, false},
		{"japanese unrelated", "東京は日本の首都です。", "猫がソファで寝ている。", 0.3, true},
		// 用 go 语 言 写 一 个 http 服 务 器: Go → Rust, 10 of 11.
		{"mixed scripts", "用Go语言写一个HTTP服务器", "用 Rust 语言写一个 HTTP 服务器", 10.0 / 11, false},
		// Hangul words: 나는 _ 갑니다, 2 of 3 words.
		{"korean", "나는 학교에 갑니다", "나는 집에 갑니다", 2.0 / 3, false},
		// ส วั ส ดี ค รั บ vs ส วั ส ดี ค่ ะ (the tone mark stays with its
		// consonant): LCS 4, lengths 7 and 6 → 8/13.
		{"thai", "สวัสดีครับ", "สวัสดีค่ะ", 8.0 / 13, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, got := range []float64{RougeL(tt.cand, tt.ref), RougeL(tt.ref, tt.cand)} {
				if tt.low && !(got >= 0 && got < tt.want) || !tt.low && !near(got, tt.want, 1e-12) {
					t.Errorf("RougeL = %v want %v (low %v); tokens %q / %q", got, tt.want, tt.low, Tokenize(tt.cand), Tokenize(tt.ref))
				}
			}
		})
	}
}

// naiveLCS is the textbook full-table LCS length.
func naiveLCS(a, b []string) int {
	t := make([][]int, len(a)+1)
	for i := range t {
		t[i] = make([]int, len(b)+1)
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			switch {
			case a[i-1] == b[j-1]:
				t[i][j] = t[i-1][j-1] + 1
			case t[i-1][j] >= t[i][j-1]:
				t[i][j] = t[i-1][j]
			default:
				t[i][j] = t[i][j-1]
			}
		}
	}
	return t[len(a)][len(b)]
}

// TestLCSLenRandom checks the stripped, numbered LCS against the full table on
// random sequences over small alphabets (shared prefixes and suffixes,
// tokens on one side only).
func TestLCSLenRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alpha := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	seq := func(n, k int) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = alpha[rng.IntN(k)]
		}
		return s
	}
	for range 3000 {
		a, b := seq(rng.IntN(20), 2+rng.IntN(7)), seq(rng.IntN(20), 2+rng.IntN(7))
		if rng.IntN(3) == 0 { // share a prefix and a suffix
			p, s := seq(rng.IntN(4), 3), seq(rng.IntN(4), 3)
			a = append(append(append([]string(nil), p...), a...), s...)
			b = append(append(append([]string(nil), p...), b...), s...)
		}
		if got, want := lcsLen(a, b), naiveLCS(a, b); got != want {
			t.Fatalf("lcsLen(%q, %q) = %d want %d", a, b, got, want)
		}
	}
}

// TestRougeLBounded: however long the texts, RougeL reads MaxWords tokens
// of each and allocates memory for those only.
func TestRougeLBounded(t *testing.T) {
	a := strings.Repeat("Alpha Beta gamma delta ", 1<<18) // 6 MiB, a million words
	b := strings.Repeat("beta Alpha delta GAMMA epsilon ", 1<<18)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := RougeL(a, b)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("RougeL of two 6 MiB texts allocated %d bytes", got)
	}
	// Capped at MaxWords each: the score of the first 1024 repetitions
	// (4096 and 5120 words), the second cut to MaxWords.
	ta, tb := Tokenize(a[:len(a)/256]), Tokenize(b[:len(b)/256])
	if len(ta) != MaxWords || len(tb) < MaxWords {
		t.Fatalf("test prefixes hold %d and %d tokens", len(ta), len(tb))
	}
	if want := float64(2*lcsLen(ta, tb[:MaxWords])) / (2 * MaxWords); s != want {
		t.Errorf("RougeL = %v want %v", s, want)
	}
}

func TestRougeLAllocs(t *testing.T) {
	en := "The quick brown Fox jumps over the lazy dog near the river bank."
	en2 := "A quick brown fox leaps over the lazy dog by the River bank!"
	zh := "今天天气很好，我们去公园散步，然后在湖边吃午饭。"
	zh2 := "今天天气不错，我们去公园跑步，然后在河边吃晚饭。"
	for _, p := range [][2]string{{en, en2}, {zh, zh2}} {
		// Per text: the lower-cased copy (only with upper case) and the token
		// slice; then one buffer for the LCS. As many as before scripts.
		if n := testing.AllocsPerRun(20, func() { RougeL(p[0], p[1]) }); n > 5 {
			t.Errorf("RougeL(%q, %q): %v allocations", p[0], p[1], n)
		}
	}
}

func FuzzRougeL(f *testing.F) {
	for _, s := range [][2]string{
		{"The cat sat on the mat.", "the cat sat on the mat"},
		{"今天天气很好，我们去公园散步。", "今天天气不好，我们去公园散步。"},
		{"東京タワーは333メートルです。", "ｶﾀｶﾅｰ か\u3099"},
		{"用Go语言写一个HTTP服务器", "나는 학교에 갑니다"},
		{"สวัสดีครับ", "ខ្មែរ"},
		{"e\u0301cole \u0301", "ab\xffcd\xe4"},
		{"", " ... "},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		s := RougeL(a, b)
		if !(s >= 0 && s <= 1) {
			t.Fatalf("RougeL(%q, %q) = %v", a, b, s)
		}
		if r := RougeL(b, a); r != s {
			t.Fatalf("RougeL not symmetric: %v vs %v", s, r)
		}
		if r := RougeL(a, a); r != 1 {
			t.Fatalf("RougeL(%q, itself) = %v", a, r)
		}
		ta := Tokenize(a)
		for _, tok := range ta {
			if tok == "" {
				t.Fatalf("Tokenize(%q) holds an empty token", a)
			}
			for _, r := range tok {
				if runeClass(r) == sepRune {
					t.Fatalf("Tokenize(%q): token %q holds separator %q", a, tok, r)
				}
			}
		}
		if len(ta) > 0 && RougeL(a, "") != 0 {
			t.Fatalf("RougeL(%q, \"\") != 0", a)
		}
		if !hasUnspaced(a) {
			if want := oldTokenize(a); !slices.Equal(ta, want) {
				t.Fatalf("Tokenize(%q) = %q, was %q", a, ta, want)
			}
		}
		if n := len(ta); n > 0 && !slices.Equal(wordTokens(a, n-1), ta[:n-1]) {
			t.Fatalf("wordTokens(%q, %d) is not a prefix of Tokenize", a, n-1)
		}
	})
}

func benchTexts() [][3]string {
	en := strings.Repeat("The quick brown fox jumps over the lazy dog near the river bank. ", 40)
	en2 := strings.Repeat("The quick brown fox leaps over a lazy dog by the river bank! ", 40)
	zh := strings.Repeat("今天天气很好，我们去公园散步，然后在湖边吃午饭。", 40)
	zh2 := strings.Repeat("今天天气不错，我们去公园跑步，然后在河边吃晚饭。", 40)
	long := strings.Repeat("Alpha Beta gamma delta ", 1100)
	long2 := strings.Repeat("beta alpha delta Gamma epsilon ", 900)
	return [][3]string{{"en-500w", en, en2}, {"zh-960c", zh, zh2}, {"en-4096w-differ", long, long2}, {"en-4096w-same", long, long}}
}

func BenchmarkRougeL(b *testing.B) {
	for _, p := range benchTexts() {
		b.Run(p[0], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				RougeL(p[1], p[2])
			}
		})
	}
}
