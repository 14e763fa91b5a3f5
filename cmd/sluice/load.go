package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/sluicegw/sluice/test/load"
)

func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "merge" {
		return runLoadMerge(args[1:], stdout, stderr)
	}
	fs, f := newLoadFlags(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	cfg, err := f.config(set)
	if err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" {
		// Fewer collections: at thousands of requests per second the collector's pauses and
		// its dedicated worker (a quarter of GOMAXPROCS) are most of the scheduling lag's tail.
		debug.SetGCPercent(400)
	}
	var view *progressView
	if showProgress(*f.quiet, stderr) {
		view = &progressView{w: stderr}
		defer view.end()
		cfg.OnProgress = view.update
	}
	var rep *load.Report
	if *f.sweep {
		rep, err = load.Sweep(ctx, cfg, load.SweepConfig{Start: *f.rate, Steps: *f.sweepSteps, Attainment: *f.sweepAtt,
			OnStep: func(s load.SweepStep) {
				view.end()
				fmt.Fprintf(stdout, "sweep: rate %8.2f req/s  attainment %5.1f%%  goodput %7.2f  TTFT p99 %8.1f ms  pass %v\n",
					s.Rate, s.Attainment*100, s.Goodput, s.TTFTp99, s.Pass)
			}})
	} else {
		rep, err = load.Run(ctx, cfg)
	}
	view.end() // before anything else is printed: the summary starts on a line of its own
	if rep == nil {
		return err
	}
	if werr := writeOutputs(rep, *f.jsonOut, *f.htmlOut); werr != nil {
		return werr
	}
	load.PrintSummary(stdout, rep)
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "sluice load: interrupted; the results cover what was measured")
		return nil
	}
	if err != nil {
		return err
	}
	threshold := *f.sloAtt
	if *f.sweep {
		threshold = *f.sweepAtt
	}
	// main prints it as the last line on stderr ("sluice load: SLO missed: ...") and exits 1.
	return rep.Check(threshold)
}

// loadFlags are the flags of `sluice load`, set by parsing its flag set.
type loadFlags struct {
	target      *string
	model       *string
	apiKey      *string
	endpoint    *string
	trace       *string
	synthetic   *string
	sessions    *string
	rate        *float64
	arrival     *string
	burst       *float64
	rampTo      *float64
	conc        *int
	sweep       *bool
	sweepSteps  *int
	sweepAtt    *float64
	duration    *time.Duration
	requests    *int
	timeScale   *float64
	slo         *string
	sloAtt      *float64
	jsonOut     *string
	htmlOut     *string
	shard       *string
	seed        *uint64
	abort       *float64
	inflate     *string
	perturb     *float64
	timeout     *time.Duration
	maxInflight *int
	noStream    *bool
	contUsage   *bool
	quiet       *bool
}

// newLoadFlags is the flag set of `sluice load`.
func newLoadFlags(stderr io.Writer) (*flag.FlagSet, *loadFlags) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "", "base URL of the OpenAI-compatible endpoint (http://host:port; /v1/chat/completions is added)")
	model := fs.String("model", "", "model name sent in each request (empty: the server's default)")
	apiKey := fs.String("api-key", os.Getenv("OPENAI_API_KEY"), "API key sent as a bearer token (default $OPENAI_API_KEY)")
	endpoint := fs.String("endpoint", "chat", "chat (/v1/chat/completions) or completions (/v1/completions)")
	trace := fs.String("trace", "", "trace file: Azure CSV, Mooncake JSONL, ShareGPT JSON or pairs from 'sluice shadow export' (replayed as recorded; format detected)")
	synthetic := fs.String("synthetic", "", "synthetic workload, e.g. in=lognormal:1000:0.5,out=fixed:128 (fixed:N, uniform:LO:HI, normal:MEAN:SD, lognormal:MEDIAN:SIGMA)")
	sessions := fs.String("sessions", "", "multi-turn sessions, e.g. n=20,turns=4,in=fixed:200,out=fixed:64,think=gamma:2:500ms")
	rate := fs.Float64("rate", 0, "open-loop rate in req/s (sessions: session starts/s); with --trace, re-paces the trace")
	arrival := fs.String("arrival", "poisson", "arrival process at --rate: poisson, constant or gamma")
	burst := fs.Float64("burstiness", 1, "gamma shape for --arrival gamma (vLLM semantics: 1 = Poisson, <1 burstier)")
	rampTo := fs.Float64("ramp-to", 0, "ramp the rate linearly from --rate to this over --duration")
	conc := fs.Int("concurrency", 0, "closed loop: keep this many requests (or sessions) in flight")
	sweep := fs.Bool("sweep", false, "find the highest rate meeting --slo (doubling from --rate, then bisection); each step runs --duration/--requests")
	sweepSteps := fs.Int("sweep-steps", 8, "runs in a sweep")
	sweepAtt := fs.Float64("sweep-attainment", load.DefaultAttainment, "share of requests that must meet every SLO for a sweep step to pass (the sweep fails, exit 1, when no step does)")
	duration := fs.Duration("duration", 0, "stop scheduling after this long (0: until the workload ends)")
	requests := fs.Int("requests", 0, "send this many requests of the whole workload (0: all; synthetic default 100)")
	timeScale := fs.Float64("time-scale", 1, "multiply trace timestamps by this (0.5 replays twice as fast)")
	slo := fs.String("slo", "", "SLO limits for goodput and attainment, e.g. ttft=500ms,itl=50ms,tpot=40ms,e2e=10s")
	sloAtt := fs.Float64("slo-attainment", load.DefaultAttainment, "with --slo: the run fails (exit 1) when fewer than this share of requests meet every SLO (0: never; --sweep uses --sweep-attainment)")
	jsonOut := fs.String("json", "", "write the JSON results (mergeable) to this file")
	htmlOut := fs.String("html", "", "write the self-contained HTML report to this file")
	shard := fs.String("shard", "", "run shard i/n of the workload (requests with index ≡ i mod n); merge the JSON files with 'sluice load merge'")
	seed := fs.Uint64("seed", 1, "seed of the workload and the schedule (shards must share it)")
	abort := fs.Float64("abort", 0, "chaos: share of streams the client aborts mid-way")
	inflate := fs.String("inflate", "", "chaos: SHARE:K inflates a share of prompts K times (e.g. 0.01:10)")
	perturb := fs.Float64("perturb", 0, "chaos: share of prompt tokens replaced by random ones")
	timeout := fs.Duration("timeout", 5*time.Minute, "per-request timeout")
	maxInflight := fs.Int("max-inflight", 10000, "open-loop bound on requests in flight (waiting for a slot shows as scheduling lag)")
	noStream := fs.Bool("no-stream", false, "send non-streaming requests (TTFT = E2E)")
	contUsage := fs.Bool("continuous-usage", false, "ask for usage on every chunk (vLLM stream_options.continuous_usage_stats) to count tokens per event exactly")
	quiet := fs.Bool("quiet", false, "no live progress view")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice load --target URL [--model M] [--trace FILE | --synthetic SPEC | --sessions SPEC]
       [--rate R | --concurrency C | --sweep] [--duration D | --requests N] [--time-scale F]
       [--slo ttft=500ms,itl=50ms] [--json OUT.json] [--html OUT.html] [--shard i/n] [--api-key K]
       sluice load merge A.json B.json ... [--json OUT.json] [--html OUT.html]

Sends a workload to an OpenAI-compatible endpoint and measures it token by token: TTFT (send to
the first event with content), ITL per token (events with several tokens split evenly), TPOT,
E2E, output tokens from usage (tokenizer fallback), goodput and SLO attainment, error classes,
Sluice's x-sluice-upstream / x-sluice-attempts, scheduling lag, and for --sessions the context
fidelity. Prompts are synthesised to exact cl100k token counts; output length is forced with
max_tokens and ignore_eos. A trace replays at its own timestamps unless --rate re-paces it.

Exit status (the summary and --json/--html are written first either way):
  0  the run passed
  1  the run failed: every request failed (none succeeded), or --slo is given and fewer than
     --slo-attainment of the requests met every limit (--sweep: no step reached
     --sweep-attainment); the last line on stderr says why. Also a usage, input or output error.
An interrupted run (SIGINT, SIGTERM) exits 0 with a note and is not judged: the requests it
cut short count as failed. 'sluice load merge' only combines: it exits 1 only when the files
cannot be read or merged, never on the SLO.

Flags:
`)
		fs.PrintDefaults()
	}
	return fs, &loadFlags{
		target: target, model: model, apiKey: apiKey, endpoint: endpoint, trace: trace,
		synthetic: synthetic, sessions: sessions, rate: rate, arrival: arrival, burst: burst,
		rampTo: rampTo, conc: conc, sweep: sweep, sweepSteps: sweepSteps, sweepAtt: sweepAtt,
		duration: duration, requests: requests, timeScale: timeScale, slo: slo, sloAtt: sloAtt,
		jsonOut: jsonOut, htmlOut: htmlOut, shard: shard, seed: seed, abort: abort, inflate: inflate,
		perturb: perturb, timeout: timeout, maxInflight: maxInflight, noStream: noStream,
		contUsage: contUsage, quiet: quiet,
	}
}

// config checks the parsed flags (set: the names given) and builds the run's config.
func (f *loadFlags) config(set map[string]bool) (load.Config, error) {
	if *f.target != "" {
		if err := load.CheckTarget(*f.target); err != nil {
			return load.Config{}, err
		}
	}
	if !(*f.sloAtt >= 0 && *f.sloAtt <= 1) {
		return load.Config{}, fmt.Errorf("--slo-attainment %g: want a share in [0, 1], e.g. 0.9", *f.sloAtt)
	}
	if !(*f.sweepAtt > 0 && *f.sweepAtt <= 1) {
		return load.Config{}, fmt.Errorf("--sweep-attainment %g: want a share in (0, 1], e.g. 0.9", *f.sweepAtt)
	}
	if set["slo-attainment"] && *f.slo == "" {
		return load.Config{}, errors.New("--slo-attainment needs --slo (the limits whose attainment it judges)")
	}
	if set["slo-attainment"] && *f.sweep {
		return load.Config{}, errors.New("--slo-attainment judges one run: with --sweep give --sweep-attainment")
	}
	cfg := load.Config{Target: *f.target, Model: *f.model, APIKey: *f.apiKey, Endpoint: *f.endpoint, Rate: *f.rate, Arrival: *f.arrival,
		Burstiness: *f.burst, RampTo: *f.rampTo, Concurrency: *f.conc, Duration: *f.duration, Requests: *f.requests, TimeScale: *f.timeScale,
		Seed: *f.seed, Abort: *f.abort, Perturb: *f.perturb, Timeout: *f.timeout, MaxInFlight: *f.maxInflight, NoStream: *f.noStream,
		ContinuousUsage: *f.contUsage}
	if *f.endpoint != "chat" && *f.endpoint != "completions" {
		return load.Config{}, fmt.Errorf("--endpoint %q: want chat or completions", *f.endpoint)
	}
	n := 0
	for _, s := range []string{*f.trace, *f.synthetic, *f.sessions} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return load.Config{}, errors.New("give exactly one of --trace, --synthetic, --sessions")
	}
	var err error
	switch {
	case *f.trace != "":
		cfg.Workload, err = load.LoadTrace(*f.trace)
	case *f.synthetic != "":
		var sp *load.SyntheticSpec
		sp, err = load.ParseSynthetic(*f.synthetic)
		cfg.Workload = &load.Workload{Synthetic: sp}
	default:
		var sp *load.SessionSpec
		sp, err = load.ParseSessions(*f.sessions)
		cfg.Workload = &load.Workload{Sessions: sp}
	}
	if err != nil {
		return load.Config{}, err
	}
	if *f.slo != "" {
		if cfg.SLO, err = load.ParseSLO(*f.slo); err != nil {
			return load.Config{}, err
		}
	}
	if *f.shard != "" {
		i, nn, ok := strings.Cut(*f.shard, "/")
		a, err1 := strconv.Atoi(i)
		b, err2 := strconv.Atoi(nn)
		if !ok || err1 != nil || err2 != nil || b < 1 || a < 0 || a >= b {
			return load.Config{}, fmt.Errorf("--shard %q: want i/n with 0 <= i < n", *f.shard)
		}
		cfg.Shard, cfg.Shards = a, b
	}
	if *f.inflate != "" {
		s, k, ok := strings.Cut(*f.inflate, ":")
		share, err1 := strconv.ParseFloat(s, 64)
		kk, err2 := strconv.Atoi(k)
		if !ok || err1 != nil || err2 != nil || kk < 1 || kk > 1000 {
			return load.Config{}, fmt.Errorf("--inflate %q: want SHARE:K, e.g. 0.01:10", *f.inflate)
		}
		cfg.Inflate, cfg.InflateK = share, kk
	}
	return cfg, nil
}

// showProgress decides whether the live progress view is drawn: on stderr, when that is a
// terminal. A variable, so that tests can draw it into a buffer.
var showProgress = func(quiet bool, stderr io.Writer) bool { return !quiet && isTTY(stderr) }

// progressView is the live progress line (schollz/progressbar) on stderr. The summary and the
// sweep's lines go to stdout, usually the same terminal, so end is called before each: it
// leaves the last state drawn and moves to a new line, so that what follows starts on a line
// of its own (in a terminal and in a file alike). The next update starts a new bar.
type progressView struct {
	w     io.Writer
	bar   *progressbar.ProgressBar // nil: nothing drawn since the last end
	total int64                    // the bar's length (-1: unknown, a spinner)
}

func (v *progressView) update(l load.Live) {
	if v.bar == nil {
		v.total = -1 // a spinner until the total is known
		if l.Total > 0 {
			v.total = l.Total
		}
		// No throttle: updates come 4 times a second, and each one must be drawn (a
		// throttled bar would draw the first of the calls below and drop the other, so
		// the count would lag the description, and the final state could be left undrawn).
		// No spinner interval: it would start a goroutine drawing the spinner every 100 ms
		// until the bar is full, over whatever is printed after end; the spinner then
		// turns once per update instead.
		v.bar = progressbar.NewOptions64(v.total, progressbar.OptionSetWriter(v.w), progressbar.OptionSetWidth(20),
			progressbar.OptionShowCount(), progressbar.OptionSetSpinnerChangeInterval(0))
	} else if l.Total > 0 && v.total != l.Total {
		// Not bar.GetMax64: a spinner's max is its width (20), so a total of 20 stayed a spinner.
		v.total = l.Total
		v.bar.ChangeMax64(l.Total)
	}
	rate := 0.0
	if l.Elapsed > 0 {
		rate = float64(l.Sent) / l.Elapsed.Seconds()
	}
	v.bar.Describe(fmt.Sprintf("%.1f req/s  in-flight %d  TTFT p50 %v p99 %v  errors %d", rate, l.InFlight,
		l.TTFTp50.Round(time.Millisecond), l.TTFTp99.Round(time.Millisecond), l.Errs))
	_ = v.bar.Set64(l.Done)
}

// end stops the bar and ends its line; a nil view or one with nothing drawn does nothing.
// It must not run concurrently with update (Run has stopped calling OnProgress when it returns).
func (v *progressView) end() {
	if v == nil || v.bar == nil {
		return
	}
	_ = v.bar.Exit()
	fmt.Fprintln(v.w)
	v.bar = nil
}

func runLoadMerge(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("load merge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.String("json", "", "write the merged JSON results here")
	htmlOut := fs.String("html", "", "write the merged HTML report here")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice load merge A.json B.json ... [--json OUT.json] [--html OUT.html]

Merges the JSON results of shards (sluice load --shard i/n --json ...) exactly: counts and HDR
histograms add, per-second buckets add, the span runs from the first send to the last answer.
Prints the merged summary. It only combines: the exit status is 1 when a file cannot be read
or the reports cannot be merged (versions or SLOs differ), never for the SLO's attainment or
failed requests; each shard's own run was judged by its exit status.

Flags:
`)
		fs.PrintDefaults()
	}
	// Flags may follow the file names.
	var files []string
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(files) == 0 {
		return errors.New("give the JSON files to merge")
	}
	var reps []*load.Report
	for _, f := range files {
		r, err := load.ReadReportFile(f)
		if err != nil {
			return err
		}
		reps = append(reps, r)
	}
	m, err := load.Merge(reps...)
	if err != nil {
		return err
	}
	if err := writeOutputs(m, *jsonOut, *htmlOut); err != nil {
		return err
	}
	load.PrintSummary(stdout, m)
	return nil
}

func writeOutputs(r *load.Report, jsonPath, htmlPath string) error {
	write := func(path string, fn func(io.Writer) error) error {
		if path == "" {
			return nil
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := write(jsonPath, r.WriteJSON); err != nil {
		return err
	}
	return write(htmlPath, r.WriteHTML)
}

func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
