package shadow

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestSampled(t *testing.T) {
	for _, tc := range []struct {
		fraction float64
		want     float64 // share of 20,000 keys
	}{{0, 0}, {0.01, 0.01}, {0.1, 0.1}, {0.5, 0.5}, {1, 1}} {
		n := 0
		for i := range 20000 {
			if Sampled("route", fmt.Sprintf("session-%d", i), tc.fraction) {
				n++
			}
		}
		got := float64(n) / 20000
		if d := got - tc.want; d > 0.01 || d < -0.01 {
			t.Errorf("fraction %v: sampled %.4f", tc.fraction, got)
		}
	}
	// The same key always gets the same answer; another salt, another subset.
	same, other := 0, 0
	for i := range 2000 {
		k := fmt.Sprintf("s%d", i)
		a := Sampled("r1", k, 0.3)
		if a == Sampled("r1", k, 0.3) {
			same++
		}
		if a != Sampled("r2", k, 0.3) {
			other++
		}
	}
	if same != 2000 {
		t.Errorf("sampling is not consistent per key: %d/2000", same)
	}
	if other < 500 {
		t.Errorf("salts pick nearly the same sessions: %d/2000 differ", other)
	}
	if Sampled("r", "", 0.99) {
		t.Error("an empty key was sampled below fraction 1")
	}
}

func TestQueueDropsWhenFull(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var done []int
	q := NewQueue(2, 1, func(_ context.Context, j int) {
		<-release
		mu.Lock()
		done = append(done, j)
		mu.Unlock()
	})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { q.Run(ctx); close(stopped) }()

	// One job in the worker, two queued; the rest dropped without waiting.
	if !q.Offer(0) {
		t.Fatal("first offer dropped")
	}
	deadline := time.Now().Add(5 * time.Second)
	for q.Counts().Running != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	accepted := 0
	for i := 1; i <= 10; i++ {
		if q.Offer(i) {
			accepted++
		}
	}
	c := q.Counts()
	if accepted != 2 || c.Dropped != 8 || c.Offered != 11 || c.Queued != 2 {
		t.Fatalf("accepted %d, counts %+v; want 2 accepted, 8 dropped", accepted, c)
	}
	close(release)
	for q.Counts().Finished != 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-stopped
	if len(done) != 3 {
		t.Fatalf("done %v, want 3 jobs", done)
	}
	if q.Offer(99) {
		t.Error("offer accepted after the queue stopped")
	}
}

func TestRequestFromBody(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		format     string
		schema     bool
		tools      []string
	}{
		{"plain", `{"messages":[]}`, "", false, nil},
		{"json object", `{"response_format":{"type":"json_object"}}`, FormatJSONObject, false, nil},
		{"json schema", `{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}`, FormatJSONSchema, true, nil},
		{"tools", `{"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}},{"type":"code_interpreter"}]}`, "", false, []string{"get_weather"}},
		{"not json", `{"messages":`, "", false, nil},
		{"forced function", `{"tool_choice":{"type":"function","function":{"name":"get_weather"}},"tools":[{"type":"function","function":{"name":"get_weather"}}]}`, "", false, []string{"get_weather"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := RequestFromBody([]byte(tc.body))
			if r.ResponseFormat != tc.format || (len(r.Schema) > 0) != tc.schema || len(r.Tools) != len(tc.tools) {
				t.Fatalf("got %+v", r)
			}
			for i, n := range tc.tools {
				if r.Tools[i].Name != n {
					t.Errorf("tool %d = %q, want %q", i, r.Tools[i].Name, n)
				}
			}
		})
	}
}

func TestToolChoiceAndCompletions(t *testing.T) {
	for body, want := range map[string]string{
		`{"tool_choice":"required"}`:                                  "required",
		`{"tool_choice":"none"}`:                                      "none",
		`{"tool_choice":{"type":"function","function":{"name":"f"}}}`: "f",
		`{}`: "",
	} {
		if got := RequestFromBody([]byte(body)).ToolChoice; got != want {
			t.Errorf("%s: tool choice %q, want %q", body, got, want)
		}
	}
	a, err := AnswerFromChat([]byte(`{"choices":[{"index":0,"text":"four","finish_reason":"stop"}]}`))
	if err != nil || a.Text != "four" {
		t.Errorf("completions body: %+v %v", a, err)
	}
	a, err = AnswerFromSSE([]byte("data: {\"choices\":[{\"index\":0,\"text\":\"fo\"}]}\n\ndata: {\"choices\":[{\"index\":0,\"text\":\"ur\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"))
	if err != nil || a.Text != "four" || a.FinishReason != "stop" {
		t.Errorf("completions stream: %+v %v", a, err)
	}
}

// TestQueueStartsWorkersOnDemand: an idle queue holds no worker goroutines, a busy one no
// more than its bound, and jobs dropped at stop reach OnDrop.
func TestQueueStartsWorkersOnDemand(t *testing.T) {
	release := make(chan struct{})
	q := NewQueue(4, 3, func(ctx context.Context, _ int) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	var dropped []int
	q.OnDrop(func(j int) { dropped = append(dropped, j) })
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { q.Run(ctx); close(stopped) }()
	time.Sleep(10 * time.Millisecond)
	if n := runtime.NumGoroutine() - before; n > 1 {
		t.Fatalf("idle queue holds %d goroutines, want 1 (Run)", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for i := range 7 {
		if !q.Offer(i) {
			t.Fatalf("offer %d dropped (3 workers + 4 queued fit)", i)
		}
		for q.Counts().Running != int64(min(i+1, 3)) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	if c := q.Counts(); c.Running != 3 || c.Queued != 4 {
		t.Fatalf("counts %+v, want 3 running and 4 queued", c)
	}
	if n := runtime.NumGoroutine() - before; n > 4 {
		t.Fatalf("busy queue holds %d goroutines, want at most 1+3", n)
	}
	if q.Offer(7) {
		t.Fatal("an eighth job was accepted")
	}
	cancel()
	<-stopped
	if len(dropped) != 4 {
		t.Fatalf("OnDrop got %v, want the 4 queued jobs", dropped)
	}
	if c := q.Counts(); c.Dropped != 5 || c.Finished != 3 {
		t.Fatalf("counts after stop %+v, want 5 dropped (1 full + 4 at stop), 3 finished", c)
	}
	close(release)
}
