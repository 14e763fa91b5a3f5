// Command bench measures the accuracy and speed of the load injector (test/load) and prints
// a markdown table, every figure marked met or not:
//
//	a. accuracy: against the simulator with a known TTFT and per-token delay at low load,
//	   the measured TTFT and ITL medians against the configured values (target: within 3%);
//	b. agreement with vegeta: non-streaming requests at the same fixed rate against the same
//	   simulator, sluice load and vegeta (as a library) alternating in this process, request
//	   counts and p50/p90/p99 latency (target: within 5%);
//	c. speed: the injector alone at 5,000 req/s non-streaming, and with 2,000 concurrent
//	   streams: achieved rate, in-flight streams and scheduling lag p99 (target < 1 ms).
//
// The simulators run as separate processes (the sluice binary, built into a temporary
// directory, `sluice mock`), so the injector's own process is what (c) measures. Everything
// binds 127.0.0.1; every phase is bounded in time.
//
//	go run ./test/load/bench [-duration 5s] [-out results.md]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluicegw/sluice/test/load"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type row struct {
	phase, figure, target, measured string
	met                             bool
}

var rows []row

func add(phase, figure, target, measured string, met bool) {
	rows = append(rows, row{phase, figure, target, measured, met})
	mark := "met"
	if !met {
		mark = "NOT MET"
	}
	logf("%s: %s = %s (target %s) %s", phase, figure, measured, target, mark)
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

func relDiff(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return (a - b) / b
}

func run() error {
	dur := flag.Duration("duration", 5*time.Second, "length of each measured run")
	out := flag.String("out", "", "also write the markdown table to this file")
	phases := flag.String("phases", "abc", "phases to run (a: accuracy, b: vegeta agreement, c: speed)")
	flag.Parse()
	if *dur < time.Second || *dur > time.Minute {
		return errors.New("-duration: between 1s and 1m")
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400) // as sluice load does
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute) // every phase is bounded; so is the whole
	defer cancel()

	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return errors.New("run from the sluice module: go run ./test/load/bench")
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	tmp, err := os.MkdirTemp("", "sluice-load-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "sluice")
	logf("building ./cmd/sluice into %s", tmp)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/sluice")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, b)
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = p.Process.Kill()
				<-done
			}
		}
	}()
	startSim := func(name string, args ...string) (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		ln.Close()
		logf, err := os.Create(filepath.Join(tmp, name+".log"))
		if err != nil {
			return "", err
		}
		cmd := exec.Command(bin, append([]string{"mock", "--listen", addr}, args...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			return "", err
		}
		procs = append(procs, cmd)
		url := "http://" + addr
		c := &http.Client{Timeout: time.Second}
		for i := 0; i < 200; i++ {
			if resp, err := c.Get(url + "/health"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return url, nil
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		b, _ := os.ReadFile(filepath.Join(tmp, name+".log"))
		return "", fmt.Errorf("simulator %s not ready: %s", name, b)
	}

	const ttft, itl = 50 * time.Millisecond, 10 * time.Millisecond
	known, err := startSim("known", "--ttft", ttft.String(), "--itl", itl.String(), "--max-running", "1024")
	if err != nil {
		return err
	}
	fast, err := startSim("fast", "--max-running", "4096")
	if err != nil {
		return err
	}
	agree, err := startSim("agree", "--ttft", "5ms", "--itl", "5ms", "--max-running", "1024")
	if err != nil {
		return err
	}
	streams, err := startSim("streams", "--itl", "200ms", "--max-running", "8192")
	if err != nil {
		return err
	}

	// a. accuracy at low load: 2 req/s at constant gaps, each request 50 ms + 31 × 10 ms, so
	// no two overlap (the simulator's steps are shared by the whole batch)
	if strings.Contains(*phases, "a") {
		sp, _ := load.ParseSynthetic("in=fixed:64,out=fixed:32")
		r, err := load.Run(ctx, load.Config{Target: known, Workload: &load.Workload{Synthetic: sp}, Rate: 2,
			Arrival: load.ArrivalConstant, Requests: 20, Seed: 1})
		if err != nil {
			return err
		}
		s := r.Summary
		ok := r.OK == r.Requests && r.Requests > 0
		add("a", "requests ok", "all", fmt.Sprintf("%d of %d", r.OK, r.Requests), ok)
		t, i := s.Latency[load.HTTFT].P50, s.Latency[load.HITL].P50
		add("a", "TTFT p50 (20 requests at 2/s, 32 tokens each)", fmt.Sprintf("%v ± 3%%", ttft), fmt.Sprintf("%.2f ms (%+.1f%%)", t, 100*relDiff(t, ms(ttft))), within(t, ms(ttft), 0.03))
		add("a", "ITL p50", fmt.Sprintf("%v ± 3%%", itl), fmt.Sprintf("%.2f ms (%+.1f%%)", i, 100*relDiff(i, ms(itl))), within(i, ms(itl), 0.03))
		tp := s.Latency[load.HTPOT].P50
		add("a", "TPOT p50", fmt.Sprintf("%v ± 3%%", itl), fmt.Sprintf("%.2f ms (%+.1f%%)", tp, 100*relDiff(tp, ms(itl))), within(tp, ms(itl), 0.03))
	}

	// b. agreement with vegeta, alternating in this process, against a simulator with
	// TTFT 5 ms and ITL 5 ms (batching spreads the latencies)
	if strings.Contains(*phases, "b") {
		const rate = 50
		n := int(rate * dur.Seconds())
		synth, err := load.NewSynth()
		if err != nil {
			return err
		}
		prompt := synth.Text(64, nil, 1)
		known := agree
		body := fmt.Appendf(nil, `{"model":"","messages":[{"role":"user","content":%q}],"max_tokens":16,"ignore_eos":true,"stream":false}`, prompt)
		sp, _ := load.ParseSynthetic("in=fixed:64,out=fixed:16")
		var vegLat []time.Duration
		var ours *load.Report
		oursN, vegN, oursOK, vegOK := 0, 0, 0, 0
		const rounds = 2
		for round := range rounds {
			r, err := load.Run(ctx, load.Config{Target: known, Workload: &load.Workload{Synthetic: sp}, Rate: rate,
				Arrival: load.ArrivalConstant, Requests: n, NoStream: true, Seed: uint64(round + 1)})
			if err != nil {
				return err
			}
			if ours == nil {
				ours = r
			} else if ours, err = load.Merge(ours, r); err != nil {
				return err
			}
			oursN += int(r.Requests)
			oursOK += int(r.OK)
			logf("b: round %d sluice load: %d requests, p50 %.2f ms", round+1, r.Requests, r.Summary.Latency[load.HE2E].P50)
			lat, ok := attack(ctx, known+"/v1/chat/completions", body, rate, *dur)
			vegLat = append(vegLat, lat...)
			vegN += len(lat)
			vegOK += ok
			logf("b: round %d vegeta: %d requests", round+1, len(lat))
		}
		add("b", fmt.Sprintf("requests (%d rounds × %v at %d/s)", rounds, *dur, rate), "equal ± 5%",
			fmt.Sprintf("sluice %d (ok %d), vegeta %d (ok %d)", oursN, oursOK, vegN, vegOK),
			within(float64(oursN), float64(vegN), 0.05) && oursOK == oursN && vegOK == vegN)
		slices.Sort(vegLat)
		for _, q := range []float64{50, 90, 99} {
			a := ms(ours.Hist[load.HE2E].Quantile(q))
			v := ms(quantile(vegLat, q/100))
			add("b", fmt.Sprintf("latency p%g", q), "equal ± 5%", fmt.Sprintf("sluice %.2f ms, vegeta %.2f ms (%+.1f%%)", a, v, 100*relDiff(a, v)), within(a, v, 0.05))
		}
	}

	// c1. speed: 5,000 req/s non-streaming
	if strings.Contains(*phases, "c") {
		const rate = 5000
		sp, _ := load.ParseSynthetic("in=fixed:32,out=fixed:8")
		cpu0 := cpuTime()
		r, err := load.Run(ctx, load.Config{Target: fast, Workload: &load.Workload{Synthetic: sp}, Rate: rate,
			Arrival: load.ArrivalConstant, Duration: *dur, NoStream: true, Seed: 1, Timeout: 10 * time.Second})
		if err != nil {
			return err
		}
		cpu := cpuTime() - cpu0
		s := r.Summary
		sent := float64(r.Requests) / dur.Seconds()
		add("c", fmt.Sprintf("5,000 req/s non-streaming, %v: achieved rate", *dur), "≥ 4,950 req/s, no errors",
			fmt.Sprintf("%.0f req/s sent, %.0f completed/s, %d errors", sent, s.ReqPerS, r.Failed), sent >= 4950 && s.ReqPerS >= 4950 && r.Failed == 0)
		lag := s.Latency[load.HLag]
		add("c", "5,000 req/s: scheduling lag p99", "< 1 ms", fmt.Sprintf("%.3f ms (p50 %.3f, max %.3f)", lag.P99, lag.P50, lag.Max), lag.P99 < 1)
		add("c", "5,000 req/s: injector CPU (info)", "-", fmt.Sprintf("%.2f CPUs of %d", cpu.Seconds()/s.DurationS, runtime.NumCPU()), true)
	}

	// c2. speed: 2,000 concurrent streams (open loop at 400 streams/s, each 25 tokens at 200 ms)
	if strings.Contains(*phases, "c") {
		const rate, out = 400, 25
		sp, _ := load.ParseSynthetic(fmt.Sprintf("in=fixed:32,out=fixed:%d", out))
		var peak atomic.Int64
		d := max(*dur, 5*time.Second) + 5*time.Second // 5 s to fill up, then steady
		cpu0 := cpuTime()
		r, err := load.Run(ctx, load.Config{Target: streams, Workload: &load.Workload{Synthetic: sp}, Rate: rate,
			Arrival: load.ArrivalConstant, Duration: d, Seed: 1, Timeout: 30 * time.Second,
			OnProgress: func(l load.Live) {
				if l.InFlight > peak.Load() {
					peak.Store(l.InFlight)
				}
			}})
		if err != nil {
			return err
		}
		cpu := cpuTime() - cpu0
		s := r.Summary
		add("c", fmt.Sprintf("streams: peak in flight (%g/s × %d tokens × 200 ms, %v)", float64(rate), out, d), "≥ 2,000, no errors",
			fmt.Sprintf("%d (%d requests, %d errors)", peak.Load(), r.Requests, r.Failed), peak.Load() >= 2000 && r.Failed == 0)
		lag := s.Latency[load.HLag]
		add("c", "streams: scheduling lag p99", "< 1 ms", fmt.Sprintf("%.3f ms (p50 %.3f, max %.3f)", lag.P99, lag.P50, lag.Max), lag.P99 < 1)
		add("c", "streams: ITL p50 / p99 (info; configured 200 ms)", "-", fmt.Sprintf("%.2f / %.2f ms", s.Latency[load.HITL].P50, s.Latency[load.HITL].P99), true)
		add("c", "streams: output tokens/s, injector CPU (info)", "-", fmt.Sprintf("%.0f tok/s, %.2f CPUs", s.OutTokPerS, cpu.Seconds()/s.DurationS), true)
	}

	var sb strings.Builder
	fmt.Fprintf(&sb, "Machine: %d CPUs, %s/%s, %s. Simulators: separate `sluice mock` processes; injector and vegeta: this process.\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Fprintln(&sb, "| phase | figure | target | measured | met |")
	fmt.Fprintln(&sb, "|---|---|---|---|---|")
	all := true
	for _, r := range rows {
		m := "yes"
		if !r.met {
			m, all = "**no**", false
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s |\n", r.phase, r.figure, r.target, r.measured, m)
	}
	fmt.Print(sb.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(sb.String()), 0o644); err != nil {
			return err
		}
	}
	if !all {
		fmt.Println("\nsome targets were not met")
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile is the nearest-rank quantile of sorted s.
func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

// attack runs vegeta at a constant rate for d and returns every latency and the successes.
func attack(ctx context.Context, url string, body []byte, rate int, d time.Duration) ([]time.Duration, int) {
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4096, DisableCompression: true}
	defer tr.CloseIdleConnections()
	atk := vegeta.NewAttacker(vegeta.Client(&http.Client{Transport: tr}), vegeta.Timeout(30*time.Second),
		vegeta.Workers(32), vegeta.MaxWorkers(4096), vegeta.MaxBody(-1))
	targeter := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodPost, URL: url, Body: body,
		Header: http.Header{"Content-Type": []string{"application/json"}}})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
			atk.Stop()
		case <-stop:
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	var lat []time.Duration
	ok := 0
	for res := range atk.Attack(targeter, vegeta.Rate{Freq: rate, Per: time.Second}, d, "vegeta") {
		lat = append(lat, res.Latency)
		if res.Code == 200 && res.Error == "" {
			ok++
		}
	}
	return lat, ok
}

// cpuTime is this process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
