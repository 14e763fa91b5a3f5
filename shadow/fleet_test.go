package shadow

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// sharedStores returns where a store two gateways share lives: a SQLite file (two handles
// on one host) and a PostgreSQL database (skipped without PostgreSQL).
func sharedStores() map[string]func(*testing.T) string {
	return map[string]func(*testing.T) string{
		"file":     func(t *testing.T) string { return filepath.Join(t.TempDir(), "fleet.db") },
		"postgres": func(t *testing.T) string { return pgShared.DB(t) },
	}
}

func mustOpen(t *testing.T, where string) *Store {
	t.Helper()
	s, err := OpenStore(context.Background(), where)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestFleetInput: two gateways write their pairs and rates to one store; the verdict input
// rebuilt from it is the same from either, holds the union of their pairs exactly as one
// accumulator fed every pair in time order would, and sums the fresh instances' rates.
func TestFleetInput(t *testing.T) {
	ctx := context.Background()
	const window, n = 50, 120
	for name, where := range sharedStores() {
		t.Run(name, func(t *testing.T) {
			u := where(t)
			a, b := mustOpen(t, u), mustOpen(t, u)
			union := NewAccumulator(window)
			t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
			count := map[string]int{}
			for i := range n {
				st, inst := a, "gw-a"
				if i%3 == 1 {
					st, inst = b, "gw-b"
				}
				// Two pairs a millisecond: ties are broken by the order they were stored.
				p := testPair("chat", i, t0.Add(time.Duration(i/2)*time.Millisecond), i%7 == 0)
				p.Instance, p.CandidateID = inst, "cand"
				if err := st.AddPair(ctx, p); err != nil {
					t.Fatal(err)
				}
				if i >= n-window {
					count[inst]++ // in the window
				}
				union.Add(p.Result)
				if p.ReplicaValid {
					union.AddReplicaSimilarity(p.ReplicaSimilarity)
				}
			}
			// Another candidate's pairs are not this comparison's.
			other := testPair("chat", 0, t0.Add(time.Hour), false)
			other.CandidateID = "old"
			if err := a.AddPair(ctx, other); err != nil {
				t.Fatal(err)
			}
			rates := []RateRecord{
				{Route: "chat", CandidateID: "cand", Instance: "gw-a", Time: t0.Add(time.Minute), ReferenceRate: 4.5, CandidateRate: 3},
				{Route: "chat", CandidateID: "cand", Instance: "gw-b", Time: t0.Add(time.Minute + time.Second), ReferenceRate: 2, CandidateRate: 1.25},
				// A gateway gone for a while: its last rates are stale.
				{Route: "chat", CandidateID: "cand", Instance: "gw-c", Time: t0, ReferenceRate: 100, CandidateRate: 100},
			}
			for i, r := range rates {
				if err := []*Store{a, b, a}[i].AddRate(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			// gw-a measures again: its row is replaced, not added.
			rates[0].ReferenceRate, rates[0].Time = 5, rates[0].Time.Add(time.Second)
			if err := a.AddRate(ctx, rates[0]); err != nil {
				t.Fatal(err)
			}
			fa, err := a.FleetInput(ctx, "chat", "cand", window, 0)
			if err != nil {
				t.Fatal(err)
			}
			fb, err := b.FleetInput(ctx, "chat", "cand", window, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(fa, fb) {
				t.Fatalf("the fleet input differs between the gateways:\n a %+v\n b %+v", fa, fb)
			}
			want := union.Input()
			want.Load.ReferenceRate, want.Load.CandidateRate = 7, 4.25
			if !reflect.DeepEqual(fa.Input, want) {
				t.Fatalf("fleet input is not the union's:\n got  %+v\n want %+v", fa.Input, want)
			}
			wp, wr := union.Counts()
			if fa.Pairs != wp || fa.Replicas != wr || fa.Candidate != "cand" || fa.RateInstances != 2 {
				t.Fatalf("counts %d/%d (want %d/%d), candidate %q, %d rate instances", fa.Pairs, fa.Replicas, wp, wr, fa.Candidate, fa.RateInstances)
			}
			if ws := []Source{{"gw-a", count["gw-a"]}, {"gw-b", count["gw-b"]}}; !reflect.DeepEqual(fa.Sources, ws) {
				t.Fatalf("sources %+v, want %+v", fa.Sources, ws)
			}
			cfg := Config{MinSamples: 8}
			va, err := Evaluate(cfg, fa.Input)
			if err != nil {
				t.Fatal(err)
			}
			vb, _ := Evaluate(cfg, fb.Input)
			if !reflect.DeepEqual(va, vb) || va.Decision != Rollback {
				t.Fatalf("verdicts %s (%s) and %s: want the same rollback (planted schema breakage)", va.Decision, va.Reason, vb.Decision)
			}
			// Wider freshness takes the stale gateway in.
			if f, err := b.FleetInput(ctx, "chat", "cand", window, 2*time.Minute); err != nil || f.RateInstances != 3 || f.Input.Load.ReferenceRate != 107 {
				t.Fatalf("with the stale gateway: %d instances, rate %v, %v", f.RateInstances, f.Input.Load.ReferenceRate, err)
			}
			// The newest pair's candidate when none is named.
			if f, err := b.FleetInput(ctx, "chat", "", window, 0); err != nil || f.Candidate != "old" || f.Pairs != 1 || f.RateInstances != 0 {
				t.Fatalf("newest candidate: %+v, %v", f, err)
			}
			// Pruning deletes rates far older than the route's newest, and keep 0 all of them.
			if err := a.AddRate(ctx, RateRecord{Route: "chat", CandidateID: "cand", Instance: "gw-z", Time: t0.Add(-2 * time.Hour), ReferenceRate: 1}); err != nil {
				t.Fatal(err)
			}
			if err := a.Prune(ctx, "chat", 1000); err != nil {
				t.Fatal(err)
			}
			var rows int
			if err := a.c().queryRow(ctx, `SELECT COUNT(*) FROM rates WHERE route = ?`, "chat").Scan(&rows); err != nil || rows != 3 {
				t.Fatalf("%d rate rows after prune, want 3: %v", rows, err)
			}
			if err := a.Prune(ctx, "chat", 0); err != nil {
				t.Fatal(err)
			}
			if err := a.c().queryRow(ctx, `SELECT COUNT(*) FROM rates`).Scan(&rows); err != nil || rows != 0 {
				t.Fatalf("%d rate rows after prune to 0: %v", rows, err)
			}
		})
	}
}

func TestAddRateRefusesBadRates(t *testing.T) {
	s := mustOpen(t, "")
	for _, r := range []RateRecord{{}, {Route: "r", ReferenceRate: -1}, {Route: "r", CandidateRate: posInf()}} {
		if err := s.AddRate(context.Background(), r); err == nil {
			t.Errorf("rate %+v accepted", r)
		}
	}
}

// BenchmarkFleetInput: rebuilding a route's verdict input of window 500 from 2,000 stored
// pairs (RestoreDepth windows), as each gateway of a fleet does every shadow.interval.
func BenchmarkFleetInput(b *testing.B) {
	for _, name := range []string{"file", "postgres"} {
		b.Run(name, func(b *testing.B) {
			where := filepath.Join(b.TempDir(), "bench.db")
			if name == "postgres" {
				where = pgShared.DB(b)
			}
			s, err := OpenStore(context.Background(), where)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			t0 := time.Now()
			for i := range 2000 {
				p := testTriple("chat", i, t0.Add(time.Duration(i)*time.Millisecond), false)
				p.CandidateID, p.Instance = "cand", []string{"gw-a", "gw-b", "gw-c"}[i%3]
				if err := s.AddPair(ctx, p); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				f, err := s.FleetInput(ctx, "chat", "cand", 500, 0)
				if err != nil || f.Pairs != 2000 {
					b.Fatalf("%d pairs, %v", f.Pairs, err)
				}
			}
		})
	}
}

// BenchmarkAddPair: writing one pair (the writer's unit of work for a shared store).
func BenchmarkAddPair(b *testing.B) {
	for _, name := range []string{"file", "postgres"} {
		b.Run(name, func(b *testing.B) {
			where := filepath.Join(b.TempDir(), "bench.db")
			if name == "postgres" {
				where = pgShared.DB(b)
			}
			s, err := OpenStore(context.Background(), where)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			p := testTriple("chat", 1, time.Now(), false)
			for b.Loop() {
				if err := s.AddPair(context.Background(), p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSourceRing: the instances of the newest window pairs are counted, at most maxSources
// names, the rest together.
func TestSourceRing(t *testing.T) {
	tests := []struct {
		name   string
		window int
		adds   []string
		want   map[string]int
	}{
		{"empty", 4, nil, map[string]int{}},
		{"within the window", 4, []string{"a", "b", "a"}, map[string]int{"a": 2, "b": 1}},
		{"the newest window", 3, []string{"a", "a", "a", "b", "b"}, map[string]int{"a": 1, "b": 2}},
	}
	many := make([]string, maxSources+10)
	for i := range many {
		many[i] = fmt.Sprintf("gw-%03d", i)
	}
	wantMany := map[string]int{otherSources: 10}
	for _, n := range many[:maxSources] {
		wantMany[n] = 1
	}
	tests = append(tests, struct {
		name   string
		window int
		adds   []string
		want   map[string]int
	}{"too many names", len(many), many, wantMany})
	for _, tt := range tests {
		r := newSourceRing(tt.window)
		for _, a := range tt.adds {
			r.add(a)
		}
		if got := r.counts(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
