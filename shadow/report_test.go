package shadow

import (
	"bytes"
	"context"
	"encoding/json"
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
