package route

import (
	"math"
	"sync"
	"time"

	"github.com/sluicegw/sluice/policy"
)

const budgetBuckets = 10

// Budget is a route's retry budget (Finagle's RetryBudget, Envoy's retry_budget): over a
// sliding window of BudgetWindow, retries may be at most Ratio × the requests seen in the
// window, or MinPerSecond × the window's seconds when that is more (the floor lets a quiet
// route retry at all). A failing backend therefore sees at most (1 + Ratio) × the offered
// load, never a retry storm.
//
// The window is BudgetWindow in budgetBuckets buckets on the injected clock. All methods are
// safe for concurrent use; each takes one short mutex.
type Budget struct {
	clock policy.Clock

	mu      sync.Mutex
	ratio   float64
	floor   float64 // retries always allowed in a window
	buckets [budgetBuckets]budgetBucket
}

type budgetBucket struct {
	epoch    int64 // now / bucket width
	requests int64
	retries  int64
}

// BudgetStatus is a budget's state, for the admin API.
type BudgetStatus struct {
	Window   time.Duration `json:"window"`
	Requests int64         `json:"requests"` // requests in the window
	Retries  int64         `json:"retries"`  // retries in the window
	Allowed  int64         `json:"allowed"`  // retries the window allows now
	Ratio    float64       `json:"ratio"`
	MinPerS  float64       `json:"min_retries_per_second"`
}

// NewBudget returns a budget allowing ratio × requests retries, at least minPerSecond per
// second, over BudgetWindow on clock (nil: the system clock).
func NewBudget(ratio, minPerSecond float64, clock policy.Clock) *Budget {
	if clock == nil {
		clock = policy.SystemClock{}
	}
	b := &Budget{clock: clock}
	b.configure(ratio, minPerSecond)
	return b
}

func (b *Budget) configure(ratio, minPerSecond float64) {
	b.mu.Lock()
	b.ratio = ratio
	b.floor = minPerSecond * BudgetWindow.Seconds()
	b.mu.Unlock()
}

const bucketWidth = int64(BudgetWindow) / budgetBuckets

// bucketLocked returns the current bucket, cleared if it held an older epoch.
func (b *Budget) bucketLocked(epoch int64) *budgetBucket {
	bk := &b.buckets[((epoch%budgetBuckets)+budgetBuckets)%budgetBuckets]
	if bk.epoch != epoch {
		*bk = budgetBucket{epoch: epoch}
	}
	return bk
}

func (b *Budget) epoch() int64 {
	return b.clock.Now().UnixNano() / bucketWidth
}

// sumLocked counts the requests and retries of the window ending in epoch.
func (b *Budget) sumLocked(epoch int64) (requests, retries int64) {
	for i := range b.buckets {
		bk := &b.buckets[i]
		if bk.epoch > epoch-budgetBuckets && bk.epoch <= epoch {
			requests += bk.requests
			retries += bk.retries
		}
	}
	return requests, retries
}

func (b *Budget) allowedLocked(requests int64) int64 {
	return int64(math.Max(b.floor, b.ratio*float64(requests)))
}

// RecordRequest counts one client request (once per request, however many attempts it takes).
func (b *Budget) RecordRequest() {
	e := b.epoch()
	b.mu.Lock()
	b.bucketLocked(e).requests++
	b.mu.Unlock()
}

// RecordRetry counts one retry (an upstream attempt after the request's first).
func (b *Budget) RecordRetry() {
	e := b.epoch()
	b.mu.Lock()
	b.bucketLocked(e).retries++
	b.mu.Unlock()
}

// AllowRetry reports whether the window has room for one more retry; it records nothing.
func (b *Budget) AllowRetry() bool {
	e := b.epoch()
	b.mu.Lock()
	defer b.mu.Unlock()
	req, ret := b.sumLocked(e)
	return ret < b.allowedLocked(req)
}

// TryRetry is AllowRetry and RecordRetry in one step: concurrent callers cannot overdraw the
// budget between the check and the record. The request path should use it.
func (b *Budget) TryRetry() bool {
	e := b.epoch()
	b.mu.Lock()
	defer b.mu.Unlock()
	req, ret := b.sumLocked(e)
	if ret >= b.allowedLocked(req) {
		return false
	}
	b.bucketLocked(e).retries++
	return true
}

// Status returns the budget's window counts.
func (b *Budget) Status() BudgetStatus {
	e := b.epoch()
	b.mu.Lock()
	defer b.mu.Unlock()
	req, ret := b.sumLocked(e)
	return BudgetStatus{
		Window: BudgetWindow, Requests: req, Retries: ret, Allowed: b.allowedLocked(req),
		Ratio: b.ratio, MinPerS: b.floor / BudgetWindow.Seconds(),
	}
}
