package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/load"
	"github.com/sluicegw/sluice/test/sim"
)

//go:embed demo.yaml
var demoConfig string

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	requests := fs.Int("requests", 64, "streaming requests to send through the gateway (sessions × turns, rounded up)")
	turns := fs.Int("turns", 4, "turns per multi-turn session")
	concurrency := fs.Int("concurrency", 8, "sessions in flight at once (split between the routes)")
	maxTokens := fs.Int("max-tokens", 48, "max_tokens of each request")
	slo := fs.String("slo", "ttft=250ms,itl=50ms", "SLO for goodput and attainment (sluice load's --slo syntax)")
	verbose := fs.Bool("v", false, "show the gateway's logs")
	chaosPhase := fs.Bool("chaos", true, "run the chaos phase: faults on the primary while the workload runs")
	outputPhase := fs.Bool("output", true, "run the output-side phase: looping answers cut, confidence from logprobs, a KV-cache leak and a stall flagged")
	shadowRequests := fs.Int("shadow-requests", 96, "requests of the shadow phase (0: no shadow phase): a slower, flakier candidate is mirrored and judged")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice demo [--requests N] [--turns T] [--concurrency C] [--max-tokens T] [--slo S] [-v]

Starts two simulated model servers and the gateway in this process on free loopback ports,
sends a streaming multi-turn chat workload through the gateway with the load injector (the
one behind 'sluice load'), and prints per-route results (requests, errors, tokens, TTFT and
inter-token latency percentiles), then goodput, SLO attainment, context fidelity across
turns and the injector's scheduling lag. Then a chaos phase: aborts, stalls before the first
token, streams cut mid-way and malformed chunks on the primary while the same workload runs,
and a table of the faults injected against what the client saw (fallbacks, resumed streams).
Then the output side: answers that fall into a loop are cut within a bounded number of tokens
(the upstream request cancelled), the model's confidence is measured from logprobs the
gateway asks for and strips, and a KV-cache leak and then a stall planted on one of the small
model's two servers are flagged, that server picked less until it recovers.
Last a shadow phase: a new config (applied live) mirrors the llama route to a candidate
server that is slower to the first token and fails 5% of requests; the pairs are compared
and the promote / hold / rollback verdict is printed with its evidence.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *requests < 1 || *turns < 1 || *concurrency < 1 || *maxTokens < 1 {
		return errors.New("--requests, --turns, --concurrency and --max-tokens must be at least 1")
	}
	sloLimits, err := load.ParseSLO(*slo)
	if err != nil {
		return err
	}

	sims, err := startDemoSims()
	if err != nil {
		return err
	}
	defer sims.stop()
	primary, fallback, small := sims.primary, sims.fallback, sims.small
	addrs := map[string]string{"Primary": primary.addr, "Fallback": fallback.addr, "Small": small.addr, "Small2": sims.small2.addr}
	cfg, err := demoConfigFor(addrs)
	if err != nil {
		return err
	}
	logLevel := slog.LevelWarn
	if *verbose {
		logLevel = slog.LevelInfo
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Version: version,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel}))})
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	fmt.Fprintf(stdout, "sluice demo: gateway on http://%s (admin http://%s)\n", srv.Addr(), srv.AdminAddr())
	fmt.Fprintf(stdout, "  simulators: llama-3-8b-sim on %s (fallback %s), qwen-small-sim on %s\n", primary.addr, fallback.addr, small.addr)

	sessions, nTurns, err := demoWorkload(ctx, stdout, srv, *requests, *turns, *concurrency, *maxTokens, *slo, sloLimits)
	if err != nil {
		return err
	}
	if *chaosPhase {
		if err := demoChaos(ctx, stdout, srv, sessions, nTurns, *concurrency, *maxTokens, sloLimits); err != nil {
			return err
		}
	}
	if *outputPhase {
		if err := demoOutputSide(ctx, stdout, srv, sims); err != nil {
			return err
		}
	}
	if *shadowRequests > 0 {
		if err := demoShadow(ctx, stdout, srv, addrs, *shadowRequests, nTurns, *concurrency, *maxTokens, sloLimits); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nmetrics: http://%s/metrics was live during the run; try `sluice serve --upstream URL` and `sluice load --target URL` next.\n", srv.AdminAddr())
	return nil
}

// demoSims are the demo's model servers: a larger model that slows down as its batch grows,
// its fallback, and a small fast one.
type demoSims struct{ primary, fallback, small, small2 *runningSim }

func (d *demoSims) stop() {
	for _, r := range []*runningSim{d.primary, d.fallback, d.small, d.small2} {
		if r != nil {
			r.stop()
		}
	}
}

// startDemoSims starts the three simulators on free loopback ports.
func startDemoSims() (d *demoSims, err error) {
	d = &demoSims{}
	defer func() {
		if err != nil {
			d.stop()
		}
	}()
	if d.primary, err = startSim(sim.Config{Model: "llama-3-8b-sim", TTFT: 40 * time.Millisecond, PrefillPerToken: 20 * time.Microsecond,
		ITL: 8 * time.Millisecond, ITLPerRunning: 500 * time.Microsecond, MaxRunning: 8, Seed: 1}); err != nil {
		return nil, err
	}
	// The fallback serves the same model, so a stream resumed there reads as the uncut one.
	if d.fallback, err = startSim(sim.Config{Model: "llama-3-8b-sim", TTFT: 40 * time.Millisecond, PrefillPerToken: 20 * time.Microsecond,
		ITL: 8 * time.Millisecond, ITLPerRunning: 500 * time.Microsecond, MaxRunning: 8, Seed: 3}); err != nil {
		return nil, err
	}
	if d.small, err = startSim(sim.Config{Model: "qwen-small-sim", TTFT: 15 * time.Millisecond, ITL: 3 * time.Millisecond,
		MaxRunning: 16, Seed: 2}); err != nil {
		return nil, err
	}
	// The small model's second server: the output-side phase plants a KV-cache leak on it.
	if d.small2, err = startSim(sim.Config{Model: "qwen-small-sim", TTFT: 15 * time.Millisecond, ITL: 3 * time.Millisecond,
		MaxRunning: 16, Seed: 5}); err != nil {
		return nil, err
	}
	return d, nil
}

// demoWorkload is the demo's first phase: the load injector's multi-turn sessions through
// each route, side by side, and the per-route results. It returns the sessions and turns it
// ran, which the chaos phase repeats.
func demoWorkload(ctx context.Context, stdout io.Writer, srv *proxy.Server, requests, turns, concurrency, maxTokens int,
	slo string, sloLimits load.SLO) (sessions, nTurns int, err error) {
	// The workload is the load injector's (test/load): multi-turn sessions, each turn carrying
	// the whole history and a [[mem:...]] marker that later answers must repeat (the
	// simulators echo every marker they see, so any loss is the gateway's doing). One run per
	// route, side by side, so each route reports on its own.
	nTurns = min(turns, requests)
	sessions = (requests + nTurns - 1) / nTurns
	routes := []demoRoute{{route: "chat-llama", model: "llama-3-8b-sim"}, {route: "chat-small", model: "small"}}
	if sessions < len(routes) {
		routes = routes[:sessions]
	}
	for i := range routes {
		routes[i].sessions = sessions / len(routes)
		if i < sessions%len(routes) {
			routes[i].sessions++
		}
	}
	fmt.Fprintf(stdout, "  workload: %d multi-turn sessions × %d turns (%d streaming chat requests), %d sessions at a time, max_tokens %d, SLO %s, sluice load injector\n\n",
		sessions, nTurns, sessions*nTurns, concurrency, maxTokens, slo)

	var wg sync.WaitGroup
	start := time.Now()
	for i := range routes {
		r := &routes[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp, err := load.ParseSessions(fmt.Sprintf("n=%d,turns=%d,in=uniform:40:120,out=fixed:%d,think=gamma:2:10ms", r.sessions, nTurns, maxTokens))
			if err != nil {
				r.err = err
				return
			}
			r.report, r.err = load.Run(ctx, load.Config{
				Target: "http://" + srv.Addr(), Model: r.model, APIKey: "sk-demo", Workload: &load.Workload{Sessions: sp},
				Concurrency: max(1, concurrency/len(routes)), SLO: sloLimits, Seed: uint64(i + 1), Timeout: 30 * time.Second,
			})
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var reps []*load.Report
	for _, r := range routes {
		if r.report == nil {
			return 0, 0, fmt.Errorf("%s: %w", r.route, r.err)
		}
		reps = append(reps, r.report)
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	all, err := load.Merge(reps...)
	if err != nil {
		return 0, 0, err
	}
	printDemo(stdout, routes, all, elapsed)
	return sessions, nTurns, nil
}

// demoConfigFor renders the embedded config with the simulators' addresses.
func demoConfigFor(addrs map[string]string) (*config.Config, error) {
	var yml bytes.Buffer
	if err := template.Must(template.New("demo").Parse(demoConfig)).Execute(&yml, addrs); err != nil {
		return nil, err
	}
	cfg, err := config.Parse(yml.Bytes())
	if err != nil {
		return nil, err
	}
	cfg.Source = "embedded demo config"
	return cfg, nil
}

// demoShadow mirrors the llama route to a deliberately worse candidate (prefill twice as slow,
// 5% of requests failing) and to a baseline (the primary's version in a sandbox of the same
// size), runs the workload again and prints the shadow report.
func demoShadow(ctx context.Context, w io.Writer, srv *proxy.Server, addrs map[string]string, requests, turns, concurrency, maxTokens int, slo load.SLO) error {
	cand, err := startSim(sim.Config{Model: "llama-3-8b-sim", TTFT: 80 * time.Millisecond, PrefillPerToken: 20 * time.Microsecond,
		ITL: 8 * time.Millisecond, ITLPerRunning: 500 * time.Microsecond, MaxRunning: 8, ErrorRate5xx: 0.05, Seed: 4})
	if err != nil {
		return fmt.Errorf("shadow phase: %w", err)
	}
	defer cand.stop()
	base, err := startSim(sim.Config{Model: "llama-3-8b-sim", TTFT: 40 * time.Millisecond, PrefillPerToken: 20 * time.Microsecond,
		ITL: 8 * time.Millisecond, ITLPerRunning: 500 * time.Microsecond, MaxRunning: 8, Seed: 5})
	if err != nil {
		return fmt.Errorf("shadow phase: %w", err)
	}
	defer base.stop()
	with := map[string]string{"Candidate": cand.addr, "Baseline": base.addr}
	for k, v := range addrs {
		with[k] = v
	}
	cfg, err := demoConfigFor(with)
	if err != nil {
		return fmt.Errorf("shadow phase: %w", err)
	}
	cfg.Source = "embedded demo config, chat-llama mirrored"
	if err := srv.Apply(cfg); err != nil {
		return fmt.Errorf("shadow phase: %w", err)
	}
	turns = min(turns, requests)
	sessions := (requests + turns - 1) / turns
	fmt.Fprintf(w, "\nshadow phase: config applied live; chat-llama mirrors every session to llama-candidate (prefill\n")
	fmt.Fprintf(w, "  twice as slow, 5%% of requests fail) and, at the same moment, to llama-baseline (the primary's version in a\n")
	fmt.Fprintf(w, "  sandbox of the candidate's size): the candidate is judged against the baseline; %d sessions × %d turns\n\n", sessions, turns)
	sp, err := load.ParseSessions(fmt.Sprintf("n=%d,turns=%d,in=uniform:40:120,out=fixed:%d,think=gamma:2:10ms", sessions, turns, maxTokens))
	if err != nil {
		return err
	}
	rep, err := load.Run(ctx, load.Config{
		Target: "http://" + srv.Addr(), Model: "llama-3-8b-sim", APIKey: "sk-demo", Workload: &load.Workload{Sessions: sp},
		Concurrency: max(1, concurrency), SLO: slo, Seed: 11, Timeout: 30 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("shadow phase: %w", err)
	}
	// The last copies finish shortly after their primaries: wait until the pair count settles.
	var last int64 = -1
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		r, err := srv.ShadowReport(ctx, false)
		if err != nil {
			return fmt.Errorf("shadow phase: %w", err)
		}
		n := int64(0)
		for _, rr := range r.Routes {
			n += rr.Samples.PairsTotal + rr.Mirror.Dropped
		}
		if n == last && n >= int64(rep.Requests) {
			break
		}
		last = n
		time.Sleep(200 * time.Millisecond)
	}
	report, err := srv.ShadowReport(ctx, true)
	if err != nil {
		return fmt.Errorf("shadow phase: %w", err)
	}
	fmt.Fprintf(w, "clients: %d requests, %d ok, %d failed (the primary served them all; the candidate saw copies)\n\n", rep.Requests, rep.OK, rep.Failed+rep.Aborted)
	if err := report.WriteText(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "the same report: http://%s/admin/shadow (HTML), /admin/shadow.json; `sluice shadow report --admin http://%s`\n", srv.AdminAddr(), srv.AdminAddr())
	return nil
}

type demoRoute struct {
	route, model string
	sessions     int
	report       *load.Report
	err          error
}

// demoChaos runs the workload again on the llama route with faults on its primary cluster and
// prints what was injected against what the clients saw.
func demoChaos(ctx context.Context, w io.Writer, srv *proxy.Server, sessions, turns, concurrency, maxTokens int, slo load.SLO) error {
	pct := func(v float64) *float64 { return &v }
	faults := []fault.Spec{
		{ID: "abort-503", Kind: fault.KindAbort, Cluster: "llama-primary", Percent: pct(10), Status: 503},
		{ID: "stall-first-token", Kind: fault.KindTTFT, Cluster: "llama-primary", Percent: pct(5), For: fault.Duration(3 * time.Second)},
		{ID: "cut-mid-stream", Kind: fault.KindCut, Cluster: "llama-primary", Percent: pct(10), AfterEvents: 10, Mode: "reset"},
		{ID: "malformed-chunk", Kind: fault.KindMalformed, Cluster: "llama-primary", Percent: pct(5), At: 5},
	}
	if err := srv.Chaos().Set(faults); err != nil {
		return fmt.Errorf("chaos phase: %w", err)
	}
	defer srv.Chaos().Clear()
	fmt.Fprintf(w, "\nchaos phase: %d sessions on chat-llama with faults on llama-primary (10%% abort 503, 5%% first token held 3s\n", sessions)
	fmt.Fprintf(w, "  against a 1s TTFT time-out, 10%% streams reset after 10 events, 5%% a malformed chunk); fallback llama-fallback, resume on\n\n")
	sp, err := load.ParseSessions(fmt.Sprintf("n=%d,turns=%d,in=uniform:40:120,out=fixed:%d,think=gamma:2:10ms", sessions, turns, maxTokens))
	if err != nil {
		return err
	}
	rep, err := load.Run(ctx, load.Config{
		Target: "http://" + srv.Addr(), Model: "llama-3-8b-sim", APIKey: "sk-demo", Workload: &load.Workload{Sessions: sp},
		Concurrency: max(1, concurrency), SLO: slo, Seed: 7, Timeout: 30 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("chaos phase: %w", err)
	}
	fmt.Fprintln(w, srv.Chaos().Report().String())
	fmt.Fprintf(w, "clients: %d requests, %d ok, %d failed; %d served after a retry or fallback; context fidelity %.1f%%\n",
		rep.Requests, rep.OK, rep.Failed+rep.Aborted, rep.Recovered, 100*rep.Summary.ContextFidelity)
	return nil
}

func printDemo(w io.Writer, routes []demoRoute, all *load.Report, elapsed time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\trequests\terrors\ttokens\tTTFT p50\tTTFT p95\tTTFT p99\tITL p50\tITL p99\t")
	for _, rt := range routes {
		r := rt.report
		t, i := r.Summary.Latency[load.HTTFT], r.Summary.Latency[load.HITL]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", rt.route, r.Requests, r.Failed+r.Aborted, r.OutputTokens,
			ms(t.P50), ms(t.P95), ms(t.P99), ms(i.P50), ms(i.P99))
	}
	_ = tw.Flush()
	s := all.Summary
	fmt.Fprintf(w, "\n%d requests in %s (%.1f req/s, %.0f output tok/s)\n", all.Requests, elapsed.Round(time.Millisecond),
		float64(all.Requests)/elapsed.Seconds(), s.OutTokPerS)
	if s.Attainment != nil {
		fmt.Fprintf(w, "goodput %.2f req/s; SLO attainment all %.1f%% (ttft %.1f%%, itl %.1f%%)\n", s.Goodput,
			100*s.Attainment["all"], 100*s.Attainment["ttft"], 100*s.Attainment["itl"])
	}
	if all.MarkersExpected > 0 {
		fmt.Fprintf(w, "context fidelity %.1f%% (%d of %d markers from earlier turns repeated)\n", 100*s.ContextFidelity,
			all.MarkersFound, all.MarkersExpected)
	}
	if lag, ok := s.Latency[load.HLag]; ok {
		fmt.Fprintf(w, "injector scheduling lag p50 %.3f ms, p99 %.3f ms\n", lag.P50, lag.P99)
	}
	n := 0
	for _, e := range all.Samples {
		if n == 5 {
			break
		}
		fmt.Fprintf(w, "error: %dx %s %d: %s\n", e.Count, e.Class, e.Status, e.Message)
		n++
	}
}

func ms(v float64) string { return fmt.Sprintf("%.1fms", v) }

type runningSim struct {
	addr string
	srv  *http.Server
	sim  *sim.Server
	done chan struct{}
}

func startSim(c sim.Config) (*runningSim, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := sim.New(c)
	rs := &runningSim{addr: ln.Addr().String(), sim: s, done: make(chan struct{}),
		srv: &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(rs.done)
		_ = rs.srv.Serve(ln)
	}()
	return rs, nil
}

func (r *runningSim) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
	<-r.done
	r.sim.Close()
}
