// Command bench is Sluice's overhead harness: it runs the simulator with zero delay and
// measures, side by side in one run, the simulator reached directly, through Sluice, through
// nginx and through haproxy, alternating the targets in short rounds so that drift on a noisy
// machine affects them all alike. See README.md in this directory.
//
//	go run ./test/bench [--quick] [--targets direct,sluice,nginx,haproxy] [--duration 5s] [--rounds 3] [--out FILE] [--perf]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	duration     time.Duration // one target's turn at one rate (and one wrk run)
	warmup       time.Duration // per target per rate, not measured
	rounds       int           // rounds of the fixed-rate and wrk phases
	streamRounds int           // measured rounds of the streaming phase
	streams      int
	streamTokens int
	rates        []int
	wrkThreads   int
	wrkConns     int
	gap          time.Duration // pause between turns
	settle       time.Duration // after the load, the wait before reading the proxies at rest again
	out          string
	sluiceBin    string
	keep         bool
	goBench      bool
	benchtime    string
	perf         bool
	quick        bool
	sluiceEnv    []string
	maxOther     float64
	quietWait    time.Duration
	targets      []string // in allTargets' order; direct always first
}

// allTargets are the targets the harness knows, in the order the report lists them.
var allTargets = []string{"direct", "sluice", "nginx", "haproxy"}

// parseTargets parses --targets: a comma-separated subset of allTargets that names direct
// (every added figure is relative to it) and at least one proxy. It returns the names in
// allTargets' order, whatever order they were given in.
func parseTargets(s string) ([]string, error) {
	seen := map[string]bool{}
	var problems []string
	for f := range strings.SplitSeq(s, ",") {
		name := strings.ToLower(strings.TrimSpace(f))
		switch {
		case name == "":
			problems = append(problems, "an empty name")
		case !slices.Contains(allTargets, name):
			problems = append(problems, fmt.Sprintf("unknown target %q (known: %s)", name, strings.Join(allTargets, ", ")))
		case seen[name]:
			problems = append(problems, fmt.Sprintf("%q named twice", name))
		}
		seen[name] = true
	}
	if !seen["direct"] {
		problems = append(problems, "direct is required (every added figure is relative to it)")
	}
	var out []string
	for _, t := range allTargets {
		if seen[t] {
			out = append(out, t)
		}
	}
	if len(out) < 2 && seen["direct"] {
		problems = append(problems, "name at least one proxy besides direct")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("--targets %q: %s", s, strings.Join(problems, "; "))
	}
	return out, nil
}

func (o options) has(target string) bool { return slices.Contains(o.targets, target) }

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	rates := fs.String("rates", "500,2000,5000", "fixed request rates (req/s) of the vegeta phase, comma-separated")
	targets := fs.String("targets", strings.Join(allTargets, ","), "the targets to measure, comma-separated: direct (required) and any of sluice, nginx, haproxy")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "one target's turn at one rate, and one wrk run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up per target before each rate")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of the fixed-rate and wrk phases (target order rotated each round)")
	fs.IntVar(&o.streamRounds, "stream-rounds", 5, "measured rounds of the streaming phase")
	fs.IntVar(&o.streams, "streams", 200, "concurrent streams per round")
	fs.IntVar(&o.streamTokens, "stream-tokens", 64, "tokens per stream (max_tokens with ignore_eos)")
	fs.IntVar(&o.wrkThreads, "wrk-threads", 2, "wrk -t")
	fs.IntVar(&o.wrkConns, "wrk-connections", 64, "wrk -c")
	fs.DurationVar(&o.gap, "gap", 250*time.Millisecond, "pause between two turns")
	fs.DurationVar(&o.settle, "settle", 10*time.Second, "after the load, wait this long before reading each proxy's memory at rest again")
	fs.StringVar(&o.out, "out", "", "also write the markdown report to this file")
	fs.StringVar(&o.sluiceBin, "sluice", "", "use this sluice binary instead of building ./cmd/sluice")
	fs.BoolVar(&o.keep, "keep", false, "keep the temp dir (configs, logs, perf data)")
	fs.BoolVar(&o.goBench, "gobench", true, "also run go test -bench ./proxy/ (the stream relay benchmarks) at the end")
	fs.StringVar(&o.benchtime, "benchtime", "1s", "-benchtime of the go benchmarks")
	fs.BoolVar(&o.perf, "perf", false, "after the measurements, profile Sluice at 2000 req/s and with streams (perf record, and a Go CPU profile from the admin listener's /debug/pprof when it serves one) and add the hot spots to the report")
	fs.Float64Var(&o.maxOther, "max-other-load", 0.5, "discard and rerun a round in which other work on the machine used more than this many CPUs in some turn (negative: keep every round)")
	fs.DurationVar(&o.quietWait, "quiet-wait", time.Minute, "before measuring, wait up to this long for the machine to be quiet (other work below --max-other-load)")
	var senv stringList
	fs.Var(&senv, "sluice-env", "KEY=VALUE added to Sluice's environment, e.g. GOMAXPROCS=1 or GOGC=200 (repeatable; for experiments)")
	fs.BoolVar(&o.quick, "quick", false, "a ~1-minute smoke run: 2s turns, 1 round, 2 stream rounds, short warm-up and go benchmarks")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: go run ./test/bench [flags]

Measures the simulator (zero delay) reached directly, through Sluice, through nginx and
through haproxy, side by side: vegeta at fixed rates, wrk at max throughput, concurrent
streams (TTFT), CPU per request and peak RSS of each proxy; prints a markdown report.
Installs nginx, haproxy and wrk with apt-get when missing (as root). Takes about 8 minutes
with the defaults.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, kv := range senv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return o, fmt.Errorf("--sluice-env %q: want KEY=VALUE", kv)
		}
	}
	o.sluiceEnv = senv
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		quick := map[string]func(){
			"duration":      func() { o.duration = 2 * time.Second },
			"warmup":        func() { o.warmup = 500 * time.Millisecond },
			"rounds":        func() { o.rounds = 1 },
			"stream-rounds": func() { o.streamRounds = 2 },
			"benchtime":     func() { o.benchtime = "200ms" },
		}
		for name, f := range quick {
			if !set[name] {
				f()
			}
		}
	}
	for f := range strings.SplitSeq(*rates, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r <= 0 || r > 100000 {
			return o, fmt.Errorf("--rates: bad rate %q", f)
		}
		o.rates = append(o.rates, r)
	}
	ts, err := parseTargets(*targets)
	if err != nil {
		return o, err
	}
	o.targets = ts
	switch {
	case o.duration < time.Second || o.duration > 5*time.Minute:
		return o, errors.New("--duration must be between 1s and 5m")
	case o.rounds < 1 || o.rounds > 20:
		return o, errors.New("--rounds must be between 1 and 20")
	case o.streamRounds < 1 || o.streamRounds > 50:
		return o, errors.New("--stream-rounds must be between 1 and 50")
	case o.streams < 1 || o.streams > 2000:
		return o, errors.New("--streams must be between 1 and 2000")
	case o.streamTokens < 1 || o.streamTokens > 4096:
		return o, errors.New("--stream-tokens must be between 1 and 4096")
	case o.warmup < 0 || o.warmup > time.Minute, o.gap < 0 || o.gap > 10*time.Second:
		return o, errors.New("--warmup must be at most 1m and --gap at most 10s")
	case o.settle < 0 || o.settle > 5*time.Minute:
		return o, errors.New("--settle must be between 0 and 5m")
	case o.wrkThreads < 1 || o.wrkConns < o.wrkThreads:
		return o, errors.New("--wrk-threads must be >= 1 and --wrk-connections >= --wrk-threads")
	case o.perf && !o.has("sluice"):
		return o, errors.New("--perf profiles Sluice: --targets must name sluice")
	case len(o.sluiceEnv) > 0 && !o.has("sluice"):
		return o, errors.New("--sluice-env is for Sluice: --targets must name sluice")
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, o)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("interrupted (%v); every child process was stopped", err)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func run(ctx context.Context, o options) (err error) {
	began := time.Now()
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	tools := []string{"wrk"}
	for _, t := range []string{"nginx", "haproxy"} {
		if o.has(t) {
			tools = append(tools, t)
		}
	}
	if err := ensureTools(ctx, logf, tools); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		logf("temp dir kept: %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	bin := o.sluiceBin
	if bin == "" {
		logf("building sluice")
		if bin, err = buildSluice(ctx, root, tmp); err != nil {
			return err
		}
	}

	var cs children
	defer cs.stopAll(5 * time.Second)

	var addrs [5]string // simulator, sluice, sluice's admin, nginx, haproxy
	for i := range addrs {
		port, err := freePort()
		if err != nil {
			return err
		}
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", port)
	}
	simAddr, gwAddr, adminAddr, ngxAddr, hapAddr := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4]

	logf("starting the simulator (zero delay) on %s", simAddr)
	sim, err := cs.start("sim", filepath.Join(tmp, "sim.log"), nil, bin, "mock", "--listen", simAddr)
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, sim, "http://"+simAddr+"/health", 20*time.Second); err != nil {
		return err
	}
	targets := []*target{{name: "direct", base: "http://" + simAddr}}
	metered := []*proxyProc{{c: sim}}
	add := func(name, addr string, p *proxyProc) {
		targets = append(targets, &target{name: name, base: "http://" + addr, proxy: p})
		metered = append(metered, p)
	}
	if o.has("sluice") {
		logf("starting sluice on %s (admin %s)", gwAddr, adminAddr)
		gw, err := cs.start("sluice", filepath.Join(tmp, "sluice.log"), o.sluiceEnv, bin, "serve",
			"--upstream", "http://"+simAddr, "--listen", gwAddr, "--admin", adminAddr)
		if err != nil {
			return err
		}
		if err := waitHTTP(ctx, gw, "http://"+adminAddr+"/readyz", 20*time.Second); err != nil {
			return err
		}
		add("sluice", gwAddr, &proxyProc{c: gw})
	}
	if o.has("nginx") {
		conf, err := writeNginxConf(tmp, ngxAddr, simAddr)
		if err != nil {
			return err
		}
		logf("starting nginx on %s (worker_processes %s)", ngxAddr, nginxWorkers)
		ngx, err := cs.start("nginx", filepath.Join(tmp, "nginx.log"), nil, lookTool("nginx"),
			"-p", tmp, "-c", conf, "-e", filepath.Join(tmp, "nginx-error.log"), "-g", "daemon off;")
		if err != nil {
			return err
		}
		if err := waitHTTP(ctx, ngx, "http://"+ngxAddr+"/health", 20*time.Second); err != nil {
			return fmt.Errorf("%w\nnginx error log: %s", err, readTail(filepath.Join(tmp, "nginx-error.log")))
		}
		add("nginx", ngxAddr, &proxyProc{c: ngx, withKids: true})
	}
	hapThreads := haproxyThreads(runtime.NumCPU())
	if o.has("haproxy") {
		maxconn := haproxyMaxconn(nofileHard())
		conf, err := writeHAProxyConf(tmp, hapAddr, simAddr, hapThreads, maxconn)
		if err != nil {
			return err
		}
		logf("starting haproxy on %s (nbthread %d, maxconn %d)", hapAddr, hapThreads, maxconn)
		// -db: in the foreground, one process (no master-worker, no daemon); it logs to stderr.
		hap, err := cs.start("haproxy", filepath.Join(tmp, "haproxy.log"), nil, lookTool("haproxy"), "-db", "-f", conf)
		if err != nil {
			return err
		}
		if err := waitHTTP(ctx, hap, "http://"+hapAddr+"/health", 20*time.Second); err != nil {
			return err
		}
		add("haproxy", hapAddr, &proxyProc{c: hap})
	}

	theMeter = &meter{procs: metered}
	maxIdle := max(512, o.streams+64)
	for _, t := range targets {
		t.client, t.streamClient = newClient(maxIdle), newClient(maxIdle)
		if err := checkTarget(ctx, t); err != nil {
			return err
		}
	}
	res := &results{
		opts: o, began: began, targets: targets, env: gatherEnv(ctx, targets, hapThreads),
		fixed: map[int]map[string]*rateResult{}, wrk: map[string][]wrkRound{},
		streams: map[string][]streamRound{}, rss: map[string]rssInfo{},
	}

	waitQuiet(ctx, o.maxOther, o.quietWait)
	res.rest = res.readRest(ctx, adminAddr)

	// a. + d. fixed rates, with CPU per request.
	body := chatBody(16, false)
	for _, rate := range o.rates {
		res.fixed[rate] = map[string]*rateResult{}
		for _, t := range targets {
			res.fixed[rate][t.name] = &rateResult{}
		}
		if o.warmup > 0 {
			logf("warm-up at %d req/s, %v per target", rate, o.warmup)
			for _, t := range targets {
				attack(ctx, t, rate, o.warmup, body)
				if err := sleepCtx(ctx, o.gap); err != nil {
					return err
				}
			}
		}
		err := res.runRounds(ctx, "rate"+strconv.Itoa(rate), o.rounds, func(t *target, r int) (func(), float64, error) {
			rr, lat := attack(ctx, t, rate, o.duration, body)
			logf("%5d req/s round %d/%d %-7s: %6d requests, achieved %7.1f req/s, ok %.4f, p50 %v, p99 %v, other load %.2f CPUs",
				rate, r+1, o.rounds, t.name, rr.requests, rr.rate, ratio(rr.ok, rr.requests), rr.p50, rr.p99, rr.foreign)
			return func() { res.fixed[rate][t.name].add(rr, lat) }, rr.foreign, nil
		})
		if err != nil {
			return err
		}
	}

	// b. max throughput with wrk.
	script, err := writeWrkScript(tmp, body)
	if err != nil {
		return err
	}
	wrkBin := lookTool("wrk")
	err = res.runRounds(ctx, "wrk", o.rounds, func(t *target, r int) (func(), float64, error) {
		w, err := runWrk(ctx, wrkBin, script, t, o.wrkThreads, o.wrkConns, o.duration)
		if err != nil {
			return nil, 0, err
		}
		logf("wrk round %d/%d %-7s: %8.0f req/s, p50 %v, p99 %v, non-2xx %d, other load %.2f CPUs", r+1, o.rounds, t.name, w.rps, w.p50, w.p99, w.non2xx, w.foreign)
		return func() { res.wrk[t.name] = append(res.wrk[t.name], w) }, w.foreign, nil
	})
	if err != nil {
		return err
	}

	// c. concurrent streams: one unmeasured round per target opens the connections.
	logf("streams: warm-up round of %d streams per target", o.streams)
	for _, t := range targets {
		if sr := streams(ctx, t, o.streams, o.streamTokens); sr.failed > 0 {
			logf("warning: %d of %d warm-up streams to %s failed: %v", sr.failed, o.streams, t.name, sr.errs)
		}
		if err := sleepCtx(ctx, o.gap); err != nil {
			return err
		}
	}
	err = res.runRounds(ctx, "streams", o.streamRounds, func(t *target, r int) (func(), float64, error) {
		sr := streams(ctx, t, o.streams, o.streamTokens)
		logf("streams round %d/%d %-7s: %d ok, %d failed, TTFT p50 %v p99 %v, wall %v, other load %.2f CPUs",
			r+1, o.streamRounds, t.name, len(sr.ttft), sr.failed, quantile(sr.ttft, .5), quantile(sr.ttft, .99), sr.wall.Round(time.Millisecond), sr.foreign)
		return func() { res.streams[t.name] = append(res.streams[t.name], sr) }, sr.foreign, nil
	})
	if err != nil {
		return err
	}

	// d. peak RSS, before anything else runs in the proxies.
	for _, t := range targets {
		if t.proxy != nil {
			sum, each := t.proxy.rss()
			res.rss[t.name] = rssInfo{sum: sum, each: each}
		}
	}
	simRSS, _ := (&proxyProc{c: sim}).rss()
	res.rss["sim"] = rssInfo{sum: simRSS, each: []int64{simRSS}}

	if o.perf {
		gw := targetNamed(targets, "sluice") // --perf requires sluice in --targets
		res.perf = profileSluice(ctx, tmp, gw, o) + pprofSluice(ctx, tmp, bin, adminAddr, gw, o)
	}
	for _, t := range targets {
		t.client.CloseIdleConnections()
		t.streamClient.CloseIdleConnections()
	}
	// e. the proxies at rest again: their memory and (Sluice's) goroutines some time after
	// the load ended, against the same before it began.
	logf("at rest again: waiting %v after the load", o.settle)
	if err := sleepCtx(ctx, o.settle); err != nil {
		return err
	}
	res.after = res.readRest(ctx, adminAddr)
	cs.stopAll(5 * time.Second)

	if o.goBench {
		logf("running the go benchmarks of the stream relay (./proxy/)")
		res.goBenchCmd, res.goBench, res.goBenchErr = runGoBench(ctx, root, o.benchtime)
		if res.goBenchErr != nil {
			logf("go benchmarks failed: %v", res.goBenchErr)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	res.elapsed = time.Since(began)
	report := res.markdown()
	fmt.Print(report)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil {
			return err
		}
		logf("report written to %s", o.out)
	}
	return nil
}

// runRounds runs n rounds in which every target takes one turn, in an order rotated each
// round. A round in which any turn saw more than --max-other-load CPUs of other work on the
// machine is discarded and run again, at most n times per phase; its turns are then kept
// only if no retry is left.
func (res *results) runRounds(ctx context.Context, phase string, n int, turn func(t *target, r int) (commit func(), foreign float64, err error)) error {
	o := res.opts
	retries := 0
	for r := 0; r < n; {
		order := rotate(res.targets, r)
		var commits []func()
		worst := 0.0
		for _, t := range order {
			commit, foreign, err := turn(t, r)
			if err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			commits = append(commits, commit)
			worst = max(worst, foreign)
			if err := sleepCtx(ctx, o.gap); err != nil {
				return err
			}
		}
		if o.maxOther >= 0 && worst > o.maxOther {
			if retries < n && time.Since(res.began) < retryBudget {
				retries++
				res.discarded = append(res.discarded, fmt.Sprintf("%s round %d (other load %.2f CPUs)", phaseName(phase), r+1, worst))
				logf("round %d of %s discarded: other work used %.2f CPUs (> --max-other-load %.2f); running it again", r+1, phaseName(phase), worst, o.maxOther)
				continue
			}
			logf("round %d of %s kept although other work used %.2f CPUs: no retry left", r+1, phaseName(phase), worst)
		}
		for _, c := range commits {
			c()
		}
		res.orders = append(res.orders, roundOrder{phase: phase, round: r, order: names(order)})
		r++
	}
	return nil
}

// retryBudget bounds the whole run: past it, busy rounds are kept rather than run again, so
// that a full run stays within about ten minutes.
const retryBudget = 7 * time.Minute

func phaseName(phase string) string {
	if rate, ok := strings.CutPrefix(phase, "rate"); ok {
		n, _ := strconv.Atoi(rate)
		return thousands(n) + " req/s"
	}
	return phase
}

// waitQuiet waits, up to limit, for a second in which other work uses at most maxOther CPUs.
func waitQuiet(ctx context.Context, maxOther float64, limit time.Duration) {
	if maxOther < 0 || limit <= 0 {
		return
	}
	deadline := time.Now().Add(limit)
	for {
		s := theMeter.start(nil)
		if sleepCtx(ctx, time.Second) != nil {
			return
		}
		_, foreign := theMeter.stop(s)
		if foreign <= maxOther {
			return
		}
		if time.Now().After(deadline) {
			logf("the machine is still busy (other work %.2f CPUs) after %v: measuring anyway", foreign, limit)
			return
		}
		logf("waiting for a quieter machine: other work uses %.2f CPUs", foreign)
	}
}

func names(ts []*target) []string {
	var n []string
	for _, t := range ts {
		n = append(n, t.name)
	}
	return n
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	return tail(b, 10)
}

// profileSluice records Sluice with perf while it serves 2000 req/s, then while it relays
// rounds of concurrent streams, and returns perf report's top symbols for each (self time,
// then cumulative time with callees), or why it could not.
func profileSluice(ctx context.Context, tmp string, t *target, o options) string {
	perf := lookTool("perf")
	if perf == "" {
		return "perf is not installed (Debian package linux-perf): no perf profile taken.\n\n"
	}
	var out strings.Builder
	capture := func(title, file string, work func()) {
		data := filepath.Join(tmp, file)
		cmd := exec.Command(perf, "record", "-F", "999", "-g", "-o", data, "-p", strconv.Itoa(t.proxy.c.pid()))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		logb := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = logb, logb
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(&out, "%s: perf record did not start: %v\n", title, err)
			return
		}
		_ = sleepCtx(ctx, 300*time.Millisecond)
		work()
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		for _, view := range []struct {
			name string
			args []string
			n    int
		}{
			{"self time, by symbol", []string{"--no-children", "--sort", "symbol", "--percent-limit", "0.7"}, 35},
			{"cumulative time (with callees), by symbol", []string{"--children", "--sort", "symbol", "--percent-limit", "3"}, 45},
			{"self time, by binary", []string{"--no-children", "--sort", "dso", "--percent-limit", "0.5"}, 10},
		} {
			args := append([]string{"report", "-i", data, "--stdio", "-g", "none"}, view.args...)
			rep, err := runCmd(ctx, 2*time.Minute, nil, perf, args...)
			if err != nil {
				fmt.Fprintf(&out, "%s: perf report failed: %v\n%s\n%s\n", title, err, tail(rep, 5), logb.String())
				return
			}
			fmt.Fprintf(&out, "%s — %s:\n\n", title, view.name)
			n := 0
			for line := range strings.SplitSeq(string(rep), "\n") {
				if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
					continue
				}
				line = strings.TrimRight(line, " -")
				if len(line) > 150 {
					line = line[:150] + "…"
				}
				fmt.Fprintf(&out, "    %s\n", line)
				if n++; n >= view.n {
					break
				}
			}
			out.WriteString("\n")
		}
	}
	logf("perf: sluice at 2000 req/s for %v", o.duration)
	capture("Sluice at 2000 req/s (non-streaming)", "perf-fixed.data", func() { attack(ctx, t, 2000, o.duration, chatBody(16, false)) })
	logf("perf: sluice with rounds of %d concurrent streams for %v", o.streams, o.duration)
	capture(fmt.Sprintf("Sluice relaying rounds of %d concurrent streams", o.streams), "perf-streams.data", func() {
		end := time.Now().Add(o.duration)
		for ctx.Err() == nil && time.Now().Before(end) {
			streams(ctx, t, o.streams, o.streamTokens)
		}
	})
	return out.String()
}

// pprofSluice fetches Go CPU profiles from Sluice's admin listener (/debug/pprof/profile)
// while it serves 2000 req/s and while it relays streams, and returns go tool pprof's top
// functions (cumulative), or says that the listener has no pprof.
func pprofSluice(ctx context.Context, tmp, bin, admin string, t *target, o options) string {
	var out strings.Builder
	secs := max(1, int(o.duration/time.Second))
	capture := func(title, file string, work func()) {
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs)
		type got struct {
			status int
			err    error
		}
		done := make(chan got, 1)
		path := filepath.Join(tmp, file)
		go func() {
			c := &http.Client{Timeout: time.Duration(secs+30) * time.Second}
			resp, err := c.Get(url)
			if err != nil {
				done <- got{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
			if err == nil && resp.StatusCode == http.StatusOK {
				err = os.WriteFile(path, b, 0o644)
			}
			done <- got{status: resp.StatusCode, err: err}
		}()
		_ = sleepCtx(ctx, 200*time.Millisecond)
		work()
		g := <-done
		switch {
		case g.err != nil:
			fmt.Fprintf(&out, "%s: fetching %s failed: %v\n\n", title, url, g.err)
			return
		case g.status == http.StatusNotFound:
			fmt.Fprintf(&out, "Sluice's admin listener serves no /debug/pprof (404): no pprof profile taken.\n\n")
			return
		case g.status != http.StatusOK:
			fmt.Fprintf(&out, "%s: %s answered %d: no pprof profile taken.\n\n", title, url, g.status)
			return
		}
		rep, err := runCmd(ctx, 2*time.Minute, nil, "go", "tool", "pprof", "-top", "-cum", "-nodecount", "40", bin, path)
		if err != nil {
			fmt.Fprintf(&out, "%s: go tool pprof failed: %v\n%s\n\n", title, err, tail(rep, 5))
			return
		}
		fmt.Fprintf(&out, "%s — go tool pprof -top -cum (from /debug/pprof/profile?seconds=%d):\n\n", title, secs)
		for line := range strings.SplitSeq(strings.TrimRight(string(rep), "\n"), "\n") {
			if len(line) > 150 {
				line = line[:150] + "…"
			}
			fmt.Fprintf(&out, "    %s\n", line)
		}
		out.WriteString("\n")
	}
	logf("pprof: sluice at 2000 req/s for %ds", secs)
	capture("Sluice at 2000 req/s (non-streaming)", "pprof-fixed.pb.gz", func() {
		attack(ctx, t, 2000, time.Duration(secs)*time.Second, chatBody(16, false))
	})
	if strings.Contains(out.String(), "no /debug/pprof") {
		return out.String()
	}
	logf("pprof: sluice with rounds of %d concurrent streams for %ds", o.streams, secs)
	capture(fmt.Sprintf("Sluice relaying rounds of %d concurrent streams", o.streams), "pprof-streams.pb.gz", func() {
		end := time.Now().Add(time.Duration(secs) * time.Second)
		for ctx.Err() == nil && time.Now().Before(end) {
			streams(ctx, t, o.streams, o.streamTokens)
		}
	})
	return out.String()
}

// envInfo describes the machine and the tools.
type envInfo struct {
	cpus                int
	cpuModel            string
	kernel              string
	goVersion           string
	nginx, haproxy, wrk string // versions; empty when not run
	nginxWorkers        int
	haproxyNbthread     int    // configured
	haproxyThreads      int    // counted in /proc
	loadavg             string // at the start of the measurements
}

func gatherEnv(ctx context.Context, targets []*target, hapThreads int) envInfo {
	e := envInfo{cpus: runtime.NumCPU(), goVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.cpuModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			e.loadavg = strings.Join(f[:3], " ")
		}
	}
	e.wrk = toolVersion(ctx, lookTool("wrk"), "-v")
	for _, t := range targets {
		switch t.name {
		case "nginx":
			e.nginx = toolVersion(ctx, lookTool("nginx"), "-v")
			pid := t.proxy.c.pid()
			e.nginxWorkers = len(slices.DeleteFunc(descendants(pid), func(p int) bool { return p == pid }))
		case "haproxy":
			// "HAProxy version 2.6.12-1+deb12u3 2025/10/03 - https://haproxy.org/"
			e.haproxy, _, _ = strings.Cut(toolVersion(ctx, lookTool("haproxy"), "-v"), " - ")
			e.haproxyNbthread = hapThreads
			e.haproxyThreads, _ = readThreads(t.proxy.c.pid())
		}
	}
	return e
}

// targetNamed returns the target called name, or nil.
func targetNamed(ts []*target, name string) *target {
	for _, t := range ts {
		if t.name == name {
			return t
		}
	}
	return nil
}
