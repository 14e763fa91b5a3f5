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
	"sort"
	"sync"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

//go:embed demo.yaml
var demoConfig string

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	requests := fs.Int("requests", 64, "streaming requests to send through the gateway")
	concurrency := fs.Int("concurrency", 8, "requests in flight at once")
	maxTokens := fs.Int("max-tokens", 48, "max_tokens of each request")
	verbose := fs.Bool("v", false, "show the gateway's logs")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice demo [--requests N] [--concurrency C] [--max-tokens T] [-v]

Starts two simulated model servers and the gateway in this process on free loopback ports,
sends a streaming chat workload through the gateway with the official openai-go client, and
prints per-route results: requests, errors, tokens, TTFT and inter-token latency percentiles.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *requests < 1 || *concurrency < 1 || *maxTokens < 1 {
		return errors.New("--requests, --concurrency and --max-tokens must be at least 1")
	}

	// Two model servers: a larger model that slows down as its batch grows, and a small fast one.
	primary, err := startSim(sim.Config{Model: "llama-3-8b-sim", TTFT: 40 * time.Millisecond, PrefillPerToken: 20 * time.Microsecond,
		ITL: 8 * time.Millisecond, ITLPerRunning: 500 * time.Microsecond, MaxRunning: 8, Seed: 1})
	if err != nil {
		return err
	}
	defer primary.stop()
	small, err := startSim(sim.Config{Model: "qwen-small-sim", TTFT: 15 * time.Millisecond, ITL: 3 * time.Millisecond,
		MaxRunning: 16, Seed: 2})
	if err != nil {
		return err
	}
	defer small.stop()

	var yml bytes.Buffer
	if err := template.Must(template.New("demo").Parse(demoConfig)).Execute(&yml, map[string]string{
		"Primary": primary.addr, "Small": small.addr,
	}); err != nil {
		return err
	}
	cfg, err := config.Parse(yml.Bytes())
	if err != nil {
		return err
	}
	cfg.Source = "embedded demo config"
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
	fmt.Fprintf(stdout, "  simulators: llama-3-8b-sim on %s, qwen-small-sim on %s\n", primary.addr, small.addr)
	fmt.Fprintf(stdout, "  workload: %d streaming chat requests, %d at a time, max_tokens %d, official openai-go client\n\n",
		*requests, *concurrency, *maxTokens)

	client := openai.NewClient(option.WithBaseURL("http://"+srv.Addr()+"/v1/"), option.WithAPIKey("sk-demo"), option.WithMaxRetries(0))
	models := []struct{ route, model string }{{"chat-llama", "llama-3-8b-sim"}, {"chat-small", "small"}}
	results := make([]demoResult, *requests)
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, *concurrency)
	for i := range *requests {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			m := models[i%len(models)]
			results[i] = streamOnce(ctx, client, m.route, m.model, i, *maxTokens)
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	printDemo(stdout, results, elapsed)
	fmt.Fprintf(stdout, "\nmetrics: http://%s/metrics was live during the run; try `sluice serve --upstream URL` next.\n", srv.AdminAddr())
	return nil
}

type demoResult struct {
	route   string
	err     error
	tokens  int
	ttft    time.Duration
	gaps    []time.Duration
	elapsed time.Duration
}

func streamOnce(ctx context.Context, client openai.Client, route, model string, i, maxTokens int) demoResult {
	res := demoResult{route: route}
	t0 := time.Now()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: model,
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are a concise assistant."),
			openai.UserMessage(fmt.Sprintf("Request %d: summarise why gateways keep SLOs under bursts. [[mem:demo%d]]", i, i)),
		},
		MaxTokens:     openai.Int(int64(maxTokens)),
		Temperature:   openai.Float(0),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var last time.Time
	for stream.Next() {
		chunk := stream.Current()
		if len(chunk.Choices) == 0 || chunk.Choices[0].Delta.Content == "" {
			continue
		}
		now := time.Now()
		if last.IsZero() {
			res.ttft = now.Sub(t0)
		} else {
			res.gaps = append(res.gaps, now.Sub(last))
		}
		last = now
		res.tokens++
	}
	res.err = stream.Err()
	res.elapsed = time.Since(t0)
	return res
}

func printDemo(w io.Writer, results []demoResult, elapsed time.Duration) {
	byRoute := map[string][]demoResult{}
	var routes []string
	for _, r := range results {
		if _, ok := byRoute[r.route]; !ok {
			routes = append(routes, r.route)
		}
		byRoute[r.route] = append(byRoute[r.route], r)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "route\trequests\terrors\ttokens\tTTFT p50\tTTFT p95\tTTFT p99\tITL p50\tITL p99\t")
	var errs []string
	for _, name := range routes {
		rs := byRoute[name]
		var ttfts, gaps []time.Duration
		nerr, tokens := 0, 0
		for _, r := range rs {
			if r.err != nil {
				nerr++
				if len(errs) < 5 {
					errs = append(errs, fmt.Sprintf("%s: %v", name, r.err))
				}
				continue
			}
			ttfts = append(ttfts, r.ttft)
			gaps = append(gaps, r.gaps...)
			tokens += r.tokens
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, len(rs), nerr, tokens,
			ms(pct(ttfts, 50)), ms(pct(ttfts, 95)), ms(pct(ttfts, 99)), ms(pct(gaps, 50)), ms(pct(gaps, 99)))
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d requests in %s (%.1f req/s)\n", len(results), elapsed.Round(time.Millisecond), float64(len(results))/elapsed.Seconds())
	for _, e := range errs {
		fmt.Fprintln(w, "error:", e)
	}
}

// pct is the nearest-rank percentile of ds (it sorts ds).
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	k := int(float64(len(ds))*p/100+0.999999) - 1
	return ds[max(0, min(k, len(ds)-1))]
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

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
