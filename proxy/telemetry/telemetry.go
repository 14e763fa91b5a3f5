package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of Sluice's meter and tracer.
const ScopeName = "github.com/sluicegw/sluice"

// Options configures [New].
type Options struct {
	// ServiceName is the resource's service.name; "sluice" if empty.
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it.
	ServiceName string
	// ServiceVersion is the resource's service.version, if not empty.
	ServiceVersion string
	// Registry receives the metrics and is what Handler serves. If nil, a new
	// registry is made. Use one Telemetry per registry.
	Registry *prometheus.Registry
	// SpanExporter, if set, receives every span synchronously as it ends
	// (meant for tests: tracetest.NewInMemoryExporter). It overrides the
	// environment. Without it, spans are exported over OTLP/gRPC when
	// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
	// (otlptracegrpc reads the other OTEL_EXPORTER_OTLP_* variables itself),
	// unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none; otherwise
	// the tracer provider is a no-op.
	SpanExporter sdktrace.SpanExporter
}

// Telemetry owns Sluice's meter provider (exported as Prometheus text on
// Handler) and tracer provider. Its methods are safe for concurrent use.
type Telemetry struct {
	reg     *prometheus.Registry
	handler http.Handler

	mp *sdkmetric.MeterProvider
	tp *sdktrace.TracerProvider // nil when tracing is off
	// otlp is the OTLP exporter tp batches into, if any: Shutdown stops it
	// itself so that a timed-out flush cannot leave an export running.
	otlp sdktrace.SpanExporter

	meter   metric.Meter
	tracer  trace.Tracer
	tracing bool
	prop    propagation.TextMapPropagator

	inst instruments
}

// New builds the providers and instruments. ctx is used only to set up the
// OTLP exporter (which does not connect until the first export).
func New(ctx context.Context, opts Options) (*Telemetry, error) {
	res, err := buildResource(opts)
	if err != nil {
		return nil, err
	}

	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	t := &Telemetry{
		reg:     reg,
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true}),
		prop:    propagation.TraceContext{},
	}

	tp, otlp, err := newTracerProvider(ctx, opts, res)
	if err != nil {
		return nil, err
	}
	t.otlp = otlp
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		if tp != nil {
			_ = tp.Shutdown(ctx)
		}
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	if tp != nil {
		t.tp = tp
		t.tracing = true
		t.tracer = tp.Tracer(ScopeName, trace.WithInstrumentationVersion(opts.ServiceVersion))
	} else {
		t.tracer = noop.NewTracerProvider().Tracer(ScopeName)
	}

	// Exemplars are only worth their cost when they can point at a trace this
	// process exports; OTEL_METRICS_EXEMPLAR_FILTER still wins when set. One
	// decision for the SDK's instruments and the package's own.
	filter := exemplarFilterFor(t.tracing)
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res),
		sdkmetric.WithExemplarFilter(filter.sdk()))
	t.meter = t.mp.Meter(ScopeName, metric.WithInstrumentationVersion(opts.ServiceVersion))

	if err := t.inst.init(t.meter, reg, filter); err != nil {
		_ = t.Shutdown(ctx)
		return nil, err
	}
	return t, nil
}

func buildResource(opts Options) (*resource.Resource, error) {
	name := opts.ServiceName
	if name == "" {
		name = "sluice"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if opts.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", opts.ServiceVersion))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME override ours.
	res, err = resource.Merge(res, resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource from environment: %w", err)
	}
	return res, nil
}

// newTracerProvider returns a nil provider when tracing is off, and the OTLP
// exporter when it made one.
func newTracerProvider(ctx context.Context, opts Options, res *resource.Resource) (*sdktrace.TracerProvider, sdktrace.SpanExporter, error) {
	if opts.SpanExporter != nil {
		return sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSyncer(opts.SpanExporter)), nil, nil
	}
	if !otlpTracesConfigured() {
		return nil, nil, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: otlp trace exporter: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp)), exp, nil
}

func otlpTracesConfigured() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Handler serves the registry in the Prometheus text format (and OpenMetrics
// when the scraper asks for it).
func (t *Telemetry) Handler() http.Handler { return t.handler }

// Registry is the registry Handler serves.
func (t *Telemetry) Registry() *prometheus.Registry { return t.reg }

// Tracer is Sluice's tracer: a no-op one when tracing is off.
func (t *Telemetry) Tracer() trace.Tracer { return t.tracer }

// Meter is Sluice's meter, for later packages to add their own instruments
// (they appear on Handler).
func (t *Telemetry) Meter() metric.Meter { return t.meter }

// TracingEnabled reports whether spans are recorded and exported.
func (t *Telemetry) TracingEnabled() bool { return t.tracing }

// Shutdown flushes pending spans and stops both providers. If ctx ends
// before the flush does, the export in progress is abandoned (and ctx's error
// returned): nothing keeps running after Shutdown returns. Later calls to the
// recording methods are dropped silently.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.otlp != nil {
		// A no-op after a clean tp.Shutdown; after a timed-out one it cancels
		// the export still retrying and closes the gRPC connection.
		errs = append(errs, t.otlp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
