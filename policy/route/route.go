// Package route plans where a request is served: its split (gray flag, weight, sticky session),
// then the route's fallback chain; and it holds the route's retry budget and per-cluster
// breakers. It is a library for the handler's forward loop (proxy/attempt.go), not a
// `{type}` policy: routing is route config (Spec, embedded in config.Route).
//
// Split choice, in order:
//
//  1. gray flag: a request whose gray-flag header equals a split's gray_flag goes to that
//     split, always (also at weight 0);
//  2. sticky: the first non-empty sticky source (session header, body user, API key) is
//     hashed, and weighted rendezvous hashing (each split scores -ln(h(key, split)) / weight,
//     the lowest wins) picks among the splits with weight > 0: a session keeps its split, and
//     a weight change moves only the sessions it must, all towards the split that gained;
//  3. otherwise at random by weight.
//
// A route whose splits have no weight (only gray flags) serves unflagged requests on its own
// cluster. The plan is the chosen candidate, then the fallback steps in order, skipping a step
// whose cluster is already in the plan. A step's `on` lists the failures that move on to it;
// in the plan they are carried by the candidate before it (policy.Candidate.On means "move
// past me on").
//
// Plans are built once per split when the Router is built; Plan returns one of them and
// allocates nothing. SetWeights swaps the split table atomically.
package route

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Router is one route's planner (policy.Planner), retry policy, retry budget and breakers.
// It is immutable but for its split weights (SetWeights) and its budget and breakers' state.
type Router struct {
	spec           Spec
	primary        string // the route's own cluster ("" when only splits serve)
	primaryPlan    []policy.Candidate
	sticky         []stickySource
	flagHeader     string // canonical header name; "" when policy.Request.GrayFlag holds it
	retry          Retry  // resolved
	resumeOn       []string
	budgets        *Budgets
	breakers       *Breakers
	weightsMu      sync.Mutex // serialises SetWeights
	table          atomic.Pointer[table]
	clusterSummary []string
}

// table is the immutable split table; SetWeights replaces it whole.
type table struct {
	splits []split
	total  int // sum of weights
}

type split struct {
	Split        // Name resolved
	seed  uint64 // hash of the name: the split's identity in rendezvous hashing
	plan  []policy.Candidate
}

var _ policy.Planner = (*Router)(nil)

// New builds the Router of a route whose own cluster and model rewrite are primaryCluster and
// primaryModel ("" when the route has only splits). The spec is validated whole; a split
// without a model takes primaryModel. clock (nil: the system clock) drives the retry budget.
func New(spec Spec, primaryCluster, primaryModel string, clock policy.Clock) (*Router, error) {
	p := spec.Problems()
	weighted := false
	for _, sp := range spec.Splits {
		weighted = weighted || sp.Weight > 0
	}
	if primaryCluster == "" && !weighted {
		if len(spec.Splits) == 0 {
			p = append(p, "cluster: required when the route has no splits")
		} else {
			p = append(p, "splits: no split has a weight > 0 and the route names no cluster for unflagged requests")
		}
	}
	if len(p) > 0 {
		return nil, p
	}
	if clock == nil {
		clock = policy.SystemClock{}
	}
	rt := &Router{spec: spec, primary: primaryCluster, retry: spec.Retry.withDefaults()}
	if spec.Resume {
		rt.resumeOn = append(slices.Clip(slices.Clone(policy.DefaultOn)), policy.CondStreamCut)
	}

	sticky := spec.Sticky
	if len(sticky) == 0 {
		sticky = DefaultSticky
	}
	for _, s := range sticky {
		rt.sticky = append(rt.sticky, parseSticky(s))
	}
	if rt.sticky[0].kind == srcNone {
		rt.sticky = nil
	}
	if h := spec.GrayFlagHeader; h != "" && !strings.EqualFold(h, DefaultGrayFlagHeader) {
		rt.flagHeader = textproto.CanonicalMIMEHeaderKey(h)
	}

	if primaryCluster != "" {
		rt.primaryPlan = rt.buildPlan(policy.Candidate{Cluster: primaryCluster, Model: primaryModel})
	}
	t := &table{}
	for _, sp := range spec.Splits {
		sp.Name = sp.name()
		if sp.Model == "" {
			sp.Model = primaryModel
		}
		t.splits = append(t.splits, split{
			Split: sp,
			seed:  mix(hashString(sp.Name)),
			plan:  rt.buildPlan(policy.Candidate{Cluster: sp.Cluster, Model: sp.Model, Split: sp.Name}),
		})
		t.total += sp.Weight
	}
	rt.table.Store(t)

	clusters := spec.Clusters()
	if primaryCluster != "" && !slices.Contains(clusters, primaryCluster) {
		clusters = append([]string{primaryCluster}, clusters...)
	}
	rt.clusterSummary = clusters
	rt.budgets = NewBudgets(rt.retry.retryRule(), rt.retry.fallbackRule(), clusters, clock)
	rt.breakers = NewBreakers(spec.Breaker, clusters...)
	return rt, nil
}

// buildPlan returns first followed by the fallback steps whose clusters are not yet in the
// plan, each candidate carrying the conditions of the step after it.
func (rt *Router) buildPlan(first policy.Candidate) []policy.Candidate {
	plan := []policy.Candidate{first}
	var steps []*Step // the step of each plan entry (nil for first)
	steps = append(steps, nil)
	for i := range rt.spec.Fallback {
		st := &rt.spec.Fallback[i]
		if slices.ContainsFunc(plan, func(c policy.Candidate) bool { return c.Cluster == st.Cluster }) {
			continue
		}
		plan = append(plan, policy.Candidate{
			Cluster: st.Cluster, Model: st.Model,
			TTFT: st.Timeouts.TTFT.D(), Idle: st.Timeouts.Idle.D(), Total: st.Timeouts.Total.D(),
		})
		steps = append(steps, st)
	}
	for k := range plan {
		plan[k].On = rt.resumeOn // nil: policy.DefaultOn
		if k+1 < len(plan) && len(steps[k+1].On) > 0 {
			plan[k].On = slices.Clip(slices.Clone(steps[k+1].On))
		}
	}
	return slices.Clip(plan)
}

// Plan returns the request's candidates: the chosen split (or the route's cluster), then the
// fallback steps. The slice and its On lists are shared by every request on the same split:
// read them, never modify them (slices.Clone first).
func (rt *Router) Plan(_ context.Context, r *policy.Request) []policy.Candidate {
	t := rt.table.Load()
	if i := rt.choose(t, r); i >= 0 {
		return t.splits[i].plan
	}
	return rt.primaryPlan
}

// choose returns the index of the request's split, or -1 for the route's own cluster.
func (rt *Router) choose(t *table, r *policy.Request) int {
	if len(t.splits) == 0 {
		return -1
	}
	if flag := rt.grayFlag(r); flag != "" {
		for i := range t.splits {
			if t.splits[i].GrayFlag == flag {
				return i
			}
		}
	}
	if t.total <= 0 {
		return -1
	}
	if h, ok := rt.stickyHash(r); ok {
		best, bestScore := -1, math.Inf(-1)
		for i := range t.splits {
			s := &t.splits[i]
			if s.Weight <= 0 {
				continue
			}
			// Weighted rendezvous (exponential race): ln(u)/w is the negated arrival time of
			// an exponential clock of rate w; the earliest wins, so split i wins with
			// probability w_i / Σw, and raising one weight only takes sessions from others.
			score := math.Log(unit(mix(h^s.seed))) / float64(s.Weight)
			if score > bestScore {
				best, bestScore = i, score
			}
		}
		return best
	}
	n := rand.IntN(t.total)
	for i := range t.splits {
		if n -= t.splits[i].Weight; n < 0 && t.splits[i].Weight > 0 {
			return i
		}
	}
	return -1 // unreachable: n < total
}

func (rt *Router) grayFlag(r *policy.Request) string {
	if r == nil {
		return ""
	}
	if rt.flagHeader == "" {
		return r.GrayFlag
	}
	if v := r.Header[rt.flagHeader]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// SetWeights changes split weights at run time, by split name (the cluster unless the split
// has a name); splits not named keep theirs. Requests in flight keep the plan they got; the
// next Plan uses the new weights. Every problem is reported and nothing changes on error.
func (rt *Router) SetWeights(weights map[string]int) error {
	rt.weightsMu.Lock()
	defer rt.weightsMu.Unlock()
	old := rt.table.Load()
	t := &table{splits: slices.Clone(old.splits)}
	var p Problems
	for name, w := range weights {
		i := slices.IndexFunc(t.splits, func(s split) bool { return s.Name == name })
		switch {
		case i < 0:
			p = append(p, fmt.Sprintf("weights: unknown split %q", name))
		case w < 0:
			p = append(p, fmt.Sprintf("weights[%s]: %d is negative", name, w))
		default:
			t.splits[i].Weight = w
		}
	}
	for _, s := range t.splits {
		t.total += s.Weight
	}
	if len(p) == 0 && t.total == 0 && rt.primary == "" {
		p = append(p, "weights: every split would have weight 0 and the route names no cluster for unflagged requests")
	}
	if len(p) > 0 {
		slices.Sort(p)
		return p
	}
	rt.table.Store(t)
	return nil
}

// CandidateFor returns the route's candidate on cluster — the route's own, a split's, or a
// fallback step's, with its model rewrite and time-outs — whatever split a request would
// get; ok is false when the route never sends there.
func (rt *Router) CandidateFor(cluster string) (c policy.Candidate, ok bool) {
	find := func(plan []policy.Candidate) bool {
		for _, pc := range plan {
			if pc.Cluster == cluster {
				c, ok = pc, true
				return true
			}
		}
		return false
	}
	if find(rt.primaryPlan) {
		return c, ok
	}
	for _, sp := range rt.table.Load().splits {
		if find(sp.plan) {
			return c, ok
		}
	}
	return policy.Candidate{}, false
}

// Weights returns the current split weights by split name.
func (rt *Router) Weights() map[string]int {
	t := rt.table.Load()
	out := make(map[string]int, len(t.splits))
	for _, s := range t.splits {
		out[s.Name] = s.Weight
	}
	return out
}

// Inherit takes over old's retry and fallback budgets (with this Router's ratios and
// floors) and old's breakers of the clusters both have, when the breaker config is
// unchanged. A config reload calls it on the new Router before publishing it; split weights
// come from the new config.
func (rt *Router) Inherit(old *Router) {
	if old == nil || old == rt {
		return
	}
	old.budgets.configure(rt.retry.retryRule(), rt.retry.fallbackRule(), rt.clusterSummary)
	rt.budgets = old.budgets
	rt.breakers.inherit(old.breakers)
}

// Budgets are the route's retry and fallback budgets, per target cluster.
func (rt *Router) Budgets() *Budgets { return rt.budgets }

// Breakers are the route's per-cluster breakers.
func (rt *Router) Breakers() *Breakers { return rt.breakers }

// Attempts is the number of attempts per candidate, the first included (≥ 1).
func (rt *Router) Attempts() int { return rt.retry.Attempts }

// PerTryTimeout bounds one attempt (0: none beyond the route's time-outs).
func (rt *Router) PerTryTimeout() time.Duration { return rt.retry.PerTryTimeout.D() }

// Resume reports whether a stream cut mid-way resumes on the next candidate.
func (rt *Router) Resume() bool { return rt.spec.Resume }

// Spec returns the spec the Router was built from (weights as configured).
func (rt *Router) Spec() Spec { return rt.spec }

// Clusters lists the clusters the route may send to: its own, the splits', the fallbacks'.
func (rt *Router) Clusters() []string { return slices.Clone(rt.clusterSummary) }

// Condition is ConditionOf with the route's contract-mismatch list.
func (rt *Router) Condition(class policy.Class, status int, errCode string) string {
	return ConditionOf(class, status, errCode, rt.spec.ContractMismatch)
}

// Verdict is the package's Verdict with the route's contract-mismatch list.
func (rt *Router) Verdict(class policy.Class, status int, errCode string) (failed, excluded bool) {
	return Verdict(class, status, errCode, rt.spec.ContractMismatch)
}

// Backoff is the wait before retry number attempt (1: the first retry) on the same candidate:
// a full-jitter exponential, uniform in [base, min(max, base·2^attempt)]. An upstream's
// Retry-After (retryAfter > 0) is honoured when configured: the wait is at least retryAfter,
// and a Retry-After above max_retry_after is not waited for: ok=false, do not retry this
// candidate (move on).
func (rt *Router) Backoff(attempt int, retryAfter time.Duration) (d time.Duration, ok bool) {
	r := &rt.retry
	honor := *r.HonorRetryAfter && retryAfter > 0
	if honor && retryAfter > r.MaxRetryAfter.D() {
		return 0, false
	}
	base, ceil := r.BackoffBase.D(), r.BackoffBase.D()
	for i := 0; i < max(attempt, 1) && ceil < r.BackoffMax.D(); i++ {
		ceil *= 2
	}
	ceil = min(ceil, r.BackoffMax.D())
	d = base
	if ceil > base {
		d += rand.N(ceil - base + 1)
	}
	if honor {
		d = max(d, retryAfter)
	}
	return d, true
}

// Status is a Router's state, for the admin API.
type Status struct {
	Splits   []Split         `json:"splits"`
	Budget   BudgetStatus    `json:"budget"`
	Breakers []BreakerStatus `json:"breakers"`
}

// Snapshot returns the current splits (with their weights), budget and breakers.
func (rt *Router) Snapshot() Status {
	t := rt.table.Load()
	s := Status{Budget: rt.budgets.Status(), Breakers: rt.breakers.Snapshot()}
	for _, sp := range t.splits {
		s.Splits = append(s.Splits, sp.Split)
	}
	return s
}

// Sticky keys.

const (
	srcHeader = iota
	srcUser
	srcKey
	srcTenant
	srcClient
	srcNone
)

type stickySource struct {
	kind   int
	header string // canonical, for srcHeader
}

func parseSticky(s string) stickySource {
	switch s {
	case StickyBodyUser:
		return stickySource{kind: srcUser}
	case StickyKey:
		return stickySource{kind: srcKey}
	case StickyTenant:
		return stickySource{kind: srcTenant}
	case StickyClient:
		return stickySource{kind: srcClient}
	case StickyNone:
		return stickySource{kind: srcNone}
	}
	return stickySource{kind: srcHeader, header: textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(s, StickyHeaderPrefix))}
}

// stickyHash hashes the request's first non-empty sticky source.
func (rt *Router) stickyHash(r *policy.Request) (uint64, bool) {
	if r == nil {
		return 0, false
	}
	for _, s := range rt.sticky {
		var v string
		switch s.kind {
		case srcHeader:
			if vs := r.Header[s.header]; len(vs) > 0 {
				v = vs[0]
			}
		case srcUser:
			if r.Request != nil {
				v = r.User
			}
		case srcKey:
			if v = bearer(r.Header); v == "" {
				v = r.Tenant
			}
		case srcTenant:
			v = r.Tenant
		case srcClient:
			v = r.Client
		}
		if v != "" {
			return mix(hashString(v)), true
		}
	}
	return 0, false
}

// bearer returns the request's bearer key (read in place, never stored).
func bearer(h http.Header) string {
	vs := h["Authorization"]
	if len(vs) == 0 {
		return ""
	}
	v := vs[0]
	if len(v) > 7 && strings.EqualFold(v[:7], "Bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// hashString is 64-bit FNV-1a: stable across processes and releases, so every gateway
// replica puts a session on the same split.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is splitmix64's finaliser: it spreads FNV's weak low bits over all 64.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// unit maps x to (0, 1), never 0 (whose log is -Inf).
func unit(x uint64) float64 {
	return (float64(x>>11) + 0.5) / (1 << 53)
}
