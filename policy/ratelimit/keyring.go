package ratelimit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// TenantSpec configures a tenant: its name, where its API keys come from (an environment
// variable holding comma-separated keys, a file with one key a line, or both) and its
// priority (higher is more important; used by the guard's load shedding).
type TenantSpec struct {
	Name     string `yaml:"name" json:"name"`
	KeysEnv  string `yaml:"keys_env" json:"keys_env,omitempty"`
	KeysFile string `yaml:"keys_file" json:"keys_file,omitempty"`
	Priority int    `yaml:"priority" json:"priority,omitempty"`
}

// Tenant is a tenant with its API keys by value. Printing, logging or marshalling a Tenant
// shows its name, priority and key count, never the keys.
type Tenant struct {
	Name     string
	Keys     []string // the API keys, by value
	Priority int
}

func (t Tenant) redacted() string {
	return fmt.Sprintf("%s(priority %d, %s)", t.Name, t.Priority, plural(len(t.Keys), "key"))
}

// String shows the name, priority and key count.
func (t Tenant) String() string { return t.redacted() }

// GoString is String (for %#v).
func (t Tenant) GoString() string { return "ratelimit.Tenant{" + t.redacted() + "}" }

// Format writes String for every verb, so that no verb prints the keys.
func (t Tenant) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = io.WriteString(f, t.GoString())
		return
	}
	_, _ = io.WriteString(f, t.redacted())
}

// LogValue shows the name, priority and key count.
func (t Tenant) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", t.Name), slog.Int("priority", t.Priority), slog.Int("keys", len(t.Keys)))
}

// MarshalJSON writes {"name":...,"priority":...,"keys":COUNT}.
func (t Tenant) MarshalJSON() ([]byte, error) {
	return json.Marshal(TenantInfo{Name: t.Name, Priority: t.Priority, Keys: len(t.Keys)})
}

// TenantInfo is what may be shown of a tenant: never its keys.
type TenantInfo struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	Keys     int    `json:"keys"` // how many keys it has
}

// Keyring maps API keys to tenants. It keeps only SHA-256 digests of the keys, so a lookup
// takes the same time whatever prefix a guess shares with a real key, and printing,
// logging or marshalling it shows tenant names and key counts only. It is immutable and
// safe for concurrent use; a nil *Keyring knows no keys.
type Keyring struct {
	s *keys
}

type keys struct {
	byDigest map[[sha256.Size]byte]int // key digest -> index in tenants
	tenants  []TenantInfo
	byName   map[string]int
}

// NewKeyring loads the tenants' keys from their environment variables and files. It returns
// every problem at once (without ever quoting a key): a tenant without a name or a key
// source, a duplicate name, an unset variable, an unreadable file, a source with no keys,
// a key given to two tenants.
func NewKeyring(specs []TenantSpec) (*Keyring, error) {
	var errs []error
	tenants := make([]Tenant, 0, len(specs))
	for i, s := range specs {
		name := s.Name
		if name == "" {
			name = "tenants[" + strconv.Itoa(i) + "]"
			errs = append(errs, fmt.Errorf("%s: name required", name))
		}
		t := Tenant{Name: s.Name, Priority: s.Priority}
		if s.KeysEnv == "" && s.KeysFile == "" {
			errs = append(errs, fmt.Errorf("tenant %s: set keys_env or keys_file", name))
		}
		if s.KeysEnv != "" {
			v, ok := os.LookupEnv(s.KeysEnv)
			if !ok {
				errs = append(errs, fmt.Errorf("tenant %s: keys_env: environment variable %s is not set", name, s.KeysEnv))
			} else {
				keys := splitKeys(v)
				if len(keys) == 0 {
					errs = append(errs, fmt.Errorf("tenant %s: keys_env: environment variable %s holds no keys", name, s.KeysEnv))
				}
				t.Keys = append(t.Keys, keys...)
			}
		}
		if s.KeysFile != "" {
			keys, err := readKeyFile(s.KeysFile)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("tenant %s: keys_file: %w", name, err))
			case len(keys) == 0:
				errs = append(errs, fmt.Errorf("tenant %s: keys_file: %s holds no keys", name, s.KeysFile))
			}
			t.Keys = append(t.Keys, keys...)
		}
		if s.Name != "" {
			tenants = append(tenants, t)
		}
	}
	k, err := build(tenants)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("tenants: %w", errors.Join(errs...))
	}
	return k, nil
}

// KeyringOf builds a Keyring from tenants given by value (tests, programmatic setups).
func KeyringOf(tenants ...Tenant) (*Keyring, error) { return build(tenants) }

func build(tenants []Tenant) (*Keyring, error) {
	var errs []error
	k := &Keyring{s: &keys{
		byDigest: make(map[[sha256.Size]byte]int),
		byName:   make(map[string]int, len(tenants)),
	}}
	for _, t := range tenants {
		if t.Name == "" {
			errs = append(errs, errors.New("a tenant has no name"))
			continue
		}
		if _, dup := k.s.byName[t.Name]; dup {
			errs = append(errs, fmt.Errorf("tenant %s: defined twice", t.Name))
			continue
		}
		idx := len(k.s.tenants)
		k.s.byName[t.Name] = idx
		n := 0
		for _, key := range t.Keys {
			if key == "" {
				continue
			}
			d := sha256.Sum256([]byte(key))
			if other, dup := k.s.byDigest[d]; dup {
				if other != idx {
					errs = append(errs, fmt.Errorf("tenant %s: a key is also a key of tenant %s", t.Name, k.s.tenants[other].Name))
				}
				continue
			}
			k.s.byDigest[d] = idx
			n++
		}
		k.s.tenants = append(k.s.tenants, TenantInfo{Name: t.Name, Priority: t.Priority, Keys: n})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return k, nil
}

func splitKeys(s string) []string {
	var keys []string
	for k := range strings.SplitSeq(s, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// readKeyFile reads one key a line; blank lines and lines starting with # are skipped.
func readKeyFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s: %w", path, pe.Err) // the path once, no content
		}
		return nil, err
	}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keys = append(keys, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}

// KeyFromHeader returns the API key a request carries: `Authorization: Bearer KEY` (the scheme
// in any case), else the `api-key` header (Azure OpenAI), else `x-api-key`.
func KeyFromHeader(h http.Header) string {
	if a := h.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	if v := h.Get("Api-Key"); v != "" {
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(h.Get("X-Api-Key"))
}

// Identify returns the tenant whose key the request carries (see KeyFromHeader). ok is false
// when there is no key or it is unknown.
func (k *Keyring) Identify(h http.Header) (tenant string, ok bool) {
	key := KeyFromHeader(h)
	if key == "" || k == nil || k.s == nil || len(k.s.byDigest) == 0 {
		return "", false
	}
	i, ok := k.s.byDigest[sha256.Sum256([]byte(key))]
	if !ok {
		return "", false
	}
	return k.s.tenants[i].Name, true
}

// Tenant returns what may be shown of the named tenant.
func (k *Keyring) Tenant(name string) (TenantInfo, bool) {
	if k == nil || k.s == nil {
		return TenantInfo{}, false
	}
	i, ok := k.s.byName[name]
	if !ok {
		return TenantInfo{}, false
	}
	return k.s.tenants[i], true
}

// Tenants lists the tenants (names, priorities, key counts) in config order.
func (k *Keyring) Tenants() []TenantInfo {
	if k == nil || k.s == nil {
		return nil
	}
	return append([]TenantInfo(nil), k.s.tenants...)
}

// String shows tenant names and key counts: "Keyring{team-a: 2 keys, team-b: 1 key}".
func (k *Keyring) String() string {
	var b strings.Builder
	b.WriteString("Keyring{")
	if k != nil && k.s != nil {
		for i, t := range k.s.tenants {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(t.Name + ": " + plural(t.Keys, "key"))
		}
	}
	b.WriteString("}")
	return b.String()
}

// GoString is String (for %#v).
func (k *Keyring) GoString() string { return "ratelimit." + k.String() }

// Format writes String for every verb, so that no verb prints the digests. It has a value
// receiver so that a copied Keyring value prints the same.
func (k Keyring) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = io.WriteString(f, k.GoString())
		return
	}
	_, _ = io.WriteString(f, k.String())
}

// LogValue shows tenant names and key counts.
func (k Keyring) LogValue() slog.Value { return slog.StringValue(k.String()) }

// MarshalJSON writes the tenants as TenantInfo: [{"name":...,"priority":...,"keys":COUNT}].
func (k *Keyring) MarshalJSON() ([]byte, error) {
	t := k.Tenants()
	if t == nil {
		t = []TenantInfo{}
	}
	return json.Marshal(t)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
