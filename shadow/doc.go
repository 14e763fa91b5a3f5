// Package shadow holds the comparison and verdict core of shadow traffic: the
// comparison of a mirrored request's answers (the primary's, the baseline's
// and the candidate's: a triple) and the statistics that decide whether a
// candidate backend may take real traffic, plus where the results live.
//
// What exists:
//
//   - stats.go: [MannWhitney], a two-sided Mann-Whitney U test (normal
//     approximation with tie and continuity corrections, adequate for n ≥ 8
//     per side) with effect sizes, [TwoProportion], a pooled two-proportion
//     z-test, and [FisherExact], the two-sided exact test for small counts.
//   - paired.go: [Wilcoxon] and [WilcoxonLogRatio], the signed-rank test of
//     paired answers (exact up to [WilcoxonExactMaxN] pairs, ties included),
//     and [PairedRatio], the ratio of medians with a paired bootstrap
//     interval and the median per-request ratio with its order-statistics
//     interval.
//   - text.go: [Tokenize] and [RougeL], ROUGE-L F1 on tokens by Unicode
//     script (one per character in scripts written without spaces: Han,
//     kana, Thai, ...; lower-cased words elsewhere) with an O(min(n,m))-memory
//     LCS and a cap of [MaxWords] tokens.
//   - verdict.go: [Config] (with [DefaultConfig], [Config.WithDefaults] and
//     [Config.Validate]) and [Evaluate], which turns per-arm observations
//     into a [Verdict]: promote, hold or rollback, with per-metric
//     [Evidence]. With a baseline the candidate is judged against it, its
//     latencies on the paired differences; without one against the primary,
//     and its latencies only when both served alike loads.
//   - pair.go: [SchemaCache.CompareTriple] (and [Compare]) turns a [Request]
//     and the answers into a [PairResult]: status, error-class and
//     finish_reason matches, latency and token deltas, RougeL similarity
//     (text plus tool calls) and the noise-floor sample (primary against
//     baseline), JSON validity and schema conformance for
//     json_object/json_schema response formats, tool calls checked against
//     the declared parameter schemas (santhosh-tekuri/jsonschema, no remote
//     references; compiled once per distinct schema in a bounded
//     [SchemaCache]), and abnormal finishes by the request's own bound.
//     [AnswerFromChat], [AnswerFromSSE] and [AnswerFromResponse] build
//     answers from bodies and captured streams of chat, completions and the
//     Responses API; [RequestFromBody] reads their requests. [Accumulator]
//     windows PairResults into the [Input] of [Evaluate]; it is
//     goroutine-safe.
//   - mirror.go: [Sampled] (which sessions are mirrored) and [Queue], the
//     bounded, never-blocking queue of mirror jobs with workers on demand.
//   - runtime.go, capture.go: a route's mirroring runtime, [Mirror]: the
//     gateway offers it sampled requests ([Mirror.Samples], [Mirror.Offer]),
//     hands it the primary's answer ([Job.Capture], [Job.PrimaryDone]); its
//     workers send the copies through the gateway's [Sender] and read them
//     ([Job.ReadAnswer]), whoever finishes last hands the triple to the
//     comparison, and a [Recorder] keeps the pair. Captures are bounded per
//     answer and per route (capture_total).
//   - store.go, export.go, report.go: the [Store] of triples and verdicts
//     (SQLite, embedded), the redacted JSONL export, and the [Report] (JSON,
//     HTML, text).
//   - postgres.go, dialect.go, fleet.go, writer.go: the same Store on a
//     PostgreSQL database the gateways of a fleet share ([IsPostgresURL]; one
//     code path, the dialect's few differences apart; the schema migrated
//     once under an advisory lock), [Store.FleetInput] (a route's verdict
//     input over every gateway's pairs and summed request rates, the same
//     from any of them), and [Writer], which writes for a gateway without
//     ever making it wait: it holds what the database cannot take yet, up
//     to a bound, and counts what it drops.
//   - leader.go: [Leader], a claim on a session-level advisory lock of a
//     shared store, so that of the control planes sharing it one at a time
//     runs the weight progression ([ProgressionLock]); a SQLite store's
//     always leads.
//
// What does not exist here: the outbound request of a copy (the pick, the
// model rewrite, chaos faults: the gateway's Sender, proxy/mirror.go), the
// periodic verdicts and the weight progression (the gateway's, or under xDS
// the control plane's).
package shadow
