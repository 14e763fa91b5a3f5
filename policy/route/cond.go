package route

import (
	"slices"

	"github.com/sluicegw/sluice/policy"
)

// Moves reports whether the failure condition cond moves a request past candidate c to the
// next candidate of its plan: c.On contains it, or, when c.On is nil, policy.DefaultOn does.
func Moves(c policy.Candidate, cond string) bool {
	if cond == "" {
		return false
	}
	on := c.On
	if on == nil {
		on = policy.DefaultOn
	}
	return slices.Contains(on, cond)
}

// ConditionOf maps how an attempt failed (the gateway's error class, the upstream's status
// and OpenAI error code) to the failure condition (policy.Cond*) the plan moves on by; ""
// when the failure is not one that moves on (success, client cancel, a plain 4xx, the route's
// own total time-out). An answer matching a contract in contracts is policy.CondContract,
// whatever its class. The conditions the handler detects itself (breaker_open, overload) are
// accepted as classes too.
func ConditionOf(class policy.Class, status int, errCode string, contracts []Contract) string {
	if status >= 400 || class != "" {
		for _, c := range contracts {
			if c.Matches(status, errCode) {
				return policy.CondContract
			}
		}
	}
	switch class {
	case policy.ClassConnect, policy.ClassEmptyResponse:
		// An empty answer (the server closed without answering) is retried like a
		// connection failure: nothing reached the client.
		return policy.CondConnect
	case policy.ClassTTFTTimeout:
		return policy.CondTTFTTimeout
	case policy.ClassNoEndpoint:
		return policy.CondNoEndpoint
	case policy.ClassUpstream5xx, policy.ClassUpstreamProtocol, policy.ClassUpstreamMalformed:
		// A server that answered badly is treated as one that answered 5xx: it was reached
		// and may have done the work, so it is not retried at once as a connection failure is.
		return policy.Cond5xx
	case policy.ClassUpstream429:
		return policy.Cond429
	case policy.ClassStreamCut, policy.ClassIdleTimeout, policy.ClassStreamError:
		return policy.CondStreamCut
	case policy.Class(policy.CondBreakerOpen), policy.Class(policy.CondOverload), policy.Class(policy.CondContract):
		return string(class)
	case "":
		switch {
		case status == 429:
			return policy.Cond429
		case status >= 500 && status <= 599:
			return policy.Cond5xx
		}
	}
	return ""
}

// Verdict is what a breaker learns from an attempt: failed (it counts against the cluster) or
// excluded (it says nothing about the cluster's health); neither means success.
//
// Failures: connection errors, empty answers, 5xx, TTFT time-outs, streams cut or stalled
// mid-way, answers that could not be relayed, and contract mismatches (the cluster cannot
// serve this route). Excluded: client cancels, the route's total time-out, the gateway's
// shutdown, 4xx (429 included: an overloaded server is the fallback chain's business, not a
// broken one) and unknown classes below 500.
func Verdict(class policy.Class, status int, errCode string, contracts []Contract) (failed, excluded bool) {
	if ConditionOf(class, status, errCode, contracts) == policy.CondContract {
		return true, false
	}
	switch class {
	case "":
		if status >= 500 && status <= 599 {
			return true, false
		}
		if status >= 400 {
			return false, true
		}
		return false, false
	case policy.ClassConnect, policy.ClassEmptyResponse, policy.ClassUpstream5xx, policy.ClassTTFTTimeout,
		policy.ClassStreamCut, policy.ClassIdleTimeout, policy.ClassStreamError, policy.ClassUpstreamError, policy.ClassUpstreamProtocol, policy.ClassUpstreamMalformed:
		return true, false
	case policy.ClassClientCancel, policy.ClassTimeout, policy.ClassShutdown, policy.ClassUpstream4xx, policy.ClassUpstream429,
		policy.ClassNoEndpoint, policy.CondBreakerOpen, policy.CondOverload:
		return false, true
	}
	is5xx := status >= 500 && status <= 599
	return is5xx, !is5xx
}
