// Package fault is Sluice's built-in chaos: faults injected on the live request path, before
// forwarding and inside the answer at SSE-event granularity, on either side of the gateway.
//
// An Engine holds the configured faults (config `chaos:`, or at runtime Set/Add/Remove/Clear
// from the admin API) and plans each request: Plan returns nil (without allocating) when no
// fault applies, else an Injection whose methods the handler calls at each step:
//
//	in := engine.Plan(req, route, headerFaults)    // nil-safe from here on
//	defer in.Done(fault.Outcome{...})              // verdict, log, counters, max_active slot
//	w = in.WrapDownstream(ctx, w)                  // downstream stream faults
//	abort, err := in.Before(ctx)                   // downstream delay / abort
//	for each upstream attempt:
//	    at := in.Attempt(cluster)                  // upstream faults of this attempt
//	    abort, err := at.Before(actx)              // upstream delay / abort (abort.Response)
//	    resp.Body = at.WrapUpstream(actx, resp.Body, isSSE)
//
// Event numbers count events with data from 1 (comments and keep-alives do not count; data:
// [DONE] does); token counts are token events as openai.Tap defines them (choices carrying
// content, text, reasoning, a refusal or a tool call). Every wait ends with its context.
// Clear is a kill switch: requests in flight stop being faulted at their next event.
//
// What each kind does, upstream (what the gateway reads) and downstream (what the client
// gets):
//
//	abort      before forwarding: an OpenAI error answer (status, Retry-After); upstream it
//	           stands for the model server's answer (retries, fallback, breakers react),
//	           downstream it goes to the client
//	delay      before forwarding: wait for, plus Gamma(shape, scale) when set
//	ttft       hold the first event for `for`
//	stall      pause `for` once, before the event after the Nth event (after_events) or
//	           after the Nth token event (after_tokens)
//	cut        in place of event N+1: eof (upstream io.EOF; downstream every later Write is
//	           swallowed), reset / h2reset (upstream a *CutError, not io.EOF;
//	           downstream panic(http.ErrAbortHandler): net/http resets the HTTP/2 stream or
//	           closes the connection), sse_error (an `event: error` event, then the end)
//	drip       wait gap (+ uniform jitter, + Gamma) before every event
//	malformed  event N (at, default 1) becomes its first half (truncate) or gets a trailing
//	           comma (invalid); a JSON body is truncated likewise
//	drop       usage: the usage-only chunk (a usage field on a chunk with choices is
//	           removed); done: the data: [DONE] event
//	corrupt    words, numbers and punctuation of choices[].delta.content, .message.content
//	           and .text are replaced at rate with plausible alternatives from a built-in
//	           vocabulary; the JSON stays valid; repeatable given seed
//	drift      rename or remove fields by path (choices[].delta.tool_calls[].function.arguments,
//	           usage); the other bytes are kept exactly
//
// A non-streaming JSON answer gets drift, corrupt and malformed only.
//
// # Kinds, by phase
//
// Each kind lives in one file, kind_<name>.go: its Kind constant and modes, the parameters
// it takes and their problems, the phase it acts in, and what it does there, behind the
// unexported faultKind interface (kind.go). The machinery dispatches by phase and never
// names a kind: Spec.Validate checks the common keys and asks the kind about its own
// parameters; Before hands each requestFault (phase beforeForwarding: delay, abort) a step
// to wait on or abort; a stream hands each eventFault the event at hand, in phase order
// (endsStream: cut, which also says how the stream ends on each side; onEvents: ttft,
// stall, drip, drop, corrupt, drift, in the faults' order; lastOnEvents: malformed), and a
// non-streaming body to each bodyFault (drift, corrupt, malformed). Optional interfaces
// give a kind what it needs beyond that: opener for state of its own in each stream
// (corrupt's generator, stall's token count), compiler for work done once when the fault
// is set (drift's paths).
//
// To add a kind: write kind_<name>.go with its Kind constant, a type implementing faultKind
// and requestFault or eventFault (and bodyFault, opener, compiler as needed), and add it to
// registry in kind.go (which orders Kinds and sizes the counters); document it in the table
// above. A new parameter is also a Spec field, a line of Spec.set and one of headerParams.
// TestRegistry checks that every kind is registered once, consistent with its phase, and
// documented here.
package fault
