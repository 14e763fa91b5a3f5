// Package shadow holds the comparison and verdict core of shadow traffic: the
// pure statistics that decide whether a candidate backend may take real
// traffic, given measurements of mirrored primary/candidate pairs.
//
// What exists:
//
//   - stats.go: [MannWhitney], a two-sided Mann-Whitney U test (normal
//     approximation with tie and continuity corrections, adequate for n ≥ 8
//     per side) with effect sizes (common-language effect size, rank-biserial
//     r, median ratio), [TwoProportion], a pooled two-proportion z-test, and
//     [FisherExact], the two-sided exact test for small counts.
//   - text.go: [Tokenize] and [RougeL], ROUGE-L F1 on lower-cased word
//     tokens with an O(min(n,m))-memory LCS and a cap of [MaxWords] words.
//   - verdict.go: [Config] (with [DefaultConfig], [Config.WithDefaults] and
//     [Config.Validate]) and [Evaluate], which turns per-arm observations
//     into a [Verdict]: promote, hold or rollback, with per-metric
//     [Evidence].
//
// What does not exist here: mirroring, capture, per-pair comparison of JSON
// schemas and tool calls (callers count breakages and pass the counts in),
// storage, reports and weight progression. This package does no I/O.
package shadow
