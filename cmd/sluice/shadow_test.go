package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/pgtest"
)

// shadowStore writes a small store file: 3 pairs and a rollback verdict on route chat, and
// 3 triples (with a baseline, loads measured) on route tri.
func shadowStore(t *testing.T) string {
	t.Helper()
	return shadowStoreAt(t, filepath.Join(t.TempDir(), "shadow.db"))
}

// shadowStoreAt writes shadowStore's pairs to the store at path (a file or a URL), mirrored
// by two gateways (instances gw-a and gw-b, in turn).
func shadowStoreAt(t *testing.T, path string) string {
	t.Helper()
	ctx := context.Background()
	st, err := shadow.OpenStore(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range 3 {
		p := shadow.Answer{Status: 200, TTFT: 40 * time.Millisecond, E2E: 400 * time.Millisecond, OutputTokens: 5, FinishReason: "stop", Text: "hello there"}
		c := p
		c.TTFT = 60 * time.Millisecond
		body := []byte(`{"model":"m","user":"carol","messages":[{"role":"user","content":"hi ` + string(rune('a'+i)) + `"}],"stream":true}`)
		rec := shadow.NewPairRecord("chat", t0.Add(time.Duration(i)*time.Second), body, p, c, nil, shadow.Compare(shadow.Request{}, p, c))
		rec.Instance = []string{"gw-a", "gw-b"}[i%2]
		if err := st.AddPair(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	cache := shadow.NewSchemaCache(8)
	for i := range 3 {
		p := shadow.Answer{Status: 200, TTFT: 40 * time.Millisecond, E2E: 400 * time.Millisecond, OutputTokens: 5, FinishReason: "stop", Text: "hello there"}
		b, c := p, p
		b.TTFT, b.Text = 42*time.Millisecond, "hello over there"
		c.TTFT = 60 * time.Millisecond
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		res := cache.CompareTriple(shadow.Request{}, p, &b, c)
		res.Loads = shadow.Loads{Primary: 5, Baseline: 2, Candidate: 3, Valid: true}
		rec := shadow.NewPairRecord("tri", t0.Add(time.Duration(i)*time.Second), body, p, c, nil, res)
		rec.SetBaseline(b)
		rec.Instance = []string{"gw-a", "gw-b"}[i%2]
		if err := st.AddPair(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	v := shadow.VerdictRecord{Route: "chat", Time: t0, Verdict: shadow.Verdict{Decision: shadow.Rollback, Reason: "regression: [ttft]",
		Evidence: []shadow.Evidence{{Metric: shadow.MetricTTFT, Test: shadow.StatMannWhitney, NPrimary: 60, NCandidate: 60, P: 1e-6, Effect: 0.5, Bound: 0.1, Verdict: shadow.Regression}}},
		Pairs: 60, Action: "weight 10→0"}
	if err := st.AddVerdict(ctx, v); err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeAdmin serves a report and an export like a gateway's admin listener, wanting token.
func fakeAdmin(t *testing.T, token string) string {
	t.Helper()
	rep := shadow.Report{Generated: time.Now().UTC(), Routes: []shadow.RouteReport{{Route: "chat", VerdictSource: shadow.SourceLive,
		Verdict: &shadow.Verdict{Decision: shadow.Promote, Reason: "no metric regressed"}}}}
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+token {
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"error":{"message":"admin API: missing or wrong bearer token"}}`))
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("GET /admin/shadow.json", auth(func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(rep) }))
	mux.HandleFunc("GET /admin/shadow/export", auth(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("route") != "chat" || r.URL.Query().Get("limit") != "5" {
			http.Error(w, "bad query "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte("{\"route\":\"chat\"}\n{\"route\":\"chat\"}\n"))
	}))
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestShadowCommand(t *testing.T) {
	store := shadowStore(t)
	admin := fakeAdmin(t, "s3cret")
	t.Setenv("SHADOW_TEST_TOKEN", "s3cret")
	t.Setenv("SHADOW_TEST_EMPTY", "")
	out := filepath.Join(t.TempDir(), "out")
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{"help", []string{"shadow", "--help"}, 0, nil, "sluice shadow report"},
		{"no subcommand", []string{"shadow"}, 1, nil, "give a subcommand"},
		{"report help", []string{"shadow", "report", "--help"}, 0, nil, "--store"},
		{"offline report", []string{"shadow", "report", "--store", store}, 0,
			[]string{"route chat", "decision: ROLLBACK", "regression", "action weight 10→0", "ttft"}, ""},
		{"offline report json", []string{"shadow", "report", "--store", store, "--json", "--html", out + ".html"}, 0,
			[]string{`"decision": "rollback"`, `"stored_pairs": 3`}, ""},
		{"offline report of triples", []string{"shadow", "report", "--store", store, "--route", "tri"}, 0,
			[]string{"route tri", "baseline errors 0", "noise floor 3 (primary against baseline)", "baseline n",
				"loads:    mean in flight per endpoint: baseline 2.0, candidate 3.0 (n 3)", "wilcoxon-signed-rank", "3 pairs"}, ""},
		{"offline export of triples", []string{"shadow", "export", "--store", store, "--route", "tri"}, 0,
			[]string{`"baseline":{"status":200,"ttft_ms":42`, `"noise_similarity":`, `"loads":{"primary":5,"baseline":2,"candidate":3}`}, "exported 3 pairs"},
		{"offline unknown route", []string{"shadow", "report", "--store", store, "--route", "nope"}, 0, []string{"route nope", "decision: NONE"}, ""},
		{"missing store", []string{"shadow", "report", "--store", filepath.Join(t.TempDir(), "typo.db")}, 1, nil, "no such file"},
		{"offline export", []string{"shadow", "export", "--store", store, "--route", "chat", "--limit", "2"}, 0,
			[]string{`{"route":"chat","ts":"2025-01-02T03:04:06Z"`, `"request":{"messages":[{"content":"hi b"`}, "exported 2 pairs"},
		{"export bad limit", []string{"shadow", "export", "--store", store, "--limit", "0"}, 1, nil, "--limit 0"},
		{"admin report", []string{"shadow", "report", "--admin", admin, "--token-env", "SHADOW_TEST_TOKEN"}, 0,
			[]string{"decision: PROMOTE"}, ""},
		{"admin without token", []string{"shadow", "report", "--admin", admin, "--token-env", "SHADOW_TEST_EMPTY"}, 1, nil,
			"wants a bearer token: set $SHADOW_TEST_EMPTY"},
		{"admin export", []string{"shadow", "export", "--admin", admin, "--token-env", "SHADOW_TEST_TOKEN", "--route", "chat", "--limit", "5"}, 0,
			[]string{`{"route":"chat"}`}, "exported 2 pairs"},
		{"admin unreachable", []string{"shadow", "report", "--admin", "http://127.0.0.1:1"}, 1, nil, "cannot reach the admin API"},
		{"admin bad url", []string{"shadow", "report", "--admin", "127.0.0.1:9090"}, 1, nil, "with its scheme"},
		{"admin wrong path", []string{"shadow", "report", "--admin", admin + "/nothing", "--token-env", "SHADOW_TEST_TOKEN"}, 1, nil, "has no /admin/shadow.json"},
		{"unknown subcommand", []string{"shadow", "frob"}, 1, nil, `unknown subcommand "frob"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o, e bytes.Buffer
			code := run(tt.args, &o, &e)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, o.String(), e.String())
			}
			for _, w := range tt.stdout {
				if !strings.Contains(o.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, o.String())
				}
			}
			if !strings.Contains(e.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, e.String())
			}
			if tt.name == "offline report json" {
				if b, err := os.ReadFile(out + ".html"); err != nil || !bytes.Contains(b, []byte(`class="banner rollback"`)) {
					t.Errorf("html report: %v", err)
				}
			}
		})
	}
}

// TestShadowCommandPostgres: `sluice shadow report|export --store postgres://…` read a store
// a fleet shares as they read a file, judged over every gateway's pairs; a bad or
// unreachable URL fails with what is wrong, never with its password.
func TestShadowCommandPostgres(t *testing.T) {
	pg := pgtest.Start(t)
	store := shadowStoreAt(t, pg.CreateDB(t, "shadow"))
	down := "postgres://sluice:topsecret@127.0.0.1:1/shadow?sslmode=disable&connect_timeout=2"
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{"report", []string{"shadow", "report", "--store", store}, 0,
			[]string{"store: postgres " + store + " (shared)", "route chat", "decision: ROLLBACK", "action weight 10→0",
				"scope:    fleet: every instance's pairs in the shared store (2 instances: gw-a 2, gw-b 1)"}, ""},
		{"report json", []string{"shadow", "report", "--store", store, "--json"}, 0,
			[]string{`"stored_pairs": 3`, `"scope": "fleet"`, `"instance": "gw-a"`, `"kind": "postgres"`}, ""},
		{"report of triples", []string{"shadow", "report", "--store", store, "--route", "tri"}, 0,
			[]string{"route tri", "noise floor 3 (primary against baseline)", "wilcoxon-signed-rank"}, ""},
		{"export", []string{"shadow", "export", "--store", store, "--route", "chat", "--limit", "2"}, 0,
			[]string{`{"route":"chat","ts":"2025-01-02T03:04:06Z"`, `"instance":"gw-b"`}, "exported 2 pairs"},
		{"bad url", []string{"shadow", "report", "--store", "postgres://sluice:topsecret@db/shadow?sslmode=sometimes"}, 1, nil, "sslmode"},
		{"unreachable", []string{"shadow", "report", "--store", down}, 1, nil, "postgres://sluice:xxxxx@127.0.0.1:1/shadow"},
		{"export unreachable", []string{"shadow", "export", "--store", down}, 1, nil, "--store: shadow store"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var o, e bytes.Buffer
			code := run(tt.args, &o, &e)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, o.String(), e.String())
			}
			for _, w := range tt.stdout {
				if !strings.Contains(o.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, o.String())
				}
			}
			if !strings.Contains(e.String(), tt.stderr) || strings.Contains(e.String()+o.String(), "topsecret") {
				t.Errorf("stderr lacks %q, or shows the password:\n%s", tt.stderr, e.String())
			}
		})
	}
}
