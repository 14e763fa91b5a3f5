// Package batch merges small requests into one upstream request and splits the answer back:
// adaptive micro-batching of /v1/embeddings (and, opt-in, of non-streamed /v1/completions with
// identical parameters). Chat completions are never merged.
//
// # Merging
//
// Batcher.Do takes a parsed request, its tenant and a Send function (the gateway's way of
// sending one body upstream and getting the whole answer back). Requests with the same key
// — the tenant, the kind, the input form (text or token IDs) and every other body field
// (model, encoding_format, dimensions, user, ...) — that arrive within the window are merged:
// each caller's input (string, []string, []int or [][]int) becomes a list, the lists are
// concatenated in arrival order into one body, and that body is sent once. The answer's items
// (data, or choices for completions: prompt i's answer j has index i×n+j) are given back by
// index: each caller gets its own, re-indexed from 0, with the other top-level fields as they
// came (object, model, id, ...) and its share of usage (prompt_tokens in proportion to its
// estimated prompt tokens, completion_tokens to the estimated tokens of its choices' text;
// the shares sum exactly to the totals, by largest remainder).
//
// A batch is sent when its window ends, or at once when it reaches max_items (or the
// backend's backend_max_inputs) inputs or max_tokens estimated tokens; a request that would
// overflow the open batch closes it and starts the next. A request that alone exceeds a cap
// is sent alone, unchanged, as are requests that cannot be merged. A batch of one sends its
// caller's body unchanged and relays the answer unchanged.
//
// # Window (AIMD)
//
// The window starts at initial_window. After each batch answered 2xx, it grows by increase
// when the batch's latency (the Send call, measured with the injected clock) was within
// target_latency, and is multiplied by decrease (0 < decrease < 1) when it was not; it stays
// within [min_window, max_window]. So the window widens while the model server keeps up and
// halves as soon as batches get slow, as Clipper's AIMD batch sizing does.
//
// At most max_in_flight batches of a key are in flight. A batch whose window ends while all
// slots are taken stays open (taking requests up to the caps) and is sent when a slot frees:
// under load, batches grow by themselves instead of queueing at the model server, and the
// latency AIMD sees is the server's batch time, not its queue.
//
// # Failures and cancellation
//
// A 4xx for a merged batch (except 408 and 429, which say nothing about the inputs) is
// retried by halves, recursively, so a bad input fails only its own caller, which gets the
// upstream's error for its own body; with one bad caller among n, about 2·log2(n) extra
// requests. A 5xx, a 408/429 or a transport error goes to every caller of the batch.
//
// A caller whose context ends before its batch is sent is taken out of it (the upstream never
// sees its inputs). One whose context ends after gets ctx.Err() and costs nothing else: the
// others get their answers; it is left out of any later bisection; and when every caller of
// a batch has gone, the batch's upstream request is cancelled.
//
// There is no polling: each open batch has one timer, each sent batch one goroutine (two
// halves of a bisection run side by side). Close sends what is open, waits for what is in
// flight and leaves no goroutine or timer behind.
//
// # Wiring
//
// The batcher is configured like a policy ({type: batch, params: {...}}) but is neither an
// Admitter nor an Observer: the gateway builds it with FromSpec and calls Do around its send
// step for batchable requests (see Batchable).
package batch
