package load

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// PrintSummary writes a plain-text summary of r.
func PrintSummary(w io.Writer, r *Report) {
	if r.Summary == nil {
		r.Summarize()
	}
	s := r.Summary
	fmt.Fprintf(w, "target %s  workload %s\nload   %s\n", r.Meta.Target, r.Meta.Workload, r.Meta.Load)
	if len(r.Meta.Shards) > 0 {
		fmt.Fprintf(w, "shards %s\n", strings.Join(r.Meta.Shards, ", "))
	}
	fmt.Fprintf(w, "requests %d  ok %d  failed %d  aborted %d  over %.2fs\n", r.Requests, r.OK, r.Failed, r.Aborted, s.DurationS)
	fmt.Fprintf(w, "throughput %.2f req/s  %.1f output tok/s  %.1f input tok/s\n", s.ReqPerS, s.OutTokPerS, s.InTokPerS)
	fmt.Fprintf(w, "output tokens %d (requests counted from usage %d, by tokenizer %d)\n", r.OutputTokens, r.TokensFromUsage, r.TokensEstimated)
	if s.Attainment != nil {
		fmt.Fprintf(w, "SLO %s: goodput %.2f req/s, attainment all %.1f%% (ttft %.1f%% tpot %.1f%% itl %.1f%% e2e %.1f%%)\n",
			sloString(r.SLO), s.Goodput, 100*s.Attainment["all"], 100*s.Attainment["ttft"], 100*s.Attainment["tpot"],
			100*s.Attainment["itl"], 100*s.Attainment["e2e"])
	}
	if r.Retried > 0 || len(r.Upstreams) > 0 {
		fmt.Fprintf(w, "gateway: retried %d, recovered %d (recovery rate %.2f%% of ok)\n", r.Retried, r.Recovered, 100*s.RecoveryRate)
	}
	if len(r.Upstreams) > 0 {
		fmt.Fprintf(w, "upstreams: %s\n", formatCounts(r.Upstreams))
	}
	if r.MarkersExpected > 0 {
		fmt.Fprintf(w, "context fidelity %.2f%% (%d of %d markers)\n", 100*s.ContextFidelity, r.MarkersFound, r.MarkersExpected)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ms\tcount\tmean\tp50\tp90\tp95\tp99\tp99.9\tmax\t")
	for _, n := range histNames {
		p, ok := s.Latency[n]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", n, p.Count, p.Mean, p.P50, p.P90, p.P95, p.P99, p.P999, p.Max)
	}
	_ = tw.Flush()
	if len(r.Errors) > 0 {
		fmt.Fprintf(w, "errors: %s\n", formatCounts(r.Errors))
		for _, e := range r.Samples {
			fmt.Fprintf(w, "  %dx %s %d: %s\n", e.Count, e.Class, e.Status, e.Message)
		}
	}
	if lag, ok := s.Latency[HLag]; ok {
		fmt.Fprintf(w, "scheduling lag p50 %.3f ms p99 %.3f ms max %.3f ms\n", lag.P50, lag.P99, lag.Max)
	}
}

// byCount returns m's keys, the largest count first and equal counts by name.
func byCount(m map[string]int64) []string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(m[b], m[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return keys
}

// formatCounts formats counts by name for people, in byCount's order: "default 297, fallback 3"
// ("none" when m is empty). Every count the text output prints (upstreams, error classes)
// goes through it, never a map's %v.
func formatCounts(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range byCount(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sloString(s SLO) string {
	out := ""
	add := func(k string, v interface{ String() string }, set bool) {
		if set {
			if out != "" {
				out += ","
			}
			out += k + "=" + v.String()
		}
	}
	add("ttft", s.TTFT, s.TTFT > 0)
	add("tpot", s.TPOT, s.TPOT > 0)
	add("itl", s.ITL, s.ITL > 0)
	add("e2e", s.E2E, s.E2E > 0)
	return out
}
