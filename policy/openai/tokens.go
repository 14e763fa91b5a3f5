package openai

// EstimateTokens estimates the tokens of chars characters of text at 4 characters a token,
// rounded up: the usual rule of thumb for English with BPE tokenizers (cl100k_base,
// o200k_base, Llama 3), where prose runs 4 to 4.5 characters a token. It is O(1). Text that
// is available as bytes is better estimated with EstimateTextTokens, which counts code,
// numbers and non-Latin scripts more conservatively.
func EstimateTokens(chars int) int {
	if chars <= 0 {
		return 0
	}
	return (chars + 3) / 4
}

// EstimateTextTokens estimates the tokens of UTF-8 text in one pass over its bytes, with no
// allocation. Each character has a weight, rounded up in total:
//
//	ASCII letters and white space   1/4 token  (about 4 characters a token in prose)
//	ASCII digits                    3/8        (tokenizers group at most 3 digits)
//	ASCII punctuation               5/8        (often a token of its own in code and JSON)
//	other ASCII control characters  1
//	2-byte UTF-8 characters         1/2        (accented Latin, Greek, Cyrillic, Hebrew, Arabic)
//	3-byte UTF-8 characters         1          (CJK, Indic, Thai, symbols)
//	4-byte UTF-8 characters         2          (emoji, rare CJK)
//
// The weights lean high on purpose: the estimate feeds rate limits and guards, where
// under-counting is the costly mistake. An exact count needs the model's tokenizer (about
// 2 ms per 1,000 tokens for cl100k_base in Go), which is why it is not on the hot path.
func EstimateTextTokens(text []byte) int {
	var s textStats
	s.addRaw(text)
	return s.tokens()
}
