package proxy

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/proxy/heapfloor"
)

// After a burst (thousands of streams held, then gone) the Go runtime keeps the freed heap and
// goroutine stacks mapped and returns them to the OS only gradually, so the gateway's RSS
// stays near its peak for minutes. Worse, what the burst left is garbage the collector has not
// yet seen: an idle gateway allocates too little to start its next collection, so the heap "in
// use" stays at the burst's size until the runtime's forced collection, two minutes later.
//
// The memory loop samples the runtime every memoryCheckEvery (runtime/metrics: no stop of the
// world) and returns the memory at once when either
//
//   - most of what the process holds is free: the free memory not yet returned is both large
//     (≥ memoryReleaseMin) and more than the heap in use; or
//   - a burst ended: the goroutines fell to at most a quarter of their peak since the last
//     release, by at least burstGoroutines (each held stream is two), while the process holds
//     at least memoryReleaseMin;
//   - a load ended: at least loadAllocMin was allocated since the last release, the last
//     quietSamples samples each allocated under quietAlloc (an idle gateway's health checks
//     and scrapes), and the process holds at least loadReleaseMin: a load of small requests
//     leaves no goroutines behind, but up to the heap floor of garbage and the free memory
//     of its peak, which an idle gateway would keep until the forced collection;
//
// the first two at most once per memoryReleaseGap, the third at most once per loadReleaseGap
// (the allocation it asks for since the last release spaces them already, and a load that
// ends soon after one, the last of a few with pauses between them, is not left holding its
// memory for half a minute). A release after a load does not hold back the other two: the
// thousands of idle streams whose quiet looks like a load's end still get theirs when they
// go. Returning is two collections (the first empties the sync.Pools into their victim
// caches, the second frees those) and debug.FreeOSMemory's release of everything free. Under
// a steady load none holds and nothing happens.

const (
	memoryCheckEvery = time.Second
	memoryReleaseMin = 64 << 20
	memoryReleaseGap = 30 * time.Second
	burstGoroutines  = 1000
	loadAllocMin     = 16 << 20
	quietAlloc       = 256 << 10 // a second of an idle gateway; 40 small requests a second allocate more
	quietSamples     = 3
	loadReleaseMin   = 16 << 20
	loadReleaseGap   = 5 * time.Second
)

// busyFloor holds the collector's heap floor (heapfloor) while the gateway is busy. The
// floor spares a loaded gateway collections (a few KiB of garbage a request); an idle one it
// only lets keep up to the floor in garbage, which its health checks and scrapes fill on
// pages that were returned to the OS, so that its resident memory creeps up by the floor
// over the minutes after a load. The memory loop drops the floor once it sees the gateway
// quiet (the samples that make a load's end, quietSamples under quietAlloc) and holds it
// again at the first sample that is not, or sooner when requests come at a load's rate
// (request).
type busyFloor struct {
	bytes uint64

	dropped atomic.Bool  // the floor is let go: request watches the rate of requests
	seen    atomic.Int64 // requests since it was let go
	mark    atomic.Int64 // when the last floorRearm of them ended (since floorEpoch)

	mu      sync.Mutex
	release func() // heapfloor.Hold's, nil while dropped
	closed  bool
}

// floorRearm requests within floorRearmWithin (640 a second or more) while the floor is let
// go hold it again at once.
const (
	floorRearm       = 32
	floorRearmWithin = 50 * time.Millisecond
)

// floorEpoch is the origin of busyFloor.mark (a monotonic clock reading).
var floorEpoch = time.Now()

// request counts a request. While the floor is let go, floorRearm requests in a row within
// floorRearmWithin hold it again at once rather than at the memory loop's next sample (up to
// a second away): a load that comes after a quiet time would start on the runtime's own
// 4 MiB heap goal, collecting every few milliseconds with every request assisting the
// collector while its connections and pools are made again, and a backlog grown then feeds
// itself. One atomic load a request while the floor is held.
func (f *busyFloor) request() {
	if !f.dropped.Load() || f.seen.Add(1)%floorRearm != 0 {
		return
	}
	now := int64(time.Since(floorEpoch))
	if prev := f.mark.Swap(now); now-prev < int64(floorRearmWithin) {
		f.hold()
	}
}

// hold holds the floor unless it is held or closed.
func (f *busyFloor) hold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.release == nil && !f.closed {
		f.release = heapfloor.Hold(f.bytes)
		f.dropped.Store(false)
	}
}

// drop lets the floor go until the next hold.
func (f *busyFloor) drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropLocked()
}

func (f *busyFloor) dropLocked() {
	if f.release != nil {
		f.release()
		f.release = nil
		f.seen.Store(0)
		f.mark.Store(int64(time.Since(floorEpoch)))
		f.dropped.Store(!f.closed)
	}
}

// close drops the floor for good: the server stopped.
func (f *busyFloor) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.dropLocked()
}

// memSample is what the memory loop decides on.
type memSample struct {
	inUse      uint64 // heap spans and stacks in use (live objects and not yet collected garbage)
	retained   uint64 // free heap and stack memory not yet returned to the OS
	goroutines int
	allocs     uint64 // heap bytes allocated since the process started
}

// memMetrics are the runtime/metrics a memSample is read from, in memSample's order.
var memMetrics = []string{
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/stacks:bytes",
	"/memory/classes/heap/free:bytes",
	"/sched/goroutines:goroutines",
	"/gc/heap/allocs:bytes",
}

// memReader reads memSamples, reusing its sample slice.
type memReader []metrics.Sample

func newMemReader() memReader {
	s := make(memReader, len(memMetrics))
	for i, name := range memMetrics {
		s[i].Name = name
	}
	return s
}

func (r memReader) read() memSample {
	metrics.Read(r)
	v := func(i int) uint64 {
		if r[i].Value.Kind() != metrics.KindUint64 {
			return 0 // not supported by this runtime: reads as nothing
		}
		return r[i].Value.Uint64()
	}
	return memSample{inUse: v(0) + v(1) + v(2), retained: v(3), goroutines: int(v(4)), allocs: v(5)}
}

// idle reports whether the samples up to the last observed were quiet (quietSamples in a
// row under quietAlloc).
func (w *memoryWatch) idle() bool { return w.quiet >= quietSamples }

// memoryWatch decides, sample by sample, when to return memory.
type memoryWatch struct {
	last     time.Time // the previous release
	lastBig  time.Time // the previous release for memory mostly free or a burst's end
	peak     int       // goroutines, the most since the previous release for a burst's end
	started  bool      // a sample was taken
	released uint64    // allocs at the previous release (or the first sample)
	prev     uint64    // allocs at the previous sample
	quiet    int       // samples in a row that allocated under quietAlloc
}

// observe takes the sample m read at now and reports whether to return memory now; when it
// does, the watch starts over from m.
func (w *memoryWatch) observe(m memSample, now time.Time) bool {
	if !w.started {
		w.started, w.released, w.prev = true, m.allocs, m.allocs
	}
	if m.allocs-w.prev < quietAlloc {
		w.quiet++
	} else {
		w.quiet = 0
	}
	w.prev = m.allocs
	w.peak = max(w.peak, m.goroutines)
	if now.Sub(w.last) < loadReleaseGap {
		return false
	}
	big := now.Sub(w.lastBig) >= memoryReleaseGap
	mostlyFree := big && m.retained >= memoryReleaseMin && m.retained > m.inUse
	burstEnded := big && w.peak-m.goroutines >= burstGoroutines && m.goroutines <= w.peak/4 &&
		m.inUse+m.retained >= memoryReleaseMin
	loadEnded := m.allocs-w.released >= loadAllocMin && w.quiet >= quietSamples &&
		m.inUse+m.retained >= loadReleaseMin
	if !mostlyFree && !burstEnded && !loadEnded {
		return false
	}
	if mostlyFree || burstEnded {
		w.lastBig, w.peak = now, m.goroutines
	}
	w.last, w.released = now, m.allocs // quiet goes on: an idle gateway stays idle
	return true
}

// releaseMemory collects twice (the sync.Pools' victim caches go with the second) and returns
// everything free to the OS.
func releaseMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

// memoryLoop returns retained free memory to the OS after bursts until ctx ends.
func (s *Server) memoryLoop(ctx context.Context) {
	t := time.NewTicker(memoryCheckEvery)
	defer t.Stop()
	r := newMemReader()
	var w memoryWatch
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m := r.read()
			release := w.observe(m, now)
			if w.idle() {
				s.heapFloor.drop()
			} else {
				s.heapFloor.hold()
			}
			if !release {
				continue
			}
			releaseMemory()
			after := r.read()
			s.log.Debug("freed memory returned to the OS after a burst",
				"in_use_mib", m.inUse>>20, "retained_mib", m.retained>>20, "goroutines", m.goroutines,
				"in_use_after_mib", after.inUse>>20, "retained_after_mib", after.retained>>20)
		}
	}
}
