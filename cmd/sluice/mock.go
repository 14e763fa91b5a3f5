package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sluicegw/sluice/test/sim"
)

func runMock(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("mock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c sim.Config
	listen := fs.String("listen", "127.0.0.1:8000", "listen address")
	fs.StringVar(&c.Model, "model", "sim-llama", "served model name")
	fs.DurationVar(&c.TTFT, "ttft", 0, "fixed prefill latency per request at no load (time to first token)")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", 0, "extra prefill time per prompt token")
	fs.DurationVar(&c.ITL, "itl", 0, "decode step time at batch size 1: the delay per output token")
	fs.DurationVar(&c.ITLPerRunning, "itl-per-running", 0, "extra decode step time per additional running sequence")
	fs.IntVar(&c.MaxRunning, "max-running", 256, "max concurrently running sequences (more wait in a queue)")
	fs.IntVar(&c.KVTokens, "kv-tokens", 1<<20, "KV cache capacity in tokens")
	fs.IntVar(&c.TokensPerEvent, "tokens-per-event", 1, "output tokens per SSE event")
	fs.IntVar(&c.MaxTokensDefault, "default-max-tokens", 64, "output length when a request gives no max_tokens")
	fs.IntVar(&c.MaxModelLen, "max-model-len", 32768, "context window: prompt + max_tokens above it is a 400")
	fs.Float64Var(&c.ErrorRate5xx, "error-rate", 0, "share of requests answered with a 5xx")
	fs.Float64Var(&c.ErrorRate429, "rate-limit-rate", 0, "share of requests answered with a 429")
	fs.DurationVar(&c.Delay, "delay", 0, "fixed extra delay before each request is processed")
	fs.DurationVar(&c.DelayJitter, "delay-jitter", 0, "uniform random extra delay up to this")
	fs.Float64Var(&c.TimeScale, "time-scale", 1, "multiplies every simulated duration (0.1 = ten times faster)")
	fs.Int64Var(&c.Seed, "seed", 1, "seed for error injection and jitter")
	fs.Float64Var(&c.LogprobTemperature, "logprob-temperature", 1, "flattens the simulated logprobs (above 1: a model less sure of itself)")
	fs.IntVar(&c.LeakKVPerRequest, "kv-leak-per-request", 0, "KV-cache tokens each finished sequence leaves in use, never freed (a leaking server, for the gateway's state checks)")
	fs.Float64Var(&c.Slowdown, "slowdown", 1, "multiplies every engine step's time (a server that stalls: throughput falls while requests queue; needs some simulated latency)")
	fs.BoolVar(&c.NoHealth, "no-health", false, "answer GET /health with 404, like servers that have none (Ollama, some proxies); /v1/models keeps working")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: sluice mock [--listen ADDR] [--ttft D] [--itl D] [--max-running N] [--kv-tokens N] [--model NAME] [flags]

Runs a simulated OpenAI-compatible model server that behaves like a vLLM instance: chat,
completions, the Responses API (/v1/responses), embeddings, models, /health and vLLM's
/metrics; deterministic answers; a performance model with a running batch, a KV cache and a
waiting queue, so TTFT rises under load as on a real server. Per-request test knobs travel as
x-sim-* headers (see go doc github.com/sluicegw/sluice/test/sim).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	s := sim.New(c)
	defer s.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stderr, "sluice mock: serving model %q on http://%s\n", c.Model, ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	<-errc
	return nil
}
