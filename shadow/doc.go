// Package shadow holds the comparison and verdict core of shadow traffic: the
// per-pair comparison of a mirrored primary/candidate answer and the pure
// statistics that decide whether a candidate backend may take real traffic.
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
//   - pair.go: [Compare] (and [SchemaCache.Compare]) turns a [Request] and
//     the primary's and candidate's [Answer] into a [PairResult]: status,
//     error-class and finish_reason matches, latency and token deltas,
//     RougeL similarity (text plus tool calls), JSON validity and schema
//     conformance for json_object/json_schema response formats, and tool
//     calls checked against the primary's function names (as a multiset)
//     and the declared parameter schemas (santhosh-tekuri/jsonschema, no
//     remote references; compiled once per distinct schema in a bounded
//     [SchemaCache]). [AnswerFromChat] and [AnswerFromSSE] build answers
//     from a chat completion body or a captured stream, and from the
//     Responses API's ([AnswerFromResponse] for its bodies);
//     [RequestFromBody] reads chat and Responses requests. [Accumulator]
//     windows PairResults and replica comparisons ([Accumulator.AddReplica],
//     the noise floor) into the [Input] of [Evaluate]; it is goroutine-safe.
//
// What does not exist here: mirroring, capture (callers fill status and
// latencies of an Answer), storage, reports and weight progression. This
// package does no I/O.
package shadow
