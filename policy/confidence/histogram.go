package confidence

import (
	"math"
	"sync/atomic"
)

// The fixed buckets (upper bounds; one more bucket above the last) of the distributions.
var (
	// EntropyBuckets bound a token's (or an answer's mean) entropy in nats: the top-k
	// entropy is at most ln k (1.61 for 5, 3.00 for 20).
	EntropyBuckets = []float64{0.01, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.25, 1.5, 2, 3}
	// MarginBuckets bound a token's top-1/top-2 probability margin, in [0, 1].
	MarginBuckets = []float64{0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.99, 1}
)

const maxBuckets = 13 // len(EntropyBuckets) + 1

// localHist counts values into buckets without atomics: a watcher's own, added to the
// series' histogram once, at its end.
type localHist struct {
	counts [maxBuckets]uint64
	sum    float64
	n      uint64
}

func (h *localHist) add(bounds []float64, v float64) {
	i := 0
	for i < len(bounds) && v > bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += v
	h.n++
}

// hist is a series' histogram, safe for concurrent use.
type hist struct {
	counts [maxBuckets]atomic.Uint64
	sum    atomic.Uint64 // float64 bits
}

func (h *hist) merge(l *localHist) {
	if l.n == 0 {
		return
	}
	for i, c := range l.counts {
		if c > 0 {
			h.counts[i].Add(c)
		}
	}
	for {
		old := h.sum.Load()
		if h.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+l.sum)) {
			break
		}
	}
}

// Histogram is a snapshot of a distribution: Counts[i] values at most Bounds[i] (and above
// the bound before), the last count above every bound.
type Histogram struct {
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	Sum    float64   `json:"sum"`
}

// Mean is the mean value, 0 without values.
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / float64(h.Count)
}

func (h *hist) snapshot(bounds []float64) Histogram {
	s := Histogram{Bounds: bounds, Counts: make([]uint64, len(bounds)+1)}
	for i := range s.Counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i] // the buckets' total, so that a scrape reads a consistent histogram
	}
	s.Sum = math.Float64frombits(h.sum.Load())
	return s
}
