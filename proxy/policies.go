package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/batch"
	_ "github.com/sluicegw/sluice/policy/concurrency" // registers type concurrency
	_ "github.com/sluicegw/sluice/policy/confidence"  // registers type confidence
	_ "github.com/sluicegw/sluice/policy/guard"       // registers type guard
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/policy/ratelimit" // registers type ratelimit; the tenants' keyring
	_ "github.com/sluicegw/sluice/policy/runaway" // registers type runaway
	"github.com/sluicegw/sluice/proxy/config"
)

// admissionOrder is the order of the admission chain by policy type (DESIGN.md: rate limits,
// then the prompt guard, then concurrency); other types follow in config order.
var admissionOrder = []string{"ratelimit", "guard", "concurrency", "batch"}

// defaultPolicies are added to every route that does not configure their type: the guard's
// first-try protection (content depth 64, surge 3 × the sender's p95 after 100 requests and
// never below 32768 tokens).
var defaultPolicies = []policy.Spec{{Type: "guard"}}

// builtPolicy is one policy instance with the spec it was built from, so that a reload
// keeps the instance (its buckets, breakers, baselines) when the spec did not change.
type builtPolicy struct {
	key   string // route + type + name + params
	typ   string
	name  string
	route string
	impl  policy.Plugin
}

// buildKeyring reads the tenants' keys.
func buildKeyring(c *config.Config) (*ratelimit.Keyring, error) {
	if len(c.Tenants) == 0 {
		return nil, nil
	}
	specs := make([]ratelimit.TenantSpec, len(c.Tenants))
	for i, t := range c.Tenants {
		specs[i] = ratelimit.TenantSpec{Name: t.Name, KeysEnv: t.KeysEnv, KeysFile: t.KeysFile, Priority: t.Priority}
	}
	kr, err := ratelimit.NewKeyring(specs)
	if err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	return kr, nil
}

// buildPolicies builds every route's policies (reusing unchanged instances of prev) and
// fills st's admission chains and observers. It reports every problem at once.
func (s *Server) buildPolicies(st *state, prev *state) error {
	old := map[string]*builtPolicy{}
	if prev != nil {
		for _, p := range prev.policies {
			old[p.key] = p
		}
	}
	priorities := map[string]int{}
	for _, t := range st.snap.Config.Tenants {
		priorities[t.Name] = t.Priority
	}
	var problems []string
	st.batchers = make([]batcher, len(st.snap.Routes))
	for i, r := range st.snap.Routes {
		env := policy.Env{Route: r.Name, Clock: policy.SystemClock{}, Logger: s.log.With("route", r.Name)}
		specs := slices.Clone(r.Policies)
		for _, d := range defaultPolicies {
			if !slices.ContainsFunc(specs, func(sp policy.Spec) bool { return sp.Type == d.Type }) {
				specs = append(specs, d)
			}
		}
		var route []*builtPolicy
		for j, spec := range specs {
			key, err := policyKey(r.Name, spec)
			if err != nil {
				problems = append(problems, fmt.Sprintf("routes[%d].policies[%d]: %v", i, j, err))
				continue
			}
			bp := old[key]
			if bp == nil {
				impl, err := policy.Build(spec, env)
				if err != nil {
					problems = append(problems, fmt.Sprintf("routes[%d].policies[%d] (%s): %v", i, j, spec.Type, err))
					continue
				}
				tn := impl.TypedName()
				bp = &builtPolicy{key: key, typ: tn.Type, name: tn.Name, route: r.Name, impl: impl}
			}
			delete(old, key) // an instance serves one route of one generation
			route = append(route, bp)
		}
		slices.SortStableFunc(route, func(a, b *builtPolicy) int { return orderOf(a.typ) - orderOf(b.typ) })
		// What each plugin offers is discovered: the contracts it implements, and what the
		// gateway gives those that ask (priorities, cluster load) or checks (clusters named).
		for _, bp := range route {
			if a, ok := bp.impl.(policy.Admitter); ok {
				st.admitters[r.Name] = append(st.admitters[r.Name], a)
			}
			if o, ok := bp.impl.(policy.Observer); ok {
				st.observers[r.Name] = append(st.observers[r.Name], o)
			}
			if f, ok := bp.impl.(policy.StreamFilter); ok {
				st.filters[r.Name] = append(st.filters[r.Name], f)
			}
			if f, ok := bp.impl.(policy.BodyFilter); ok {
				st.bodies[r.Name] = append(st.bodies[r.Name], f)
			}
			if b, ok := bp.impl.(batcher); ok {
				st.batchers[i] = b
			}
			if u, ok := bp.impl.(policy.ClusterUser); ok {
				named := u.Clusters()
				for _, param := range slices.Sorted(maps.Keys(named)) {
					if c := named[param]; st.clusters[c] == nil {
						problems = append(problems, fmt.Sprintf("routes[%d].policies (%s): %s: unknown cluster %q", i, bp.typ, param, c))
					}
				}
			}
			if p, ok := bp.impl.(policy.PrioritySetter); ok {
				p.SetPriorities(priorities)
			}
			if l, ok := bp.impl.(policy.LoadAware); ok {
				l.SetLoadSource(policy.LoadFunc(s.clusterLoad(st)))
			}
		}
		st.policies = append(st.policies, route...)
	}
	if len(problems) > 0 {
		// Close what this attempt built and will not use.
		for _, bp := range st.policies {
			if prev == nil || !slices.Contains(prev.policies, bp) {
				closePolicy(bp)
			}
		}
		st.policies = nil
		return &config.ValidationError{Problems: problems}
	}
	return nil
}

// retire closes the policies of a replaced generation that the new one does not reuse.
func retire(old, cur *state) {
	for _, bp := range old.policies {
		if !slices.Contains(cur.policies, bp) {
			closePolicy(bp)
		}
	}
}

func closePolicy(bp *builtPolicy) {
	if c, ok := bp.impl.(io.Closer); ok {
		_ = c.Close()
	}
}

// batcher is a plugin that sends requests at the send step, merged with others (the batch
// policy).
type batcher interface {
	Batchable(*openai.Request) bool
	Do(ctx context.Context, req *openai.Request, tenant string, send batch.Send) (status int, header http.Header, body []byte, err error)
}

func policyKey(route string, s policy.Spec) (string, error) {
	b, err := json.Marshal(s.Params)
	if err != nil {
		return "", fmt.Errorf("params: %w", err)
	}
	return strings.Join([]string{route, s.Type, s.Name, string(b)}, "\x00"), nil
}

func orderOf(typ string) int {
	if i := slices.Index(admissionOrder, typ); i >= 0 {
		return i
	}
	return len(admissionOrder)
}

// clusterLoad sums a cluster's fresh queue signals (and takes its highest KV-cache use) for
// the adaptive concurrency limiter. It does not block.
func (s *Server) clusterLoad(st *state) func(cluster string) (waiting, kv float64, fresh bool) {
	return func(cluster string) (waiting, kv float64, fresh bool) {
		cc := st.snap.Cluster(cluster)
		if cc == nil {
			return 0, 0, false
		}
		for _, ep := range cc.Endpoints {
			if l, ok := s.scraper.Get(ep.URL); ok {
				waiting += l.Waiting
				kv = max(kv, l.KVCacheUsage)
				fresh = true
			}
		}
		return waiting, kv, fresh
	}
}
