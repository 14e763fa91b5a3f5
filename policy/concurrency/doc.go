// Package concurrency is the adaptive concurrency limiter: a policy.Admitter that keeps the
// requests a route has in flight on its model servers near the point where they are fastest,
// and queues the rest by priority and deadline. It is registered as policy type "concurrency";
// one instance belongs to one route (its key is the route), and learns from the Outcome that the
// gateway hands to Decision.Done (it is not an Observer: Done settles each admission once).
// It offers the gateway its Snapshot as its admin view (policy.Viewer) and its limit, queue,
// rejections and waits as metrics (policy.MetricsReporter, view.go).
//
// # Controller (Gradient2 / Envoy adaptive-concurrency style)
//
// Each finished request that got a token adds its TTFT and, with 2+ tokens, its TPOT (time per
// output token) to the current sample window: per-token latency, not whole-request time, which
// grows with output length. An outcome that says "overloaded" without a latency (upstream 429 or
// 5xx, ttft_timeout, status 429/503) counts as a drop; other failures (client gone, 4xx) are
// ignored. A window closes at the first settlement after it has lasted sample_window and holds
// min_samples (samples + drops). Then, for s ∈ {TTFT, TPOT} with samples in the window:
//
//	sample_s   = percentile (p90) of the window's values of s
//	baseline_s = the lowest sample_s seen; it rises only after the limit has sat at min_limit
//	             for min_rtt, to the minimum of sample_s over that last min_rtt (like Envoy's
//	             minRTT recalculation at minimum concurrency; a plain sliding minimum drifts up
//	             under sustained overload and takes the limit with it)
//	ref_s      = baseline_s × (1 + tolerance), lowered to target_s when that is set and lower
//	grad_s     = ref_s / sample_s
//	latency    = min(grad_TTFT, grad_TPOT, 1 − drops/(samples+drops) when drops > 0)
//	pressure   = min over the clusters that served in the window, from fresh GPU/queue signals:
//	             kv > kv_high:            min(0.95, 1 − (kv − kv_high) / (2 (1 − kv_high)))
//	                                      (kv = kv_high+ → 0.95, kv = 1 → 0.5)
//	             waiting grew since that cluster's previous fresh reading (prev → now, now ≥ 1):
//	                                      min(0.95, (prev + 1) / (now + 1))
//	             otherwise 1 (stale or missing signals are ignored)
//	gradient   = clamp(min(latency, pressure), min_gradient, max_gradient)   (pressure 1 does not
//	             cap a latency gradient above 1 when max_gradient > 1)
//	headroom   = headroom param (default √limit), only when min(latency, pressure) ≥ 1
//	             (no congestion) and the window was not app-limited; 0 otherwise
//	new        = limit × gradient + headroom
//	limit      = clamp((1 − smoothing) × limit + smoothing × new, min_limit, max_limit)
//
// A window is app-limited when its highest in-flight count stayed under limit/2: such a window
// cannot show whether a higher limit would hurt, so it neither adds headroom nor lets a gradient
// above 1 raise the limit (as Gradient2 does). Headroom is withheld under congestion (a
// deviation from "limit × gradient + headroom" always): at small limits √limit outweighs any
// gradient ≥ 0.5, and the limit could never fall. The limit in force is ⌊limit⌋.
//
// # Queue
//
// A request that finds no free slot (or others already waiting) waits in a queue of at most
// max_queue, ordered by priority (higher first: the tenant's from SetPriorities, or the
// x-sluice-priority header with trust_priority_header), then deadline (the earlier of ctx's
// deadline and arrival + max_wait), then arrival. It is rejected at once with 429
// concurrency_limit and Retry-After when the queue is full, or when its deadline would pass
// before a slot could plausibly free up: expected wait = position × hold / limit, where hold is
// the EWMA of the time slots are held (slots free up at about limit/hold per second; no
// estimate before the first settlement). A waiter that reaches its deadline gets 429
// (queue_timeout); one whose ctx ends leaves the queue and Admit returns ctx's error. Done frees
// the slot and hands free slots to waiters in queue order. There is no polling: waiters block on
// a channel, and max_wait timers use the clock's AfterFunc when it has one (see AfterFuncer),
// else time.AfterFunc. Everything timed reads env.Clock.
package concurrency
