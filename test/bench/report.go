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

// Reference figures for nginx given in the issue (measured on a 2-core machine like this one).
const (
	refNginxAddedP50   = 0.16  // ms, at 2,000 req/s
	refNginxAddedP99   = 1.1   // ms
	refNginxCPU        = 30.0  // µs per request
	refNginxThroughput = 0.70  // x direct
	refNginxTTFT       = 3.8   // ms added TTFT p50, 200 streams
	refNginxRSS        = 26.0  // MiB
	targetRate         = 2000  // the rate the latency and CPU targets are judged at
	limitAdded         = 1.2   // Sluice's added p50/p99 vs nginx's
	limitCPU           = 1.5   // Sluice's CPU per request vs nginx's
	limitEventNs       = 5000. // ns per relayed event
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

func (res *results) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	o, e := res.opts, res.env

	p("# Sluice overhead: direct vs Sluice vs nginx\n\n")
	p("Run started %s, took %v. Machine: %d CPUs (%s), kernel %s; %s; %s (worker_processes %s: %d workers); %s.\n\n",
		res.began.Format("2006-01-02 15:04 MST"), res.elapsed.Round(time.Second), e.cpus, e.cpuModel, e.kernel,
		e.goVersion, e.nginx, nginxWorkers, e.nginxWorkers, e.wrk)
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
	p("- Sluice: `sluice serve --upstream http://SIM --listen ... --admin ...`, every default on (as built from this tree)")
	if len(o.sluiceEnv) > 0 {
		p(", environment `%s`", strings.Join(o.sluiceEnv, " "))
	}
	p(".\n")
	p("- nginx: generated config, `proxy_buffering off`, `proxy_http_version 1.1`, `proxy_set_header Connection \"\"`, upstream `keepalive 256`, access log off; `worker_processes %s` = one worker per CPU, as Go's GOMAXPROCS gives Sluice.\n", nginxWorkers)
	p("- Turns of %v per target, %d round(s) with the target order rotated each round, %v unmeasured warm-up per target per rate, %v pause between turns; streams: %d × %d tokens, %d measured round(s) after one warm-up round.\n",
		o.duration, o.rounds, o.warmup, o.gap, o.streams, o.streamTokens, o.streamRounds)
	p("- **Caveat:** the load generators (vegeta inside the harness process, wrk, the stream client), the simulator and the proxy under test all share these %d CPUs. Absolute figures are pessimistic and the max-throughput phase is a contest for CPU; compare the ratios, measured side by side in this one run.\n\n", e.cpus)

	// ---- targets ----
	s50, s99 := res.pooled(targetRate, "sluice")
	n50, n99 := res.pooled(targetRate, "nginx")
	d50, d99 := res.pooled(targetRate, "direct")
	sa50, sa99, na50, na99 := s50-d50, s99-d99, n50-d50, n99-d99
	sCPU, nCPU := res.cpuAt(targetRate, "sluice"), res.cpuAt(targetRate, "nginx")
	dT, _, _, _, _, _, _ := res.streamPooled("direct")
	sT, _, _, _, _, _, _ := res.streamPooled("sluice")
	nT, _, _, _, _, _, _ := res.streamPooled("nginx")
	dTTFT, sTTFT, nTTFT := quantile(dT, .5), quantile(sT, .5), quantile(nT, .5)

	p("## Targets\n\n")
	p("| target | Sluice | nginx (this run) | limit | verdict |\n|---|---|---|---|---|\n")
	if _, ok := res.fixed[targetRate]; ok {
		p("| added p50 at %s req/s | %s | %s | ≤ %.1f × nginx = %s | %s |\n", thousands(targetRate), fmtAdded(sa50), fmtAdded(na50),
			limitAdded, fmtAdded(time.Duration(limitAdded*float64(na50))), latencyVerdict(sa50, na50, limitAdded))
		p("| added p99 at %s req/s | %s | %s | ≤ %.1f × nginx = %s | %s |\n", thousands(targetRate), fmtAdded(sa99), fmtAdded(na99),
			limitAdded, fmtAdded(time.Duration(limitAdded*float64(na99))), latencyVerdict(sa99, na99, limitAdded))
		cpuV := "**missed**"
		if sCPU <= limitCPU*nCPU {
			cpuV = "**met**"
		}
		p("| CPU per request at %s req/s | %s | %s | ≤ %.1f × nginx = %s | %s (%s nginx) |\n", thousands(targetRate), fmtUs(sCPU), fmtUs(nCPU),
			limitCPU, fmtUs(limitCPU*nCPU), cpuV, fmtX(div(sCPU, nCPU)))
	} else {
		p("| added latency and CPU at %s req/s | not measured (--rates lacks %d) | | | |\n", thousands(targetRate), targetRate)
	}
	ttftV := "**missed**"
	if sTTFT-dTTFT <= nTTFT-dTTFT {
		ttftV = "**met**"
	}
	p("| TTFT p50 added, %d streams × %d tokens | %s | %s | ≤ nginx | %s (%s nginx) |\n", o.streams, o.streamTokens,
		fmtAdded(sTTFT-dTTFT), fmtAdded(nTTFT-dTTFT), ttftV, fmtX(div(float64(sTTFT-dTTFT), float64(nTTFT-dTTFT))))
	res.benchTargets(p)
	p("\nThe issue's reference for nginx on a 2-core machine: %+.2f ms p50 and %+.1f ms p99 at 2,000 req/s, %.0f µs CPU per request, %.2fx direct throughput, %+.1f ms TTFT p50 with 200 streams, %.0f MiB peak RSS. This run's nginx is the yardstick above (same run, same conditions).\n\n",
		refNginxAddedP50, refNginxAddedP99, refNginxCPU, refNginxThroughput, refNginxTTFT, refNginxRSS)

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
		sp50, sp99 := res.pooled(rate, "sluice")
		np50, np99 := res.pooled(rate, "nginx")
		p("\nSluice vs nginx: added p50 %s, added p99 %s, CPU/request %s.", fmtX(div(float64(sp50-dp50), float64(np50-dp50))),
			fmtX(div(float64(sp99-dp99), float64(np99-dp99))), fmtX(div(res.cpuAt(rate, "sluice"), res.cpuAt(rate, "nginx"))))
		for _, t := range res.targets {
			if len(fr[t.name].errs) > 0 {
				var es []string
				for k, v := range fr[t.name].errs {
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
	sRPS, _, _, _, _, _, _ := res.wrkMean("sluice")
	nRPS, _, _, _, _, _, _ := res.wrkMean("nginx")
	p("\nSluice vs nginx throughput: %s.\n\n", fmtX(div(sRPS, nRPS)))

	// ---- c ----
	p("## c. %d concurrent streams of %d tokens (max_tokens %d, ignore_eos, stream)\n\n", o.streams, o.streamTokens, o.streamTokens)
	p("All streams of a round start at once on warm keep-alive connections. TTFT: request sent to the first event with non-empty content; E2E: to `data: [DONE]`. Pooled over %d round(s).\n\n", o.streamRounds)
	p("| target | ok | failed | short | TTFT p50 | TTFT p99 | added p50 | added p99 | E2E p50 | E2E p99 | round wall (mean) | CPU/stream | CPU/event |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	dTp99 := quantile(dT, .99)
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
	p("CPU: utime+stime from /proc/PID/stat (clock ticks of 10 ms) across each of the proxy's own turns, divided by the requests completed in them; nginx counts its master and workers. Peak RSS: VmHWM from /proc/PID/status at the end of the streaming phase (nginx: the sum over master and workers, shared pages counted in each).\n\n")
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
		_, _, ok, failed, _, _, sticks := res.streamPooled(name)
		v = append(v, cpuUs(sticks, ok+failed))
		v = append(v, mib(res.rss[name].sum))
		return v
	}
	sr, nr := row("sluice"), row("nginx")
	for _, x := range []struct {
		name string
		v    []float64
	}{{"sluice", sr}, {"nginx", nr}} {
		p("| %s |", x.name)
		for _, v := range x.v[:len(x.v)-1] {
			p(" %s |", fmtUs(v))
		}
		p(" %.1f MiB |\n", x.v[len(x.v)-1])
	}
	p("| Sluice / nginx |")
	for i := range sr {
		p(" %s |", fmtX(div(sr[i], nr[i])))
	}
	p("\n\n")
	var each []string
	for _, v := range res.rss["nginx"].each {
		each = append(each, fmt.Sprintf("%.1f", mib(v)))
	}
	p("nginx per process (MiB, master first): %s. Simulator peak RSS for reference: %.1f MiB.\n\n", strings.Join(each, ", "), mib(res.rss["sim"].sum))

	// ---- go bench ----
	res.benchSection(p)

	// ---- per round ----
	p("## Per-round detail\n\n")
	p("Each round runs the targets back to back in the order shown; added figures within one round are the fairest pairing.\n\n")
	p("| phase | round | order | direct | sluice | nginx | other load (worst turn) |\n|---|---|---|---|---|---|---|\n")
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
				rr := res.fixed[rate][name].rounds
				if i < len(rr) {
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
		phase := phaseName(ro.phase)
		p("| %s | %d | %s | %s | %s | %s | %.2f CPUs |\n", phase, ro.round+1, strings.Join(ro.order, " → "), cells["direct"], cells["sluice"], cells["nginx"], worst)
	}
	p("\n")
	if res.perf != "" {
		p("## Profile of Sluice (perf record -F 999 -g on the sluice process; Go CPU profile from the admin listener)\n\n")
		p("```\n%s```\n\n", res.perf)
	}
	return b.String()
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

func (res *results) benchTargets(p func(string, ...any)) {
	if !res.opts.goBench {
		p("| per-event relay cost, allocations per event | not run (--gobench=false) | — | < 5 µs, 0 | — |\n")
		return
	}
	large, ok1 := res.bench(benchRelayLarge)
	small, ok2 := res.bench(benchRelaySmall)
	loop, ok3 := res.bench(benchLoopFull)
	if res.goBenchErr != nil || !ok1 || !ok2 || !ok3 {
		p("| per-event relay cost, allocations per event | go benchmarks failed (see below) | — | < 5 µs, 0 | not measured |\n")
		return
	}
	ns := large["ns/event"]
	v := "**missed**"
	if ns < limitEventNs {
		v = "**met**"
	}
	p("| per-event relay cost (go bench, handler path, %d events) | %.0f ns/event (relay loop alone: %.0f ns) | — | < 5 µs | %s |\n", eventsLarge-4, ns, loop["ns/op"], v)
	marginal := (large["allocs/op"] - small["allocs/op"]) / float64(eventsLarge-eventsSmall)
	v = "**missed**"
	if loop["allocs/op"] == 0 && marginal < 0.01 {
		v = "**met**"
	}
	p("| allocations per relayed event (go bench) | %.3f marginal per event (%.0f allocs/op at %d events, %.0f at %d); relay loop alone %.0f allocs/event | — | none beyond the event | %s |\n",
		marginal, small["allocs/op"], eventsSmall-4, large["allocs/op"], eventsLarge-4, loop["allocs/op"], v)
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
	p(" RelayLoop: one event per iteration of Reader.Next, Tap.Observe, Write and Flush.\n\n")
}
