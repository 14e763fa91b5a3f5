// Package load is Sluice's token-level load injector (`sluice load`): it sends a workload to
// any OpenAI-compatible endpoint and measures, token by token, what the users of that
// endpoint would feel.
//
// # Workloads
//
// A Workload is one of: a trace (Azure LLM inference CSV, Mooncake JSONL with prefix-block
// hash_ids, ShareGPT JSON; the format is detected from the file by ParseTrace), a synthetic
// spec (input and output token counts drawn from fixed, uniform, normal or lognormal
// distributions, ParseSynthetic), or generated multi-turn sessions (ParseSessions): each
// turn carries the whole history, think time between turns is Gamma(shape, scale), requests
// carry X-Session-ID and X-Turn-Index, and every user turn plants a [[mem:XXXX]] marker.
//
// Prompts are synthesised to exact token counts in the cl100k_base tiktoken encoding (the
// guard's default) from a vocabulary of words that are each exactly one token with a leading
// space; cl100k's pre-tokenizer splits text at every " word", so N words are N tokens. A
// Mooncake hash id names a 512-token block whose text is a pure function of the id, so two
// requests that share a block share its text byte for byte. Output length is forced with
// max_tokens and "ignore_eos": true.
//
// # Load shapes
//
// Constant rate, Poisson, Gamma with vLLM's --burstiness semantics (shape = burstiness,
// mean gap 1/rate), the trace's own timestamps (multiplied by TimeScale), a linear ramp from
// Rate to RampTo, closed-loop concurrency, and Sweep: the highest rate that meets the SLO,
// by doubling then bisection. The schedule is a pure function of the seed, so shards
// (Shard i of n takes requests with index ≡ i mod n) together send exactly the whole.
//
// # Measurement (compatible with vLLM's `bench serve`)
//
//	send       when the request was written (Lag = send − scheduled time: the injector's own
//	           queueing, reported in every run so its timing can be trusted)
//	TTFT       send → first SSE event whose choices carry non-empty content/text (or a tool
//	           call's name or arguments: tool calls are output too)
//	           (FirstEvent: send → first SSE event of any kind)
//	tokens     per event: the usage delta when the server streams usage on every chunk,
//	           else a cl100k count of the event's text (at least 1). When the final usage
//	           gives completion_tokens, the per-event counts are scaled to add up to it.
//	           OutputTokens comes from usage when present, else from the tokenizer; the
//	           report says how many requests used each (TokensFromUsage / TokensEstimated).
//	token times an event of n tokens at t_i after an event at t_{i-1} has its tokens at
//	           t_{i-1} + k(t_i − t_{i-1})/n, k = 1..n; the extra tokens of the first event
//	           share its timestamp (nothing tells when they were made)
//	ITL        gaps between successive token times (tokens − 1 values per request)
//	E2E        send → last content event
//	TPOT       (E2E − TTFT) / (tokens − 1), for requests with at least 2 tokens
//
// Aggregates: request and output-token throughput over the measured span (first send to
// last completion), p50/p90/p95/p99/p99.9 from HDR histograms (microseconds, 3 significant
// digits), goodput (completed requests per second meeting every SLO given; ITL's limit
// applies to the request's every gap), SLO attainment per metric, error classes and HTTP
// statuses, the error-recovery rate (successful requests Sluice served with
// x-sluice-attempts > 1), answers per x-sluice-upstream, and for sessions the context
// fidelity: of the markers planted in earlier turns, the share the later answers repeat.
//
// # Results
//
// A Report holds only mergeable raw data (counts, sums, HDR histograms encoded in the V2
// compressed format, per-second buckets keyed by wall-clock second); Summary is derived.
// Merge combines shard reports exactly. WriteHTML renders a self-contained page with inline
// SVG charts.
package load
