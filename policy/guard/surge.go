package guard

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// The surge baseline: the prompt sizes (tokens) of a sender's recent admitted, successful
// requests on a route, in a sliding window of buckets. Each bucket is a small histogram with log-spaced
// bins (8 exact bins for 0..7, then 4 bins an octave, each at most 25% wide), and the window
// keeps their sum, so adding a sample and reading the p95 are O(bins) with fixed memory
// whatever the traffic. The p95 is reported as the upper bound of its bin: it errs high, so
// the surge signal errs towards admitting.

const numBins = 8 + 4*29 // up to 2^32 tokens

func binOf(v int) int {
	if v < 8 {
		return max(v, 0)
	}
	u := uint64(v)
	e := bits.Len64(u) - 1 // >= 3
	b := 8 + (e-3)*4 + int(u>>(e-2)&3)
	return min(b, numBins-1)
}

// binUpper is the largest value of bin b.
func binUpper(b int) int {
	if b < 8 {
		return b
	}
	e := (b-8)/4 + 3
	sub := (b - 8) % 4
	return (4+sub+1)<<(e-2) - 1
}

type histBucket struct {
	epoch int64 // which bucket period it holds
	n     uint32
	bins  [numBins]uint32
}

// baseline is one sender's sliding window on a route.
type baseline struct {
	lastUsed atomic.Int64 // env clock, UnixNano: for dropping the least recently used
	evicted  atomic.Bool  // dropped from the set: a ticket holding it looks the sender up again
	mu       sync.Mutex
	period   time.Duration
	head     int64 // the newest epoch seen
	total    uint32
	sum      [numBins]uint32
	ring     []histBucket
}

func newBaseline(window time.Duration, buckets int) *baseline {
	return &baseline{period: window / time.Duration(buckets), ring: make([]histBucket, buckets)}
}

// advance expires the buckets that fell out of the window at now. Caller holds mu.
func (b *baseline) advance(now time.Time) int64 {
	ep := now.UnixNano() / int64(b.period)
	if ep <= b.head {
		return b.head // time does not go back: late samples go to the newest bucket
	}
	n := int64(len(b.ring))
	if ep-b.head >= n {
		for i := range b.ring {
			b.ring[i] = histBucket{epoch: ep}
		}
		b.sum, b.total = [numBins]uint32{}, 0
	} else {
		for e := b.head + 1; e <= ep; e++ {
			hb := &b.ring[e%n]
			if hb.n > 0 {
				for i, c := range hb.bins {
					b.sum[i] -= c
				}
				b.total -= hb.n
				hb.bins = [numBins]uint32{}
				hb.n = 0
			}
			hb.epoch = e
		}
	}
	b.head = ep
	return ep
}

// add records one prompt's tokens at now.
func (b *baseline) add(tokens int, now time.Time) {
	b.mu.Lock()
	ep := b.advance(now)
	hb := &b.ring[ep%int64(len(b.ring))]
	bin := binOf(tokens)
	hb.bins[bin]++
	hb.n++
	b.sum[bin]++
	b.total++
	b.mu.Unlock()
}

// p95 returns the window's p95 (upper bound of its bin) and the number of samples in it.
func (b *baseline) p95(now time.Time) (p95 int, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	if b.total == 0 {
		return 0, 0
	}
	need := (uint64(b.total)*95 + 99) / 100 // ceil(0.95 n)
	var cum uint64
	for i, c := range b.sum {
		cum += uint64(c)
		if cum >= need {
			return binUpper(i), int(b.total)
		}
	}
	return binUpper(numBins - 1), int(b.total)
}
