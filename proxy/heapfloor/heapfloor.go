// Package heapfloor keeps the Go collector's heap goal at or above a floor while the live
// heap is small.
//
// The runtime starts a collection when the heap has grown by GOGC percent (100) of what the
// previous one left live, and at least at 4 MiB. A gateway's live heap is small (2–3 MiB at
// rest and under a steady load of small requests: its buffers are pooled) while it allocates
// a few KiB a request, so at 2,000 req/s it collects five or six times a second, and each
// collection takes a quarter of a processor from the requests while it marks
// (docs/performance.md: the floor cut the CPU a request by 6–13% in two harness runs and
// the p99 at 2,000 req/s by 10% in a paired one). A larger
// GOGC alone would multiply a large live heap too (10,000 held streams are 500 MiB live).
//
// So while at least one owner holds a floor (Hold), after each collection the GOGC is set to
// put the next goal at the floor, or at twice the live heap when that is more: the collector
// runs as it would by default once the live heap is half the floor or more. The runtime's own
// 4 MiB minimum grows with GOGC (4 MiB × GOGC/100), so GOGC is at most 100 × floor / 4 MiB:
// 400 for the default 16 MiB. The memory a floor costs is at most the floor less 4 MiB, in
// garbage not yet collected.
//
// A runtime finalizer on a small object made anew after each collection runs the adjustment:
// no goroutine of its own, one call a collection. An operator who sets the GOGC environment
// variable has chosen: Hold does nothing.
package heapfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"sync"
)

// RuntimeMinimum is the runtime's own least heap goal at GOGC=100; a floor at or below it
// changes nothing.
const RuntimeMinimum = 4 << 20

// Percent is the GOGC that puts the collector's next goal at max(floor, 2 × live) for a live
// heap of live bytes (0: not yet known, taken as small), never below the runtime's 100.
func Percent(live, floor uint64) int {
	if floor <= RuntimeMinimum {
		return 100
	}
	most := floor * 100 / RuntimeMinimum // the runtime's minimum, 4 MiB × GOGC/100, at the floor
	switch {
	case live == 0:
		return int(most)
	case live >= floor/2:
		return 100 // twice the live heap is at or above the floor: the runtime's own goal
	}
	return int(min(most, floor*100/live-100))
}

var (
	mu      sync.Mutex
	floors  []uint64 // the holders' floors; the highest is kept
	gen     uint64   // the finalizer chain's generation: a chain of an older one stops
	before  int      // the GOGC before the first holder
	current int      // the GOGC last set
	live    = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
)

// Held is how many owners hold a floor (those whose Hold did something).
func Held() int {
	mu.Lock()
	defer mu.Unlock()
	return len(floors)
}

// Hold keeps the collector's heap goal at or above floor bytes until release is called
// (later calls of release do nothing). The highest floor held counts; the last release puts
// the GOGC back to what it was. Nothing happens when the GOGC environment variable is set or
// floor is at most RuntimeMinimum.
func Hold(floor uint64) (release func()) {
	if os.Getenv("GOGC") != "" || floor <= RuntimeMinimum {
		return func() {}
	}
	mu.Lock()
	floors = append(floors, floor)
	if len(floors) == 1 {
		gen++
		before = debug.SetGCPercent(100)
		current = 100
		arm(gen)
	}
	adjustLocked()
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			i := slices.Index(floors, floor)
			floors = slices.Delete(floors, i, i+1)
			if len(floors) == 0 {
				gen++ // the chain stops at its next collection
				debug.SetGCPercent(before)
				return
			}
			adjustLocked()
		})
	}
}

// sentinel is made anew after each collection; its finalizer runs after the next one. At 32
// bytes it is outside the tiny allocator, which would keep it alive with its neighbours.
type sentinel struct{ _ [32]byte }

func arm(g uint64) {
	runtime.SetFinalizer(new(sentinel), func(*sentinel) {
		mu.Lock()
		defer mu.Unlock()
		if g != gen {
			return
		}
		adjustLocked()
		arm(g)
	})
}

// adjustLocked sets the GOGC for the live heap the last collection left and the highest floor.
func adjustLocked() {
	metrics.Read(live)
	var l uint64
	if live[0].Value.Kind() == metrics.KindUint64 {
		l = live[0].Value.Uint64()
	}
	if p := Percent(l, slices.Max(floors)); p != current {
		debug.SetGCPercent(p) // no stop of the world: the pacer's goal is recomputed
		current = p
	}
}
