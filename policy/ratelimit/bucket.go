package ratelimit

import (
	"math"
	"sync"
	"time"
)

// maxDelay bounds every wait and reset the buckets report (about 146 years), so that rounding
// them up (formatReset, Retry-After) never overflows a time.Duration.
const maxDelay = time.Duration(1 << 62)

// tokenBucket is a token bucket that may go into debt: it holds at most capacity tokens,
// refills continuously at rate tokens a second, and its level goes negative when a charge is
// borrowed from the future; later charges wait the debt out. Every operation is O(1) and
// allocation-free whatever the count, so no charge, however large, costs more than another.
// It is safe for concurrent use.
//
// Its arithmetic is golang.org/x/time/rate's (refill = elapsed seconds × rate, wait = missing
// tokens / rate), so waits and levels are the same, but there is no reservation object: a
// charge that is not kept is given back with give, which adds the tokens back (never above the
// capacity), whenever that happens.
type tokenBucket struct {
	rate     float64 // tokens per second, > 0
	capacity float64 // >= 1

	mu    sync.Mutex
	level float64   // at last: at most capacity, negative in debt
	last  time.Time // when level was last brought up to date
}

// newTokenBucket returns a full bucket of capacity tokens refilling at perMinute a minute.
func newTokenBucket(perMinute float64, capacity int) *tokenBucket {
	return &tokenBucket{rate: perMinute / 60, capacity: float64(capacity), level: float64(capacity)}
}

// levelAt returns the level at now without changing the bucket. b.mu is held. A now before
// the last update (callers racing with their clock readings) adds nothing: time never runs
// backwards for the bucket, so no refill is counted twice.
func (b *tokenBucket) levelAt(now time.Time) float64 {
	if !now.After(b.last) {
		return b.level
	}
	return min(b.capacity, b.level+now.Sub(b.last).Seconds()*b.rate)
}

// advance brings the level up to date at now and returns it. b.mu is held.
func (b *tokenBucket) advance(now time.Time) float64 {
	lvl := b.levelAt(now)
	b.level = lvl
	if now.After(b.last) {
		b.last = now
	}
	return lvl
}

// take charges n tokens at now, into debt if need be, and returns how long the charge must
// wait: until the bucket held n tokens before it, or, for n above the capacity, until it was
// full (what is beyond the capacity is borrowed from the future).
func (b *tokenBucket) take(now time.Time, n float64) time.Duration {
	b.mu.Lock()
	lvl := b.advance(now)
	b.level = lvl - n
	b.mu.Unlock()
	if need := min(n, b.capacity); lvl < need {
		return b.durationOf(need - lvl)
	}
	return 0
}

// give adds n tokens back at now (a cancelled charge or a refund), never above the capacity.
func (b *tokenBucket) give(now time.Time, n float64) {
	b.mu.Lock()
	b.level = min(b.capacity, b.advance(now)+n)
	b.mu.Unlock()
}

// state returns the level at now (negative in debt) and how long until the bucket is full.
func (b *tokenBucket) state(now time.Time) (level float64, reset time.Duration) {
	b.mu.Lock()
	level = b.levelAt(now)
	b.mu.Unlock()
	if missing := b.capacity - level; missing > 0 {
		reset = b.durationOf(missing)
	}
	return level, reset
}

// full reports whether the bucket is full at now (forgetting it would change nothing).
func (b *tokenBucket) full(now time.Time) bool {
	lvl, _ := b.state(now)
	return lvl >= b.capacity
}

// durationOf returns the time n tokens take to refill, at most maxDelay.
func (b *tokenBucket) durationOf(n float64) time.Duration {
	d := float64(time.Second) * (n / b.rate)
	if !(d < float64(maxDelay)) { // also NaN
		return maxDelay
	}
	return time.Duration(d)
}

// satMul returns a × b for a, b >= 0, or math.MaxInt when that overflows.
func satMul(a, b int) int {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt/b {
		return math.MaxInt
	}
	return a * b
}

// satAdd returns a + b for a, b >= 0, or math.MaxInt when that overflows.
func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}
