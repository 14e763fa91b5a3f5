package config

import (
	"net/http"
	"net/textproto"
	"path"
	"sort"
	"strings"
)

// Snapshot is a validated Config compiled for matching. It is immutable; the gateway swaps
// whole snapshots atomically.
type Snapshot struct {
	Config *Config
	Routes []*CompiledRoute
}

// CompiledRoute is a Route ready to match, with its time-outs resolved
// (route, else cluster, else global).
type CompiledRoute struct {
	Route
	Index    int
	Timeouts Timeouts
	headers  []headerMatch
	glob     bool
}

type headerMatch struct {
	key, value string // key canonical; value "*" = present
}

// NewSnapshot compiles a validated config.
func NewSnapshot(c *Config) *Snapshot {
	s := &Snapshot{Config: c}
	clusters := map[string]*Cluster{}
	for i := range c.Clusters {
		clusters[c.Clusters[i].Name] = &c.Clusters[i]
	}
	for i, r := range c.Routes {
		cr := &CompiledRoute{Route: r, Index: i, glob: strings.ContainsAny(r.Match.Model, "*?[\\")}
		base := c.Timeouts.Timeouts
		if cl := clusters[r.Cluster]; cl != nil {
			base = cl.Timeouts.Or(c.Timeouts.Timeouts)
		}
		cr.Timeouts = r.Timeouts.Or(base)
		for k, v := range r.Match.Headers {
			cr.headers = append(cr.headers, headerMatch{key: textproto.CanonicalMIMEHeaderKey(k), value: v})
		}
		sort.Slice(cr.headers, func(a, b int) bool { return cr.headers[a].key < cr.headers[b].key })
		s.Routes = append(s.Routes, cr)
	}
	return s
}

// Route returns the first route matching the request, or nil. It does not allocate.
func (s *Snapshot) Route(urlPath, model string, h http.Header) *CompiledRoute {
	for _, r := range s.Routes {
		if r.Matches(urlPath, model, h) {
			return r
		}
	}
	return nil
}

// Matches reports whether the route matches a request.
func (r *CompiledRoute) Matches(urlPath, model string, h http.Header) bool {
	if !strings.HasPrefix(urlPath, r.Match.PathPrefix) {
		return false
	}
	if m := r.Match.Model; m != "" {
		if r.glob {
			if ok, _ := path.Match(m, model); !ok {
				return false
			}
		} else if m != model {
			return false
		}
	}
	for _, hm := range r.headers {
		vs := h[hm.key]
		if len(vs) == 0 {
			return false
		}
		if hm.value != "*" && vs[0] != hm.value {
			return false
		}
	}
	return true
}

// Cluster returns the named cluster's config, or nil.
func (s *Snapshot) Cluster(name string) *Cluster {
	for i := range s.Config.Clusters {
		if s.Config.Clusters[i].Name == name {
			return &s.Config.Clusters[i]
		}
	}
	return nil
}
