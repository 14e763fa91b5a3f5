package fault

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Kind names a fault.
type Kind string

// The fault kinds. Abort and delay act before the request is forwarded; the others act on the
// answer, at SSE event boundaries (and, for drift, corrupt and malformed, on a non-streaming
// JSON body too).
const (
	KindAbort     Kind = "abort"     // answer with an HTTP error (status, Retry-After)
	KindDelay     Kind = "delay"     // wait before forwarding: fixed, or Gamma(shape, scale)
	KindTTFT      Kind = "ttft"      // hold the first event
	KindStall     Kind = "stall"     // pause once after N events or N token events
	KindCut       Kind = "cut"       // end the stream after N events (eof, reset, h2reset, sse_error)
	KindDrip      Kind = "drip"      // delay every event
	KindMalformed Kind = "malformed" // turn event N into truncated or invalid JSON
	KindDrop      Kind = "drop"      // drop the usage chunk or [DONE]
	KindCorrupt   Kind = "corrupt"   // replace output tokens with plausible alternatives
	KindDrift     Kind = "drift"     // rename or remove fields of the response JSON
)

// Kinds lists every fault kind.
var Kinds = []Kind{KindAbort, KindDelay, KindTTFT, KindStall, KindCut, KindDrip, KindMalformed, KindDrop, KindCorrupt, KindDrift}

func (k Kind) index() int {
	for i, x := range Kinds {
		if x == k {
			return i
		}
	}
	return -1
}

// request reports whether the kind acts before forwarding (in Before), not on the answer.
func (k Kind) request() bool { return k == KindAbort || k == KindDelay }

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

// Modes of a cut.
const (
	CutEOF      = "eof"       // a clean end of stream without [DONE]
	CutReset    = "reset"     // a TCP reset
	CutH2Reset  = "h2reset"   // an HTTP/2 stream reset
	CutSSEError = "sse_error" // an in-band `event: error` event, then the end
)

// Modes of malformed and drop.
const (
	MalformedTruncate = "truncate" // the first half of the event's JSON
	MalformedInvalid  = "invalid"  // the JSON with a trailing comma before its closing brace
	DropUsage         = "usage"    // the usage chunk (or the usage field of a chunk with choices)
	DropDone          = "done"     // the data: [DONE] event
)

// Defaults.
const (
	DefaultLogSize     = 1000
	DefaultAbortStatus = 503
	DefaultCorruptRate = 0.002
	MaxLogSize         = 1_000_000
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

// params lists the kind params each kind takes (besides the common keys).
var params = map[Kind][]string{
	KindAbort:     {"status", "retry_after", "message"},
	KindDelay:     {"for", "shape", "scale"},
	KindTTFT:      {"for"},
	KindStall:     {"for", "after_events", "after_tokens"},
	KindCut:       {"after_events", "mode", "message"},
	KindDrip:      {"gap", "jitter", "shape", "scale"},
	KindMalformed: {"at", "mode"},
	KindDrop:      {"mode"},
	KindCorrupt:   {"rate", "seed"},
	KindDrift:     {"rename", "remove"},
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

func (s Spec) problems(at string) Problems {
	var p Problems
	add := func(field, format string, args ...any) {
		p = append(p, at+field+": "+fmt.Sprintf(format, args...))
	}
	allowed, known := params[s.Kind]
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
	if (s.Shape > 0) != (s.Scale > 0) && (s.Kind == KindDelay || s.Kind == KindDrip) {
		add("shape", "shape and scale go together (a Gamma(shape, scale) wait)")
	}
	switch s.Kind {
	case KindAbort:
		if s.Status != 0 && (s.Status < 400 || s.Status > 599) {
			add("status", "must be an HTTP error status (400..599), not %d", s.Status)
		}
	case KindDelay:
		if s.For <= 0 && s.Shape <= 0 {
			add("for", "a delay needs a duration (for) or shape and scale")
		}
	case KindTTFT:
		if s.For <= 0 {
			add("for", "required: how long to hold the first event")
		}
	case KindStall:
		if s.For <= 0 {
			add("for", "required: how long to pause")
		}
		if s.AfterEvents < 0 {
			add("after_events", "must not be negative")
		}
		if s.AfterTokens < 0 {
			add("after_tokens", "must not be negative")
		}
		if s.AfterEvents > 0 && s.AfterTokens > 0 {
			add("after_tokens", "set after_events or after_tokens, not both")
		}
	case KindCut:
		if s.AfterEvents < 0 {
			add("after_events", "must not be negative")
		}
		switch s.Mode {
		case "", CutEOF, CutReset, CutH2Reset, CutSSEError:
		default:
			add("mode", "must be eof, reset, h2reset or sse_error, not %q", s.Mode)
		}
	case KindDrip:
		if s.Gap <= 0 && s.Jitter <= 0 && s.Shape <= 0 {
			add("gap", "a drip needs a gap, a jitter, or shape and scale")
		}
	case KindMalformed:
		if s.At < 0 {
			add("at", "must not be negative")
		}
		switch s.Mode {
		case "", MalformedTruncate, MalformedInvalid:
		default:
			add("mode", "must be truncate or invalid, not %q", s.Mode)
		}
	case KindDrop:
		switch s.Mode {
		case "", DropUsage, DropDone:
		default:
			add("mode", "must be usage or done, not %q", s.Mode)
		}
	case KindCorrupt:
		if math.IsNaN(s.Rate) || s.Rate < 0 || s.Rate > 1 {
			add("rate", "must be within (0, 1], not %v", s.Rate)
		}
	case KindDrift:
		if len(s.Rename) == 0 && len(s.Remove) == 0 {
			add("rename", "a drift needs rename or remove paths")
		}
		for _, path := range sortedKeys(s.Rename) {
			if _, err := parsePath(path); err != nil {
				add("rename["+strconv.Quote(path)+"]", "%v", err)
			}
			if n := s.Rename[path]; n == "" || strings.ContainsAny(n, "\"\\\x00\n\r") {
				add("rename["+strconv.Quote(path)+"]", "the new name must be non-empty, without quotes, backslashes or line breaks")
			}
		}
		for i, path := range s.Remove {
			if _, err := parsePath(path); err != nil {
				add(fmt.Sprintf("remove[%d]", i), "%v", err)
			}
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
