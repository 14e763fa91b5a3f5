package batch

import (
	"sync/atomic"
	"time"
)

// SizeBuckets are the upper bounds of the items-per-batch histogram in Stats.Sizes (the last
// bucket counts everything above the one before it).
var SizeBuckets = [...]int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1 << 62}

func bucket(items int) int {
	for i, ub := range SizeBuckets {
		if items <= ub {
			return i
		}
	}
	return len(SizeBuckets) - 1
}

type stats struct {
	requests, alone, merged, batches, items, earlyFlushes   atomic.Int64
	splits, cancelledBefore, cancelledAfter, grows, shrinks atomic.Int64
	sizes                                                   [len(SizeBuckets)]atomic.Int64
}

// Stats are the batcher's counters since New, for metrics.
type Stats struct {
	Requests        int64                   `json:"requests"`         // Do calls
	Alone           int64                   `json:"alone"`            // sent alone: not batchable, over a cap alone, or after Close
	Merged          int64                   `json:"merged"`           // callers in sent batches
	Batches         int64                   `json:"batches"`          // batches sent (their first upstream request)
	Items           int64                   `json:"items"`            // inputs in sent batches
	Sizes           [len(SizeBuckets)]int64 `json:"sizes"`            // batches by items, bounds SizeBuckets
	EarlyFlushes    int64                   `json:"early_flushes"`    // batches sent before the window ended (a cap reached)
	Splits          int64                   `json:"splits"`           // 4xx answers retried by halves
	CancelledBefore int64                   `json:"cancelled_before"` // callers gone before their batch was sent (removed)
	CancelledAfter  int64                   `json:"cancelled_after"`  // callers gone after their batch was sent
	WindowGrows     int64                   `json:"window_grows"`     // AIMD additive increases
	WindowShrinks   int64                   `json:"window_shrinks"`   // AIMD multiplicative decreases
	Window          time.Duration           `json:"window_ns"`        // the window now
}

// ItemsPerBatch is the mean number of inputs per batch (0 before the first).
func (s Stats) ItemsPerBatch() float64 {
	if s.Batches == 0 {
		return 0
	}
	return float64(s.Items) / float64(s.Batches)
}

// Stats returns the counters.
func (b *Batcher) Stats() Stats {
	s := Stats{
		Requests: b.st.requests.Load(), Alone: b.st.alone.Load(), Merged: b.st.merged.Load(),
		Batches: b.st.batches.Load(), Items: b.st.items.Load(), EarlyFlushes: b.st.earlyFlushes.Load(),
		Splits: b.st.splits.Load(), CancelledBefore: b.st.cancelledBefore.Load(),
		CancelledAfter: b.st.cancelledAfter.Load(), WindowGrows: b.st.grows.Load(),
		WindowShrinks: b.st.shrinks.Load(), Window: b.Window(),
	}
	for i := range s.Sizes {
		s.Sizes[i] = b.st.sizes[i].Load()
	}
	return s
}

// Snapshot is the batcher's state for the admin API.
type Snapshot struct {
	Params   Params `json:"params"`
	Stats    Stats  `json:"stats"`
	Window   string `json:"window"`
	Open     int    `json:"open_batches"` // batches not sent yet (window open, or waiting for a slot)
	Waiting  int    `json:"waiting"`      // callers in those batches
	InFlight int    `json:"in_flight"`    // batches sent and not answered yet
}

// Snapshot returns the parameters, counters and open batches.
func (b *Batcher) Snapshot() Snapshot {
	s := Snapshot{Params: b.p, Stats: b.Stats()}
	s.Window = s.Stats.Window.String()
	b.mu.Lock()
	for _, ks := range b.keys {
		s.InFlight += ks.inflight
		for _, bt := range append([]*batch{ks.open}, ks.queued...) {
			if bt != nil {
				s.Open++
				s.Waiting += len(bt.callers)
			}
		}
	}
	b.mu.Unlock()
	return s
}
