package guard

import (
	"fmt"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"

	"github.com/sluicegw/sluice/policy"
)

// Exact token counts with tiktoken.
//
// Concurrency: a *tiktoken.Tiktoken is immutable once built (its maps are only read) and its
// regular expressions are dlclark/regexp2 Regexps, which are documented as safe for concurrent
// use (they keep their match runners under a mutex). So one encoder per encoding is shared
// by all requests; what bounds the cost is the exact-count semaphore of each Guard, not a pool
// of encoders. Building an encoder takes a while (it decodes and sorts the 100k-200k token
// table: a few hundred ms), so it is built once per process, on first use or by WarmUp.

func init() {
	tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
}

// Encodings known to tiktoken-go.
var knownEncodings = map[string]bool{
	"cl100k_base": true, "o200k_base": true, "p50k_base": true, "r50k_base": true, "p50k_edit": true,
}

type encoderEntry struct {
	once sync.Once
	tk   *tiktoken.Tiktoken
	err  error
}

var encoders sync.Map // encoding name -> *encoderEntry

func encoder(name string) (*tiktoken.Tiktoken, error) {
	v, _ := encoders.LoadOrStore(name, new(encoderEntry))
	e := v.(*encoderEntry)
	e.once.Do(func() {
		if !knownEncodings[name] {
			e.err = fmt.Errorf("unknown encoding %q", name)
			return
		}
		e.tk, e.err = tiktoken.GetEncoding(name)
	})
	return e.tk, e.err
}

// builtinEncodings map model patterns to encodings when the params do not say (cl100k_base
// otherwise).
var builtinEncodings = []pattern[string]{
	{"gpt-4o*", "o200k_base"}, {"chatgpt-4o*", "o200k_base"}, {"gpt-4.1*", "o200k_base"},
	{"gpt-4.5*", "o200k_base"}, {"gpt-5*", "o200k_base"}, {"o1*", "o200k_base"},
	{"o3*", "o200k_base"}, {"o4*", "o200k_base"}, {"gpt-oss*", "o200k_base"},
}

const defaultEncoding = "cl100k_base"

// builtinContextWindows are the context windows of well-known models, used when the params
// give neither context_windows matching the model nor context_window. Patterns are
// case-insensitive; the most specific (longest) match wins.
var builtinContextWindows = []pattern[int]{
	{"gpt-4o*", 128000}, {"chatgpt-4o*", 128000}, {"gpt-4.1*", 1047576}, {"gpt-4-turbo*", 128000},
	{"gpt-4-*-preview", 128000}, {"gpt-4", 8192}, {"gpt-4-0613", 8192}, {"gpt-4-0314", 8192},
	{"gpt-4-32k*", 32768}, {"gpt-3.5-turbo*", 16385}, {"gpt-5*", 400000}, {"o1*", 200000},
	{"o3*", 200000}, {"o4-mini*", 200000}, {"gpt-oss*", 131072},
	{"*llama-3.1*", 131072}, {"*llama-3.2*", 131072}, {"*llama-3.3*", 131072},
	{"*llama-3-*", 8192}, {"*llama-4*", 1048576},
}

// pattern is a model glob and its value. A glob has '*' (any run, '/' included) and '?' (any
// one byte); it matches ASCII case-insensitively.
type pattern[T any] struct {
	glob string
	v    T
}

// lookup returns the value of the most specific (longest) glob matching name.
func lookup[T any](ps []pattern[T], name string) (v T, ok bool) {
	best := -1
	for _, p := range ps {
		if len(p.glob) > best && policy.Glob(p.glob, name) {
			v, ok, best = p.v, true, len(p.glob)
		}
	}
	return v, ok
}

// exactCount counts the prompt's tokens with the encoder: every text piece encoded as the
// model sees it (JSON escapes decoded), plus token IDs, plus the chat-template overhead that
// the estimate adds too (4 a message and 3 for the reply's priming).
func exactCount(tk *tiktoken.Tiktoken, pt *promptText, messages int) int {
	n := pt.tokenIDs
	var buf []byte
	for _, s := range pt.segs {
		b := s.b
		if s.esc {
			buf = unescape(buf[:0], s.b)
			b = buf
		}
		n += len(tk.EncodeOrdinary(string(b)))
	}
	if messages > 0 {
		n += 4*messages + 3
	}
	return n
}
