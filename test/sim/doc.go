// Package sim is a simulated OpenAI-compatible model server that behaves like a vLLM
// instance: the same endpoints, response shapes, errors and metric names, deterministic
// answers, and a performance model in which time to first token rises under load the way it
// does on a real server. `sluice mock` serves it; every gateway test runs against it.
//
// # Endpoints
//
//	POST /v1/chat/completions   stream and non-stream, tools, stream_options.include_usage
//	POST /v1/completions        prompt: string, array of strings, token ids, arrays of token ids (one choice each)
//	POST /v1/responses          OpenAI Responses API, stream and non-stream, function tools, previous_response_id
//	POST /v1/embeddings         input as above; dimensions; encoding_format float or base64 (little-endian float32)
//	GET  /v1/models             lists Config.Model with max_model_len (GET /v1/models/{id} too)
//	GET  /health                200 (404 with Config.NoHealth, like servers that have none)
//	GET  /metrics               Prometheus text, vLLM names, label model_name
//
// Errors use OpenAI's shape {"error":{"message","type","param","code"}}: unknown path 404
// not_found, malformed JSON 400 invalid_json, another model 404 model_not_found, prompt +
// max tokens over MaxModelLen 400 context_length_exceeded with vLLM's message ("This
// model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000
// in the messages, 1000 in the completion). Please reduce the length of the messages or
// completion."), a request whose prompt + max tokens exceed the whole KV cache 400
// kv_cache_exceeded, body over 32 MiB 413. A missing "model" means the served model, as in
// vLLM.
//
// # Answers
//
// Output tokens are words of a built-in vocabulary (one word = one token, each after the
// first with a leading space), drawn by a PRNG seeded from a hash of the model name, the
// whole conversation (every message's role and text, content parts, tool calls) or prompt,
// and the "seed" parameter. Without "seed", a temperature above 0 mixes in randomness;
// otherwise the same request always gets the same answer, streamed or not, and the same
// conversation gets the same answer from chat and from the Responses API.
//
// Length: max_completion_tokens, else max_tokens (max_output_tokens for the Responses API),
// else MaxTokensDefault (lowered to what
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
// Logprobs: chat's "logprobs": true with "top_logprobs": K (0 to 20), and completions'
// "logprobs": K (0 to 20), get deterministic log probabilities shaped like vLLM's, streamed
// (each chunk carries its own tokens') and not. Chat: choices[i].logprobs {"content":
// [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}, the K alternatives
// with the sampled token first; completions: {text_offset, token_logprobs, tokens,
// top_logprobs: [{token: logprob}]}, K entries (the sampled token alone for K = 0). Values
// are float32s widened, as vLLM's, floored at -9999. Each token comes from a simulated
// next-token distribution over the vocabulary, geometric in the rank (the sampled token the
// most probable), whose sharpness is drawn from the answer's hash: mostly sure, with
// stretches of 8 tokens that are not (see logprobs.go). Config.LogprobTemperature divides
// every sharpness: above 1 a model less sure of itself. The same request gets the same
// logprobs streamed or not. vLLM's checks apply: top_logprobs without logprobs true, or
// above 20, is a 400 (param top_logprobs); completions' logprobs above 20 too. A tool call
// carries "logprobs": null, and the Responses API "logprobs": [] (neither is modelled).
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
// # Responses API
//
// POST /v1/responses takes model (optional), input (a string, or an array of items:
// {role, content} or {type: "message", role, content} with role user, assistant, system or
// developer and content a string or parts [{type: "input_text"|"output_text", text},
// {type: "input_image", image_url}]; {type: "function_call", call_id, name, arguments};
// {type: "function_call_output", call_id, output}; reasoning items are skipped),
// instructions, stream, max_output_tokens, temperature, top_p, seed, ignore_eos (as in
// chat), tools (flat: {type: "function", name, description, parameters, strict}; other tool
// types are accepted and never called), tool_choice ("auto", "none", "required" or
// {type: "function", name}), parallel_tool_calls, previous_response_id, user, metadata
// (string values), store and text.format (text, json_object or json_schema with name and
// schema: validated and echoed, not enforced, as chat ignores response_format). Invalid
// fields are 400s naming the field in "param" (input[2].call_id, max_output_tokens, ...);
// over-length requests get the context_length_exceeded 400 above with param "input".
//
// The request stands for a chat conversation: instructions as a system message, then the
// stored conversation of previous_response_id, then one message per input item (a
// function_call is an assistant message with that one tool call, a function_call_output a
// tool message with its call_id). Its answer is exactly the chat answer to that
// conversation (same text, markers, tool-call rules, call id and arguments), and it runs
// through the same engine, knobs and error injection. Prompt tokens are counted as for chat
// (the tools JSON is the Responses one). max_output_tokens reaching the end gives status
// "incomplete" with incomplete_details {"reason": "max_output_tokens"} (the output item's
// status is "incomplete" too); otherwise "completed".
//
// The answer is a response object {id "resp_…", object "response", created_at, status,
// error null, incomplete_details, model, output, usage {input_tokens, output_tokens,
// total_tokens, input_tokens_details.cached_tokens 0, output_tokens_details.reasoning_tokens
// 0}} plus the echoed request fields (instructions, max_output_tokens, metadata {},
// parallel_tool_calls true, previous_response_id, store, temperature 1, text
// {"format":{"type":"text"}}, tool_choice "auto", tools [], top_p 1, truncation "disabled",
// user, ...). output holds one item: {type "message", id "msg_…", status, role "assistant",
// content [{type "output_text", text, annotations [], logprobs []}]} or {type
// "function_call", id "fc_…", call_id "call_…", name, arguments, status}.
//
// Stored responses: unless "store" is false, every finished response (streamed or not) keeps
// its conversation (input after its own previous conversation, then its output; not its
// instructions, which OpenAI does not carry over), stored before the answer is written, so
// previous_response_id works at once. At most 1024 responses and 64 MiB of text are kept
// per server, oldest dropped first; an unknown or dropped id is a 404
// previous_response_not_found (param previous_response_id). Each server has its own store,
// so a previous_response_id sent to another instance is a 404, as with vLLM's in-memory
// store (VLLM_ENABLE_RESPONSES_API_STORE).
//
// A Responses stream is `event: TYPE\ndata: {"type": TYPE, "sequence_number": N, ...}\n\n`
// per event, N counting from 0, and no [DONE]. response.created and response.in_progress
// (the response object with status "in_progress", output [] and usage null) come right
// after the headers, before the request enters the engine, as vLLM sends them. With the
// first token: response.output_item.added (the item, status "in_progress", no content or
// empty arguments) and, for text, response.content_part.added (an empty output_text part).
// Then one response.output_text.delta {item_id, output_index 0, content_index 0, delta,
// logprobs []} per TokensPerEvent tokens (one per decode step by default), or
// response.function_call_arguments.delta {item_id, output_index, delta} per TokensPerEvent
// argument fragments. At the end: response.output_text.done {text} and
// response.content_part.done, or response.function_call_arguments.done {arguments}; then
// response.output_item.done (the whole item), then response.completed, or
// response.incomplete when max_output_tokens cut the answer, carrying the final response
// object with its usage. A text answer of n tokens is n+8 events at one token per event:
//
//	event: response.created               {"type":…,"sequence_number":0,"response":{…"status":"in_progress"…}}
//	event: response.in_progress           {… 1 …}
//	event: response.output_item.added     {…,"output_index":0,"item":{"type":"message","id":"msg_…","status":"in_progress",…,"content":[]}}
//	event: response.content_part.added    {…,"item_id":"msg_…","output_index":0,"content_index":0,"part":{"type":"output_text","text":"",…}}
//	event: response.output_text.delta     {…,"delta":"morning"} (n times)
//	event: response.output_text.done      {…,"text":"morning all"}
//	event: response.content_part.done     {…,"part":{"type":"output_text","text":"morning all",…}}
//	event: response.output_item.done      {…,"item":{…,"status":"completed",…}}
//	event: response.completed             {…,"response":{…,"output":[…],"usage":{…}}}
//
// # Performance model
//
// A scheduler goroutine (started by New, stopped by Close) runs engine steps like vLLM's
// continuous batching. Each API request becomes one sequence per answer (chat and
// responses: 1, completions: one per prompt, embeddings: one per input, prefill only). Sequences wait in a
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
// vllm:kv_cache_usage_perc reports prompt + generated tokens of the running sequences (plus
// any leaked, see below) over KVTokens; admission uses the reservation (prompt + max output tokens), so usage can read
// below 1 while the queue waits for KV space.
//
// State knobs, for a gateway's model-server checks. KV-cache leak: LeakKVPerRequest tokens of
// KV cache stay in use after each finished sequence (on the fast path too), never freed:
// vllm:kv_cache_usage_perc stays up with nothing running and grows with each request, up to
// the whole cache, and admission has that much less room; SetKVLeak sets the leaked amount
// (0 frees it, as a restart would). Stall: every step's time is multiplied by Slowdown
// (SetSlowdown at run time re-times the step under way; +Inf pauses the engine until a finite
// factor is set), so throughput falls while requests keep queueing; it needs the scheduler.
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
// They apply to every API endpoint, /v1/responses included. "Events" are SSE events: every
// chat or completions data line (the role chunk, the usage chunk and [DONE] included), and
// every Responses API event (response.created and response.in_progress included).
//
//	x-sim-die-after: N          after N SSE events kill the connection: no terminating chunk,
//	                            no [DONE]; 0 kills it right after the headers. Non-stream:
//	                            the connection is closed at once without a response.
//	x-sim-stall-first: D        hold the response for D: before the headers (non-stream), or
//	                            after the headers and before the first event (stream).
//	x-sim-stall-after: N        with x-sim-stall-for: D, pause for D before event N+1.
//	x-sim-status: CODE          answer CODE (400-599) at once with an OpenAI error body
//	                            (Retry-After: 1 on 429 and 503).
//	x-sim-error-after: N        after N SSE events end the stream with an in-stream error, as
//	                            vLLM does when a request fails mid-stream: chat and
//	                            completions send
//	                            data: {"error":{"message":"…","type":"InternalServerError","param":null,"code":500}}
//	                            then data: [DONE]; the Responses API sends
//	                            event: error
//	                            data: {"type":"error","sequence_number":N,"code":"server_error","message":"…","param":null}
//	                            and nothing after it. The body then ends normally (no broken
//	                            connection); the request counts in Stats().Errors. N at or
//	                            past the stream's length: no error. Non-stream: a 500 with
//	                            the vLLM body above, at once.
//	x-sim-error-event: 1        with x-sim-error-after: put an "event: error" line before the
//	                            chat/completions error's data line, as some servers do
//	                            (1/true or 0/false; Responses errors are always named).
//	x-sim-loop-after: N         the text answer falls into a loop after N tokens (N >= 1): from
//	                            token N on it repeats its own tokens N-P .. N-1 again and
//	                            again, never reaching EOS, up to max tokens (finish_reason
//	                            "length"; Responses: "incomplete"), as a degenerate model
//	                            does. Every choice and endpoint, streamed or not, the same
//	                            way; a continuation continues the loop. An answer that ends
//	                            before token N, and a tool call, are left as they are.
//	x-sim-loop-period: P        with x-sim-loop-after: the block repeated, P tokens (1 to N,
//	                            default min(16, N)): 1 repeats a word, 64 a paragraph.
//
// At the same event count a stall comes first, then die-after, then error-after.
//
// Durations are Go durations ("250ms", "2s") or plain seconds, in real time (not scaled),
// at most 1h; a stall ends early when the client goes away. A malformed knob is a 400.
//
// Limits: request bodies up to 32 MiB, at most 4096 prompts or inputs per request.
// Not modelled: n > 1, stop sequences, echo, prefix caching, preemption, chunked-prefill
// token budgets (all sequences admitted in a step prefill in that one step).
package sim
