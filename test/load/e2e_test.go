package load

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/test/sim"
)

func startSim(t *testing.T, cfg sim.Config) string {
	t.Helper()
	s := sim.New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	return ts.URL
}

func within(t *testing.T, name string, got, want, tol float64) {
	t.Helper()
	if got < want*(1-tol) || got > want*(1+tol) {
		t.Errorf("%s = %.3f, want %.3f ± %.0f%%", name, got, want, tol*100)
	} else {
		t.Logf("%s = %.3f (configured %.3f)", name, got, want)
	}
}

func TestRunAgainstSimulator(t *testing.T) {
	url := startSim(t, sim.Config{TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond, Seed: 1})
	sp, err := ParseSynthetic("in=uniform:50:150,out=fixed:16")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := Run(ctx, Config{Target: url, Workload: &Workload{Synthetic: sp}, Rate: 8, Arrival: ArrivalConstant,
		Requests: 20, SLO: SLO{TTFT: time.Second}, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	s := r.Summary
	if r.Requests != 20 || r.OK != 20 {
		t.Fatalf("requests %d ok %d errors %v samples %v", r.Requests, r.OK, r.Errors, r.Samples)
	}
	if r.OutputTokens != 20*16 || r.TokensFromUsage != 20 {
		t.Errorf("output tokens %d (from usage %d), want %d", r.OutputTokens, r.TokensFromUsage, 20*16)
	}
	within(t, "TTFT p50 ms", s.Latency[HTTFT].P50, 20, 0.25)
	within(t, "ITL p50 ms", s.Latency[HITL].P50, 5, 0.25)
	if s.Attainment["all"] != 1 {
		t.Errorf("attainment %v", s.Attainment)
	}
	if r.Hist[HLag].Count() != 20 || s.Latency[HLag].P99 > 20 {
		t.Errorf("lag %+v", s.Latency[HLag])
	}
}

func TestSessionsFidelity(t *testing.T) {
	url := startSim(t, sim.Config{TTFT: 2 * time.Millisecond, ITL: time.Millisecond, Seed: 1})
	sp, err := ParseSessions("n=4,turns=3,in=fixed:40,out=fixed:12,think=gamma:2:5ms")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := Run(ctx, Config{Target: url, Workload: &Workload{Sessions: sp}, Concurrency: 2, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 12 || r.OK != 12 {
		t.Fatalf("requests %d ok %d %v %v", r.Requests, r.OK, r.Errors, r.Samples)
	}
	// Turn t expects t markers: 0+1+2 per session.
	if r.MarkersExpected != 4*3 || r.MarkersFound != r.MarkersExpected || r.Summary.ContextFidelity != 1 {
		t.Errorf("markers %d/%d fidelity %v", r.MarkersFound, r.MarkersExpected, r.Summary.ContextFidelity)
	}
}

func TestRunThroughGateway(t *testing.T) {
	url := startSim(t, sim.Config{TTFT: 10 * time.Millisecond, ITL: 2 * time.Millisecond, Seed: 1})
	cfg, err := config.FromUpstreams("127.0.0.1:0", "127.0.0.1:0", []string{url}, "")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	w, err := LoadTrace("testdata/mooncake_conversation_200.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	w.Items = w.Items[:12]
	for i := range w.Items { // keep prompts small for the test
		w.Items[i].InputTokens = min(w.Items[i].InputTokens, 1500)
		w.Items[i].HashIDs = w.Items[i].HashIDs[:min(len(w.Items[i].HashIDs), 2)]
		w.Items[i].OutputTokens = 8
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := Run(ctx, Config{Target: "http://" + srv.Addr(), Model: sim.DefaultModel, Workload: w, Concurrency: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 12 || r.OK != 12 || r.OutputTokens != 12*8 || r.Upstreams["default"] != 12 {
		t.Fatalf("requests %d ok %d tokens %d upstreams %v errors %v %v", r.Requests, r.OK, r.OutputTokens, r.Upstreams, r.Errors, r.Samples)
	}
	if p := r.Summary.Latency[HTTFT].P50; p < 9 || p > 40 {
		t.Errorf("TTFT p50 %.2f ms through the gateway, configured 10 ms", p)
	}
}
