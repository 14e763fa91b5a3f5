package shadow

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// slowInput is an input whose candidate is 30% slower in TTFT.
func slowInput(n int, slow float64) Input {
	rng := rand.New(rand.NewPCG(1, 2))
	var in Input
	for range n {
		p := 100 + rng.NormFloat64()*5
		in.Primary.TTFT = append(in.Primary.TTFT, p)
		in.Candidate.TTFT = append(in.Candidate.TTFT, p*slow+rng.NormFloat64()*5)
		in.Primary.E2E = append(in.Primary.E2E, 10*p)
		in.Candidate.E2E = append(in.Candidate.E2E, 10*p)
		in.CandidateSimilarity = append(in.CandidateSimilarity, 0.8)
	}
	in.Primary.Requests, in.Candidate.Requests = n, n
	return in
}

func TestBuildReportAndRender(t *testing.T) {
	ctx := context.Background()
	store, err := OpenStore(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	t0 := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	route := `chat<script>alert("x")</script>`
	for i := range 12 {
		if err := store.AddPair(ctx, testPair(route, i, t0.Add(time.Duration(i)*time.Second), i == 11)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{MinSamples: 20}
	slow := slowInput(200, 1.3)
	v, err := Evaluate(cfg, slow)
	if err != nil {
		t.Fatal(err)
	}
	held := Verdict{Decision: Hold, Reason: "not decided", Evidence: v.Evidence}
	if err := store.AddVerdict(ctx, VerdictRecord{Route: route, Time: t0, Verdict: held, Pairs: 12}); err != nil {
		t.Fatal(err)
	}
	same := slowInput(200, 1)
	tests := []struct {
		name     string
		in       []RouteInput
		decision string
		source   string
		rows     []string // substrings of the text rendering
	}{
		{name: "live slow candidate", decision: "rollback", source: SourceLive,
			in: []RouteInput{{Route: route, PrimaryCluster: "llama-primary", CandidateCluster: "llama-cand", Input: &slow,
				Verdict: &v, VerdictTime: t0.Add(time.Minute), Action: "weight 10→0", Mirror: MirrorStats{Offered: 300, Mirrored: 250, Dropped: 50}, Config: cfg}},
			rows: []string{"decision: ROLLBACK", "ttft", "mann-whitney-u", "200/200", "regression", "tool_call_breakage (critical)", "dropped 50", "action weight 10→0"}},
		{name: "evaluated identical", decision: "promote", source: SourceEvaluated,
			in:   []RouteInput{{Route: "same", Input: &same, Config: cfg}},
			rows: []string{"decision: PROMOTE", "error_rate", "two-proportion-z"}},
		{name: "offline from the store", decision: "hold", source: SourceStored, in: nil,
			rows: []string{"decision: HOLD", "history (newest first)", "recent problems", "candidate", "text is not JSON"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st *Store
			if tt.in == nil || tt.in[0].Route == route {
				st = store
			}
			rep, err := BuildReport(ctx, st, tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Routes) != 1 {
				t.Fatalf("%d routes", len(rep.Routes))
			}
			rr := rep.Routes[0]
			if rr.Verdict == nil || string(rr.Verdict.Decision) != tt.decision || rr.VerdictSource != tt.source {
				t.Fatalf("verdict %+v source %s", rr.Verdict, rr.VerdictSource)
			}
			if len(rr.Distributions) != 3 {
				t.Fatalf("distributions %+v", rr.Distributions)
			}
			for _, d := range rr.Distributions {
				if d.Primary.N > 0 && (len(d.Edges) != ReportBuckets+1 || sum(d.PrimaryCounts) != d.Primary.N || sum(d.CandidateCounts) != d.Candidate.N) {
					t.Errorf("%s histogram: %+v", d.Metric, d)
				}
			}
			// JSON round trip with stable names.
			b, err := json.Marshal(rep)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{`"routes"`, `"verdict_source"`, `"distributions"`, `"p99"`, `"primary_counts"`, `"noise_floor"`, `"mirror"`} {
				if !bytes.Contains(b, []byte(k)) {
					t.Errorf("JSON lacks %s", k)
				}
			}
			var back Report
			if err := json.Unmarshal(b, &back); err != nil || back.Routes[0].Verdict.Decision != rr.Verdict.Decision {
				t.Fatalf("JSON round trip: %v", err)
			}
			var txt bytes.Buffer
			if err := rep.WriteText(&txt); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.rows {
				if !strings.Contains(txt.String(), w) {
					t.Errorf("text lacks %q:\n%s", w, txt.String())
				}
			}
			if testing.Verbose() {
				t.Log("\n" + txt.String())
			}
			var h bytes.Buffer
			if err := rep.WriteHTML(&h); err != nil {
				t.Fatal(err)
			}
			html := h.String()
			for _, w := range []string{`class="banner ` + tt.decision + `"`, strings.ToUpper(tt.decision), "<svg", "Per-metric tests", "<td>ttft</td>"} {
				if !strings.Contains(html, w) {
					t.Errorf("html lacks %q", w)
				}
			}
			if strings.Contains(html, "<script>") || strings.Contains(html, "http://") && !strings.Contains(html, "xmlns") {
				t.Errorf("html has unescaped script or external references")
			}
			if rr.Route == route && !strings.Contains(html, "chat&lt;script&gt;") {
				t.Errorf("route name not escaped")
			}
		})
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

func TestReportEmpty(t *testing.T) {
	rep, err := BuildReport(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var txt, h bytes.Buffer
	if err := rep.WriteText(&txt); err != nil || !strings.Contains(txt.String(), "no mirrored routes") {
		t.Fatalf("%v %q", err, txt.String())
	}
	if err := rep.WriteHTML(&h); err != nil || !strings.Contains(h.String(), "No mirrored routes") {
		t.Fatalf("%v", err)
	}
	// A route with nothing yet: no verdict, empty histograms, no NaN in JSON.
	rep, err = BuildReport(context.Background(), nil, []RouteInput{{Route: "new"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Routes[0].Verdict != nil || rep.Routes[0].VerdictSource != SourceNone {
		t.Fatalf("%+v", rep.Routes[0])
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Fatal(err)
	}
	txt.Reset()
	if err := rep.WriteText(&txt); err != nil || !strings.Contains(txt.String(), "decision: NONE") {
		t.Fatalf("%v %s", err, txt.String())
	}
	if err := rep.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
}

// tripleInput accumulates n triples whose candidate is slow times the baseline in TTFT
// (the primary as fast as the baseline), with loads and noise-floor samples.
func tripleInput(n int, slow float64) Input {
	rng := rand.New(rand.NewPCG(3, 4))
	acc := NewAccumulator(n)
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for range n {
		b := 100 + rng.NormFloat64()*20
		side := func(ttft float64) SideResult {
			return SideResult{OK: true, TTFT: ms(ttft), ITL: 8 * time.Millisecond, E2E: ms(10 * ttft), SchemaChecked: true}
		}
		p, bs, c := side(b*(1+rng.NormFloat64()*0.02)), side(b), side(b*slow*(1+rng.NormFloat64()*0.02))
		acc.Add(PairResult{Primary: p, Baseline: &bs, Candidate: c, Similarity: 0.8, SimilarityValid: true,
			NoiseSimilarity: 0.82, NoiseValid: true, Loads: Loads{Primary: 6, Baseline: 2, Candidate: 2.5, Valid: true}})
	}
	return acc.Input()
}

func TestReportTriple(t *testing.T) {
	ctx := context.Background()
	store, err := OpenStore(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := range 9 {
		if err := store.AddPair(ctx, testTriple("chat", i, t0.Add(time.Duration(i)*time.Second), i == 8)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{MinSamples: 20}
	slow := tripleInput(200, 1.3)
	// Without a baseline, the primary served four times the candidate's load: its
	// latencies are not comparable. Its schema checks are too few to judge.
	unpaired := slowInput(200, 1.3)
	for range 200 {
		unpaired.Load.Reference = append(unpaired.Load.Reference, 8)
		unpaired.Load.Candidate = append(unpaired.Load.Candidate, 2)
	}
	unpaired.Load.ReferenceRate, unpaired.Load.CandidateRate = 8, 2
	unpaired.Primary.SchemaChecked, unpaired.Candidate.SchemaChecked = 5, 5
	mirror := MirrorStats{Offered: 300, Mirrored: 250, Dropped: 50, Compared: 240, Incomplete: 2, Sides: []SideStats{
		{Side: "candidate", Cluster: "llama-cand", Sent: 250, Failed: 3, Compared: 240},
		{Side: "baseline", Cluster: `llama-base<script>`, Sent: 250, Failed: 1, Compared: 240},
	}}
	tests := []struct {
		name     string
		in       []RouteInput
		decision string
		text     []string // substrings of the text rendering
		html     []string // and of the HTML one
		check    func(t *testing.T, rr RouteReport)
	}{
		{name: "triples", decision: "rollback",
			in: []RouteInput{{Route: "chat", PrimaryCluster: "llama-primary", CandidateCluster: "llama-cand", Input: &slow,
				Mirror: mirror, Config: cfg}},
			text: []string{"baseline llama-base", "reference", "wilcoxon-signed-rank", "200 pairs", "×1.3", "×1.10",
				"compared 240, incomplete 2", "side", "cluster", "llama-cand", "sent", "baseline errors 0",
				"noise floor 200 (primary against baseline)", "mean in flight per endpoint: baseline 2.0, candidate 2.5 (n 200)",
				"baseline n", "noise floor (primary against baseline)"},
			html: []string{`<rect class="b"`, `<span class="lb"></span>baseline`, "<td>baseline</td>", "<th>reference</th>",
				"llama-base&lt;script&gt;", "<td>wilcoxon-signed-rank</td>", "200 pairs", "baseline p50", "compared 240",
				"<td class=\"num\">240</td>", "Loads: mean in flight per endpoint: baseline 2.0, candidate 2.5 (n 200)."},
			check: func(t *testing.T, rr RouteReport) {
				if rr.BaselineCluster != "llama-base<script>" || rr.Samples.Baseline == nil || rr.Samples.Baseline.Requests != 200 {
					t.Errorf("baseline cluster %q samples %+v", rr.BaselineCluster, rr.Samples.Baseline)
				}
				for _, d := range rr.Distributions {
					if d.Baseline == nil || d.Baseline.N != 200 || sum(d.BaselineCounts) != 200 || len(d.BaselineCounts) != ReportBuckets {
						t.Errorf("%s: baseline arm %+v", d.Metric, d)
					}
				}
				e := rr.Verdict.Evidence[0]
				if e.Metric != MetricTTFT || e.Reference != "baseline" || e.Ratio < 1.2 || !(e.Low < e.Ratio && e.Ratio < e.High) ||
					!strings.HasPrefix(formatEffect(e), fmt.Sprintf("×%.2f [%.2f, %.2f]", e.Ratio, e.Low, e.High)) {
					t.Errorf("ttft evidence %+v: %s", e, formatEffect(e))
				}
				if rr.Loads == nil || rr.Loads.ReferenceName != "baseline" || rr.Loads.Reference != 2 || rr.Loads.Candidate != 2.5 {
					t.Errorf("loads %+v", rr.Loads)
				}
			}},
		{name: "not comparable without a baseline", decision: "hold",
			in: []RouteInput{{Route: "solo", Input: &unpaired, Config: cfg, Mirror: MirrorStats{Offered: 10, Failed: 1, Replicas: 2}}},
			text: []string{"notes:", "ttft not_comparable: loads differ", "e2e not_comparable: loads differ",
				"schema_breakage not_exercised: 5 checked", "mean in flight per endpoint: primary 8.0, candidate 2.0 (n 200)",
				"requests a second per endpoint: primary 8.0, candidate 2.0",
				"failed 1, replicas 2", "mann-whitney-u"},
			html: []string{`class="not_comparable"`, "loads differ", `class="not_exercised"`, "failed 1, replicas 2"},
			check: func(t *testing.T, rr RouteReport) {
				if rr.Samples.Baseline != nil || rr.Distributions[0].Baseline != nil || rr.BaselineCluster != "" {
					t.Errorf("a baseline appeared: %+v", rr.Samples)
				}
				if rr.Loads == nil || rr.Loads.ReferenceName != "primary" || rr.Loads.ReferenceRate != 8 || rr.Loads.CandidateRate != 2 {
					t.Errorf("loads %+v", rr.Loads)
				}
				for _, e := range rr.Verdict.Evidence[:3] {
					if e.Metric != MetricITL && (e.Verdict != NotComparable || !strings.Contains(e.Note, "8.0")) {
						t.Errorf("%s: %s (%s), want not_comparable with the loads", e.Metric, e.Verdict, e.Note)
					}
				}
			}},
		{name: "offline triples", decision: "hold", in: nil,
			text: []string{"recent problems", "text is not JSON", "baseline n", "failed: status 503 (upstream_5xx)"},
			html: []string{`<rect class="b"`, "<td>baseline</td>"},
			check: func(t *testing.T, rr RouteReport) {
				if rr.Samples.Baseline == nil || rr.Samples.Baseline.Requests != 9 || rr.Samples.Baseline.Errors != 3 {
					t.Errorf("restored baseline samples %+v", rr.Samples.Baseline)
				}
				var sides []string
				for _, p := range rr.Problems {
					sides = append(sides, p.Side)
				}
				if !strings.Contains(strings.Join(sides, " "), "baseline") {
					t.Errorf("no baseline problem among %v", sides)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st *Store
			if tt.in == nil {
				st = store
			}
			rep, err := BuildReport(ctx, st, tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Routes) != 1 {
				t.Fatalf("%d routes", len(rep.Routes))
			}
			rr := rep.Routes[0]
			if rr.Verdict == nil || string(rr.Verdict.Decision) != tt.decision {
				t.Fatalf("verdict %+v", rr.Verdict)
			}
			tt.check(t, rr)
			b, err := json.Marshal(rep)
			if err != nil {
				t.Fatal(err)
			}
			if tt.name == "triples" {
				for _, k := range []string{`"baseline":{`, `"baseline_counts"`, `"baseline_cluster"`, `"loads":{"reference_name":"baseline"`,
					`"sides":[`, `"compared":240`, `"incomplete":2`, `"ratio":`, `"ratio_low":`, `"reference":"baseline"`, `"noise_floor_source":"baseline"`} {
					if !bytes.Contains(b, []byte(k)) {
						t.Errorf("JSON lacks %s", k)
					}
				}
			}
			var txt bytes.Buffer
			if err := rep.WriteText(&txt); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.text {
				if !strings.Contains(txt.String(), w) {
					t.Errorf("text lacks %q:\n%s", w, txt.String())
				}
			}
			if testing.Verbose() {
				t.Log("\n" + txt.String())
			}
			var h bytes.Buffer
			if err := rep.WriteHTML(&h); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.html {
				if !strings.Contains(h.String(), w) {
					t.Errorf("html lacks %q", w)
				}
			}
			if strings.Contains(h.String(), "<script>") {
				t.Errorf("html has an unescaped script")
			}
		})
	}
}

// TestReportKeepsSteps: a verdict that changed a weight stays in the report's steps however
// many verdicts followed it (the history shows the newest ReportHistory only); recommendations
// and refusals are not steps.
func TestReportKeepsSteps(t *testing.T) {
	ctx := context.Background()
	store, err := OpenStore(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	t0 := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	add := func(i int, action string) {
		t.Helper()
		v := VerdictRecord{Route: "r", Time: t0.Add(time.Duration(i) * time.Second), Verdict: Verdict{Decision: Promote, Reason: "ok"},
			Pairs: 40, Action: action, Instance: "sluice xds"}
		if err := store.AddVerdict(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	add(0, "weight cand 0→10")
	add(1, "recommend cand weight 10→20 (the control plane owns the weights)")
	for i := 2; i < 2+3*ReportHistory; i++ {
		add(i, "")
	}
	add(100, "weight cand 10→20")
	rep, err := BuildReport(ctx, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Routes) != 1 {
		t.Fatalf("routes %+v", rep.Routes)
	}
	rr := rep.Routes[0]
	if len(rr.History) != ReportHistory || len(rr.Steps) != 2 || rr.Steps[0].Action != "weight cand 10→20" || rr.Steps[1].Action != "weight cand 0→10" {
		t.Fatalf("history %d, steps %+v", len(rr.History), rr.Steps)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "weight steps (newest first)") || !strings.Contains(b.String(), "weight cand 0→10") {
		t.Errorf("text report lacks the steps:\n%s", b.String())
	}
	var h strings.Builder
	if err := rep.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(h.String(), "Weight steps") || !strings.Contains(h.String(), "weight cand 0→10") {
		t.Error("HTML report lacks the steps")
	}
}
