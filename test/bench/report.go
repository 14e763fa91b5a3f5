package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// results is everything one run measured.
type results struct {
	opts      options
	began     time.Time
	elapsed   time.Duration
	env       envInfo
	targets   []*target
	orders    []roundOrder
	discarded []string // rounds run again because the machine was busy

	fixed   map[int]map[string]*rateResult // rate -> target -> pooled rounds
	wrk     map[string][]wrkRound
	streams map[string][]streamRound
	rss     map[string]rssInfo
	// rest and after are each proxy at rest before the load and o.settle after it.
	rest, after map[string]restInfo

	goBenchCmd string
	goBench    []goBench
	goBenchErr error
	perf       string
}

type roundOrder struct {
	phase string
	round int
	order []string
}

type rssInfo struct {
	sum  int64
	each []int64
}

// restInfo is a proxy at rest: its resident memory (VmRSS, summed over its processes) and,
// for Sluice, its goroutines (-1 where not known).
type restInfo struct {
	rss        int64
	goroutines int
}

// Reference figures for nginx given in the issue (measured on a 2-core machine like this one).
const (
	// issue 18's reference figures for nginx (its table, a 2-core machine)
	refNginxAddedP50   = 0.10 // ms, at 2,000 req/s
	refNginxAddedP99   = 0.30 // ms
	refNginxCPU        = 22.0 // µs per request
	refNginxThroughput = 0.72 // x direct
	refNginxTTFT       = 1.8  // ms added TTFT p50, 200 streams
	refNginxRSS        = 26.0 // MiB

	// limitBack is how far above its baseline a proxy's resident memory at rest after the
	// load may be and still count as back at it.
	limitBack    = 1.10
	targetRate   = 2000 // the rate the latency and CPU targets are judged at
	limitAdded   = 1.5  // Sluice's added p50/p99 vs nginx's
	limitCPU     = 1.5  // Sluice's CPU per request vs nginx's
	limitEventNs = 1000 // ns per relayed event, the relay loop (read, tap, write, flush)
)

// quantile returns the q-quantile (nearest rank) of ds, which it sorts.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.3f ms", ms(d)) }

func fmtAdded(d time.Duration) string { return fmt.Sprintf("%+.3f ms", ms(d)) }

func fmtX(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", v)
}

func div(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func cpuUs(ticks uint64, n int) float64 {
	if n == 0 {
		return math.NaN()
	}
	return float64(ticks) / clockTicks * 1e6 / float64(n)
}

func fmtUs(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f µs", v)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// latencyVerdict judges Sluice's added latency against limit × nginx's.
func latencyVerdict(sluice, nginx time.Duration, limit float64) string {
	if nginx <= 0 {
		if sluice <= 0 {
			return "met (neither adds latency measurably)"
		}
		return "indeterminate: nginx added ≤ 0 in this run (noise); compare the absolute figures"
	}
	r := float64(sluice) / float64(nginx)
	if r <= limit {
		return fmt.Sprintf("**met** (%.2fx nginx)", r)
	}
	return fmt.Sprintf("**missed** (%.2fx nginx)", r)
}

func (res *results) pooled(rate int, name string) (p50, p99 time.Duration) {
	r := res.fixed[rate][name]
	if r == nil {
		return 0, 0
	}
	return quantile(r.latencies, .5), quantile(r.latencies, .99)
}

func (res *results) streamPooled(name string) (ttft, e2e []time.Duration, ok, failed, short int, wall time.Duration, ticks uint64) {
	for _, sr := range res.streams[name] {
		ttft = append(ttft, sr.ttft...)
		e2e = append(e2e, sr.e2e...)
		ok += len(sr.ttft)
		failed += sr.failed
		short += sr.short
		wall += sr.wall
		ticks += sr.cpuTicks
	}
	if n := len(res.streams[name]); n > 0 {
		wall /= time.Duration(n)
	}
	return
}

func (res *results) wrkMean(name string) (rps float64, p50, p99 time.Duration, non2xx, requests int, ticks uint64, sock string) {
	ws := res.wrk[name]
	for _, w := range ws {
		rps += w.rps
		p50 += w.p50
		p99 += w.p99
		non2xx += w.non2xx
		requests += w.requests
		ticks += w.cpuTicks
		if w.sockErrs != "" {
			sock = w.sockErrs
		}
	}
	if n := len(ws); n > 0 {
		rps /= float64(n)
		p50 /= time.Duration(n)
		p99 /= time.Duration(n)
	}
	return
}

func (res *results) bench(name string) (map[string]float64, bool) {
	for _, b := range res.goBench {
		if b.name == name {
			return b.metrics, true
		}
	}
	return nil, false
}

// label is a target's name in prose.
func label(name string) string {
	if name == "sluice" {
		return "Sluice"
	}
	return name
}

func (res *results) has(name string) bool { return targetNamed(res.targets, name) != nil }

// pair is one ratio the report gives: a's figure divided by b's.
type pair struct{ a, b string }

func (p pair) String() string { return label(p.a) + " ÷ " + label(p.b) }

// pairs are the ratios of this run: Sluice against each yardstick (nginx, haproxy), and
// haproxy against nginx, those of the measured targets only.
func (res *results) pairs() []pair {
	var ps []pair
	for _, p := range []pair{{"sluice", "nginx"}, {"sluice", "haproxy"}, {"haproxy", "nginx"}} {
		if res.has(p.a) && res.has(p.b) {
			ps = append(ps, p)
		}
	}
	return ps
}

// ratios renders "Sluice ÷ nginx 2.40x, Sluice ÷ haproxy 1.90x, ..." of f over res.pairs().
func (res *results) ratios(f func(name string) float64) string {
	var parts []string
	for _, pr := range res.pairs() {
		parts = append(parts, fmt.Sprintf("%s %s", pr, ratioTo(f(pr.a), f(pr.b), pr.b)))
	}
	return strings.Join(parts, ", ")
}

// ratioTo is a ÷ b, or why there is none: a ratio to an added figure at or below zero (noise
// on a busy machine) means nothing.
func ratioTo(a, b float64, bName string) string {
	if math.IsNaN(a) || math.IsNaN(b) {
		return "n/a"
	}
	if b <= 0 {
		return fmt.Sprintf("n/a (%s's ≤ 0)", label(bName))
	}
	return fmtX(a / b)
}

// yardsticks are the measured proxies Sluice is compared with, in the report's order.
func (res *results) yardsticks() []string {
	var ys []string
	for _, y := range []string{"nginx", "haproxy"} {
		if res.has(y) {
			ys = append(ys, y)
		}
	}
	return ys
}

func (res *results) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	o, e := res.opts, res.env

	var labels []string
	for _, t := range res.targets {
		labels = append(labels, label(t.name))
	}
	p("# Sluice overhead: %s\n\n", strings.Join(labels, " vs "))
	tools := []string{e.goVersion}
	if res.has("nginx") {
		tools = append(tools, fmt.Sprintf("%s (worker_processes %s: %d workers)", e.nginx, nginxWorkers, e.nginxWorkers))
	}
	if res.has("haproxy") {
		tools = append(tools, fmt.Sprintf("%s (nbthread %d: %d threads)", e.haproxy, e.haproxyNbthread, e.haproxyThreads))
	}
	tools = append(tools, e.wrk)
	p("Run started %s, took %v. Machine: %d CPUs (%s), kernel %s; %s.\n\n",
		res.began.Format("2006-01-02 15:04 MST"), res.elapsed.Round(time.Second), e.cpus, e.cpuModel, e.kernel, strings.Join(tools, "; "))
	if e.loadavg != "" {
		p("Load average when the measurements began: %s. ", e.loadavg)
	}
	mean, worst, turns := res.foreignLoad()
	p("Other work on the machine during the measured turns (user+system CPU time of processes other than the harness and its children, from /proc/stat): mean %.2f CPUs, worst turn %.2f CPUs, over %d turns.", mean, worst, turns)
	if len(res.discarded) > 0 {
		p(" Rounds discarded and run again because other work exceeded %.2f CPUs: %s.", o.maxOther, strings.Join(res.discarded, "; "))
	}
	if mean > 0.25 || worst > 0.75 {
		p(" **The machine was not quiet: treat this run's figures with extra care, and prefer the per-round pairings below.**")
	}
	p("\n\n")
	p("- Upstream: `sluice mock` with zero delay (the simulator's inline fast path), its own process.\n")
	if res.has("sluice") {
		p("- Sluice: `sluice serve --upstream http://SIM --listen ... --admin ...`, every default on (as built from this tree)")
		if len(o.sluiceEnv) > 0 {
			p(", environment `%s`", strings.Join(o.sluiceEnv, " "))
		}
		p(".\n")
	}
	if res.has("nginx") {
		p("- nginx: generated config, `proxy_buffering off`, `proxy_http_version 1.1`, `proxy_set_header Connection \"\"`, upstream `keepalive 256`, access log off; `worker_processes %s` = one worker per CPU, as Go's GOMAXPROCS gives Sluice.\n", nginxWorkers)
	}
	if res.has("haproxy") {
		p("- haproxy: generated config, `mode http`, keep-alive on both sides with `http-reuse always` (any idle upstream connection serves any request, as nginx's keepalive pool and Go's Transport do), `option http-no-delay` (without it haproxy 2.6 holds a stream's events until the stream ends), no request buffering, logging off; `nbthread %d` = one thread per CPU; one process in the foreground (`-db`).\n", e.haproxyNbthread)
	}
	var left []string
	for _, t := range allTargets {
		if !res.has(t) {
			left = append(left, t)
		}
	}
	if len(left) > 0 {
		p("- Left out of this run (`--targets %s`): %s.\n", strings.Join(names(res.targets), ","), strings.Join(left, ", "))
	}
	p("- Turns of %v per target, %d round(s) with the target order rotated each round, %v unmeasured warm-up per target per rate, %v pause between turns; streams: %d × %d tokens, %d measured round(s) after one warm-up round.\n",
		o.duration, o.rounds, o.warmup, o.gap, o.streams, o.streamTokens, o.streamRounds)
	p("- **Caveat:** the load generators (vegeta inside the harness process, wrk, the stream client), the simulator and the proxy under test all share these %d CPUs. Absolute figures are pessimistic and the max-throughput phase is a contest for CPU; compare the ratios, measured side by side in this one run.\n\n", e.cpus)

	// ---- targets ----
	d50, d99 := res.pooled(targetRate, "direct")
	added := func(name string) (a50, a99 time.Duration) {
		p50, p99 := res.pooled(targetRate, name)
		return p50 - d50, p99 - d99
	}
	dT, _, _, _, _, _, _ := res.streamPooled("direct")
	dTTFT, dTp99 := quantile(dT, .5), quantile(dT, .99)
	addedTTFT := func(name string) (a50, a99 time.Duration) {
		tt, _, _, _, _, _, _ := res.streamPooled(name)
		return quantile(tt, .5) - dTTFT, quantile(tt, .99) - dTp99
	}
	res.targetsSection(p, added, addedTTFT)

	// ---- a ----
	p("## a. Fixed rates (vegeta): POST /v1/chat/completions, non-streaming, max_tokens 16\n\n")
	p("Latency is vegeta's: request sent to whole body read. Added = target − direct, pooled over all rounds.\n\n")
	for _, rate := range o.rates {
		fr := res.fixed[rate]
		if fr == nil {
			continue
		}
		dp50, dp99 := res.pooled(rate, "direct")
		p("### %s req/s\n\n", thousands(rate))
		p("| target | requests | success | achieved req/s | p50 | p99 | added p50 | added p99 | CPU/request |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, t := range res.targets {
			r := fr[t.name]
			if r == nil {
				continue
			}
			p50, p99 := res.pooled(rate, t.name)
			achieved := 0.0
			for _, rr := range r.rounds {
				achieved += rr.rate
			}
			if len(r.rounds) > 0 {
				achieved /= float64(len(r.rounds))
			}
			added50, added99, cpu := "—", "—", "—"
			if t.proxy != nil {
				added50, added99, cpu = fmtAdded(p50-dp50), fmtAdded(p99-dp99), fmtUs(cpuUs(r.cpuTicks, r.requests))
			}
			p("| %s | %s | %.4f | %.1f | %s | %s | %s | %s | %s |\n", t.name, thousands(r.requests), ratio(r.ok, r.requests),
				achieved, fmtMs(p50), fmtMs(p99), added50, added99, cpu)
		}
		if len(res.pairs()) > 0 {
			p("\nRatios: added p50 %s; added p99 %s; CPU/request %s.",
				res.ratios(func(n string) float64 { p50, _ := res.pooled(rate, n); return float64(p50 - dp50) }),
				res.ratios(func(n string) float64 { _, p99 := res.pooled(rate, n); return float64(p99 - dp99) }),
				res.ratios(func(n string) float64 { return res.cpuAt(rate, n) }))
		}
		for _, t := range res.targets {
			if r := fr[t.name]; r != nil && len(r.errs) > 0 {
				var es []string
				for k, v := range r.errs {
					es = append(es, fmt.Sprintf("%q ×%d rounds", k, v))
				}
				slices.Sort(es)
				p(" Errors from %s: %s.", t.name, strings.Join(es, "; "))
			}
		}
		p("\n\n")
	}

	// ---- b ----
	p("## b. Max throughput (wrk -t%d -c%d, %v per run, %d round(s))\n\n", o.wrkThreads, o.wrkConns, o.duration, o.rounds)
	p("wrk runs on the same %d CPUs as the simulator and the proxy: this is throughput of the whole box, load generator included.\n\n", e.cpus)
	p("| target | req/s (mean) | vs direct | p50 (mean) | p99 (mean) | non-2xx | socket errors | CPU/request |\n|---|---|---|---|---|---|---|---|\n")
	dRPS, _, _, _, _, _, _ := res.wrkMean("direct")
	for _, t := range res.targets {
		rps, w50, w99, non2xx, reqs, ticks, sock := res.wrkMean(t.name)
		cpu := "—"
		if t.proxy != nil {
			cpu = fmtUs(cpuUs(ticks, reqs))
		}
		if sock == "" {
			sock = "none"
		}
		p("| %s | %.0f | %s | %s | %s | %d | %s | %s |\n", t.name, rps, fmtX(div(rps, dRPS)), fmtMs(w50), fmtMs(w99), non2xx, sock, cpu)
	}
	if len(res.pairs()) > 0 {
		p("\nThroughput ratios: %s.", res.ratios(func(n string) float64 { rps, _, _, _, _, _, _ := res.wrkMean(n); return rps }))
	}
	p("\n\n")

	// ---- c ----
	p("## c. %d concurrent streams of %d tokens (max_tokens %d, ignore_eos, stream)\n\n", o.streams, o.streamTokens, o.streamTokens)
	p("All streams of a round start at once on warm keep-alive connections. TTFT: request sent to the first event with non-empty content; E2E: to `data: [DONE]`. Pooled over %d round(s).\n\n", o.streamRounds)
	p("| target | ok | failed | short | TTFT p50 | TTFT p99 | added p50 | added p99 | E2E p50 | E2E p99 | round wall (mean) | CPU/stream | CPU/event |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range res.targets {
		tt, e2e, ok, failed, short, wall, ticks := res.streamPooled(t.name)
		t50, t99 := quantile(tt, .5), quantile(tt, .99)
		a50, a99, cs, ce := "—", "—", "—", "—"
		if t.proxy != nil {
			n := ok + failed
			a50, a99 = fmtAdded(t50-dTTFT), fmtAdded(t99-dTp99)
			cs, ce = fmtUs(cpuUs(ticks, n)), fmtUs(cpuUs(ticks, n*(o.streamTokens+3)))
		}
		p("| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t.name, ok, failed, short, fmtMs(t50), fmtMs(t99),
			a50, a99, fmtMs(quantile(e2e, .5)), fmtMs(quantile(e2e, .99)), fmtMs(wall), cs, ce)
	}
	p("\nCPU/event divides by %d events per stream (role chunk, %d tokens, finish chunk, [DONE]).", o.streamTokens+3, o.streamTokens)
	if len(res.pairs()) > 0 {
		p(" Ratios: added TTFT p50 %s; added TTFT p99 %s; CPU/stream %s.",
			res.ratios(func(n string) float64 { a50, _ := addedTTFT(n); return float64(a50) }),
			res.ratios(func(n string) float64 { _, a99 := addedTTFT(n); return float64(a99) }),
			res.ratios(res.cpuPerStream))
	}
	for _, t := range res.targets {
		for _, sr := range res.streams[t.name] {
			if len(sr.errs) > 0 {
				p(" First errors from %s: %q.", t.name, sr.errs)
				break
			}
		}
	}
	p("\n\n")

	// ---- d ----
	p("## d. CPU time per request and peak RSS of each proxy\n\n")
	p("CPU: utime+stime from /proc/PID/stat (clock ticks of 10 ms; a process's figure sums all its threads) across each of the proxy's own turns, divided by the requests completed in them; nginx counts its master and workers, haproxy is one process (`-db`) with its threads. Peak RSS: VmHWM from /proc/PID/status at the end of the streaming phase (nginx: the sum over master and workers, shared pages counted in each).\n\n")
	p("| proxy |")
	for _, rate := range o.rates {
		p(" CPU/req @ %s |", thousands(rate))
	}
	p(" CPU/req wrk | CPU/stream | peak RSS |\n|---|")
	for range o.rates {
		p("---|")
	}
	p("---|---|---|\n")
	row := func(name string) []float64 {
		var v []float64
		for _, rate := range o.rates {
			v = append(v, res.cpuAt(rate, name))
		}
		_, _, _, _, reqs, ticks, _ := res.wrkMean(name)
		v = append(v, cpuUs(ticks, reqs))
		v = append(v, res.cpuPerStream(name))
		v = append(v, mib(res.rss[name].sum))
		return v
	}
	rows := map[string][]float64{}
	for _, t := range res.targets {
		if t.proxy == nil {
			continue
		}
		rows[t.name] = row(t.name)
		v := rows[t.name]
		p("| %s |", t.name)
		for _, x := range v[:len(v)-1] {
			p(" %s |", fmtUs(x))
		}
		p(" %.1f MiB |\n", v[len(v)-1])
	}
	for _, pr := range res.pairs() {
		p("| %s |", pr)
		for i := range rows[pr.a] {
			p(" %s |", fmtX(div(rows[pr.a][i], rows[pr.b][i])))
		}
		p("\n")
	}
	p("\n")
	res.kernelShares(p, o.rates)
	if res.has("nginx") {
		var each []string
		for _, v := range res.rss["nginx"].each {
			each = append(each, fmt.Sprintf("%.1f", mib(v)))
		}
		p("nginx per process (MiB, master first): %s. ", strings.Join(each, ", "))
	}
	if res.has("haproxy") {
		p("haproxy: one process of %d threads (nbthread %d). ", e.haproxyThreads, e.haproxyNbthread)
	}
	p("Simulator peak RSS for reference: %.1f MiB.\n\n", mib(res.rss["sim"].sum))

	// ---- e ----
	if len(res.rest) > 0 && len(res.after) > 0 {
		p("## e. At rest again after the load\n\n")
		p("Resident memory (VmRSS from /proc/PID/status, summed over a proxy's processes) at rest before the first phase, its peak (VmHWM) and at rest %v after the last phase ended and the clients closed their connections; Sluice's goroutines (go_goroutines on its admin listener) at the same two moments.\n\n", o.settle)
		p("| proxy | RSS at rest before | peak RSS | RSS %v after | after ÷ before | goroutines before → after |\n|---|---|---|---|---|---|\n", o.settle)
		for _, t := range res.targets {
			if t.proxy == nil {
				continue
			}
			r, a := res.rest[t.name], res.after[t.name]
			g := "—"
			if r.goroutines >= 0 && a.goroutines >= 0 {
				g = fmt.Sprintf("%d → %d", r.goroutines, a.goroutines)
			}
			p("| %s | %.1f MiB | %.1f MiB | %.1f MiB | %s | %s |\n", t.name, mib(r.rss), mib(res.rss[t.name].sum), mib(a.rss), fmtX(div(float64(a.rss), float64(r.rss))), g)
		}
		p("\n")
	}

	// ---- go bench ----
	res.benchSection(p)

	// ---- per round ----
	p("## Per-round detail\n\n")
	p("Each round runs the targets back to back in the order shown; added figures within one round are the fairest pairing.\n\n")
	p("| phase | round | order |")
	for _, t := range res.targets {
		p(" %s |", t.name)
	}
	p(" other load (worst turn) |\n|---|---|---|")
	for range res.targets {
		p("---|")
	}
	p("---|\n")
	idx := map[string]int{}
	for _, ro := range res.orders {
		i := idx[ro.phase]
		idx[ro.phase]++
		cells := map[string]string{}
		worst := 0.0
		for _, name := range ro.order {
			switch {
			case strings.HasPrefix(ro.phase, "rate"):
				rate, _ := strconv.Atoi(strings.TrimPrefix(ro.phase, "rate"))
				if r := res.fixed[rate][name]; r != nil && i < len(r.rounds) {
					rr := r.rounds
					cells[name] = fmt.Sprintf("p50 %.3f / p99 %.3f ms, %.0f req/s", ms(rr[i].p50), ms(rr[i].p99), rr[i].rate)
					worst = max(worst, rr[i].foreign)
				}
			case ro.phase == "wrk":
				if ws := res.wrk[name]; i < len(ws) {
					cells[name] = fmt.Sprintf("%.0f req/s", ws[i].rps)
					worst = max(worst, ws[i].foreign)
				}
			case ro.phase == "streams":
				if ss := res.streams[name]; i < len(ss) {
					cells[name] = fmt.Sprintf("TTFT p50 %.2f / p99 %.2f ms", ms(quantile(ss[i].ttft, .5)), ms(quantile(ss[i].ttft, .99)))
					worst = max(worst, ss[i].foreign)
				}
			}
		}
		p("| %s | %d | %s |", phaseName(ro.phase), ro.round+1, strings.Join(ro.order, " → "))
		for _, t := range res.targets {
			p(" %s |", cells[t.name])
		}
		p(" %.2f CPUs |\n", worst)
	}
	p("\n")
	if res.perf != "" {
		p("## Profile of Sluice (perf record -F 999 -g on the sluice process; Go CPU profile from the admin listener)\n\n")
		p("```\n%s```\n\n", res.perf)
	}
	return b.String()
}

// targetsSection judges the targets: Sluice's figures against nginx's (the issue's
// yardstick), with haproxy's beside them and Sluice's ratio to it.
func (res *results) targetsSection(p func(string, ...any), added, addedTTFT func(name string) (a50, a99 time.Duration)) {
	o := res.opts
	p("## Targets\n\n")
	if !res.has("sluice") {
		p("Sluice was left out of this run (`--targets %s`): no target judged.\n\n", strings.Join(names(res.targets), ","))
		return
	}
	ys := res.yardsticks()
	p("| target | Sluice |")
	for _, y := range ys {
		p(" %s (this run) |", y)
	}
	p(" limit | verdict |\n|---|---|")
	for range ys {
		p("---|")
	}
	p("---|---|\n")
	// row prints one judged figure: Sluice's, each yardstick's, the limit and the verdict.
	row := func(name string, fmtV func(float64) string, v func(target string) float64, limit string, verdict func(s, n float64) string) {
		s := v("sluice")
		p("| %s | %s |", name, fmtV(s))
		for _, y := range ys {
			p(" %s |", fmtV(v(y)))
		}
		verd := "no yardstick: nginx not in --targets"
		if res.has("nginx") {
			verd = verdict(s, v("nginx"))
		}
		if res.has("haproxy") {
			if h := v("haproxy"); h > 0 {
				verd += fmt.Sprintf("; %s haproxy", fmtX(s/h))
			} else {
				verd += "; haproxy's ≤ 0"
			}
		}
		p(" %s | %s |\n", limit, verd)
	}
	nginxTimes := func(limit float64, v float64, f func(float64) string) string {
		if !res.has("nginx") {
			return fmt.Sprintf("≤ %.1f × nginx", limit)
		}
		return fmt.Sprintf("≤ %.1f × nginx = %s", limit, f(limit*v))
	}
	addedMs := func(v float64) string { return fmtAdded(time.Duration(v)) }
	if _, ok := res.fixed[targetRate]; ok {
		a50 := func(n string) float64 { v, _ := added(n); return float64(v) }
		a99 := func(n string) float64 { _, v := added(n); return float64(v) }
		latV := func(s, n float64) string { return latencyVerdict(time.Duration(s), time.Duration(n), limitAdded) }
		row(fmt.Sprintf("added p50 at %s req/s", thousands(targetRate)), addedMs, a50, nginxTimes(limitAdded, a50("nginx"), addedMs), latV)
		row(fmt.Sprintf("added p99 at %s req/s", thousands(targetRate)), addedMs, a99, nginxTimes(limitAdded, a99("nginx"), addedMs), latV)
		cpu := func(n string) float64 { return res.cpuAt(targetRate, n) }
		row(fmt.Sprintf("CPU per request at %s req/s", thousands(targetRate)), fmtUs, cpu, nginxTimes(limitCPU, cpu("nginx"), fmtUs), func(s, n float64) string {
			if s <= limitCPU*n {
				return fmt.Sprintf("**met** (%s nginx)", fmtX(div(s, n)))
			}
			return fmt.Sprintf("**missed** (%s nginx)", fmtX(div(s, n)))
		})
	} else {
		p("| added latency and CPU at %s req/s | not measured (--rates lacks %d) |", thousands(targetRate), targetRate)
		for range ys {
			p(" |")
		}
		p(" | |\n")
	}
	t50 := func(n string) float64 { v, _ := addedTTFT(n); return float64(v) }
	row(fmt.Sprintf("TTFT p50 added, %d streams × %d tokens", o.streams, o.streamTokens), addedMs, t50, "≤ nginx", func(s, n float64) string {
		if s <= n {
			return fmt.Sprintf("**met** (%s nginx)", fmtX(div(s, n)))
		}
		return fmt.Sprintf("**missed** (%s nginx)", fmtX(div(s, n)))
	})
	if len(res.rest) > 0 && len(res.after) > 0 {
		back := func(n string) float64 { return div(float64(res.after[n].rss), float64(res.rest[n].rss)) }
		row(fmt.Sprintf("RSS %v after the load ÷ at rest before it", o.settle), func(v float64) string { return fmtX(v) }, back,
			fmt.Sprintf("≤ %.2fx (its baseline)", limitBack), func(s, _ float64) string {
				if s <= limitBack {
					return "**met**"
				}
				return "**missed**"
			})
	}
	res.benchTargets(p, len(ys))
	p("\nThe issue's reference for nginx on a 2-core machine: %+.2f ms p50 and %+.1f ms p99 at 2,000 req/s, %.0f µs CPU per request, %.2fx direct throughput, %+.1f ms TTFT p50 with 200 streams, %.0f MiB peak RSS. This run's nginx is the yardstick above (same run, same conditions)",
		refNginxAddedP50, refNginxAddedP99, refNginxCPU, refNginxThroughput, refNginxTTFT, refNginxRSS)
	if res.has("haproxy") {
		p("; haproxy, configured as a plain streaming proxy too, is a second one beside it")
	}
	p(".\n\n")
}

// kernelShares says how much of each proxy's CPU above was the kernel's (stime: system
// calls, and the loopback TCP work done in them), at each rate and a stream: what user
// space costs, and what no user-space change can take away.
func (res *results) kernelShares(p func(string, ...any), rates []int) {
	var lines []string
	for _, t := range res.targets {
		if t.proxy == nil {
			continue
		}
		var parts []string
		for _, rate := range rates {
			if r := res.fixed[rate][t.name]; r != nil && r.requests > 0 {
				parts = append(parts, fmt.Sprintf("%s @ %s", kernelPart(r.cpuTicks, r.sysTicks, r.requests), thousands(rate)))
			}
		}
		var all, sys uint64
		n := 0
		for _, sr := range res.streams[t.name] {
			all += sr.cpuTicks
			sys += sr.sysTicks
			n += len(sr.ttft) + sr.failed
		}
		if n > 0 {
			parts = append(parts, kernelPart(all, sys, n)+" a stream")
		}
		if len(parts) == 0 {
			continue
		}
		lines = append(lines, t.name+" "+strings.Join(parts, ", "))
	}
	if len(lines) > 0 {
		p("In the kernel (stime), of the CPU above, user space being the rest: %s.\n\n", strings.Join(lines, "; "))
	}
}

// kernelPart is "S of A µs (P%)": the kernel's part sys of all ticks over n requests.
func kernelPart(all, sys uint64, n int) string {
	if all == 0 {
		return "0 µs"
	}
	return fmt.Sprintf("%s of %s (%.0f%%)", fmtUs(cpuUs(sys, n)), fmtUs(cpuUs(all, n)), 100*float64(sys)/float64(all))
}

// cpuPerStream is a proxy's CPU per stream in µs over the measured streaming rounds.
func (res *results) cpuPerStream(name string) float64 {
	_, _, ok, failed, _, _, ticks := res.streamPooled(name)
	return cpuUs(ticks, ok+failed)
}

// foreignLoad summarises the CPUs' worth of other work over every measured turn.
func (res *results) foreignLoad() (mean, worst float64, n int) {
	add := func(v float64) {
		mean += v
		worst = max(worst, v)
		n++
	}
	for _, byTarget := range res.fixed {
		for _, r := range byTarget {
			for _, rr := range r.rounds {
				add(rr.foreign)
			}
		}
	}
	for _, ws := range res.wrk {
		for _, w := range ws {
			add(w.foreign)
		}
	}
	for _, ss := range res.streams {
		for _, sr := range ss {
			add(sr.foreign)
		}
	}
	if n > 0 {
		mean /= float64(n)
	}
	return mean, worst, n
}

// cpuAt is a proxy's CPU per request in µs at a fixed rate.
func (res *results) cpuAt(rate int, name string) float64 {
	r := res.fixed[rate][name]
	if r == nil {
		return math.NaN()
	}
	return cpuUs(r.cpuTicks, r.requests)
}

const (
	benchRelaySmall = "BenchmarkStreamRelay/events=16"
	benchRelayLarge = "BenchmarkStreamRelay/events=1024"
	benchLoopFull   = "BenchmarkRelayLoop/next+observe+write+flush"
	benchLoopDirect = "BenchmarkStreamRelayLoopback/events=1024/direct"
	benchLoopSluice = "BenchmarkStreamRelayLoopback/events=1024/sluice"
	eventsSmall     = 16 + 4 // role, tokens, finish, usage, [DONE]
	eventsLarge     = 1024 + 4
)

// benchTargets adds the rows judged by the Go benchmarks to the targets table, with an empty
// cell for each of the yardsticks columns.
func (res *results) benchTargets(p func(string, ...any), yardsticks int) {
	dash := strings.Repeat(" — |", yardsticks)
	if !res.opts.goBench {
		p("| per-event relay cost, allocations per event | not run (--gobench=false) |%s < 1 µs, 0 | — |\n", dash)
		return
	}
	large, ok1 := res.bench(benchRelayLarge)
	small, ok2 := res.bench(benchRelaySmall)
	loop, ok3 := res.bench(benchLoopFull)
	if res.goBenchErr != nil || !ok1 || !ok2 || !ok3 {
		p("| per-event relay cost, allocations per event | go benchmarks failed (see below) |%s < 1 µs, 0 | not measured |\n", dash)
		return
	}
	ns := large["ns/event"]
	v := "**missed**"
	if loop["ns/op"] < limitEventNs {
		v = "**met**"
	}
	p("| per-event relay cost (go bench: the relay loop; the handler path with %d events amortises the request's own cost) | %.0f ns/event (handler path: %.0f ns) |%s < 1 µs | %s |\n", eventsLarge-4, loop["ns/op"], ns, dash, v)
	marginal := (large["allocs/op"] - small["allocs/op"]) / float64(eventsLarge-eventsSmall)
	v = "**missed**"
	if loop["allocs/op"] == 0 && marginal < 0.01 {
		v = "**met**"
	}
	p("| allocations per relayed event (go bench) | %.3f marginal per event (%.0f allocs/op at %d events, %.0f at %d); relay loop alone %.0f allocs/event |%s none beyond the event | %s |\n",
		marginal, small["allocs/op"], eventsSmall-4, large["allocs/op"], eventsLarge-4, loop["allocs/op"], dash, v)
}

func (res *results) benchSection(p func(string, ...any)) {
	if !res.opts.goBench {
		return
	}
	p("## Go benchmarks of the stream relay (package proxy)\n\n")
	p("`%s`\n\n", res.goBenchCmd)
	if res.goBenchErr != nil {
		p("Failed:\n\n```\n%v\n```\n\n", res.goBenchErr)
		return
	}
	p("| benchmark | ns/op | ns/event | allocs/event | allocs/op | B/op |\n|---|---|---|---|---|---|\n")
	for _, gb := range res.goBench {
		f := func(unit, format string) string {
			if v, ok := gb.metrics[unit]; ok {
				return fmt.Sprintf(format, v)
			}
			return "—"
		}
		p("| %s | %s | %s | %s | %s | %s |\n", gb.name, f("ns/op", "%.0f"), f("ns/event", "%.0f"), f("allocs/event", "%.4f"), f("allocs/op", "%.0f"), f("B/op", "%.0f"))
	}
	p("\nStreamRelay: Handler.ServeHTTP per iteration, upstream an in-process RoundTripper returning one event per Read, client a discarding ResponseWriter+Flusher; per-event figures amortise the per-request cost, and allocs/op not growing from 16 to 1024 events means no allocation per event. StreamRelayLoopback: the same over loopback TCP (client and upstream in the benchmark process too), direct vs through Sluice.")
	if d, ok := res.bench(benchLoopDirect); ok {
		if s, ok := res.bench(benchLoopSluice); ok {
			p(" Through Sluice over loopback adds %.0f ns per event (1024-event streams, syscalls included).", s["ns/event"]-d["ns/event"])
		}
	}
	p(" RelayLoop: one event per iteration of Reader.Next, Tap.ObserveChunk (the tap's scan, which is also the chunk check), Write and Flush.\n\n")
}
