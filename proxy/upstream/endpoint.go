package upstream

import (
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint is one upstream server of a cluster. Its identity (URL, weight) is fixed; its
// state (in-flight count, health, ejection, counters) may be shared with the endpoint of the
// same URL in the cluster it replaced (see Cluster.Inherit). All methods are safe for
// concurrent use.
type Endpoint struct {
	cluster    *Cluster
	url        *url.URL
	key        string
	raw        string
	metricsURL string
	healthURLs []string // tried in order until one exists (see HealthCheck.Path)
	weight     int64
	hrwKey     uint64 // rendezvous-hash key, from the URL key: the same on every replica and reload
	st         *endpointState

	// The signal term last read from Options.Load (float64 bits; noSignal: none) and until
	// when (unix ns by the cluster's Clock) it may be used without asking again. Per
	// cluster, not shared across reloads: a new cluster may have another source or weights.
	sig      atomic.Uint64
	sigUntil atomic.Int64
	// The flags last read with sig (Flags bits), and whether a skipped ejection of this
	// flagging was logged.
	flags        atomic.Uint32
	ejectSkipped atomic.Bool
}

// endpointState is what survives a reload. Hot fields are atomic; the rest is guarded by mu.
type endpointState struct {
	inFlight     atomic.Int64
	healthy      atomic.Bool
	passed       atomic.Bool  // an active check has succeeded at least once
	ejectedUntil atomic.Int64 // unix nanoseconds by the cluster's Clock; 0 = never ejected
	consecutive  atomic.Int64 // consecutive passive failures
	requests     atomic.Int64 // requests begun
	failures     atomic.Int64 // requests reported as failed
	picks        [numPickReasons]atomic.Int64

	mu           sync.Mutex
	multiplier   int64 // ejection multiplier (Envoy's eject_time_backoff)
	timesEjected int64 // total ejections, never decreases
	ejectReason  Flags // of the last ejection: the flags, or 0 for consecutive failures
	hcFailures   int   // consecutive active-check failures
	hcSuccesses  int   // consecutive active-check successes
	lastCheck    time.Time
	lastCheckErr string
	healthIdx    atomic.Int32 // the index into healthURLs of the path that exists

	models   atomic.Pointer[[]Model] // what GET /v1/models last answered; nil: never fetched
	modelsAt atomic.Int64            // when it was last asked (unix ns by the cluster's Clock); 0: never
	// modelsFetch, guarded by mu, is closed when the fetch in flight ends (nil: none).
	modelsFetch chan struct{}
}

func newEndpointState() *endpointState {
	s := &endpointState{}
	s.healthy.Store(true) // optimistic: healthy until proven otherwise
	return s
}

// URL returns the endpoint's base URL. The caller must not modify it.
func (e *Endpoint) URL() *url.URL { return e.url }

// String returns the endpoint's URL as configured.
func (e *Endpoint) String() string { return e.raw }

// MetricsURL returns the configured model-server metrics URL, or "".
func (e *Endpoint) MetricsURL() string { return e.metricsURL }

// Weight returns the endpoint's weight (1..MaxWeight).
func (e *Endpoint) Weight() int { return int(e.weight) }

// InFlight returns the number of requests begun and not yet ended on this endpoint,
// including those begun through the cluster this one replaced.
func (e *Endpoint) InFlight() int64 { return e.st.inFlight.Load() }

// Begin counts a request in flight on the endpoint. Every Begin must be matched by exactly
// one End. Begin and End do not allocate; prefer them on the hot path.
func (e *Endpoint) Begin() {
	e.st.inFlight.Add(1)
	e.st.requests.Add(1)
}

// End ends a request counted by Begin.
func (e *Endpoint) End() { e.st.inFlight.Add(-1) }

// Acquire is Begin returning its End: release may be called any number of times and ends
// the request once. It allocates one small closure per call; Begin/End do not.
func (e *Endpoint) Acquire() (release func()) {
	e.Begin()
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			e.End()
		}
	}
}

// Healthy reports the endpoint's active health-check status (true when checks are off).
func (e *Endpoint) Healthy() bool {
	return !e.cluster.hcEnabled || e.st.healthy.Load()
}

// Ready reports whether the endpoint has been seen healthy: with active checks, healthy and
// having passed a check at least once (the optimistic start, before any check, is not ready:
// a model server still loading its weights); without checks, always.
func (e *Endpoint) Ready() bool {
	return !e.cluster.hcEnabled || (e.st.healthy.Load() && e.st.passed.Load())
}

// Available reports whether Pick would consider the endpoint outside panic mode: healthy by
// active checks (or checks off) and not ejected at now (or ejection off).
func (e *Endpoint) Available(now time.Time) bool {
	return e.cluster.usable(e.st, now.UnixNano())
}

// Report records the outcome of one request for passive outlier detection. ok=false is a
// failure: a connect error, a 5xx, or a response cut mid-stream. Client cancellations must
// not be reported. A success resets the consecutive-failure count; Outlier.ConsecutiveFailures
// failures in a row eject the endpoint (see the package doc for duration and limits).
func (e *Endpoint) Report(ok bool) {
	s := e.st
	if ok {
		if s.consecutive.Load() != 0 {
			s.consecutive.Store(0)
		}
		return
	}
	s.failures.Add(1)
	c := e.cluster
	if !c.odEnabled {
		s.consecutive.Add(1)
		return
	}
	if c.clock.Now().UnixNano() < s.ejectedUntil.Load() {
		// A request begun before the ejection failed: it says nothing new, and counting it
		// would leave the endpoint close to re-ejection when it returns (Envoy resets the
		// count on return for the same reason).
		return
	}
	if s.consecutive.Add(1) >= int64(c.opts.Outlier.ConsecutiveFailures) {
		c.maybeEject(e)
	}
}

// EndpointStatus is a point-in-time view of one endpoint for the admin API.
// Counters survive reloads with the rest of the endpoint state.
type EndpointStatus struct {
	URL          string    `json:"url"`
	MetricsURL   string    `json:"metrics_url,omitempty"`
	Weight       int       `json:"weight"`
	Healthy      bool      `json:"healthy"`                // by active checks; true when checks are off
	Ejected      bool      `json:"ejected"`                // by outlier detection (failures, or a flag), now
	EjectedUntil time.Time `json:"ejected_until,omitzero"` // zero unless Ejected
	// EjectionReason says why, while Ejected: "consecutive_failures", or the flags
	// ("kv_leak", "stall") with Outlier.EjectFlagged.
	EjectionReason string `json:"ejection_reason,omitempty"`
	// Flags are the states the endpoint's load carries now (a fresh signal from
	// Options.Load; package gpu's checks), and EffectiveWeight the weight picking gives it:
	// Weight, or Weight × Picking.FlaggedWeight while flagged.
	Flags               []string  `json:"flags,omitempty"`
	EffectiveWeight     float64   `json:"effective_weight"`
	TimesEjected        int64     `json:"times_ejected"`        // total, never decreases
	EjectionMultiplier  int64     `json:"ejection_multiplier"`  // next ejection lasts BaseEjection × (this+1), before decay and cap
	InFlight            int64     `json:"in_flight"`            // begun and not ended
	ConsecutiveFailures int64     `json:"consecutive_failures"` // passive, since the last success or ejection
	Requests            int64     `json:"requests"`             // begun (Begin or Acquire)
	Failures            int64     `json:"failures"`             // reported with Report(false)
	LastHealthCheck     time.Time `json:"last_health_check,omitzero"`
	LastHealthError     string    `json:"last_health_error,omitempty"` // of the last check; empty after a success
	Picks               PickStats `json:"picks"`                       // times Pick/PickFor chose this endpoint, by reason
}

func (e *Endpoint) status(now int64) EndpointStatus {
	s := e.st
	st := EndpointStatus{
		URL:                 e.raw,
		MetricsURL:          e.metricsURL,
		Weight:              int(e.weight),
		Healthy:             e.Healthy(),
		InFlight:            s.inFlight.Load(),
		ConsecutiveFailures: s.consecutive.Load(),
		Requests:            s.requests.Load(),
		Failures:            s.failures.Load(),
	}
	st.EffectiveWeight = float64(e.weight)
	if src := e.cluster.opts.Load; src != nil {
		if l, ok := src.Get(e.raw); ok && l.Flags&allFlags != 0 {
			st.Flags = (l.Flags & allFlags).Names()
			st.EffectiveWeight *= e.cluster.pk.flagW
		}
	}
	s.mu.Lock()
	if until := s.ejectedUntil.Load(); e.cluster.ejects && now < until {
		st.Ejected = true
		st.EjectedUntil = time.Unix(0, until)
		st.EjectionReason = "consecutive_failures"
		if s.ejectReason != 0 {
			st.EjectionReason = s.ejectReason.String()
		}
	}
	st.TimesEjected = s.timesEjected
	st.EjectionMultiplier = s.multiplier
	st.LastHealthCheck = s.lastCheck
	st.LastHealthError = s.lastCheckErr
	s.mu.Unlock()
	st.Picks = s.pickStats()
	return st
}
