package route

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluicegw/sluice/policy"
)

const budgetBuckets = 10

// Kinds of extra attempt a Budgets bounds.
const (
	// KindRetry is another attempt on the same cluster (retry.attempts, or a connection
	// failure tried once on another endpoint).
	KindRetry = "retry"
	// KindFallback is an attempt on the next cluster of the plan (a fallback step, or the
	// continuation of a stream resumed there).
	KindFallback = "fallback"
)

// BudgetRule is one budget's size: Ratio × the window's base count, or MinPerSecond × the
// window's seconds when that is more (the floor lets a quiet route retry at all).
type BudgetRule struct {
	Ratio        float64 `json:"ratio"`
	MinPerSecond float64 `json:"min_per_second"`
}

func (r BudgetRule) allowed(base int64) int64 {
	return int64(math.Max(r.MinPerSecond*BudgetWindow.Seconds(), r.Ratio*float64(base)))
}

// Budgets are a route's retry and fallback budgets (Finagle's RetryBudget, Envoy's
// retry_budget), one of each per target cluster, over a sliding window of BudgetWindow in
// budgetBuckets buckets on the injected clock:
//
//   - retries to a cluster are at most retry.Ratio × the requests first sent to that
//     cluster (floor retry.MinPerSecond), so a failing cluster sees at most (1 + Ratio) × its
//     offered load, never a retry storm;
//   - fallbacks into a cluster (requests moving on to it from another cluster of the plan)
//     are at most fallback.Ratio × the route's requests (floor fallback.MinPerSecond). A
//     fallback moves load to a different, healthy cluster — routing, not a storm — so the
//     default ratio is 1: every request a partly failing primary cannot serve may fall back.
//     A lower ratio protects a small fallback cluster from a whole primary failing over.
//
// Retries never spend the fallback budget, nor fallbacks the retry budget. A refusal is
// counted by kind (Exhausted). All methods are safe for concurrent use; each takes one short
// mutex.
type Budgets struct {
	clock policy.Clock

	mu       sync.Mutex
	retry    BudgetRule
	fallback BudgetRule
	requests window // the route's requests
	clusters map[string]*clusterBudget
	refused  [2]int64 // by kind index, since the start
	logged   [2]logState
}

type clusterBudget struct {
	sent      window // first attempts on the cluster (the request's first, or a fallback's)
	retries   window
	fallbacks window
}

type logState struct {
	last     time.Time
	unlogged int64
}

// window counts events over BudgetWindow in budgetBuckets buckets.
type window [budgetBuckets]budgetBucket

type budgetBucket struct {
	epoch int64 // now / bucket width
	n     int64
}

const bucketWidth = int64(BudgetWindow) / budgetBuckets

func (w *window) add(epoch int64) {
	bk := &w[((epoch%budgetBuckets)+budgetBuckets)%budgetBuckets]
	if bk.epoch != epoch {
		*bk = budgetBucket{epoch: epoch}
	}
	bk.n++
}

func (w *window) sum(epoch int64) (n int64) {
	for i := range w {
		if bk := &w[i]; bk.epoch > epoch-budgetBuckets && bk.epoch <= epoch {
			n += bk.n
		}
	}
	return n
}

// NewBudgets returns the budgets of a route sending to clusters (others are added when first
// used), on clock (nil: the system clock).
func NewBudgets(retry, fallback BudgetRule, clusters []string, clock policy.Clock) *Budgets {
	if clock == nil {
		clock = policy.SystemClock{}
	}
	b := &Budgets{clock: clock, retry: retry, fallback: fallback, clusters: make(map[string]*clusterBudget, len(clusters))}
	for _, c := range clusters {
		b.clusters[c] = &clusterBudget{}
	}
	return b
}

func (b *Budgets) configure(retry, fallback BudgetRule, clusters []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.retry, b.fallback = retry, fallback
	for _, c := range clusters {
		if b.clusters[c] == nil {
			b.clusters[c] = &clusterBudget{}
		}
	}
}

func (b *Budgets) epoch() int64 { return b.clock.Now().UnixNano() / bucketWidth }

// clusterLocked returns the cluster's budget, created on first use: the clusters are the
// config's (a route's plan and a policy's reroute name configured clusters), so the map
// stays bounded.
func (b *Budgets) clusterLocked(c string) *clusterBudget {
	cb := b.clusters[c]
	if cb == nil {
		cb = &clusterBudget{}
		b.clusters[c] = cb
	}
	return cb
}

// RecordRequest counts one client request of the route (once, however many attempts it takes).
func (b *Budgets) RecordRequest() {
	e := b.epoch()
	b.mu.Lock()
	b.requests.add(e)
	b.mu.Unlock()
}

// RecordSend counts a first attempt on cluster: the request's first, or a fallback's after
// TryFallback allowed it. Retries to the cluster are measured against these.
func (b *Budgets) RecordSend(cluster string) {
	e := b.epoch()
	b.mu.Lock()
	b.clusterLocked(cluster).sent.add(e)
	b.mu.Unlock()
}

// TryRetry reports whether the retry budget of cluster has room for one more retry, and
// records it if so (concurrent callers cannot overdraw it between the check and the record).
func (b *Budgets) TryRetry(cluster string) bool {
	e := b.epoch()
	b.mu.Lock()
	defer b.mu.Unlock()
	cb := b.clusterLocked(cluster)
	if cb.retries.sum(e) >= b.retry.allowed(cb.sent.sum(e)) {
		b.refused[0]++
		b.logged[0].unlogged++
		return false
	}
	cb.retries.add(e)
	return true
}

// TryFallback reports whether the fallback budget of cluster has room for one more request
// moving on to it, and records it (and the send to cluster) if so.
func (b *Budgets) TryFallback(cluster string) bool {
	e := b.epoch()
	b.mu.Lock()
	defer b.mu.Unlock()
	cb := b.clusterLocked(cluster)
	if cb.fallbacks.sum(e) >= b.fallback.allowed(b.requests.sum(e)) {
		b.refused[1]++
		b.logged[1].unlogged++
		return false
	}
	cb.fallbacks.add(e)
	cb.sent.add(e)
	return true
}

func kindIndex(kind string) int {
	if kind == KindFallback {
		return 1
	}
	return 0
}

// Exhausted is the number of attempts of kind (KindRetry, KindFallback) refused since the
// budgets were built (a reload's Inherit keeps them).
func (b *Budgets) Exhausted(kind string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused[kindIndex(kind)]
}

// LogDue reports whether a refusal of kind should be logged now: at most once per every,
// with the number of refusals since the last log (this one included).
func (b *Budgets) LogDue(kind string, every time.Duration) (refused int64, due bool) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	ls := &b.logged[kindIndex(kind)]
	if ls.unlogged == 0 || (!ls.last.IsZero() && now.Sub(ls.last) < every) {
		return 0, false
	}
	n := ls.unlogged
	ls.last, ls.unlogged = now, 0
	return n, true
}

// BudgetStatus is the budgets' state, for the admin API.
type BudgetStatus struct {
	Window    time.Duration         `json:"window"`
	Requests  int64                 `json:"requests"` // the route's requests in the window
	Retry     BudgetRule            `json:"retry"`
	Fallback  BudgetRule            `json:"fallback"`
	Clusters  []ClusterBudgetStatus `json:"clusters"`
	Exhausted map[string]int64      `json:"exhausted"` // refusals by kind since the start
}

// ClusterBudgetStatus is one target cluster's budgets in the window.
type ClusterBudgetStatus struct {
	Cluster          string `json:"cluster"`
	Sent             int64  `json:"sent"` // first attempts sent to it
	Retries          int64  `json:"retries"`
	RetriesAllowed   int64  `json:"retries_allowed"`
	Fallbacks        int64  `json:"fallbacks"`
	FallbacksAllowed int64  `json:"fallbacks_allowed"`
}

// Status returns the budgets' window counts, clusters in name order.
func (b *Budgets) Status() BudgetStatus {
	e := b.epoch()
	b.mu.Lock()
	defer b.mu.Unlock()
	req := b.requests.sum(e)
	s := BudgetStatus{
		Window: BudgetWindow, Requests: req, Retry: b.retry, Fallback: b.fallback,
		Exhausted: map[string]int64{KindRetry: b.refused[0], KindFallback: b.refused[1]},
	}
	for name, cb := range b.clusters {
		sent := cb.sent.sum(e)
		s.Clusters = append(s.Clusters, ClusterBudgetStatus{
			Cluster: name, Sent: sent,
			Retries: cb.retries.sum(e), RetriesAllowed: b.retry.allowed(sent),
			Fallbacks: cb.fallbacks.sum(e), FallbacksAllowed: b.fallback.allowed(req),
		})
	}
	slices.SortFunc(s.Clusters, func(a, b ClusterBudgetStatus) int { return cmp.Compare(a.Cluster, b.Cluster) })
	return s
}
