package policy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// Class is why a request or one of its attempts failed: the one vocabulary that labels metrics
// (error_type), Outcomes (ErrorClass), logs and the chaos report. Every class has one row in
// the class table (its status, OpenAI error type, default message and whether another attempt
// may follow); the route maps classes to the conditions a plan moves on (route.ConditionOf).
type Class string

// The gateway's failure classes: transport and upstream.
const (
	ClassClientCancel  Class = "client_cancel"  // the client went away
	ClassClientStalled Class = "client_stalled" // the client stopped reading: a write to it exceeded the write time-out
	ClassBodyTimeout   Class = "body_timeout"   // the client did not send its body within the body time-out
	ClassTTFTTimeout   Class = "ttft_timeout"   // no first byte within the route's TTFT time-out
	ClassIdleTimeout   Class = "idle_timeout"   // no event within the idle time-out, mid-stream
	ClassTimeout       Class = "timeout"        // the route's total time-out
	ClassConnect       Class = "connect"        // could not connect to (or send to) the endpoint
	ClassNoEndpoint    Class = "no_endpoint"    // no healthy endpoint in the cluster
	ClassUpstream5xx   Class = "upstream_5xx"   // the model server answered 5xx
	ClassUpstream429   Class = "upstream_429"   // the model server answered 429
	ClassUpstream4xx   Class = "upstream_4xx"   // the model server answered another 4xx
	ClassStreamCut     Class = "stream_cut"     // the stream broke after it started
	ClassStreamError   Class = "stream_error"   // the model server reported an error in the stream, after it started
	ClassEmptyResponse Class = "upstream_empty" // the upstream closed before sending anything
	ClassShutdown      Class = "shutdown"       // the gateway's drain deadline passed
	ClassUpstreamError Class = "upstream_error" // the upstream's answer could not be relayed
	// ClassUpstreamProtocol: the model server's answer broke HTTP (malformed, a short or
	// broken body, oversized headers, a flood of 1xx): it was reached and may have done the
	// work, so this is not a connection failure.
	ClassUpstreamProtocol Class = "upstream_protocol"
	// ClassUpstreamMalformed: a successful answer not in the promised shape (not JSON, not an
	// event stream for a stream, an encoding not asked for).
	ClassUpstreamMalformed Class = "upstream_malformed"
	ClassBreakerOpen       Class = "breaker_open"    // the cluster's breaker is open
	ClassPerTryTimeout     Class = "per_try_timeout" // one attempt exceeded retry.per_try_timeout (or a step's total)
	ClassFaultInjected     Class = "fault_injected"  // a chaos fault answered for the model server
	ClassBatchSplit        Class = "batch_split"     // a batched answer could not be split back into its requests
	ClassPolicyError       Class = "policy_error"    // a policy failed (not a rejection: a bug or a broken dependency)
	ClassUnparsed          Class = "unparsed"        // a mirrored copy's answer could not be parsed for the comparison
)

// The policies' rejections.
const (
	ClassRateLimited       Class = "rate_limit_exceeded"     // a request or token budget is spent (ratelimit)
	ClassConcurrencyLimit  Class = "concurrency_limit"       // the cluster's concurrency limit and queue are full (concurrency)
	ClassInvalidAPIKey     Class = "invalid_api_key"         // no or an unknown API key where tenants are required
	ClassPromptTooLarge    Class = "prompt_too_large"        // the prompt is over the guard's size bound
	ClassContextLength     Class = "context_length_exceeded" // prompt plus max_tokens exceed the model's context window
	ClassPromptTooDeep     Class = "prompt_too_deep"         // the body nests deeper than the guard allows
	ClassTooManyMessages   Class = "too_many_messages"       // more messages than the guard allows
	ClassPromptRepetitive  Class = "prompt_repetitive"       // the prompt repeats itself past the guard's bound
	ClassPromptSurge       Class = "prompt_surge"            // the prompt is far larger than the tenant's baseline
	ClassTenantBreakerOpen Class = "tenant_breaker_open"     // the tenant's (or client's) breaker is open
	ClassLoadShed          Class = "load_shed"               // staged degradation sheds this priority
)

// The output side's findings (stream filters).
const (
	// ClassRunaway: the answer fell into a loop (the same n-gram or paragraph generated again
	// and again); cut, or only flagged, by the runaway policy.
	ClassRunaway Class = "runaway_generation"
)

// The request's own faults, found before any policy runs.
const (
	ClassUnknownURL      Class = "unknown_url"            // a path outside /v1/
	ClassInvalidPath     Class = "invalid_path"           // a path with dot or empty segments
	ClassNoRoute         Class = "no_route"               // no route matches
	ClassModelNotFound   Class = "model_not_found"        // the route serves no such model
	ClassUnsupportedType Class = "unsupported_media_type" // a body that is not JSON
	ClassBodyRead        Class = "body_read"              // the body could not be read
	ClassTooLarge        Class = "request_too_large"      // the body is over max_body_bytes
	ClassInvalidJSON     Class = "invalid_json"           // the body is not JSON
	ClassInvalidType     Class = "invalid_type"           // a field of the wrong JSON type
	ClassInvalidValue    Class = "invalid_value"          // a field with a value out of range
	ClassMissingField    Class = "missing_field"          // a required field is missing
	ClassInvalidRequest  Class = "invalid_request"        // the request cannot be sent as it is
	ClassFaultNotAllowed Class = "fault_not_allowed"      // x-sluice-fault without the admin token or network
	ClassInvalidFault    Class = "invalid_fault"          // x-sluice-fault does not parse
)

// StatusClientClosed is nginx's 499: the client closed the request.
const StatusClientClosed = 499

// ClassInfo is a class's row in the class table.
type ClassInfo struct {
	Status  int    // the HTTP status a client gets for it
	Type    string // OpenAI's error type
	Message string // the message when the failure gives none
	// Retryable: another attempt (another endpoint, another candidate) may follow a failure of
	// this class before anything reached the client.
	Retryable bool
}

// classes is the one table from failure class to status: 499 client gone, 504 upstream
// time-out, 503 breaker open, no healthy endpoint or shutting down, 429 rate limit or queue
// full, 413 too large, 400 bad request, 502 otherwise.
var classes = map[Class]ClassInfo{
	ClassClientCancel:      {StatusClientClosed, "invalid_request_error", "client closed the request", false},
	ClassClientStalled:     {StatusClientClosed, "invalid_request_error", "the client stopped reading the answer", false},
	ClassBodyTimeout:       {http.StatusRequestTimeout, "invalid_request_error", "the request body did not arrive within the body time-out", false},
	ClassTTFTTimeout:       {http.StatusGatewayTimeout, "timeout_error", "upstream sent no first token within the route's TTFT time-out", true},
	ClassIdleTimeout:       {http.StatusGatewayTimeout, "timeout_error", "upstream stalled longer than the route's idle time-out", true},
	ClassTimeout:           {http.StatusGatewayTimeout, "timeout_error", "request exceeded the route's total time-out", false},
	ClassPerTryTimeout:     {http.StatusGatewayTimeout, "timeout_error", "the model server did not answer within the per-try time-out", true},
	ClassNoEndpoint:        {http.StatusServiceUnavailable, "server_error", "no healthy endpoint is available for this route", false},
	ClassBreakerOpen:       {http.StatusServiceUnavailable, "server_error", "the model server pool is failing and its breaker is open; retry later", false},
	ClassShutdown:          {http.StatusServiceUnavailable, "server_error", "the gateway is shutting down; retry on another replica", false},
	ClassConnect:           {http.StatusBadGateway, "server_error", "could not connect to the model server", true},
	ClassStreamCut:         {http.StatusBadGateway, "server_error", "the model server's stream ended before completion", true},
	ClassStreamError:       {http.StatusBadGateway, "server_error", "the model server reported an error in the stream", false},
	ClassEmptyResponse:     {http.StatusBadGateway, "server_error", "the model server closed the connection without answering", true},
	ClassUpstreamError:     {http.StatusBadGateway, "server_error", "the model server's answer could not be relayed", true},
	ClassUpstreamProtocol:  {http.StatusBadGateway, "server_error", "the model server's answer broke off or was malformed", true},
	ClassUpstreamMalformed: {http.StatusBadGateway, "server_error", "the model server sent an invalid response", true},
	ClassUpstream5xx:       {http.StatusBadGateway, "server_error", "the model server failed", true},
	ClassUpstream429:       {http.StatusTooManyRequests, "rate_limit_error", "the model server is busy", true},
	ClassUpstream4xx:       {http.StatusBadRequest, "invalid_request_error", "the model server refused the request", false},
	ClassFaultInjected:     {http.StatusServiceUnavailable, "server_error", "fault injected", false},
	ClassBatchSplit:        {http.StatusBadGateway, "server_error", "the batched answer could not be split", false},
	ClassPolicyError:       {http.StatusInternalServerError, "server_error", "a policy failed", false},
	ClassUnparsed:          {http.StatusBadGateway, "server_error", "the answer could not be parsed", false},

	ClassRateLimited:       {http.StatusTooManyRequests, "rate_limit_error", "rate limit reached", false},
	ClassConcurrencyLimit:  {http.StatusTooManyRequests, "rate_limit_error", "the concurrency limit is reached", false},
	ClassInvalidAPIKey:     {http.StatusUnauthorized, "invalid_request_error", "Incorrect API key provided.", false},
	ClassPromptTooLarge:    {http.StatusRequestEntityTooLarge, "invalid_request_error", "the prompt is too large", false},
	ClassContextLength:     {http.StatusBadRequest, "invalid_request_error", "the prompt and max_tokens exceed the model's context length", false},
	ClassPromptTooDeep:     {http.StatusBadRequest, "invalid_request_error", "the request nests too deeply", false},
	ClassTooManyMessages:   {http.StatusBadRequest, "invalid_request_error", "the request has too many messages", false},
	ClassPromptRepetitive:  {http.StatusBadRequest, "invalid_request_error", "the prompt repeats itself", false},
	ClassPromptSurge:       {http.StatusRequestEntityTooLarge, "invalid_request_error", "the prompt is far larger than usual", false},
	ClassTenantBreakerOpen: {http.StatusServiceUnavailable, "server_error", "the breaker is open for this client", false},
	ClassLoadShed:          {http.StatusServiceUnavailable, "server_error", "the gateway is shedding load", false},
	ClassRunaway:           {http.StatusBadGateway, "server_error", "the answer was cut: the model repeated itself (runaway generation)", false},

	ClassUnknownURL:      {http.StatusNotFound, "invalid_request_error", "unknown path", false},
	ClassInvalidPath:     {http.StatusBadRequest, "invalid_request_error", "invalid path", false},
	ClassNoRoute:         {http.StatusNotFound, "invalid_request_error", "no route matches", false},
	ClassModelNotFound:   {http.StatusNotFound, "invalid_request_error", "the model does not exist", false},
	ClassUnsupportedType: {http.StatusUnsupportedMediaType, "invalid_request_error", "the request body must be JSON", false},
	ClassBodyRead:        {http.StatusBadRequest, "invalid_request_error", "reading the request body failed", false},
	ClassTooLarge:        {http.StatusRequestEntityTooLarge, "invalid_request_error", "the request body is too large", false},
	ClassInvalidJSON:     {http.StatusBadRequest, "invalid_request_error", "the body is not valid JSON", false},
	ClassInvalidType:     {http.StatusBadRequest, "invalid_request_error", "a field has the wrong type", false},
	ClassInvalidValue:    {http.StatusBadRequest, "invalid_request_error", "a field has an invalid value", false},
	ClassMissingField:    {http.StatusBadRequest, "invalid_request_error", "a required field is missing", false},
	ClassInvalidRequest:  {http.StatusBadRequest, "invalid_request_error", "invalid request", false},
	ClassFaultNotAllowed: {http.StatusForbidden, "permission_error", "faults need the admin token", false},
	ClassInvalidFault:    {http.StatusBadRequest, "invalid_request_error", "invalid fault", false},
}

// Info is the class's row in the class table; an unknown class is a 502 server error.
func (c Class) Info() ClassInfo {
	if i, ok := classes[c]; ok {
		return i
	}
	return ClassInfo{Status: http.StatusBadGateway, Type: "server_error", Message: "the model server's answer could not be relayed"}
}

// Known reports whether the class has a row in the class table.
func (c Class) Known() bool {
	_, ok := classes[c]
	return ok
}

// Classes lists every class in the table.
func Classes() []Class {
	out := make([]Class, 0, len(classes))
	for c := range classes {
		out = append(out, c)
	}
	return out
}

// Phase is when a failure happened: before anything reached the client (the request can still
// move to another attempt and gets an HTTP error) or in the stream (the client has part of the
// answer, and gets an in-band error event).
type Phase uint8

// The phases.
const (
	BeforeFirstByte Phase = iota
	InStream
)

// Failure is one failed request or attempt: its class, when it happened, what the client is
// told and why (the cause, for logs). It is the one value a failure travels in, from a policy's
// rejection or an attempt's result to the client's answer (built in one place, proxy/errors.go).
type Failure struct {
	Class Class
	Phase Phase
	// Status, Type and Code are what the client gets: the class table's status and type, and
	// the class as the code, unless the failure is more specific (a model server's own
	// status, a chaos fault's configured one; OpenAI's "tokens" and "requests" types).
	Status     int
	Type       string
	Code       string
	Message    string        // the class table's when empty
	Param      string        // the offending request parameter, if any
	RetryAfter time.Duration // if positive, the client gets Retry-After
	Err        error         // the cause (for logs, never the client's)
}

// Fail is a failure of class c with its message (the class table's when msg is empty), its
// status and type from the class table.
func Fail(c Class, msg string) *Failure {
	i := c.Info()
	if msg == "" {
		msg = i.Message
	}
	return &Failure{Class: c, Status: i.Status, Type: i.Type, Code: string(c), Message: msg}
}

// Failf is Fail with the cause err kept for logs.
func Failf(c Class, err error, msg string) *Failure {
	f := Fail(c, msg)
	f.Err = err
	return f
}

// Error implements error: "<status> <class>: <message>".
func (f *Failure) Error() string {
	return strconv.Itoa(f.Status) + " " + string(f.Class) + ": " + f.Message
}

// Unwrap is the cause.
func (f *Failure) Unwrap() error { return f.Err }

// Retryable reports whether another attempt may follow the failure: the class allows it and
// nothing reached the client yet.
func (f *Failure) Retryable() bool {
	return f != nil && f.Phase == BeforeFirstByte && f.Class.Info().Retryable
}

// OpenAI is the failure as the client gets it: an OpenAI error with its status and
// Retry-After.
func (f *Failure) OpenAI() *openai.Error {
	return &openai.Error{Status: f.Status, Type: f.Type, Code: f.Code, Message: f.Message, Param: f.Param, RetryAfter: f.RetryAfter}
}

// FromOpenAI is the failure an OpenAI error stands for (a parser's, a chaos fault's): its code
// is the class, its status and type stand.
func FromOpenAI(e *openai.Error) *Failure {
	return &Failure{Class: Class(e.Code), Status: e.Status, Type: e.Type, Code: e.Code, Message: e.Message, Param: e.Param, RetryAfter: e.RetryAfter, Err: e}
}

// UpstreamClass is the class of a model server's answer by its status ("" for a success,
// below 400): a 5xx or a 429 may be retried (another endpoint, another cluster; see
// Info().Retryable), any other 4xx is the request's own and goes back to the client. The one
// place where an upstream status becomes a class: attempts, batched requests and the
// shadow's copies all use it.
func UpstreamClass(status int) Class {
	switch {
	case status >= 500:
		return ClassUpstream5xx
	case status == 429:
		return ClassUpstream429
	case status >= 400:
		return ClassUpstream4xx
	}
	return ""
}
