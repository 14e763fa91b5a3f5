package guard

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Breakers: one gobreaker TwoStepCircuitBreaker per (route, tenant), created on first use.
//
// What they count: every request the guard checks (its Allow) ends in exactly one done call:
// an explosion (a signal rejected or rerouted the request) is a failure, and so is an
// admitted request whose answer fell into a loop (runaway_generation, cut or flagged); an
// admitted request that ends with a 2xx and no error class is a success; everything else is excluded
// (IsExcluded): client errors, cancellations, upstream failures (those are the cluster
// breakers' business, not the tenant's), and requests shed by degradation. A breaker trips when
// at least min_requests counted requests are in its rolling window and the share of
// explosions among them reaches failure_ratio.
//
// Time: gobreaker reads time.Now itself (it has no injectable clock), so the open period and
// the rolling window are in real time; the times the guard reports about breakers (opened at,
// retry after) are real time too. OnStateChange runs under the breaker's lock: it only stores
// atomics here and never calls the breaker.

var (
	// errExplosion is what an explosion reports to its breaker: a failure.
	errExplosion = errors.New("guard: prompt explosion")
	// errRunaway is what an admitted request whose answer fell into a loop reports: a
	// failure, as an explosion.
	errRunaway = errors.New("guard: runaway generation")
	// errExcluded is what a request that says nothing about explosions reports.
	errExcluded = errors.New("guard: excluded outcome")
)

type breakerKey struct{ route, tenant string }

type breaker struct {
	key      breakerKey
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	openedAt atomic.Int64 // time.Now().UnixNano() when it last opened; 0 if never
	trips    atomic.Uint64
	lastUsed atomic.Int64 // env clock, UnixNano
}

type breakerSet struct {
	mu       sync.RWMutex
	m        map[breakerKey]*breaker
	max      int
	settings gobreaker.Settings
	onTrip   func() // called (from OnStateChange) when any breaker opens; must not block
}

func newBreakerSet(bp BreakerParams, onTrip func()) *breakerSet {
	minReq := uint32(bp.MinRequests)
	ratio := bp.FailureRatio
	period := bp.BucketPeriod.D()
	if period <= 0 {
		period = bp.Window.D() / time.Duration(bp.Buckets)
	}
	return &breakerSet{
		m:   map[breakerKey]*breaker{},
		max: bp.MaxBreakers,
		settings: gobreaker.Settings{
			MaxRequests:  uint32(bp.HalfOpenProbes),
			Interval:     bp.Window.D(),
			BucketPeriod: period,
			Timeout:      bp.OpenFor.D(),
			ReadyToTrip: func(c gobreaker.Counts) bool {
				n := c.TotalSuccesses + c.TotalFailures
				return n >= minReq && n > 0 && float64(c.TotalFailures) >= ratio*float64(n)
			},
			IsSuccessful: func(err error) bool { return err == nil },
			IsExcluded:   func(err error) bool { return errors.Is(err, errExcluded) },
		},
		onTrip: onTrip,
	}
}

// get returns the breaker of (route, tenant), creating it (and evicting one when full).
func (s *breakerSet) get(route, tenant string, now time.Time) *breaker {
	k := breakerKey{route, tenant}
	s.mu.RLock()
	b := s.m[k]
	s.mu.RUnlock()
	if b == nil {
		s.mu.Lock()
		if b = s.m[k]; b == nil {
			if len(s.m) >= s.max {
				s.evictLocked()
			}
			b = s.newBreaker(k)
			s.m[k] = b
		}
		s.mu.Unlock()
	}
	b.lastUsed.Store(now.UnixNano())
	return b
}

func (s *breakerSet) newBreaker(k breakerKey) *breaker {
	b := &breaker{key: k}
	st := s.settings
	st.Name = k.route + "/" + k.tenant
	st.OnStateChange = func(_ string, _, to gobreaker.State) {
		if to == gobreaker.StateOpen {
			b.openedAt.Store(time.Now().UnixNano())
			b.trips.Add(1)
			if s.onTrip != nil {
				s.onTrip()
			}
		}
	}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](st)
	return b
}

// evictLocked drops the least recently used closed breaker, else the least recently used one.
// It is O(breakers) and runs only when the set is full.
func (s *breakerSet) evictLocked() {
	var victim, victimAny *breaker
	for _, b := range s.m {
		if victimAny == nil || b.lastUsed.Load() < victimAny.lastUsed.Load() {
			victimAny = b
		}
		if (victim == nil || b.lastUsed.Load() < victim.lastUsed.Load()) && b.cb.State() == gobreaker.StateClosed {
			victim = b
		}
	}
	if victim == nil {
		victim = victimAny
	}
	if victim != nil {
		delete(s.m, victim.key)
	}
}

// reset drops the breakers of tenant ("" : all); the next request builds a fresh, closed
// one. Requests in flight report to the dropped breaker, which nobody reads any more.
func (s *breakerSet) reset(tenant string, all bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range s.m {
		if all || k.tenant == tenant {
			delete(s.m, k)
			n++
		}
	}
	return n
}

func (s *breakerSet) list() []*breaker {
	s.mu.RLock()
	out := make([]*breaker, 0, len(s.m))
	for _, b := range s.m {
		out = append(out, b)
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].key.route != out[j].key.route {
			return out[i].key.route < out[j].key.route
		}
		return out[i].key.tenant < out[j].key.tenant
	})
	return out
}

// retryAfter is how long until the open breaker b lets probes through (at least 1ms, so
// that a Retry-After header is always sent).
func (b *breaker) retryAfter(openFor time.Duration) time.Duration {
	at := b.openedAt.Load()
	if at == 0 {
		return openFor
	}
	return max(time.Duration(at)+openFor-time.Duration(time.Now().UnixNano()), time.Millisecond)
}
