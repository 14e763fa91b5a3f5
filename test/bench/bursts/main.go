// Command bursts sends bursts of concurrent streams, each burst after a quiet gap, and
// prints the TTFT percentiles over all of them: what a gateway that sizes itself to the load
// (the adaptive processors of proxy/procs) gives the first requests of a burst that finds it
// idle. test/bench/bursts.sh runs it against builds in turn.
//
//	go run ./test/bench/bursts [--streams 200] [--bursts 8] [--gap 2.5s] [--tokens 64] URL
//
// TTFT is from the request sent to the first event with non-empty content; a stream that
// does not end with data: [DONE] counts as failed. Every wait is bounded (--timeout a burst).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicegw/sluice/test/bench/chatstream"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bursts:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("bursts", flag.ContinueOnError)
	streams := fs.Int("streams", 200, "concurrent streams a burst")
	bursts := fs.Int("bursts", 8, "bursts")
	gap := fs.Duration("gap", 2500*time.Millisecond, "quiet between two bursts")
	tokens := fs.Int("tokens", 64, "tokens a stream (max_tokens, ignore_eos)")
	timeout := fs.Duration("timeout", time.Minute, "the longest a burst may take")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *streams < 1 || *streams > 5000 || *bursts < 1 || *bursts > 1000 || *tokens < 1 {
		return errors.New("usage: bursts [--streams 1..5000] [--bursts 1..1000] [--gap D] [--tokens N] URL")
	}
	base := strings.TrimSuffix(fs.Arg(0), "/")
	tr := &http.Transport{MaxIdleConns: *streams, MaxIdleConnsPerHost: *streams, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := fmt.Appendf(nil, `{"model":"sim-llama","messages":[{"role":"user","content":"Write about the sea."}],"max_tokens":%d,"ignore_eos":true,"stream":true}`, *tokens)
	var (
		mu       sync.Mutex
		ttfts    []time.Duration
		failed   int
		firstErr error
	)
	for b := range *bursts {
		if b > 0 {
			time.Sleep(*gap)
		}
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		var wg sync.WaitGroup
		for range *streams {
			wg.Go(func() {
				ttft, err := chatstream.TTFT(ctx, client, base, body)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if failed++; firstErr == nil {
						firstErr = err
					}
					return
				}
				ttfts = append(ttfts, ttft)
			})
		}
		wg.Wait()
		cancel()
	}
	if len(ttfts) == 0 {
		return fmt.Errorf("every one of %d streams failed, the first with: %w", failed, firstErr)
	}
	slices.Sort(ttfts)
	q := func(p int) float64 { return float64(ttfts[min(len(ttfts)-1, len(ttfts)*p/100)]) / 1e6 }
	fmt.Printf("TTFT p50 %.1f ms p90 %.1f ms p99 %.1f ms (%d streams, %d failed)\n", q(50), q(90), q(99), len(ttfts), failed)
	if firstErr != nil {
		fmt.Printf("the first failure: %v\n", firstErr)
	}
	return nil
}
