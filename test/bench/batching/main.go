// Command batching measures what adaptive batching of embeddings (policy/batch) buys against
// a simulated embedding server whose cost is a fixed time per request plus a time per input
// (test/sim EmbedRequestCost, EmbedItemCost; one engine, requests take it in turn). It
// offers open-loop Poisson load of single-input /v1/embeddings requests at a sweep of rates,
// once straight to the simulator and once through a Batcher, and reports for each rate the
// throughput answered and the latency percentiles. The headline is the highest throughput
// each mode sustains with p99 within the SLO.
//
//	go run ./test/bench/batching [-slo 250ms] [-duration 3s] [-request-cost 20ms] [-item-cost 1ms]
//	                             [-max-items 64] [-max-in-flight 1] [-target-latency 100ms]
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/batch"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/test/sim"
)

func main() {
	slo := flag.Duration("slo", 250*time.Millisecond, "p99 latency objective")
	dur := flag.Duration("duration", 3*time.Second, "load duration per rate")
	reqCost := flag.Duration("request-cost", 20*time.Millisecond, "simulator EmbedRequestCost")
	itemCost := flag.Duration("item-cost", time.Millisecond, "simulator EmbedItemCost")
	direct := flag.String("direct-rates", "20,30,40,45", "offered rates (req/s) without batching")
	batched := flag.String("batched-rates", "100,200,400,600", "offered rates (req/s) with batching")
	target := flag.Duration("target-latency", 100*time.Millisecond, "batch target_latency")
	maxItems := flag.Int("max-items", 64, "batch max_items")
	inFlight := flag.Int("max-in-flight", 1, "batch max_in_flight (the simulator has one engine)")
	flag.Parse()

	srv := sim.New(sim.Config{EmbedRequestCost: *reqCost, EmbedItemCost: *itemCost})
	defer srv.Close()
	ts := httptest.NewServer(srv)
	defer ts.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096}}
	send := func(ctx context.Context, body []byte) (int, http.Header, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/embeddings", bytes.NewReader(body))
		if err != nil {
			return 0, nil, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b, err
	}

	fmt.Printf("simulator: EmbedRequestCost %v, EmbedItemCost %v; single-input requests, Poisson arrivals, %v per rate; SLO p99 <= %v\n\n",
		*reqCost, *itemCost, *dur, *slo)
	fmt.Println("| mode | offered req/s | answered req/s | p50 | p99 | errors | mean items/batch | window end |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	best := map[string]float64{}
	for _, mode := range []string{"direct", "batched"} {
		rates := *direct
		if mode == "batched" {
			rates = *batched
		}
		for _, f := range strings.Split(rates, ",") {
			rate, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || rate <= 0 {
				fmt.Fprintln(os.Stderr, "bad rate", f)
				os.Exit(2)
			}
			var b *batch.Batcher
			if mode == "batched" {
				b, err = batch.New(batch.Params{
					MinWindow: policy.Duration(time.Millisecond), MaxWindow: policy.Duration(50 * time.Millisecond),
					TargetLatency: policy.Duration(*target), Increase: policy.Duration(time.Millisecond),
					MaxItems: *maxItems, MaxInFlight: *inFlight,
				}, nil)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
			}
			r := run(rate, *dur, b, send)
			extra := "-"
			window := "-"
			if b != nil {
				b.Close()
				s := b.Stats()
				extra = fmt.Sprintf("%.1f", s.ItemsPerBatch())
				window = s.Window.String()
			}
			fmt.Printf("| %s | %.0f | %.1f | %v | %v | %d | %s | %s |\n", mode, rate, r.throughput,
				r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.errors, extra, window)
			if r.p99 <= *slo && r.errors == 0 && r.throughput > best[mode] {
				best[mode] = r.throughput
			}
			time.Sleep(200 * time.Millisecond) // let the engine drain
		}
	}
	fmt.Printf("\nbest throughput with p99 <= %v: direct %.1f req/s, batched %.1f req/s", *slo, best["direct"], best["batched"])
	if best["direct"] > 0 {
		fmt.Printf(" (%.1fx)", best["batched"]/best["direct"])
	}
	fmt.Println()
}

type result struct {
	throughput float64
	p50, p99   time.Duration
	errors     int
}

// run offers Poisson arrivals at rate for d and waits for every answer (each bounded by a
// 10 s time-out, which counts as an error).
func run(rate float64, d time.Duration, b *batch.Batcher, send batch.Send) result {
	rng := rand.New(rand.NewPCG(1, 2))
	var (
		mu   sync.Mutex
		lats []time.Duration
		errs int
		wg   sync.WaitGroup
	)
	start := time.Now()
	next := start
	for i := 0; ; i++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if next.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(next))
		body := []byte(fmt.Sprintf(`{"model":"sim-llama","input":"document number %d about rivers and mountains"}`, i))
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			t0 := time.Now()
			var st int
			var err error
			if b == nil {
				st, _, _, err = send(ctx, body)
			} else {
				req, perr := openai.ParseRequest(openai.KindEmbedding, body)
				if perr != nil {
					panic(perr)
				}
				st, _, _, err = b.Do(ctx, req, "bench", send)
			}
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || st != http.StatusOK {
				errs++
				return
			}
			lats = append(lats, lat)
		})
	}
	wg.Wait()
	el := time.Since(start)
	slices.Sort(lats)
	pct := func(q float64) time.Duration {
		if len(lats) == 0 {
			return 0
		}
		return lats[min(len(lats)-1, int(q*float64(len(lats))))]
	}
	return result{throughput: float64(len(lats)) / el.Seconds(), p50: pct(0.5), p99: pct(0.99), errors: errs}
}
