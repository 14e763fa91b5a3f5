package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/batch"
	"github.com/sluicegw/sluice/policy/concurrency"
	"github.com/sluicegw/sluice/policy/guard"
	"github.com/sluicegw/sluice/policy/ratelimit"
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
	impl  any
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
	st.batchers = make([]*batch.Batcher, len(st.snap.Routes))
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
				impl, err := buildPolicy(spec, env)
				if err != nil {
					problems = append(problems, fmt.Sprintf("routes[%d].policies[%d] (%s): %v", i, j, spec.Type, err))
					continue
				}
				name := spec.Name
				if name == "" {
					name = spec.Type
				}
				bp = &builtPolicy{key: key, typ: spec.Type, name: name, route: r.Name, impl: impl}
			}
			delete(old, key) // an instance serves one route of one generation
			route = append(route, bp)
		}
		slices.SortStableFunc(route, func(a, b *builtPolicy) int { return orderOf(a.typ) - orderOf(b.typ) })
		for _, bp := range route {
			if a, ok := bp.impl.(policy.Admitter); ok {
				st.admitters[r.Name] = append(st.admitters[r.Name], a)
			}
			if o, ok := bp.impl.(policy.Observer); ok {
				st.observers[r.Name] = append(st.observers[r.Name], o)
			}
			if g, ok := bp.impl.(*guard.Guard); ok {
				if c := g.Params().Degrade.LongContextCluster; c != "" && st.clusters[c] == nil {
					problems = append(problems, fmt.Sprintf("routes[%d].policies (guard): degrade.long_context_cluster: unknown cluster %q", i, c))
				}
				g.SetPriorities(priorities)
			}
			if b, ok := bp.impl.(*batch.Batcher); ok {
				st.batchers[i] = b
			}
			if c, ok := bp.impl.(*concurrency.Limiter); ok {
				c.SetPriorities(priorities)
				c.SetLoadSource(concurrency.LoadFunc(s.clusterLoad(st)))
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
	switch c := bp.impl.(type) {
	case io.Closer:
		_ = c.Close()
	case interface{ Close() }:
		c.Close()
	}
}

// buildPolicy builds one route policy. The batcher is not an admission policy (it sits at
// the send step), so it is built by its own package rather than the registry.
func buildPolicy(spec policy.Spec, env policy.Env) (any, error) {
	if spec.Type != batch.Type {
		return policy.Build(spec, env)
	}
	raw, err := json.Marshal(spec.Params)
	if err != nil {
		return nil, fmt.Errorf("params: %w", err)
	}
	return batch.FromSpec(raw, env)
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
