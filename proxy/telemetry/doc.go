// Package telemetry sets up Sluice's OpenTelemetry meter and tracer, holds the
// request instruments, and serves them in the Prometheus format on /metrics.
//
// The gateway handler records metrics and spans around each step of a
// request (policies do not): InFlight when a request starts and ends,
// UpstreamError per failed upstream attempt, RecordRequest once when the
// request is over, StartServer/StartClient/Inject/SetGenAIResult for traces.
// RecordRequest pre-builds and caches its attribute sets per distinct set of
// values, so a request with values seen before costs no allocation of its own.
//
// # Metrics
//
// Names as they appear on /metrics (Prometheus text format; OpenTelemetry
// name in parentheses). Label values: route and cluster are config names,
// error_type is the error class ("" or absent on success: client_cancel,
// upstream_timeout, ttft_timeout, idle_timeout, connect, upstream_5xx,
// upstream_4xx, stream_cut, no_endpoint, bad_request, too_large, ...).
//
// GenAI semantic conventions v1.41.0 (recorded only for requests with an
// operation: chat, text_completion, embeddings). Common labels:
// gen_ai_operation_name, gen_ai_provider_name ("openai": the API every
// upstream speaks), gen_ai_request_model, gen_ai_response_model (when known),
// server_address and server_port (the upstream endpoint that answered last).
//
//   - gen_ai_client_operation_duration_seconds (gen_ai.client.operation.duration)
//     histogram, seconds: the whole request as the gateway saw it. Common
//     labels plus error_type on failure. Buckets 0.01, 0.02, 0.04, 0.08, 0.16,
//     0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92.
//   - gen_ai_client_token_usage (gen_ai.client.token.usage) histogram,
//     tokens: common labels plus gen_ai_token_type (input, output); recorded
//     only when the count is known. Buckets 1, 4, 16, 64, 256, 1024, 4096,
//     16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864.
//   - gen_ai_server_time_to_first_token_seconds
//     (gen_ai.server.time_to_first_token) histogram, seconds: successful
//     requests that produced a token. Common labels. Buckets 0.001, 0.005,
//     0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10.
//   - gen_ai_server_time_per_output_token_seconds
//     (gen_ai.server.time_per_output_token) histogram, seconds: mean time per
//     output token after the first, successful requests with 2 tokens or
//     more. Common labels. Buckets 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
//     0.3, 0.4, 0.5, 0.75, 1, 2.5.
//
// Sluice's own:
//
//   - sluice_requests_total (sluice.requests) counter: every request
//     answered. Labels route, cluster, http_response_status_code (the status
//     the client got; 499 when it went away), error_type on failure.
//   - sluice_requests_in_flight (sluice.requests.in_flight) gauge
//     (UpDownCounter): requests in progress. Label route.
//   - sluice_upstream_errors_total (sluice.upstream.errors) counter: failed
//     upstream attempts (a request retried twice can count twice). Labels
//     cluster, error_type.
//   - sluice_gateway_overhead_seconds (sluice.gateway.overhead) histogram,
//     seconds: time spent in Sluice per request, upstream wait excluded.
//     Label route. Buckets 1e-05, 2.5e-05, 5e-05, 0.0001, 0.00025, 0.0005,
//     0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1.
//   - sluice_request_attempts (sluice.request.attempts) histogram: upstream
//     attempts per request (1 = no retry or fallback). Label route. Buckets
//     1, 2, 3, 4, 5, 6, 8, 10.
//   - sluice_config_reloads_total (sluice.config.reloads) counter:
//     configuration loads. Label result (ok, error).
//   - sluice_config_last_reload_success_timestamp_seconds
//     (sluice.config.last_reload_success_timestamp) gauge, Unix seconds:
//     absent until the first successful load. No labels.
//   - sluice_config_info (sluice.config.info) gauge, always 1: label version,
//     the configuration version in use (absent until SetConfigInfo).
//   - target_info gauge, always 1: the resource (service_name,
//     service_version, telemetry_sdk_*; plus OTEL_RESOURCE_ATTRIBUTES).
//
// Histograms expose _bucket (with le), _sum and _count series. No
// otel_scope_* labels are added. Each instrument keeps at most 2000 label
// sets (the SDK's cardinality limit; the excess is folded into one series
// labelled otel_metric_overflow="true"), so the handler should pass model
// names that a route accepted, not arbitrary client input.
//
// The per-request instruments (the four GenAI ones, sluice.requests, the
// in-flight gauge, overhead and attempts) are aggregated by this package
// (series.go), not by the OpenTelemetry SDK, whose measurement resolves and
// normalises its attribute set and looks up its series on every call: 2.7 µs
// for RecordRequest against 0.3 µs now (BenchmarkRecordRequest), 6% of the
// gateway's CPU at 2,000 req/s. Their exposition is the SDK exporter's, in
// both formats, pinned by TestExpositionGolden (testdata/exposition.txt was
// written by the SDK's exporter): names, help, labels, buckets with inclusive
// upper bounds, the 2000-series limit with its overflow series, exemplars.
// Exemplars follow OTEL_METRICS_EXEMPLAR_FILTER (always_on, always_off,
// trace_based; unset: trace_based when traces are exported, else off): the
// last measurement of each bucket (of a counter: its last increment) with
// trace_id and span_id, shown in the OpenMetrics format; the gauge keeps none.
// The rest (upstream errors, reloads, config info) and every instrument other
// packages make on Meter stay in the SDK; all appear on the same registry.
//
// # Time to first token and time per output token
//
// GenAI conventions v1.41.0 define two pairs: client-side
// gen_ai.client.operation.time_to_first_chunk / time_per_output_chunk and
// model-server-side gen_ai.server.time_to_first_token / time_per_output_token.
// Sluice uses the server pair. The client chunk metric is recorded once per
// chunk (an inter-chunk latency), which RecordRequest cannot give and which
// would cost a measurement per token; the server pair is per request, and its
// definitions (successful responses; mean time per output token after the
// first) are the ones Sluice measures, the same as vLLM's. To its own clients
// Sluice is the GenAI server, and reporting under the model servers' names
// and buckets puts the gateway's figures next to theirs for the same model
// (told apart by the scrape's job/instance labels). Duration and token usage
// have no such choice and use the client instruments the spec requires.
//
// # Traces
//
// Tracing is on when Options.SpanExporter is set, or when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
// (OTLP/gRPC, batched; OTEL_TRACES_SAMPLER and the other OTEL_* variables
// apply) and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none.
// Otherwise the tracer provider is a no-op and spans cost nothing.
//
// Propagation is W3C Trace Context (traceparent, tracestate) only. With
// tracing on, StartServer's span is the child of the incoming traceparent,
// StartClient's span the child of the server span, and Inject writes the
// client span as the upstream's parent. With tracing off, StartServer still
// extracts the incoming span context into the returned context and returns
// it as a non-recording span, and StartClient returns the context unchanged:
// Inject on either context writes the incoming traceparent and tracestate
// exactly as received (the no-op tracer keeps the parent span context), and
// nothing when there was none. Inject always replaces traceparent/tracestate
// headers copied from the incoming request.
//
// Span attributes: server span: http.request.method, url.path, sluice.route;
// client span: gen_ai.operation.name, gen_ai.provider.name,
// gen_ai.request.model, server.address, server.port, sluice.cluster,
// sluice.endpoint, sluice.attempt (and http.request.resend_count from the
// second attempt on); SetGenAIResult adds the outcome to either.
package telemetry
