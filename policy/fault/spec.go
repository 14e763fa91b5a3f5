package fault

import (
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Kind names a fault. The kinds (KindAbort, KindDelay, ...) are defined one per file,
// kind_<name>.go, each with what it does; Kinds lists them.
type Kind string

// Side is where a fault sits.
type Side string

// The sides. Upstream faults sit between the gateway and the model server, so the gateway's
// own policies (retries, fallback, breakers) react to them; downstream faults sit between the
// gateway and the client, to test clients.
const (
	Upstream   Side = "upstream"
	Downstream Side = "downstream"
)

func (s Side) index() int {
	if s == Downstream {
		return 1
	}
	return 0
}

// Defaults.
const (
	DefaultLogSize = 1000
	MaxLogSize     = 1_000_000
)

// Spec is one fault: what to inject (kind and its params), where (side, route, model,
// cluster) and when (percent or every, schedule, max_active). YAML and JSON keys are the
// snake_case names of the tags.
type Spec struct {
	// ID names the fault in List, Log and Report ("" gets "f1", "f2"... on Set or Add).
	ID   string `yaml:"id,omitempty" json:"id,omitempty"`
	Kind Kind   `yaml:"kind" json:"kind"`
	// Side is upstream (default) or downstream.
	Side Side `yaml:"side,omitempty" json:"side,omitempty"`
	// Percent is the share of matching requests it fires on, 0 to 100 (default 100 when
	// Every is 0 too). Drawn from the engine's seeded generator.
	Percent *float64 `yaml:"percent,omitempty" json:"percent,omitempty"`
	// Every fires it on every Nth matching request instead (exact, by a counter).
	Every int `yaml:"every,omitempty" json:"every,omitempty"`
	// Route is a route name or glob ('*', '?') the request's route must match ("" any).
	Route string `yaml:"route,omitempty" json:"route,omitempty"`
	// Model is a glob ('*' matches any run, '/' included; case-insensitive) on the request's
	// model ("" any).
	Model string `yaml:"model,omitempty" json:"model,omitempty"`
	// Cluster is a glob on the cluster of an upstream attempt ("" any). Upstream only.
	Cluster string `yaml:"cluster,omitempty" json:"cluster,omitempty"`
	// Attempts is how many upstream attempts of one request it hits (default 1: the first
	// matching attempt, so a retry or a fallback can survive it). Upstream only.
	Attempts int `yaml:"attempts,omitempty" json:"attempts,omitempty"`
	// Start is when the fault becomes active (RFC3339; zero: at once).
	Start time.Time `yaml:"start,omitempty" json:"start,omitzero"`
	// Duration is how long it stays active from Start (or from when it was set); 0 forever.
	Duration Duration `yaml:"duration,omitempty" json:"duration,omitempty"`
	// MaxActive caps the requests this fault is active on at once (0: no cap).
	MaxActive int `yaml:"max_active,omitempty" json:"max_active,omitempty"`

	// Status is abort's HTTP status (default 503).
	Status int `yaml:"status,omitempty" json:"status,omitempty"`
	// RetryAfter is abort's Retry-After (0: none).
	RetryAfter Duration `yaml:"retry_after,omitempty" json:"retry_after,omitempty"`
	// Message is the error message of abort and of cut's sse_error ("" a default).
	Message string `yaml:"message,omitempty" json:"message,omitempty"`
	// For is delay's fixed wait, ttft's hold and stall's pause.
	For Duration `yaml:"for,omitempty" json:"for,omitempty"`
	// Shape and Scale add a Gamma(shape, scale) random wait to delay and drip.
	Shape float64  `yaml:"shape,omitempty" json:"shape,omitempty"`
	Scale Duration `yaml:"scale,omitempty" json:"scale,omitempty"`
	// Gap is drip's fixed wait before every event; Jitter adds a uniform [0, jitter).
	Gap    Duration `yaml:"gap,omitempty" json:"gap,omitempty"`
	Jitter Duration `yaml:"jitter,omitempty" json:"jitter,omitempty"`
	// AfterEvents is N of stall and cut: the fault acts after the Nth event with data (0:
	// before the first).
	AfterEvents int `yaml:"after_events,omitempty" json:"after_events,omitempty"`
	// AfterTokens is N of stall counted in token events (events whose choices carry
	// content), instead of events.
	AfterTokens int `yaml:"after_tokens,omitempty" json:"after_tokens,omitempty"`
	// At is malformed's event N (default 1).
	At int `yaml:"at,omitempty" json:"at,omitempty"`
	// Mode is cut's eof (default), reset, h2reset or sse_error; malformed's truncate
	// (default) or invalid; drop's usage (default) or done.
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`
	// Rate is corrupt's share of output tokens replaced, in (0, 1] (default 0.002).
	Rate float64 `yaml:"rate,omitempty" json:"rate,omitempty"`
	// Seed makes corrupt's choices repeatable (0: drawn from the engine's generator).
	Seed int64 `yaml:"seed,omitempty" json:"seed,omitempty"`
	// Rename maps drift paths to a new key name, e.g.
	// "choices[].delta.tool_calls[].function.arguments": "args".
	Rename map[string]string `yaml:"rename,omitempty" json:"rename,omitempty"`
	// Remove lists drift paths to remove, e.g. "usage".
	Remove []string `yaml:"remove,omitempty" json:"remove,omitempty"`
}

// side returns the side with its default.
func (s *Spec) side() Side {
	if s.Side == "" {
		return Upstream
	}
	return s.Side
}

// Problems is every problem of a Spec or Config, each with its path. As an error it lists
// them all.
type Problems []string

func (p Problems) Error() string {
	if len(p) == 1 {
		return p[0]
	}
	return fmt.Sprintf("%d problems:\n  %s", len(p), strings.Join(p, "\n  "))
}

// Validate returns Problems listing every problem of the fault (nil when none).
func (s Spec) Validate() error {
	if p := s.problems(""); len(p) > 0 {
		return p
	}
	return nil
}

// set lists the kind params that are set (non-zero).
func (s *Spec) set() []string {
	var out []string
	add := func(name string, on bool) {
		if on {
			out = append(out, name)
		}
	}
	add("status", s.Status != 0)
	add("retry_after", s.RetryAfter != 0)
	add("message", s.Message != "")
	add("for", s.For != 0)
	add("shape", s.Shape != 0)
	add("scale", s.Scale != 0)
	add("gap", s.Gap != 0)
	add("jitter", s.Jitter != 0)
	add("after_events", s.AfterEvents != 0)
	add("after_tokens", s.AfterTokens != 0)
	add("at", s.At != 0)
	add("mode", s.Mode != "")
	add("rate", s.Rate != 0)
	add("seed", s.Seed != 0)
	add("rename", len(s.Rename) > 0)
	add("remove", len(s.Remove) > 0)
	return out
}

// checker collects the problems a kind finds in its own parameters, each "field: what"
// (Spec.Validate puts the spec's path in front).
type checker struct{ list Problems }

func (c *checker) add(field, format string, args ...any) {
	c.list = append(c.list, field+": "+fmt.Sprintf(format, args...))
}

// gammaPair adds the problem of a Gamma(shape, scale) wait with only one of the two set
// (delay, drip).
func (c *checker) gammaPair(s *Spec) {
	if (s.Shape > 0) != (s.Scale > 0) {
		c.add("shape", "shape and scale go together (a Gamma(shape, scale) wait)")
	}
}

func (s Spec) problems(at string) Problems {
	var p Problems
	add := func(field, format string, args ...any) {
		p = append(p, at+field+": "+fmt.Sprintf(format, args...))
	}
	fk, known := byKind[s.Kind]
	if !known {
		add("kind", "unknown fault kind %q (known: %s)", s.Kind, kindList())
	}
	switch s.Side {
	case "", Upstream, Downstream:
	default:
		add("side", "must be upstream or downstream, not %q", s.Side)
	}
	if s.Percent != nil {
		if v := *s.Percent; math.IsNaN(v) || v < 0 || v > 100 {
			add("percent", "must be within 0..100, not %v", v)
		}
		if s.Every != 0 {
			add("every", "set percent or every, not both")
		}
	}
	if s.Every < 0 {
		add("every", "must not be negative")
	}
	if s.MaxActive < 0 {
		add("max_active", "must not be negative")
	}
	if s.Duration < 0 {
		add("duration", "must not be negative")
	}
	if s.Attempts < 0 {
		add("attempts", "must not be negative")
	}
	if s.side() == Downstream {
		if s.Cluster != "" {
			add("cluster", "applies to upstream faults only")
		}
		if s.Attempts != 0 {
			add("attempts", "applies to upstream faults only")
		}
	}
	if known {
		allowed := params[s.Kind]
		for _, name := range s.set() {
			ok := false
			for _, a := range allowed {
				ok = ok || a == name
			}
			if !ok {
				add(name, "not a parameter of %s (its parameters: %s)", s.Kind, strings.Join(allowed, ", "))
			}
		}
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"retry_after", s.RetryAfter}, {"for", s.For}, {"scale", s.Scale}, {"gap", s.Gap}, {"jitter", s.Jitter}} {
		if d.v < 0 {
			add(d.name, "must not be negative")
		}
	}
	if s.Shape < 0 || math.IsNaN(s.Shape) || math.IsInf(s.Shape, 0) {
		add("shape", "must be positive")
	}
	if known {
		for _, q := range fk.check(s).list {
			p = append(p, at+q)
		}
	}
	return p
}

func kindList() string {
	s := make([]string, len(Kinds))
	for i, k := range Kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// Config is the chaos section of the gateway's config (`chaos:`).
type Config struct {
	// Enabled turns injection on (also `sluice serve --chaos`). Off, Plan returns nil.
	Enabled bool `yaml:"enabled" json:"enabled"`
	// Faults are the configured faults.
	Faults []Spec `yaml:"faults,omitempty" json:"faults,omitempty"`
	// AllowedNetworks are CIDRs (or single IPs) whose clients may send the x-sluice-fault
	// header without the admin token.
	AllowedNetworks []string `yaml:"allowed_networks,omitempty" json:"allowed_networks,omitempty"`
	// LogSize bounds the in-memory log of injections (default 1000).
	LogSize int `yaml:"log_size,omitempty" json:"log_size,omitempty"`
}

// Validate returns Problems listing every problem of the config (nil when none).
func (c Config) Validate() error {
	var p Problems
	if c.LogSize < 0 || c.LogSize > MaxLogSize {
		p = append(p, fmt.Sprintf("log_size: must be within 0..%d (0: %d)", MaxLogSize, DefaultLogSize))
	}
	for i, n := range c.AllowedNetworks {
		if _, err := parseNetwork(n); err != nil {
			p = append(p, fmt.Sprintf("allowed_networks[%d]: %v", i, err))
		}
	}
	p = append(p, validateSet(c.Faults, "faults")...)
	if len(p) > 0 {
		return p
	}
	return nil
}

func validateSet(faults []Spec, at string) Problems {
	var p Problems
	ids := map[string]int{}
	for i, f := range faults {
		pre := fmt.Sprintf("%s[%d].", at, i)
		p = append(p, f.problems(pre)...)
		if f.ID != "" {
			if j, dup := ids[f.ID]; dup {
				p = append(p, fmt.Sprintf("%sid: %q is also the id of %s[%d]", pre, f.ID, at, j))
			} else {
				ids[f.ID] = i
			}
		}
	}
	return p
}

// AllowsNetwork reports whether ip is in one of AllowedNetworks (the header's other
// authorization besides the admin token). Invalid entries never match.
func (c Config) AllowsNetwork(ip net.IP) bool {
	if ip == nil {
		return false
	}
	for _, n := range c.AllowedNetworks {
		if nw, err := parseNetwork(n); err == nil && nw.Contains(ip) {
			return true
		}
	}
	return false
}

func parseNetwork(s string) (*net.IPNet, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "/") {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, fmt.Errorf("%q is neither a CIDR nor an IP address", s)
		}
		bits := 128
		if ip4 := ip.To4(); ip4 != nil {
			ip, bits = ip4, 32
		}
		return &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, nil
	}
	_, nw, err := net.ParseCIDR(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a CIDR", s)
	}
	return nw, nil
}

// Duration is policy.Duration: "250ms", "2s" or a number of seconds, in YAML and JSON.
type Duration = policy.Duration
