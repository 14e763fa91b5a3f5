package telemetry

import (
	"context"
	"net/http"
	"net/textproto"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicegw/sluice/proxy/httphead"
)

// StartServer starts the server span of an incoming request, child of the
// W3C traceparent/tracestate in r's headers if any. Its name is
// "<method>" (with route: "<method> <route>") until the handler renames it
// "<operation> <model>" with SetServerRequest once the body is parsed and
// the route matched.
//
// With tracing off it returns the context carrying the incoming span context
// (if any) and a non-recording span: ending or renaming it does nothing, and
// Inject on that context forwards the incoming traceparent unchanged.
func (t *Telemetry) StartServer(ctx context.Context, r *http.Request, route string) (context.Context, trace.Span) {
	ctx = t.prop.Extract(ctx, headerCarrier(r.Header))
	if !t.tracing {
		return ctx, trace.SpanFromContext(ctx)
	}
	name := r.Method
	if route != "" {
		name += " " + route
	}
	return t.tracer.Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			keyRequestMethod.String(r.Method),
			keyURLPath.String(r.URL.Path),
			keySluiceRoute.String(route),
		))
}

// ServerRequest is what the handler knows of a request once it is parsed and matched, for
// the server span.
type ServerRequest struct {
	Method, Route    string
	Operation, Model string // gen_ai.operation.name ("" for other kinds) and gen_ai.request.model
	MaxTokens        int    // gen_ai.request.max_tokens (0: not set)
	Temperature      *float64
	Seed             *int64
}

// SetServerRequest names the server span as the GenAI conventions name inference spans,
// "{gen_ai.operation.name} {gen_ai.request.model}" ("{method} {route}" for other requests),
// and sets the route and the GenAI request attributes on it, so that the span carries both
// the operation and (with SetGenAIResult) the usage. A non-recording span costs nothing.
func SetServerRequest(span trace.Span, r ServerRequest) {
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs, keySluiceRoute.String(r.Route))
	r.Model = boundModel(r.Model)
	switch {
	case r.Operation != "":
		name := r.Operation
		if r.Model != "" {
			name += " " + r.Model
			attrs = append(attrs, keyRequestModel.String(r.Model))
		}
		span.SetName(name)
		attrs = append(attrs, keyOperationName.String(r.Operation), keyProviderName.String(ProviderName))
		if r.MaxTokens > 0 {
			attrs = append(attrs, keyRequestMaxTokens.Int(r.MaxTokens))
		}
		if r.Temperature != nil {
			attrs = append(attrs, keyRequestTemperature.Float64(*r.Temperature))
		}
		if r.Seed != nil {
			attrs = append(attrs, keyRequestSeed.Int64(*r.Seed))
		}
	case r.Route != "":
		span.SetName(r.Method + " " + r.Route)
	}
	span.SetAttributes(attrs...)
}

// StartClient starts the client span of one upstream attempt (attempt counts
// from 1), named "<operation> <model>" as the GenAI conventions name
// inference spans, with the GenAI request attributes. With tracing off it
// returns ctx and its (non-recording) span unchanged.
func (t *Telemetry) StartClient(ctx context.Context, operation, model, cluster, endpoint string, attempt int) (context.Context, trace.Span) {
	if !t.tracing {
		return ctx, trace.SpanFromContext(ctx)
	}
	model = boundModel(model)
	name := operation
	switch {
	case name == "":
		name = "upstream"
		if model != "" {
			name += " " + model
		}
	case model != "":
		name += " " + model
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	if operation != "" {
		attrs = append(attrs, keyOperationName.String(operation))
	}
	attrs = append(attrs, keyProviderName.String(ProviderName))
	if model != "" {
		attrs = append(attrs, keyRequestModel.String(model))
	}
	if hp := t.inst.endpointCache.get(endpoint); hp.host != "" {
		attrs = append(attrs, keyServerAddress.String(hp.host))
		if hp.port != 0 {
			attrs = append(attrs, keyServerPort.Int(hp.port))
		}
	}
	attrs = append(attrs, keySluiceCluster.String(cluster), keySluiceEndpoint.String(endpoint), keyAttempt.Int(attempt))
	if attempt > 1 {
		attrs = append(attrs, keyResendCount.Int(attempt-1))
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// Inject writes the traceparent (and tracestate, if any) of ctx's span into
// h, the upstream request's headers, replacing any forwarded ones. Pass the
// context from StartClient, or from StartServer: with tracing off that
// context holds the incoming span context, so the incoming traceparent is
// propagated unchanged; with no incoming one, nothing is written.
func (t *Telemetry) Inject(ctx context.Context, h http.Header) {
	delete(h, "Traceparent")
	delete(h, "Tracestate")
	t.prop.Inject(ctx, headerCarrier(h))
}

// headerCarrier is propagation.HeaderCarrier for the W3C trace context's own keys without
// canonicalizing them on every request: the propagator asks for "traceparent" and
// "tracestate", which http.Header.Get canonicalizes (and, not being among net/textproto's
// common names, allocates) on each call. Other keys go through the canonicalization.
type headerCarrier http.Header

func (c headerCarrier) Get(key string) string {
	return httphead.Get(http.Header(c), canonicalKey(key))
}

func (c headerCarrier) Set(key, value string) {
	httphead.Set(http.Header(c), canonicalKey(key), value)
}

func (c headerCarrier) Keys() []string { return propagation.HeaderCarrier(c).Keys() }

func canonicalKey(key string) string {
	switch key {
	case "traceparent":
		return "Traceparent"
	case "tracestate":
		return "Tracestate"
	case "baggage":
		return "Baggage"
	}
	return textproto.CanonicalMIMEHeaderKey(key)
}

// callerFault lists the error classes caused by the caller, not by Sluice or
// an upstream: they set error.type but leave the span status unset.
var callerFault = map[string]bool{"client_cancel": true, "bad_request": true, "too_large": true}

// SetGenAIResult sets a request's (or one attempt's) outcome on span (server or
// client): gen_ai.usage.input_tokens and gen_ai.usage.output_tokens (when known),
// gen_ai.response.model, gen_ai.response.finish_reasons, gen_ai.response.id,
// http.response.status_code, gen_ai.request.stream,
// gen_ai.response.time_to_first_chunk (streams), error.type, and the span status: Error with the error class as its
// description, unless the class is the caller's fault (client_cancel,
// bad_request, too_large). A non-recording span costs nothing.
func SetGenAIResult(span trace.Span, r RequestRecord) {
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 9)
	if r.InputTokens > 0 {
		attrs = append(attrs, keyInputTokens.Int(r.InputTokens))
	}
	if r.OutputTokens > 0 {
		attrs = append(attrs, keyOutputTokens.Int(r.OutputTokens))
	}
	if r.ResponseModel != "" {
		attrs = append(attrs, keyResponseModel.String(r.ResponseModel))
	}
	if r.Status != 0 {
		attrs = append(attrs, keyStatusCode.Int(r.Status))
	}
	if r.Operation == "chat" || r.Operation == "text_completion" {
		attrs = append(attrs, keyRequestStream.Bool(r.Stream))
	}
	if r.Stream && r.TTFT > 0 {
		attrs = append(attrs, keyTimeToFirstChunk.Float64(r.TTFT.Seconds()))
	}
	if r.FinishReason != "" {
		attrs = append(attrs, keyFinishReasons.StringSlice([]string{r.FinishReason}))
	}
	if r.ResponseID != "" {
		attrs = append(attrs, keyResponseID.String(r.ResponseID))
	}
	if r.ErrorClass != "" {
		attrs = append(attrs, keyErrorType.String(r.ErrorClass))
	}
	span.SetAttributes(attrs...)
	if r.ErrorClass != "" && !callerFault[r.ErrorClass] {
		span.SetStatus(codes.Error, r.ErrorClass)
	}
}

// maxModelAttr bounds a model name in span names and attributes: it may come from a client.
const maxModelAttr = 256

func boundModel(m string) string {
	if len(m) > maxModelAttr {
		return m[:maxModelAttr]
	}
	return m
}
