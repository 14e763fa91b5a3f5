package policy

// Failure classes: why a request or one of its attempts failed, the one vocabulary that labels
// metrics (error_type), Outcomes (ErrorClass), logs and the chaos report. The proxy sets
// them; the route maps them to the conditions a plan moves on (route.ConditionOf).
const (
	ClassClientCancel  = "client_cancel"  // the client went away
	ClassClientStalled = "client_stalled" // the client stopped reading: a write to it exceeded the write time-out
	ClassBodyTimeout   = "body_timeout"   // the client did not send its body within the body time-out
	ClassTTFTTimeout   = "ttft_timeout"   // no first byte within the route's TTFT time-out
	ClassIdleTimeout   = "idle_timeout"   // no event within the idle time-out, mid-stream
	ClassTimeout       = "timeout"        // the route's total time-out
	ClassConnect       = "connect"        // could not connect to (or send to) the endpoint
	ClassNoEndpoint    = "no_endpoint"    // no healthy endpoint in the cluster
	ClassUpstream5xx   = "upstream_5xx"   // the model server answered 5xx
	ClassUpstream429   = "upstream_429"   // the model server answered 429
	ClassUpstream4xx   = "upstream_4xx"   // the model server answered another 4xx
	ClassStreamCut     = "stream_cut"     // the stream broke after it started
	ClassStreamError   = "stream_error"   // the model server reported an error in the stream, after it started
	ClassEmptyResponse = "upstream_empty" // the upstream closed before sending anything
	ClassShutdown      = "shutdown"       // the gateway's drain deadline passed
	ClassUpstreamError = "upstream_error" // the upstream's answer could not be relayed
	// ClassUpstreamProtocol: the model server's answer broke HTTP (malformed, a short or
	// broken body, oversized headers, a flood of 1xx): it was reached and may have done the
	// work, so this is not a connection failure.
	ClassUpstreamProtocol = "upstream_protocol"
	// ClassUpstreamMalformed: a successful answer not in the promised shape (not JSON, not an
	// event stream for a stream, an encoding not asked for).
	ClassUpstreamMalformed = "upstream_malformed"
	ClassBreakerOpen       = "breaker_open"    // the cluster's breaker is open
	ClassPerTryTimeout     = "per_try_timeout" // one attempt exceeded retry.per_try_timeout (or a step's total)
)
