package ratelimit

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Keying of a Limiter's buckets (Params.Per).
const (
	PerTenant = "tenant" // one bucket pair per tenant (anonymous requests share one)
	PerRoute  = "route"  // one bucket pair per route
	PerGlobal = "global" // one bucket pair for everything this policy instance sees
)

// Descriptor value sources (GlobalEntry.From).
const (
	FromTenant = "tenant"
	FromRoute  = "route"
	FromModel  = "model"
)

// Hit units sent to the global service (Global.Hits).
const (
	HitsRequests = "requests"
	HitsTokens   = "tokens"
)

// Defaults.
const (
	DefaultPer              = PerTenant
	DefaultBurst            = 1.0
	DefaultDefaultMaxTokens = 256
	DefaultMaxTokensCap     = 4096
	DefaultMaxKeys          = 10000
	DefaultGlobalTimeout    = 20 * time.Millisecond
	DefaultGlobalDomain     = "sluice"
)

// Params configures a rate limit policy (`{type: ratelimit, params: {...}}`). Zero values take
// the defaults (see WithDefaults). Every limit is per minute and refills continuously, as a
// token bucket whose capacity is Burst × the per-minute limit.
type Params struct {
	// RequestsPerMinute limits requests (0: no request limit).
	RequestsPerMinute float64 `json:"requests_per_minute,omitempty"`
	// TokensPerMinute limits tokens: prompt plus completion (0: no token limit).
	TokensPerMinute float64 `json:"tokens_per_minute,omitempty"`
	// Per keys the buckets: "tenant" (default), "route" or "global". A policy instance on a
	// route sees only that route's requests, so "tenant" there means per (route, tenant).
	Per string `json:"per,omitempty"`
	// Burst is the bucket capacity as a multiple of the per-minute limit (default 1: a full
	// minute's budget may be spent at once, as OpenAI does; 0.1 smooths to 6-second bursts).
	Burst float64 `json:"burst,omitempty"`
	// DefaultMaxTokens is the completion size charged up front when a request has no
	// max_tokens (default 256), per choice (× n). Embeddings are charged their input only.
	DefaultMaxTokens int `json:"default_max_tokens,omitempty"`
	// MaxTokensCap caps the completion size charged up front per choice (default 4096;
	// -1: no cap). What is used beyond it is charged when the response ends.
	MaxTokensCap int `json:"max_tokens_cap,omitempty"`
	// MaxWait lets Admit wait up to this long for budget (honouring the request's context)
	// instead of answering 429 at once (default 0: never wait).
	MaxWait policy.Duration `json:"max_wait,omitempty"`
	// MaxKeys bounds the number of bucket pairs kept (default 10000); idle ones are evicted
	// first, then the least recently used.
	MaxKeys int `json:"max_keys,omitempty"`
	// RequireAuth rejects requests without a known tenant (policy.Request.Tenant == "") with
	// 401 invalid_api_key.
	RequireAuth bool `json:"require_auth,omitempty"`
	// Overrides sets other limits for named tenants (Per must be "tenant"). A zero field keeps
	// the policy's value.
	Overrides map[string]Limits `json:"overrides,omitempty"`
	// Global, when set, also asks an Envoy-compatible rate limit service (shared by all
	// replicas) after the local limits admit a request. Off by default.
	Global *Global `json:"global,omitempty"`
}

// Limits are per-minute limits for one tenant (Params.Overrides).
type Limits struct {
	RequestsPerMinute float64 `json:"requests_per_minute,omitempty"`
	TokensPerMinute   float64 `json:"tokens_per_minute,omitempty"`
}

// Global configures the Envoy-compatible rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit).
type Global struct {
	// Address is the service's gRPC address (host:port, plaintext), required.
	Address string `json:"address"`
	// Domain is the rate limit domain (default "sluice").
	Domain string `json:"domain,omitempty"`
	// Timeout bounds each call (default 20ms); on error or time-out the request is admitted
	// (fail open) and Stats.GlobalFailures counts it.
	Timeout policy.Duration `json:"timeout,omitempty"`
	// Descriptors sent with each call (default: [[{key: tenant, from: tenant}]]). The service
	// answers OVER_LIMIT when any of them is over its limit.
	Descriptors [][]GlobalEntry `json:"descriptors,omitempty"`
	// Hits is what one request adds to the service's counters: "requests" (1, default) or
	// "tokens" (the up-front token charge; not reconciled later).
	Hits string `json:"hits,omitempty"`
}

// GlobalEntry is one descriptor entry: a key and either a literal Value or a value taken From
// the request ("tenant", "route" or "model"; an empty tenant is sent as "anonymous").
type GlobalEntry struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
	From  string `json:"from,omitempty"`
}

// WithDefaults returns p with zero values replaced by the defaults.
func (p Params) WithDefaults() Params {
	policy.Default(&p.Per, DefaultPer)
	policy.Default(&p.Burst, DefaultBurst)
	policy.Default(&p.DefaultMaxTokens, DefaultDefaultMaxTokens)
	policy.Default(&p.MaxTokensCap, DefaultMaxTokensCap)
	policy.Default(&p.MaxKeys, DefaultMaxKeys)
	if p.Global != nil {
		g := *p.Global
		policy.Default(&g.Domain, DefaultGlobalDomain)
		policy.Default(&g.Timeout, policy.Duration(DefaultGlobalTimeout))
		policy.Default(&g.Hits, HitsRequests)
		if len(g.Descriptors) == 0 {
			g.Descriptors = [][]GlobalEntry{{{Key: "tenant", From: FromTenant}}}
		}
		p.Global = &g
	}
	return p
}

// Validate checks p (after defaults) and returns every problem, joined, or nil.
func (p Params) Validate() error {
	var c policy.Check

	if p.RequestsPerMinute < 0 {
		c.Add("requests_per_minute: %v must be >= 0", p.RequestsPerMinute)
	}
	if p.TokensPerMinute < 0 {
		c.Add("tokens_per_minute: %v must be >= 0", p.TokensPerMinute)
	}
	switch p.Per {
	case "", PerTenant, PerRoute, PerGlobal:
	default:
		c.Add("per: %q must be one of tenant, route, global", p.Per)
	}
	if p.Burst < 0 {
		c.Add("burst: %v must be > 0 (a multiple of the per-minute limit)", p.Burst)
	}
	if p.DefaultMaxTokens < 0 {
		c.Add("default_max_tokens: %d must be >= 0", p.DefaultMaxTokens)
	}
	if p.MaxTokensCap < -1 {
		c.Add("max_tokens_cap: %d must be > 0, or -1 for no cap", p.MaxTokensCap)
	}
	if p.MaxWait < 0 {
		c.Add("max_wait: %v must be >= 0", p.MaxWait.D())
	}
	if p.MaxKeys < 0 {
		c.Add("max_keys: %d must be > 0", p.MaxKeys)
	}
	if len(p.Overrides) > 0 && p.Per != "" && p.Per != PerTenant {
		c.Add("overrides: only with per: tenant (per is %q)", p.Per)
	}
	names := make([]string, 0, len(p.Overrides))
	for name := range p.Overrides {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		o := p.Overrides[name]
		if name == "" {
			c.Add("overrides: empty tenant name")
		}
		if o.RequestsPerMinute < 0 {
			c.Add("overrides.%s.requests_per_minute: %v must be >= 0", name, o.RequestsPerMinute)
		}
		if o.TokensPerMinute < 0 {
			c.Add("overrides.%s.tokens_per_minute: %v must be >= 0", name, o.TokensPerMinute)
		}
	}
	if g := p.Global; g != nil {
		if g.Address == "" {
			c.Add("global.address: required")
		}
		if g.Timeout < 0 {
			c.Add("global.timeout: %v must be > 0", g.Timeout.D())
		}
		switch g.Hits {
		case "", HitsRequests, HitsTokens:
		default:
			c.Add("global.hits: %q must be requests or tokens", g.Hits)
		}
		for i, d := range g.Descriptors {
			if len(d) == 0 {
				c.Add("global.descriptors[%d]: no entries", i)
			}
			for j, e := range d {
				at := fmt.Sprintf("global.descriptors[%d][%d]", i, j)
				if e.Key == "" {
					c.Add("%s.key: required", at)
				}
				switch {
				case e.From == "" && e.Value == "":
					c.Add("%s: set value or from", at)
				case e.From != "" && e.Value != "":
					c.Add("%s: set value or from, not both", at)
				}
				switch e.From {
				case "", FromTenant, FromRoute, FromModel:
				default:
					c.Add("%s.from: %q must be tenant, route or model", at, e.From)
				}
			}
		}
	}
	if p.RequestsPerMinute == 0 && p.TokensPerMinute == 0 && p.Global == nil && !p.RequireAuth && len(p.Overrides) == 0 {
		c.Add("nothing to enforce: set requests_per_minute, tokens_per_minute, overrides, global or require_auth")
	}
	if err := c.Err(); err != nil {
		return errors.New("ratelimit: " + strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return nil
}
