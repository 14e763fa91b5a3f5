// Package upstream holds the clusters the gateway sends requests to: their endpoints, the
// health of each endpoint, how many requests each has in flight, and the HTTP transport that
// carries requests to them.
//
// # The picture
//
//	Options ──Validate──► NewCluster ──(Inherit old)──► Start ──► PickFor ─► Begin/End ─► Report
//	                                                                 ▲                        │
//	                    active health checks (one goroutine per      │                        │
//	                    endpoint, owned by the cluster) ─► healthy ──┘      outlier ejection ◄┘
//
// A [Cluster] is built from [Options] and is immutable apart from the per-endpoint state
// (in-flight count, health, ejection, counters), which is all atomic or behind small locks.
// The gateway asks [Cluster.PickFor] for an endpoint, brackets the request with
// [Endpoint.Begin]/[Endpoint.End] (or [Endpoint.Acquire]), sends it with
// [Cluster.Transport], and tells the endpoint how it went with [Endpoint.Report].
//
// # Picking
//
// The gateway asks [Cluster.PickFor] with a [Hint] (the request's prompt-prefix hash), or
// [Cluster.Pick], which is PickFor without a hint. Both scan every endpoint once (O(n), no
// allocation) and never count the request: the caller calls Begin.
//
// Strategy least_inflight (the default without Options.Load), weighted least request:
// endpoint a beats b when (inflight(a)+1)/weight(a) < (inflight(b)+1)/weight(b). With equal
// weights (the default, 1) this is plain least in-flight. Equal normalised load goes to the
// higher weight; a remaining tie (same in-flight, same weight) is broken round-robin.
//
// Strategy load_aware (the default with Options.Load) adds what the model server reports
// through [LoadSource], for signals that are fresh (Get returns ok):
//
//	score = (inflight+1)/weight × InFlightWeight + waiting × WaitingWeight + kv × KVWeight
//
// and picks the lowest score. In-flight counts this gateway's requests and moves at once;
// waiting (the server's queue, all clients' requests) and kv (KV-cache use, 0..1) move only
// at each scrape, so the in-flight term keeps a burst between two scrapes from piling onto
// the endpoint that looked idlest. An endpoint without a fresh signal (never scraped,
// scrape failing, stale, or a non-finite or negative value) is scored as if its signal term
// were the mean signal term of the endpoints that have one in this pick: it is neither
// taken for idle (which would draw every request to a server whose metrics endpoint is
// down) nor shunned, and among such endpoints in-flight decides. With no fresh signal at
// all this is least in-flight (counted as no_signals). Equal scores are broken at random
// (reservoir sampling), so idle endpoints share evenly.
//
// Prefix affinity (both strategies; Picking.DisableAffinity turns it off): when the hint
// carries a PrefixHash (and PrefixLen is 0 or at least AffinityMinPrefix), the available
// endpoints, exclude aside, are ranked by rendezvous hashing of the prefix with each
// endpoint's URL key (weighted by endpoint weight; deterministic, so every gateway replica
// and every reload agrees). The top one is the affinity endpoint: requests sharing a prompt
// prefix go there, where the model server's prefix cache holds it, as long as its score is
// at most AffinityMaxLoad above the best score; otherwise that request goes to the
// best-scoring endpoint (affinity abandoned for load). An endpoint added to or removed from
// the cluster moves only the prefixes it wins or held, about 1/n of them. Excluding the
// affinity endpoint (a retry) sends the request to the prefix's next endpoint in rendezvous
// order.
//
// Flagged endpoints (both strategies): when Options.Load reports flags for an endpoint (a
// KV-cache leak or a stall, found by package gpu's checks on a fresh signal), the endpoint
// keeps Picking.FlaggedWeight (default 0.1) of its weight in every term that uses the weight:
// (in-flight+1)/weight in least in-flight and in the load-aware score. It is picked less, not
// never: idle endpoints win over it, loaded ones share with it in proportion. Least in-flight
// then reads Options.Load too (for the flags only), at most once per LoadCache per endpoint.
// The rendezvous ranking keeps the configured weight (prefixes do not move), but a flagged
// affinity endpoint scores at its lowered weight, so affinity is abandoned unless the others
// are much busier.
//
// Every pick is counted on the chosen endpoint by reason ([PickStats]: least_inflight,
// load_aware, no_signals, affinity_kept, affinity_abandoned, panic), in
// [Cluster.Snapshot] per endpoint and [Cluster.PickStats] per cluster.
//
// The endpoint passed as exclude (the one that just failed) is skipped when any other
// endpoint is available.
//
// An endpoint is available when it is healthy by active checks (or active checking is off)
// and not ejected by outlier detection (or outlier detection is off).
//
// Panic mode, after Envoy's panic threshold but narrower: when no endpoint is available but
// some are healthy by active checks and merely ejected, Pick returns the one whose ejection
// ends soonest (still honouring exclude where it can), because sending to a possibly bad
// endpoint beats failing every request. Pick returns [ErrNoHealthyEndpoint] only when every
// endpoint is unhealthy by active health checks.
//
// # Active health checks
//
// With HealthCheck.Interval > 0, [Cluster.Start] checks every endpoint each Interval with
// GET scheme://host + HealthCheck.Path (the endpoint URL's own path is not used), with
// HealthCheck.Timeout; 2xx is a success, anything else (including redirects and transport
// errors) a failure. An endpoint starts healthy (optimistic, as Envoy without
// initial-health-check gating): UnhealthyThreshold consecutive failures mark it unhealthy and
// HealthyThreshold consecutive successes mark it healthy again. Transitions are logged on
// Options.Logger. A successful active check does not end an outlier ejection (Envoy's
// successful_active_health_check_uneject_host is not followed: a model server's /health
// often answers 200 while generation fails).
//
// # Outlier detection (passive)
//
// [Endpoint.Report] takes the caller's verdict on each request: a failure is a connect error,
// a 5xx, or a response cut mid-stream; client cancellations are not reported at all. After
// Outlier.ConsecutiveFailures failures in a row the endpoint is ejected, and the consecutive
// count is reset whether or not the ejection was allowed (as Envoy does). A success resets
// the count. The ejection lasts BaseEjection × m, capped at MaxEjection, where m is the
// ejection multiplier: it grows by one with each ejection (while BaseEjection × m is below
// MaxEjection + BaseEjection) and, as in Envoy, shrinks by one for each full DecayInterval
// the endpoint has spent back in service since its last ejection ended. Expiry is checked
// lazily against the [Clock] at Pick time; no timer goroutine exists.
//
// MaxEjectionPercent follows Envoy's rule: an ejection is allowed only when
// 100 × (ejected now + 1) ≤ MaxEjectionPercent × len(endpoints). With the default of 50 a
// cluster of two or more endpoints can always eject at least one; a single-endpoint cluster
// is never ejected unless MaxEjectionPercent is 100 (and then panic mode still routes to it).
//
// Flag ejection (Outlier.EjectFlagged, off by default): a pick that reads flags for an
// endpoint ejects it as consecutive failures would (BaseEjection × multiplier, the same
// multiplier and decay, within MaxEjectionPercent), except that it never ejects the last
// available endpoint of the cluster (healthy and not ejected): a degraded server beats none.
// An endpoint still flagged when its ejection ends is ejected again, for longer. It works
// with passive failure ejection off (ConsecutiveFailures 0). The status says why an endpoint
// is ejected (EndpointStatus.EjectionReason) and which flags it has now.
//
// # Reloads
//
// On a config reload the gateway builds new clusters with [NewCluster] and calls
// [Cluster.Inherit] with the old cluster of the same name before Start. Endpoints whose URL is
// unchanged share their state with the old cluster's endpoints (in-flight count, health,
// ejection and multiplier, counters), so a reload resets neither outlier state nor in-flight
// accounting, and requests still running on the old cluster release their in-flight count on
// the shared state. When the transport settings are unchanged the new cluster also shares the
// old cluster's connection pool (reference counted). Closing the old cluster then stops only
// its health checks; idle connections are closed when the last cluster using the transport
// is closed.
package upstream
