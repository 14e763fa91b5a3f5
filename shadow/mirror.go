package shadow

import (
	"context"
	"hash/fnv"
	"math"
	"sync"
	"sync/atomic"
)

// Sampled reports whether the traffic identified by key (a session, else a tenant, else a
// client) is mirrored at fraction. The choice is a hash of salt and key, so every request of
// a conversation gets the same answer, and routes with different salts mirror different
// conversations. An empty key is never mirrored below fraction 1: without a key there is no
// conversation to keep whole.
func Sampled(salt, key string, fraction float64) bool {
	switch {
	case fraction >= 1:
		return true
	case fraction <= 0 || math.IsNaN(fraction) || key == "":
		return false
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(salt))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(key))
	// The top 53 bits as a uniform number in [0, 1).
	return float64(mix(h.Sum64())>>11)/(1<<53) < fraction
}

// mix is a 64-bit finaliser (splitmix64) that spreads FNV's weak high bits.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// MirrorCounts are a mirror's counters since it started.
type MirrorCounts struct {
	Offered  int64 `json:"offered"`  // copies offered to the queue
	Dropped  int64 `json:"dropped"`  // dropped because the queue was full (or the mirror stopped)
	Started  int64 `json:"started"`  // taken by a worker
	Finished int64 `json:"finished"` // workers done with them
	Queued   int64 `json:"queued"`   // waiting now
	Running  int64 `json:"running"`  // in a worker now
}

// Queue is a bounded queue of mirror jobs served by up to a fixed number of workers, each
// started when a job comes and gone when there is none (an idle queue holds one goroutine).
// Offer never blocks: when the queue is full the job is dropped and counted, so the primary
// request that offered it is never slowed. Run owns the workers; they stop when its context
// ends, and jobs still queued then are dropped (handed to the OnDrop function, if any).
type Queue[J any] struct {
	jobs    chan J
	workers int
	do      func(context.Context, J)
	onDrop  func(J)

	offered, dropped, started, finished, running atomic.Int64

	mu     sync.Mutex
	closed bool
}

// NewQueue returns a queue of up to maxQueue waiting jobs served by up to workers workers at
// once, each running do. maxQueue 0 means a job is taken only when a worker is free.
func NewQueue[J any](maxQueue, workers int, do func(context.Context, J)) *Queue[J] {
	return &Queue[J]{jobs: make(chan J, max(0, maxQueue)), workers: max(1, workers), do: do}
}

// OnDrop sets what is done with a job accepted by Offer but dropped when the queue stops
// (so its owner can release what it holds). Call it before Run.
func (q *Queue[J]) OnDrop(f func(J)) { q.onDrop = f }

// Offer queues j, or drops it (false) when the queue is full or stopped.
func (q *Queue[J]) Offer(j J) bool {
	q.offered.Add(1)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		select {
		case q.jobs <- j:
			return true
		default:
		}
	}
	q.dropped.Add(1)
	return false
}

// Run serves the queue until ctx ends, then waits for the workers to return; jobs left in
// the queue are dropped. Run may be called once.
func (q *Queue[J]) Run(ctx context.Context) {
	slots := make(chan struct{}, q.workers)
	var wg sync.WaitGroup
serve:
	for {
		// A job is taken off the queue only when a worker may start on it, so the queue
		// holds what waits, and no more than maxQueue of it.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break serve
		}
		select {
		case j := <-q.jobs:
			q.started.Add(1)
			q.running.Add(1)
			wg.Go(func() {
				defer func() {
					q.running.Add(-1)
					q.finished.Add(1)
					<-slots
				}()
				q.do(ctx, j)
			})
		case <-ctx.Done():
			break serve
		}
	}
	wg.Wait()
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	for {
		select {
		case j := <-q.jobs:
			q.dropped.Add(1)
			if q.onDrop != nil {
				q.onDrop(j)
			}
		default:
			return
		}
	}
}

// Counts returns the queue's counters.
func (q *Queue[J]) Counts() MirrorCounts {
	return MirrorCounts{
		Offered: q.offered.Load(), Dropped: q.dropped.Load(), Started: q.started.Load(),
		Finished: q.finished.Load(), Queued: int64(len(q.jobs)), Running: q.running.Load(),
	}
}
