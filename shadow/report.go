package shadow

import (
	"context"
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// MirrorStats are a route's mirror counters, supplied by the mirroring runtime: requests
// offered to the mirror (chosen by the fraction), copies sent to the sandbox, copies
// dropped because the queue was full, copies that failed before an answer, and replica
// requests sent to the primary cluster for the noise floor.
type MirrorStats struct {
	Offered  int64 `json:"offered"`
	Mirrored int64 `json:"mirrored"`
	Dropped  int64 `json:"dropped"`
	Failed   int64 `json:"failed"`
	Replicas int64 `json:"replicas"`
}

// RouteInput is what the gateway knows of one mirrored route when a report is built.
// Everything is optional but Route: a nil Input is rebuilt from the store (Store.Restore
// over Window pairs), a nil Verdict is the latest stored one, else Evaluate(Config, Input).
type RouteInput struct {
	Route            string
	PrimaryCluster   string
	CandidateCluster string
	// CandidateID selects the stored pairs restored when Input is nil ("" : the newest's).
	CandidateID string
	// Input is the current accumulator's snapshot (Accumulator.Input).
	Input *Input
	// Pairs and Replicas are the accumulator's totals (Accumulator.Counts).
	Pairs, Replicas int64
	// Verdict is the current verdict, made at VerdictTime.
	Verdict     *Verdict
	VerdictTime time.Time
	// Action is what the gateway did on the current verdict (e.g. "weight 10→20").
	Action string
	Mirror MirrorStats
	// Config holds the thresholds (WithDefaults is applied).
	Config Config
	// Window bounds the pairs restored when Input is nil (DefaultWindow when ≤ 0).
	Window int
}

// Report bounds.
const (
	ReportHistory  = 20 // verdicts listed per route
	ReportProblems = 20 // recent pair problems listed per route
	ReportBuckets  = 12 // histogram buckets per latency metric
	// reportProblemScan is how many recent pairs are searched for problems.
	reportProblemScan = 500
)

// Where a route report's verdict came from.
const (
	SourceLive      = "live"      // RouteInput.Verdict
	SourceStored    = "stored"    // the latest verdict in the store
	SourceEvaluated = "evaluated" // computed for this report from the samples
	SourceNone      = "none"
)

// Report is the shadow-traffic report of every mirrored route: served as JSON by
// /admin/shadow.json, rendered by WriteHTML (/admin/shadow) and WriteText (`sluice shadow
// report`). Field names are stable.
type Report struct {
	Generated time.Time     `json:"generated"`
	Routes    []RouteReport `json:"routes"`
}

// RouteReport is one route's part of a Report.
type RouteReport struct {
	Route            string     `json:"route"`
	PrimaryCluster   string     `json:"primary_cluster,omitempty"`
	CandidateCluster string     `json:"candidate_cluster,omitempty"`
	Verdict          *Verdict   `json:"verdict,omitempty"`
	VerdictTime      *time.Time `json:"verdict_time,omitempty"`
	VerdictSource    string     `json:"verdict_source"`
	Action           string     `json:"action,omitempty"`
	// History holds the latest stored verdicts, newest first.
	History       []HistoryEntry    `json:"history"`
	Samples       Samples           `json:"samples"`
	Mirror        MirrorStats       `json:"mirror"`
	Distributions []Distribution    `json:"distributions"`
	Similarity    SimilaritySummary `json:"similarity"`
	// Problems are recent pairs' problems, newest first.
	Problems []PairProblem `json:"problems"`
}

// HistoryEntry is one past verdict.
type HistoryEntry struct {
	Time     time.Time `json:"ts"`
	Decision Decision  `json:"decision"`
	Reason   string    `json:"reason"`
	Pairs    int64     `json:"pairs"`
	Replicas int64     `json:"replicas"`
	Action   string    `json:"action,omitempty"`
}

// ArmCounts are one side's request counts in the judged window.
type ArmCounts struct {
	Requests        int `json:"requests"`
	Errors          int `json:"errors"`
	AbnormalFinish  int `json:"abnormal_finish"`
	SchemaChecked   int `json:"schema_checked"`
	SchemaBroken    int `json:"schema_broken"`
	ToolCallChecked int `json:"tool_call_checked"`
	ToolCallBroken  int `json:"tool_call_broken"`
}

func armCounts(a Arm) ArmCounts {
	return ArmCounts{Requests: a.Requests, Errors: a.Errors, AbnormalFinish: a.AbnormalFinish,
		SchemaChecked: a.SchemaChecked, SchemaBroken: a.SchemaBroken, ToolCallChecked: a.ToolCallChecked,
		ToolCallBroken: a.ToolCallBroken}
}

// Samples says how much data is behind the verdict.
type Samples struct {
	Primary    ArmCounts `json:"primary"`
	Candidate  ArmCounts `json:"candidate"`
	NoiseFloor int       `json:"noise_floor"` // replica similarities in the window
	// PairsTotal and ReplicasTotal are the accumulator's totals since start (or restore).
	PairsTotal    int64 `json:"pairs_total"`
	ReplicasTotal int64 `json:"replicas_total"`
	// StoredPairs and StoredVerdicts are the store's rows for the route.
	StoredPairs    int64 `json:"stored_pairs"`
	StoredVerdicts int64 `json:"stored_verdicts"`
	MinSamples     int   `json:"min_samples"`
}

// Percentiles summarise one sample (NaN-free: zero when N is 0).
type Percentiles struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Distribution shows one latency metric of both sides: percentiles and a histogram over
// shared bucket edges (len(Edges) = buckets+1; the last bucket also holds everything above
// its upper edge).
type Distribution struct {
	Metric          string      `json:"metric"`
	Unit            string      `json:"unit"`
	Primary         Percentiles `json:"primary"`
	Candidate       Percentiles `json:"candidate"`
	Edges           []float64   `json:"edges"`
	PrimaryCounts   []int       `json:"primary_counts"`
	CandidateCounts []int       `json:"candidate_counts"`
}

// SimilaritySummary compares the candidate's similarity to the primary with the noise floor
// (replica vs primary).
type SimilaritySummary struct {
	Candidate  Percentiles   `json:"candidate"`
	NoiseFloor Percentiles   `json:"noise_floor"`
	Margin     float64       `json:"margin"`
	Verdict    MetricVerdict `json:"verdict,omitempty"`
	Note       string        `json:"note,omitempty"`
}

// PairProblem is one problem of a recent pair.
type PairProblem struct {
	Time      time.Time `json:"ts"`
	RequestID string    `json:"request_id,omitempty"`
	Side      string    `json:"side"` // primary, candidate or pair
	Problem   string    `json:"problem"`
}

// BuildReport builds the report of routes. store may be nil (no history, no stored
// verdicts, no restore). With routes nil, every route in the store is reported from
// stored data alone (the offline report).
func BuildReport(ctx context.Context, store *Store, routes []RouteInput) (Report, error) {
	rep := Report{Generated: time.Now().UTC(), Routes: []RouteReport{}}
	if routes == nil && store != nil {
		names, err := store.Routes(ctx)
		if err != nil {
			return rep, err
		}
		for _, n := range names {
			routes = append(routes, RouteInput{Route: n})
		}
	}
	for _, in := range routes {
		rr, err := buildRoute(ctx, store, in)
		if err != nil {
			return rep, fmt.Errorf("shadow report: route %q: %w", in.Route, err)
		}
		rep.Routes = append(rep.Routes, rr)
	}
	return rep, nil
}

func buildRoute(ctx context.Context, store *Store, in RouteInput) (RouteReport, error) {
	cfg := in.Config.WithDefaults()
	rr := RouteReport{Route: in.Route, PrimaryCluster: in.PrimaryCluster, CandidateCluster: in.CandidateCluster,
		Mirror: in.Mirror, Action: in.Action, VerdictSource: SourceNone, History: []HistoryEntry{},
		Problems: []PairProblem{}}
	input := in.Input
	pairs, replicas := in.Pairs, in.Replicas
	if store != nil {
		if input == nil {
			acc := NewAccumulator(in.Window)
			if err := store.Restore(ctx, in.Route, in.CandidateID, acc, in.Window); err != nil {
				return rr, err
			}
			snap := acc.Input()
			input = &snap
			pairs, replicas = acc.Counts()
		}
		vs, err := store.Verdicts(ctx, in.Route, ReportHistory)
		if err != nil {
			return rr, err
		}
		for _, v := range vs {
			rr.History = append(rr.History, HistoryEntry{Time: v.Time.UTC(), Decision: v.Verdict.Decision,
				Reason: v.Verdict.Reason, Pairs: v.Pairs, Replicas: v.Replicas, Action: v.Action})
		}
		if in.Verdict == nil && len(vs) > 0 {
			v, t := vs[0].Verdict, vs[0].Time.UTC()
			rr.Verdict, rr.VerdictTime, rr.VerdictSource = &v, &t, SourceStored
			if rr.Action == "" {
				rr.Action = vs[0].Action
			}
		}
		rr.Samples.StoredPairs, rr.Samples.StoredVerdicts, err = store.Count(ctx, in.Route)
		if err != nil {
			return rr, err
		}
		if rr.Problems, err = recentProblems(ctx, store, in.Route); err != nil {
			return rr, err
		}
	}
	if input == nil {
		input = &Input{}
	}
	if in.Verdict != nil {
		v := *in.Verdict
		rr.Verdict, rr.VerdictSource = &v, SourceLive
		if !in.VerdictTime.IsZero() {
			t := in.VerdictTime.UTC()
			rr.VerdictTime = &t
		}
	}
	if rr.Verdict == nil && input.Primary.Requests > 0 {
		v, err := Evaluate(cfg, *input)
		if err != nil {
			return rr, err
		}
		t := time.Now().UTC()
		rr.Verdict, rr.VerdictTime, rr.VerdictSource = &v, &t, SourceEvaluated
	}
	if rr.Verdict != nil {
		v := *rr.Verdict
		v.Evidence = sanitizeEvidence(v.Evidence)
		rr.Verdict = &v
	}
	rr.Samples.Primary, rr.Samples.Candidate = armCounts(input.Primary), armCounts(input.Candidate)
	rr.Samples.NoiseFloor = len(input.NoiseFloor)
	rr.Samples.PairsTotal, rr.Samples.ReplicasTotal = pairs, replicas
	rr.Samples.MinSamples = cfg.MinSamples
	for _, m := range []struct {
		name string
		p, c []float64
	}{
		{MetricTTFT, input.Primary.TTFT, input.Candidate.TTFT},
		{MetricITL, input.Primary.ITL, input.Candidate.ITL},
		{MetricE2E, input.Primary.E2E, input.Candidate.E2E},
	} {
		rr.Distributions = append(rr.Distributions, distribution(m.name, finite(m.p), finite(m.c)))
	}
	rr.Similarity = SimilaritySummary{Candidate: percentiles(finite(input.CandidateSimilarity)),
		NoiseFloor: percentiles(finite(input.NoiseFloor)), Margin: cfg.SimilarityMargin}
	if rr.Verdict != nil {
		for _, e := range rr.Verdict.Evidence {
			if e.Metric == MetricSimilarity {
				rr.Similarity.Verdict, rr.Similarity.Note = e.Verdict, e.Note
			}
		}
	}
	return rr, nil
}

func recentProblems(ctx context.Context, store *Store, route string) ([]PairProblem, error) {
	ps, err := store.Pairs(ctx, route, reportProblemScan)
	if err != nil {
		return nil, err
	}
	out := []PairProblem{}
	add := func(p PairRecord, side, prob string) bool {
		out = append(out, PairProblem{Time: p.Time.UTC(), RequestID: p.RequestID, Side: side, Problem: prob})
		return len(out) >= ReportProblems
	}
	for _, p := range ps {
		var probs [][2]string
		if !p.Result.Candidate.OK && p.Result.Primary.OK {
			probs = append(probs, [2]string{"candidate", describeFailure(p.Candidate)})
		}
		for _, x := range p.Result.Candidate.Problems {
			probs = append(probs, [2]string{"candidate", x})
		}
		for _, x := range p.Result.Primary.Problems {
			probs = append(probs, [2]string{"primary", x})
		}
		for _, x := range p.Result.Notes {
			probs = append(probs, [2]string{"pair", x})
		}
		for _, pr := range probs {
			if add(p, pr[0], pr[1]) {
				return out, nil
			}
		}
	}
	return out, nil
}

func describeFailure(a Answer) string {
	s := "failed"
	if a.Status != 0 {
		s += fmt.Sprintf(": status %d", a.Status)
	}
	if a.ErrorClass != "" {
		s += " (" + a.ErrorClass + ")"
	}
	return s
}

// quantile is the linearly interpolated q-quantile of sorted s.
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	f := pos - float64(i)
	return s[i] + f*(s[i+1]-s[i])
}

func percentiles(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return Percentiles{N: len(s), Mean: Mean(s), P50: quantile(s, 0.5), P90: quantile(s, 0.9), P99: quantile(s, 0.99)}
}

func distribution(metric string, p, c []float64) Distribution {
	d := Distribution{Metric: metric, Unit: "ms", Primary: percentiles(p), Candidate: percentiles(c)}
	if len(p)+len(c) == 0 {
		d.Edges, d.PrimaryCounts, d.CandidateCounts = []float64{}, []int{}, []int{}
		return d
	}
	lo := math.Inf(1)
	for _, xs := range [][]float64{p, c} {
		for _, v := range xs {
			lo = math.Min(lo, v)
		}
	}
	hi := math.Max(d.Primary.P99, d.Candidate.P99)
	if !(hi > lo) {
		hi = lo + 1
	}
	step := (hi - lo) / ReportBuckets
	d.Edges = make([]float64, ReportBuckets+1)
	for i := range d.Edges {
		d.Edges[i] = lo + float64(i)*step
	}
	count := func(xs []float64) []int {
		out := make([]int, ReportBuckets)
		for _, v := range xs {
			b := int((v - lo) / step)
			out[max(0, min(b, ReportBuckets-1))]++
		}
		return out
	}
	d.PrimaryCounts, d.CandidateCounts = count(p), count(c)
	return d
}

// formatEffect renders an Evidence's effect in its metric's terms: a relative change for
// latencies, percentage points for rates, an absolute difference for similarity.
func formatEffect(e Evidence) string {
	switch {
	case e.Verdict == Skipped || e.Verdict == Insufficient:
		return "-"
	case e.Effect >= math.MaxFloat64 || math.IsInf(e.Effect, 1):
		return "+inf"
	case e.Test == StatMannWhitney && e.Metric != MetricSimilarity:
		return fmt.Sprintf("%+.1f%%", e.Effect*100)
	case e.Metric == MetricSimilarity:
		return fmt.Sprintf("%+.3f", e.Effect)
	default:
		return fmt.Sprintf("%+.2fpp", e.Effect*100)
	}
}

func formatBound(e Evidence) string {
	switch {
	case e.Critical:
		return "any"
	case e.Test == StatMannWhitney && e.Metric != MetricSimilarity:
		return fmt.Sprintf("%.1f%%", e.Bound*100)
	case e.Metric == MetricSimilarity:
		return fmt.Sprintf("%.3f", e.Bound)
	default:
		return fmt.Sprintf("%.2fpp", e.Bound*100)
	}
}

func formatP(e Evidence) string {
	if e.Verdict == Skipped || e.Verdict == Insufficient {
		return "-"
	}
	if e.P < 1e-4 {
		return fmt.Sprintf("%.1e", e.P)
	}
	return fmt.Sprintf("%.4f", e.P)
}

// formatValue renders an Evidence's primary or candidate value: a median in ms, a rate in
// percent, a mean similarity.
func formatValue(e Evidence, v float64) string {
	switch {
	case e.Verdict == Skipped || e.Verdict == Insufficient:
		return "-"
	case e.Metric == MetricSimilarity:
		return fmt.Sprintf("%.3f", v)
	case e.Test == StatMannWhitney:
		return fmtNum(v) + "ms"
	default:
		return fmt.Sprintf("%.2f%%", v*100)
	}
}

// fmtNum prints a latency with 3 significant digits (no exponent below a million).
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func metricName(e Evidence) string {
	if e.Critical {
		return e.Metric + " (critical)"
	}
	return e.Metric
}

// termSafe replaces control characters (escape sequences among them) so that data
// cannot drive the terminal.
func termSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}

// oneLineText flattens s for a terminal table cell.
func oneLineText(s string, n int) string {
	s = termSafe(strings.Join(strings.Fields(s), " "))
	if len(s) > n {
		return cut(s, n-1) + "…"
	}
	return s
}

// WriteText renders the report for a terminal: per route, the decision, the per-metric
// table, the distributions side by side, the similarity against the noise floor, the
// verdict history and recent problems.
func (r Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	if len(r.Routes) == 0 {
		ew.printf("no mirrored routes (no route has a mirror block, or the store is empty)\n")
		return ew.err
	}
	for i, rr := range r.Routes {
		if i > 0 {
			ew.printf("\n")
		}
		writeRouteText(ew, rr)
	}
	return ew.err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }

func writeRouteText(ew *errWriter, rr RouteReport) {
	head := "route " + rr.Route
	if rr.PrimaryCluster != "" || rr.CandidateCluster != "" {
		head += fmt.Sprintf("  (primary %s, candidate %s)", orDash(rr.PrimaryCluster), orDash(rr.CandidateCluster))
	}
	ew.printf("%s\n", termSafe(head))
	if rr.Verdict == nil {
		ew.printf("  decision: NONE  (no verdict and no samples yet)\n")
	} else {
		ew.printf("  decision: %s  %s\n", termSafe(strings.ToUpper(string(rr.Verdict.Decision))), oneLineText(rr.Verdict.Reason, 400))
		when := rr.VerdictSource
		if rr.VerdictTime != nil {
			when += " " + rr.VerdictTime.Format(time.RFC3339)
		}
		ew.printf("  verdict:  %s", when)
		if rr.Action != "" {
			ew.printf("; action %s", oneLineText(rr.Action, MaxNameLen))
		}
		ew.printf("\n")
	}
	m := rr.Mirror
	ew.printf("  mirror:   offered %d, mirrored %d, dropped %d, failed %d, replicas %d\n",
		m.Offered, m.Mirrored, m.Dropped, m.Failed, m.Replicas)
	s := rr.Samples
	ew.printf("  samples:  window %d pairs (candidate errors %d, primary errors %d), noise floor %d, min %d per side; stored %d pairs, %d verdicts\n",
		s.Candidate.Requests, s.Candidate.Errors, s.Primary.Errors, s.NoiseFloor, s.MinSamples, s.StoredPairs, s.StoredVerdicts)
	if rr.Verdict != nil && len(rr.Verdict.Evidence) > 0 {
		ew.printf("\n")
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  metric\ttest\tn (p/c)\tprimary\tcandidate\teffect\tbound\tp\tverdict\t")
		for _, e := range rr.Verdict.Evidence {
			fmt.Fprintf(tw, "  %s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", termSafe(metricName(e)), termSafe(e.Test), e.NPrimary, e.NCandidate,
				formatValue(e, e.Primary), formatValue(e, e.Cand), formatEffect(e), formatBound(e), formatP(e), termSafe(string(e.Verdict)))
		}
		_ = tw.Flush()
	}
	ew.printf("\n")
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  latency (ms)\tprimary n\tp50\tp90\tp99\tcandidate n\tp50\tp90\tp99\t")
	for _, d := range rr.Distributions {
		pp, cp := pcts(d.Primary), pcts(d.Candidate)
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n", termSafe(d.Metric), d.Primary.N, pp[0], pp[1], pp[2],
			d.Candidate.N, cp[0], cp[1], cp[2])
	}
	_ = tw.Flush()
	sim := rr.Similarity
	ew.printf("\n  similarity: candidate mean %.3f (n %d) vs noise floor mean %.3f (n %d), margin %.3f",
		sim.Candidate.Mean, sim.Candidate.N, sim.NoiseFloor.Mean, sim.NoiseFloor.N, sim.Margin)
	if sim.Verdict != "" {
		ew.printf(": %s", sim.Verdict)
	}
	if sim.Note != "" {
		ew.printf(" (%s)", sim.Note)
	}
	ew.printf("\n")
	if len(rr.History) > 0 {
		ew.printf("\n  history (newest first):\n")
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, h := range rr.History {
			fmt.Fprintf(tw, "    %s\t%s\t%d pairs\t%s\t%s\t\n", h.Time.Format(time.RFC3339), termSafe(string(h.Decision)), h.Pairs,
				orDash(oneLineText(h.Action, MaxNameLen)), oneLineText(h.Reason, 100))
		}
		_ = tw.Flush()
	}
	if len(rr.Problems) > 0 {
		ew.printf("\n  recent problems:\n")
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, p := range rr.Problems {
			fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t\n", p.Time.Format(time.RFC3339), termSafe(p.Side), orDash(oneLineText(p.RequestID, 64)),
				oneLineText(p.Problem, 120))
		}
		_ = tw.Flush()
	}
}

// pcts renders p50, p90 and p99 ("-" without samples).
func pcts(p Percentiles) [3]string {
	if p.N == 0 {
		return [3]string{"-", "-", "-"}
	}
	return [3]string{fmtNum(p.P50), fmtNum(p.P90), fmtNum(p.P99)}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// The HTML view: everything precomputed, the template only places it.
type htmlRoute struct {
	RouteReport
	Class, Decision, When string
	Rows                  []htmlRow
	Charts                []htmlChart
}

type htmlRow struct {
	Metric, Test, N, Primary, Cand, Effect, Bound, P, Verdict, Class, Note string
}

type htmlChart struct {
	Distribution
	Bars           []htmlBar
	Width, Height  int
	LoLabel        string
	MidLabel       string
	HiLabel        string
	PrimaryLabel   string
	CandidateLabel string
}

type htmlBar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

const (
	chartW, chartH, chartPad = 420, 120, 4
)

func chart(d Distribution) htmlChart {
	c := htmlChart{Distribution: d, Width: chartW, Height: chartH + 18}
	c.PrimaryLabel = fmt.Sprintf("p50 %s, p90 %s, p99 %s ms (n %d)", fmtNum(d.Primary.P50), fmtNum(d.Primary.P90), fmtNum(d.Primary.P99), d.Primary.N)
	c.CandidateLabel = fmt.Sprintf("p50 %s, p90 %s, p99 %s ms (n %d)", fmtNum(d.Candidate.P50), fmtNum(d.Candidate.P90), fmtNum(d.Candidate.P99), d.Candidate.N)
	n := len(d.PrimaryCounts)
	if n == 0 || len(d.CandidateCounts) != n || len(d.Edges) != n+1 {
		return c
	}
	// Bars show each side's share of its own samples, so unequal n compare fairly.
	share := func(k, total int) float64 {
		if total == 0 {
			return 0
		}
		return float64(k) / float64(total)
	}
	top := 0.0
	for i := range n {
		top = math.Max(top, math.Max(share(d.PrimaryCounts[i], d.Primary.N), share(d.CandidateCounts[i], d.Candidate.N)))
	}
	if top == 0 {
		return c
	}
	bw := float64(chartW-2*chartPad) / float64(n)
	for i := range n {
		x := chartPad + float64(i)*bw
		for j, side := range []struct {
			k, total int
			class    string
		}{{d.PrimaryCounts[i], d.Primary.N, "p"}, {d.CandidateCounts[i], d.Candidate.N, "c"}} {
			h := share(side.k, side.total) / top * (chartH - 10)
			c.Bars = append(c.Bars, htmlBar{X: x + float64(j)*bw/2, Y: chartH - h, W: math.Max(bw/2-1, 1), H: h,
				Class: side.class, Title: fmt.Sprintf("%s–%s ms: %d", fmtNum(d.Edges[i]), fmtNum(d.Edges[i+1]), side.k)})
		}
	}
	c.LoLabel, c.MidLabel, c.HiLabel = fmtNum(d.Edges[0]), fmtNum(d.Edges[n/2]), fmtNum(d.Edges[n])+"+"
	return c
}

func htmlRoutes(r Report) []htmlRoute {
	var out []htmlRoute
	for _, rr := range r.Routes {
		h := htmlRoute{RouteReport: rr, Class: "none", Decision: "NO VERDICT"}
		if rr.Verdict != nil {
			h.Class, h.Decision = string(rr.Verdict.Decision), strings.ToUpper(string(rr.Verdict.Decision))
			h.When = rr.VerdictSource
			if rr.VerdictTime != nil {
				h.When += " " + rr.VerdictTime.Format(time.RFC3339)
			}
			for _, e := range rr.Verdict.Evidence {
				h.Rows = append(h.Rows, htmlRow{Metric: metricName(e), Test: e.Test,
					N: fmt.Sprintf("%d / %d", e.NPrimary, e.NCandidate), Primary: formatValue(e, e.Primary),
					Cand: formatValue(e, e.Cand), Effect: formatEffect(e), Bound: formatBound(e), P: formatP(e),
					Verdict: string(e.Verdict), Class: string(e.Verdict), Note: e.Note})
			}
		}
		for _, d := range rr.Distributions {
			h.Charts = append(h.Charts, chart(d))
		}
		out = append(out, h)
	}
	return out
}

var htmlTmpl = template.Must(template.New("shadow").Funcs(template.FuncMap{
	"ts":  func(t time.Time) string { return t.Format(time.RFC3339) },
	"f3":  func(v float64) string { return fmt.Sprintf("%.3f", v) },
	"f1":  func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"up":  func(d Decision) string { return strings.ToUpper(string(d)) },
	"low": func(d Decision) string { return string(d) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sluice shadow report</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.2em;margin:1.6em 0 .4em}h3{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse;margin:.3em 0 1em}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.banner{padding:.7em 1em;border-radius:6px;color:#fff;font-weight:600;margin:.4em 0}
.banner small{font-weight:400;opacity:.9;display:block}
.banner.promote{background:#2e7d32}.banner.hold{background:#b26a00}.banner.rollback{background:#c62828}.banner.none{background:#616161}
td.regression,td.rollback{color:#c62828;font-weight:600}td.pass,td.promote{color:#2e7d32}
td.inconclusive,td.insufficient,td.hold{color:#b26a00}td.skipped{color:#777}
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{border:1px solid #ddd;border-radius:6px;padding:.5em}
svg rect.p{fill:#1f77b4}svg rect.c{fill:#ff7f0e}svg text{font-size:10px;fill:#555}
.legend span{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 .8em;vertical-align:middle}
.lp{background:#1f77b4}.lc{background:#ff7f0e}.muted{color:#666}
</style></head><body>
<h1>Sluice shadow report</h1>
<p class="muted">Generated {{ts .Generated}}. Candidate versus primary on mirrored traffic; a difference counts only when it is significant and beyond its bound (latency: Mann-Whitney U, rates: two-proportion or Fisher, similarity: against the primary-vs-primary noise floor).</p>
{{if not .Routes}}<p>No mirrored routes (no route has a mirror block, or the store is empty).</p>{{end}}
{{range .Routes}}
<section>
<h2>Route {{.Route}}</h2>
{{if or .PrimaryCluster .CandidateCluster}}<p>primary <b>{{.PrimaryCluster}}</b>, candidate <b>{{.CandidateCluster}}</b></p>{{end}}
<div class="banner {{.Class}}">{{.Decision}}{{if .Verdict}} — {{.Verdict.Reason}}{{end}}
<small>{{if .When}}verdict {{.When}}{{end}}{{if .Action}}; action {{.Action}}{{end}}</small></div>
<p>Mirror: offered {{.Mirror.Offered}}, mirrored {{.Mirror.Mirrored}}, dropped {{.Mirror.Dropped}}, failed {{.Mirror.Failed}}, replicas {{.Mirror.Replicas}}.
Window: {{.Samples.Candidate.Requests}} pairs (candidate errors {{.Samples.Candidate.Errors}}, primary errors {{.Samples.Primary.Errors}}), noise floor {{.Samples.NoiseFloor}}, at least {{.Samples.MinSamples}} per side needed. Stored: {{.Samples.StoredPairs}} pairs, {{.Samples.StoredVerdicts}} verdicts.</p>
{{if .Rows}}
<h3>Per-metric tests</h3>
<table><tr><th>metric</th><th>test</th><th>n (primary / candidate)</th><th>primary</th><th>candidate</th><th>effect</th><th>bound</th><th>p</th><th>verdict</th></tr>
{{range .Rows}}<tr><td>{{.Metric}}</td><td>{{.Test}}</td><td class="num">{{.N}}</td><td class="num">{{.Primary}}</td><td class="num">{{.Cand}}</td><td class="num">{{.Effect}}</td><td class="num">{{.Bound}}</td><td class="num">{{.P}}</td><td class="{{.Class}}" title="{{.Note}}">{{.Verdict}}{{if .Note}} <span class="muted">({{.Note}})</span>{{end}}</td></tr>
{{end}}</table>
{{end}}
<h3>Latency distributions</h3>
<div class="legend"><span class="lp"></span>primary<span class="lc"></span>candidate <span class="muted">(bars: share of each side's samples per bucket; the last bucket holds everything above)</span></div>
<div class="charts">
{{range .Charts}}<div class="chart"><b>{{.Metric}}</b> <span class="muted">({{.Unit}})</span><br>
<span class="muted">primary {{.PrimaryLabel}}<br>candidate {{.CandidateLabel}}</span><br>
{{if .Bars}}<svg width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Metric}} histogram">
{{range .Bars}}<rect class="{{.Class}}" x="{{f1 .X}}" y="{{f1 .Y}}" width="{{f1 .W}}" height="{{f1 .H}}"><title>{{.Title}}</title></rect>
{{end}}<text x="4" y="{{.Height}}">{{.LoLabel}}</text><text x="{{.Width}}" y="{{.Height}}" text-anchor="end">{{.HiLabel}}</text><text x="210" y="{{.Height}}" text-anchor="middle">{{.MidLabel}}</text>
</svg>{{else}}<p class="muted">no samples</p>{{end}}
</div>
{{end}}</div>
<h3>Similarity against the noise floor</h3>
<table><tr><th></th><th>n</th><th>mean</th><th>p50</th><th>p90</th></tr>
<tr><td>candidate vs primary</td><td class="num">{{.Similarity.Candidate.N}}</td><td class="num">{{f3 .Similarity.Candidate.Mean}}</td><td class="num">{{f3 .Similarity.Candidate.P50}}</td><td class="num">{{f3 .Similarity.Candidate.P90}}</td></tr>
<tr><td>replica vs primary (noise floor)</td><td class="num">{{.Similarity.NoiseFloor.N}}</td><td class="num">{{f3 .Similarity.NoiseFloor.Mean}}</td><td class="num">{{f3 .Similarity.NoiseFloor.P50}}</td><td class="num">{{f3 .Similarity.NoiseFloor.P90}}</td></tr>
</table>
<p>Margin {{f3 .Similarity.Margin}}{{if .Similarity.Verdict}}: <b>{{.Similarity.Verdict}}</b>{{end}}{{if .Similarity.Note}} <span class="muted">({{.Similarity.Note}})</span>{{end}}</p>
{{if .History}}
<h3>Verdict history</h3>
<table><tr><th>time</th><th>decision</th><th>pairs</th><th>replicas</th><th>action</th><th>reason</th></tr>
{{range .History}}<tr><td>{{ts .Time}}</td><td class="{{low .Decision}}">{{up .Decision}}</td><td class="num">{{.Pairs}}</td><td class="num">{{.Replicas}}</td><td>{{.Action}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>
{{end}}
{{if .Problems}}
<h3>Recent pair problems</h3>
<table><tr><th>time</th><th>side</th><th>request</th><th>problem</th></tr>
{{range .Problems}}<tr><td>{{ts .Time}}</td><td>{{.Side}}</td><td>{{.RequestID}}</td><td>{{.Problem}}</td></tr>
{{end}}</table>
{{end}}
</section>
{{end}}
</body></html>
`))

// WriteHTML renders the report as one self-contained HTML page (no external assets):
// per route a verdict banner, the per-metric test table, the latency distributions side
// by side as inline SVG histograms, the similarity against the noise floor, the verdict
// history and recent pair problems. Everything from the data is escaped.
func (r Report) WriteHTML(w io.Writer) error {
	data := struct {
		Generated time.Time
		Routes    []htmlRoute
	}{r.Generated, htmlRoutes(r)}
	if err := htmlTmpl.Execute(w, data); err != nil {
		return fmt.Errorf("shadow report: html: %w", err)
	}
	return nil
}
