package route

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Breakers are a route's per-cluster circuit breakers: one gobreaker TwoStepCircuitBreaker per
// cluster, with a rolling window (Window in Buckets buckets), a minimum volume (MinRequests
// counted in the window) and a failure ratio. Open, a breaker refuses attempts for OpenFor;
// then HalfOpenProbes attempts go through, and as many successes in a row close it, while one
// failure reopens it.
//
// Every allowed attempt must end in exactly one done call (or a half-open breaker may wait for
// a probe that never reports). Excluded attempts count for neither side (see Verdict).
//
// Time: gobreaker reads time.Now itself (it has no injectable clock), so windows and open
// periods are real time. OnStateChange runs under the breaker's lock: it only stores atomics.
type Breakers struct {
	cfg      Breaker // resolved
	settings gobreaker.Settings

	mu sync.RWMutex
	m  map[string]*clusterBreaker
}

type clusterBreaker struct {
	cluster  string
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	openedAt atomic.Int64 // UnixNano of the last opening; 0 if never
	trips    atomic.Uint64
}

// BreakerStatus is one cluster breaker's state, for the admin API.
type BreakerStatus struct {
	Cluster    string    `json:"cluster"`
	State      string    `json:"state"` // "closed", "half-open", "open", "disabled"
	Requests   uint32    `json:"requests"`
	Successes  uint32    `json:"successes"`
	Failures   uint32    `json:"failures"`
	Exclusions uint32    `json:"exclusions"`
	Trips      uint64    `json:"trips"`
	OpenedAt   time.Time `json:"opened_at,omitzero"`
}

var (
	errFailed   = errors.New("route: attempt failed")
	errExcluded = errors.New("route: excluded outcome")
)

// Done is how an attempt a breaker allowed is reported: End it once.
type Done func(error)

// End reports how the attempt ended (see Verdict): failed counts against the cluster, excluded
// counts neither way (a client's cancel, the client's own fault).
func (d Done) End(failed, excluded bool) {
	switch {
	case excluded:
		d(errExcluded)
	case failed:
		d(errFailed)
	default:
		d(nil)
	}
}

// noopDone is the done of a disabled breaker.
var noopDone = Done(func(error) {})

// NewBreakers returns breakers configured by cfg (zero fields take their defaults) for the
// given clusters; a cluster not given gets its breaker on first use.
func NewBreakers(cfg Breaker, clusters ...string) *Breakers {
	cfg = cfg.withDefaults()
	minReq := uint32(cfg.MinRequests)
	ratio := cfg.FailureRatio
	b := &Breakers{
		cfg: cfg,
		m:   make(map[string]*clusterBreaker, len(clusters)),
		settings: gobreaker.Settings{
			MaxRequests:  uint32(cfg.HalfOpenProbes),
			Interval:     cfg.Window.D(),
			BucketPeriod: cfg.Window.D() / time.Duration(cfg.Buckets),
			Timeout:      cfg.OpenFor.D(),
			ReadyToTrip: func(c gobreaker.Counts) bool {
				n := c.TotalSuccesses + c.TotalFailures
				return n > 0 && n >= minReq && float64(c.TotalFailures) >= ratio*float64(n)
			},
			IsSuccessful: func(err error) bool { return err == nil },
			IsExcluded:   func(err error) bool { return err == errExcluded },
		},
	}
	if !cfg.Disabled {
		for _, c := range clusters {
			if b.m[c] == nil {
				b.m[c] = b.newBreaker(c)
			}
		}
	}
	return b
}

func (b *Breakers) newBreaker(cluster string) *clusterBreaker {
	cb := &clusterBreaker{cluster: cluster}
	st := b.settings
	st.Name = cluster
	st.OnStateChange = func(_ string, _, to gobreaker.State) {
		if to == gobreaker.StateOpen {
			cb.openedAt.Store(time.Now().UnixNano())
			cb.trips.Add(1)
		}
	}
	cb.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](st)
	return cb
}

func (b *Breakers) get(cluster string) *clusterBreaker {
	b.mu.RLock()
	cb := b.m[cluster]
	b.mu.RUnlock()
	if cb != nil {
		return cb
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if cb = b.m[cluster]; cb == nil {
		cb = b.newBreaker(cluster)
		b.m[cluster] = cb
	}
	return cb
}

// Allow asks the cluster's breaker for one attempt. ok=false: the breaker is open (or
// half-open with its probes taken): skip the cluster with policy.CondBreakerOpen. Otherwise
// done must be ended once with how the attempt ended (Done.End). It is the breaker's own
// function: no closure of this package's is made an attempt.
func (b *Breakers) Allow(cluster string) (done Done, ok bool) {
	if b == nil || b.cfg.Disabled {
		return noopDone, true
	}
	d, err := b.get(cluster).cb.Allow()
	if err != nil {
		return nil, false
	}
	return d, true
}

// State returns the cluster breaker's state: "closed", "half-open", "open" or "disabled".
func (b *Breakers) State(cluster string) string {
	if b == nil || b.cfg.Disabled {
		return "disabled"
	}
	return b.get(cluster).cb.State().String()
}

// RetryAfter is how long until the cluster's open breaker lets probes through (0 when it is
// not open).
func (b *Breakers) RetryAfter(cluster string) time.Duration {
	if b == nil || b.cfg.Disabled {
		return 0
	}
	cb := b.get(cluster)
	if cb.cb.State() != gobreaker.StateOpen {
		return 0
	}
	at := cb.openedAt.Load()
	return max(time.Duration(at)+b.cfg.OpenFor.D()-time.Duration(time.Now().UnixNano()), time.Millisecond)
}

// Snapshot lists the breakers by cluster name.
func (b *Breakers) Snapshot() []BreakerStatus {
	if b == nil {
		return nil
	}
	b.mu.RLock()
	list := make([]*clusterBreaker, 0, len(b.m))
	for _, cb := range b.m {
		list = append(list, cb)
	}
	b.mu.RUnlock()
	sort.Slice(list, func(i, j int) bool { return list[i].cluster < list[j].cluster })
	out := make([]BreakerStatus, 0, len(list))
	for _, cb := range list {
		c := cb.cb.Counts()
		s := BreakerStatus{
			Cluster: cb.cluster, State: cb.cb.State().String(),
			Requests: c.Requests, Successes: c.TotalSuccesses, Failures: c.TotalFailures,
			Exclusions: c.TotalExclusions, Trips: cb.trips.Load(),
		}
		if at := cb.openedAt.Load(); at != 0 {
			s.OpenedAt = time.Unix(0, at)
		}
		out = append(out, s)
	}
	return out
}

// inherit takes over old's breakers of the clusters b has, when both are configured alike
// (a gobreaker cannot be reconfigured: a changed breaker config starts afresh).
func (b *Breakers) inherit(old *Breakers) {
	if old == nil || old == b || old.cfg != b.cfg || b.cfg.Disabled {
		return
	}
	old.mu.RLock()
	defer old.mu.RUnlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	for c := range b.m {
		if ob := old.m[c]; ob != nil {
			b.m[c] = ob
		}
	}
}
