// Command bench is Sluice's overhead harness: it runs the simulator with zero delay and
// measures, side by side in one run, the simulator reached directly, through Sluice and
// through nginx, alternating the targets in short rounds so that drift on a noisy machine
// affects all three alike. See README.md in this directory.
//
//	go run ./test/bench [--quick] [--duration 5s] [--rounds 3] [--out FILE] [--perf]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
	out          string
	sluiceBin    string
	keep         bool
	goBench      bool
	benchtime    string
	perf         bool
	quick        bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	rates := fs.String("rates", "500,2000,5000", "fixed request rates (req/s) of the vegeta phase, comma-separated")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "one target's turn at one rate, and one wrk run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up per target before each rate")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of the fixed-rate and wrk phases (target order rotated each round)")
	fs.IntVar(&o.streamRounds, "stream-rounds", 5, "measured rounds of the streaming phase")
	fs.IntVar(&o.streams, "streams", 200, "concurrent streams per round")
	fs.IntVar(&o.streamTokens, "stream-tokens", 64, "tokens per stream (max_tokens with ignore_eos)")
	fs.IntVar(&o.wrkThreads, "wrk-threads", 2, "wrk -t")
	fs.IntVar(&o.wrkConns, "wrk-connections", 64, "wrk -c")
	fs.DurationVar(&o.gap, "gap", 250*time.Millisecond, "pause between two turns")
	fs.StringVar(&o.out, "out", "", "also write the markdown report to this file")
	fs.StringVar(&o.sluiceBin, "sluice", "", "use this sluice binary instead of building ./cmd/sluice")
	fs.BoolVar(&o.keep, "keep", false, "keep the temp dir (configs, logs, perf data)")
	fs.BoolVar(&o.goBench, "gobench", true, "also run go test -bench ./proxy/ (the stream relay benchmarks) at the end")
	fs.StringVar(&o.benchtime, "benchtime", "1s", "-benchtime of the go benchmarks")
	fs.BoolVar(&o.perf, "perf", false, "after the measurements, profile Sluice with perf record at 2000 req/s and with streams, and add the hot spots to the report")
	fs.BoolVar(&o.quick, "quick", false, "a ~1-minute smoke run: 2s turns, 1 round, 2 stream rounds, short warm-up and go benchmarks")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: go run ./test/bench [flags]

Measures the simulator (zero delay) reached directly, through Sluice and through nginx, side
by side: vegeta at fixed rates, wrk at max throughput, concurrent streams (TTFT), CPU per
request and peak RSS of each proxy; prints a markdown report. Installs nginx and wrk with
apt-get when missing (as root). Takes about 6 minutes with the defaults.

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
	case o.wrkThreads < 1 || o.wrkConns < o.wrkThreads:
		return o, errors.New("--wrk-threads must be >= 1 and --wrk-connections >= --wrk-threads")
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
	if err := ensureTools(ctx, logf); err != nil {
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

	simPort, err1 := freePort()
	gwPort, err2 := freePort()
	adminPort, err3 := freePort()
	ngxPort, err4 := freePort()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return err
	}
	simAddr := fmt.Sprintf("127.0.0.1:%d", simPort)
	gwAddr := fmt.Sprintf("127.0.0.1:%d", gwPort)
	adminAddr := fmt.Sprintf("127.0.0.1:%d", adminPort)
	ngxAddr := fmt.Sprintf("127.0.0.1:%d", ngxPort)

	logf("starting the simulator (zero delay) on %s", simAddr)
	sim, err := cs.start("sim", filepath.Join(tmp, "sim.log"), bin, "mock", "--listen", simAddr)
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, sim, "http://"+simAddr+"/health", 20*time.Second); err != nil {
		return err
	}
	logf("starting sluice on %s (admin %s)", gwAddr, adminAddr)
	gw, err := cs.start("sluice", filepath.Join(tmp, "sluice.log"), bin, "serve",
		"--upstream", "http://"+simAddr, "--listen", gwAddr, "--admin", adminAddr)
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, gw, "http://"+adminAddr+"/readyz", 20*time.Second); err != nil {
		return err
	}
	nginxBin := lookTool("nginx")
	conf, err := writeNginxConf(tmp, ngxAddr, simAddr)
	if err != nil {
		return err
	}
	logf("starting nginx on %s (worker_processes %s)", ngxAddr, nginxWorkers)
	ngx, err := cs.start("nginx", filepath.Join(tmp, "nginx.log"), nginxBin,
		"-p", tmp, "-c", conf, "-e", filepath.Join(tmp, "nginx-error.log"), "-g", "daemon off;")
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, ngx, "http://"+ngxAddr+"/health", 20*time.Second); err != nil {
		return fmt.Errorf("%w\nnginx error log: %s", err, readTail(filepath.Join(tmp, "nginx-error.log")))
	}

	maxIdle := max(512, o.streams+64)
	targets := []*target{
		{name: "direct", base: "http://" + simAddr},
		{name: "sluice", base: "http://" + gwAddr, proxy: &proxyProc{c: gw}},
		{name: "nginx", base: "http://" + ngxAddr, proxy: &proxyProc{c: ngx, withKids: true}},
	}
	for _, t := range targets {
		t.client, t.streamClient = newClient(maxIdle), newClient(maxIdle)
		if err := checkTarget(ctx, t); err != nil {
			return err
		}
	}
	res := &results{
		opts: o, began: began, targets: targets, env: gatherEnv(ctx, nginxBin, ngx),
		fixed: map[int]map[string]*rateResult{}, wrk: map[string][]wrkRound{},
		streams: map[string][]streamRound{}, rss: map[string]rssInfo{},
	}

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
		for r := range o.rounds {
			order := rotate(targets, r)
			res.orders = append(res.orders, roundOrder{phase: "rate" + strconv.Itoa(rate), round: r, order: names(order)})
			for _, t := range order {
				rr, lat := attack(ctx, t, rate, o.duration, body)
				if err := ctx.Err(); err != nil {
					return err
				}
				res.fixed[rate][t.name].add(rr, lat)
				logf("%5d req/s round %d/%d %-6s: %6d requests, achieved %7.1f req/s, ok %.4f, p50 %v, p99 %v",
					rate, r+1, o.rounds, t.name, rr.requests, rr.rate, ratio(rr.ok, rr.requests), rr.p50, rr.p99)
				if err := sleepCtx(ctx, o.gap); err != nil {
					return err
				}
			}
		}
	}

	// b. max throughput with wrk.
	script, err := writeWrkScript(tmp, body)
	if err != nil {
		return err
	}
	wrkBin := lookTool("wrk")
	for r := range o.rounds {
		order := rotate(targets, r)
		res.orders = append(res.orders, roundOrder{phase: "wrk", round: r, order: names(order)})
		for _, t := range order {
			w, err := runWrk(ctx, wrkBin, script, t, o.wrkThreads, o.wrkConns, o.duration)
			if err != nil {
				return err
			}
			res.wrk[t.name] = append(res.wrk[t.name], w)
			logf("wrk round %d/%d %-6s: %8.0f req/s, p50 %v, p99 %v, non-2xx %d", r+1, o.rounds, t.name, w.rps, w.p50, w.p99, w.non2xx)
			if err := sleepCtx(ctx, o.gap); err != nil {
				return err
			}
		}
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
	for r := range o.streamRounds {
		order := rotate(targets, r)
		res.orders = append(res.orders, roundOrder{phase: "streams", round: r, order: names(order)})
		for _, t := range order {
			sr := streams(ctx, t, o.streams, o.streamTokens)
			if err := ctx.Err(); err != nil {
				return err
			}
			res.streams[t.name] = append(res.streams[t.name], sr)
			logf("streams round %d/%d %-6s: %d ok, %d failed, TTFT p50 %v p99 %v, wall %v",
				r+1, o.streamRounds, t.name, len(sr.ttft), sr.failed, quantile(sr.ttft, .5), quantile(sr.ttft, .99), sr.wall.Round(time.Millisecond))
			if err := sleepCtx(ctx, o.gap); err != nil {
				return err
			}
		}
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
		res.perf = profileSluice(ctx, tmp, targets[1], o)
	}
	for _, t := range targets {
		t.client.CloseIdleConnections()
		t.streamClient.CloseIdleConnections()
	}
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

// profileSluice records Sluice with perf while it serves 2000 req/s, then 200-stream rounds,
// and returns perf report's top symbols for each, or why it could not.
func profileSluice(ctx context.Context, tmp string, t *target, o options) string {
	perf := lookTool("perf")
	if perf == "" {
		return "perf is not installed (Debian package linux-perf): no profile taken."
	}
	var out strings.Builder
	capture := func(title string, work func()) {
		data := filepath.Join(tmp, "perf-"+strings.ReplaceAll(title, " ", "-")+".data")
		cmd := exec.Command(perf, "record", "-F", "999", "-g", "-o", data, "-p", strconv.Itoa(t.proxy.c.pid()))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		logb := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = logb, logb
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(&out, "%s: perf record did not start: %v\n", title, err)
			return
		}
		time.Sleep(300 * time.Millisecond)
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
		rep, err := runCmd(ctx, 2*time.Minute, nil, perf, "report", "-i", data, "--stdio", "--no-children",
			"--sort", "symbol", "--percent-limit", "0.7", "-g", "none")
		if err != nil {
			fmt.Fprintf(&out, "%s: perf report failed: %v\n%s\n%s\n", title, err, tail(rep, 5), logb.String())
			return
		}
		fmt.Fprintf(&out, "%s (self time, symbols at 0.7%% or more):\n\n", title)
		n := 0
		for line := range strings.SplitSeq(string(rep), "\n") {
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			fmt.Fprintf(&out, "    %s\n", strings.TrimRight(line, " "))
			if n++; n >= 45 {
				break
			}
		}
		out.WriteString("\n")
	}
	logf("perf: sluice at 2000 req/s for %v", o.duration)
	capture("fixed 2000 req/s", func() { attack(ctx, t, 2000, o.duration, chatBody(16, false)) })
	logf("perf: sluice with %d concurrent streams, %d rounds", o.streams, max(3, o.streamRounds))
	capture(strconv.Itoa(o.streams)+" streams", func() {
		for range max(3, o.streamRounds) {
			streams(ctx, t, o.streams, o.streamTokens)
		}
	})
	return out.String()
}

// envInfo describes the machine and the tools.
type envInfo struct {
	cpus         int
	cpuModel     string
	kernel       string
	goVersion    string
	nginx, wrk   string
	nginxWorkers int
}

func gatherEnv(ctx context.Context, nginxBin string, ngx *child) envInfo {
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
	e.nginx = toolVersion(ctx, nginxBin, "-v")
	e.wrk = toolVersion(ctx, lookTool("wrk"), "-v")
	e.nginxWorkers = len(slices.DeleteFunc(descendants(ngx.pid()), func(p int) bool { return p == ngx.pid() }))
	return e
}
