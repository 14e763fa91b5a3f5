package telemetry

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noTraceEnv makes sure the environment does not turn OTLP tracing on.
func noTraceEnv(t *testing.T) {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
}

func newTel(t *testing.T, opts Options) *Telemetry {
	t.Helper()
	tel, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tel.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return tel
}

// scrape GETs /metrics from Handler over HTTP and parses the text exposition.
func scrape(t *testing.T, tel *Telemetry) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(metricsBody(t, tel, "")))
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	return fams
}

// metricsBody GETs /metrics from Handler over HTTP with accept as its Accept header ("":
// none, the text format).
func metricsBody(t *testing.T, tel *Telemetry, accept string) []byte {
	t.Helper()
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return b
}

func labelNames(m *dto.Metric) []string {
	var out []string
	for _, l := range m.GetLabel() {
		out = append(out, l.GetName())
	}
	sort.Strings(out)
	return out
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// find returns the series of fam whose labels include want.
func find(fam *dto.MetricFamily, want map[string]string) *dto.Metric {
	if fam == nil {
		return nil
	}
outer:
	for _, m := range fam.GetMetric() {
		got := labelMap(m)
		for k, v := range want {
			if got[k] != v {
				continue outer
			}
		}
		return m
	}
	return nil
}

var okStream = RequestRecord{
	Route: "chat", Cluster: "llama-primary", Endpoint: "http://10.0.0.5:8000",
	Operation: "chat", RequestModel: "llama-3", ResponseModel: "llama-3-70b-instruct",
	Stream: true, Status: 200, Duration: 1500 * time.Millisecond,
	TTFT: 120 * time.Millisecond, TPOT: 30 * time.Millisecond,
	InputTokens: 321, OutputTokens: 45, Overhead: 80 * time.Microsecond, Attempts: 1,
}

var failed = RequestRecord{
	Route: "chat", Cluster: "llama-primary", Endpoint: "http://10.0.0.5:8000",
	Operation: "chat", RequestModel: "llama-3", Stream: true, Status: 504,
	ErrorClass: "upstream_timeout", Duration: 10 * time.Second, Overhead: 50 * time.Microsecond, Attempts: 2,
}

var genAILabels = []string{"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model", "server_address", "server_port"}

func with(base []string, more ...string) []string {
	out := append(slices.Clone(base), more...)
	sort.Strings(out)
	return out
}

// TestExposition checks every metric the package documents: name on
// /metrics, type and label names.
func TestExposition(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{ServiceVersion: "test"})
	ctx := context.Background()
	tel.RecordRequest(ctx, okStream)
	tel.RecordRequest(ctx, failed)
	tel.InFlight(ctx, "chat", 1)
	tel.UpstreamError(ctx, "llama-primary", "connect")
	tel.ConfigReload(ctx, true)
	tel.ConfigReload(ctx, false)
	tel.SetConfigInfo("v42")
	fams := scrape(t, tel)

	tests := []struct {
		name   string
		typ    dto.MetricType
		labels []string // the exact label names of one series
	}{
		{"gen_ai_client_operation_duration_seconds", dto.MetricType_HISTOGRAM, with(genAILabels)},
		{"gen_ai_client_operation_duration_seconds", dto.MetricType_HISTOGRAM, []string{"error_type", "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "server_address", "server_port"}},
		{"gen_ai_client_token_usage", dto.MetricType_HISTOGRAM, with(genAILabels, "gen_ai_token_type")},
		{"gen_ai_server_time_to_first_token_seconds", dto.MetricType_HISTOGRAM, with(genAILabels)},
		{"gen_ai_server_time_per_output_token_seconds", dto.MetricType_HISTOGRAM, with(genAILabels)},
		{"sluice_requests_total", dto.MetricType_COUNTER, []string{"cluster", "http_response_status_code", "route"}},
		{"sluice_requests_total", dto.MetricType_COUNTER, []string{"cluster", "error_type", "http_response_status_code", "route"}},
		{"sluice_requests_in_flight", dto.MetricType_GAUGE, []string{"route"}},
		{"sluice_upstream_errors_total", dto.MetricType_COUNTER, []string{"cluster", "error_type"}},
		{"sluice_gateway_overhead_seconds", dto.MetricType_HISTOGRAM, []string{"route"}},
		{"sluice_request_attempts", dto.MetricType_HISTOGRAM, []string{"route"}},
		{"sluice_config_reloads_total", dto.MetricType_COUNTER, []string{"result"}},
		{"sluice_config_last_reload_success_timestamp_seconds", dto.MetricType_GAUGE, nil},
		{"sluice_config_info", dto.MetricType_GAUGE, []string{"version"}},
		{"target_info", dto.MetricType_GAUGE, []string{"service_name", "service_version", "telemetry_sdk_language", "telemetry_sdk_name", "telemetry_sdk_version"}},
	}
	for _, tt := range tests {
		t.Run(tt.name+fmt.Sprint(tt.labels), func(t *testing.T) {
			fam, ok := fams[tt.name]
			if !ok {
				t.Fatalf("%s missing from /metrics", tt.name)
			}
			if fam.GetType() != tt.typ {
				t.Fatalf("%s: type %v, want %v", tt.name, fam.GetType(), tt.typ)
			}
			var seen [][]string
			for _, m := range fam.GetMetric() {
				got := labelNames(m)
				if slices.Equal(got, tt.labels) {
					return
				}
				seen = append(seen, got)
			}
			t.Errorf("%s: no series with labels %v; have %v", tt.name, tt.labels, seen)
		})
	}

	// Nothing undocumented: every family on /metrics is in the table.
	for name := range fams {
		if !slices.ContainsFunc(tests, func(tt struct {
			name   string
			typ    dto.MetricType
			labels []string
		}) bool {
			return tt.name == name
		}) {
			t.Errorf("undocumented metric %s on /metrics", name)
		}
	}

	if v := fams["sluice_config_info"].GetMetric(); len(v) != 1 || labelMap(v[0])["version"] != "v42" {
		t.Errorf("sluice_config_info = %v", v)
	}
	ts := fams["sluice_config_last_reload_success_timestamp_seconds"].GetMetric()[0].GetGauge().GetValue()
	if d := time.Since(time.Unix(0, int64(ts*1e9))); d < 0 || d > time.Minute {
		t.Errorf("last reload timestamp %v is %v from now", ts, d)
	}
}

// TestBuckets checks the bucket boundaries as exposed.
func TestBuckets(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{})
	tel.RecordRequest(context.Background(), okStream)
	fams := scrape(t, tel)
	tests := []struct {
		name string
		want []float64
	}{
		{"gen_ai_client_operation_duration_seconds", []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}},
		{"gen_ai_client_token_usage", []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}},
		{"gen_ai_server_time_to_first_token_seconds", []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}},
		{"gen_ai_server_time_per_output_token_seconds", []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}},
		{"sluice_gateway_overhead_seconds", []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1}},
		{"sluice_request_attempts", []float64{1, 2, 3, 4, 5, 6, 8, 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fam := fams[tt.name]
			if fam == nil || len(fam.GetMetric()) == 0 {
				t.Fatalf("%s missing", tt.name)
			}
			var got []float64
			for _, b := range fam.GetMetric()[0].GetHistogram().GetBucket() {
				got = append(got, b.GetUpperBound())
			}
			// The text format adds le="+Inf"; the parser may or may not keep it.
			if n := len(got); n > 0 && got[n-1] > 1e300 {
				got = got[:n-1]
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("buckets %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRecordRequest checks what one record puts where.
func TestRecordRequest(t *testing.T) {
	noTraceEnv(t)
	embeddings := RequestRecord{Route: "embed", Cluster: "e5", Endpoint: "10.0.0.9:9000", Operation: "embeddings",
		RequestModel: "e5-large", Status: 200, Duration: 20 * time.Millisecond, InputTokens: 12, Attempts: 1}
	models := RequestRecord{Route: "models", Status: 200, Duration: time.Millisecond}
	tests := []struct {
		name string
		rec  RequestRecord
		// series that must have count 1, by family, selected by labels
		want map[string]map[string]string
		// families that must have no series at all
		absent []string
	}{
		{
			name: "stream ok",
			rec:  okStream,
			want: map[string]map[string]string{
				"sluice_requests_total":                       {"route": "chat", "cluster": "llama-primary", "http_response_status_code": "200"},
				"gen_ai_client_operation_duration_seconds":    {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai", "gen_ai_request_model": "llama-3", "gen_ai_response_model": "llama-3-70b-instruct", "server_address": "10.0.0.5", "server_port": "8000"},
				"gen_ai_client_token_usage":                   {"gen_ai_token_type": "output"},
				"gen_ai_server_time_to_first_token_seconds":   {"gen_ai_request_model": "llama-3"},
				"gen_ai_server_time_per_output_token_seconds": {"gen_ai_request_model": "llama-3"},
				"sluice_gateway_overhead_seconds":             {"route": "chat"},
				"sluice_request_attempts":                     {"route": "chat"},
			},
		},
		{
			name: "upstream timeout",
			rec:  failed,
			want: map[string]map[string]string{
				"sluice_requests_total":                    {"error_type": "upstream_timeout", "http_response_status_code": "504"},
				"gen_ai_client_operation_duration_seconds": {"error_type": "upstream_timeout"},
			},
			absent: []string{"gen_ai_client_token_usage", "gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds"},
		},
		{
			name: "embeddings",
			rec:  embeddings,
			want: map[string]map[string]string{
				"gen_ai_client_operation_duration_seconds": {"gen_ai_operation_name": "embeddings", "server_address": "10.0.0.9", "server_port": "9000"},
				"gen_ai_client_token_usage":                {"gen_ai_token_type": "input"},
			},
			absent: []string{"gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds", "sluice_gateway_overhead_seconds"},
		},
		{
			name:   "not a GenAI operation",
			rec:    models,
			want:   map[string]map[string]string{"sluice_requests_total": {"route": "models", "cluster": ""}},
			absent: []string{"gen_ai_client_operation_duration_seconds", "gen_ai_client_token_usage", "sluice_request_attempts"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tel := newTel(t, Options{})
			tel.RecordRequest(context.Background(), tt.rec)
			fams := scrape(t, tel)
			for name, labels := range tt.want {
				m := find(fams[name], labels)
				if m == nil {
					t.Errorf("%s: no series with %v", name, labels)
					continue
				}
				var n uint64
				if h := m.GetHistogram(); h != nil {
					n = h.GetSampleCount()
				} else {
					n = uint64(m.GetCounter().GetValue())
				}
				if n != 1 {
					t.Errorf("%s%v: count %d, want 1", name, labels, n)
				}
			}
			for _, name := range tt.absent {
				if f := fams[name]; f != nil && len(f.GetMetric()) > 0 {
					t.Errorf("%s recorded: %v", name, f.GetMetric())
				}
			}
		})
	}

	t.Run("token counts", func(t *testing.T) {
		tel := newTel(t, Options{})
		tel.RecordRequest(context.Background(), okStream)
		fams := scrape(t, tel)
		for typ, want := range map[string]float64{"input": 321, "output": 45} {
			m := find(fams["gen_ai_client_token_usage"], map[string]string{"gen_ai_token_type": typ})
			if got := m.GetHistogram().GetSampleSum(); got != want {
				t.Errorf("%s tokens sum %v, want %v", typ, got, want)
			}
		}
	})
}

func TestInFlightAndConfigInfo(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{})
	ctx := context.Background()
	for range 3 {
		tel.InFlight(ctx, "chat", 1)
	}
	tel.InFlight(ctx, "chat", -1)
	tel.SetConfigInfo("v1")
	tel.SetConfigInfo("v2")
	fams := scrape(t, tel)
	if got := find(fams["sluice_requests_in_flight"], map[string]string{"route": "chat"}).GetGauge().GetValue(); got != 2 {
		t.Errorf("in flight %v, want 2", got)
	}
	info := fams["sluice_config_info"].GetMetric()
	if len(info) != 1 || labelMap(info[0])["version"] != "v2" || info[0].GetGauge().GetValue() != 1 {
		t.Errorf("config info %v, want only version v2 = 1", info)
	}
	if _, ok := fams["sluice_config_last_reload_success_timestamp_seconds"]; ok {
		t.Error("last reload success exported before any success")
	}
	// Before any reload both reload series are there at 0: the first failure is an increase.
	for _, result := range []string{"ok", "error"} {
		m := find(fams["sluice_config_reloads_total"], map[string]string{"result": result})
		if m == nil || m.GetCounter().GetValue() != 0 {
			t.Errorf("sluice_config_reloads_total{result=%q} before any reload: %v, want 0", result, m)
		}
	}
}

const (
	incomingTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingParent = "00f067aa0ba902b7"
	incomingTP     = "00-" + incomingTrace + "-" + incomingParent + "-01"
	incomingTS     = "vendor=opaque"
)

func incomingRequest() *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("traceparent", incomingTP)
	r.Header.Set("tracestate", incomingTS)
	return r
}

func TestSpans(t *testing.T) {
	noTraceEnv(t)
	exp := tracetest.NewInMemoryExporter()
	tel := newTel(t, Options{SpanExporter: exp})
	if !tel.TracingEnabled() {
		t.Fatal("tracing off with an explicit exporter")
	}
	ctx, srv := tel.StartServer(context.Background(), incomingRequest(), "chat")
	srv.SetName("chat llama-3")
	cctx, cli := tel.StartClient(ctx, "chat", "llama-3", "llama-primary", "http://10.0.0.5:8000", 2)
	up := http.Header{}
	up.Set("Traceparent", "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01") // forwarded, stale
	tel.Inject(cctx, up)
	SetGenAIResult(cli, failed)
	cli.End()
	SetGenAIResult(srv, okStream)
	srv.End()

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	client, server := spans[0], spans[1]
	if server.SpanKind != trace.SpanKindServer || client.SpanKind != trace.SpanKindClient {
		t.Errorf("kinds %v, %v", server.SpanKind, client.SpanKind)
	}
	if got := server.Parent; !got.IsRemote() || got.TraceID().String() != incomingTrace || got.SpanID().String() != incomingParent {
		t.Errorf("server parent %v, want remote %s/%s", got, incomingTrace, incomingParent)
	}
	if server.SpanContext.TraceID().String() != incomingTrace {
		t.Errorf("server trace %s", server.SpanContext.TraceID())
	}
	if server.SpanContext.TraceState().String() != incomingTS {
		t.Errorf("tracestate %q not kept", server.SpanContext.TraceState())
	}
	if client.Parent.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("client parent %s, want server %s", client.Parent.SpanID(), server.SpanContext.SpanID())
	}
	wantTP := "00-" + incomingTrace + "-" + client.SpanContext.SpanID().String() + "-01"
	if got := up.Get("traceparent"); got != wantTP {
		t.Errorf("upstream traceparent %q, want %q", got, wantTP)
	}
	if got := up.Get("tracestate"); got != incomingTS {
		t.Errorf("upstream tracestate %q", got)
	}
	if server.Name != "chat llama-3" || client.Name != "chat llama-3" {
		t.Errorf("names %q, %q", server.Name, client.Name)
	}

	checkAttrs(t, "client", client, map[string]any{
		"gen_ai.operation.name":     "chat",
		"gen_ai.provider.name":      "openai",
		"gen_ai.request.model":      "llama-3",
		"server.address":            "10.0.0.5",
		"server.port":               int64(8000),
		"sluice.cluster":            "llama-primary",
		"sluice.attempt":            int64(2),
		"http.request.resend_count": int64(1),
		"error.type":                "upstream_timeout",
		"http.response.status_code": int64(504),
	})
	if client.Status.Code != codes.Error || client.Status.Description != "upstream_timeout" {
		t.Errorf("client status %v", client.Status)
	}
	checkAttrs(t, "server", server, map[string]any{
		"http.request.method":                 "POST",
		"url.path":                            "/v1/chat/completions",
		"sluice.route":                        "chat",
		"gen_ai.usage.input_tokens":           int64(321),
		"gen_ai.usage.output_tokens":          int64(45),
		"gen_ai.response.model":               "llama-3-70b-instruct",
		"gen_ai.request.stream":               true,
		"gen_ai.response.time_to_first_chunk": 0.12,
		"http.response.status_code":           int64(200),
	})
	if server.Status.Code != codes.Unset {
		t.Errorf("server status %v", server.Status)
	}
	if hasAttr(server, "error.type") {
		t.Error("error.type on a successful span")
	}
}

func hasAttr(s tracetest.SpanStub, key string) bool {
	return slices.ContainsFunc(s.Attributes, func(kv attribute.KeyValue) bool { return string(kv.Key) == key })
}

func checkAttrs(t *testing.T, which string, s tracetest.SpanStub, want map[string]any) {
	t.Helper()
	got := map[string]any{}
	for _, kv := range s.Attributes {
		got[string(kv.Key)] = kv.Value.AsInterface()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s span %s = %v (%T), want %v (%T)", which, k, got[k], got[k], v, v)
		}
	}
}

func TestSpanStatus(t *testing.T) {
	noTraceEnv(t)
	exp := tracetest.NewInMemoryExporter()
	tel := newTel(t, Options{SpanExporter: exp})
	tests := []struct {
		class string
		want  codes.Code
	}{
		{"", codes.Unset},
		{"client_cancel", codes.Unset},
		{"bad_request", codes.Unset},
		{"too_large", codes.Unset},
		{"upstream_5xx", codes.Error},
		{"ttft_timeout", codes.Error},
		{"stream_cut", codes.Error},
		{"no_endpoint", codes.Error},
	}
	for _, tt := range tests {
		t.Run(tt.class, func(t *testing.T) {
			exp.Reset()
			_, span := tel.StartServer(context.Background(), httptest.NewRequest("POST", "/v1/completions", nil), "r")
			SetGenAIResult(span, RequestRecord{Operation: "text_completion", Status: 500, ErrorClass: tt.class})
			span.End()
			s := exp.GetSpans()[0]
			if s.Status.Code != tt.want {
				t.Errorf("status %v, want %v", s.Status.Code, tt.want)
			}
			if s.Parent.IsValid() {
				t.Errorf("root span has parent %v", s.Parent)
			}
			if got := hasAttr(s, "error.type"); got != (tt.class != "") {
				t.Errorf("error.type present = %v", got)
			}
		})
	}
}

// TestInjectWithoutTracer: no exporter, no environment: the no-op provider
// keeps the incoming span context, so Inject forwards it unchanged.
func TestInjectWithoutTracer(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{})
	if tel.TracingEnabled() {
		t.Fatal("tracing on without exporter or environment")
	}
	tests := []struct {
		name   string
		req    *http.Request
		wantTP string
		wantTS string
	}{
		{"incoming traceparent", incomingRequest(), incomingTP, incomingTS},
		{"none", httptest.NewRequest("POST", "/v1/chat/completions", nil), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, srv := tel.StartServer(context.Background(), tt.req, "chat")
			srv.SetName("chat m")
			if srv.IsRecording() {
				t.Error("no-op server span is recording")
			}
			cctx, cli := tel.StartClient(ctx, "chat", "m", "c", "http://h:1", 1)
			SetGenAIResult(cli, failed)
			cli.End()
			for name, ctx := range map[string]context.Context{"server": ctx, "client": cctx} {
				up := http.Header{}
				up.Set("Traceparent", "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01")
				up.Set("Tracestate", "stale=1")
				tel.Inject(ctx, up)
				if got := up.Get("traceparent"); got != tt.wantTP {
					t.Errorf("%s ctx: traceparent %q, want %q", name, got, tt.wantTP)
				}
				if got := up.Get("tracestate"); got != tt.wantTS {
					t.Errorf("%s ctx: tracestate %q, want %q", name, got, tt.wantTS)
				}
			}
			srv.End()
		})
	}
}

// TestOTLPFromEnvironment: the OTLP endpoint in the environment turns
// tracing on; Shutdown stops everything it started.
func TestOTLPFromEnvironment(t *testing.T) {
	// The unreachable collector makes the SDK report export errors: keep
	// them out of the test output.
	prev := otel.GetErrorHandler()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {}))
	t.Cleanup(func() { otel.SetErrorHandler(prev) })
	tests := []struct {
		name string
		env  map[string]string
		on   bool
	}{
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, true},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"}, true},
		{"sdk disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, false},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}, false},
		{"nothing", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			noTraceEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			tel, err := New(context.Background(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tel.TracingEnabled() != tt.on {
				t.Errorf("tracing %v, want %v", tel.TracingEnabled(), tt.on)
			}
			ctx, span := tel.StartServer(context.Background(), incomingRequest(), "chat")
			_, cli := tel.StartClient(ctx, "chat", "m", "c", "h:1", 1)
			cli.End()
			span.End()
			// The collector is unreachable: the pending export may fail or
			// time out, but nothing may keep running afterwards.
			sctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_ = tel.Shutdown(sctx)
			goleak.VerifyNone(t)
		})
	}
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in   string
		want hostPort
	}{
		{"", hostPort{}},
		{"http://10.0.0.5:8000", hostPort{"10.0.0.5", 8000}},
		{"https://api.example.com/v1", hostPort{"api.example.com", 443}},
		{"http://vllm.svc", hostPort{"vllm.svc", 80}},
		{"http://[::1]:9000", hostPort{"::1", 9000}},
		{"10.0.0.5:8000", hostPort{"10.0.0.5", 8000}},
		{"vllm-0", hostPort{"vllm-0", 0}},
	}
	for _, tt := range tests {
		if got := parseEndpoint(tt.in); got != tt.want {
			t.Errorf("parseEndpoint(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestOptCacheBounded(t *testing.T) {
	builds := 0
	c := optCache[int, int]{build: func(k int) int { builds++; return k * 2 }}
	for i := range cacheLimit + 10 {
		if got := c.get(i); got != i*2 {
			t.Fatalf("get(%d) = %d", i, got)
		}
	}
	if len(c.m) > cacheLimit {
		t.Errorf("cache holds %d, limit %d", len(c.m), cacheLimit)
	}
	n := builds
	c.get(cacheLimit + 9)
	if builds != n {
		t.Error("recent key rebuilt")
	}
}

// TestConcurrentUse runs every method from many goroutines (meaningful
// under -race).
func TestConcurrentUse(t *testing.T) {
	noTraceEnv(t)
	tel := newTel(t, Options{SpanExporter: tracetest.NewNoopExporter()})
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			ctx := context.Background()
			for i := range 200 {
				r := okStream
				r.RequestModel = fmt.Sprintf("m%d", (g+i)%5)
				tel.InFlight(ctx, r.Route, 1)
				ctx2, s := tel.StartServer(ctx, incomingRequest(), r.Route)
				_, c := tel.StartClient(ctx2, r.Operation, r.RequestModel, r.Cluster, r.Endpoint, 1)
				tel.Inject(ctx2, http.Header{})
				SetGenAIResult(c, r)
				c.End()
				s.End()
				tel.RecordRequest(ctx, r)
				tel.UpstreamError(ctx, r.Cluster, "connect")
				tel.ConfigReload(ctx, i%2 == 0)
				tel.SetConfigInfo(fmt.Sprint(i))
				tel.InFlight(ctx, r.Route, -1)
			}
		}()
	}
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	for range 5 {
		resp, err := http.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
	}
	for range 8 {
		<-done
	}
	fams := scrape(t, tel)
	var total float64
	for _, m := range fams["sluice_requests_total"].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	if total != 8*200 {
		t.Errorf("requests %v, want %d", total, 8*200)
	}
}

func BenchmarkRecordRequest(b *testing.B) {
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	b.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	run := func(b *testing.B, opts Options, ctx func(*Telemetry) context.Context) {
		tel, err := New(context.Background(), opts)
		if err != nil {
			b.Fatal(err)
		}
		defer tel.Shutdown(context.Background())
		c := ctx(tel)
		tel.RecordRequest(c, okStream) // warm the attribute cache
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			tel.RecordRequest(c, okStream)
		}
	}
	b.Run("no-tracing", func(b *testing.B) {
		run(b, Options{}, func(*Telemetry) context.Context { return context.Background() })
	})
	b.Run("sampled-span", func(b *testing.B) {
		// Tracing on and a sampled span in ctx: exemplars are collected.
		run(b, Options{SpanExporter: tracetest.NewNoopExporter()}, func(tel *Telemetry) context.Context {
			ctx, _ := tel.StartServer(context.Background(), incomingRequest(), "chat")
			return ctx
		})
	})
	b.Run("parallel", func(b *testing.B) {
		tel, err := New(context.Background(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer tel.Shutdown(context.Background())
		tel.RecordRequest(context.Background(), okStream)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tel.RecordRequest(context.Background(), okStream)
			}
		})
	})
}
