// Command mirroring is Sluice's mirroring benchmark (issue 7: "mirroring on vs off: primary
// p99 latency within 5%"). One primary simulator and three sandbox simulators (a candidate
// and a baseline as fast as the primary, and a candidate 20× slower to decode) sit behind
// gateways built from config: mirroring off, mirroring on to the fast sandbox (every request
// copied, enough workers that the sandbox keeps up), mirroring on with a baseline (every
// request copied to the fast candidate and to the baseline at the same moment: two sandbox
// copies a request), mirroring on to the slow sandbox (a smaller queue, which fills: copies
// are dropped), and "off" again as an A/A control. An open-loop streaming load drives the
// primary route of each in interleaved rounds (the order rotates every round) so that machine
// noise hits every configuration alike; the primary's TTFT and E2E percentiles are pooled
// over the rounds and compared, and the mirror counters are read from each gateway's admin
// API. It prints a markdown report with a verdict. Everything runs in this process on
// 127.0.0.1. See README.md in this directory.
//
//	go run ./test/bench/mirroring [--duration 5s] [--rounds 5] [--rate 20] [--baseline=false] [--cpuprofile cpu.out]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/load"
	"github.com/sluicegw/sluice/test/sim"
)

type options struct {
	duration     time.Duration // measured window of one configuration in one round
	warmup       time.Duration // unmeasured load on each fresh gateway before its window
	rounds       int
	rate         float64
	arrival      string
	in           int
	out          string // output-token distribution (load.ParseDist)
	seed         uint64
	ttft, itl    time.Duration // the primary's, the fast sandbox's and the baseline's simulator
	slowITL      time.Duration // the slow sandbox's ITL
	maxConc      int           // mirror max_concurrency (sandboxes that keep up; 0: the gateway's default)
	maxQueue     int           // mirror max_queue (sandboxes that keep up; 0: the gateway's default)
	slowMaxConc  int           // mirror max_concurrency with the slow sandbox (0: the default)
	slowMaxQueue int           // mirror max_queue with the slow sandbox (0: the default)
	target       float64       // the on/off p99 ratio to meet
	control      bool          // run "off" twice per round (A/A)
	baseline     bool          // run "on, with baseline"
	cpuProfile   string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mirroring:", err)
		os.Exit(1)
	}
}

func parseFlags() (options, error) {
	var o options
	fs := flag.NewFlagSet("mirroring", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured load window of each configuration in each round")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured load on each fresh gateway before its window (opens connections, fills the slow mirror's queue)")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds; each runs every configuration once, in an order rotated every round")
	fs.Float64Var(&o.rate, "rate", 20, "offered primary rate, req/s (open loop)")
	fs.StringVar(&o.arrival, "arrival", "poisson", "arrivals: poisson or constant")
	fs.IntVar(&o.in, "in", 64, "prompt tokens per request")
	fs.StringVar(&o.out, "out", "uniform:32:64", "output tokens per request (ignore_eos): fixed:N, uniform:LO:HI, ...")
	fs.Uint64Var(&o.seed, "seed", 42, "arrival and workload seed (round r uses seed+r for every configuration)")
	fs.DurationVar(&o.ttft, "ttft", 20*time.Millisecond, "simulator TTFT (prefill time per admitted request; the engine's steps are serial, so rate × ttft is its prefill share)")
	fs.DurationVar(&o.itl, "itl", 5*time.Millisecond, "simulator ITL (decode step)")
	fs.DurationVar(&o.slowITL, "slow-itl", 100*time.Millisecond, "ITL of the slow sandbox")
	fs.IntVar(&o.maxConc, "max-concurrency", 32, "mirror max_concurrency with the sandboxes that keep up (\"on\" and \"on, with baseline\"; 0: the gateway's default)")
	fs.IntVar(&o.maxQueue, "max-queue", 64, "mirror max_queue with the sandboxes that keep up (0: the gateway's default)")
	fs.IntVar(&o.slowMaxConc, "slow-max-concurrency", 8, "mirror max_concurrency with the slow sandbox (0: the gateway's default)")
	fs.IntVar(&o.slowMaxQueue, "slow-max-queue", 16, "mirror max_queue with the slow sandbox (0: the gateway's default)")
	fs.BoolVar(&o.control, "control", true, "also run \"off\" a second time in every round, as an A/A control: the noise floor of the ratios")
	fs.BoolVar(&o.baseline, "baseline", true, "also run \"on, with baseline\": every request mirrored to the fast candidate and to a baseline sandbox (configured like the primary) at once")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (labelled by part: go tool pprof -tags)")
	fs.Float64Var(&o.target, "target", 1.05, "the on/off ratio of primary p99 to meet")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return o, err
	}
	if o.duration <= 0 || o.warmup < 0 || o.rounds < 1 || o.rate <= 0 || o.ttft < 0 || o.itl < 0 || o.slowITL <= 0 ||
		o.maxConc < 0 || o.maxQueue < 0 || o.slowMaxConc < 0 || o.slowMaxQueue < 0 {
		return o, errors.New("--duration, --rate, --rounds and --slow-itl must be positive; --warmup, --ttft, --itl, the max concurrencies and the max queues not negative (0: the gateway's default)")
	}
	if o.arrival != load.ArrivalPoisson && o.arrival != load.ArrivalConstant {
		return o, fmt.Errorf("--arrival %q: want poisson or constant", o.arrival)
	}
	return o, nil
}

// conf is one gateway configuration.
type conf struct {
	name     string
	sandbox  string // the sandbox cluster's URL
	mirror   string // the route's mirror block, "" for none
	baseline bool   // the mirror has a baseline: two sandbox copies a request
	slow     bool   // the sandbox cannot keep up: copies are not waited for
	control  bool   // "off" a second time: the noise floor
}

// counters are a gateway's mirror counters for route "chat": the sluice_shadow_* metrics
// and the per-side counts of the shadow report (/admin/shadow.json, "mirror").
type counters struct {
	offered, dropped, pairs, incomplete float64
	failed, baseFailed                  float64 // the candidate's and the baseline's failed copies
	candSent, baseSent                  float64 // copies sent and ended (answered or failed), per side
	candCompared, baseCompared          float64 // copies compared, per side
	queued                              float64 // a gauge: at the reading
}

func (c counters) sub(o counters) counters {
	return counters{c.offered - o.offered, c.dropped - o.dropped, c.pairs - o.pairs, c.incomplete - o.incomplete,
		c.failed - o.failed, c.baseFailed - o.baseFailed, c.candSent - o.candSent, c.baseSent - o.baseSent,
		c.candCompared - o.candCompared, c.baseCompared - o.baseCompared, c.queued}
}

func (c *counters) add(o counters) {
	c.offered += o.offered
	c.dropped += o.dropped
	c.pairs += o.pairs
	c.incomplete += o.incomplete
	c.failed += o.failed
	c.baseFailed += o.baseFailed
	c.candSent += o.candSent
	c.baseSent += o.baseSent
	c.candCompared += o.candCompared
	c.baseCompared += o.baseCompared
}

// pending are the copies accepted and not yet ended: queued or in flight, or done and
// waiting for their primary's answer or for a comparer.
func (c counters) pending() float64 { return c.offered - c.dropped - c.pairs - c.incomplete }

// turn is one configuration's measured window in one round.
type turn struct {
	round, pos int
	rep        *load.Report
	mirror     counters // during the window (queued: at its end)
	pending    float64  // copies accepted and not yet ended when the counters were read
	cpuMS      float64  // this process's CPU per request in the window (everything in-process)
	otherCPUs  float64  // CPUs busy with other processes during the window (mean)
	warnings   []string // counters that do not add up
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	// Every part runs under a profiler label ("part"), inherited by the goroutines it starts
	// (the simulator's engine, the servers' connections, the gateway's handlers and mirror
	// workers): `go tool pprof -tags` splits --cpuprofile's CPU time by part.
	serve := func(c sim.Config, part string) (s *sim.Server, ts *httptest.Server, err error) {
		pprof.Do(ctx, pprof.Labels("part", part), func(context.Context) {
			s = sim.New(c)
			var ln net.Listener
			if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				s.Close()
				return
			}
			ts = &httptest.Server{Listener: ln, Config: &http.Server{Handler: s}}
			ts.Start()
		})
		return s, ts, err
	}
	// The baseline runs the primary's version: its simulator is configured like the primary's
	// (and like the fast candidate's), on its own engine, so the candidate's copies and the
	// baseline's do not share one engine's steps.
	primaryCfg := sim.Config{TTFT: o.ttft, ITL: o.itl, Seed: 1}
	slowCfg := primaryCfg
	slowCfg.ITL = o.slowITL
	var urls [4]string // primary, sandbox, slow sandbox, baseline
	for i, c := range []sim.Config{primaryCfg, primaryCfg, slowCfg, primaryCfg} {
		s, ts, err := serve(c, []string{"sim primary", "sim sandbox", "sim slow sandbox", "sim baseline"}[i])
		if err != nil {
			return err
		}
		defer s.Close()
		defer ts.Close()
		urls[i] = ts.URL
	}
	// "off" must stay first: every ratio is to it.
	confs := []conf{
		{name: "off", sandbox: urls[1]},
		{name: "on", sandbox: urls[1], mirror: mirrorBlock(o.maxConc, o.maxQueue, false)},
	}
	if o.baseline {
		confs = append(confs, conf{name: "on, with baseline", sandbox: urls[1], mirror: mirrorBlock(o.maxConc, o.maxQueue, true), baseline: true})
	}
	confs = append(confs, conf{name: "on, slow sandbox", sandbox: urls[2], mirror: mirrorBlock(o.slowMaxConc, o.slowMaxQueue, false), slow: true})
	if o.control {
		confs = append(confs, conf{name: "off again (A/A)", sandbox: urls[1], control: true})
	}

	wl := &load.Workload{Name: "synthetic"}
	if wl.Synthetic, err = load.ParseSynthetic(fmt.Sprintf("in=fixed:%d,out=%s", o.in, o.out)); err != nil {
		return err
	}
	est := time.Duration(len(confs)*o.rounds) * (o.duration + o.warmup + time.Second/2)
	fmt.Fprintf(os.Stderr, "%d rounds × %d configurations × (%v warm-up + %v measured) at %.0f req/s; about %v\n",
		o.rounds, len(confs), o.warmup, o.duration, o.rate, est.Round(10*time.Second))

	turns := make([][]turn, len(confs))
	start := time.Now()
	for r := range o.rounds {
		for k := range confs {
			i := (k + r) % len(confs) // rotate the order every round
			if ctx.Err() != nil {
				return ctx.Err()
			}
			t, err := runTurn(ctx, o, urls[0], urls[3], confs[i], wl, r)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, confs[i].name, err)
			}
			t.round, t.pos = r+1, k+1
			turns[i] = append(turns[i], t)
			s := t.rep.Summary
			fmt.Fprintf(os.Stderr, "round %d/%d %-17s ok %d/%d, TTFT p99 %.1f ms, E2E p99 %.1f ms, mirror offered %.0f dropped %.0f compared %.0f (copies ended %.0f+%.0f), other CPUs %.2f\n",
				r+1, o.rounds, confs[i].name, t.rep.OK, t.rep.Requests, s.Latency[load.HTTFT].P99, s.Latency[load.HE2E].P99,
				t.mirror.offered, t.mirror.dropped, t.mirror.pairs, t.mirror.candSent, t.mirror.baseSent, t.otherCPUs)
			for _, w := range t.warnings {
				fmt.Fprintf(os.Stderr, "round %d/%d %-17s warning: %s\n", r+1, o.rounds, confs[i].name, w)
			}
		}
	}
	return report(os.Stdout, o, confs, turns, time.Since(start))
}

// gatewayYAML is the gateway's config: every cluster in every configuration, the mirror
// block only where it mirrors.
func gatewayYAML(primary, baseline string, c conf) string {
	var b strings.Builder
	fmt.Fprintf(&b, `listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0}
clusters:
  - {name: primary, endpoints: [{url: %q}], health_check: {disabled: true}}
  - {name: sandbox, endpoints: [{url: %q}], health_check: {disabled: true}}
  - {name: baseline, endpoints: [{url: %q}], health_check: {disabled: true}}
routes:
  - name: chat
    cluster: primary
`, primary, c.sandbox, baseline)
	if c.mirror != "" {
		fmt.Fprintf(&b, "    mirror: %s\n", c.mirror)
	}
	return b.String()
}

// mirrorBlock is a route's mirror to the sandbox (and the baseline); a bound of 0 is left
// out: the gateway's default.
func mirrorBlock(conc, queue int, baseline bool) string {
	s := "{cluster: sandbox"
	if baseline {
		s += ", baseline: baseline"
	}
	s += ", fraction: 1"
	if conc > 0 {
		s += fmt.Sprintf(", max_concurrency: %d", conc)
	}
	if queue > 0 {
		s += fmt.Sprintf(", max_queue: %d", queue)
	}
	return s + "}"
}

// runTurn builds a fresh gateway, warms it up, measures one window and shuts it down (which
// cancels copies still queued or in flight, so nothing of one turn runs into the next).
func runTurn(ctx context.Context, o options, primary, baseline string, c conf, wl *load.Workload, round int) (turn, error) {
	y := gatewayYAML(primary, baseline, c)
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		return turn{}, fmt.Errorf("config: %w\n%s", err, y)
	}
	var srv *proxy.Server
	pprof.Do(ctx, pprof.Labels("part", "gateway "+strings.ReplaceAll(c.name, ",", "")), func(context.Context) {
		if srv, err = proxy.New(proxy.Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "mirroring-bench"}); err != nil {
			err = fmt.Errorf("proxy.New: %w", err)
			return
		}
		if err = srv.Start(); err != nil {
			err = fmt.Errorf("start the gateway: %w", err)
		}
	})
	if err != nil {
		return turn{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	tr := &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true, IdleConnTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	lc := load.Config{Target: "http://" + srv.Addr(), Model: sim.DefaultModel, Workload: wl,
		Rate: o.rate, Arrival: o.arrival, Timeout: time.Minute, Client: hc}
	if o.warmup > 0 {
		w := lc
		w.Duration, w.Seed = o.warmup, o.seed+1000+uint64(round)
		if _, err := runLoad(ctx, w); err != nil {
			return turn{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	admin := "http://" + srv.AdminAddr()
	// Copies end shortly after their primaries when the sandbox keeps up: wait (bounded) until
	// every accepted copy has ended, so that each window's counters are its own. The slow
	// sandbox's copies are not waited for (that is the point of the bounded queue). The wait
	// polls /metrics; the shadow report, heavier, is read once it is over (outside the CPU
	// measurement for the window's end), and its counters are the ones reported: one
	// snapshot, consistent even while the slow sandbox's copies still end.
	var warnings []string
	settled := func() (bool, error) {
		deadline := time.Now().Add(3 * time.Second)
		for {
			n, err := readMetrics(ctx, hc, admin+"/metrics")
			if err != nil || c.mirror == "" {
				return true, err
			}
			done := n.queued == 0 && n.pending() == 0
			if done || c.slow || time.Now().After(deadline) {
				return done, nil
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	snapshot := func(settledNow bool) (counters, error) {
		if c.mirror == "" {
			return counters{}, nil
		}
		n, err := readReport(ctx, hc, admin+"/admin/shadow.json")
		if err != nil || !settledNow {
			return n, err
		}
		// Settled: nothing moves, so the metrics must say what the report says.
		m, err := readMetrics(ctx, hc, admin+"/metrics")
		if err != nil {
			return n, err
		}
		m.candSent, m.baseSent, m.candCompared, m.baseCompared, m.queued = n.candSent, n.baseSent, n.candCompared, n.baseCompared, n.queued
		if m != n {
			warnings = append(warnings, fmt.Sprintf("/metrics %+v, /admin/shadow.json %+v", m, n))
		}
		return n, nil
	}
	s0, err := settled()
	if err != nil {
		return turn{}, err
	}
	c0, err := snapshot(s0)
	if err != nil {
		return turn{}, err
	}
	cpu0, busy0 := cpuSelf(), busyCPU()
	t0 := time.Now()
	m := lc
	m.Duration, m.Seed = o.duration, o.seed+uint64(round)
	rep, err := runLoad(ctx, m)
	if err != nil {
		return turn{}, err
	}
	rep.Summarize()
	s1, err := settled()
	if err != nil {
		return turn{}, err
	}
	wall := time.Since(t0)
	cpu := cpuSelf() - cpu0
	busy1 := busyCPU()
	c1, err := snapshot(s1)
	if err != nil {
		return turn{}, err
	}
	t := turn{rep: rep, mirror: c1.sub(c0)}
	t.pending = c1.pending()
	if c.mirror != "" {
		// Every copy sent is compared when the sandboxes keep up, on each side; with a
		// baseline both sides are sent every copy.
		m := t.mirror
		if c.baseline && m.baseSent != m.candSent {
			warnings = append(warnings, fmt.Sprintf("copies sent: candidate %.0f, baseline %.0f", m.candSent, m.baseSent))
		}
		if m.candCompared != m.pairs || c.baseline && m.baseCompared != m.pairs {
			warnings = append(warnings, fmt.Sprintf("compared: %.0f, candidate side %.0f, baseline side %.0f", m.pairs, m.candCompared, m.baseCompared))
		}
	}
	t.warnings = warnings
	if rep.Requests > 0 {
		t.cpuMS = cpu.Seconds() * 1000 / float64(rep.Requests)
	}
	if busy0 >= 0 && busy1 >= 0 {
		t.otherCPUs = math.Max(0, (busy1-busy0-cpu).Seconds()/wall.Seconds())
	}
	return t, nil
}

// runLoad is load.Run under the profiler label of the load generator.
func runLoad(ctx context.Context, c load.Config) (rep *load.Report, err error) {
	pprof.Do(ctx, pprof.Labels("part", "load"), func(ctx context.Context) { rep, err = load.Run(ctx, c) })
	return rep, err
}

// get GETs an admin URL; the caller closes the body.
func get(ctx context.Context, hc *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp, nil
}

// readReport reads the route's mirror counters from the gateway's shadow report: the same
// counters as the metrics, and each side's copies sent and compared, in one snapshot (the
// queue's length, a gauge, is not in the report: queued is 0).
func readReport(ctx context.Context, hc *http.Client, url string) (counters, error) {
	resp, err := get(ctx, hc, url)
	if err != nil {
		return counters{}, err
	}
	defer resp.Body.Close()
	var rep struct {
		Routes []struct {
			Route  string `json:"route"`
			Mirror struct {
				Offered, Dropped, Compared, Incomplete int64
				Sides                                  []struct {
					Side                   string
					Sent, Failed, Compared int64
				}
			} `json:"mirror"`
		} `json:"routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return counters{}, fmt.Errorf("%s: %w", url, err)
	}
	for _, r := range rep.Routes {
		if r.Route != "chat" {
			continue
		}
		m := r.Mirror
		c := counters{offered: float64(m.Offered), dropped: float64(m.Dropped), pairs: float64(m.Compared), incomplete: float64(m.Incomplete)}
		for _, s := range m.Sides {
			switch s.Side {
			case "candidate":
				c.failed, c.candSent, c.candCompared = float64(s.Failed), float64(s.Sent), float64(s.Compared)
			case "baseline":
				c.baseFailed, c.baseSent, c.baseCompared = float64(s.Failed), float64(s.Sent), float64(s.Compared)
			}
		}
		return c, nil
	}
	return counters{}, fmt.Errorf("%s: no route \"chat\"", url)
}

// readMetrics reads the route's mirror counters from the gateway's Prometheus endpoint.
func readMetrics(ctx context.Context, hc *http.Client, url string) (counters, error) {
	resp, err := get(ctx, hc, url)
	if err != nil {
		return counters{}, err
	}
	defer resp.Body.Close()
	var c counters
	dst := map[string]*float64{
		"sluice_shadow_offered_total":            &c.offered,
		"sluice_shadow_dropped_total":            &c.dropped,
		"sluice_shadow_pairs_total":              &c.pairs,
		"sluice_shadow_candidate_failures_total": &c.failed,
		"sluice_shadow_baseline_failures_total":  &c.baseFailed,
		"sluice_shadow_incomplete_total":         &c.incomplete,
		"sluice_shadow_queued":                   &c.queued,
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		p := dst[name]
		if p == nil || !strings.Contains(line, `route="chat"`) {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return counters{}, fmt.Errorf("/metrics line %q: %w", line, err)
		}
		*p += v
	}
	return c, sc.Err()
}

// cpuSelf is this process's user+system CPU time so far.
func cpuSelf() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// busyCPU is the machine's non-idle CPU time so far, from /proc/stat (user, nice, system,
// steal; interrupts left out), or -1 where it cannot be read.
func busyCPU() time.Duration {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return -1
	}
	fs := strings.Fields(sc.Text())
	if len(fs) < 9 || fs[0] != "cpu" {
		return -1
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 8} {
		v, err := strconv.ParseInt(fs[i], 10, 64)
		if err != nil {
			return -1
		}
		ticks += v
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// stats are the pooled figures of one configuration.
type stats struct {
	rep                             *load.Report
	sent, ok                        int64
	ttft50, ttft99, e2e50, e2e99    float64
	ttftMean, e2eMean               float64
	lag99                           float64
	mirror                          counters
	pending, cpuMS, other, otherMax float64
}

func pool(ts []turn) (stats, error) {
	var s stats
	var reps []*load.Report
	for _, t := range ts {
		reps = append(reps, t.rep)
		s.mirror.add(t.mirror)
		s.pending += t.pending
		s.cpuMS += t.cpuMS / float64(len(ts))
		s.other += t.otherCPUs / float64(len(ts))
		s.otherMax = math.Max(s.otherMax, t.otherCPUs)
	}
	rep, err := load.Merge(reps...)
	if err != nil {
		return s, err
	}
	s.rep, s.sent, s.ok = rep, rep.Requests, rep.OK
	l := rep.Summary.Latency
	s.ttft50, s.ttft99 = l[load.HTTFT].P50, l[load.HTTFT].P99
	s.e2e50, s.e2e99 = l[load.HE2E].P50, l[load.HE2E].P99
	s.ttftMean, s.e2eMean = l[load.HTTFT].Mean, l[load.HE2E].Mean
	s.lag99 = l[load.HLag].P99
	return s, nil
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

func report(w io.Writer, o options, confs []conf, turns [][]turn, took time.Duration) error {
	ss := make([]stats, len(confs))
	for i := range confs {
		var err error
		if ss[i], err = pool(turns[i]); err != nil {
			return err
		}
	}
	off := ss[0]

	fmt.Fprintf(w, "## Mirroring on vs off: the primary's latency\n\n")
	fmt.Fprintf(w, "Simulators (test/sim): primary, fast sandbox and baseline TTFT %v, ITL %v (each its own engine); slow sandbox TTFT %v, ITL %v. Requests: streaming chat, %d prompt tokens, output %s tokens (ignore_eos).\n",
		o.ttft, o.itl, o.ttft, o.slowITL, o.in, o.out)
	fmt.Fprintf(w, "Load (test/load): %s arrivals at %.0f req/s, %d rounds × %v measured per configuration (each after %v warm-up on a fresh gateway), order rotated every round; round r uses seed %d+r for every configuration. Run took %v.\n",
		o.arrival, o.rate, o.rounds, o.duration, o.warmup, o.seed, took.Round(time.Second))
	for _, c := range confs {
		if c.mirror != "" {
			fmt.Fprintf(w, "Mirror of \"%s\": `%s`.\n", c.name, c.mirror)
		}
	}
	fmt.Fprintf(w, "Everything in one process (load generator, gateways, simulators) on %d CPUs.\n\n", runtime.NumCPU())

	fmt.Fprintln(w, "| config | sent | ok | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | E2E p99 ms | TTFT p99 ÷ off | E2E p99 ÷ off | mirror offered | dropped | copies ended cand. / base. | compared cand. / base. | incomplete | failures cand. / base. | pending at end | CPU ms/req | other CPUs (mean / max) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i, c := range confs {
		s := ss[i]
		rt, re := "—", "—"
		mo, md, msent, mcomp, minc, mf, mpend := "—", "—", "—", "—", "—", "—", "—"
		if i > 0 {
			rt, re = fmt.Sprintf("%.3f", ratio(s.ttft99, off.ttft99)), fmt.Sprintf("%.3f", ratio(s.e2e99, off.e2e99))
		}
		if c.mirror != "" {
			m := s.mirror
			sides := func(cand, base float64) string {
				if c.baseline {
					return f0(cand) + " / " + f0(base)
				}
				return f0(cand) + " / —"
			}
			mo, md, minc, mpend = f0(m.offered), f0(m.dropped), f0(m.incomplete), f0(s.pending)
			msent, mcomp, mf = sides(m.candSent, m.baseSent), sides(m.candCompared, m.baseCompared), sides(m.failed, m.baseFailed)
		}
		fmt.Fprintf(w, "| %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f / %.2f |\n",
			c.name, s.sent, s.ok, s.ttft50, s.ttft99, s.e2e50, s.e2e99, rt, re, mo, md, msent, mcomp, minc, mf, mpend, s.cpuMS, s.other, s.otherMax)
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "Per round (TTFT p99 / E2E p99, ms; the position in the round's order in brackets):")
	fmt.Fprintln(w)
	fmt.Fprint(w, "| round |")
	for _, c := range confs {
		fmt.Fprintf(w, " %s |", c.name)
	}
	fmt.Fprint(w, "\n|---|")
	for range confs {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for r := range o.rounds {
		fmt.Fprintf(w, "| %d |", r+1)
		for i := range confs {
			t := turns[i][r]
			l := t.rep.Summary.Latency
			fmt.Fprintf(w, " %.1f / %.1f (%d) |", l[load.HTTFT].P99, l[load.HE2E].P99, t.pos)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)

	// The rounds' own ratios: every configuration of a round gets the same arrivals and
	// token counts, so a round's on ÷ off is a paired comparison; their spread is the noise
	// of this machine at one round's sample size.
	for i, c := range confs {
		if i == 0 {
			continue
		}
		var rt, re []float64
		for r := range o.rounds {
			a, b := turns[i][r].rep.Summary.Latency, turns[0][r].rep.Summary.Latency
			rt = append(rt, ratio(a[load.HTTFT].P99, b[load.HTTFT].P99))
			re = append(re, ratio(a[load.HE2E].P99, b[load.HE2E].P99))
		}
		fmt.Fprintf(w, "- \"%s\" ÷ \"off\" by round: TTFT p99 %s; E2E p99 %s. Mean TTFT %+.2f ms, mean E2E %+.2f ms (pooled, minus \"off\").\n",
			c.name, spread(rt), spread(re), ss[i].ttftMean-off.ttftMean, ss[i].e2eMean-off.e2eMean)
	}
	fmt.Fprintf(w, "- Load generator lag p99 (send behind schedule): %s ms.\n", lagList(confs, ss))
	var warns []string
	for i, c := range confs {
		for _, t := range turns[i] {
			for _, m := range t.warnings {
				warns = append(warns, fmt.Sprintf("round %d, %s: %s", t.round, c.name, m))
			}
		}
	}
	if len(warns) == 0 {
		fmt.Fprintln(w, "- Counter checks: in every turn the settled /metrics counters matched the shadow report's, each side compared every copy it was sent, and with a baseline both sides were sent every copy.")
	} else {
		fmt.Fprintf(w, "- Counter checks: %d did not add up:\n", len(warns))
		for _, m := range warns {
			fmt.Fprintf(w, "  - %s\n", m)
		}
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "Verdict:")
	fmt.Fprintln(w)
	// The A/A control: how far "off" is from itself at this sample size on this machine.
	aaT, aaE := math.NaN(), math.NaN()
	for i, c := range confs {
		if c.control {
			aaT, aaE = ratio(ss[i].ttft99, off.ttft99), ratio(ss[i].e2e99, off.e2e99)
			fmt.Fprintf(w, "- A/A control, \"%s\" ÷ \"off\" (no mirror in either): TTFT p99 ×%.3f, E2E p99 ×%.3f: the noise floor of these ratios in this run.\n",
				c.name, aaT, aaE)
		}
	}
	all := true
	for i, c := range confs {
		if c.mirror == "" {
			continue
		}
		s := ss[i]
		rt, re := ratio(s.ttft99, off.ttft99), ratio(s.e2e99, off.e2e99)
		okAll := s.ok == s.sent && off.ok == off.sent
		met := rt <= o.target && re <= o.target && okAll
		noise := ""
		if !math.IsNaN(aaT) {
			beyond := rt-1 > math.Abs(aaT-1) || re-1 > math.Abs(aaE-1)
			noise = fmt.Sprintf("; beyond the A/A noise (±%.1f%% TTFT, ±%.1f%% E2E): %s", 100*math.Abs(aaT-1), 100*math.Abs(aaE-1), yesNo(beyond))
		}
		fmt.Fprintf(w, "- mirroring %s: primary TTFT p99 %.1f vs %.1f ms (×%.3f), E2E p99 %.1f vs %.1f ms (×%.3f), every primary request answered: %s%s → within %.0f%%: **%s**\n",
			c.name, s.ttft99, off.ttft99, rt, s.e2e99, off.e2e99, re, yesNo(okAll), noise, 100*(o.target-1), metMissed(met))
		all = all && met
	}
	fmt.Fprintf(w, "\nIssue 7 target (mirroring on vs off: primary p99 latency within %.0f%%): **%s**\n", 100*(o.target-1), metMissed(all))
	return nil
}

// spread is "min–max (median m)" of ratios.
func spread(v []float64) string {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.3f–%.3f (median %.3f)", v[0], v[len(v)-1], v[len(v)/2])
}

func lagList(confs []conf, ss []stats) string {
	var parts []string
	for i, c := range confs {
		parts = append(parts, fmt.Sprintf("%s %.1f", c.name, ss[i].lag99))
	}
	return strings.Join(parts, ", ")
}

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

func metMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
