package ratelimit

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	keyA1 = "sk-alpha-0123456789abcdef"
	keyA2 = "sk-alpha-second-key-zzzz"
	keyB1 = "sk-bravo-from-file-111111"
	keyB2 = "sk-bravo-from-file-222222"
)

func testKeyring(t *testing.T) *Keyring {
	t.Helper()
	t.Setenv("RL_TEST_KEYS_A", " "+keyA1+" ,"+keyA2+",, ")
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("# team b\n"+keyB1+"\n\n  "+keyB2+"  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := NewKeyring([]TenantSpec{
		{Name: "team-a", KeysEnv: "RL_TEST_KEYS_A", Priority: 2},
		{Name: "team-b", KeysFile: file, Priority: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeyringIdentify(t *testing.T) {
	k := testKeyring(t)
	tests := []struct {
		name, header, value string
		want                string
	}{
		{"bearer", "Authorization", "Bearer " + keyA1, "team-a"},
		{"bearer lower case", "Authorization", "bearer " + keyA2, "team-a"},
		{"file key", "Authorization", "Bearer " + keyB2, "team-b"},
		{"api-key", "api-key", keyB1, "team-b"},
		{"x-api-key", "X-Api-Key", keyA1, "team-a"},
		{"unknown", "Authorization", "Bearer sk-nope", ""},
		{"prefix of a key", "Authorization", "Bearer " + keyA1[:10], ""},
		{"key plus suffix", "Authorization", "Bearer " + keyA1 + "x", ""},
		{"basic auth", "Authorization", "Basic " + keyA1, ""},
		{"empty bearer", "Authorization", "Bearer ", ""},
		{"no header", "", "", ""},
	}
	for _, tc := range tests {
		h := http.Header{}
		if tc.header != "" {
			h.Set(tc.header, tc.value)
		}
		got, ok := k.Identify(h)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: Identify = %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
	var nilK *Keyring
	if _, ok := nilK.Identify(http.Header{"Authorization": {"Bearer " + keyA1}}); ok {
		t.Error("a nil keyring identified a key")
	}
	if ti, ok := k.Tenant("team-a"); !ok || ti.Keys != 2 || ti.Priority != 2 {
		t.Errorf("Tenant = %+v %v", ti, ok)
	}
	if ts := k.Tenants(); len(ts) != 2 || ts[1].Name != "team-b" || ts[1].Keys != 2 {
		t.Errorf("Tenants = %+v", ts)
	}
}

// TestKeyringNeverLeaks prints, logs and marshals a Keyring and its Tenants every way and
// looks for the keys.
func TestKeyringNeverLeaks(t *testing.T) {
	k := testKeyring(t)
	tenant := Tenant{Name: "team-a", Keys: []string{keyA1, keyA2}, Priority: 2}
	var out []string
	for _, v := range []any{k, *k, tenant, &tenant, []Tenant{tenant}, map[string]*Keyring{"k": k}} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
			out = append(out, fmt.Sprintf(verb, v))
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "v", v)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "v", v)
		out = append(out, buf.String())
	}
	all := strings.Join(out, "\n")
	digests := []string{}
	for _, key := range []string{keyA1, keyA2, keyB1, keyB2} {
		d := sha256.Sum256([]byte(key))
		digests = append(digests, fmt.Sprintf("%x", d[:4]), strings.Trim(fmt.Sprint(d[:4]), "[]"), fmt.Sprintf("%X", d[:4]))
	}
	for _, key := range append([]string{keyA1, keyA2, keyB1, keyB2, "alpha", "bravo"}, digests...) {
		if strings.Contains(all, key) {
			t.Errorf("output contains key material %q:\n%s", key, all)
		}
	}
	if got := k.String(); got != "Keyring{team-a: 2 keys, team-b: 2 keys}" {
		t.Errorf("String = %q", got)
	}
	if got := fmt.Sprint(tenant); got != "team-a(priority 2, 2 keys)" {
		t.Errorf("Tenant = %q", got)
	}
	b, _ := json.Marshal(k)
	if string(b) != `[{"name":"team-a","priority":2,"keys":2},{"name":"team-b","priority":1,"keys":2}]` {
		t.Errorf("JSON = %s", b)
	}
}

func TestNewKeyringListsEveryProblem(t *testing.T) {
	t.Setenv("RL_TEST_EMPTY", " , ")
	t.Setenv("RL_TEST_SHARED", "sk-shared-secret-1")
	t.Setenv("RL_TEST_SHARED2", "sk-shared-secret-1")
	t.Setenv("RL_TEST_OK", "sk-ok-secret-1")
	emptyFile := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(emptyFile, []byte("# nothing\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := NewKeyring([]TenantSpec{
		{Name: "", KeysEnv: "RL_TEST_OK"},
		{Name: "nosource"},
		{Name: "unset", KeysEnv: "RL_TEST_UNSET_VARIABLE"},
		{Name: "empty", KeysEnv: "RL_TEST_EMPTY"},
		{Name: "nofile", KeysFile: filepath.Join(t.TempDir(), "missing")},
		{Name: "emptyfile", KeysFile: emptyFile},
		{Name: "one", KeysEnv: "RL_TEST_SHARED"},
		{Name: "two", KeysEnv: "RL_TEST_SHARED2"},
		{Name: "one", KeysEnv: "RL_TEST_OK"},
	})
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{
		"tenants[0]: name required",
		"tenant nosource: set keys_env or keys_file",
		"tenant unset: keys_env: environment variable RL_TEST_UNSET_VARIABLE is not set",
		"tenant empty: keys_env: environment variable RL_TEST_EMPTY holds no keys",
		"tenant nofile: keys_file: ", "no such file",
		"tenant emptyfile: keys_file: ", "holds no keys",
		"tenant two: a key is also a key of tenant one",
		"tenant one: defined twice",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "secret") {
		t.Errorf("error quotes a key:\n%s", msg)
	}

	if _, err := KeyringOf(Tenant{Keys: []string{"k"}}); err == nil {
		t.Error("KeyringOf accepted a tenant without a name")
	}
	if k, err := NewKeyring(nil); err != nil || k.String() != "Keyring{}" {
		t.Errorf("empty keyring: %v %v", k, err)
	}
}
