package load

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

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

// serverMeans reads the mean TTFT and inter-token latency, in milliseconds, that the
// simulator itself observed (its vllm:* histograms' sums over counts).
func serverMeans(t *testing.T, url string) (ttft, itl float64) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the simulator's /metrics: %v", err)
	}
	mean := func(name string) float64 {
		mf := fams[name]
		if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
			t.Fatalf("the simulator exposes no %s samples", name)
		}
		h := mf.GetMetric()[0].GetHistogram()
		return h.GetSampleSum() / float64(h.GetSampleCount()) * 1000
	}
	return mean("vllm:time_to_first_token_seconds"), mean("vllm:inter_token_latency_seconds")
}

// TestRunAgainstSimulator checks what the injector measures against what the server did, not
// against wall-clock expectations: a loaded machine makes both later, never the client's view
// earlier than the server's. TTFT is at least the server's own (the client starts before the
// request arrives and reads the token after it is written) and less than the server's own plus
// one inter-token gap (a tool that timed the headers would be under it, one that timed the
// second token or the end over it); the gaps the client sees are the server's within 25%.
func TestRunAgainstSimulator(t *testing.T) {
	const ttft, itl = 20 * time.Millisecond, 10 * time.Millisecond
	url := startSim(t, sim.Config{TTFT: ttft, ITL: itl, Seed: 1})
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
	srvTTFT, srvITL := serverMeans(t, url)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	if srvTTFT < ms(ttft) || srvITL < ms(itl) {
		t.Fatalf("the simulator's own means TTFT %.3f ms ITL %.3f ms are under its configured %v %v", srvTTFT, srvITL, ttft, itl)
	}
	// 1% for the client histogram's precision.
	if got := s.Latency[HTTFT].Mean; got < srvTTFT*0.99 || got > srvTTFT+ms(itl) {
		t.Errorf("TTFT mean %.3f ms, want between the server's %.3f and that plus one gap (%v)", got, srvTTFT, itl)
	} else {
		t.Logf("TTFT mean %.3f ms (server %.3f, configured %v)", got, srvTTFT, ttft)
	}
	if got := s.Latency[HITL].P50; got < srvITL*0.75 || got > srvITL*1.25 {
		t.Errorf("ITL p50 %.3f ms, want the server's mean %.3f ± 25%%", got, srvITL)
	} else {
		t.Logf("ITL p50 %.3f ms (server mean %.3f, configured %v)", got, srvITL, itl)
	}
	if s.Attainment["all"] != 1 {
		t.Errorf("attainment %v", s.Attainment)
	}
	// Open loop: a request is sent on its schedule, not after the one before it ends. Each takes
	// over 170 ms against 125 ms between sends, so a pacer that waited would lag by seconds.
	if r.Hist[HLag].Count() != 20 || s.Latency[HLag].P99 > 100 {
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
