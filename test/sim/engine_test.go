package sim

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// streamTTFT sends a streaming chat request and returns the time to its first event and the
// whole answer. Safe to call from any goroutine (reports with t.Error).
func streamTTFT(t *testing.T, ts *httptest.Server, body map[string]any) (time.Duration, []sseEvent) {
	b := map[string]any{"stream": true}
	for k, v := range body {
		b[k] = v
	}
	sent := time.Now()
	resp, err := send(context.Background(), ts, "/v1/chat/completions", b, nil)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer resp.Body.Close()
	evs, err := readSSE(resp.Body)
	if err != nil || len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
		t.Errorf("stream: %d events, %v", len(evs), err)
		return 0, evs
	}
	return evs[0].at.Sub(sent), evs
}

var waitingRe = regexp.MustCompile(`(?m)^vllm:num_requests_waiting\{model_name="sim-llama"\} (\S+)$`)

func TestQueueingRaisesTTFT(t *testing.T) {
	s, ts := start(t, Config{TTFT: 20 * time.Millisecond, ITL: 10 * time.Millisecond, MaxRunning: 2})
	body := chatBody("queue me", map[string]any{"max_tokens": 25, "ignore_eos": true})
	ttfts := make([]time.Duration, 6)
	var wg sync.WaitGroup
	wg.Go(func() { ttfts[0], _ = streamTTFT(t, ts, body) })
	waitFor(t, 5*time.Second, "the first request to run", func() bool { return s.Stats().Running >= 1 })
	for i := 1; i < len(ttfts); i++ {
		wg.Go(func() { ttfts[i], _ = streamTTFT(t, ts, body) })
	}
	sawWaiting := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !sawWaiting; time.Sleep(3 * time.Millisecond) {
		_, raw := get(t, ts, "/metrics")
		if m := waitingRe.FindSubmatch(raw); m != nil {
			v, _ := strconv.ParseFloat(string(m[1]), 64)
			sawWaiting = v > 0
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if !sawWaiting {
		t.Errorf("vllm:num_requests_waiting never rose above 0")
	}
	st := s.Stats()
	if st.PeakWaiting < 1 || st.PeakRunning != 2 || st.Completed != 6 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("stats %+v", st)
	}
	// With two slots and one taken, at least three of the five later requests had to wait
	// for a whole answer (24 decode steps) before their prefill.
	later := 0
	for _, d := range ttfts[1:] {
		if d > ttfts[0] {
			later++
		}
	}
	if later < 3 {
		t.Errorf("TTFTs %v: want at least 3 later requests slower than the first", ttfts)
	}
	sorted := slices.Clone(ttfts[1:])
	slices.Sort(sorted)
	if sorted[len(sorted)-1] < 2*sorted[0] {
		t.Errorf("TTFTs %v: the last queued request should wait far longer than the first admitted", ttfts)
	}
}

func TestPrefillCost(t *testing.T) {
	_, ts := start(t, Config{PrefillPerToken: time.Millisecond, ITL: time.Millisecond})
	short, _ := streamTTFT(t, ts, chatBody("hi", map[string]any{"max_tokens": 2}))
	long, _ := streamTTFT(t, ts, chatBody(strings.Repeat("abcd", 300), map[string]any{"max_tokens": 2})) // ~300 tokens
	if long <= short {
		t.Fatalf("TTFT with a 300-token prompt %v <= with a 2-token prompt %v", long, short)
	}
}

func TestDecodeSlowsWithBatch(t *testing.T) {
	_, ts := start(t, Config{ITL: time.Millisecond, ITLPerRunning: 8 * time.Millisecond})
	body := chatBody("batch", map[string]any{"max_tokens": 15, "ignore_eos": true})
	elapsed := func(n int) time.Duration {
		begin := time.Now()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { streamTTFT(t, ts, body) })
		}
		wg.Wait()
		return time.Since(begin)
	}
	alone := elapsed(1)
	four := elapsed(4)
	// Alone: 15 steps of 1 ms. Four at once: steps of up to 1 + 3×8 ms.
	if four < 3*alone {
		t.Fatalf("4 concurrent sequences took %v, 1 alone %v: decode should slow with the batch", four, alone)
	}
}

func TestTimeScale(t *testing.T) {
	s, ts := start(t, Config{TTFT: 5 * time.Second, ITL: time.Second, TimeScale: 0.0005})
	begin := time.Now()
	a := chat(t, ts, chatBody("fast", map[string]any{"max_tokens": 5, "ignore_eos": true}), false)
	if d := time.Since(begin); d > 4*time.Second {
		t.Fatalf("took %v: TimeScale not applied (unscaled: 9s)", d)
	}
	if a.usage.CompletionTokens != 5 || s.Stats().GenerationTokens != 5 {
		t.Fatalf("usage %+v stats %+v", *a.usage, s.Stats())
	}
}

func TestKVLimitAdmitsFewer(t *testing.T) {
	// "hi" is 2 prompt tokens; with max_tokens 20 a request reserves 22 KV tokens.
	runFour := func(t *testing.T, kv int) Stats {
		s, ts := start(t, Config{ITL: 10 * time.Millisecond, MaxRunning: 8, KVTokens: kv})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				resp, err := send(context.Background(), ts, "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 20, "ignore_eos": true}), nil)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("status %d", resp.StatusCode)
				}
			})
		}
		wg.Wait()
		return s.Stats()
	}
	small := runFour(t, 30)
	if small.PeakRunning != 1 || small.Completed != 4 {
		t.Fatalf("KV for one request: stats %+v, want peak running 1", small)
	}
	large := runFour(t, 1000)
	if large.PeakRunning < 2 || large.Completed != 4 {
		t.Fatalf("KV for all: stats %+v, want peak running >= 2", large)
	}
	if large.KVUsedTokens != 0 || large.KVReservedTokens != 0 {
		t.Fatalf("KV not freed: %+v", large)
	}
}

// openStream starts a streaming chat request and reads n events from it.
func openStream(t *testing.T, ctx context.Context, ts *httptest.Server, body map[string]any, hdr map[string]string, n int) (*http.Response, *bufio.Reader) {
	t.Helper()
	b := map[string]any{"stream": true}
	for k, v := range body {
		b[k] = v
	}
	resp, err := send(ctx, ts, "/v1/chat/completions", b, hdr)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for got := 0; got < n; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", got, err)
		}
		if strings.HasPrefix(line, "data: ") {
			got++
		}
	}
	return resp, br
}

func TestCancellation(t *testing.T) {
	s, ts := start(t, Config{ITL: 5 * time.Millisecond, MaxRunning: 1})
	long := chatBody("a long answer", map[string]any{"max_tokens": 5000, "ignore_eos": true})

	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	resp1, _ := openStream(t, ctx1, ts, long, nil, 3)
	defer resp1.Body.Close()

	// The second request waits for the only slot; its headers come at once.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	resp2, err := send(ctx2, ts, "/v1/chat/completions", map[string]any{"messages": long["messages"], "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	waitFor(t, 5*time.Second, "the second request to wait", func() bool { return s.Stats().Waiting == 1 })

	cancel2()
	waitFor(t, 5*time.Second, "the waiting request to be removed", func() bool {
		st := s.Stats()
		return st.Waiting == 0 && st.Cancelled == 1
	})
	if st := s.Stats(); st.Running != 1 {
		t.Fatalf("running request disturbed: %+v", st)
	}

	cancel1()
	waitFor(t, 5*time.Second, "the running request to be removed", func() bool {
		st := s.Stats()
		return st.Running == 0 && st.Cancelled == 2 && st.KVUsedTokens == 0 && st.KVReservedTokens == 0
	})
	// The slot is free again.
	if a := chat(t, ts, chatBody("next", map[string]any{"max_tokens": 3}), false); a.usage.CompletionTokens < 2 {
		t.Fatalf("answer after cancellation: %+v", a)
	}
	_, raw := get(t, ts, "/metrics")
	if !strings.Contains(string(raw), `vllm:request_success_total{finished_reason="abort",model_name="sim-llama"} 2`) {
		t.Errorf("aborted sequences not counted in vllm:request_success_total")
	}
	if st := s.Stats(); st.Completed != 1 || st.Cancelled != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSlowClientDoesNotBlock(t *testing.T) {
	s, ts := start(t, Config{ITL: 2 * time.Millisecond})
	hdr := map[string]string{"x-sim-stall-after": "2", "x-sim-stall-for": "600ms"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, br := openStream(t, ctx, ts, chatBody("slow reader", map[string]any{"max_tokens": 40, "ignore_eos": true}), hdr, 2)
	defer resp.Body.Close()
	// While the handler of the slow stream is stalled, the engine keeps generating for it
	// and serves others.
	other := chat(t, ts, chatBody("other", map[string]any{"max_tokens": 5, "ignore_eos": true}), false)
	if other.usage.CompletionTokens != 5 {
		t.Fatalf("other answer %+v", other)
	}
	waitFor(t, 5*time.Second, "the slow stream's sequence to finish", func() bool { return s.Stats().Running == 0 })
	generatedAt := time.Now()
	evs, err := readSSE(br)
	if err != nil || len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("rest of the slow stream: %d events, %v", len(evs), err)
	}
	if !evs[0].at.After(generatedAt) {
		t.Fatalf("the stalled stream resumed before its sequence finished: not a stall")
	}
	if st := s.Stats(); st.GenerationTokens != 45 || st.Completed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDieAfter(t *testing.T) {
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{{"fast", Config{}}, {"scheduled", scheduled}} {
		t.Run(cfg.name, func(t *testing.T) {
			s, ts := start(t, cfg.cfg)
			for i, n := range []int{3, 0, 1} {
				hdr := map[string]string{"x-sim-die-after": strconv.Itoa(n)}
				b := chatBody("die", map[string]any{"max_tokens": 20, "ignore_eos": true, "stream": true})
				resp, err := send(context.Background(), ts, "/v1/chat/completions", b, hdr)
				if err != nil {
					t.Fatal(err)
				}
				evs, err := readSSE(resp.Body)
				resp.Body.Close()
				if err == nil || len(evs) != n {
					t.Fatalf("die-after %d: %d events, err %v; want %d events and a broken stream", n, len(evs), err, n)
				}
				waitFor(t, 5*time.Second, "the killed sequence to be removed", func() bool {
					st := s.Stats()
					return st.Aborted == int64(i+1) && st.Running == 0
				})
			}
			// Non-streaming: the connection closes without a response.
			resp, err := send(context.Background(), ts, "/v1/chat/completions", chatBody("die", nil), map[string]string{"x-sim-die-after": "0"})
			if err == nil {
				resp.Body.Close()
				t.Fatalf("non-stream die-after: got status %d, want a connection error", resp.StatusCode)
			}
			if st := s.Stats(); st.Aborted != 4 || st.Completed != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestStalls(t *testing.T) {
	_, ts := start(t, Config{})
	const stall = 150 * time.Millisecond
	t.Run("first non-stream", func(t *testing.T) {
		begin := time.Now()
		resp, _ := post(t, ts, "/v1/chat/completions", chatBody("x", nil), map[string]string{"x-sim-stall-first": "150ms"})
		if resp.StatusCode != 200 || time.Since(begin) < stall {
			t.Fatalf("status %d after %v", resp.StatusCode, time.Since(begin))
		}
	})
	t.Run("first stream", func(t *testing.T) {
		b := chatBody("x", map[string]any{"stream": true})
		begin := time.Now()
		resp, err := send(context.Background(), ts, "/v1/chat/completions", b, map[string]string{"x-sim-stall-first": "0.15"})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		evs, err := readSSE(resp.Body)
		if err != nil || len(evs) < 3 || evs[0].at.Sub(begin) < stall {
			t.Fatalf("%d events, err %v, first after %v", len(evs), err, evs[0].at.Sub(begin))
		}
	})
	t.Run("after N", func(t *testing.T) {
		b := chatBody("x", map[string]any{"stream": true, "max_tokens": 6, "ignore_eos": true})
		begin := time.Now()
		resp, err := send(context.Background(), ts, "/v1/chat/completions", b, map[string]string{"x-sim-stall-after": "2", "x-sim-stall-for": "150ms"})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		evs, err := readSSE(resp.Body)
		if err != nil || len(evs) != 9 || evs[len(evs)-1].data != "[DONE]" {
			t.Fatalf("%d events, err %v", len(evs), err)
		}
		if evs[2].at.Sub(begin) < stall {
			t.Fatalf("third event after %v, want >= %v", evs[2].at.Sub(begin), stall)
		}
	})
	t.Run("client gives up", func(t *testing.T) {
		s, ts := start(t, Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := send(ctx, ts, "/v1/chat/completions", chatBody("x", nil), map[string]string{"x-sim-stall-first": "30s"})
		if err == nil {
			t.Fatal("want a timeout")
		}
		waitFor(t, 5*time.Second, "the stalled handler to notice", func() bool { return s.Stats().Cancelled == 1 })
	})
}

func TestClose(t *testing.T) {
	s := New(scheduled)
	ts := httptest.NewServer(s)
	defer ts.Close()
	body := chatBody("a long answer", map[string]any{"max_tokens": 5000, "ignore_eos": true})
	resp, br := openStream(t, context.Background(), ts, body, nil, 2)
	defer resp.Body.Close()
	s.Close()
	s.Close()
	evs, err := readSSE(br)
	if err != nil || (len(evs) > 0 && evs[len(evs)-1].data == "[DONE]") {
		t.Fatalf("stream after Close: %d events, err %v; want a clean end without [DONE]", len(evs), err)
	}
	r, raw := post(t, ts, "/v1/chat/completions", chatBody("x", nil), nil)
	if r.StatusCode != 503 {
		t.Fatalf("after Close: status %d %s", r.StatusCode, raw)
	}
	// The fast path needs no scheduler and keeps answering.
	f := New(Config{})
	f.Close()
	f.Close()
	rec := httptest.NewRecorder()
	f.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(`{"prompt":"x"}`)))
	if rec.Code != 200 {
		t.Fatalf("fast path after Close: %d", rec.Code)
	}
}

// TestDieAfterHTTP2: HTTP/2 connections cannot be hijacked; the stream is reset instead.
func TestDieAfterHTTP2(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	ts := httptest.NewUnstartedServer(s)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer ts.Close()
	b := chatBody("die", map[string]any{"max_tokens": 20, "ignore_eos": true, "stream": true})
	resp, err := send(context.Background(), ts, "/v1/chat/completions", b, map[string]string{"x-sim-die-after": "2"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("proto %s", resp.Proto)
	}
	evs, err := readSSE(resp.Body)
	resp.Body.Close()
	if err == nil || len(evs) != 2 {
		t.Fatalf("%d events, err %v; want 2 and a reset stream", len(evs), err)
	}
	resp, err = send(context.Background(), ts, "/v1/chat/completions", chatBody("die", nil), map[string]string{"x-sim-die-after": "0"})
	if err == nil {
		resp.Body.Close()
		t.Fatalf("non-stream: status %d, want an error", resp.StatusCode)
	}
	// The connection survives for other streams.
	if a := chat(t, ts, chatBody("alive", nil), true); a.text[0] == "" {
		t.Fatal("no answer after the reset")
	}
	if st := s.Stats(); st.Aborted != 2 || st.Completed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDelay(t *testing.T) {
	s, ts := start(t, Config{Delay: 100 * time.Millisecond, DelayJitter: 50 * time.Millisecond, Seed: 5})
	if s.fast {
		t.Fatal("a delay must take the scheduled path")
	}
	begin := time.Now()
	resp, raw := post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":2}`, nil)
	if resp.StatusCode != 200 || time.Since(begin) < 100*time.Millisecond {
		t.Fatalf("status %d after %v: %s", resp.StatusCode, time.Since(begin), raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := send(ctx, ts, "/v1/completions", `{"prompt":"x"}`, nil); err == nil {
		t.Fatal("want a timeout")
	}
	waitFor(t, 5*time.Second, "the delayed request to count as cancelled", func() bool { return s.Stats().Cancelled == 1 })
}
