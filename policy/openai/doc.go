// Package openai is the gateway's view of the OpenAI HTTP API: what it must understand of
// a request and of an answer on the hot path, and nothing it does not.
//
// On the way in, KindOf classifies the endpoint (chat completions, completions,
// embeddings, the Responses API at POST /v1/responses, the model list), ReadBody reads the
// body under a bound, and ParseRequest scans it once, in place, for what the policies
// need: model, stream, sizes and shape (messages or input items, prompt characters, a
// token estimate, structural depth, tools), and for Responses the server-side state a
// request refers to (previous_response_id, store, background). The model is optional: a
// request without one parses with Model "" and the caller decides whether the route
// supplies one (vLLM serves its default model). The body is never re-marshalled; when a
// route renames the model, SetModel splices the new value into a copy and leaves every
// other byte alone.
//
// On the way out, Reader splits an SSE stream into events without allocating per event;
// the relay writes each Event's Raw bytes through unchanged while a Tap scans its data for
// token timing (TTFT, gaps between token events), finish_reason and usage. The Tap reads
// chat and completion chunks and Responses API events alike (Responses data is told apart
// by its top-level "type"; its finish is mapped to chat's by ResponsesFinishReason), and
// Tap.Done means the stream's end marker was seen: data: [DONE], or a Responses terminal
// event. WriteEvent and DoneEvent write events of the gateway's own.
//
// Errors that reach a client are *Error: an HTTP status plus OpenAI's error JSON
// ({"error":{"message","type","param","code"}}), written as a response by WriteError or,
// once a stream has started, as an in-band SSE event by Error.SSE (chat and completions)
// or Error.ResponsesSSE (a Responses stream, numbered after the last event relayed).
//
// Everything here is built on one small JSON scanner (scan.go): strict like encoding/json,
// zero-copy, iterative (deep nesting costs a bit per level, not stack), and it matches
// keys exactly, as the model servers' decoders do, so the gateway and the model server
// read the same request.
package openai
