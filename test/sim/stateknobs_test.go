package sim

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// metricValue reads one sample of the simulator's /metrics page.
func metricValue(t testing.TB, page []byte, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{[^}]*\} (\S+)$`).FindSubmatch(page)
	if m == nil {
		t.Fatalf("%s not on the metrics page", name)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestKVLeak(t *testing.T) {
	// "hi" is 2 prompt tokens; max_tokens 10 with ignore_eos: 12 KV tokens while running.
	req := chatBody("hi", map[string]any{"max_tokens": 10, "ignore_eos": true})
	tests := []struct {
		name string
		cfg  Config
	}{
		{"scheduled", Config{ITL: time.Millisecond, KVTokens: 1000, LeakKVPerRequest: 100}},
		{"fast path", Config{KVTokens: 1000, LeakKVPerRequest: 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, ts := start(t, tc.cfg)
			for i := 1; i <= 3; i++ {
				if a := chat(t, ts, req, i%2 == 0); a.usage.CompletionTokens != 10 {
					t.Fatalf("answer %+v", a)
				}
				_, page := get(t, ts, "/metrics")
				st := s.Stats()
				want := float64(100*i) / 1000
				if st.KVLeakedTokens != 100*i || st.Running != 0 || st.KVUsage != want {
					t.Fatalf("after %d requests: stats %+v, want %d tokens leaked, KV use %v", i, st, 100*i, want)
				}
				for _, name := range []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} {
					if got := metricValue(t, page, name); got != want {
						t.Errorf("after %d requests: %s = %v, want %v", i, name, got, want)
					}
				}
				if got := metricValue(t, page, "vllm:num_requests_running"); got != 0 {
					t.Errorf("running %v with the leak", got)
				}
			}
			s.SetKVLeak(950)
			if st := s.Stats(); st.KVLeakedTokens != 950 || st.KVUsage != 0.95 {
				t.Fatalf("SetKVLeak(950): %+v", st)
			}
			s.SetKVLeak(5000)
			if st := s.Stats(); st.KVLeakedTokens != 1000 || st.KVUsage != 1 {
				t.Fatalf("SetKVLeak over capacity: %+v", st)
			}
			s.SetKVLeak(0)
			if st := s.Stats(); st.KVLeakedTokens != 0 || st.KVUsage != 0 {
				t.Fatalf("SetKVLeak(0): %+v", st)
			}
		})
	}
}

// TestKVLeakTakesAdmissionRoom: leaked KV is gone from admission, as on a leaking server:
// a request that fits the cache waits while the leak fills it, and runs once it is freed.
func TestKVLeakTakesAdmissionRoom(t *testing.T) {
	s, ts := start(t, Config{ITL: time.Millisecond, KVTokens: 100})
	s.SetKVLeak(95)
	done := make(chan error, 1)
	go func() {
		resp, err := send(context.Background(), ts, "/v1/chat/completions", chatBody("hi", map[string]any{"max_tokens": 10}), nil)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, 5*time.Second, "the request to wait for KV room", func() bool { return s.Stats().Waiting == 1 })
	if st := s.Stats(); st.Running != 0 || st.Completed != 0 {
		t.Fatalf("admitted into a leaked cache: %+v", st)
	}
	s.SetKVLeak(0)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Completed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSlowdown: a paused engine generates nothing while requests queue behind it, and picks
// up where it was once the factor is finite again; a finite factor stretches every step.
func TestSlowdown(t *testing.T) {
	s, ts := start(t, Config{ITL: time.Millisecond, MaxRunning: 1})
	req := chatBody("hi", map[string]any{"max_tokens": 20, "ignore_eos": true})

	s.SetSlowdown(math.Inf(1))
	if st := s.Stats(); st.Slowdown != math.Inf(1) {
		t.Fatalf("Slowdown %v", st.Slowdown)
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); wg.Wait() }()
	codes := make(chan int, 3)
	for range 3 {
		wg.Go(func() {
			resp, err := send(ctx, ts, "/v1/chat/completions", req, nil)
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	waitFor(t, 5*time.Second, "one running, two queued", func() bool {
		st := s.Stats()
		return st.Running == 1 && st.Waiting == 2
	})
	// Paused: the running request's step never ends. A request with a deadline well past
	// many unpaused steps still gets no token.
	short, cancelShort := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancelShort()
	if resp, err := send(short, ts, "/v1/chat/completions", req, nil); err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a request finished on a paused engine (err %v)", err)
		}
	}
	if st := s.Stats(); st.GenerationTokens != 0 {
		t.Fatalf("paused engine generated %d tokens", st.GenerationTokens)
	}

	s.SetSlowdown(0) // back to normal: the step under way is re-timed
	for range 3 {
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
	}
	if st := s.Stats(); st.GenerationTokens != 60 || st.Slowdown != 1 {
		t.Fatalf("after resuming: %+v", st)
	}
}

// TestSlowdownStretchesSteps: with a factor of a million a 1 ms step takes about 17 minutes,
// so a request never finishes within its deadline; set back to 1 it finishes.
func TestSlowdownStretchesSteps(t *testing.T) {
	s, ts := start(t, Config{ITL: time.Millisecond, Slowdown: 1e6})
	if st := s.Stats(); st.Slowdown != 1e6 {
		t.Fatalf("Config.Slowdown not applied: %v", st.Slowdown)
	}
	req := chatBody("hi", map[string]any{"max_tokens": 5, "ignore_eos": true})
	done := make(chan int, 1)
	go func() {
		resp, err := send(context.Background(), ts, "/v1/chat/completions", req, nil)
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	waitFor(t, 5*time.Second, "the request to run", func() bool { return s.Stats().Running == 1 })
	select {
	case code := <-done:
		t.Fatalf("finished (%d) at a millionfold slowdown", code)
	case <-time.After(50 * time.Millisecond):
	}
	s.SetSlowdown(1)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if st := s.Stats(); st.GenerationTokens != 5 {
		t.Fatalf("stats %+v", st)
	}
}
