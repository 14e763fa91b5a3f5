// Package sim is a simulated OpenAI-compatible model server that behaves like a vLLM
// instance: the same endpoints, response shapes, errors and metric names, deterministic
// answers, and a performance model in which time to first token rises under load the way it
// does on a real server. `sluice mock` serves it; every gateway test runs against it.
//
// # Endpoints
//
//	POST /v1/chat/completions   stream and non-stream, tools, stream_options.include_usage
//	POST /v1/completions        prompt: string, array of strings, token ids, arrays of token ids (one choice each)
//	POST /v1/embeddings         input as above; dimensions; encoding_format float or base64 (little-endian float32)
//	GET  /v1/models             lists Config.Model (GET /v1/models/{id} too)
//	GET  /health                200
//	GET  /metrics               Prometheus text, vLLM names, label model_name
//
// Errors use OpenAI's shape {"error":{"message","type","param","code"}}: unknown path 404
// not_found, malformed JSON 400 invalid_json, another model 404 model_not_found, prompt +
// max_tokens over MaxModelLen 400 context_length_exceeded, a request whose prompt + max
// tokens exceed the whole KV cache 400 kv_cache_exceeded, body over 32 MiB 413. A missing
// "model" means the served model, as in vLLM.
//
// # Answers
//
// Output tokens are words of a built-in vocabulary (one word = one token, each after the
// first with a leading space), drawn by a PRNG seeded from a hash of the model name, the
// whole conversation (every message's role and text, content parts, tool calls) or prompt,
// and the "seed" parameter. Without "seed", a temperature above 0 mixes in randomness;
// otherwise the same request always gets the same answer, streamed or not.
//
// Length: max_completion_tokens, else max_tokens, else MaxTokensDefault (lowered to what
// the context window leaves when absent). Unless "ignore_eos" is true, the answer ends at a
// hash-derived EOS point in [ceil(max/2), max] with finish_reason "stop"; reaching max gives
// "length". With ignore_eos exactly max tokens come out.
//
// Continuation (vLLM's "continue_final_message": true): when the last message is an assistant
// message, the answer is the one the conversation without it would get, less its first k
// tokens (k = the prefix's words), with max tokens counted after the prefix. A stream cut
// after k tokens and resumed elsewhere with the text so far as the prefix therefore reads
// exactly as the uncut answer.
//
// Context markers: every [[mem:XXXX]] (XXXX: 1-32 of [A-Za-z0-9_-]) found anywhere in the
// conversation is repeated at the start of the answer, once each, in order of first
// appearance, one token each (as many as max tokens allow; EOS never cuts them).
//
// Tools: with "tools" and tool_choice not "none", unless the last message is a tool result,
// the answer is one tool call to the function named by tool_choice (or the first function),
// id "call_" + 16 hex digits from the request hash, arguments generated from the function's
// JSON Schema (every property, by type, enum → first value, nested to a small depth), finish
// "tool_calls". Its tokens are the call header plus one per 4-byte argument fragment; max
// tokens can cut the arguments (finish "length"). Streamed like OpenAI: the first delta has
// index, id, type, name and empty arguments, later deltas carry argument fragments.
//
// Prompt tokens are estimated, not tokenized: ceil(characters/4) of every piece of text
// (characters are code points) + 1 per message + ceil(bytes of the "tools" JSON / 4), at
// least 1; a token-id prompt counts one token per id.
//
// Streaming: Content-Type text/event-stream, `data: {json}\n\n` per event, flushed per
// event. Chat streams begin with a role chunk (delta.role "assistant", content "") sent
// when the first token is ready, then TokensPerEvent tokens per chunk, then a chunk with an
// empty delta and finish_reason, then (with include_usage) a chunk with "choices": [] and
// usage, then `data: [DONE]`. Completions streams are the same without the role chunk.
//
// # Performance model
//
// A scheduler goroutine (started by New, stopped by Close) runs engine steps like vLLM's
// continuous batching. Each API request becomes one sequence per answer (chat: 1,
// completions: one per prompt, embeddings: one per input, prefill only). Sequences wait in a
// FIFO queue; at the start of each step the head is admitted while fewer than MaxRunning
// run and its prompt + max output tokens fit in the KV cache not yet reserved (strict FIFO:
// a head that does not fit blocks those behind it). A step prefills the newly admitted
// sequences and decodes one token for every sequence already running; it lasts
//
//	Σ over admitted (TTFT + PrefillPerToken × prompt tokens)
//	+ ITL + ITLPerRunning × (decoding − 1)     when any sequence is decoding
//
// all multiplied by TimeScale, and delivers its tokens when it ends (a sequence's first
// token comes out of its prefill step). So TTFT grows with the queue and with the prefill
// of requests admitted alongside, and inter-token latency grows with the batch and spikes
// when new prompts are prefilled. Steps are timed against an absolute schedule with timers
// (late steps catch up, at most 5 ms behind), never busy loops; an idle scheduler blocks on
// a channel. Tokens reach handlers through per-request progress counters and a one-slot
// notify channel, so the scheduler never blocks on a slow client: the sequence keeps its
// slot and its tokens wait. A client that goes away is removed from the queue or the batch
// at once, its KV cache freed, and counted in Stats().Cancelled (finished_reason "abort" in
// the metrics).
//
// vllm:kv_cache_usage_perc reports prompt + generated tokens of the running sequences over
// KVTokens; admission uses the reservation (prompt + max output tokens), so usage can read
// below 1 while the queue waits for KV space.
//
// Fast path: when TTFT, PrefillPerToken, ITL, ITLPerRunning, Delay and DelayJitter are all
// zero, no scheduler runs; handlers generate answers inline (MaxRunning and KV admission do
// not apply, a request that could never fit is still rejected). Delay and DelayJitter add a
// scaled wait before a request enters the engine. ErrorRate5xx and ErrorRate429 answer a
// share of API requests at once with 500/503 or 429 (Retry-After: 1).
//
// Embeddings batch cost: with EmbedRequestCost or EmbedItemCost set, an embeddings request,
// once parsed (and after Delay), waits for the server's one embedding engine and holds it for
//
//	(EmbedRequestCost + EmbedItemCost × inputs) × TimeScale
//
// before it goes on to be answered (through the scheduler, or inline on the fast path: the
// cost does not turn the fast path off). Requests take the engine one at a time in arrival
// order, so n single-input requests cost n × (EmbedRequestCost + EmbedItemCost) while one
// request with n inputs costs EmbedRequestCost + n × EmbedItemCost: merging small requests
// pays as on a real embedding server, whose fixed per-forward-pass cost dominates small
// batches. A client that goes away stops waiting (and releases the engine) at once.
//
// Metrics (real time, after TimeScale): gauges vllm:num_requests_running,
// vllm:num_requests_waiting, vllm:kv_cache_usage_perc (and the older
// vllm:gpu_cache_usage_perc); histograms vllm:time_to_first_token_seconds,
// vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds,
// vllm:request_queue_time_seconds; counters vllm:prompt_tokens_total,
// vllm:generation_tokens_total, vllm:request_success_total{finished_reason}. TTFT and e2e
// are measured from the request's arrival at the handler. On the fast path ITL is not
// observed.
//
// # Per-request knobs (request headers)
//
//	x-sim-die-after: N          after N SSE events (every data line counts, the role chunk and
//	                            [DONE] included) kill the connection: no terminating chunk, no
//	                            [DONE]; 0 kills it right after the headers. Non-stream: the
//	                            connection is closed at once without a response.
//	x-sim-stall-first: D        hold the response for D: before the headers (non-stream), or
//	                            after the headers and before the first event (stream).
//	x-sim-stall-after: N        with x-sim-stall-for: D, pause for D before event N+1.
//	x-sim-status: CODE          answer CODE (400-599) at once with an OpenAI error body
//	                            (Retry-After: 1 on 429 and 503).
//
// Durations are Go durations ("250ms", "2s") or plain seconds, in real time (not scaled),
// at most 1h; a stall ends early when the client goes away. A malformed knob is a 400.
//
// Limits: request bodies up to 32 MiB, at most 4096 prompts or inputs per request.
// Not modelled: n > 1, stop sequences, logprobs, prefix caching, preemption, chunked-prefill
// token budgets (all sequences admitted in a step prefill in that one step).
package sim
