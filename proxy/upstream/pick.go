package upstream

import (
	"hash/fnv"
	"math"
	"strings"
)

// Load is a model server's load as its metrics report it (vLLM v1 names).
type Load struct {
	Waiting      float64 // vllm:num_requests_waiting: requests queued, not yet running
	Running      float64 // vllm:num_requests_running (reported; not scored: in-flight covers it)
	KVCacheUsage float64 // vllm:kv_cache_usage_perc, 0..1
	// Flags are states of the server its metrics betray (package gpu's checks): a flagged
	// endpoint keeps only Picking.FlaggedWeight of its weight, and with
	// Outlier.EjectFlagged it is ejected.
	Flags Flags
}

// Flags is a set of model-server states found from the server's metrics.
type Flags uint8

// The flags (the same as package gpu's).
const (
	FlagKVLeak Flags = 1 << iota // the KV cache stayed in use with nothing running or waiting
	FlagStall                    // the queue grew while throughput fell

	allFlags = FlagKVLeak | FlagStall
)

var flagNames = [...]string{"kv_leak", "stall"}

// Names returns the names of f's flags ("kv_leak", "stall").
func (f Flags) Names() []string {
	var out []string
	for i, n := range flagNames {
		if f&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// String is Names joined by commas.
func (f Flags) String() string { return strings.Join(f.Names(), ",") }

// LoadSource gives the current load of an endpoint. Get is called with the endpoint's URL as
// configured (Endpoint.String, EndpointSpec.URL) and must report ok=false when it has no
// fresh signal for it (never scraped, scrape failing, or older than its staleness limit):
// picking then scores that endpoint without one (see the package doc). Get is called from
// many goroutines at once, at most once per endpoint per Picking.LoadCache (default 10 ms)
// per cluster: it must be safe for concurrent use and must not block.
type LoadSource interface {
	Get(endpointURL string) (Load, bool)
}

// Hint is what the request tells the picker beyond its cluster.
type Hint struct {
	// PrefixHash is a hash of the start of the prompt (openai.Request.PrefixHash); 0 means
	// none. Requests with equal hashes go to the same endpoint while it is not overloaded.
	PrefixHash uint64
	// PrefixLen is how many bytes of prompt PrefixHash covers; 0 means unknown (taken as
	// long enough). Below Picking.AffinityMinPrefix the hash is ignored.
	PrefixLen int
	// Home, when set, is the endpoint (as configured, Endpoint.String) that holds state the
	// request refers to (a stored Responses answer): it is picked whenever it is available.
	Home string
}

// PickStats counts picks by the reason the endpoint was chosen. Every pick counts once.
type PickStats struct {
	LeastInFlight     int64 `json:"least_inflight"`     // least_inflight strategy, no affinity
	LoadAware         int64 `json:"load_aware"`         // load_aware, scored with fresh signals (some endpoints may have been stale), no affinity
	NoSignals         int64 `json:"no_signals"`         // load_aware, but no endpoint had fresh signals: in-flight only
	AffinityKept      int64 `json:"affinity_kept"`      // the prefix's affinity endpoint, not overloaded
	AffinityAbandoned int64 `json:"affinity_abandoned"` // the affinity endpoint was overloaded: the best-scoring one instead
	Panic             int64 `json:"panic"`              // panic mode: every endpoint ejected (see the package doc)
	Home              int64 `json:"home"`               // the endpoint holding the request's state (Hint.Home)
}

// Add adds o to s.
func (s *PickStats) Add(o PickStats) {
	s.LeastInFlight += o.LeastInFlight
	s.LoadAware += o.LoadAware
	s.NoSignals += o.NoSignals
	s.AffinityKept += o.AffinityKept
	s.AffinityAbandoned += o.AffinityAbandoned
	s.Panic += o.Panic
	s.Home += o.Home
}

type pickReason uint8

const (
	pickLeastInFlight pickReason = iota
	pickLoadAware
	pickNoSignals
	pickAffinityKept
	pickAffinityAbandoned
	pickPanic
	pickHome
	numPickReasons
)

func (s *endpointState) pickStats() PickStats {
	return PickStats{
		LeastInFlight:     s.picks[pickLeastInFlight].Load(),
		LoadAware:         s.picks[pickLoadAware].Load(),
		NoSignals:         s.picks[pickNoSignals].Load(),
		AffinityKept:      s.picks[pickAffinityKept].Load(),
		AffinityAbandoned: s.picks[pickAffinityAbandoned].Load(),
		Panic:             s.picks[pickPanic].Load(),
		Home:              s.picks[pickHome].Load(),
	}
}

// picked counts a pick of e for reason r and returns e.
func (e *Endpoint) picked(r pickReason) *Endpoint {
	e.st.picks[r].Add(1)
	return e
}

// PickStats returns the picks of the cluster's endpoints by reason, summed. The counts live
// with the endpoint state, so they survive reloads (Inherit) with it; an endpoint removed
// by a reload takes its counts with it.
func (c *Cluster) PickStats() PickStats {
	var s PickStats
	for _, e := range c.endpoints {
		s.Add(e.st.pickStats())
	}
	return s
}

// picker is Options.Picking resolved for the hot path.
type picker struct {
	load       LoadSource // nil unless the strategy is load_aware
	src        LoadSource // Options.Load when picks read it (for signals or flags); else nil
	flagW      float64    // Picking.FlaggedWeight
	flagWFixed int64      // FlaggedWeight in 1/weightScale units, for least in-flight
	ejectFlags bool       // Outlier.EjectFlagged with a source
	wInFlight  float64
	wWaiting   float64
	wKV        float64
	affMaxLoad float64
	affMinLen  int
	affinity   bool
	uniform    bool  // every endpoint has the same weight: rendezvous without logarithms
	loadCache  int64 // nanoseconds a signal from load is reused; 0: ask on every pick
}

func newPicker(o Options) picker {
	pk := o.Picking
	p := picker{
		wInFlight:  pk.InFlightWeight,
		wWaiting:   pk.WaitingWeight,
		wKV:        pk.KVWeight,
		affMaxLoad: pk.AffinityMaxLoad,
		affMinLen:  pk.AffinityMinPrefix,
		affinity:   !pk.DisableAffinity,
		loadCache:  max(int64(pk.LoadCache), 0),
	}
	if pk.Strategy == StrategyLoadAware {
		p.load = o.Load
	}
	p.flagW = pk.FlaggedWeight
	p.flagWFixed = max(int64(math.Round(pk.FlaggedWeight*weightScale)), 1)
	if o.Load != nil && (p.load != nil || pk.FlaggedWeight < 1 || o.Outlier.EjectFlagged) {
		p.src = o.Load
		p.ejectFlags = o.Outlier.EjectFlagged
	}
	return p
}

// weightScale is the unit of weights in least in-flight comparisons: a flagged endpoint's
// weight is FlaggedWeight × weight, kept an integer.
const weightScale = 1024

// hrwKey derives an endpoint's rendezvous key from its URL key (FNV-1a, then mixed).
func hrwKey(key string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return mix64(h.Sum64())
}

// mix64 is murmur3's 64-bit finaliser: a bijection that spreads every input bit.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// PickFor returns an endpoint for a request: the best available endpoint by the cluster's
// strategy or, when h carries a prefix hash, the prefix's affinity endpoint unless it is
// overloaded. exclude (may be nil; matched by URL state, so an endpoint of the cluster this
// one replaced also counts) is skipped when any other endpoint is available; with affinity
// the next endpoint in the prefix's rendezvous order takes its place, so retries of one
// prefix agree too. See the package doc for the score, freshness, ties and panic mode.
// PickFor is O(len(endpoints)) and does not allocate; it asks Options.Load for an
// endpoint's signal at most once per Picking.LoadCache (shared by all picks), and does not
// count the request in flight: call Begin (or Acquire) on the result.
func (c *Cluster) PickFor(exclude *Endpoint, h Hint) (*Endpoint, error) {
	if h.Home != "" {
		now := c.clock.Now().UnixNano()
		for _, e := range c.endpoints {
			if e.raw == h.Home && e != exclude && c.usable(e.st, now) {
				return e.picked(pickHome), nil
			}
		}
	}
	p := &c.pk
	affinity := p.affinity && h.PrefixHash != 0 && (h.PrefixLen == 0 || h.PrefixLen >= p.affMinLen)
	if p.load == nil && !affinity {
		return c.pickLeastInFlight(exclude)
	}
	return c.pickScored(exclude, h.PrefixHash, affinity)
}

// pickScored scores every available endpoint (see the package doc) and applies affinity.
func (c *Cluster) pickScored(exclude *Endpoint, prefix uint64, affinity bool) (*Endpoint, error) {
	p := &c.pk
	now := c.clock.Now().UnixNano()
	var ex *endpointState
	if exclude != nil {
		ex = exclude.st
	}
	var (
		fresh, stale         *Endpoint // best with fresh signals (by score), best without (by in-flight term)
		freshScore, staleIF  float64
		freshTies, staleTies int
		nFresh               int
		sigSum               float64 // signal terms of the fresh endpoints
		exAvail              *Endpoint
		rnd                  uint64 // tie-breaking PRNG state, seeded on the first tie

		aff           *Endpoint // rendezvous winner
		affRank       uint64
		affRankF      float64
		affIF, affSig float64
		affFresh      bool
	)
	for _, e := range c.endpoints {
		if !c.usable(e.st, now) || (p.src != nil && !c.refreshLoad(e, now)) {
			continue
		}
		if e.st == ex {
			exAvail = e
			continue
		}
		// (in-flight+1)/weight: the load this request would join, so that among idle
		// endpoints the higher weight wins, as in least in-flight.
		inf := float64(max(e.st.inFlight.Load(), 0)+1) / float64(e.weight) * p.wInFlight
		if e.flags.Load() != 0 {
			inf /= p.flagW // a flagged endpoint keeps FlaggedWeight of its weight
		}
		sig, ok := 0.0, false
		if p.load != nil {
			sig, ok = c.signal(e)
		}
		if ok {
			nFresh++
			sigSum += sig
			switch s := inf + sig; {
			case fresh == nil || s < freshScore:
				fresh, freshScore, freshTies = e, s, 1
			case s == freshScore:
				if freshTies++; c.oneIn(&rnd, freshTies) {
					fresh = e
				}
			}
		} else {
			switch {
			case stale == nil || inf < staleIF:
				stale, staleIF, staleTies = e, inf, 1
			case inf == staleIF:
				if staleTies++; c.oneIn(&rnd, staleTies) {
					stale = e
				}
			}
		}
		if affinity {
			// Rendezvous (highest random weight) hashing: the prefix's endpoint is the one
			// ranking it highest, so adding or removing an endpoint moves only the prefixes
			// it wins or held.
			r, win := mix64(prefix^e.hrwKey), false
			if p.uniform {
				win = aff == nil || r > affRank
				affRank = max(affRank, r)
			} else {
				// Weighted rendezvous: rank w/-ln(u) with u uniform in (0,1) wins a share
				// of prefixes proportional to the weight w. As 1-u <= -ln(u), w/(1-u)
				// bounds the rank from above: the logarithm is taken only for endpoints
				// that might beat the leader (a handful of the n).
				w := float64(e.weight)
				v := (float64(r>>11) + 0.5) / (1 << 53) // 1-u
				if aff == nil || w/v > affRankF {
					rf := w / -math.Log1p(-v)
					win = aff == nil || rf > affRankF
					affRankF = max(affRankF, rf)
				}
			}
			if win {
				aff, affIF, affSig, affFresh = e, inf, sig, ok
			}
		}
	}

	// An endpoint without fresh signals is scored as if its queue and KV cache were those
	// of the average fresh endpoint: neither a magnet (taken as idle) nor shunned.
	mean := 0.0
	if nFresh > 0 {
		mean = sigSum / float64(nFresh)
	}
	var best *Endpoint
	var bestScore float64
	switch {
	case fresh == nil && stale == nil:
		if exAvail != nil { // the excluded endpoint is the only one available
			return exAvail.picked(c.plainReason(1)), nil
		}
		return c.panicPick(ex)
	case stale == nil:
		best, bestScore = fresh, freshScore
	case fresh == nil:
		best, bestScore = stale, staleIF+mean
	default:
		ss := staleIF + mean
		switch {
		case freshScore < ss:
			best, bestScore = fresh, freshScore
		case ss < freshScore:
			best, bestScore = stale, ss
		default: // a tie across the two groups: each tied endpoint equally likely
			best, bestScore = fresh, freshScore
			if c.rand(&rnd)%uint64(freshTies+staleTies) < uint64(staleTies) {
				best = stale
			}
		}
	}
	if aff != nil {
		as := affIF + mean
		if affFresh {
			as = affIF + affSig
		}
		if as <= bestScore+p.affMaxLoad {
			return aff.picked(pickAffinityKept), nil
		}
		return best.picked(pickAffinityAbandoned), nil
	}
	return best.picked(c.plainReason(nFresh)), nil
}

// noSignal marks the absence of a signal in Endpoint.sig (a NaN).
var noSignal = math.Float64bits(math.NaN())

// refreshLoad brings e's cached signal term and flags up to date, asking Options.Load at most
// once per LoadCache per endpoint (one caller wins the refresh; the others use the previous
// values meanwhile). A refresh that finds e flagged may eject it (Outlier.EjectFlagged): it
// reports whether e is still usable.
func (c *Cluster) refreshLoad(e *Endpoint, now int64) bool {
	if until := e.sigUntil.Load(); now >= until && e.sigUntil.CompareAndSwap(until, now+c.pk.loadCache) {
		bits, flags := noSignal, Flags(0)
		if l, ok := c.pk.src.Get(e.raw); ok {
			// NaN, negative or infinite values: not a signal.
			if s := l.Waiting*c.pk.wWaiting + l.KVCacheUsage*c.pk.wKV; s >= 0 && s <= math.MaxFloat64 &&
				l.Waiting >= 0 && l.KVCacheUsage >= 0 {
				bits = math.Float64bits(s)
			}
			flags = l.Flags & allFlags
		}
		e.sig.Store(bits)
		if e.flags.Swap(uint32(flags)) != 0 && flags == 0 {
			e.ejectSkipped.Store(false)
		}
		if flags != 0 && c.pk.ejectFlags {
			c.ejectFlagged(e, flags, now)
			return c.usable(e.st, now)
		}
	}
	return true
}

// signal returns e's cached signal term, waiting×WaitingWeight + kv×KVWeight, and whether
// e has a fresh signal (see refreshLoad).
func (c *Cluster) signal(e *Endpoint) (float64, bool) {
	v := math.Float64frombits(e.sig.Load())
	return v, v == v
}

// plainReason is the reason for a pick without affinity.
func (c *Cluster) plainReason(nFresh int) pickReason {
	switch {
	case c.pk.load == nil:
		return pickLeastInFlight
	case nFresh == 0:
		return pickNoSignals
	}
	return pickLoadAware
}

// rand steps a per-pick xorshift PRNG, seeded on first use from the cluster's counter.
func (c *Cluster) rand(s *uint64) uint64 {
	if *s == 0 {
		*s = mix64(c.rr.Add(1)) | 1
	}
	x := *s
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	*s = x
	return x
}

// oneIn reports true with probability 1/n (reservoir sampling among n ties).
func (c *Cluster) oneIn(s *uint64, n int) bool {
	return c.rand(s)%uint64(n) == 0
}
