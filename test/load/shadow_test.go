package load

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicegw/sluice/test/sim"
)

func TestParseShadow(t *testing.T) {
	w, err := LoadTrace("testdata/shadow_pairs.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(w.Name, FormatShadow) || !strings.Contains(w.Name, "2 lines skipped") {
		t.Errorf("name %q", w.Name)
	}
	type want struct {
		at       time.Duration
		endpoint string
		stream   bool
		out      int
		body     string // substring
	}
	wants := []want{
		{0, "chat", false, 4, `"content":"Say hi"`},
		{20 * time.Millisecond, "completions", true, 6, `"prompt":"Once upon a time"`},
		{40 * time.Millisecond, "chat", true, 8, `"What is a sluice?"`},
		{100 * time.Millisecond, "chat", true, 16, `"tools":[`},
	}
	if len(w.Items) != len(wants) {
		t.Fatalf("%d items, want %d", len(w.Items), len(wants))
	}
	for i, it := range w.Items {
		wt := wants[i]
		if it.At != wt.at || !it.HasAt || it.Endpoint != wt.endpoint || it.Stream != wt.stream || it.OutputTokens != wt.out ||
			!strings.Contains(string(it.Body), wt.body) || it.InputTokens < 1 {
			t.Errorf("item %d: at %v endpoint %q stream %v out %d input %d body %s", i, it.At, it.Endpoint, it.Stream,
				it.OutputTokens, it.InputTokens, it.Body)
		}
	}
	// Detection and errors.
	tests := []struct {
		name, in, err string
		items         int
	}{
		{"route first", `{"route":"r","request":{"messages":[{"role":"user","content":"x"}]}}`, "", 1},
		{"request later, no ts", `{"ts_x":1,"request":{"prompt":"x"}}`, "", 1},
		{"mooncake untouched", `{"timestamp":0,"input_length":10,"output_length":5,"hash_ids":[1]}`, "", 1},
		{"nothing replayable", `{"route":"r","request":null}` + "\n" + `{"route":"r","endpoint":"/v1/embeddings","request":{"input":"x"}}`, "no replayable request (2 lines skipped", 0},
		{"bad line", `{"route":"r","request":{"prompt":"x"}}` + "\n" + `{"route":`, "line 2", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := ParseTrace(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || len(w.Items) != tt.items {
				t.Fatalf("%v, %+v", err, w)
			}
		})
	}
}

// seen is one request the simulator got.
type seen struct {
	path   string
	stream bool
	model  string
	body   string
}

func TestReplayShadowAgainstSimulator(t *testing.T) {
	s := sim.New(sim.Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond, Seed: 1})
	var mu sync.Mutex
	var got []seen
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var v struct {
			Stream bool   `json:"stream"`
			Model  string `json:"model"`
		}
		_ = json.Unmarshal(b, &v)
		mu.Lock()
		got = append(got, seen{r.URL.Path, v.Stream, v.Model, string(b)})
		mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { ts.Close(); s.Close() })
	tests := []struct {
		name    string
		cfg     Config
		minSpan time.Duration
	}{
		{"recorded gaps", Config{TimeScale: 1}, 90 * time.Millisecond},
		{"as fast as the rate", Config{Rate: 1000, Arrival: ArrivalConstant}, 0},
		{"closed loop", Config{Concurrency: 2}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			got = nil
			mu.Unlock()
			w, err := LoadTrace("testdata/shadow_pairs.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			cfg := tt.cfg
			cfg.Target, cfg.Model, cfg.Workload, cfg.Seed = ts.URL, sim.DefaultModel, w, 1
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			r, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if span := time.Since(start); span < tt.minSpan {
				t.Errorf("replay took %v, the recorded gaps add up to 100ms", span)
			}
			if r.Requests != 4 || r.OK != 4 {
				t.Fatalf("requests %d ok %d errors %v samples %v", r.Requests, r.OK, r.Errors, r.Samples)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 4 {
				t.Fatalf("simulator got %d requests", len(got))
			}
			paths := map[string]int{}
			streams := 0
			for _, g := range got {
				paths[g.path]++
				if g.stream {
					streams++
				}
				if g.model != sim.DefaultModel || strings.Contains(g.body, "dave") {
					t.Errorf("body %s", g.body)
				}
			}
			if paths["/v1/chat/completions"] != 3 || paths["/v1/completions"] != 1 || streams != 3 {
				t.Errorf("paths %v, %d streaming", paths, streams)
			}
		})
	}
}
