// Package openai is the gateway's view of the OpenAI HTTP API: what it must understand of
// a request and of an answer on the hot path, and nothing it does not.
//
// On the way in, KindOf classifies the endpoint, ReadBody reads the body under a bound, and
// ParseRequest scans it once, in place, for what the policies need: model, stream, sizes
// and shape (messages, prompt characters, a token estimate, structural depth, tools). The
// body is never re-marshalled; when a route renames the model, SetModel splices the new
// value into a copy and leaves every other byte alone.
//
// On the way out, Reader splits an SSE stream into events without allocating per event;
// the relay writes each Event's Raw bytes through unchanged while a Tap scans its data for
// token timing (TTFT, gaps between token events), finish_reason and usage. WriteEvent and
// DoneEvent write events of the gateway's own.
//
// Errors that reach a client are *Error: an HTTP status plus OpenAI's error JSON
// ({"error":{"message","type","param","code"}}), written as a response by WriteError or,
// once a stream has started, as an in-band SSE event by Error.SSE.
//
// Everything here is built on one small JSON scanner (scan.go): strict like encoding/json,
// zero-copy, iterative (deep nesting costs a bit per level, not stack), and it matches
// keys exactly, as the model servers' decoders do, so the gateway and the model server
// read the same request.
package openai
