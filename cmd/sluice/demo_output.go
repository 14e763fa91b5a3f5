package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/test/sim"
)

// demoOutputSide is the demo's output-side phase, on the small model's route (the runaway and
// confidence policies, demo.yaml) and its two servers: streams asked to fall into a loop are
// cut, ordinary ones are not; the confidence policy's reading of the answers; a KV-cache leak
// planted on the second server is flagged and the server picked less until it is freed.
func demoOutputSide(ctx context.Context, w io.Writer, srv *proxy.Server, sims *demoSims) error {
	fmt.Fprintln(w, "\noutput side: the small model's route cuts looping answers and reads the model's confidence; then a KV-cache leak and a stall on one of its two servers")
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	url := "http://" + srv.Addr() + "/v1/chat/completions"
	if err := demoRunaway(ctx, w, hc, url); err != nil {
		return err
	}
	if err := demoConfidence(ctx, w, hc, srv); err != nil {
		return err
	}
	if err := demoKVLeak(ctx, w, hc, srv, sims, url); err != nil {
		return err
	}
	return demoStall(ctx, w, hc, srv, sims.small2, "http://"+sims.small2.addr)
}

// demoRunaway sends 8 streams told to loop after 40 tokens and 8 ordinary ones at once
// (max_tokens 2048): the looping ones are cut, the ordinary ones are not.
func demoRunaway(ctx context.Context, w io.Writer, hc *http.Client, url string) error {
	const loops, ordinary, maxTokens = 8, 8, 2048
	type result struct {
		loop          bool
		tokens        int
		cut           bool
		finish        string
		elapsed       time.Duration
		err           error
		status        int
		doneSeen      bool
		logprobsShown bool
	}
	results := make([]result, loops+ordinary)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			r := &results[i]
			r.loop = i < loops
			body := fmt.Sprintf(`{"model":"small","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"Tell me about rivers, take %d."}]}`, maxTokens, i)
			if !r.loop {
				body = strings.Replace(body, fmt.Sprint(maxTokens), "256", 1)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			if err != nil {
				r.err = err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if r.loop {
				req.Header.Set(sim.HeaderLoopAfter, "40")
			}
			start := time.Now()
			resp, err := hc.Do(req)
			if err != nil {
				r.err = err
				return
			}
			defer resp.Body.Close()
			r.status = resp.StatusCode
			r.tokens, r.finish, r.cut, r.doneSeen, r.logprobsShown = readDemoStream(resp.Body)
			r.elapsed = time.Since(start)
		})
	}
	wg.Wait()
	var cutLoops, cutOrdinary, loopTokens int
	var loopTime time.Duration
	for _, r := range results {
		if r.err != nil || r.status != http.StatusOK || !r.doneSeen || r.logprobsShown {
			return fmt.Errorf("output side: a stream failed: status %d, err %v, [DONE] %v, logprobs shown to the client %v", r.status, r.err, r.doneSeen, r.logprobsShown)
		}
		switch {
		case r.loop && r.cut && r.finish == "length":
			cutLoops++
			loopTokens += r.tokens
			loopTime += r.elapsed
		case !r.loop && r.cut:
			cutOrdinary++
		}
	}
	avg := 0
	if cutLoops > 0 {
		avg = loopTokens / cutLoops
	}
	fmt.Fprintf(w, "  runaway: %d of %d looping streams cut with finish_reason \"length\" after %d tokens on average (max_tokens %d; %v each, the upstream request cancelled); %d of %d ordinary answers cut\n",
		cutLoops, loops, avg, maxTokens, (loopTime / time.Duration(max(cutLoops, 1))).Round(time.Millisecond), cutOrdinary, ordinary)
	return nil
}

// demoConfidence prints the confidence policy's reading of every streamed answer on the
// route so far.
func demoConfidence(ctx context.Context, w io.Writer, hc *http.Client, srv *proxy.Server) error {
	var view struct {
		Policies []struct {
			View struct {
				Sampled        uint64 `json:"sampled"`
				StrippedEvents uint64 `json:"stripped_events"`
				Series         []struct {
					Model        string `json:"model"`
					Tokens       uint64 `json:"tokens"`
					UnsureTokens uint64 `json:"unsure_tokens"`
					Spans        uint64 `json:"spans"`
					Entropy      struct {
						Count uint64  `json:"count"`
						Sum   float64 `json:"sum"`
					} `json:"entropy"`
				} `json:"series"`
			} `json:"view"`
		} `json:"policies"`
	}
	if err := demoAdminJSON(ctx, hc, srv, "/admin/policies?type=confidence", &view); err != nil {
		return err
	}
	for _, p := range view.Policies {
		for _, se := range p.View.Series {
			mean := 0.0
			if se.Entropy.Count > 0 {
				mean = se.Entropy.Sum / float64(se.Entropy.Count)
			}
			fmt.Fprintf(w, "  confidence: %d requests asked for logprobs by the gateway, stripped from %d events before the client saw them; %s: %d tokens, mean entropy %.2f nats, %.1f%% unsure tokens, %d low-confidence spans\n",
				p.View.Sampled, p.View.StrippedEvents, se.Model, se.Tokens, mean, 100*float64(se.UnsureTokens)/float64(max(se.Tokens, 1)), se.Spans)
		}
	}
	return nil
}

// demoKVLeak plants a KV-cache leak on the small model's second server (60% of its cache
// held with nothing running): the gateway flags it, picks it less, and clears the flag once
// the leak is freed.
func demoKVLeak(ctx context.Context, w io.Writer, hc *http.Client, srv *proxy.Server, sims *demoSims, url string) error {
	leaky := "http://" + sims.small2.addr
	before, err := demoPicks(ctx, hc, srv, url, leaky, 40)
	if err != nil {
		return err
	}
	sims.small2.sim.SetKVLeak(sim.DefaultKVTokens * 6 / 10)
	start := time.Now()
	flagged, err := demoWaitFlag(ctx, hc, srv, leaky, true, 15*time.Second)
	if err != nil {
		return err
	}
	took := time.Since(start)
	during, err := demoPicks(ctx, hc, srv, url, leaky, 40)
	if err != nil {
		return err
	}
	sims.small2.sim.SetKVLeak(0)
	start = time.Now()
	if _, err := demoWaitFlag(ctx, hc, srv, leaky, false, 15*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(w, "  state: %s flagged on the second server %v after the leak began (effective weight %.2f); it served %d of 40 requests while flagged (%d of 40 before); cleared %v after the leak was freed\n",
		strings.Join(flagged.Flags, ", "), took.Round(100*time.Millisecond), flagged.EffectiveWeight, during, before, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// demoStall stalls the second server under its own traffic (sent to it directly, as other
// gateways would): its engine stops while requests keep arriving, so its queue grows as its
// throughput falls to nothing; the gateway flags it, and clears the flag once it runs again.
func demoStall(ctx context.Context, w io.Writer, hc *http.Client, srv *proxy.Server, rs *runningSim, endpoint string) error {
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		rs.sim.SetSlowdown(1)
		wg.Wait()
	}()
	client := func() {
		defer wg.Done()
		for lctx.Err() == nil {
			req, err := http.NewRequestWithContext(lctx, http.MethodPost, "http://"+rs.addr+"/v1/chat/completions",
				strings.NewReader(`{"model":"qwen-small-sim","max_tokens":16,"messages":[{"role":"user","content":"steady"}]}`))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for range 12 { // steady traffic: throughput, no queue
		wg.Add(1)
		go client()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(1500 * time.Millisecond):
	}
	rs.sim.SetSlowdown(math.Inf(1)) // the engine stops
	for range 12 {                  // and requests keep coming: the queue grows
		wg.Add(1)
		go client()
	}
	start := time.Now()
	flagged, err := demoWaitFlag(ctx, hc, srv, endpoint, true, 15*time.Second)
	if err != nil {
		return err
	}
	took := time.Since(start)
	rs.sim.SetSlowdown(1)
	start = time.Now()
	if _, err := demoWaitFlag(ctx, hc, srv, endpoint, false, 20*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(w, "  state: %s flagged on the second server %v after its engine stopped with requests queueing (effective weight %.2f); cleared %v after it ran again\n",
		strings.Join(flagged.Flags, ", "), took.Round(100*time.Millisecond), flagged.EffectiveWeight, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// readDemoStream reads a chat stream: the content chunks, the last finish_reason, whether the
// runaway policy's comment ended it, whether [DONE] came and whether any chunk carried logprobs.
func readDemoStream(r io.Reader) (tokens int, finish string, cut, done, logprobs bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte(": sluice: runaway")):
			cut = true
		case bytes.Equal(line, []byte("data: [DONE]")):
			done = true
		case bytes.HasPrefix(line, []byte("data: {")):
			var c struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
					Logprobs     json.RawMessage `json:"logprobs"`
					FinishReason *string         `json:"finish_reason"`
				} `json:"choices"`
			}
			if json.Unmarshal(line[len("data: "):], &c) != nil {
				continue
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != "" {
					tokens++
				}
				if len(ch.Logprobs) > 0 && string(ch.Logprobs) != "null" {
					logprobs = true
				}
				if ch.FinishReason != nil && *ch.FinishReason != "" {
					finish = *ch.FinishReason
				}
			}
		}
	}
	return tokens, finish, cut, done, logprobs
}

// demoPicks sends n small non-streaming requests (8 at a time) and returns how many the
// endpoint served.
func demoPicks(ctx context.Context, hc *http.Client, srv *proxy.Server, url, endpoint string, n int) (int, error) {
	before, err := demoEndpoint(ctx, hc, srv, endpoint)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"model":"small","max_tokens":24,"messages":[{"role":"user","content":"count %d"}]}`, i)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- fmt.Errorf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("output side: %w", err)
	}
	after, err := demoEndpoint(ctx, hc, srv, endpoint)
	if err != nil {
		return 0, err
	}
	return int(after.Requests - before.Requests), nil
}

// demoWaitFlag waits (at most d) until the endpoint is flagged (or no longer is).
func demoWaitFlag(ctx context.Context, hc *http.Client, srv *proxy.Server, endpoint string, flagged bool, d time.Duration) (upstream.EndpointStatus, error) {
	deadline := time.Now().Add(d)
	for {
		st, err := demoEndpoint(ctx, hc, srv, endpoint)
		if err != nil {
			return st, err
		}
		if (len(st.Flags) > 0) == flagged {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("output side: the endpoint's flags are %v after %v", st.Flags, d)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// demoEndpoint is the endpoint's status from /admin/endpoints.
func demoEndpoint(ctx context.Context, hc *http.Client, srv *proxy.Server, endpoint string) (upstream.EndpointStatus, error) {
	var all map[string][]upstream.EndpointStatus
	if err := demoAdminJSON(ctx, hc, srv, "/admin/endpoints", &all); err != nil {
		return upstream.EndpointStatus{}, err
	}
	for _, eps := range all {
		if i := slices.IndexFunc(eps, func(e upstream.EndpointStatus) bool { return e.URL == endpoint }); i >= 0 {
			return eps[i], nil
		}
	}
	return upstream.EndpointStatus{}, errors.New("output side: no endpoint " + endpoint)
}

// demoAdminJSON decodes an admin API answer.
func demoAdminJSON(ctx context.Context, hc *http.Client, srv *proxy.Server, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.AdminAddr()+path, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", path, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
