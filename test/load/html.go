package load

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// WriteHTML writes a self-contained HTML report (inline SVG, no external assets).
func (r *Report) WriteHTML(w io.Writer) error {
	r.Summarize()
	data := map[string]any{
		"R": r, "S": r.Summary, "SLO": sloString(r.SLO),
		"Pcts":  r.pctRows(),
		"Dists": []template.HTML{r.distSVG(HTTFT, "TTFT"), r.distSVG(HITL, "ITL"), r.distSVG(HE2E, "E2E")},
		"TTFTTime": r.timeSVG("TTFT mean per second (ms), by send time", func(b Bucket) (float64, bool) {
			return float64(b.TTFTSum) / 1000 / float64(max(b.TTFTN, 1)), b.TTFTN > 0
		}),
		"TokTime":    r.timeSVG("Output tokens per second", func(b Bucket) (float64, bool) { return float64(b.Tokens), true }),
		"ReqTime":    r.timeSVG("Completed requests per second", func(b Bucket) (float64, bool) { return float64(b.Done - b.Errors), true }),
		"Sweep":      r.sweepSVG(),
		"ErrorKeys":  byCount(r.Errors),
		"StatusKeys": byCount(r.Statuses),
		"UpKeys":     byCount(r.Upstreams),
		"Shards":     strings.Join(r.Meta.Shards, ", "),
	}
	return reportTmpl.Execute(w, data)
}

type pctRow struct {
	Name string
	P    Pct
}

func (r *Report) pctRows() []pctRow {
	var out []pctRow
	for _, n := range histNames {
		if p, ok := r.Summary.Latency[n]; ok {
			out = append(out, pctRow{n, p})
		}
	}
	return out
}

const svgW, svgH, padL, padB, padT = 560, 220, 56, 34, 24

func svgOpen(sb *strings.Builder, title string) {
	fmt.Fprintf(sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img"><title>%s</title>`,
		svgW, svgH, svgW, svgH, template.HTMLEscapeString(title))
	fmt.Fprintf(sb, `<text x="%d" y="16" font-size="13" font-weight="bold">%s</text>`, padL, template.HTMLEscapeString(title))
	fmt.Fprintf(sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, svgH-padB, svgW-8, svgH-padB)
	fmt.Fprintf(sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, padL, padT, padL, svgH-padB)
}

func fmtNum(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// distSVG draws a histogram of h on log-spaced millisecond bins.
func (r *Report) distSVG(name, title string) template.HTML {
	h := r.Hist[name]
	var sb strings.Builder
	svgOpen(&sb, title+" distribution (ms, log scale)")
	if h == nil || h.Count() == 0 {
		sb.WriteString(`<text x="200" y="110">no data</text></svg>`)
		return template.HTML(sb.String())
	}
	// The axis starts at the smallest value, but no lower than half the first percentile:
	// zero gaps (tokens of one event) would otherwise stretch a log axis over decades.
	lo := math.Max(math.Max(float64(h.h.Min())/1000, float64(h.Quantile(1).Microseconds())/2000), 0.001)
	hi := math.Max(float64(h.h.Max())/1000, lo*1.01)
	const nb = 40
	bins := make([]int64, nb)
	l0, l1 := math.Log10(lo), math.Log10(hi)
	for _, b := range h.Bars() {
		v := math.Max(float64(b.From+b.To)/2000, lo)
		i := int(float64(nb) * (math.Log10(v) - l0) / (l1 - l0 + 1e-12))
		bins[min(max(i, 0), nb-1)] += b.Count
	}
	var top int64 = 1
	for _, c := range bins {
		top = max(top, c)
	}
	pw, ph := float64(svgW-8-padL), float64(svgH-padB-padT)
	for i, c := range bins {
		if c == 0 {
			continue
		}
		bh := ph * float64(c) / float64(top)
		fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4a78c2"><title>%d</title></rect>`,
			float64(padL)+pw*float64(i)/nb, float64(svgH-padB)-bh, pw/nb-1, bh, c)
	}
	for k := 0; k <= 4; k++ {
		v := math.Pow(10, l0+(l1-l0)*float64(k)/4)
		anchor := "middle"
		if k == 4 {
			anchor = "end"
		}
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" font-size="10" text-anchor="%s">%s</text>`, float64(padL)+pw*float64(k)/4, svgH-padB+14, anchor, fmtNum(v))
	}
	fmt.Fprintf(&sb, `<text x="4" y="%d" font-size="10">%d</text>`, padT+8, top)
	for _, q := range []struct {
		p float64
		c string
	}{{50, "#2a2"}, {99, "#c22"}} {
		v := float64(h.Quantile(q.p).Microseconds()) / 1000
		x := float64(padL) + pw*(math.Log10(math.Max(v, lo))-l0)/(l1-l0+1e-12)
		// Labels go right of their line, or left of it near the right edge; p99's sits lower
		// so that the two cannot overlap.
		tx, anchor := x+3, "start"
		if x > float64(svgW)-90 {
			tx, anchor = x-3, "end"
		}
		ty := padT + 10
		if q.p == 99 {
			ty += 12
		}
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-dasharray="4 2"/><text x="%.1f" y="%d" font-size="10" fill="%s" text-anchor="%s">p%g %s</text>`,
			x, padT, x, svgH-padB, q.c, tx, ty, q.c, anchor, q.p, fmtNum(v))
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

// timeSVG draws a per-second line chart.
func (r *Report) timeSVG(title string, f func(Bucket) (float64, bool)) template.HTML {
	var sb strings.Builder
	svgOpen(&sb, title)
	if len(r.Seconds) == 0 {
		sb.WriteString(`<text x="200" y="110">no data</text></svg>`)
		return template.HTML(sb.String())
	}
	t0, t1 := r.Seconds[0].Unix, r.Seconds[len(r.Seconds)-1].Unix
	span := float64(max(t1-t0, 1))
	top := 0.0
	for _, b := range r.Seconds {
		if v, ok := f(b); ok {
			top = math.Max(top, v)
		}
	}
	if top == 0 {
		top = 1
	}
	pw, ph := float64(svgW-8-padL), float64(svgH-padB-padT)
	var pts []string
	for _, b := range r.Seconds {
		v, ok := f(b)
		if !ok {
			continue
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", float64(padL)+pw*float64(b.Unix-t0)/span, float64(svgH-padB)-ph*v/top))
	}
	fmt.Fprintf(&sb, `<polyline fill="none" stroke="#c2554a" stroke-width="1.5" points="%s"/>`, strings.Join(pts, " "))
	fmt.Fprintf(&sb, `<text x="4" y="%d" font-size="10">%s</text>`, padT+8, fmtNum(top))
	fmt.Fprintf(&sb, `<text x="%d" y="%d" font-size="10">0 s</text><text x="%d" y="%d" font-size="10" text-anchor="end">%d s</text>`,
		padL, svgH-padB+14, svgW-8, svgH-padB+14, t1-t0)
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

// sweepSVG draws SLO attainment against rate for a sweep.
func (r *Report) sweepSVG() template.HTML {
	if len(r.Sweep) == 0 {
		return ""
	}
	steps := slices.Clone(r.Sweep)
	slices.SortFunc(steps, func(a, b SweepStep) int { return int(math.Copysign(1, a.Rate-b.Rate)) })
	var sb strings.Builder
	svgOpen(&sb, "SLO attainment vs rate (sweep)")
	maxR := steps[len(steps)-1].Rate * 1.05
	pw, ph := float64(svgW-8-padL), float64(svgH-padB-padT)
	var pts []string
	for _, s := range steps {
		x, y := float64(padL)+pw*s.Rate/maxR, float64(svgH-padB)-ph*s.Attainment
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		c := "#c22"
		if s.Pass {
			c = "#2a2"
		}
		fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%.2f req/s: %.1f%%</title></circle>`, x, y, c, s.Rate, 100*s.Attainment)
	}
	fmt.Fprintf(&sb, `<polyline fill="none" stroke="#888" points="%s"/>`, strings.Join(pts, " "))
	fmt.Fprintf(&sb, `<text x="4" y="%d" font-size="10">100%%</text><text x="%d" y="%d" font-size="10" text-anchor="end">%s req/s</text>`,
		padT+8, svgW-8, svgH-padB+14, fmtNum(maxR))
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"ts": func(ns int64) string {
		if ns == 0 {
			return "-"
		}
		return time.Unix(0, ns).UTC().Format(time.RFC3339)
	},
	"f2":  func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"pct": func(v float64) string { return fmt.Sprintf("%.2f%%", 100*v) },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>sluice load report</title>
<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:12px}svg{background:#fafafa;border:1px solid #ddd}</style></head><body>
<h1>sluice load report</h1>
<p>Target <b>{{.R.Meta.Target}}</b>{{if .R.Meta.Model}}, model <b>{{.R.Meta.Model}}</b>{{end}}<br>
Workload: {{.R.Meta.Workload}}<br>Load: {{.R.Meta.Load}}<br>Started {{.R.Meta.Started}}{{if .Shards}}, merged shards {{.Shards}}{{end}}</p>
<h2>Summary</h2>
<table><tr><th>requests</th><th>ok</th><th>failed</th><th>aborted</th><th>duration s</th><th>req/s</th><th>output tok/s</th><th>input tok/s</th><th>output tokens</th><th>error rate</th></tr>
<tr><td>{{.R.Requests}}</td><td>{{.R.OK}}</td><td>{{.R.Failed}}</td><td>{{.R.Aborted}}</td><td>{{f2 .S.DurationS}}</td><td>{{f2 .S.ReqPerS}}</td><td>{{f2 .S.OutTokPerS}}</td><td>{{f2 .S.InTokPerS}}</td><td>{{.R.OutputTokens}}</td><td>{{pct .S.ErrorRate}}</td></tr></table>
<p>Output tokens counted from usage for {{.R.TokensFromUsage}} requests, by tokenizer for {{.R.TokensEstimated}}.</p>
{{if .S.Attainment}}<h2>SLO ({{.SLO}})</h2>
<table><tr><th>goodput req/s</th><th>all</th><th>ttft</th><th>tpot</th><th>itl</th><th>e2e</th></tr>
<tr><td>{{f2 .S.Goodput}}</td><td>{{pct (index .S.Attainment "all")}}</td><td>{{pct (index .S.Attainment "ttft")}}</td><td>{{pct (index .S.Attainment "tpot")}}</td><td>{{pct (index .S.Attainment "itl")}}</td><td>{{pct (index .S.Attainment "e2e")}}</td></tr></table>{{end}}
{{if .R.MarkersExpected}}<p>Context fidelity: <b>{{pct .S.ContextFidelity}}</b> ({{.R.MarkersFound}} of {{.R.MarkersExpected}} markers repeated).</p>{{end}}
<h2>Latency (ms)</h2>
<table><tr><th>metric</th><th>count</th><th>mean</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th></tr>
{{range .Pcts}}<tr><td>{{.Name}}</td><td>{{.P.Count}}</td><td>{{f2 .P.Mean}}</td><td>{{f2 .P.P50}}</td><td>{{f2 .P.P90}}</td><td>{{f2 .P.P95}}</td><td>{{f2 .P.P99}}</td><td>{{f2 .P.P999}}</td><td>{{f2 .P.Max}}</td></tr>
{{end}}</table>
<div class="charts">{{range .Dists}}{{.}}{{end}}{{.TTFTTime}}{{.TokTime}}{{.ReqTime}}{{.Sweep}}</div>
{{if .R.Sweep}}<h2>Sweep steps</h2><table><tr><th>rate</th><th>requests</th><th>attainment</th><th>goodput</th><th>req/s</th><th>TTFT p50</th><th>TTFT p99</th><th>ITL p99</th><th>lag p99</th><th>pass</th></tr>
{{range .R.Sweep}}<tr><td>{{f2 .Rate}}</td><td>{{.Requests}}</td><td>{{pct .Attainment}}</td><td>{{f2 .Goodput}}</td><td>{{f2 .Throughput}}</td><td>{{f2 .TTFTp50}}</td><td>{{f2 .TTFTp99}}</td><td>{{f2 .ITLp99}}</td><td>{{f2 .LagP99}}</td><td>{{.Pass}}</td></tr>
{{end}}</table>{{end}}
<h2>Errors and faults</h2>
<table><tr><th>class</th><th>count</th></tr>{{range .ErrorKeys}}<tr><td>{{.}}</td><td>{{index $.R.Errors .}}</td></tr>{{else}}<tr><td>none</td><td>0</td></tr>{{end}}
<tr><td>aborted by the client (chaos)</td><td>{{.R.Aborted}}</td></tr>
<tr><td>retried by the gateway (x-sluice-attempts &gt; 1)</td><td>{{.R.Retried}}</td></tr>
<tr><td>recovered (retried and served)</td><td>{{.R.Recovered}} ({{pct .S.RecoveryRate}} of ok)</td></tr></table>
<table><tr><th>HTTP status</th><th>count</th></tr>{{range .StatusKeys}}<tr><td>{{.}}</td><td>{{index $.R.Statuses .}}</td></tr>{{end}}</table>
{{if .UpKeys}}<table><tr><th>x-sluice-upstream</th><th>count</th></tr>{{range .UpKeys}}<tr><td>{{.}}</td><td>{{index $.R.Upstreams .}}</td></tr>{{end}}</table>{{end}}
{{if .R.Samples}}<table><tr><th>class</th><th>status</th><th>count</th><th>message</th></tr>{{range .R.Samples}}<tr><td>{{.Class}}</td><td>{{.Status}}</td><td>{{.Count}}</td><td style="text-align:left">{{.Message}}</td></tr>{{end}}</table>{{end}}
</body></html>
`))
