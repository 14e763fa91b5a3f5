package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestEmbedCostValidate(t *testing.T) {
	err := Config{EmbedRequestCost: -time.Millisecond, EmbedItemCost: -time.Millisecond}.Validate()
	if err == nil || !strings.Contains(err.Error(), "EmbedRequestCost") || !strings.Contains(err.Error(), "EmbedItemCost") {
		t.Fatalf("Validate = %v, want both fields named", err)
	}
	if c := (Config{EmbedRequestCost: -1}).withDefaults(); c.EmbedRequestCost != 0 {
		t.Fatalf("withDefaults kept a negative cost: %v", c.EmbedRequestCost)
	}
}

func TestEmbedCostModel(t *testing.T) {
	const req, item, scale = 20 * time.Millisecond, 2 * time.Millisecond, 0.5
	inputs := func(n int) []string {
		in := make([]string, n)
		for i := range in {
			in[i] = fmt.Sprintf("text %d", i)
		}
		return in
	}
	cases := []struct {
		name    string
		cfg     Config
		callers int // concurrent requests
		inputs  int // inputs per request
		min     time.Duration
	}{
		{"one request, one input", Config{EmbedRequestCost: req, EmbedItemCost: item, TimeScale: scale}, 1, 1, 11 * time.Millisecond},
		{"one request, 8 inputs", Config{EmbedRequestCost: req, EmbedItemCost: item, TimeScale: scale}, 1, 8, 18 * time.Millisecond},
		{"8 requests queue for the engine", Config{EmbedRequestCost: req, EmbedItemCost: item, TimeScale: scale}, 8, 1, 88 * time.Millisecond},
		{"scheduled path too", Config{EmbedRequestCost: req, EmbedItemCost: item, TimeScale: scale, TTFT: time.Millisecond}, 4, 1, 44 * time.Millisecond},
		{"no cost", Config{}, 8, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := start(t, tc.cfg)
			body := map[string]any{"input": inputs(tc.inputs)}
			var wg sync.WaitGroup
			errs := make(chan error, tc.callers)
			t0 := time.Now()
			for range tc.callers {
				wg.Go(func() {
					resp, err := send(context.Background(), ts, "/v1/embeddings", body, nil)
					if err != nil {
						errs <- err
						return
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						errs <- fmt.Errorf("status %d", resp.StatusCode)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if el := time.Since(t0); el < tc.min {
				t.Fatalf("%d requests of %d inputs took %v, want >= %v", tc.callers, tc.inputs, el, tc.min)
			}
		})
	}
}

func TestEmbedCostClientGone(t *testing.T) {
	s, ts := start(t, Config{EmbedRequestCost: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := send(ctx, ts, "/v1/embeddings", map[string]any{"input": "x"}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	waitFor(t, 2*time.Second, "cancelled counted", func() bool { return s.Stats().Cancelled == 1 })
}
