package server

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"

	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
	"github.com/sluicegw/sluice/test/pgtest"

	_ "modernc.org/sqlite" // to make the store unreadable underneath it
)

func TestNextWeight(t *testing.T) {
	p := config.Progression{Split: "cand", Step: 10, Max: 30, Interval: config.Duration(time.Minute)}
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		decision shadow.Decision
		cur      int
		stepped  time.Time
		want     int
	}{
		{"first promote steps at once", shadow.Promote, 0, time.Time{}, 10},
		{"promote a full interval later", shadow.Promote, 10, now.Add(-time.Minute), 20},
		{"promote within the interval waits", shadow.Promote, 10, now.Add(-59 * time.Second), 10},
		{"promote stops at max", shadow.Promote, 25, time.Time{}, 30},
		{"promote at max holds", shadow.Promote, 30, time.Time{}, 30},
		{"promote above max (the file's) holds", shadow.Promote, 40, time.Time{}, 40},
		{"rollback sets 0 at once", shadow.Rollback, 20, now, 0},
		{"rollback at 0 holds", shadow.Rollback, 0, time.Time{}, 0},
		{"hold keeps", shadow.Hold, 20, time.Time{}, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextWeight(tc.decision, tc.cur, p, tc.stepped, now); got != tc.want {
				t.Errorf("nextWeight(%s, %d) = %d, want %d", tc.decision, tc.cur, got, tc.want)
			}
		})
	}
}

// progressConfig is testdata/progression.yaml with its placeholders replaced.
func progressConfig(t testing.TB, cand string, weight, maxWeight int, embed string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "progression.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer("CAND", cand, "WEIGHT", fmt.Sprint(weight), "MAX", fmt.Sprint(maxWeight), "EMBED", embed).Replace(string(b))
}

func parseConfig(t *testing.T, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestKeptOverlay(t *testing.T) {
	old := parseConfig(t, progressConfig(t, "cand", 10, 30, "embed"))
	for _, tc := range []struct {
		name    string
		next    string
		dropped bool
	}{
		{"another route changes", progressConfig(t, "cand", 10, 30, "main"), false},
		{"the progression's max changes", progressConfig(t, "cand", 10, 50, "embed"), false},
		{"the candidate's file weight changes", progressConfig(t, "cand", 20, 30, "embed"), true},
		{"the primary's weight changes", strings.Replace(progressConfig(t, "cand", 10, 30, "embed"), "weight: 100", "weight: 90", 1), true},
		{"a new candidate", progressConfig(t, "next", 10, 30, "embed"), true},
		{"a baseline added", strings.Replace(progressConfig(t, "cand", 10, 30, "embed"), "fraction: 1,", "fraction: 1, baseline: next,", 1), true},
		{"no progression any more", strings.Replace(progressConfig(t, "cand", 10, 30, "embed"), ", progression: {step: 10, interval: 1m, max: 30}", "", 1), true},
		{"the route is gone", strings.Replace(progressConfig(t, "cand", 10, 30, "embed"), "name: chat", "name: talk", 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept, dropped := keptOverlay(old, parseConfig(t, tc.next), map[string]int{"chat": 0})
			if _, ok := kept["chat"]; ok == tc.dropped || slices.Equal(dropped, []string{"chat"}) != tc.dropped {
				t.Errorf("kept %v, dropped %v; want dropped=%v", kept, dropped, tc.dropped)
			}
		})
	}
}

func TestWithWeights(t *testing.T) {
	c := parseConfig(t, progressConfig(t, "cand", 10, 30, "embed"))
	eff := withWeights(c, map[string]int{"chat": 25, "embeddings": 3})
	if w, _ := weightOf(*findRoute(eff, "chat")); w != 25 {
		t.Errorf("chat's candidate at %d, want 25", w)
	}
	if w, _ := weightOf(*findRoute(c, "chat")); w != 10 {
		t.Errorf("the file's config changed: chat's candidate at %d, want 10", w)
	}
	if r := findRoute(eff, "embeddings"); len(r.Splits) != 0 || r.Cluster != "embed" {
		t.Errorf("a route without a progression changed: %+v", r)
	}
	if withWeights(c, nil) != c {
		t.Error("no overlay: not the file's config itself")
	}
}

// storePairs stores n pairs of the route's candidate, alternately mirrored by gw-a and gw-b,
// the candidate's TTFT slower by slower (each pair its own latency, a few ms apart).
func storePairs(t testing.TB, st *shadow.Store, candidate string, n int, slower time.Duration, t0 time.Time) {
	t.Helper()
	for i := range n {
		p := shadow.Answer{Status: 200, TTFT: time.Duration(40+i%9) * time.Millisecond, ITL: 5 * time.Millisecond,
			E2E: time.Duration(200+i%11) * time.Millisecond, OutputTokens: 32, FinishReason: "stop", Text: "the quick brown fox jumps over the lazy dog"}
		c := p
		c.TTFT += slower
		c.E2E += slower
		rep := p
		rec := shadow.NewPairRecord("chat", t0.Add(time.Duration(i)*time.Millisecond), []byte(`{"model":"m"}`), p, c, &rep, shadow.Compare(shadow.Request{}, p, c))
		rec.CandidateID, rec.Instance = candidate, []string{"gw-a", "gw-b"}[i%2]
		if err := st.AddPair(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
}

// chatWeight is the weight of cluster in route chat of a RouteConfiguration response (-1 when
// the response has no such split).
func chatWeight(t *testing.T, r *discoverygrpc.DeltaDiscoveryResponse, cluster string) int {
	t.Helper()
	if r.GetTypeUrl() != resource.RouteType {
		return -1
	}
	for _, res := range r.GetResources() {
		rc := &routev3.RouteConfiguration{}
		if err := res.GetResource().UnmarshalTo(rc); err != nil {
			t.Fatal(err)
		}
		for _, vh := range rc.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if rt.GetName() != "chat" {
					continue
				}
				for _, cw := range rt.GetRoute().GetWeightedClusters().GetClusters() {
					if cw.GetName() == cluster {
						return int(cw.GetWeight().GetValue())
					}
				}
			}
		}
	}
	return -1
}

// embeddingsCluster is the cluster of route embeddings in a RouteConfiguration response.
func embeddingsCluster(t *testing.T, r *discoverygrpc.DeltaDiscoveryResponse) string {
	t.Helper()
	if r.GetTypeUrl() != resource.RouteType {
		return ""
	}
	for _, res := range r.GetResources() {
		rc := &routev3.RouteConfiguration{}
		if err := res.GetResource().UnmarshalTo(rc); err != nil {
			t.Fatal(err)
		}
		for _, vh := range rc.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if rt.GetName() == "embeddings" {
					return rt.GetRoute().GetCluster()
				}
			}
		}
	}
	return ""
}

// TestProgression runs the control plane's progression on a store two gateways filled: the
// judgement before serving rolls a regressed candidate back (its first snapshot has weight 0),
// an unrelated file change keeps the weight, a new candidate starts from the file's weight and
// is promoted a step per interval up to max, every change pushed to the nodes and recorded in
// the store as the verdict's action; a file change of the route's weights resets them.
func TestProgression(t *testing.T) {
	defer goleak.VerifyNone(t)
	st, storePath, file := sqliteStore(t)
	defer st.Close()
	t0 := time.Now().Add(-time.Hour)
	storePairs(t, st, "cand", 40, 60*time.Millisecond, t0)
	writeFile(t, file, progressConfig(t, "cand", 10, 30, "embed"))

	t.Run("serve", func(t *testing.T) {
		s, addr := startServerWith(t, Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: storePath})
		fileV1 := s.Status().FileVersion
		c := dialDelta(t, addr, "replica-1")
		first := c.await("the first route configuration", func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
			return r.GetTypeUrl() == resource.RouteType
		})
		if w := chatWeight(t, first, "cand"); w != 0 {
			t.Fatalf("the first snapshot sends the candidate at weight %d: want it rolled back (0) before serving", w)
		}
		status := s.Status()
		rp := status.Progression.Routes
		if !status.Progression.On || len(rp) != 1 || rp[0].Weight != 0 || rp[0].FileWeight != 10 || !rp[0].Overridden ||
			rp[0].Verdict == nil || rp[0].Verdict.Decision != shadow.Rollback || len(rp[0].Steps) != 1 ||
			rp[0].Steps[0].From != 10 || rp[0].Steps[0].To != 0 || status.Version != fileV1+"+p1" || rp[0].Candidate != "cand" {
			t.Fatalf("after the first judgement: %+v", status)
		}
		if src := rp[0].Verdict.Sources; len(src) != 2 || src[0].Instance != "gw-a" || src[1].Instance != "gw-b" {
			t.Errorf("sources %+v: want both gateways'", src)
		}
		waitVerdict(t, st, "weight cand 10→0", "cand")

		// Another route changes: the control plane's weight stays.
		writeFile(t, file, progressConfig(t, "cand", 10, 30, "main"))
		if changed, err := s.Reload(context.Background()); !changed || err != nil {
			t.Fatalf("Reload: %v, %v", changed, err)
		}
		if st := s.Status(); st.Progression.Routes[0].Weight != 0 || st.FileVersion == fileV1 || !strings.HasSuffix(st.Version, "+p1") {
			t.Fatalf("after an unrelated change: %+v", st)
		}
		c.await("the new route config, the candidate still at 0", func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
			return chatWeight(t, r, "cand") == 0 && embeddingsCluster(t, r) == "main"
		})

		// A new candidate, at weight 0 in the file: promoted one step an interval, up to 30.
		storePairs(t, st, "next", 40, 0, t0)
		writeFile(t, file, progressConfig(t, "next", 0, 30, "main"))
		if changed, err := s.Reload(context.Background()); !changed || err != nil {
			t.Fatalf("Reload: %v, %v", changed, err)
		}
		if st := s.Status(); st.Progression.Routes[0].Overridden || st.Version != st.FileVersion {
			t.Fatalf("a new candidate kept the old weights: %+v", st)
		}
		now := time.Now()
		for i, want := range []struct {
			after  time.Duration
			weight int
		}{{0, 10}, {30 * time.Second, 10}, {time.Minute, 20}, {2 * time.Minute, 30}, {3 * time.Minute, 30}} {
			changed := s.judgeAll(context.Background(), now.Add(want.after))
			got := s.Status().Progression.Routes[0]
			if got.Weight != want.weight {
				t.Fatalf("judgement %d (+%v): weight %d, want %d (verdict %+v, error %q)", i, want.after, got.Weight, want.weight, got.Verdict, got.Error)
			}
			if changed > 0 {
				// Awaited at once: a node that has not ACKed one push gets only the newest.
				c.await(fmt.Sprintf("weight %d pushed", want.weight), func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
					return chatWeight(t, r, "next") == want.weight
				})
			}
		}
		steps := s.Status().Progression.Routes[0].Steps
		var got []string
		for _, sp := range steps {
			got = append(got, sp.Action)
		}
		if want := []string{"weight cand 10→0", "weight next 0→10", "weight next 10→20", "weight next 20→30"}; !slices.Equal(got, want) {
			t.Errorf("steps %q, want %q", got, want)
		}
		waitVerdict(t, st, "weight next 20→30", "next")

		// The file changes the route's weights: they are the file's again.
		writeFile(t, file, progressConfig(t, "next", 5, 30, "main"))
		if changed, err := s.Reload(context.Background()); !changed || err != nil {
			t.Fatalf("Reload: %v, %v", changed, err)
		}
		c.await("the file's weight", func(r *discoverygrpc.DeltaDiscoveryResponse) bool { return chatWeight(t, r, "next") == 5 })
		if st := s.Status(); st.Progression.Routes[0].Overridden || st.Progression.Routes[0].SteppedAt != nil {
			t.Errorf("after the file changed the weights: %+v", st.Progression.Routes[0])
		}
	})
}

// waitVerdict waits (bounded) for the control plane's newest verdict of route chat in the
// store to have action, for candidate.
func waitVerdict(t *testing.T, st *shadow.Store, action, candidate string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		vs, err := st.Verdicts(context.Background(), "chat", 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			if v.Instance == Instance && v.Action == action {
				if v.CandidateID != candidate || v.Pairs != 40 || len(v.Verdict.Evidence) == 0 {
					t.Fatalf("verdict %+v: want candidate %s over 40 pairs, with its evidence", v, candidate)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no verdict with action %q in the store: %+v", action, vs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProgressionStoreDown: a store that cannot be opened leaves the file's weights and says
// why in the status.
func TestProgressionStoreDown(t *testing.T) {
	defer goleak.VerifyNone(t)
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, file, progressConfig(t, "cand", 10, 30, "embed"))
	t.Run("serve", func(t *testing.T) {
		// A folder that does not exist: the store never opens.
		s, _ := startServerWith(t, Options{ConfigPath: file, WatchInterval: time.Hour, StoreWait: 50 * time.Millisecond,
			ShadowStore: filepath.Join(t.TempDir(), "missing", "shadow.db")})
		st := s.Status()
		rp := st.Progression.Routes
		if !st.Progression.On || len(rp) != 1 || rp[0].Weight != 10 || rp[0].Overridden || !strings.Contains(rp[0].Error, "not open") ||
			st.Version != st.FileVersion {
			t.Fatalf("status %+v", st)
		}
	})
}

// sqliteStore opens a SQLite shadow store in a temporary directory, and names a config
// file beside it. The caller closes the store (deferred before goleak's check runs: a
// t.Cleanup would run after it).
func sqliteStore(t *testing.T) (st *shadow.Store, storePath, file string) {
	t.Helper()
	dir := t.TempDir()
	storePath, file = filepath.Join(dir, "shadow.db"), filepath.Join(dir, "sluice.yaml")
	st, err := shadow.OpenStore(context.Background(), storePath)
	if err != nil {
		t.Fatal(err)
	}
	return st, storePath, file
}

func startServerWith(t *testing.T, opts Options) (*Server, string) {
	t.Helper()
	s, addr, _ := runServer(t, opts)
	return s, addr
}

// runServer starts a Server on 127.0.0.1:0 and waits until it serves (with a store, judged
// once); stop stops it (bounded: the test fails when Serve does not return), and runs when
// the test ends if it was not called.
func runServer(t *testing.T, opts Options) (_ *Server, addr string, stop func()) {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Serve did not return")
			}
		})
	}
	t.Cleanup(stop)
	// Serve judges (or follows) once before it serves: wait for it, as a replica's stream
	// would.
	select {
	case <-s.started:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not start within 10s")
	}
	return s, ln.Addr().String(), stop
}

// TestAdminHandler: /admin/xds and /metrics want the same authorisation (authorized), and
// refuse in OpenAI's error shape.
func TestAdminHandler(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, file, progressConfig(t, "cand", 10, 30, "embed"))
	s, err := New(Options{ConfigPath: file, ShadowStore: "postgres://sluice:hunter2@db.internal/shadow"})
	if err != nil {
		t.Fatal(err)
	}
	served := []struct {
		path  string
		check func(t *testing.T, body []byte)
	}{
		{"/admin/xds", func(t *testing.T, body []byte) {
			var st Status
			if err := json.Unmarshal(body, &st); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(body), "hunter2") || !st.Progression.On || st.Progression.Instance != Instance ||
				len(st.Progression.Routes) != 1 || st.Progression.Routes[0].Weight != 10 || st.Version == "" {
				t.Errorf("status %s", body)
			}
		}},
		{"/metrics", func(t *testing.T, body []byte) {
			if !strings.Contains(string(body), "sluice_xds_snapshot_pushes_total") {
				t.Errorf("no metrics: %s", body)
			}
		}},
	}
	for _, tc := range []struct {
		name, listen, token, sent string
		want                      int
	}{
		{"loopback, no token set", "127.0.0.1:18001", "", "", http.StatusOK},
		{"token set, none sent", "127.0.0.1:18001", "s3cret", "", http.StatusUnauthorized},
		{"token set, wrong one sent", "127.0.0.1:18001", "s3cret", "nope", http.StatusUnauthorized},
		{"token set and sent", "0.0.0.0:18001", "s3cret", "s3cret", http.StatusOK},
		{"not loopback, no token set", "0.0.0.0:18001", "", "", http.StatusUnauthorized},
	} {
		for _, sv := range served {
			t.Run(tc.name+" "+sv.path, func(t *testing.T) {
				t.Setenv(config.DefaultAdminTokenEnv, tc.token)
				req := httptest.NewRequest(http.MethodGet, sv.path, nil)
				if tc.sent != "" {
					req.Header.Set("Authorization", "Bearer "+tc.sent)
				}
				rec := httptest.NewRecorder()
				s.AdminHandler(tc.listen).ServeHTTP(rec, req)
				if rec.Code != tc.want {
					t.Fatalf("status %d, want %d: %s", rec.Code, tc.want, rec.Body)
				}
				if tc.want != http.StatusOK {
					var e struct {
						Error struct{ Message, Type, Code string }
					}
					if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != "invalid_admin_token" || e.Error.Type != "authentication_error" {
						t.Errorf("a refusal not in OpenAI's error shape: %s", rec.Body)
					}
					return
				}
				sv.check(t, rec.Body.Bytes())
			})
		}
	}
	rec := httptest.NewRecorder()
	s.AdminHandler("127.0.0.1:1").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("/healthz: %d", rec.Code)
	}
}

// The split a progression names is found as the router names splits.
func TestSplitIndex(t *testing.T) {
	splits := []route.Split{{Cluster: "main", Weight: 90}, {Name: "canary", Cluster: "cand", Weight: 10}, {Cluster: "other"}}
	for name, want := range map[string]int{"main": 0, "canary": 1, "cand": -1, "other": 2, "none": -1} {
		if got := splitIndex(splits, name); got != want {
			t.Errorf("splitIndex(%q) = %d, want %d", name, got, want)
		}
	}
}

// BenchmarkJudge: one judgement of the control plane over a store of 2,000 pairs of the
// route's candidate (window 500, as docs/fleet.md quotes): reading the fleet's window
// (Store.FleetInput), the verdict (shadow.Evaluate) and, the weight unchanged, no push.
func BenchmarkJudge(b *testing.B) {
	for _, name := range []string{"file", "postgres"} {
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			where := filepath.Join(dir, "bench.db")
			if name == "postgres" {
				where = pgtest.Start(b).CreateDB(b, "bench")
			}
			st, err := shadow.OpenStore(context.Background(), where)
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			storePairs(b, st, "cand", 2000, 0, time.Now().Add(-time.Hour))
			file := filepath.Join(dir, "sluice.yaml")
			writeFile(b, file, strings.Replace(progressConfig(b, "cand", 30, 30, "embed"), "window: 100", "window: 500", 1))
			s, err := New(Options{ConfigPath: file, ShadowStore: where})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			w := s.startProgression(ctx)
			defer func() {
				cancel()
				_ = w.Close(context.Background())
			}()
			if rp := s.Status().Progression.Routes[0]; rp.Verdict == nil || rp.Verdict.Pairs != 2000 {
				b.Fatalf("first judgement: %+v", rp)
			}
			b.ResetTimer()
			for b.Loop() {
				if n := s.judgeAll(ctx, time.Now()); n != 0 {
					b.Fatalf("%d weights changed at max", n)
				}
			}
		})
	}
}

// BenchmarkPublish: one weight change pushed: the config with the new weight validated, its
// resources built and set as the fleet's snapshot.
func BenchmarkPublish(b *testing.B) {
	file := filepath.Join(b.TempDir(), "sluice.yaml")
	writeFile(b, file, progressConfig(b, "cand", 10, 30, "embed"))
	s, err := New(Options{ConfigPath: file})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		s.mu.Lock()
		eff := withWeights(s.file, map[string]int{"chat": i % 30})
		err := eff.Validate()
		if err == nil {
			err = s.publish(ctx, eff, snapshotVersion(s.fileVersion, map[string]int{"chat": 0}, i), pushProgression)
		}
		s.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
}

// TestReloadRefusesAnInvalidOverlay: a file change that keeps the route's splits but makes
// the control plane's weight unservable (every split at 0 with no cluster left) serves the
// file's weights.
func TestReloadRefusesAnInvalidOverlay(t *testing.T) {
	const withCluster = `clusters:
  - {name: main, endpoints: [{url: "http://10.0.0.5:8000"}]}
  - {name: cand, endpoints: [{url: "http://10.0.0.6:8000"}]}
routes:
  - name: chat
    CLUSTER
    splits: [{cluster: cand, weight: 10}]
    mirror: {cluster: cand, fraction: 1, progression: {step: 10, interval: 1m, max: 30}}
`
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, file, strings.Replace(withCluster, "CLUSTER", "cluster: main", 1))
	s, err := New(Options{ConfigPath: file})
	if err != nil {
		t.Fatal(err)
	}
	// As a rollback would have left it.
	s.mu.Lock()
	s.overlay = map[string]int{"chat": 0}
	err = s.publish(context.Background(), withWeights(s.file, s.overlay), snapshotVersion(s.fileVersion, s.overlay, 1), pushProgression)
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, file, strings.Replace(withCluster, "CLUSTER", "model: m", 1))
	if changed, err := s.Reload(context.Background()); !changed || err != nil {
		t.Fatalf("Reload: %v, %v", changed, err)
	}
	st := s.Status()
	if rp := st.Progression.Routes[0]; rp.Weight != 10 || rp.Overridden || st.Version != st.FileVersion {
		t.Errorf("after the file dropped the route's cluster: %+v", st)
	}
}

func TestParseStep(t *testing.T) {
	for _, tc := range []struct {
		action, split string
		from, to      int
		ok            bool
	}{
		{"weight good 0→10", "good", 0, 10, true},
		{"weight my canary 20→0", "my canary", 20, 0, true},
		{"recommend good weight 0→10 (the control plane owns the weights)", "", 0, 0, false},
		{"weight good 0->10", "", 0, 0, false},
		{"weight good x→10", "", 0, 0, false},
		{"weight 0→10", "", 0, 0, false},
		{"weight good -5→10", "", 0, 0, false},
		{"", "", 0, 0, false},
	} {
		split, from, to, ok := parseStep(tc.action)
		if ok != tc.ok || ok && (split != tc.split || from != tc.from || to != tc.to) {
			t.Errorf("parseStep(%q) = %q %d %d %v, want %q %d %d %v", tc.action, split, from, to, ok, tc.split, tc.from, tc.to, tc.ok)
		}
	}
}

// step is a verdict of the control plane (unless instance says otherwise) that changed route
// chat's weight of candidate's split, at t0 plus at.
type step struct {
	candidate, action, instance string
	at                          time.Duration
}

// stepRecords are the steps as Store.Steps returns them: newest first.
func stepRecords(t0 time.Time, steps []step) []shadow.VerdictRecord {
	var out []shadow.VerdictRecord
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		inst := s.instance
		if inst == "" {
			inst = Instance
		}
		d := shadow.Promote
		if strings.HasSuffix(s.action, "→0") {
			d = shadow.Rollback
		}
		out = append(out, shadow.VerdictRecord{Route: "chat", CandidateID: s.candidate, Time: t0.Add(s.at),
			Verdict: shadow.Verdict{Decision: d, Reason: "planted"}, Action: s.action, Instance: inst})
	}
	return out
}

// restoreCases are the rollouts a starting control plane finds in the store, route chat's
// file (candidate cand, next or another at fileWeight), what it serves first (want: the
// recovered weight, or the file's) and whether it says it recovered it.
var restoreCases = []struct {
	name       string
	cand       string
	fileWeight int
	steps      []step
	want       int
	recovered  bool
}{
	{"a promotion", "next", 0, []step{{"next", "weight next 0→10", "", 0}, {"next", "weight next 10→20", "", time.Second}}, 20, true},
	{"a rollback", "cand", 10, []step{{"cand", "weight cand 10→0", "", 0}}, 0, true},
	{"through a rollback and a promotion", "next", 0, []step{{"next", "weight next 0→10", "", 0}, {"next", "weight next 10→20", "", time.Second},
		{"next", "weight next 20→0", "", 2 * time.Second}, {"next", "weight next 0→10", "", 3 * time.Second}}, 10, true},
	{"back at the file's weight", "next", 0, []step{{"next", "weight next 0→10", "", 0}, {"next", "weight next 10→0", "", time.Second}}, 0, true},
	{"the newest rollout, after the file reset the weights", "next", 5, []step{{"next", "weight next 0→10", "", 0},
		{"next", "weight next 10→20", "", time.Second}, {"next", "weight next 5→15", "", 2 * time.Second}}, 15, true},
	{"the file reset the weights since", "next", 5, []step{{"next", "weight next 0→10", "", 0}, {"next", "weight next 10→20", "", time.Second}}, 5, false},
	{"another candidate's steps", "next", 0, []step{{"cand", "weight cand 10→0", "", 0}, {"other", "weight other 0→10", "", time.Second}}, 0, false},
	{"another candidate's steps between", "next", 0, []step{{"next", "weight next 0→10", "", 0}, {"cand", "weight cand 10→0", "", time.Second},
		{"next", "weight next 10→20", "", 2 * time.Second}}, 20, true},
	{"a gateway's own steps, not the control plane's", "next", 0, []step{{"next", "weight next 0→10", "gw-a", 0}}, 0, false},
	{"no steps", "next", 0, nil, 0, false},
}

// TestRecoverRoute traces the rollouts of restoreCases back through their steps.
func TestRecoverRoute(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, tc := range restoreCases {
		t.Run(tc.name, func(t *testing.T) {
			r := *findRoute(parseConfig(t, progressConfig(t, tc.cand, tc.fileWeight, 30, "embed")), "chat")
			rec, found := recoverRoute(r, stepRecords(t0, tc.steps), false)
			got := tc.fileWeight
			if found && rec.why == "" {
				got = rec.weight
				last := rec.steps[len(rec.steps)-1]
				if !rec.stepped.Equal(last.Time) || last.To != rec.weight || rec.steps[0].Time.After(last.Time) {
					t.Errorf("recovered %+v: want the steps oldest first, stepped at the newest", rec)
				}
			}
			if got != tc.want || (found && rec.why == "") != tc.recovered {
				t.Errorf("recovered weight %d (%+v, found %v), want %d, recovered %v", got, rec, found, tc.want, tc.recovered)
			}
		})
	}
	t.Run("traced back to the oldest step of a full page", func(t *testing.T) {
		r := *findRoute(parseConfig(t, progressConfig(t, "next", 0, 30, "embed")), "chat")
		recs := stepRecords(t0, []step{{"next", "weight next 0→10", "", 0}, {"next", "weight next 10→20", "", time.Second}})
		if rec, found := recoverRoute(r, recs, true); !found || rec.why == "" {
			t.Errorf("recovered %+v from a full page: its start is not known", rec)
		}
		// A page that holds the rollout's start, and an older one's step, is traced.
		recs = append(recs, stepRecords(t0, []step{{"next", "weight next 20→30", "", -time.Hour}})...)
		if rec, found := recoverRoute(r, recs, true); !found || rec.why != "" || rec.weight != 20 {
			t.Errorf("recovered %+v, want 20", rec)
		}
	})
}

// TestProgressionRestoresWeights: a control plane that starts with the store serves, from its
// first snapshot, the weight its steps recorded there set (restoreCases), shows them in its
// status, and steps on from there, not from the file's weight: the last step's time counts
// for the progression interval.
func TestProgressionRestoresWeights(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range restoreCases {
		t.Run(tc.name, func(t *testing.T) {
			st, storePath, file := sqliteStore(t)
			defer st.Close()
			// Recent steps (the progression's interval is 1m), and no pairs: the first
			// verdict holds, so the weight served is the recovered one.
			t0 := time.Now().Add(-10 * time.Second)
			for _, v := range stepRecords(t0, tc.steps) {
				if err := st.AddVerdict(context.Background(), v); err != nil {
					t.Fatal(err)
				}
			}
			writeFile(t, file, progressConfig(t, tc.cand, tc.fileWeight, 30, "embed"))
			s, addr := startServerWith(t, Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: storePath})
			first := dialDelta(t, addr, "replica-1").await("the first route configuration", func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
				return r.GetTypeUrl() == resource.RouteType
			})
			if w := chatWeight(t, first, tc.cand); w != tc.want {
				t.Errorf("the first snapshot sends %s at weight %d, want %d", tc.cand, w, tc.want)
			}
			status := s.Status()
			rp := status.Progression.Routes[0]
			if rp.Weight != tc.want || rp.Recovered != tc.recovered || rp.Overridden != (tc.want != tc.fileWeight) ||
				rp.Verdict == nil || rp.Verdict.Decision != shadow.Hold {
				t.Errorf("status %+v", rp)
			}
			if tc.recovered {
				if len(rp.Steps) == 0 {
					t.Fatal("no steps in the status")
				}
				last := rp.Steps[len(rp.Steps)-1]
				if last.To != tc.want || last.Version != "" || rp.SteppedAt == nil || !rp.SteppedAt.Equal(last.Time) {
					t.Errorf("steps %+v, stepped at %v: want the recovered ones, the newest last", rp.Steps, rp.SteppedAt)
				}
				if tc.want != tc.fileWeight && status.Version != status.FileVersion+"+p1" {
					t.Errorf("version %q, want the file's %q+p1", status.Version, status.FileVersion)
				}
			}
		})
	}

	t.Run("a promotion goes on from the recovered weight", func(t *testing.T) {
		st, storePath, file := sqliteStore(t)
		defer st.Close()
		storePairs(t, st, "next", 40, 0, time.Now().Add(-time.Hour)) // identical: promote
		writeFile(t, file, progressConfig(t, "next", 0, 30, "embed"))
		var steppedAt time.Time
		t.Run("the first control plane", func(t *testing.T) {
			s, _ := startServerWith(t, Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: storePath})
			// Judged before serving: 0→10; a minute later: 10→20.
			s.judgeAll(context.Background(), time.Now().Add(time.Minute))
			rp := s.Status().Progression.Routes[0]
			if rp.Weight != 20 || len(rp.Steps) != 2 {
				t.Fatalf("first control plane: %+v", rp)
			}
			steppedAt = rp.Steps[1].Time
			waitVerdict(t, st, "weight next 10→20", "next")
		})
		t.Run("started again", func(t *testing.T) {
			s, addr := startServerWith(t, Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: storePath})
			c := dialDelta(t, addr, "replica-1")
			first := c.await("the first route configuration", func(r *discoverygrpc.DeltaDiscoveryResponse) bool {
				return r.GetTypeUrl() == resource.RouteType
			})
			// Without the store's steps: 10 (the file's 0, promoted once before serving).
			if w := chatWeight(t, first, "next"); w != 20 {
				t.Fatalf("the first snapshot after the restart sends next at weight %d, want the 20 it had", w)
			}
			rp := s.Status().Progression.Routes[0]
			var got []string
			for _, sp := range rp.Steps {
				got = append(got, sp.Action)
			}
			if want := []string{"weight next 0→10", "weight next 10→20"}; !slices.Equal(got, want) || !rp.Recovered ||
				rp.Verdict == nil || rp.Verdict.Decision != shadow.Promote || rp.SteppedAt == nil || !rp.SteppedAt.Equal(steppedAt) {
				t.Fatalf("after the restart: %+v, steps %q", rp, got)
			}
			// The last step's time counts: within its interval the promote holds, then steps.
			if n := s.judgeAll(context.Background(), steppedAt.Add(59*time.Second)); n != 0 {
				t.Errorf("stepped %d times within the interval of the recovered step", n)
			}
			if n := s.judgeAll(context.Background(), steppedAt.Add(time.Minute)); n != 1 || s.Status().Progression.Routes[0].Weight != 30 {
				t.Errorf("a promote an interval after the recovered step: %d changes, weight %d, want 30", n, s.Status().Progression.Routes[0].Weight)
			}
			c.await("weight 30 pushed", func(r *discoverygrpc.DeltaDiscoveryResponse) bool { return chatWeight(t, r, "next") == 30 })
			waitVerdict(t, st, "weight next 20→30", "next")
		})
	})
}

// TestProgressionWaitsForTheRecovery: while the steps cannot be read from the store, the
// control plane does not judge (a step from the file's weight could undo a rollback or a
// promotion it had made) and says why; once they can, it recovers and judges.
func TestProgressionWaitsForTheRecovery(t *testing.T) {
	defer goleak.VerifyNone(t)
	st, storePath, file := sqliteStore(t)
	defer st.Close()
	storePairs(t, st, "next", 40, 0, time.Now().Add(-time.Hour)) // identical: promote
	db, err := sql.Open("sqlite", storePath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rename := func(from, to string) {
		t.Helper()
		if _, err := db.Exec("ALTER TABLE " + from + " RENAME TO " + to); err != nil {
			t.Fatal(err)
		}
	}
	rename("verdicts", "verdicts_away") // the steps cannot be read
	writeFile(t, file, progressConfig(t, "next", 0, 30, "embed"))
	t.Run("serve", func(t *testing.T) {
		s, _ := startServerWith(t, Options{ConfigPath: file, WatchInterval: time.Hour, ShadowStore: storePath})
		rp := s.Status().Progression.Routes[0]
		if rp.Weight != 0 || rp.Verdict != nil || len(rp.Steps) != 0 || !strings.Contains(rp.Error, "weight not recovered from the store") {
			t.Fatalf("with the steps unreadable: %+v", rp)
		}
		rename("verdicts_away", "verdicts")
		if n := s.judgeAll(context.Background(), time.Now()); n != 1 {
			t.Fatalf("%d weight changes once the steps could be read, want 1", n)
		}
		if rp := s.Status().Progression.Routes[0]; rp.Weight != 10 || rp.Error != "" || rp.Recovered {
			t.Errorf("after the recovery (nothing to recover) and a promote: %+v", rp)
		}
	})
}

// TestStoredWeightsWaitForOwnSteps: a control plane that still holds steps of its own (the
// store took no writes for a while) does not read the store's steps back over them: the
// store's older chain (0→10) must not undo the rollback (10→0) it has pushed and not yet
// written. It serves its weights as they are until its own steps are written.
func TestStoredWeightsWaitForOwnSteps(t *testing.T) {
	defer goleak.VerifyNone(t)
	st, _, file := sqliteStore(t)
	defer st.Close()
	writeFile(t, file, progressConfig(t, "next", 0, 30, "embed"))
	step := shadow.VerdictRecord{Route: "chat", CandidateID: "next", Instance: Instance, Time: time.Now().Add(-time.Minute),
		Verdict: shadow.Verdict{Decision: shadow.Promote}, Action: "weight next 0→10"}
	if err := st.AddVerdict(context.Background(), step); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{ConfigPath: file})
	if err != nil {
		t.Fatal(err)
	}
	// A writer whose store never answers, holding the rollback this control plane made.
	w := shadow.StartWriter(func(context.Context) (*shadow.Store, error) { return nil, errors.New("store down") },
		shadow.WriterConfig{MaxBytes: 1 << 20})
	s.writer.Store(w)
	held := step
	held.Time, held.Verdict.Decision, held.Action = time.Now(), shadow.Rollback, "weight next 10→0"
	w.AddVerdict(held)
	read, changed := s.storedWeights(context.Background(), st, true)
	if read || changed != 0 {
		t.Errorf("with its own step held: read %v, %d weights changed; want the store not read over it", read, changed)
	}
	if rp := s.Status().Progression.Routes[0]; rp.Weight != 0 || !strings.Contains(rp.Error, "own steps are not written") {
		t.Errorf("with its own step held: %+v", rp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = w.Close(ctx) // what it holds is dropped (the store never answered)
}
