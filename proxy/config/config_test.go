package config

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

const minimal = `
clusters:
  - name: a
    endpoints: [{url: "http://127.0.0.1:8000"}]
routes:
  - {name: r, cluster: a}
`

func TestParseAppliesDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", c.Listen, DefaultListen},
		{"admin.listen", c.Admin.Listen, DefaultAdminListen},
		{"admin.token_env", c.Admin.TokenEnv, DefaultAdminTokenEnv},
		{"max_body_bytes", int64(c.MaxBodyBytes), int64(DefaultMaxBodyBytes)},
		{"heap_floor", int64(c.HeapFloor), int64(DefaultHeapFloor)},
		{"drain_timeout", c.DrainTimeout.D(), DefaultDrainTimeout},
		{"timeouts.ttft", c.Timeouts.TTFT.D(), DefaultTTFTTimeout},
		{"route timeouts inherit", NewSnapshot(c).Routes[0].Timeouts.Idle.D(), DefaultIdleTimeout},
		{"health path (auto: /health, then /v1/models)", c.Clusters[0].HealthCheck.Path, ""},
		{"outlier failures", c.Clusters[0].Outlier.ConsecutiveFailures, DefaultOutlierConsecutiveFailures},
		{"endpoint weight", c.Clusters[0].Endpoints[0].Weight, 1},
		{"route prefix", c.Routes[0].Match.PathPrefix, "/"},
	}
	for _, ck := range checks {
		if !reflect.DeepEqual(ck.got, ck.want) {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	if c.Version == "" {
		t.Error("version not set")
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	t.Setenv("SLUICE_TEST_EMPTY", "")
	bad := `
listen: "nope"
procs: auto
admin: {listen: "0.0.0.0:9090", token_env: SLUICE_TEST_EMPTY, metrics_token_env: SLUICE_TEST_EMPTY, ready_clusters: [nope, b]}
max_body_bytes: 10
heap_floor: 1MiB
timeouts: {ttft: -1s}
clusters:
  - name: a
    endpoints: [{url: "ftp://x"}, {url: "http://h:1"}, {url: "http://h:1"}]
    outlier: {base_ejection: 10s, max_ejection: 1s, max_ejection_percent: 150}
    health_check: {path: health}
    api_key_env: SLUICE_TEST_EMPTY
  - name: a
    endpoints: []
  - endpoints: [{url: "http://h:2", metrics: "::"}, {url: "http://u:p@h:3", weight: 20000}]
  - {name: b, endpoints: [{url: "http://h:4"}], health_check: {disabled: true}, http_client: curl}
routes:
  - {name: r1, cluster: x}
  - {name: r1, cluster: a, match: {path_prefix: v1, model: "[", headers: {"bad name": v}}}
  - {name: r3}
`
	_, err := Parse([]byte(bad))
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want ValidationError, got %v", err)
	}
	want := []string{
		`listen: "nope" is not host:port`,
		`procs: "auto" is not a sizing (adaptive, fixed)`,
		`admin.listen: "0.0.0.0:9090" is not a loopback address, so a bearer token is required: set SLUICE_TEST_EMPTY`,
		`max_body_bytes: 10 is too small`,
		`heap_floor: 1048576 is out of range (4MiB, the runtime's own sizing, to 4GiB)`,
		`timeouts.ttft: must not be negative`,
		`clusters[0].endpoints[0].url: "ftp://x": scheme must be http or https`,
		`clusters[0].endpoints[2].url: duplicate endpoint "http://h:1"`,
		`clusters[0].health_check.path: must start with /`,
		`clusters[0].outlier.max_ejection: 1s is shorter than base_ejection 10s`,
		`clusters[0].outlier.max_ejection_percent: 150 is not within 0..100`,
		`clusters[0].api_key_env: environment variable SLUICE_TEST_EMPTY is empty or unset`,
		`clusters[1].name: duplicate cluster "a"`,
		`clusters[1].endpoints: at least one endpoint is required`,
		`clusters[2].name: required`,
		`clusters[2].endpoints[0].metrics: "::": missing protocol scheme`,
		`clusters[2].endpoints[1].url: "http://u:p@h:3": must not contain user info`,
		`clusters[2].endpoints[1].weight: 20000 is not within 1..10000`,
		`clusters[3].http_client: "curl" is not a client (sluice, net/http)`,
		`admin.ready_clusters[0]: unknown cluster "nope"`,
		`admin.ready_clusters[1]: cluster "b" has no active health check, so its readiness is unknown`,
		`admin.metrics_token_env: SLUICE_TEST_EMPTY is not set (or empty)`,
		`routes[0].cluster: unknown cluster "x"`,
		`routes[1].name: duplicate route "r1"`,
		`routes[1].match.path_prefix: must start with /`,
		`routes[1].match.model: invalid glob "["`,
		`routes[1].match.headers: invalid header name "bad name"`,
		`routes[2].cluster: required`,
	}
	for _, w := range want {
		found := false
		for _, p := range ve.Problems {
			if strings.HasPrefix(p, w) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("missing problem %q", w)
		}
	}
	if len(ve.Problems) != len(want) {
		t.Errorf("got %d problems, want %d:\n%s", len(ve.Problems), len(want), strings.Join(ve.Problems, "\n"))
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown key", "listn: x\n" + minimal, `line 1:1: listn: unknown key (did you mean "listen"?)`},
		{"bad duration", "drain_timeout: soon\n" + minimal, `line 1:16: drain_timeout: invalid duration "soon"`},
		{"bad size", "max_body_bytes: 12XB\n" + minimal, `line 1:17: max_body_bytes: invalid size`},
		{"wrong type", "clusters: 5\n", `line 1:11: clusters: expected a list, got "5"`},
		{"empty", "", "at least one cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestDurationsAndSizes(t *testing.T) {
	c, err := Parse([]byte("drain_timeout: 2.5\nmax_body_bytes: 2MiB\nmax_event_bytes: 4096\n" + minimal))
	if err != nil {
		t.Fatal(err)
	}
	if c.DrainTimeout.D() != 2500*time.Millisecond {
		t.Errorf("drain_timeout = %v", c.DrainTimeout.D())
	}
	if c.MaxBodyBytes != 2<<20 || c.MaxEventBytes != 4096 {
		t.Errorf("sizes = %d %d", c.MaxBodyBytes, c.MaxEventBytes)
	}
}

func TestTimeoutsResolveRouteThenClusterThenGlobal(t *testing.T) {
	c, err := Parse([]byte(`
timeouts: {ttft: 9s, idle: 9s, total: 9s, connect: 9s}
clusters:
  - name: a
    endpoints: [{url: "http://127.0.0.1:1"}]
    timeouts: {ttft: 5s}
routes:
  - {name: r, cluster: a, timeouts: {idle: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := NewSnapshot(c).Routes[0].Timeouts
	want := Timeouts{Connect: Duration(9 * time.Second), TTFT: Duration(5 * time.Second), Idle: Duration(time.Second), Total: Duration(9 * time.Second)}
	if got != want {
		t.Fatalf("timeouts = %+v, want %+v", got, want)
	}
}

func TestRouteMatching(t *testing.T) {
	c, err := Parse([]byte(`
clusters:
  - {name: a, endpoints: [{url: "http://127.0.0.1:1"}]}
routes:
  - {name: gray, cluster: a, match: {path_prefix: /v1/chat/, headers: {x-gray-flag: v2}}}
  - {name: any-flag, cluster: a, match: {headers: {X-Canary: "*"}}}
  - {name: llama, cluster: a, match: {path_prefix: /v1/, model: "llama-3*"}}
  - {name: exact, cluster: a, match: {model: "qwen"}}
  - {name: embed, cluster: a, match: {path_prefix: /v1/embeddings}}
`))
	if err != nil {
		t.Fatal(err)
	}
	s := NewSnapshot(c)
	tests := []struct {
		path, model string
		hdr         http.Header
		want        string
	}{
		{"/v1/chat/completions", "llama-3-8b", http.Header{"X-Gray-Flag": {"v2"}}, "gray"},
		{"/v1/chat/completions", "llama-3-8b", http.Header{"X-Gray-Flag": {"v3"}}, "llama"},
		{"/v1/completions", "x", http.Header{"X-Canary": {"yes"}}, "any-flag"},
		{"/v1/completions", "llama-3.1", nil, "llama"},
		{"/v1/chat/completions", "qwen", nil, "exact"},
		{"/v1/chat/completions", "qwen2", nil, ""},
		{"/v1/embeddings", "e5", nil, "embed"},
		{"/other", "llama-3", nil, ""},
	}
	for _, tt := range tests {
		got := ""
		if r := s.Route(tt.path, tt.model, tt.hdr); r != nil {
			got = r.Name
		}
		if got != tt.want {
			t.Errorf("Route(%s, %s, %v) = %q, want %q", tt.path, tt.model, tt.hdr, got, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { s.Route("/v1/chat/completions", "llama-3-8b", http.Header{}) }); n > 1 {
		t.Errorf("Route allocates %v times", n)
	}
}

func TestFromUpstreams(t *testing.T) {
	c, err := FromUpstreams("127.0.0.1:0", "127.0.0.1:0", []string{"http://127.0.0.1:8000", "http://127.0.0.1:8001"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Clusters) != 1 || len(c.Clusters[0].Endpoints) != 2 || len(c.Routes) != 1 {
		t.Fatalf("config = %+v", c)
	}
	if _, err := FromUpstreams("127.0.0.1:0", "127.0.0.1:0", []string{"localhost:8000"}, ""); err == nil {
		t.Fatal("a URL without scheme must be rejected")
	}
	if p := c.Clusters[0].HealthCheck.Path; p != "" {
		t.Errorf("default health path %q, want \"\" (auto)", p)
	}
	c2, err := FromUpstreams("127.0.0.1:0", "127.0.0.1:0", []string{"http://127.0.0.1:8000"}, "/ready")
	if err != nil || c2.Clusters[0].HealthCheck.Path != "/ready" || c2.Version == c.Version {
		t.Fatalf("--health-path /ready: %v %+v", err, c2.Clusters[0].HealthCheck)
	}
	if _, err := FromUpstreams("127.0.0.1:0", "127.0.0.1:0", []string{"http://127.0.0.1:8000"}, "ready"); err == nil {
		t.Error("a health path without a leading / must be rejected")
	}
}

func TestSecretsAreRedacted(t *testing.T) {
	t.Setenv("SLUICE_TEST_KEY", "sk-very-secret")
	c, err := Parse([]byte(`
clusters:
  - {name: a, endpoints: [{url: "http://127.0.0.1:1"}], api_key_env: SLUICE_TEST_KEY}
routes: [{cluster: a}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Clusters[0].APIKey.Reveal() != "sk-very-secret" {
		t.Fatal("key not read from env")
	}
	for _, s := range []string{c.Clusters[0].APIKey.String(), mustJSON(t, c)} {
		if strings.Contains(s, "sk-very-secret") {
			t.Fatalf("secret leaked: %s", s)
		}
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	matches, _ := filepath.Glob("../../examples/*.yaml")
	if len(matches) == 0 {
		t.Fatal("no examples/*.yaml")
	}
	for _, m := range matches {
		if _, err := LoadFile(m); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
}

// TestReadmeDocumentsEveryKey keeps the config reference (docs/config.md) and the structs in
// step.
func TestReadmeDocumentsEveryKey(t *testing.T) {
	readme, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	collectKeys(reflect.TypeFor[Config](), "", &keys)
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.Contains(string(readme), "`"+k+"`") {
			t.Errorf("docs/config.md lacks `%s`", k)
		}
	}
}

func collectKeys(t reflect.Type, prefix string, out *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		parts := strings.Split(f.Tag.Get("yaml"), ",")
		tag := parts[0]
		if len(parts) > 1 && parts[1] == "inline" {
			collectKeys(f.Type, prefix, out)
			continue
		}
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		*out = append(*out, key)
		ft := f.Type
		if ft.Kind() == reflect.Slice || ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			collectKeys(ft, key+".", out)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestValidateMirror(t *testing.T) {
	for _, tc := range []struct {
		name, mirror, splits string
		want                 []string
	}{
		{"valid", `{cluster: cand, fraction: 0.2, set_headers: {x-env: shadow}}`, "", nil},
		{"bounds", `{cluster: cand, fraction: 0, replica_fraction: 2, max_concurrency: 5000, capture_bytes: 10}`, "", []string{
			"mirror.fraction: 0 is not within (0, 1]", "mirror.replica_fraction: 2 is not within [0, 1]",
			"mirror.max_concurrency: 5000 is not within 1..4096", "mirror.capture_bytes: 10 is too small"}},
		{"valid baseline", `{cluster: cand, baseline: base, fraction: 1, abnormal_finish: [content_filter, missing]}`, "", nil},
		{"baseline problems", `{cluster: cand, baseline: nope, fraction: 1}`, "", []string{`mirror.baseline: unknown cluster "nope"`}},
		{"baseline is the candidate", `{cluster: cand, baseline: cand, fraction: 1}`, "", []string{`mirror.baseline: "cand" is the candidate's cluster`}},
		{"baseline is production", `{cluster: cand, baseline: main, fraction: 1}`, "", []string{`mirror.baseline: "main" is the route's own cluster`}},
		{"baseline and replica", `{cluster: cand, baseline: base, fraction: 1, replica_fraction: 0.1, abnormal_finish: [""]}`, "", []string{
			"mirror.replica_fraction: not with a baseline", `mirror.abnormal_finish[0]: "" is not a finish reason`}},
		{"capture_total below capture_bytes", `{cluster: cand, fraction: 1, capture_bytes: 2MiB, capture_total: 1MiB}`, "", []string{
			"mirror.capture_total: 1048576 is less than capture_bytes (2097152)"}},
		{"unknown and own cluster", `{cluster: nope, fraction: 1}`, "", []string{`mirror.cluster: unknown cluster "nope"`}},
		{"own cluster", `{cluster: main, fraction: 1}`, "", []string{`mirror.cluster: "main" is the route's own cluster`}},
		{"credentials in set_headers", `{cluster: cand, fraction: 1, set_headers: {X-Goog-Api-Key: k, Authorization: b}}`, "", []string{
			"set_headers.X-Goog-Api-Key: credentials for the sandbox come from its cluster's api_key",
			"set_headers.Authorization: credentials for the sandbox come from its cluster's api_key"}},
		{"progression without a split", `{cluster: cand, fraction: 1, progression: {step: 10, interval: 1m, max: 50}}`, "",
			[]string{`mirror.progression.split: no split of this route sends to "cand"`}},
		{"progression", `{cluster: cand, fraction: 1, progression: {step: 0, max: 0}}`,
			"    splits: [{cluster: main, weight: 100}, {cluster: cand, weight: 0}]\n",
			[]string{"progression.step: 0 must be at least 1", "progression.max: 0 must be at least 1", "progression.interval: required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := "clusters:\n  - {name: main, endpoints: [{url: \"http://h:1\"}]}\n  - {name: cand, endpoints: [{url: \"http://h:2\"}]}\n" +
				"  - {name: base, endpoints: [{url: \"http://h:3\"}]}\n" +
				"routes:\n  - name: chat\n    cluster: main\n" + tc.splits + "    mirror: " + tc.mirror + "\n"
			c, err := Parse([]byte(y))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if m := c.Routes[0].Mirror; m.MaxQueue != DefaultMirrorMaxQueue || m.CaptureBytes != DefaultMirrorCaptureBytes ||
					m.MaxConcurrency != DefaultMirrorMaxConcurrency || m.CaptureTotal != DefaultMirrorCaptureTotal {
					t.Errorf("defaults not applied: %+v", m)
				}
				return
			}
			if err == nil {
				t.Fatal("invalid mirror accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nlacks %q", err, w)
				}
			}
		})
	}
}

// TestValidateShadowStore: a PostgreSQL store is checked when the config is built (every
// problem at once, the password never in them) without being connected to; the shadow
// block's other keys are bounded.
func TestValidateShadowStore(t *testing.T) {
	for _, tc := range []struct {
		name, shadow string
		want         []string
	}{
		{"file", `{store: /var/lib/sluice/shadow.db}`, nil},
		// Nothing listens on port 1: building the config must not try.
		{"postgres", `{store: "postgres://sluice:pw@127.0.0.1:1/shadow?sslmode=disable&connect_timeout=2", instance: gw-1, buffer: 16MiB}`, nil},
		{"postgresql", `{store: "postgresql:///shadow?host=/run/postgresql"}`, nil},
		{"bad URL", `{store: "postgres://sluice:topsecret@db/shadow?sslmode=always", instance: "gw\u0001", buffer: 1MiB}`, []string{
			"shadow.store: postgres://sluice:xxxxx@db/shadow?sslmode=always: ", "sslmode",
			`shadow.instance: "gw\x01": at most 256 bytes`, "shadow.buffer: 1048576 is too small"}},
		{"other scheme", `{store: "mysql://u:topsecret@db/shadow"}`, []string{`shadow.store: a "mysql://" URL: give a SQLite file, or a postgres://`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(minimal + "shadow: " + tc.shadow + "\n"))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if c.Shadow.Buffer < MinShadowBuffer {
					t.Errorf("buffer %d", c.Shadow.Buffer)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nlacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "topsecret") {
				t.Errorf("the password is in the problems: %v", err)
			}
		})
	}
	c, err := Parse([]byte(minimal + "shadow: {store: \"postgres://sluice:topsecret@db/shadow\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Shadow.Buffer != DefaultShadowBuffer {
		t.Errorf("default buffer %d", c.Shadow.Buffer)
	}
	y, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{mustJSON(t, c), string(y)} {
		if strings.Contains(s, "topsecret") || !strings.Contains(s, "postgres://sluice:xxxxx@db/shadow") {
			t.Errorf("the store's password is not masked: %s", s)
		}
	}
	if !strings.Contains(c.Shadow.Store, "topsecret") {
		t.Error("the config lost the password it must connect with")
	}
}
