package load

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// Encoding is the tiktoken encoding prompts are synthesised in and output text is counted
// with when the server gives no usage (the guard's default).
const Encoding = "cl100k_base"

// BlockTokens is the size of a Mooncake prefix block.
const BlockTokens = 512

// candidates are common English words; those that are exactly one cl100k token with a
// leading space form the vocabulary (checked when the tokenizer is built).
var candidates = strings.Fields(`the of and to in is for on that with as was by at from this have are
be or not but all were which one more their time first two new other some can out about up so
people there only when year years would after most also over many state world could any used
made work well life part back high school city while three between should like system group
number water right long find under since both house name small order point still public power
found might until great head place early young large line area government family play game
music light river body water market open hand book party level report field policy market
court local case table study model point study control around south north east west paper
road color price money health early study cause sound black white green blue river land
ocean stone glass metal wood fire earth space plant animal horse bird fish tree flower
garden window door floor wall room street bridge tower island forest desert valley mountain
summer winter spring morning evening night month week today story history science nature
energy signal network memory change return travel gather shape balance remember describe
consider simple strong quick quiet bright clear warm cold heavy light empty full happy
ready final common single double center middle corner edge surface answer question reason
result value method process member office letter image voice language language page word`)

var (
	tokOnce sync.Once
	tokEnc  *tiktoken.Tiktoken
	tokErr  error
	vocab   []string // each " "+w is exactly one token
)

// Tokenizer returns the shared cl100k_base encoder (built once, offline; a few hundred ms).
func Tokenizer() (*tiktoken.Tiktoken, error) {
	tokOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
		tokEnc, tokErr = tiktoken.GetEncoding(Encoding)
		if tokErr != nil {
			return
		}
		seen := map[string]bool{}
		for _, w := range candidates {
			if seen[w] {
				continue
			}
			seen[w] = true
			if len(tokEnc.Encode(" "+w, nil, nil)) == 1 {
				vocab = append(vocab, w)
			}
		}
		if len(vocab) < 64 {
			tokErr = fmt.Errorf("load: only %d one-token words in %s", len(vocab), Encoding)
		}
	})
	return tokEnc, tokErr
}

// CountTokens counts s in cl100k_base (0 if the tokenizer is unavailable).
func CountTokens(s string) int {
	tk, err := Tokenizer()
	if err != nil || s == "" {
		return 0
	}
	return len(tk.Encode(s, nil, nil))
}

// Synth builds prompts of exact token counts. Blocks of BlockTokens words are cached by key
// (bounded), so hash-id prompts that share a block share its text and cost one build. Safe
// for concurrent use.
type Synth struct {
	mu     sync.Mutex
	blocks map[uint64]string
}

const maxCachedBlocks = 8192

// NewSynth builds the tokenizer (if needed) and returns a synthesiser.
func NewSynth() (*Synth, error) {
	if _, err := Tokenizer(); err != nil {
		return nil, err
	}
	return &Synth{blocks: make(map[uint64]string)}, nil
}

// block returns the text of block key with n words (n == BlockTokens is cached).
func (s *Synth) block(key uint64, n int) string {
	if n == BlockTokens {
		s.mu.Lock()
		b, ok := s.blocks[key]
		s.mu.Unlock()
		if ok {
			return b
		}
	}
	rng := rand.New(rand.NewPCG(key, 0x5eed))
	var sb strings.Builder
	sb.Grow(n * 7)
	for range n {
		sb.WriteByte(' ')
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	b := sb.String()
	if n == BlockTokens {
		s.mu.Lock()
		if len(s.blocks) >= maxCachedBlocks {
			clear(s.blocks)
		}
		s.blocks[key] = b
		s.mu.Unlock()
	}
	return b
}

// Text returns a prompt of exactly tokens cl100k tokens made of blocks: block i is
// keyed by hashIDs[i] when given, else by (seed, i). The last block is cut short.
func (s *Synth) Text(tokens int, hashIDs []int64, seed uint64) string {
	if tokens <= 0 {
		return ""
	}
	var sb strings.Builder
	sb.Grow(tokens * 7)
	for i := 0; tokens > 0; i++ {
		n := min(tokens, BlockTokens)
		var key uint64
		if i < len(hashIDs) {
			key = uint64(hashIDs[i])*0x9e3779b97f4a7c15 + 1
		} else {
			key = seed*0x9e3779b97f4a7c15 ^ uint64(i+1)*0xbf58476d1ce4e5b9 ^ 0x8000000000000000
		}
		b := s.block(key, BlockTokens)
		if n < BlockTokens {
			b = cutWords(b, n)
		}
		sb.WriteString(b)
		tokens -= n
	}
	return sb.String()
}

// cutWords returns the first n " word"s of b.
func cutWords(b string, n int) string {
	seen := 0
	for i := 0; i < len(b); i++ {
		if b[i] == ' ' {
			if seen == n {
				return b[:i]
			}
			seen++
		}
	}
	return b
}

// Marked returns text of exactly tokens tokens that contains marker (" [[mem:ID]]") at its
// start when the budget allows.
func (s *Synth) Marked(tokens int, marker string, seed uint64) string {
	mt := CountTokens(" " + marker)
	if marker == "" || mt > tokens {
		return s.Text(tokens, nil, seed)
	}
	return " " + marker + s.Text(tokens-mt, nil, seed)
}

// Perturb replaces each word of a synthesised prompt with a random vocabulary word with
// probability rate; the token count is unchanged.
func Perturb(text string, rate float64, rng *rand.Rand) string {
	if rate <= 0 || len(vocab) == 0 {
		return text
	}
	words := strings.Split(text, " ")
	for i, w := range words {
		if w == "" || strings.HasPrefix(w, "[[") {
			continue
		}
		if rng.Float64() < rate {
			words[i] = vocab[rng.IntN(len(vocab))]
		}
	}
	return strings.Join(words, " ")
}
