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
// offered to the mirror (chosen by the fraction), mirrored (their sandbox copies sent),
// dropped (a queue was full: before sending, or before comparing), compared (pairs or
// triples judged) and incomplete (the primary did not finish, or did not within the
// mirror's time-out), and per side what was sent, failed and compared.
type MirrorStats struct {
	Offered    int64 `json:"offered"`
	Mirrored   int64 `json:"mirrored"`
	Dropped    int64 `json:"dropped"`
	Compared   int64 `json:"compared"`
	Incomplete int64 `json:"incomplete"`
	// Failed counts the candidate's failed copies, Replicas the replica answers taken into
	// the noise floor (kept for readers of older reports; Sides has the same).
	Failed   int64       `json:"failed"`
	Replicas int64       `json:"replicas"`
	Sides    []SideStats `json:"sides,omitempty"`
}

// SideStats are one sandbox side's counters: the candidate, the baseline or the replica
// (copies to the primary's own cluster).
type SideStats struct {
	Side     string `json:"side"`
	Cluster  string `json:"cluster"`
	Sent     int64  `json:"sent"`
	Failed   int64  `json:"failed"`
	Compared int64  `json:"compared"`
}

// RouteInput is what the gateway knows of one mirrored route when a report is built.
// Everything is optional but Route: a nil Input is rebuilt from the store (Store.Restore
// over Window pairs), a nil Verdict is the latest stored one, else Evaluate(Config, Input).
type RouteInput struct {
	Route            string
	PrimaryCluster   string
	CandidateCluster string
	// BaselineCluster is the baseline's sandbox cluster, when the route has one ("": the
	// cluster of Mirror's "baseline" side, if any).
	BaselineCluster string
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
	// Scope and Sources say what Input holds (see RouteReport); set by a gateway whose
	// verdict was judged over a shared store's pairs. When Input is nil they are filled from
	// the store.
	Scope   string
	Sources []Source
}

// Report bounds.
const (
	ReportHistory  = 20 // verdicts listed per route
	ReportSteps    = 20 // weight steps listed per route
	ReportProblems = 20 // recent pair problems listed per route
	ReportBuckets  = 12 // histogram buckets per latency metric
	// reportProblemScan is how many recent pairs are searched for problems.
	reportProblemScan = 500
)

// What a route's verdict judged (RouteReport.Scope).
const (
	// ScopeFleet: every gateway instance's pairs in a shared store (FleetInput).
	ScopeFleet = "fleet"
	// ScopeInstance: this gateway's own pairs only: its store is not shared, or the shared
	// store could not be read for the verdict (then progression does not promote).
	ScopeInstance = "instance"
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
	// Store is the state of the store the report read, when known.
	Store *StoreStatus `json:"store,omitempty"`
}

// StoreStatus describes a gateway's shadow store: its kind ("postgres", "sqlite" or
// "memory"), where it is (the PostgreSQL URL with its password masked), whether replicas
// share it and this gateway's name there (Instance), why it is not open (Error), and for a
// shared store the writer that holds records while the database cannot take them.
type StoreStatus struct {
	Kind     string       `json:"kind"`
	Location string       `json:"location,omitempty"`
	Shared   bool         `json:"shared"`
	Instance string       `json:"instance,omitempty"`
	Error    string       `json:"error,omitempty"`
	Writer   *WriterStats `json:"writer,omitempty"`
}

// RouteReport is one route's part of a Report.
type RouteReport struct {
	Route            string     `json:"route"`
	PrimaryCluster   string     `json:"primary_cluster,omitempty"`
	BaselineCluster  string     `json:"baseline_cluster,omitempty"`
	CandidateCluster string     `json:"candidate_cluster,omitempty"`
	Verdict          *Verdict   `json:"verdict,omitempty"`
	VerdictTime      *time.Time `json:"verdict_time,omitempty"`
	VerdictSource    string     `json:"verdict_source"`
	// Scope is what the verdict and the samples judged: ScopeFleet (every instance's
	// pairs in a shared store, Sources naming them) or ScopeInstance ("" when unknown).
	Scope   string   `json:"scope,omitempty"`
	Sources []Source `json:"sources,omitempty"`
	Action  string   `json:"action,omitempty"`
	// History holds the latest stored verdicts, newest first.
	History []HistoryEntry `json:"history"`
	// Steps holds the latest stored verdicts that changed a weight (the rollout's steps, by a
	// gateway's progression or the control plane's), newest first.
	Steps         []HistoryEntry    `json:"steps"`
	Samples       Samples           `json:"samples"`
	Mirror        MirrorStats       `json:"mirror"`
	Distributions []Distribution    `json:"distributions"`
	Similarity    SimilaritySummary `json:"similarity"`
	// Loads summarises the loads the reference and the candidate served in the window, when
	// they were measured.
	Loads *LoadSummary `json:"loads,omitempty"`
	// Problems are recent pairs' problems, newest first.
	Problems []PairProblem `json:"problems"`
}

// LoadSummary is the mean load (requests in flight per endpoint of the side's cluster when
// each request was sent to it, the request itself included) of the reference (ReferenceName:
// "baseline" or "primary") and of the candidate over the window's N measured pairs, and
// their request rates per endpoint (requests begun a second over the gateway's last
// interval) when the gateway measured them (Input.Load's rates; in a report rebuilt from a
// shared store, the sum of the instances' latest rates).
type LoadSummary struct {
	ReferenceName string  `json:"reference_name"`
	Reference     float64 `json:"reference"`
	Candidate     float64 `json:"candidate"`
	N             int     `json:"n"`
	ReferenceRate float64 `json:"reference_rate,omitempty"`
	CandidateRate float64 `json:"candidate_rate,omitempty"`
}

// HistoryEntry is one past verdict.
type HistoryEntry struct {
	Time     time.Time `json:"ts"`
	Decision Decision  `json:"decision"`
	Reason   string    `json:"reason"`
	Pairs    int64     `json:"pairs"`
	Replicas int64     `json:"replicas"`
	Action   string    `json:"action,omitempty"`
	// Instance is the gateway that judged, in a store a fleet shares.
	Instance string `json:"instance,omitempty"`
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

// Samples says how much data is behind the verdict: per side the requests of the window
// (Baseline, with a baseline, counts the triples' baseline answers: then the reference), and
// the noise-floor samples, from NoiseFloorSource ("baseline": the primary against the
// baseline, "replica": against a replica of the primary; "" when none).
type Samples struct {
	Primary          ArmCounts  `json:"primary"`
	Baseline         *ArmCounts `json:"baseline,omitempty"`
	Candidate        ArmCounts  `json:"candidate"`
	NoiseFloor       int        `json:"noise_floor"`
	NoiseFloorSource string     `json:"noise_floor_source,omitempty"`
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

// Distribution shows one latency metric of every side (the primary, the baseline when the
// route has one, the candidate): percentiles and a histogram over shared bucket edges
// (len(Edges) = buckets+1; the last bucket also holds everything above its upper edge).
type Distribution struct {
	Metric          string       `json:"metric"`
	Unit            string       `json:"unit"`
	Primary         Percentiles  `json:"primary"`
	Baseline        *Percentiles `json:"baseline,omitempty"`
	Candidate       Percentiles  `json:"candidate"`
	Edges           []float64    `json:"edges"`
	PrimaryCounts   []int        `json:"primary_counts"`
	BaselineCounts  []int        `json:"baseline_counts,omitempty"`
	CandidateCounts []int        `json:"candidate_counts"`
}

// SimilaritySummary compares the candidate's similarity to the primary with the noise floor
// (the primary against the baseline, or against a replica: Reference says which).
type SimilaritySummary struct {
	Candidate  Percentiles   `json:"candidate"`
	NoiseFloor Percentiles   `json:"noise_floor"`
	Margin     float64       `json:"margin"`
	Reference  string        `json:"reference,omitempty"`
	Verdict    MetricVerdict `json:"verdict,omitempty"`
	Note       string        `json:"note,omitempty"`
}

// PairProblem is one problem of a recent pair.
type PairProblem struct {
	Time      time.Time `json:"ts"`
	RequestID string    `json:"request_id,omitempty"`
	Side      string    `json:"side"` // primary, baseline, candidate or pair
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
	rr := RouteReport{Route: in.Route, PrimaryCluster: in.PrimaryCluster, BaselineCluster: in.BaselineCluster,
		CandidateCluster: in.CandidateCluster, Mirror: in.Mirror, Action: in.Action, VerdictSource: SourceNone,
		History: []HistoryEntry{}, Steps: []HistoryEntry{}, Problems: []PairProblem{}, Scope: in.Scope, Sources: in.Sources}
	for _, sd := range in.Mirror.Sides {
		if rr.BaselineCluster == "" && sd.Side == "baseline" {
			rr.BaselineCluster = sd.Cluster
		}
	}
	input := in.Input
	pairs, replicas := in.Pairs, in.Replicas
	if store != nil {
		if input == nil {
			f, err := store.FleetInput(ctx, in.Route, in.CandidateID, in.Window, 0)
			if err != nil {
				return rr, err
			}
			input = &f.Input
			pairs, replicas = f.Pairs, f.Replicas
			if store.Shared() && rr.Scope == "" {
				rr.Scope, rr.Sources = ScopeFleet, f.Sources
			}
		}
		vs, err := store.Verdicts(ctx, in.Route, ReportHistory)
		if err != nil {
			return rr, err
		}
		for _, v := range vs {
			rr.History = append(rr.History, HistoryEntry{Time: v.Time.UTC(), Decision: v.Verdict.Decision,
				Reason: v.Verdict.Reason, Pairs: v.Pairs, Replicas: v.Replicas, Action: v.Action, Instance: v.Instance})
		}
		steps, err := store.Steps(ctx, in.Route, ReportSteps)
		if err != nil {
			return rr, err
		}
		for _, v := range steps {
			rr.Steps = append(rr.Steps, HistoryEntry{Time: v.Time.UTC(), Decision: v.Verdict.Decision,
				Reason: v.Verdict.Reason, Pairs: v.Pairs, Replicas: v.Replicas, Action: v.Action, Instance: v.Instance})
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
	if input.Baseline != nil {
		b := armCounts(*input.Baseline)
		rr.Samples.Baseline = &b
	}
	rr.Samples.NoiseFloor = len(input.NoiseFloor)
	if rr.Samples.NoiseFloor > 0 {
		rr.Samples.NoiseFloorSource = map[bool]string{true: "baseline", false: "replica"}[input.Baseline != nil]
	}
	rr.Samples.PairsTotal, rr.Samples.ReplicasTotal = pairs, replicas
	rr.Samples.MinSamples = cfg.MinSamples
	var base Arm
	if input.Baseline != nil {
		base = *input.Baseline
	}
	for _, m := range []struct {
		name    string
		p, b, c []float64
	}{
		{MetricTTFT, input.Primary.TTFT, base.TTFT, input.Candidate.TTFT},
		{MetricITL, input.Primary.ITL, base.ITL, input.Candidate.ITL},
		{MetricE2E, input.Primary.E2E, base.E2E, input.Candidate.E2E},
	} {
		rr.Distributions = append(rr.Distributions, distribution(m.name, finite(m.p), finite(m.b), finite(m.c), input.Baseline != nil))
	}
	rr.Similarity = SimilaritySummary{Candidate: percentiles(finite(input.CandidateSimilarity)),
		NoiseFloor: percentiles(finite(input.NoiseFloor)), Margin: cfg.SimilarityMargin}
	if rr.Verdict != nil {
		for _, e := range rr.Verdict.Evidence {
			if e.Metric == MetricSimilarity {
				rr.Similarity.Verdict, rr.Similarity.Note, rr.Similarity.Reference = e.Verdict, e.Note, e.Reference
			}
		}
	}
	if rr.Similarity.Reference == "" && rr.Samples.NoiseFloorSource != "" {
		rr.Similarity.Reference = "noise floor (primary against " + rr.Samples.NoiseFloorSource + ")"
	}
	if l := input.Load; len(l.Reference) > 0 && len(l.Candidate) > 0 || l.ReferenceRate > 0 || l.CandidateRate > 0 {
		ls := LoadSummary{ReferenceName: "primary", ReferenceRate: finiteOr(l.ReferenceRate), CandidateRate: finiteOr(l.CandidateRate)}
		if ref, cand := finite(l.Reference), finite(l.Candidate); len(ref) > 0 && len(cand) > 0 {
			ls.Reference, ls.Candidate, ls.N = Mean(ref), Mean(cand), min(len(ref), len(cand))
		}
		if input.Baseline != nil {
			ls.ReferenceName = "baseline"
		}
		rr.Loads = &ls
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
		// A candidate's failure is a problem when its reference (the baseline when there is
		// one) answered; a baseline's failure when the primary did (the sandbox is unwell).
		refOK := p.Result.Primary.OK
		if b := p.Result.Baseline; b != nil {
			refOK = b.OK
		}
		if !p.Result.Candidate.OK && refOK {
			probs = append(probs, [2]string{"candidate", describeFailure(p.Candidate)})
		}
		for _, x := range p.Result.Candidate.Problems {
			probs = append(probs, [2]string{"candidate", x})
		}
		if b := p.Result.Baseline; b != nil {
			if !b.OK && p.Result.Primary.OK && p.Baseline != nil {
				probs = append(probs, [2]string{"baseline", describeFailure(*p.Baseline)})
			}
			for _, x := range b.Problems {
				probs = append(probs, [2]string{"baseline", x})
			}
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

// distribution builds the percentiles and histograms of one metric: of the primary, the
// baseline (when withBaseline) and the candidate, over shared edges.
func distribution(metric string, p, b, c []float64, withBaseline bool) Distribution {
	d := Distribution{Metric: metric, Unit: "ms", Primary: percentiles(p), Candidate: percentiles(c)}
	sides := [][]float64{p, c}
	if withBaseline {
		bp := percentiles(b)
		d.Baseline = &bp
		sides = append(sides, b)
	}
	if len(p)+len(b)+len(c) == 0 {
		d.Edges, d.PrimaryCounts, d.CandidateCounts = []float64{}, []int{}, []int{}
		if withBaseline {
			d.BaselineCounts = []int{}
		}
		return d
	}
	lo := math.Inf(1)
	for _, xs := range sides {
		for _, v := range xs {
			lo = math.Min(lo, v)
		}
	}
	hi := math.Max(d.Primary.P99, d.Candidate.P99)
	if d.Baseline != nil {
		hi = math.Max(hi, d.Baseline.P99)
	}
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
	if withBaseline {
		d.BaselineCounts = count(b)
	}
	return d
}

// isLatency reports whether e is a latency metric.
func isLatency(e Evidence) bool {
	switch e.Metric {
	case MetricTTFT, MetricITL, MetricE2E:
		return true
	}
	return false
}

// judged reports whether e's numbers were computed (not skipped, too few samples, or not
// exercised).
func judged(e Evidence) bool {
	switch e.Verdict {
	case Skipped, Insufficient, NotExercised:
		return false
	}
	return true
}

// formatEffect renders an Evidence's effect in its metric's terms: for paired latencies the
// ratio of the candidate's median to the baseline's with its confidence interval
// ("×1.31 [1.22, 1.40]"), for other latencies a relative change, percentage points for
// rates, an absolute difference for similarity.
func formatEffect(e Evidence) string {
	switch {
	case !judged(e):
		return "-"
	case e.Ratio != 0 && !math.IsInf(e.Ratio, 0) && !math.IsNaN(e.Ratio):
		if e.Low == 0 && e.High == 0 {
			return fmt.Sprintf("×%.2f", e.Ratio)
		}
		return fmt.Sprintf("×%.2f [%.2f, %.2f]", e.Ratio, e.Low, e.High)
	case e.Effect >= math.MaxFloat64 || math.IsInf(e.Effect, 1):
		return "+inf"
	case isLatency(e):
		return fmt.Sprintf("%+.1f%%", e.Effect*100)
	case e.Metric == MetricSimilarity:
		return fmt.Sprintf("%+.3f", e.Effect)
	case e.Metric == MetricEntropy:
		return fmt.Sprintf("%+.3f nats [%+.3f, %+.3f]", e.Effect, e.EffectLow, e.EffectHigh)
	case e.Metric == MetricLowMargin:
		return fmt.Sprintf("%+.2fpp [%+.2f, %+.2f]", e.Effect*100, e.EffectLow*100, e.EffectHigh*100)
	default:
		return fmt.Sprintf("%+.2fpp", e.Effect*100)
	}
}

func formatBound(e Evidence) string {
	switch {
	case e.Critical:
		return "any"
	case isLatency(e) && e.Test == StatWilcoxon:
		return fmt.Sprintf("×%.2f", 1+e.Bound)
	case isLatency(e):
		return fmt.Sprintf("%.1f%%", e.Bound*100)
	case e.Metric == MetricSimilarity:
		return fmt.Sprintf("%.3f", e.Bound)
	case e.Metric == MetricEntropy:
		return fmt.Sprintf("%.3f nats", e.Bound)
	default:
		return fmt.Sprintf("%.2fpp", e.Bound*100)
	}
}

func formatP(e Evidence) string {
	if !judged(e) {
		return "-"
	}
	if e.P < 1e-4 {
		return fmt.Sprintf("%.1e", e.P)
	}
	return fmt.Sprintf("%.4f", e.P)
}

// formatValue renders an Evidence's reference or candidate value: a median in ms, a rate in
// percent, a mean similarity.
func formatValue(e Evidence, v float64) string {
	switch {
	case !judged(e):
		return "-"
	case e.Metric == MetricSimilarity:
		return fmt.Sprintf("%.3f", v)
	case e.Metric == MetricEntropy:
		return fmt.Sprintf("%.3f nats", v)
	case isLatency(e):
		return fmtNum(v) + "ms"
	default:
		return fmt.Sprintf("%.2f%%", v*100)
	}
}

// formatN renders an Evidence's sample sizes: "n pairs" for paired tests, else
// "reference/candidate".
func formatN(e Evidence, sep string) string {
	if e.Test == StatWilcoxon {
		return fmt.Sprintf("%d pairs", e.NCandidate)
	}
	return fmt.Sprintf("%d%s%d", e.NPrimary, sep, e.NCandidate)
}

// evidenceReference names what e judged the candidate against ("primary" for evidence stored
// before references were recorded).
func evidenceReference(e Evidence) string {
	if e.Reference == "" {
		return "primary"
	}
	return e.Reference
}

// noted reports whether e's note is listed under the text report's table: the notes that
// say why a metric was not judged or judged apart (not_comparable gives the two loads,
// not_exercised and a critical check's insufficient how often the candidate broke alone).
// The HTML table shows every note.
func noted(e Evidence) bool {
	if e.Note == "" {
		return false
	}
	switch e.Verdict {
	case NotComparable, NotExercised, Inconclusive:
		return true
	case Insufficient:
		return e.Critical
	}
	return false
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

// WriteText renders the report for a terminal: per route, the decision, the mirror's
// counters (per side), the samples and loads, the per-metric table with the notes of what
// was not judged or holds, the distributions side by side (primary, baseline, candidate), the similarity against the noise floor, the
// verdict history and recent problems.
func (r Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	if r.Store != nil {
		ew.printf("%s\n\n", termSafe(storeLine(*r.Store)))
	}
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
	switch {
	case rr.BaselineCluster != "":
		head += fmt.Sprintf("  (primary %s, baseline %s, candidate %s)", orDash(rr.PrimaryCluster), rr.BaselineCluster, orDash(rr.CandidateCluster))
	case rr.PrimaryCluster != "" || rr.CandidateCluster != "":
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
	if rr.Scope != "" {
		ew.printf("  scope:    %s\n", termSafe(scopeLine(rr)))
	}
	m := rr.Mirror
	ew.printf("  mirror:   offered %d, mirrored %d, dropped %d, compared %d, incomplete %d", m.Offered, m.Mirrored, m.Dropped,
		m.Compared, m.Incomplete)
	if len(m.Sides) == 0 {
		ew.printf(", failed %d, replicas %d", m.Failed, m.Replicas)
	}
	ew.printf("\n")
	if len(m.Sides) > 0 {
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "            side\tcluster\tsent\tfailed\tcompared\t")
		for _, sd := range m.Sides {
			fmt.Fprintf(tw, "            %s\t%s\t%d\t%d\t%d\t\n", oneLineText(sd.Side, 32), orDash(oneLineText(sd.Cluster, MaxNameLen)),
				sd.Sent, sd.Failed, sd.Compared)
		}
		_ = tw.Flush()
	}
	s := rr.Samples
	errs := fmt.Sprintf("candidate errors %d", s.Candidate.Errors)
	if s.Baseline != nil {
		errs += fmt.Sprintf(", baseline errors %d", s.Baseline.Errors)
	}
	errs += fmt.Sprintf(", primary errors %d", s.Primary.Errors)
	noise := fmt.Sprintf("noise floor %d", s.NoiseFloor)
	if s.NoiseFloorSource != "" {
		noise += " (primary against " + s.NoiseFloorSource + ")"
	}
	ew.printf("  samples:  window %d pairs (%s), %s, min %d per side; stored %d pairs, %d verdicts\n",
		s.Candidate.Requests, errs, noise, s.MinSamples, s.StoredPairs, s.StoredVerdicts)
	if l := rr.Loads; l != nil {
		ew.printf("  loads:    %s\n", termSafe(loadsLine(*l)))
	}
	if rr.Verdict != nil && len(rr.Verdict.Evidence) > 0 {
		ew.printf("\n")
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  metric\treference\ttest\tn (r/c)\treference\tcandidate\teffect\tbound\tp\tverdict\t")
		var notes []Evidence
		for _, e := range rr.Verdict.Evidence {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", termSafe(metricName(e)), oneLineText(evidenceReference(e), 64),
				termSafe(e.Test), formatN(e, "/"), formatValue(e, e.Primary), formatValue(e, e.Cand), formatEffect(e), formatBound(e),
				formatP(e), termSafe(string(e.Verdict)))
			if noted(e) {
				notes = append(notes, e)
			}
		}
		_ = tw.Flush()
		if len(notes) > 0 {
			ew.printf("\n  notes:\n")
			for _, e := range notes {
				ew.printf("    %s %s: %s\n", termSafe(e.Metric), termSafe(string(e.Verdict)), oneLineText(e.Note, 400))
			}
		}
	}
	ew.printf("\n")
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	withBaseline := false
	for _, d := range rr.Distributions {
		withBaseline = withBaseline || d.Baseline != nil
	}
	if withBaseline {
		fmt.Fprintln(tw, "  latency (ms)\tprimary n\tp50\tp90\tp99\tbaseline n\tp50\tp90\tp99\tcandidate n\tp50\tp90\tp99\t")
	} else {
		fmt.Fprintln(tw, "  latency (ms)\tprimary n\tp50\tp90\tp99\tcandidate n\tp50\tp90\tp99\t")
	}
	for _, d := range rr.Distributions {
		row := "  " + termSafe(d.Metric)
		sides := []Percentiles{d.Primary, d.Candidate}
		if withBaseline {
			var b Percentiles
			if d.Baseline != nil {
				b = *d.Baseline
			}
			sides = []Percentiles{d.Primary, b, d.Candidate}
		}
		for _, p := range sides {
			pp := pcts(p)
			row += fmt.Sprintf("\t%d\t%s\t%s\t%s", p.N, pp[0], pp[1], pp[2])
		}
		fmt.Fprintln(tw, row+"\t")
	}
	_ = tw.Flush()
	sim := rr.Similarity
	ew.printf("\n  similarity: candidate mean %.3f (n %d) vs %s mean %.3f (n %d), margin %.3f",
		sim.Candidate.Mean, sim.Candidate.N, oneLineText(orText(sim.Reference, "noise floor"), 64), sim.NoiseFloor.Mean, sim.NoiseFloor.N, sim.Margin)
	if sim.Verdict != "" {
		ew.printf(": %s", sim.Verdict)
	}
	if sim.Note != "" {
		ew.printf(" (%s)", oneLineText(sim.Note, 400))
	}
	ew.printf("\n")
	if len(rr.History) > 0 {
		ew.printf("\n  history (newest first):\n")
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, h := range rr.History {
			by := ""
			if h.Instance != "" {
				by = " by " + oneLineText(h.Instance, 64)
			}
			fmt.Fprintf(tw, "    %s%s\t%s\t%d pairs\t%s\t%s\t\n", h.Time.Format(time.RFC3339), by, termSafe(string(h.Decision)), h.Pairs,
				orDash(oneLineText(h.Action, MaxNameLen)), oneLineText(h.Reason, 100))
		}
		_ = tw.Flush()
	}
	if len(rr.Steps) > 0 {
		ew.printf("\n  weight steps (newest first):\n")
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, h := range rr.Steps {
			by := ""
			if h.Instance != "" {
				by = " by " + oneLineText(h.Instance, 64)
			}
			fmt.Fprintf(tw, "    %s%s\t%s\t%d pairs\t%s\t\n", h.Time.Format(time.RFC3339), by, termSafe(string(h.Decision)), h.Pairs,
				oneLineText(h.Action, MaxNameLen))
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

// storeLine renders a StoreStatus.
func storeLine(s StoreStatus) string {
	line := "store: " + s.Kind
	if s.Location != "" {
		line += " " + oneLineText(s.Location, 200)
	}
	if s.Shared {
		line += " (shared"
		if s.Instance != "" {
			line += "; this gateway is instance " + oneLineText(s.Instance, MaxNameLen)
		}
		line += ")"
	}
	if s.Error != "" {
		line += ": not open: " + oneLineText(s.Error, 300)
	}
	if w := s.Writer; w != nil {
		state := "connected"
		switch {
		case !w.Opened:
			state = "not opened yet"
		case !w.Connected:
			state = "unreachable"
		}
		var dropped int64
		for _, n := range w.Dropped {
			dropped += n
		}
		line += fmt.Sprintf(": %s; held %d records (%s of %s), written %d, dropped %d, failed %d, retries %d", state,
			w.Buffered, byteSize(w.BufferedBytes), byteSize(w.MaxBytes), w.Written, dropped, w.Failed, w.Retries)
		if !w.DownSince.IsZero() {
			line += ", down since " + w.DownSince.UTC().Format(time.RFC3339)
		}
		if w.LastError != "" {
			line += "; last error " + oneLineText(w.LastError, 300)
		}
	}
	return line
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// scopeLine renders what a route's verdict judged.
func scopeLine(rr RouteReport) string {
	switch rr.Scope {
	case ScopeFleet:
		line := fmt.Sprintf("fleet: every instance's pairs in the shared store (%d instances", len(rr.Sources))
		for i, s := range rr.Sources {
			if i == 8 {
				line += ", …"
				break
			}
			sep := ": "
			if i > 0 {
				sep = ", "
			}
			line += fmt.Sprintf("%s%s %d", sep, oneLineText(orText(s.Instance, "(unnamed)"), 64), s.Pairs)
		}
		return line + ")"
	case ScopeInstance:
		return "instance: this gateway's own pairs"
	}
	return oneLineText(rr.Scope, 64)
}

// loadsLine renders a LoadSummary.
func loadsLine(l LoadSummary) string {
	var parts []string
	if l.N > 0 {
		parts = append(parts, fmt.Sprintf("mean in flight per endpoint: %s %.1f, candidate %.1f (n %d)", l.ReferenceName, l.Reference, l.Candidate, l.N))
	}
	if l.ReferenceRate > 0 || l.CandidateRate > 0 {
		parts = append(parts, fmt.Sprintf("requests a second per endpoint: %s %.1f, candidate %.1f", l.ReferenceName, l.ReferenceRate, l.CandidateRate))
	}
	return strings.Join(parts, "; ")
}

// pcts renders p50, p90 and p99 ("-" without samples).
func pcts(p Percentiles) [3]string {
	if p.N == 0 {
		return [3]string{"-", "-", "-"}
	}
	return [3]string{fmtNum(p.P50), fmtNum(p.P90), fmtNum(p.P99)}
}

func orDash(s string) string { return orText(s, "-") }

func orText(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// The HTML view: everything precomputed, the template only places it.
type htmlRoute struct {
	RouteReport
	Class, Decision, When string
	Rows                  []htmlRow
	Charts                []htmlChart
	HasBaseline           bool
	Loads                 string // the loads line, "" when not measured
	ScopeText             string // what the verdict judged, "" when unknown
}

type htmlRow struct {
	Metric, Reference, Test, N, Primary, Cand, Effect, Bound, P, Verdict, Class, Note string
}

type htmlChart struct {
	Distribution
	Bars           []htmlBar
	Width, Height  int
	LoLabel        string
	MidLabel       string
	HiLabel        string
	PrimaryLabel   string
	BaselineLabel  string // "" without a baseline
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

func pctLabel(p Percentiles) string {
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s ms (n %d)", fmtNum(p.P50), fmtNum(p.P90), fmtNum(p.P99), p.N)
}

func chart(d Distribution) htmlChart {
	c := htmlChart{Distribution: d, Width: chartW, Height: chartH + 18}
	c.PrimaryLabel, c.CandidateLabel = pctLabel(d.Primary), pctLabel(d.Candidate)
	type side struct {
		counts []int
		total  int
		class  string
	}
	sides := []side{{d.PrimaryCounts, d.Primary.N, "p"}}
	if d.Baseline != nil {
		c.BaselineLabel = pctLabel(*d.Baseline)
		sides = append(sides, side{d.BaselineCounts, d.Baseline.N, "b"})
	}
	sides = append(sides, side{d.CandidateCounts, d.Candidate.N, "c"})
	n := len(d.PrimaryCounts)
	if n == 0 || len(d.Edges) != n+1 {
		return c
	}
	for _, sd := range sides {
		if len(sd.counts) != n {
			return c
		}
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
		for _, sd := range sides {
			top = math.Max(top, share(sd.counts[i], sd.total))
		}
	}
	if top == 0 {
		return c
	}
	bw := float64(chartW-2*chartPad) / float64(n)
	sw := bw / float64(len(sides))
	for i := range n {
		x := chartPad + float64(i)*bw
		for j, sd := range sides {
			h := share(sd.counts[i], sd.total) / top * (chartH - 10)
			c.Bars = append(c.Bars, htmlBar{X: x + float64(j)*sw, Y: chartH - h, W: math.Max(sw-1, 1), H: h,
				Class: sd.class, Title: fmt.Sprintf("%s–%s ms: %d", fmtNum(d.Edges[i]), fmtNum(d.Edges[i+1]), sd.counts[i])})
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
				h.Rows = append(h.Rows, htmlRow{Metric: metricName(e), Reference: evidenceReference(e), Test: e.Test,
					N: formatN(e, " / "), Primary: formatValue(e, e.Primary),
					Cand: formatValue(e, e.Cand), Effect: formatEffect(e), Bound: formatBound(e), P: formatP(e),
					Verdict: string(e.Verdict), Class: string(e.Verdict), Note: e.Note})
			}
		}
		for _, d := range rr.Distributions {
			h.Charts = append(h.Charts, chart(d))
			h.HasBaseline = h.HasBaseline || d.Baseline != nil
		}
		if l := rr.Loads; l != nil {
			h.Loads = loadsLine(*l)
		}
		if rr.Scope != "" {
			h.ScopeText = scopeLine(rr)
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
td.inconclusive,td.insufficient,td.hold,td.not_comparable{color:#b26a00}td.skipped,td.not_exercised{color:#777}
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{border:1px solid #ddd;border-radius:6px;padding:.5em}
svg rect.p{fill:#1f77b4}svg rect.b{fill:#2ca02c}svg rect.c{fill:#ff7f0e}svg text{font-size:10px;fill:#555}
.legend span{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 .8em;vertical-align:middle}
.lp{background:#1f77b4}.lb{background:#2ca02c}.lc{background:#ff7f0e}.muted{color:#666}
</style></head><body>
<h1>Sluice shadow report</h1>
<p class="muted">Generated {{ts .Generated}}. The candidate against its reference on mirrored traffic: the baseline (the primary's version in a sandbox, asked at the same moment) when the route has one, else the primary. A difference counts only when it is significant and beyond its bound (latency: Wilcoxon signed-rank on the same requests' baseline and candidate latencies, effect the ratio of medians with its confidence interval; without a baseline Mann-Whitney U, and only when both sides served alike loads. Rates: two-proportion or Fisher. Similarity: against the noise floor, the primary against the baseline or a replica).</p>
{{with .Store}}<p class="muted">{{.}}</p>{{end}}
{{if not .Routes}}<p>No mirrored routes (no route has a mirror block, or the store is empty).</p>{{end}}
{{range .Routes}}
<section>
<h2>Route {{.Route}}</h2>
{{if or .PrimaryCluster .BaselineCluster .CandidateCluster}}<p>primary <b>{{.PrimaryCluster}}</b>{{if .BaselineCluster}}, baseline <b>{{.BaselineCluster}}</b>{{end}}, candidate <b>{{.CandidateCluster}}</b></p>{{end}}
<div class="banner {{.Class}}">{{.Decision}}{{if .Verdict}} — {{.Verdict.Reason}}{{end}}
<small>{{if .When}}verdict {{.When}}{{end}}{{if .Action}}; action {{.Action}}{{end}}{{if .ScopeText}}<br>{{.ScopeText}}{{end}}</small></div>
<p>Mirror: offered {{.Mirror.Offered}}, mirrored {{.Mirror.Mirrored}}, dropped {{.Mirror.Dropped}}, compared {{.Mirror.Compared}}, incomplete {{.Mirror.Incomplete}}{{if not .Mirror.Sides}}, failed {{.Mirror.Failed}}, replicas {{.Mirror.Replicas}}{{end}}.</p>
{{if .Mirror.Sides}}<table class="sides"><tr><th>side</th><th>cluster</th><th>sent</th><th>failed</th><th>compared</th></tr>
{{range .Mirror.Sides}}<tr><td>{{.Side}}</td><td>{{.Cluster}}</td><td class="num">{{.Sent}}</td><td class="num">{{.Failed}}</td><td class="num">{{.Compared}}</td></tr>
{{end}}</table>{{end}}
<p>Window: {{.Samples.Candidate.Requests}} pairs (candidate errors {{.Samples.Candidate.Errors}}{{with .Samples.Baseline}}, baseline errors {{.Errors}}{{end}}, primary errors {{.Samples.Primary.Errors}}), noise floor {{.Samples.NoiseFloor}}{{with .Samples.NoiseFloorSource}} (primary against {{.}}){{end}}, at least {{.Samples.MinSamples}} per side needed. Stored: {{.Samples.StoredPairs}} pairs, {{.Samples.StoredVerdicts}} verdicts.{{if .Loads}}<br>
Loads: {{.Loads}}.{{end}}</p>
{{if .Rows}}
<h3>Per-metric tests</h3>
<table><tr><th>metric</th><th>reference</th><th>test</th><th>n (reference / candidate)</th><th>reference</th><th>candidate</th><th>effect</th><th>bound</th><th>p</th><th>verdict</th></tr>
{{range .Rows}}<tr><td>{{.Metric}}</td><td>{{.Reference}}</td><td>{{.Test}}</td><td class="num">{{.N}}</td><td class="num">{{.Primary}}</td><td class="num">{{.Cand}}</td><td class="num">{{.Effect}}</td><td class="num">{{.Bound}}</td><td class="num">{{.P}}</td><td class="{{.Class}}" title="{{.Note}}">{{.Verdict}}{{if .Note}} <span class="muted">({{.Note}})</span>{{end}}</td></tr>
{{end}}</table>
{{end}}
<h3>Latency distributions</h3>
<div class="legend"><span class="lp"></span>primary{{if .HasBaseline}}<span class="lb"></span>baseline{{end}}<span class="lc"></span>candidate <span class="muted">(bars: share of each side's samples per bucket; the last bucket holds everything above)</span></div>
<div class="charts">
{{range .Charts}}<div class="chart"><b>{{.Metric}}</b> <span class="muted">({{.Unit}})</span><br>
<span class="muted">primary {{.PrimaryLabel}}<br>{{if .BaselineLabel}}baseline {{.BaselineLabel}}<br>{{end}}candidate {{.CandidateLabel}}</span><br>
{{if .Bars}}<svg width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="{{.Metric}} histogram">
{{range .Bars}}<rect class="{{.Class}}" x="{{f1 .X}}" y="{{f1 .Y}}" width="{{f1 .W}}" height="{{f1 .H}}"><title>{{.Title}}</title></rect>
{{end}}<text x="4" y="{{.Height}}">{{.LoLabel}}</text><text x="{{.Width}}" y="{{.Height}}" text-anchor="end">{{.HiLabel}}</text><text x="210" y="{{.Height}}" text-anchor="middle">{{.MidLabel}}</text>
</svg>{{else}}<p class="muted">no samples</p>{{end}}
</div>
{{end}}</div>
<h3>Similarity against the noise floor</h3>
<table><tr><th></th><th>n</th><th>mean</th><th>p50</th><th>p90</th></tr>
<tr><td>candidate vs primary</td><td class="num">{{.Similarity.Candidate.N}}</td><td class="num">{{f3 .Similarity.Candidate.Mean}}</td><td class="num">{{f3 .Similarity.Candidate.P50}}</td><td class="num">{{f3 .Similarity.Candidate.P90}}</td></tr>
<tr><td>{{if .Similarity.Reference}}{{.Similarity.Reference}}{{else}}noise floor{{end}}</td><td class="num">{{.Similarity.NoiseFloor.N}}</td><td class="num">{{f3 .Similarity.NoiseFloor.Mean}}</td><td class="num">{{f3 .Similarity.NoiseFloor.P50}}</td><td class="num">{{f3 .Similarity.NoiseFloor.P90}}</td></tr>
</table>
<p>Margin {{f3 .Similarity.Margin}}{{if .Similarity.Verdict}}: <b>{{.Similarity.Verdict}}</b>{{end}}{{if .Similarity.Note}} <span class="muted">({{.Similarity.Note}})</span>{{end}}</p>
{{if .History}}
<h3>Verdict history</h3>
<table><tr><th>time</th><th>decision</th><th>pairs</th><th>replicas</th><th>action</th><th>reason</th></tr>
{{range .History}}<tr><td>{{ts .Time}}{{with .Instance}} <span class="muted">by {{.}}</span>{{end}}</td><td class="{{low .Decision}}">{{up .Decision}}</td><td class="num">{{.Pairs}}</td><td class="num">{{.Replicas}}</td><td>{{.Action}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>
{{end}}
{{if .Steps}}
<h3>Weight steps</h3>
<table><tr><th>time</th><th>decision</th><th>pairs</th><th>action</th></tr>
{{range .Steps}}<tr><td>{{ts .Time}}{{with .Instance}} <span class="muted">by {{.}}</span>{{end}}</td><td class="{{low .Decision}}">{{up .Decision}}</td><td class="num">{{.Pairs}}</td><td>{{.Action}}</td></tr>
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
// per route a verdict banner, the mirror's counters per side, the per-metric test table
// (reference, test, n, values, effect, bound, p, verdict and note), the loads, the latency
// distributions of the primary, the baseline and the candidate side by side as inline SVG
// histograms, the similarity against the noise floor, the verdict
// history and recent pair problems. Everything from the data is escaped.
func (r Report) WriteHTML(w io.Writer) error {
	data := struct {
		Generated time.Time
		Store     string
		Routes    []htmlRoute
	}{Generated: r.Generated, Routes: htmlRoutes(r)}
	if r.Store != nil {
		data.Store = storeLine(*r.Store)
	}
	if err := htmlTmpl.Execute(w, data); err != nil {
		return fmt.Errorf("shadow report: html: %w", err)
	}
	return nil
}
