package main

import (
	"strings"
	"testing"
	"time"
)

// fakeResults is a run of the given targets with figures chosen so that every ratio is known:
// at every rate direct takes 1 ms, Sluice adds 0.3 ms, nginx 0.1 ms and haproxy 0.2 ms (the same
// at p50 and p99); CPU per request is 300, 100 and 200 µs (per stream 3,000, 1,000 and 2,000 µs);
// wrk throughput 30,000, 9,000, 21,000 and 15,000 req/s; streams add 3, 1 and 2 ms to TTFT.
func fakeResults(names ...string) *results {
	o := options{
		duration: 2 * time.Second, rounds: 1, streamRounds: 1, streams: 10, streamTokens: 4,
		rates: []int{500, 2000}, wrkThreads: 2, wrkConns: 64, goBench: true, targets: names, settle: 10 * time.Second,
	}
	addedMs := map[string]float64{"direct": 0, "sluice": .3, "nginx": .1, "haproxy": .2}
	cpuTicks := map[string]uint64{"sluice": 30, "nginx": 10, "haproxy": 20} // per 1,000 requests
	sysTicks := map[string]uint64{"sluice": 10, "nginx": 8, "haproxy": 10}  // of which in the kernel
	rps := map[string]float64{"direct": 30000, "sluice": 9000, "nginx": 21000, "haproxy": 15000}
	res := &results{
		opts: o, began: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), elapsed: time.Minute,
		env: envInfo{cpus: 2, cpuModel: "test CPU", kernel: "6.1", goVersion: "go1.26", nginx: "nginx version: nginx/1.22.1",
			haproxy: "HAProxy version 2.6.12", wrk: "wrk 4.1.0", nginxWorkers: 2, haproxyNbthread: 2, haproxyThreads: 2},
		fixed: map[int]map[string]*rateResult{}, wrk: map[string][]wrkRound{},
		streams: map[string][]streamRound{}, rss: map[string]rssInfo{"sim": {sum: 10 << 20}},
		goBench: []goBench{
			{name: benchRelaySmall, metrics: map[string]float64{"ns/event": 2000, "allocs/op": 56}},
			{name: benchRelayLarge, metrics: map[string]float64{"ns/event": 600, "allocs/op": 56}},
			{name: benchLoopFull, metrics: map[string]float64{"ns/op": 330, "allocs/op": 0}},
		},
		goBenchCmd: "go test -bench . ./proxy/",
	}
	for _, n := range names {
		t := &target{name: n}
		if n != "direct" {
			t.proxy = &proxyProc{}
		}
		res.targets = append(res.targets, t)
	}
	for _, rate := range o.rates {
		res.fixed[rate] = map[string]*rateResult{}
		for _, n := range names {
			lat := time.Duration((1 + addedMs[n]) * float64(time.Millisecond))
			rr := rateRound{requests: 1000, ok: 1000, rate: float64(rate), p50: lat, p99: lat, cpuTicks: cpuTicks[n], sysTicks: sysTicks[n]}
			lats := make([]time.Duration, 1000)
			for i := range lats {
				lats[i] = lat
			}
			r := &rateResult{}
			r.add(rr, lats)
			res.fixed[rate][n] = r
		}
	}
	for _, n := range names {
		reqs := int(rps[n]) * 2
		res.wrk[n] = []wrkRound{{requests: reqs, seconds: 2, rps: rps[n], p50: time.Millisecond, p99: 2 * time.Millisecond, cpuTicks: cpuTicks[n] * uint64(reqs) / 1000}}
		ttft := time.Duration((5 + 10*addedMs[n]) * float64(time.Millisecond))
		sr := streamRound{cpuTicks: cpuTicks[n] / 10, sysTicks: sysTicks[n] / 10, wall: 20 * time.Millisecond} // 10 streams: 3,000, 1,000, 2,000 µs each
		for range o.streams {
			sr.ttft = append(sr.ttft, ttft)
			sr.e2e = append(sr.e2e, ttft+time.Millisecond)
		}
		res.streams[n] = []streamRound{sr}
		if n != "direct" {
			res.rss[n] = rssInfo{sum: 20 << 20, each: []int64{8 << 20, 12 << 20}}
		}
	}
	res.rest = map[string]restInfo{"sluice": {rss: 30 << 20, goroutines: 17}, "nginx": {rss: 20 << 20, goroutines: -1}, "haproxy": {rss: 18 << 20, goroutines: -1}}
	res.after = map[string]restInfo{"sluice": {rss: 36 << 20, goroutines: 19}, "nginx": {rss: 21 << 20, goroutines: -1}, "haproxy": {rss: 18 << 20, goroutines: -1}}
	for _, phase := range []string{"rate500", "rate2000", "wrk", "streams"} {
		res.orders = append(res.orders, roundOrder{phase: phase, round: 0, order: names})
	}
	return res
}

func TestMarkdown(t *testing.T) {
	for _, tc := range []struct {
		name        string
		targets     []string
		tweak       func(*results)
		want, avoid []string
	}{
		{
			name:    "all four",
			targets: []string{"direct", "sluice", "nginx", "haproxy"},
			want: []string{
				"# Sluice overhead: direct vs Sluice vs nginx vs haproxy\n",
				"HAProxy version 2.6.12 (nbthread 2: 2 threads)",
				"- haproxy: generated config, `mode http`",
				"| target | Sluice | nginx (this run) | haproxy (this run) | limit | verdict |",
				"| added p50 at 2,000 req/s | +0.300 ms | +0.100 ms | +0.200 ms | ≤ 1.5 × nginx = +0.150 ms | **missed** (3.00x nginx); 1.50x haproxy |",
				"| CPU per request at 2,000 req/s | 300.0 µs | 100.0 µs | 200.0 µs | ≤ 1.5 × nginx = 150.0 µs | **missed** (3.00x nginx); 1.50x haproxy |",
				"| TTFT p50 added, 10 streams × 4 tokens | +3.000 ms | +1.000 ms | +2.000 ms | ≤ nginx | **missed** (3.00x nginx); 1.50x haproxy |",
				"| haproxy | 1,000 | 1.0000 | 2000.0 | 1.200 ms | 1.200 ms | +0.200 ms | +0.200 ms | 200.0 µs |",
				"Ratios: added p50 Sluice ÷ nginx 3.00x, Sluice ÷ haproxy 1.50x, haproxy ÷ nginx 2.00x; added p99 Sluice ÷ nginx 3.00x",
				"CPU/request Sluice ÷ nginx 3.00x, Sluice ÷ haproxy 1.50x, haproxy ÷ nginx 2.00x.",
				"| haproxy | 15000 | 0.50x |",
				"Throughput ratios: Sluice ÷ nginx 0.43x, Sluice ÷ haproxy 0.60x, haproxy ÷ nginx 0.71x.",
				"Ratios: added TTFT p50 Sluice ÷ nginx 3.00x, Sluice ÷ haproxy 1.50x, haproxy ÷ nginx 2.00x",
				"| haproxy | 200.0 µs | 200.0 µs | 200.0 µs | 2000.0 µs | 20.0 MiB |",
				"| Sluice ÷ haproxy | 1.50x | 1.50x | 1.50x | 1.50x | 1.00x |",
				"| haproxy ÷ nginx | 2.00x | 2.00x | 2.00x | 2.00x | 1.00x |",
				"haproxy: one process of 2 threads (nbthread 2).",
				"| RSS 10s after the load ÷ at rest before it | 1.20x | 1.05x | 1.00x | ≤ 1.10x (its baseline) | **missed**; 1.20x haproxy |",
				"| sluice | 30.0 MiB | 20.0 MiB | 36.0 MiB | 1.20x | 17 → 19 |",
				"| nginx | 20.0 MiB | 20.0 MiB | 21.0 MiB | 1.05x | — |",
				"| phase | round | order | direct | sluice | nginx | haproxy | other load (worst turn) |",
				"| wrk | 1 | direct → sluice → nginx → haproxy | 30000 req/s | 9000 req/s | 21000 req/s | 15000 req/s | 0.00 CPUs |",
				"haproxy, configured as a plain streaming proxy too, is a second one beside it.",
				"In the kernel (stime), of the CPU above, user space being the rest: sluice 100.0 µs of 300.0 µs (33%) @ 500, 100.0 µs of 300.0 µs (33%) @ 2,000, 1000.0 µs of 3000.0 µs (33%) a stream; nginx 80.0 µs of 100.0 µs (80%) @ 500, 80.0 µs of 100.0 µs (80%) @ 2,000, 0.0 µs of 1000.0 µs (0%) a stream; haproxy 100.0 µs of 200.0 µs (50%) @ 500, 100.0 µs of 200.0 µs (50%) @ 2,000, 1000.0 µs of 2000.0 µs (50%) a stream.\n\nnginx per process",
			},
			avoid: []string{"Left out of this run"},
		},
		{
			name:    "haproxy left out",
			targets: []string{"direct", "sluice", "nginx"},
			want: []string{
				"# Sluice overhead: direct vs Sluice vs nginx\n",
				"| target | Sluice | nginx (this run) | limit | verdict |",
				"| added p50 at 2,000 req/s | +0.300 ms | +0.100 ms | ≤ 1.5 × nginx = +0.150 ms | **missed** (3.00x nginx) |",
				"Ratios: added p50 Sluice ÷ nginx 3.00x; added p99 Sluice ÷ nginx 3.00x; CPU/request Sluice ÷ nginx 3.00x.",
				"| Sluice ÷ nginx | 3.00x | 3.00x | 3.00x | 3.00x | 1.00x |",
				"Left out of this run (`--targets direct,sluice,nginx`): haproxy.",
			},
			avoid: []string{"haproxy (this run)", "÷ haproxy", "haproxy ÷", "HAProxy version", "| haproxy |", "nbthread"},
		},
		{
			name:    "nginx left out",
			targets: []string{"direct", "sluice", "haproxy"},
			want: []string{
				"| target | Sluice | haproxy (this run) | limit | verdict |",
				"| added p50 at 2,000 req/s | +0.300 ms | +0.200 ms | ≤ 1.5 × nginx | no yardstick: nginx not in --targets; 1.50x haproxy |",
				"| Sluice ÷ haproxy | 1.50x |",
				"Left out of this run (`--targets direct,sluice,haproxy`): nginx.",
			},
			avoid: []string{"nginx (this run)", "÷ nginx", "worker_processes", "nginx per process"},
		},
		{
			name:    "a yardstick adds nothing",
			targets: []string{"direct", "sluice", "nginx", "haproxy"},
			tweak: func(res *results) { // nginx and haproxy as fast as direct at 2,000 req/s
				for _, n := range []string{"nginx", "haproxy"} {
					r := res.fixed[2000][n]
					for i := range r.latencies {
						r.latencies[i] = time.Millisecond
					}
				}
			},
			want: []string{
				"| added p50 at 2,000 req/s | +0.300 ms | +0.000 ms | +0.000 ms | ≤ 1.5 × nginx = +0.000 ms | indeterminate: nginx added ≤ 0 in this run (noise); compare the absolute figures; haproxy's ≤ 0 |",
				"Ratios: added p50 Sluice ÷ nginx n/a (nginx's ≤ 0), Sluice ÷ haproxy n/a (haproxy's ≤ 0), haproxy ÷ nginx n/a (nginx's ≤ 0);",
				// the other rate keeps its ratios
				"Ratios: added p50 Sluice ÷ nginx 3.00x, Sluice ÷ haproxy 1.50x, haproxy ÷ nginx 2.00x;",
			},
		},
		{
			name:    "sluice left out",
			targets: []string{"direct", "nginx", "haproxy"},
			want: []string{
				"# Sluice overhead: direct vs nginx vs haproxy\n",
				"Sluice was left out of this run (`--targets direct,nginx,haproxy`): no target judged.",
				"Ratios: added p50 haproxy ÷ nginx 2.00x;",
				"| haproxy ÷ nginx | 2.00x |",
			},
			avoid: []string{"Sluice ÷", "| sluice |", "- Sluice: `sluice serve"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := fakeResults(tc.targets...)
			if tc.tweak != nil {
				tc.tweak(res)
			}
			md := res.markdown()
			for _, w := range tc.want {
				if !strings.Contains(md, w) {
					t.Errorf("report lacks %q", w)
				}
			}
			for _, a := range tc.avoid {
				if strings.Contains(md, a) {
					t.Errorf("report has %q", a)
				}
			}
			checkTables(t, md)
			if t.Failed() {
				t.Logf("report:\n%s", md)
			}
		})
	}
}

// checkTables fails when a row of a markdown table has another number of cells than its
// header.
func checkTables(t *testing.T, md string) {
	t.Helper()
	header := -1
	for i, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			header = -1
			continue
		}
		n := strings.Count(line, "|")
		if header < 0 {
			header = n
			continue
		}
		if n != header {
			t.Errorf("line %d has %d cell separators, its table's header %d: %q", i+1, n, header, line)
		}
	}
}
