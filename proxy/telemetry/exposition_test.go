package telemetry

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

var update = flag.Bool("update", false, "rewrite testdata/exposition.txt from this build")

// exposition is /metrics in the format accept asks for, target_info left out (its labels
// name the SDK's version).
func exposition(t *testing.T, tel *Telemetry, accept string) string {
	t.Helper()
	var b strings.Builder
	for line := range strings.Lines(string(metricsBody(t, tel, accept))) {
		if !strings.Contains(line, "target_info") {
			b.WriteString(line)
		}
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

// TestExemplars: with traces exported, a measurement under a sampled span leaves an
// exemplar (trace_id, span_id, its value) on its histogram bucket and on the request
// counter, never on the in-flight gauge; none without a sampled span, with tracing off,
// or with OTEL_METRICS_EXEMPLAR_FILTER=always_off.
func TestExemplars(t *testing.T) {
	tests := []struct {
		name    string
		tracing bool
		filter  string
		sampled bool
		want    bool
	}{
		{"sampled span", true, "", true, true},
		{"span not sampled", true, "", false, false},
		{"filter always_off", true, "always_off", true, false},
		{"tracing off", false, "", false, false},
		{"tracing off, filter always_on", false, "always_on", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			noTraceEnv(t)
			t.Setenv("OTEL_METRICS_EXEMPLAR_FILTER", tt.filter)
			opts := Options{}
			if tt.tracing {
				opts.SpanExporter = tracetest.NewNoopExporter()
			}
			tel := newTel(t, opts)
			ctx := context.Background()
			var tid string
			if tt.tracing {
				var span trace.Span
				ctx, span = tel.StartServer(ctx, incomingRequest(), "chat")
				defer span.End()
				if !tt.sampled {
					ctx = trace.ContextWithSpanContext(context.Background(),
						span.SpanContext().WithTraceFlags(0))
				}
				tid = span.SpanContext().TraceID().String()
			}
			tel.RecordRequest(ctx, okStream)
			tel.InFlight(ctx, "chat", 1)
			tel.UpstreamError(ctx, "llama-primary", "upstream_timeout") // an SDK instrument: the same filter
			out := exposition(t, tel, "application/openmetrics-text; version=1.0.0")
			for _, name := range []string{
				"gen_ai_client_operation_duration_seconds_bucket", "gen_ai_client_token_usage_bucket",
				"gen_ai_server_time_to_first_token_seconds_bucket", "gen_ai_server_time_per_output_token_seconds_bucket",
				"sluice_gateway_overhead_seconds_bucket", "sluice_request_attempts_bucket", "sluice_requests_total",
				"sluice_upstream_errors_total",
			} {
				var n int
				for _, line := range strings.Split(out, "\n") {
					if strings.HasPrefix(line, name+"{") && strings.Contains(line, " # {") {
						n++
						if tid != "" && tt.want && !strings.Contains(line, `trace_id="`+tid+`"`) {
							t.Errorf("%s: exemplar without the span's trace: %s", name, line)
						}
					}
				}
				want := 0
				if tt.want {
					want = 1
					if name == "gen_ai_client_token_usage_bucket" {
						want = 2 // input and output
					}
				}
				if n != want {
					t.Errorf("%s: %d exemplars, want %d", name, n, want)
				}
			}
			if strings.Contains(out, "sluice_requests_in_flight{route=\"chat\"} 1.0 #") {
				t.Error("the in-flight gauge carries an exemplar")
			}
		})
	}
}

// TestConcurrentHistograms: parallel measurements of one series lose nothing: the count
// and the sum are every measurement's.
func TestConcurrentHistograms(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{})
	const workers, each = 8, 500
	done := make(chan struct{})
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for range each {
				tel.RecordRequest(context.Background(), okStream) // overhead 80 µs, attempts 1
			}
		}()
	}
	for range workers {
		<-done
	}
	fams := scrape(t, tel)
	h := find(fams["sluice_request_attempts"], map[string]string{"route": "chat"}).GetHistogram()
	if h.GetSampleCount() != workers*each || h.GetSampleSum() != workers*each {
		t.Errorf("attempts: count %d sum %v, want %d", h.GetSampleCount(), h.GetSampleSum(), workers*each)
	}
	o := find(fams["sluice_gateway_overhead_seconds"], map[string]string{"route": "chat"}).GetHistogram()
	if want := 80e-6 * workers * each; o.GetSampleCount() != workers*each || math.Abs(o.GetSampleSum()-want) > 1e-9 {
		t.Errorf("overhead: count %d sum %v, want %d and %v", o.GetSampleCount(), o.GetSampleSum(), workers*each, want)
	}
}
