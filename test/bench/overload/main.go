// Command overload is Sluice's overload benchmark (issue 8, "Performance: Overload"): one
// batch-limited simulator, offered an open-loop Poisson load at twice its capacity, reached
// through a gateway with no limit, with static concurrency limits (swept) and with the
// adaptive concurrency limiter. It prints a markdown table (admitted, rejected, TTFT of the
// admitted requests, goodput) and the verdicts. Everything runs in this process on 127.0.0.1.
// See README.md in this directory.
//
//	go run ./test/bench/overload [--duration 20s] [--target 500ms] [--statics 4,8,16,24,32]
package main

import (
	"context"
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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/load"
	"github.com/sluicegw/sluice/test/sim"
)

type options struct {
	duration    time.Duration // offered-load window of one configuration
	capDuration time.Duration // capacity measurement
	target      time.Duration // TTFT SLO, the configured target
	factor      float64       // offered load / capacity
	statics     []int
	in, out     int
	seed        uint64
	// adaptive limiter params
	aTargetTTFT time.Duration
	aMaxWait    time.Duration
	aMaxQueue   int
	aMinLimit   int
	aMaxLimit   int
	aWindow     time.Duration
	sMaxWait    time.Duration // static limits' max_wait
	sMaxQueue   int
}

// The simulated model server: batch-limited, so capacity is finite.
var simCfg = sim.Config{
	TTFT:          30 * time.Millisecond,
	ITL:           10 * time.Millisecond,
	ITLPerRunning: 1 * time.Millisecond,
	MaxRunning:    16,
	Seed:          1,
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
}

func parseFlags() (options, error) {
	var o options
	fs := flag.NewFlagSet("overload", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "offered-load window of each configuration")
	fs.DurationVar(&o.capDuration, "cap-duration", 6*time.Second, "capacity measurement (closed loop at MaxRunning, direct to the simulator)")
	fs.DurationVar(&o.target, "target", 500*time.Millisecond, "TTFT target: the SLO of every run")
	fs.Float64Var(&o.factor, "factor", 2, "offered rate as a multiple of the measured capacity")
	statics := fs.String("statics", "4,8,16,24,32", "static limits to sweep")
	fs.IntVar(&o.in, "in", 64, "prompt tokens per request")
	fs.IntVar(&o.out, "out", 32, "output tokens per request (ignore_eos)")
	fs.Uint64Var(&o.seed, "seed", 42, "arrival and workload seed (the same for every configuration)")
	fs.DurationVar(&o.aTargetTTFT, "adaptive-target-ttft", 250*time.Millisecond, "adaptive: target_ttft")
	fs.DurationVar(&o.aMaxWait, "adaptive-max-wait", 200*time.Millisecond, "adaptive: max_wait")
	fs.IntVar(&o.aMaxQueue, "adaptive-max-queue", 64, "adaptive: max_queue")
	fs.IntVar(&o.aMinLimit, "adaptive-min-limit", 4, "adaptive: min_limit")
	fs.IntVar(&o.aMaxLimit, "adaptive-max-limit", 64, "adaptive: max_limit")
	fs.DurationVar(&o.aWindow, "adaptive-sample-window", 500*time.Millisecond, "adaptive: sample_window")
	fs.DurationVar(&o.sMaxWait, "static-max-wait", 0, "static limits: max_wait (default: the adaptive max_wait, so that only the limit differs)")
	fs.IntVar(&o.sMaxQueue, "static-max-queue", 64, "static limits: max_queue")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return o, err
	}
	if o.sMaxWait <= 0 {
		o.sMaxWait = o.aMaxWait
	}
	for _, f := range strings.Split(*statics, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return o, fmt.Errorf("--statics: bad limit %q", f)
		}
		o.statics = append(o.statics, n)
	}
	if o.duration <= 0 || o.capDuration <= 0 || o.target <= 0 || o.factor <= 0 {
		return o, errors.New("--duration, --cap-duration, --target and --factor must be positive")
	}
	return o, nil
}

// result is one configuration's run.
type result struct {
	name       string
	rate       float64
	offered    int64
	admitted   int64 // requests with a 200 (served)
	rejected   int64 // 429
	other      int64 // other failures
	p50, p99   float64
	max        float64
	good       int64
	goodput    float64 // SLO-meeting requests / offered window
	attainment float64 // SLO-meeting share of offered
	windows    []window
}

// window is the TTFT of the requests sent in [from, to) seconds of the run.
type window struct {
	from, to  int
	n         int64
	mean, max float64 // ms
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// The simulator, on 127.0.0.1.
	s := sim.New(simCfg)
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ts := &httptest.Server{Listener: ln, Config: &http.Server{Handler: s}}
	ts.Start()
	defer ts.Close()

	wl := &load.Workload{Name: "synthetic"}
	wl.Synthetic, err = load.ParseSynthetic(fmt.Sprintf("in=fixed:%d,out=fixed:%d", o.in, o.out))
	if err != nil {
		return err
	}
	slo := load.SLO{TTFT: o.target}

	// Capacity: the model's estimate, and the throughput measured closed-loop at MaxRunning
	// in flight directly on the simulator (the batch is always full: the most it can do).
	step := float64(simCfg.ITL+time.Duration(simCfg.MaxRunning-1)*simCfg.ITLPerRunning) / 1e9
	model := 1 / (float64(simCfg.TTFT)/1e9 + float64(o.out)/float64(simCfg.MaxRunning)*step)
	fmt.Fprintf(os.Stderr, "measuring capacity (%v closed loop, %d in flight, direct)...\n", o.capDuration, simCfg.MaxRunning)
	cr, err := load.Run(ctx, load.Config{Target: ts.URL, Model: sim.DefaultModel, Workload: wl,
		Concurrency: simCfg.MaxRunning, Duration: o.capDuration, SLO: slo, Seed: o.seed, Timeout: time.Minute})
	if err != nil {
		return fmt.Errorf("capacity run: %w", err)
	}
	cr.Summarize()
	capacity := cr.Summary.ReqPerS
	if cr.OK == 0 || capacity <= 0 {
		return fmt.Errorf("capacity run: nothing completed (%d failed)", cr.Failed)
	}
	capP99 := cr.Summary.Latency[load.HTTFT].P99
	rate := math.Round(o.factor*capacity*10) / 10
	fmt.Fprintf(os.Stderr, "capacity: model %.1f req/s, measured %.1f req/s (TTFT p99 %.0f ms at full batch); offered %.1f req/s\n",
		model, capacity, capP99, rate)

	type conf struct {
		name, policy string
	}
	confs := []conf{{"no limit", ""}}
	for _, n := range o.statics {
		confs = append(confs, conf{fmt.Sprintf("static %d", n),
			fmt.Sprintf("{type: concurrency, params: {adaptive: false, min_limit: 1, max_limit: %d, max_queue: %d, max_wait: %s}}",
				n, o.sMaxQueue, o.sMaxWait)})
	}
	adaptive := fmt.Sprintf("{type: concurrency, params: {adaptive: true, target_ttft: %s, min_limit: %d, max_limit: %d, sample_window: %s, max_queue: %d, max_wait: %s}}",
		o.aTargetTTFT, o.aMinLimit, o.aMaxLimit, o.aWindow, o.aMaxQueue, o.aMaxWait)
	confs = append(confs, conf{"adaptive", adaptive})

	var results []result
	for _, c := range confs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(os.Stderr, "%s: %.1f req/s for %v...\n", c.name, rate, o.duration)
		r, err := runOne(ctx, o, ts.URL, c.policy, wl, slo, rate)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		r.name = c.name
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "  admitted %d, rejected %d, TTFT p99 %.0f ms, goodput %.2f req/s\n", r.admitted, r.rejected, r.p99, r.goodput)
		if err := pause(ctx); err != nil {
			return err
		}
	}
	report(os.Stdout, o, model, capacity, capP99, rate, adaptive, results)
	return nil
}

// pause separates two configurations: load.Run returns only after every request ended, so
// the simulator is idle; a short pause lets its last step finish.
func pause(ctx context.Context) error {
	select {
	case <-time.After(500 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func runOne(ctx context.Context, o options, simURL, policy string, wl *load.Workload, slo load.SLO, rate float64) (result, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nadmin: {listen: 127.0.0.1:0}\nclusters:\n  - {name: sim, endpoints: [{url: %q}], health_check: {disabled: true}}\nroutes:\n  - name: all\n    cluster: sim\n", simURL)
	if policy != "" {
		fmt.Fprintf(&b, "    policies:\n      - %s\n", policy)
	}
	cfg, err := config.Parse([]byte(b.String()))
	if err != nil {
		return result{}, fmt.Errorf("config: %w\n%s", err, b.String())
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "overload-bench"})
	if err != nil {
		return result{}, fmt.Errorf("proxy.New: %w", err)
	}
	if err := srv.Start(); err != nil {
		return result{}, fmt.Errorf("start the gateway: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	tr := &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true, IdleConnTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	rep, err := load.Run(ctx, load.Config{Target: "http://" + srv.Addr(), Model: sim.DefaultModel, Workload: wl,
		Rate: rate, Arrival: "poisson", Duration: o.duration, SLO: slo, Seed: o.seed,
		Timeout: 2 * time.Minute, Client: &http.Client{Transport: tr}})
	if err != nil {
		return result{}, err
	}
	rep.Summarize()
	r := result{rate: rate, offered: rep.Requests, admitted: rep.OK, rejected: rep.Statuses["429"], good: rep.SLOMet["all"]}
	r.other = rep.Requests - rep.OK - r.rejected
	if p, ok := rep.Summary.Latency[load.HTTFT]; ok {
		r.p50, r.p99, r.max = p.P50, p.P99, p.Max
	}
	r.goodput = float64(r.good) / o.duration.Seconds()
	if rep.Requests > 0 {
		r.attainment = float64(r.good) / float64(rep.Requests)
	}
	r.windows = windows(rep, o.duration)
	return r, nil
}

// windows splits the run by send time into about 4 equal windows and gives the TTFT mean and
// max of each (the report keeps per-second sums and maxima, not per-second histograms).
func windows(rep *load.Report, d time.Duration) []window {
	if len(rep.Seconds) == 0 {
		return nil
	}
	secs := slices.Clone(rep.Seconds)
	slices.SortFunc(secs, func(a, b load.Bucket) int { return int(a.Unix - b.Unix) })
	t0 := rep.FirstSend / 1e9
	total := int(math.Ceil(d.Seconds()))
	w := max(1, total/4)
	var out []window
	for from := 0; from < total; from += w {
		win := window{from: from, to: min(from+w, total)}
		var sum int64
		for _, b := range secs {
			rel := int(b.Unix - t0)
			if rel >= win.from && rel < win.to {
				sum += b.TTFTSum
				win.n += b.TTFTN
				win.max = max(win.max, float64(b.TTFTMax)/1000)
			}
		}
		if win.n > 0 {
			win.mean = float64(sum) / float64(win.n) / 1000
		}
		out = append(out, win)
	}
	return out
}

func report(w io.Writer, o options, model, capacity, capP99, rate float64, adaptive string, rs []result) {
	fmt.Fprintf(w, "## Overload at %.3gx capacity\n\n", o.factor)
	fmt.Fprintf(w, "Simulator: MaxRunning %d, TTFT %v, ITL %v, ITLPerRunning %v; requests: %d prompt tokens, %d output tokens (ignore_eos), streaming.\n",
		simCfg.MaxRunning, simCfg.TTFT, simCfg.ITL, simCfg.ITLPerRunning, o.in, o.out)
	fmt.Fprintf(w, "Capacity: model %.1f req/s, measured %.1f req/s (closed loop, %d in flight, TTFT p99 %.0f ms). Offered: **%.1f req/s** Poisson for %v (seed %d).\n",
		model, capacity, simCfg.MaxRunning, capP99, rate, o.duration, o.seed)
	fmt.Fprintf(w, "SLO / target: TTFT ≤ %v. Goodput = requests meeting the SLO / %v (rejected and failed requests are not good).\n\n", o.target, o.duration)
	fmt.Fprintf(w, "Static: `{adaptive: false, min_limit: 1, max_limit: N, max_queue: %d, max_wait: %s}`\n\n", o.sMaxQueue, o.sMaxWait)
	fmt.Fprintf(w, "Adaptive: `%s`\n\n", adaptive)

	fmt.Fprintln(w, "| config | offered req/s | sent | admitted | rejected (429) | other errors | TTFT p50 ms | TTFT p99 ms | TTFT max ms | SLO met | goodput req/s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %.1f | %d | %d | %d | %d | %.0f | %.0f | %.0f | %.1f%% | %.2f |\n",
			r.name, r.rate, r.offered, r.admitted, r.rejected, r.other, r.p50, r.p99, r.max, 100*r.attainment, r.goodput)
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "TTFT of the admitted requests by send time (mean / max, ms):")
	fmt.Fprintln(w)
	if len(rs) > 0 && len(rs[0].windows) > 0 {
		fmt.Fprint(w, "| config |")
		for _, win := range rs[0].windows {
			fmt.Fprintf(w, " %d–%d s |", win.from, win.to)
		}
		fmt.Fprint(w, "\n|---|")
		for range rs[0].windows {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprintln(w)
		for _, r := range rs {
			fmt.Fprintf(w, "| %s |", r.name)
			for _, win := range r.windows {
				fmt.Fprintf(w, " %.0f / %.0f |", win.mean, win.max)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}

	var none, ad *result
	best := -1
	for i := range rs {
		switch {
		case rs[i].name == "no limit":
			none = &rs[i]
		case rs[i].name == "adaptive":
			ad = &rs[i]
		case best < 0 || rs[i].goodput > rs[best].goodput:
			best = i
		}
	}
	fmt.Fprintln(w, "Verdicts:")
	fmt.Fprintln(w)
	target := float64(o.target) / 1e6
	if ad != nil {
		fmt.Fprintf(w, "- adaptive TTFT p99 %.0f ms < target %.0f ms: **%s**\n", ad.p99, target, passFail(ad.p99 < target && ad.admitted > 0))
		if best >= 0 {
			b := rs[best]
			ratio := 0.0
			if b.goodput > 0 {
				ratio = ad.goodput / b.goodput
			}
			fmt.Fprintf(w, "- adaptive goodput %.2f req/s ≥ 90%% of the best static (%s, %.2f req/s): %.0f%% **%s**\n",
				ad.goodput, b.name, b.goodput, 100*ratio, passFail(ratio >= 0.9))
		}
	}
	if none != nil && len(none.windows) > 1 {
		f, l := none.windows[0], none.windows[len(none.windows)-1]
		grows := l.mean > 2*f.mean && l.mean > target && none.p99 > target
		fmt.Fprintf(w, "- no limit: TTFT mean %.0f ms in the first window → %.0f ms in the last (max %.0f → %.0f ms), p99 %.0f ms over the run; grows with the run (backlog builds at %.1f − %.1f req/s): **%s**\n",
			f.mean, l.mean, f.max, l.max, none.p99, rate, capacity, yesNo(grows))
	}
}

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
