package shadow

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// testPair builds a compared pair; i varies latencies and texts, broken plants a schema
// breakage on the candidate.
func testPair(route string, i int, at time.Time, broken bool) PairRecord {
	req := Request{ResponseFormat: FormatJSONObject}
	p := Answer{Status: 200, TTFT: time.Duration(40+i) * time.Millisecond, ITL: 8 * time.Millisecond,
		E2E: time.Duration(400+i) * time.Millisecond, OutputTokens: 50, FinishReason: "stop", Text: `{"answer": 42}`}
	if i%5 != 3 { // most answers carried logprobs
		p.Confidence = Confidence{Tokens: 50, MeanEntropy: 0.2 + 0.01*float64(i%7), LowMargin: 0.02 * float64(i%3)}
	}
	c := p
	c.TTFT += 3 * time.Millisecond
	if broken {
		c.Text = "the answer is 42"
		c.Confidence.MeanEntropy += 0.1
	}
	body := []byte(`{"model":"m","user":"alice@example.com","messages":[{"role":"user","content":"hi","name":"alice"}],"response_format":{"type":"json_object"},"stream":true}`)
	r := NewPairRecord(route, at, body, p, c, nil, Compare(req, p, c))
	r.RequestID = "req-" + route
	r.Session = "s123"
	r.Endpoint = "/v1/chat/completions"
	if i%2 == 0 {
		rep := p
		rep.Text = `{"answer": 42, "note": "x"}`
		rep.Confidence = Confidence{} // a replica's is not stored: no verdict reads it
		r = NewPairRecord(route, at, body, p, c, &rep, Compare(req, p, c))
		r.RequestID, r.Session, r.Endpoint = "req-"+route, "s123", "/v1/chat/completions"
	}
	return r
}

// testTriple builds a compared triple: testPair's primary and candidate with a baseline
// answer (failing every third request, so its noise-floor sample is missing there) and
// the loads (unmeasured every fifth).
func testTriple(route string, i int, at time.Time, broken bool) PairRecord {
	req := Request{ResponseFormat: FormatJSONObject}
	r := testPair(route, i, at, broken)
	r.Replica, r.ReplicaSimilarity, r.ReplicaValid = nil, 0, false // no replicas with a baseline
	b := r.Primary
	b.TTFT += time.Duration(1+i%3) * time.Millisecond
	b.E2E -= 2 * time.Millisecond
	b.Text = `{"answer": 42, "sure": true}`
	if i%3 == 2 {
		b = Answer{Status: 503, ErrorClass: "upstream_5xx"}
	}
	r.SetBaseline(b)
	r.Result = defaultCache.CompareTriple(req, r.Primary, r.Baseline, r.Candidate)
	if i%5 != 4 {
		r.Result.Loads = Loads{Primary: float64(1 + i%4), Baseline: 2, Candidate: 2.5, Valid: true}
	}
	return r
}

// sortInput puts the samples of in in order (ring order differs between a live and a
// restored accumulator: compare them as multisets).
func sortInput(in *Input) {
	arms := []*Arm{&in.Primary, &in.Candidate}
	if in.Baseline != nil {
		arms = append(arms, in.Baseline)
	}
	for _, a := range arms {
		for _, xs := range [][]float64{a.TTFT, a.ITL, a.E2E} {
			sortFloats(xs)
		}
	}
	sortFloats(in.CandidateSimilarity)
	sortFloats(in.NoiseFloor)
	byPair := func(ps [][2]float64) {
		sort.Slice(ps, func(i, j int) bool { return ps[i][0] < ps[j][0] || ps[i][0] == ps[j][0] && ps[i][1] < ps[j][1] })
	}
	for _, ps := range [][][2]float64{in.Paired.TTFT, in.Paired.ITL, in.Paired.E2E, in.Confidence.Entropy, in.Confidence.LowMargin} {
		byPair(ps)
	}
	loads := make([][2]float64, len(in.Load.Reference))
	for i := range loads {
		loads[i] = [2]float64{in.Load.Reference[i], in.Load.Candidate[i]}
	}
	byPair(loads)
	for i, l := range loads {
		in.Load.Reference[i], in.Load.Candidate[i] = l[0], l[1]
	}
}

func posInf() float64 { return math.Inf(1) }

func mkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

func sortFloats(xs []float64) { sort.Float64s(xs) }

// openTestStores returns openers of a store of each kind: in memory, a SQLite file, and a
// PostgreSQL database (its own, on the package's shared server; skipped without one).
func openTestStores(t *testing.T) map[string]func(*testing.T) *Store {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shadow.db")
	open := func(p func(*testing.T) string) func(*testing.T) *Store {
		return func(t *testing.T) *Store {
			s, err := OpenStore(ctx, p(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
	}
	fixed := func(p string) func(*testing.T) string { return func(*testing.T) string { return p } }
	return map[string]func(*testing.T) *Store{"memory": open(fixed("")), "file": open(fixed(path)),
		"postgres": open(func(t *testing.T) string { return pgShared.DB(t) })}
}

func TestStoreRoundTrip(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2025, 3, 4, 5, 6, 7, 891011121, time.UTC)
	for name, open := range openTestStores(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			want := []PairRecord{testPair("chat", 0, t0, false), testPair("chat", 1, t0.Add(time.Second), true),
				testPair("other", 2, t0.Add(2*time.Second), false)}
			for _, p := range want {
				if err := s.AddPair(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Pairs(ctx, "chat", 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || got[0].ID == 0 || !got[0].Time.Equal(want[1].Time) {
				t.Fatalf("got %d pairs, first at %v", len(got), got)
			}
			for i, g := range got {
				w := want[1-i]
				g.ID = 0
				g.Time = g.Time.UTC()
				if !reflect.DeepEqual(g, w) {
					t.Errorf("pair %d:\n got  %+v\n want %+v", i, g, w)
				}
			}
			if !got[0].Result.Candidate.SchemaBroken || got[0].Result.Candidate.Problems == nil {
				t.Errorf("planted breakage lost: %+v", got[0].Result.Candidate)
			}
			if got[1].Replica == nil || !got[1].ReplicaValid || got[1].ReplicaSimilarity <= 0 {
				t.Errorf("replica lost: %+v", got[1])
			}
			if strings.Contains(string(got[0].Request), "alice") || !strings.Contains(string(got[0].Request), `"stream":true`) {
				t.Errorf("request not redacted as expected: %s", got[0].Request)
			}
			all, err := s.Pairs(ctx, "", 0)
			if err != nil || len(all) != 3 || all[0].Route != "other" {
				t.Fatalf("all pairs: %d %v", len(all), err)
			}
			routes, err := s.Routes(ctx)
			if err != nil || !reflect.DeepEqual(routes, []string{"chat", "other"}) {
				t.Fatalf("routes %v %v", routes, err)
			}
		})
	}
}

func TestStoreVerdicts(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	for name, open := range openTestStores(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			v := Verdict{Decision: Rollback, Reason: "regression: [ttft]", Evidence: []Evidence{
				{Metric: MetricTTFT, Test: StatMannWhitney, NPrimary: 60, NCandidate: 60, P: 1e-9, Effect: 0.3, Bound: 0.1, Verdict: Regression},
				{Metric: MetricE2E, Test: StatMannWhitney, P: 0.5, Effect: posInf(), Verdict: Inconclusive},
			}}
			for i, d := range []Decision{Hold, Rollback} {
				vr := VerdictRecord{Route: "chat", Time: t0.Add(time.Duration(i) * time.Minute), Verdict: v, Pairs: 60, Replicas: 6, Action: "weight 10→0"}
				vr.Verdict.Decision = d
				if err := s.AddVerdict(ctx, vr); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Verdicts(ctx, "chat", 5)
			if err != nil || len(got) != 2 {
				t.Fatalf("%d verdicts, %v", len(got), err)
			}
			g := got[0]
			if g.Verdict.Decision != Rollback || g.Action != "weight 10→0" || g.Pairs != 60 || g.Replicas != 6 ||
				len(g.Verdict.Evidence) != 2 || g.Verdict.Evidence[0].Verdict != Regression || g.Verdict.Evidence[1].Effect <= 1e300 {
				t.Fatalf("verdict %+v", g)
			}
			if got[1].Verdict.Decision != Hold {
				t.Fatalf("order: %v then %v", got[0].Verdict.Decision, got[1].Verdict.Decision)
			}
			if err := s.AddVerdict(ctx, VerdictRecord{}); err == nil {
				t.Error("verdict without a route was accepted")
			}
			if err := s.AddPair(ctx, PairRecord{}); err == nil {
				t.Error("pair without a route was accepted")
			}
		})
	}
}

func TestStorePersistsAcrossReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sub dir", "shadow?#%.db")
	if err := mkdirAll(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	s, err := OpenStore(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for i := range 30 {
		if err := s.AddPair(ctx, testPair("chat", i, t0.Add(time.Duration(i)*time.Millisecond), false)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddVerdict(ctx, VerdictRecord{Route: "chat", Verdict: Verdict{Decision: Promote, Reason: "ok"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenStore(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ps, vs, err := s.Count(ctx, "chat")
	if err != nil || ps != 30 || vs != 1 {
		t.Fatalf("after reopen: %d pairs, %d verdicts, %v", ps, vs, err)
	}
	if err := s.Prune(ctx, "", 10); err != nil {
		t.Fatal(err)
	}
	got, err := s.Pairs(ctx, "chat", 100)
	if err != nil || len(got) != 10 || got[9].Result.Primary.TTFT != 60*time.Millisecond {
		t.Fatalf("after prune: %d pairs, last TTFT %v, %v", len(got), got[len(got)-1].Result.Primary.TTFT, err)
	}
	if err := s.Prune(ctx, "chat", 0); err != nil {
		t.Fatal(err)
	}
	if ps, vs, _ := s.Count(ctx, ""); ps != 0 || vs != 0 {
		t.Fatalf("prune to 0 left %d pairs %d verdicts", ps, vs)
	}
}

// TestPruneKeepsWeightSteps: the route's every-interval verdicts never push out its weight
// steps (a control plane recovers its weights from the first step of the rollout on), which
// are kept apart up to StepRetention; keep 0 deletes them too.
func TestPruneKeepsWeightSteps(t *testing.T) {
	ctx := context.Background()
	s, err := OpenStore(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer func(n int) { StepRetention = n }(StepRetention)
	StepRetention = 3
	t0 := time.Now()
	add := func(i int, action string) {
		t.Helper()
		if err := s.AddVerdict(ctx, VerdictRecord{Route: "chat", Time: t0.Add(time.Duration(i) * time.Millisecond),
			Verdict: Verdict{Decision: Promote, Reason: "ok"}, Action: action, Instance: "sluice xds"}); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range []int{0, 10, 20, 30} { // the rollout's steps, oldest first
		add(i, fmt.Sprintf("weight cand %d→%d", w, w+10))
	}
	for i := range 50 { // then the fleet's verdicts, each interval
		add(10+i, "")
		add(100+i, "recommend cand weight 40→50 (the control plane owns the weights)")
	}
	if err := s.Prune(ctx, "chat", 5); err != nil {
		t.Fatal(err)
	}
	steps, err := s.Steps(ctx, "chat", 100)
	if err != nil || len(steps) != 3 || steps[2].Action != "weight cand 10→20" || steps[0].Action != "weight cand 30→40" {
		t.Fatalf("steps after prune: %v (%v), want the newest 3 (StepRetention)", steps, err)
	}
	if _, vs, _ := s.Count(ctx, "chat"); vs != 5+3 {
		t.Errorf("%d verdicts after prune, want 5 and the 3 steps", vs)
	}
	if err := s.Prune(ctx, "chat", 0); err != nil {
		t.Fatal(err)
	}
	if _, vs, _ := s.Count(ctx, "chat"); vs != 0 {
		t.Errorf("prune to 0 left %d verdicts", vs)
	}
}

func TestStoreRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "new.db")
	s, err := OpenStore(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := OpenStore(ctx, path); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Fatalf("got %v", err)
	}
}

func TestStoreRestore(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		n, window int
		broken    bool
		triples   bool
	}{
		{"all kept", 60, 100, false, false},
		{"window cuts", 60, 20, true, false},
		{"triples all kept", 60, 100, false, true},
		// Every third baseline fails: the live noise floor reaches back past the newest 20
		// triples, and so must the restored one.
		{"triples window cuts", 60, 20, true, true},
		{"pairs then triples", 60, 50, true, true},
		// The newest replicas are older than the pairs replayed (RestoreDepth windows).
		{"sparse replicas", 60, 2, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := OpenStore(ctx, ":memory:")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			live := NewAccumulator(tt.window)
			t0 := time.Now()
			for i := range tt.n {
				at := t0.Add(time.Duration(i) * time.Millisecond)
				p := testPair("chat", i, at, tt.broken)
				if tt.triples && (tt.name != "pairs then triples" || i >= 20) {
					p = testTriple("chat", i, at, tt.broken)
				}
				if tt.name == "sparse replicas" && i >= 30 {
					p.Replica, p.ReplicaSimilarity, p.ReplicaValid = nil, 0, false
				}
				live.Add(p.Result)
				if p.ReplicaValid {
					live.AddReplicaSimilarity(p.ReplicaSimilarity)
				}
				if err := s.AddPair(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			restored := NewAccumulator(tt.window)
			if err := s.Restore(ctx, "chat", "", restored, tt.window); err != nil {
				t.Fatal(err)
			}
			a, b := live.Input(), restored.Input()
			sortInput(&a)
			sortInput(&b)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("restored input differs:\n live     %+v\n restored %+v", a, b)
			}
			if tt.triples {
				if a.Baseline == nil || len(a.Paired.E2E) == 0 || len(a.Load.Reference) == 0 || len(a.NoiseFloor) == 0 || len(a.Confidence.Entropy) == 0 {
					t.Fatalf("the triples left no baseline, pairs, loads or noise floor: %+v", a)
				}
				if tt.broken && a.SchemaBrokeAlone == 0 {
					t.Fatalf("planted breakage not counted as the candidate's alone: %+v", a)
				}
			}
			if _, lr := live.Counts(); true {
				if _, rr := restored.Counts(); rr > lr {
					t.Errorf("restored %d replicas, the live accumulator had %d", rr, lr)
				}
			}
			if tt.name == "sparse replicas" && len(b.NoiseFloor) != tt.window {
				t.Errorf("restored noise floor %v, want the %d newest replicas", b.NoiseFloor, tt.window)
			}
			cfg := Config{MinSamples: 8}
			va, _ := Evaluate(cfg, a)
			vb, _ := Evaluate(cfg, b)
			if va.Decision != vb.Decision {
				t.Fatalf("verdict %s before restart, %s after", va.Decision, vb.Decision)
			}
			if tt.broken && vb.Decision != Rollback {
				t.Errorf("planted schema breakage: %s (%s)", vb.Decision, vb.Reason)
			}
		})
	}
}

func TestStoreTripleRoundTrip(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	for name, open := range openTestStores(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ok := testTriple("chat", 0, t0, true)
			failed := testTriple("chat", 2, t0.Add(time.Second), false) // the baseline failed
			checksOnly := testTriple("chat", 4, t0.Add(2*time.Second), false)
			checksOnly.Baseline = nil // its answer not kept: the checks and latencies are
			answerOnly := testTriple("chat", 6, t0.Add(3*time.Second), false)
			answerOnly.Result.Baseline = nil
			want := []PairRecord{ok, failed, checksOnly, answerOnly}
			for _, p := range want {
				if err := s.AddPair(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Pairs(ctx, "chat", 10)
			if err != nil || len(got) != len(want) {
				t.Fatalf("%d pairs, %v", len(got), err)
			}
			for i, g := range got {
				w := want[len(want)-1-i]
				g.ID, g.Time = 0, g.Time.UTC()
				if !reflect.DeepEqual(g, w) {
					t.Errorf("triple %d:\n got  %+v\n want %+v", i, g, w)
				}
			}
			g := got[len(got)-1] // ok
			if g.Baseline == nil || g.Result.Baseline == nil || !g.Result.NoiseValid || g.Result.NoiseSimilarity <= 0 ||
				!g.Result.Loads.Valid || g.Result.Loads.Baseline != 2 || !g.Result.Candidate.SchemaBroken {
				t.Errorf("triple lost its baseline, noise floor or loads: %+v", g)
			}
			if f := got[2]; f.Result.NoiseValid || f.Result.Baseline == nil || f.Result.Baseline.OK || f.Baseline.ErrorClass != "upstream_5xx" {
				t.Errorf("failed baseline: %+v", f.Result)
			}
			if c := got[1]; c.Baseline != nil || c.Result.Baseline == nil || c.Result.Baseline.TTFT == 0 || c.Result.Loads.Valid {
				t.Errorf("checks only: %+v", c)
			}
			var n int
			if err := s.c().queryRow(ctx, `SELECT COUNT(*) FROM pairs WHERE b_present AND load_baseline = 2`).Scan(&n); err != nil || n != 3 {
				t.Errorf("%d rows with a baseline and its load, %v", n, err)
			}
		})
	}
}

func TestStoreSchemaVersion(t *testing.T) {
	if SchemaVersion != len(migrations) {
		t.Fatalf("SchemaVersion %d, but %d migrations", SchemaVersion, len(migrations))
	}
}

// TestStoreMigratesFromV3: a store written before baselines opens, keeps its pairs, and
// takes triples.
func TestStoreMigratesFromV3(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v3.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	stmts := append([]string{`CREATE TABLE schema_version (version INTEGER NOT NULL)`,
		`INSERT INTO schema_version(version) VALUES (3)`}, migrations[:3]...)
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	old := testPair("chat", 1, t0, true)
	old.CandidateID = "cand"
	// A version 3 store has no confidence columns: the pair reads back without.
	old.Primary.Confidence, old.Candidate.Confidence = Confidence{}, Confidence{}
	old.Result.Primary.Confidence, old.Result.Candidate.Confidence = Confidence{}, Confidence{}
	cols := []string{"route", "ts_ns", "candidate", "request", "similarity", "tool_names_match"}
	vals := []any{old.Route, t0.UnixNano(), old.CandidateID, string(old.Request), old.Result.Similarity, old.Result.ToolNamesMatch}
	for _, side := range []struct {
		p   string
		a   Answer
		chk SideResult
	}{{"p_", old.Primary, old.Result.Primary}, {"c_", old.Candidate, old.Result.Candidate}} {
		av, err := answerValues(side.a)
		if err != nil {
			t.Fatal(err)
		}
		cv, err := checkValues(side.chk)
		if err != nil {
			t.Fatal(err)
		}
		cols = append(append(cols, prefixed(side.p, answerCols)...), prefixed(side.p, checkCols)...)
		vals = append(append(vals, av...), cv...)
	}
	q := "INSERT INTO pairs (" + strings.Join(cols, ", ") + ") VALUES (" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	if _, err := db.ExecContext(ctx, q, vals...); err != nil {
		t.Fatal(err)
	}
	db.Close()

	if _, err := OpenStoreReadOnly(ctx, path); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("older than this binary's %d", SchemaVersion)) {
		t.Fatalf("read-only open of a version 3 store: %v", err)
	}
	s, err := OpenStore(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v int
	if err := s.db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v); err != nil || v != SchemaVersion {
		t.Fatalf("version %d after migration, %v", v, err)
	}
	tri := testTriple("chat", 3, t0.Add(time.Second), false)
	tri.CandidateID = "cand"
	if err := s.AddPair(ctx, tri); err != nil {
		t.Fatal(err)
	}
	got, err := s.Pairs(ctx, "chat", 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("%d pairs, %v", len(got), err)
	}
	for i, w := range []PairRecord{tri, old} {
		g := got[i]
		g.ID, g.Time = 0, g.Time.UTC()
		w.RequestID, w.Session, w.Endpoint = g.RequestID, g.Session, g.Endpoint // not inserted above
		if !reflect.DeepEqual(g, w) {
			t.Errorf("pair %d after migration:\n got  %+v\n want %+v", i, g, w)
		}
	}
	if got[1].Baseline != nil || got[1].Result.Baseline != nil || got[1].Result.NoiseValid || got[1].Result.Loads.Valid {
		t.Errorf("the old pair grew a baseline: %+v", got[1].Result)
	}
	acc := NewAccumulator(10)
	if err := s.Restore(ctx, "chat", "cand", acc, 10); err != nil {
		t.Fatal(err)
	}
	in := acc.Input()
	if n, _ := acc.Counts(); n != 2 || in.Baseline == nil || in.Baseline.Requests != 1 || in.Primary.Requests != 2 || len(in.NoiseFloor) != 1 {
		t.Fatalf("restored across the migration: %d pairs, %+v", n, in)
	}
	if ro, err := OpenStoreReadOnly(ctx, path); err != nil {
		t.Fatalf("read-only open after the migration: %v", err)
	} else {
		ro.Close()
	}
}

func TestStoreBoundsAndBadInput(t *testing.T) {
	ctx := context.Background()
	s, err := OpenStore(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	long := strings.Repeat("é", MaxStoredText) // 2 bytes each
	p := PairRecord{Route: strings.Repeat("r", 1000), Request: json.RawMessage(`not json`),
		Primary: Answer{Text: long}, Candidate: Answer{Text: "key sk-abcdefghijklmnopqrstuvwx here"}}
	p.Result.Candidate.Problems = make([]string, 100)
	if err := s.AddPair(ctx, p); err != nil {
		t.Fatal(err)
	}
	got, err := s.Pairs(ctx, "", 1)
	if err != nil || len(got) != 1 {
		t.Fatal(err)
	}
	g := got[0]
	if len(g.Route) != MaxNameLen || len(g.Primary.Text) > MaxStoredText || g.Request != nil ||
		len(g.Result.Candidate.Problems) != MaxStoredProblems || strings.Contains(g.Candidate.Text, "sk-") {
		t.Fatalf("bounds: route %d text %d request %q problems %d candidate %q", len(g.Route), len(g.Primary.Text),
			g.Request, len(g.Result.Candidate.Problems), g.Candidate.Text)
	}
	if err := s.Restore(ctx, "x", "", nil, 0); err == nil {
		t.Error("restore into nil accumulator")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Pairs(cctx, "", 1); err == nil {
		t.Error("cancelled context: no error")
	}
}

func TestStoreConcurrent(t *testing.T) {
	ctx := context.Background()
	for name, open := range openTestStores(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			const writers, each = 8, 15
			errs := make(chan error, writers*2)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(2)
				go func() {
					defer wg.Done()
					for i := range each {
						if err := s.AddPair(ctx, testPair("chat", w*each+i, time.Now(), false)); err != nil {
							errs <- err
							return
						}
					}
				}()
				go func() {
					defer wg.Done()
					for range each {
						if _, err := s.Pairs(ctx, "chat", 5); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n, _, err := s.Count(ctx, "chat"); err != nil || n != writers*each {
				t.Fatalf("%d pairs, %v", n, err)
			}
		})
	}
}

// TestStoreRestoreByCandidate: a new candidate does not inherit its predecessor's pairs.
func TestStoreRestoreByCandidate(t *testing.T) {
	ctx := context.Background()
	s, err := OpenStore(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := range 30 {
		p := testPair("chat", i, t0.Add(time.Duration(i)*time.Second), true)
		p.CandidateID = "old"
		if err := s.AddPair(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		p := testPair("chat", i, t0.Add(time.Minute+time.Duration(i)*time.Second), false)
		p.CandidateID = "new"
		if err := s.AddPair(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		candidate string
		want      int64
	}{{"old", 30}, {"new", 5}, {"", 5}, {"never", 0}} {
		acc := NewAccumulator(100)
		if err := s.Restore(ctx, "chat", tc.candidate, acc, 100); err != nil {
			t.Fatal(err)
		}
		if n, _ := acc.Counts(); n != tc.want {
			t.Errorf("candidate %q: restored %d pairs, want %d", tc.candidate, n, tc.want)
		}
	}
	ps, err := s.Pairs(ctx, "chat", 1)
	if err != nil || len(ps) != 1 || ps[0].CandidateID != "new" {
		t.Errorf("newest pair %+v, %v", ps, err)
	}
}

func TestStoreSessionHash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := OpenStore(ctx, dir+"/a.db")
	if err != nil {
		t.Fatal(err)
	}
	h1 := a.SessionHash("alice@example.com")
	if h1 == "" || h1 != a.SessionHash("alice@example.com") || h1 == a.SessionHash("bob@example.com") {
		t.Fatalf("hashes %q", h1)
	}
	sum := sha256.Sum256([]byte("alice@example.com"))
	if h1 == hex.EncodeToString(sum[:8]) {
		t.Error("the session hash is a plain SHA-256: reversible by hashing guessed ids")
	}
	a.Close()
	a2, err := OpenStore(ctx, dir+"/a.db")
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if a2.SessionHash("alice@example.com") != h1 {
		t.Error("the key did not survive a reopen")
	}
	b, err := OpenStore(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.SessionHash("alice@example.com") == h1 {
		t.Error("two stores share a key")
	}
}

func TestStoreReadOnly(t *testing.T) {
	ctx := context.Background()
	file := t.TempDir() + "/s.db"
	w, err := OpenStore(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.AddPair(ctx, testPair("chat", 1, time.Now(), false)); err != nil {
		t.Fatal(err)
	}
	r, err := OpenStoreReadOnly(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if ps, err := r.Pairs(ctx, "chat", 10); err != nil || len(ps) != 1 {
		t.Fatalf("read %d pairs, %v", len(ps), err)
	}
	if r.SessionHash("s") != w.SessionHash("s") {
		t.Error("read-only store hashes sessions differently")
	}
	if err := r.AddPair(ctx, testPair("chat", 2, time.Now(), false)); err == nil {
		t.Error("a read-only store accepted a write")
	}
	if _, err := OpenStoreReadOnly(ctx, t.TempDir()+"/missing.db"); err == nil {
		t.Error("a missing file opened")
	}
}
