package telemetry

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/exposition.txt from this build")

// exposition is /metrics in the Prometheus text format, target_info left out (its labels
// name the SDK's version).
func exposition(t *testing.T, tel *Telemetry, accept string) string {
	t.Helper()
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); !strings.Contains(line, "target_info") {
			b.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// recordMix records a bit of everything the request metrics see: answers and failures,
// streams and not, each GenAI operation and none, endpoints with and without ports, a
// response model and none, tokens known and not, and in-flight moves.
func recordMix(tel *Telemetry) {
	ctx := context.Background()
	recs := []RequestRecord{
		okStream, okStream, failed,
		{Route: "chat", Cluster: "llama-primary", Endpoint: "http://10.0.0.5:8000", Operation: "chat",
			RequestModel: "llama-3", ResponseModel: "llama-3-70b-instruct", Status: 200,
			Duration: 40 * time.Millisecond, TTFT: 5 * time.Millisecond, InputTokens: 4, OutputTokens: 1,
			Overhead: 2 * time.Millisecond, Attempts: 3},
		{Route: "embed", Cluster: "bge", Endpoint: "https://embed.internal", Operation: "embeddings",
			RequestModel: "bge-m3", ResponseModel: "bge-m3", Status: 200, Duration: 20 * time.Millisecond,
			InputTokens: 1 << 20, Overhead: 10 * time.Microsecond, Attempts: 1},
		{Route: "legacy", Cluster: "old", Endpoint: "10.0.0.9:9000", Operation: "text_completion",
			RequestModel: "gpt2", Status: 499, ErrorClass: "client_cancel", Duration: 90 * time.Second,
			Overhead: time.Second, Attempts: 12},
		{Route: "models", Status: 200, Duration: time.Millisecond, Overhead: 30 * time.Microsecond},
		{Route: "", Status: 404, ErrorClass: "no_route", Duration: time.Millisecond},
		{Route: "chat", Cluster: "llama-primary", Endpoint: "llama.local", Operation: "chat",
			RequestModel: "llama-3", Status: 200, Duration: 81920 * time.Millisecond,
			TTFT: 10 * time.Second, TPOT: 2500 * time.Millisecond, OutputTokens: 64, Attempts: 1,
			Overhead: 100 * time.Millisecond},
	}
	for _, r := range recs {
		tel.InFlight(ctx, r.Route, 1)
		tel.RecordRequest(ctx, r)
	}
	for _, r := range recs[1:] {
		tel.InFlight(ctx, r.Route, -1)
	}
	tel.UpstreamError(ctx, "llama-primary", "upstream_timeout")
	tel.ConfigReload(ctx, false)
}

// TestExpositionGolden pins every request metric's series, help, type, buckets and
// values on /metrics, in both formats, against testdata/exposition.txt (written by the
// OpenTelemetry SDK's exporter when the file was made: `go test ./proxy/telemetry -run
// ExpositionGolden -update`).
func TestExpositionGolden(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{ServiceName: "sluice", ServiceVersion: "test"})
	recordMix(tel)
	got := "# text/plain\n" + exposition(t, tel, "text/plain; version=0.0.4") +
		"# application/openmetrics-text\n" + exposition(t, tel, "application/openmetrics-text; version=1.0.0")
	const file = "testdata/exposition.txt"
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("exposition differs from %s at line %d:\n got: %s\nwant: %s", file, i+1, g, w)
			}
		}
	}
}

// TestCardinalityLimit: past 2000 label sets an instrument folds what follows into one
// series labelled otel_metric_overflow="true", and counts nothing twice.
func TestCardinalityLimit(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{})
	const models = 2100
	for i := range models {
		r := okStream
		r.RequestModel = fmt.Sprintf("m-%d", i)
		tel.RecordRequest(context.Background(), r)
	}
	fams := scrape(t, tel)
	for _, name := range []string{"gen_ai_client_operation_duration_seconds", "gen_ai_server_time_to_first_token_seconds"} {
		fam := fams[name]
		var total uint64
		var overflow *uint64
		for _, m := range fam.GetMetric() {
			c := m.GetHistogram().GetSampleCount()
			total += c
			if labelMap(m)["otel_metric_overflow"] == "true" {
				overflow = &c
				if len(m.GetLabel()) != 1 {
					t.Errorf("%s: overflow series labels %v", name, labelNames(m))
				}
			}
		}
		if len(fam.GetMetric()) != 2000 || overflow == nil || *overflow != models-1999 || total != models {
			t.Errorf("%s: %d series, overflow %v, total %d; want 2000, %d, %d", name, len(fam.GetMetric()), overflow, total, models-1999, models)
		}
	}
	// sluice_requests_total has one label set here: no overflow.
	if n := len(fams["sluice_requests_total"].GetMetric()); n != 1 {
		t.Errorf("sluice_requests_total: %d series, want 1", n)
	}
}
