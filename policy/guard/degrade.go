package guard

import (
	"sync"
	"time"
)

// Staged degradation of a route, on the env clock.
//
//	level 0  normal
//	level 1  the route's breakers opened more than trips_per_minute times in the last minute:
//	         max_tokens capped at level1_max_tokens, prompts failing a size signal
//	         (max_prompt_tokens, surge) rerouted to long_context_cluster when one is set, and the
//	         surge factor lowered to level1_surge_factor
//	level 2  more than saturation_inflight requests admitted by the guard are in flight:
//	         level 1's measures, and tenants with a priority below shed_below_priority are
//	         rejected (503 load_shed)
//
// A level is entered as soon as its condition holds (level 2 directly from 0 if saturated).
// It is left one step at a time: a step down happens once the condition of the current level
// has been false for cool_down, counted from the first evaluation that saw it false (with
// traffic, every request evaluates; without, the level stays up longer, never shorter), and
// the next step down needs another cool_down (hysteresis).
// The level is evaluated lazily, on each Admit, settle and Level call: no goroutine.
//
// Trips are counted by the breakers' OnStateChange in an atomic counter; the evaluation moves
// the new trips into a one-minute sliding window of tripBuckets buckets, so a trip counts from
// the first evaluation that sees it.

const tripBuckets = 6

type degrader struct {
	mu          sync.Mutex
	level       int
	belowSince  time.Time // when an evaluation first saw the current level's condition false
	falling     bool      // belowSince is set
	seenTrips   uint64
	tripEpochs  [tripBuckets]int64
	tripCounts  [tripBuckets]uint64
	tripsPerMin int
	saturation  int
	coolDown    time.Duration
}

const tripPeriod = time.Minute / tripBuckets

// eval updates and returns the level at now, given the trip counter and the in-flight count.
func (d *degrader) eval(now time.Time, trips uint64, inflight int64) int {
	if d.tripsPerMin == 0 && d.saturation == 0 {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ep := now.UnixNano() / int64(tripPeriod)
	i := ep % tripBuckets
	if d.tripEpochs[i] != ep {
		d.tripEpochs[i], d.tripCounts[i] = ep, 0
	}
	if trips > d.seenTrips {
		d.tripCounts[i] += trips - d.seenTrips
		d.seenTrips = trips
	}
	var recent uint64
	for j := range tripBuckets {
		if d.tripEpochs[j] > ep-tripBuckets {
			recent += d.tripCounts[j]
		}
	}
	target := 0
	if d.tripsPerMin > 0 && recent > uint64(d.tripsPerMin) {
		target = 1
	}
	if d.saturation > 0 && inflight > int64(d.saturation) {
		target = 2
	}
	switch {
	case target >= d.level:
		d.level = target
		d.falling = false
	case !d.falling:
		d.falling, d.belowSince = true, now
	case now.Sub(d.belowSince) >= d.coolDown:
		d.level--
		d.belowSince = now // the next step down needs another cool_down
	}
	return d.level
}
