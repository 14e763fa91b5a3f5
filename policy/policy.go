// Package policy holds the contracts between the gateway's request path and its policies, and
// nothing else. The handler (proxy/handler.go) calls them in this order:
//
//	admit  Admitter.Admit       rate limits ─► prompt guard ─► concurrency   (may reject or wait)
//	plan   Planner.Plan         splits, then the fallback chain
//	settle Observer.Observe     breakers and adaptive limits learn from the Outcome
//
// Policies learn only from Outcomes: they never see the response body or the client's writer.
package policy

import (
	"context"
	"net/http"
	"time"

	"github.com/sluicegw/sluice/policy/clock"
	"github.com/sluicegw/sluice/policy/openai"
)

// Request is what a policy sees of one client request: the parsed body plus its identity.
type Request struct {
	*openai.Request
	ID     string // x-request-id
	Route  string // matched route name
	Tenant string // tenant name ("" when anonymous)
	// Client is the client's IP address: the peer's, or, when the peer is one of the
	// configured trusted_proxies, the first address from the right of X-Forwarded-For
	// (or Forwarded) that is not a trusted proxy.
	Client string
	// ClientKnown reports that Client names one client: trusted_proxies is configured, so
	// the gateway knows which peers are proxies. Without it the peer may be a load balancer
	// or a sidecar in front of many clients, and nothing per client (a breaker, a baseline)
	// may be keyed by it.
	ClientKnown bool
	Session     string      // X-Session-ID, else the body's user field
	GrayFlag    string      // value of the gray-flag header
	Header      http.Header // the client's headers (read-only)
	Arrival     time.Time   // when the gateway received the request
	// ContextWindow is the context window the model server advertises for the request's
	// model (vLLM's max_model_len on /v1/models), 0 when unknown.
	ContextWindow int
}

// Decision is an Admitter's answer.
type Decision struct {
	// Reject, when non-nil, is the failure the client gets: its class (whose row in the class
	// table gives the status), message and Retry-After.
	Reject *Failure
	// Header, when non-nil, is added to the client's response whatever happens next (e.g. the
	// x-ratelimit-* headers).
	Header http.Header
	// CapMaxTokens, when > 0, lowers the request's max_tokens to at most this before it is sent
	// (staged degradation).
	CapMaxTokens int
	// Reroute, when set, sends the request to this cluster instead of the route's plan (e.g. an
	// oversized prompt to a long-context cluster).
	Reroute string
	// SetFields, when non-nil, are top-level fields set on the request's body before it is
	// sent (e.g. logprobs asked of the upstream by a stream filter that strips them again).
	// A field the client set itself is left as the client set it. Keys must be plain JSON
	// field names; values whole JSON values.
	SetFields map[string][]byte
	// Done, when non-nil, is called once with the request's Outcome (e.g. to release a slot or
	// reconcile a token charge). It must not block.
	Done func(Outcome)
}

// Admitter decides whether a request may proceed. Admit may wait, but never past ctx's deadline.
type Admitter interface {
	Admit(ctx context.Context, r *Request) (Decision, error)
}

// Candidate is one place a request may be served: a cluster, an optional model rewrite, the
// failures that move on from it to the next candidate, and its own time-outs.
type Candidate struct {
	Cluster string
	Model   string // "" keeps the request's model
	// Split names the split that chose this cluster ("" for a fallback step).
	Split string
	// On lists the failure conditions (Cond*) on which the plan moves past this candidate to
	// the next one. Nil means the defaults of the step (see DefaultOn).
	On []string
	// TTFT, Idle and Total override the route's time-outs for attempts on this candidate
	// (0 keeps the route's).
	TTFT, Idle, Total time.Duration
}

// Failure conditions that move a request on to the next candidate (before the first byte
// reached the client).
const (
	CondConnect     = "connect"      // could not connect or send
	Cond5xx         = "5xx"          // the model server answered 5xx
	Cond429         = "429"          // the model server answered 429
	CondTTFTTimeout = "ttft_timeout" // no first byte within the TTFT time-out
	CondBreakerOpen = "breaker_open" // the cluster's breaker is open
	CondNoEndpoint  = "no_endpoint"  // no healthy endpoint in the cluster
	CondOverload    = "overload"     // the gateway's own limit for the cluster is full
	CondContract    = "contract"     // the answer matched the route's contract-mismatch list
	CondStreamCut   = "stream_cut"   // the stream broke mid-way (only with resume)
)

// DefaultOn is what moves on from a candidate that does not say: every failure before the
// first byte (a contract mismatch only arises where the route lists one).
var DefaultOn = []string{CondConnect, Cond5xx, Cond429, CondTTFTTimeout, CondBreakerOpen, CondNoEndpoint, CondOverload, CondContract}

// Planner orders the candidates for a request: the primary first, then fallbacks.
type Planner interface {
	Plan(ctx context.Context, r *Request) []Candidate
}

// Outcome is how a request ended, as the policies learn it.
type Outcome struct {
	Status       int           // HTTP status the client got (499 when it went away)
	ErrorClass   Class         // "" on success
	Cluster      string        // the candidate that served (or failed last)
	Endpoint     string        // the endpoint URL that served (or failed last)
	Attempts     int           // upstream attempts made
	Duration     time.Duration // whole request
	TTFT         time.Duration // 0 if no token reached the client
	TPOT         time.Duration // mean time per output token after the first, 0 if < 2 tokens
	InputTokens  int           // usage.prompt_tokens, else the estimate
	OutputTokens int           // usage.completion_tokens, else the tap's count
	// Flags are what the stream filters saw in the answer without failing it (e.g.
	// ClassRunaway for a loop that was counted but not cut); nil when none.
	Flags []Class
}

// Clock is the one time source of policies, injected so that breakers, limiters and batchers
// are tested without sleeping (package clock, a leaf).
type Clock = clock.Clock

// SystemClock is the real clock.
type SystemClock = clock.System

// Observer learns from finished requests. Observe must not block.
type Observer interface {
	Observe(ctx context.Context, r *Request, o Outcome)
}
