package telemetry

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
)

// Histogram bucket boundaries. The GenAI ones are those the semantic
// conventions recommend for each instrument.
var (
	durationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	ttftBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}
	tpotBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
	overheadBuckets = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1}
	attemptBuckets  = []float64{1, 2, 3, 4, 5, 6, 8, 10}
)

// ProviderName is the gen_ai.provider.name Sluice reports: every upstream
// speaks the OpenAI REST API, and the spec names the attribute after the API
// flavour (the models behind it are told apart by gen_ai.request.model,
// gen_ai.response.model and server.address).
const ProviderName = "openai"

// Attribute keys (as OpenTelemetry names them; Prometheus labels replace the
// dots with underscores).
const (
	keyRoute              = attribute.Key("route")
	keyCluster            = attribute.Key("cluster")
	keyStatusCode         = attribute.Key("http.response.status_code")
	keyErrorType          = attribute.Key("error.type")
	keyResult             = attribute.Key("result")
	keyVersion            = attribute.Key("version")
	keyOperationName      = attribute.Key("gen_ai.operation.name")
	keyProviderName       = attribute.Key("gen_ai.provider.name")
	keyRequestModel       = attribute.Key("gen_ai.request.model")
	keyResponseModel      = attribute.Key("gen_ai.response.model")
	keyTokenType          = attribute.Key("gen_ai.token.type")
	keyServerAddress      = attribute.Key("server.address")
	keyServerPort         = attribute.Key("server.port")
	keyInputTokens        = attribute.Key("gen_ai.usage.input_tokens")
	keyOutputTokens       = attribute.Key("gen_ai.usage.output_tokens")
	keyAttempt            = attribute.Key("sluice.attempt")
	keyResendCount        = attribute.Key("http.request.resend_count")
	keyRequestMethod      = attribute.Key("http.request.method")
	keyURLPath            = attribute.Key("url.path")
	keyRequestStream      = attribute.Key("gen_ai.request.stream")
	keyRequestMaxTokens   = attribute.Key("gen_ai.request.max_tokens")
	keyRequestTemperature = attribute.Key("gen_ai.request.temperature")
	keyRequestSeed        = attribute.Key("gen_ai.request.seed")
	keyFinishReasons      = attribute.Key("gen_ai.response.finish_reasons")
	keyResponseID         = attribute.Key("gen_ai.response.id")
	keyTimeToFirstChunk   = attribute.Key("gen_ai.response.time_to_first_chunk")
	keySluiceRoute        = attribute.Key("sluice.route")
	keySluiceCluster      = attribute.Key("sluice.cluster")
	keySluiceEndpoint     = attribute.Key("sluice.endpoint")
)

// cacheLimit bounds each attribute cache; past it the cache is cleared and
// refilled by the traffic that follows (seriesLimit, 2000 series per
// instrument as in the SDK, bounds the metrics themselves).
const cacheLimit = 4096

type instruments struct {
	// Per request, aggregated by Sluice (series.go): the GenAI semantic conventions' four
	// and Sluice's own.
	opDuration, tokenUsage, ttft, tpot     *family
	requests, inFlight, overhead, attempts *family
	exemplars                              exemplarFilter

	// The rest, in the OpenTelemetry SDK.
	upstreamErrors metric.Int64Counter
	reloads        metric.Int64Counter

	lastReloadOK atomic.Int64 // unix nanoseconds; 0 = never
	configInfo   atomic.Pointer[[]metric.ObserveOption]

	reloadOK, reloadErr []metric.AddOption

	reqCache      optCache[recordKey, *recordRefs]
	inFlightCache optCache[string, *ref]
	upErrCache    optCache[[2]string, []metric.AddOption]
	endpointCache optCache[string, hostPort]
}

// families are the per-request instruments, as the SDK's Prometheus exporter names them.
func (in *instruments) families() []*family {
	in.opDuration = newFamily("gen_ai_client_operation_duration_seconds", "GenAI operation duration.", kindHistogram, durationBuckets)
	in.tokenUsage = newFamily("gen_ai_client_token_usage", "Number of input and output tokens used.", kindHistogram, tokenBuckets)
	in.ttft = newFamily("gen_ai_server_time_to_first_token_seconds", "Time to generate first token for successful responses.", kindHistogram, ttftBuckets)
	in.tpot = newFamily("gen_ai_server_time_per_output_token_seconds", "Time per output token generated after the first token for successful responses.", kindHistogram, tpotBuckets)
	in.requests = newFamily("sluice_requests_total", "Requests Sluice answered, by route, cluster, HTTP status and error class.", kindCounter, nil)
	in.inFlight = newFamily("sluice_requests_in_flight", "Requests in progress in Sluice, by route.", kindGauge, nil)
	in.overhead = newFamily("sluice_gateway_overhead_seconds", "Time spent in Sluice itself per request, excluding the wait on the upstream.", kindHistogram, overheadBuckets)
	in.attempts = newFamily("sluice_request_attempts", "Upstream attempts per request (1 = no retry or fallback).", kindHistogram, attemptBuckets)
	return []*family{in.opDuration, in.tokenUsage, in.ttft, in.tpot, in.requests, in.inFlight, in.overhead, in.attempts}
}

func (in *instruments) init(m metric.Meter, reg prometheus.Registerer, filter exemplarFilter) error {
	var err error
	fail := func(name string, e error) error { return fmt.Errorf("telemetry: instrument %s: %w", name, e) }

	in.exemplars = filter
	if err := reg.Register(&collector{families: in.families()}); err != nil {
		return fail("request metrics", err)
	}
	if in.upstreamErrors, err = m.Int64Counter("sluice.upstream.errors",
		metric.WithDescription("Failed upstream attempts, by cluster and error class."),
		metric.WithUnit("{error}")); err != nil {
		return fail("sluice.upstream.errors", err)
	}
	if in.reloads, err = m.Int64Counter("sluice.config.reloads",
		metric.WithDescription("Configuration reloads, by result (ok or error)."),
		metric.WithUnit("{reload}")); err != nil {
		return fail("sluice.config.reloads", err)
	}
	lastOK, err := m.Float64ObservableGauge("sluice.config.last_reload_success_timestamp",
		metric.WithDescription("Unix time of the last successful configuration load."),
		metric.WithUnit("s"))
	if err != nil {
		return fail("sluice.config.last_reload_success_timestamp", err)
	}
	info, err := m.Int64ObservableGauge("sluice.config.info",
		metric.WithDescription("Always 1; the version label is the configuration version in use."))
	if err != nil {
		return fail("sluice.config.info", err)
	}
	if _, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if ns := in.lastReloadOK.Load(); ns != 0 {
			o.ObserveFloat64(lastOK, float64(ns)/1e9)
		}
		if opts := in.configInfo.Load(); opts != nil {
			o.ObserveInt64(info, 1, *opts...)
		}
		return nil
	}, lastOK, info); err != nil {
		return fail("callback", err)
	}

	in.reloadOK = addOpts(attribute.NewSet(keyResult.String("ok")))
	in.reloadErr = addOpts(attribute.NewSet(keyResult.String("error")))
	// Both series exist from the start at 0, so that the first failed reload is an increase
	// (an alert on increase() never sees a series that appears at 1).
	in.reloads.Add(context.Background(), 0, in.reloadOK...)
	in.reloads.Add(context.Background(), 0, in.reloadErr...)

	in.reqCache.build = buildRecordOpts(in)
	in.inFlightCache.build = func(route string) *ref {
		return newRef(in.inFlight, labelOf(keyRoute, route))
	}
	in.upErrCache.build = func(k [2]string) []metric.AddOption {
		return addOpts(attribute.NewSet(keyCluster.String(k[0]), keyErrorType.String(k[1])))
	}
	in.endpointCache.build = parseEndpoint
	return nil
}

// RequestRecord is what the handler knows about one request once it ended.
type RequestRecord struct {
	Route, Cluster, Endpoint string
	// Operation is gen_ai.operation.name: "chat", "text_completion",
	// "embeddings", or "" for anything else (no GenAI metrics then).
	Operation                   string
	RequestModel, ResponseModel string
	Stream                      bool
	// Status is the HTTP status the client got (499 when it went away).
	Status int
	// ErrorClass is "" on success, else e.g. "client_cancel",
	// "upstream_timeout", "ttft_timeout", "idle_timeout", "connect",
	// "upstream_5xx", "upstream_4xx", "stream_cut", "no_endpoint",
	// "bad_request", "too_large". It becomes error.type.
	ErrorClass string
	// Duration is the whole request as seen by the gateway.
	Duration time.Duration
	// TTFT is the time to the first token; 0 if none.
	TTFT time.Duration
	// TPOT is the mean time per output token after the first; 0 if fewer
	// than 2 tokens.
	TPOT time.Duration
	// InputTokens and OutputTokens: 0 means unknown, not recorded.
	InputTokens, OutputTokens int
	// Overhead is the time spent in Sluice excluding the upstream wait.
	Overhead time.Duration
	// Attempts counts upstream attempts (0: none was made).
	Attempts int
	// FinishReason and ResponseID (spans only): the answer's last finish_reason and id.
	FinishReason, ResponseID string
}

// recordKey is every RequestRecord field that becomes an attribute.
type recordKey struct {
	route, cluster, endpoint, op, reqModel, respModel, errClass string
	status                                                      int
}

// recordRefs holds the series of one recordKey, so that a RecordRequest with a known key
// allocates nothing and looks nothing up.
type recordRefs struct {
	requests          *ref
	duration          *ref // GenAI labels + error_type
	ttft, tpot        *ref // GenAI labels
	tokIn, tokOut     *ref
	overhead, attempt *ref // route
}

func buildRecordOpts(in *instruments) func(recordKey) *recordRefs {
	return func(k recordKey) *recordRefs {
		o := &recordRefs{}
		// Labels in name order, as the exposition sorts them.
		req := []label{labelOf(keyCluster, k.cluster)}
		if k.errClass != "" {
			req = append(req, labelOf(keyErrorType, k.errClass))
		}
		req = append(req, labelOf(keyStatusCode, strconv.Itoa(k.status)), labelOf(keyRoute, k.route))
		o.requests = newRef(in.requests, req...)
		o.overhead = newRef(in.overhead, labelOf(keyRoute, k.route))
		o.attempt = newRef(in.attempts, labelOf(keyRoute, k.route))
		if k.op == "" {
			return o
		}
		// GenAI labels: error_type sorts first, gen_ai_token_type after the models.
		g := []label{labelOf(keyOperationName, k.op), labelOf(keyProviderName, ProviderName)}
		if k.reqModel != "" {
			g = append(g, labelOf(keyRequestModel, k.reqModel))
		}
		if k.respModel != "" {
			g = append(g, labelOf(keyResponseModel, k.respModel))
		}
		models := len(g)
		if hp := in.endpointCache.get(k.endpoint); hp.host != "" {
			g = append(g, labelOf(keyServerAddress, hp.host))
			if hp.port != 0 {
				g = append(g, labelOf(keyServerPort, strconv.Itoa(hp.port)))
			}
		}
		tok := func(typ genaiconv.TokenTypeAttr) []label {
			out := make([]label, 0, len(g)+1)
			out = append(out, g[:models]...)
			out = append(out, labelOf(keyTokenType, string(typ)))
			return append(out, g[models:]...)
		}
		o.ttft, o.tpot = newRef(in.ttft, g...), newRef(in.tpot, g...)
		o.tokIn = newRef(in.tokenUsage, tok(genaiconv.TokenTypeInput)...)
		o.tokOut = newRef(in.tokenUsage, tok(genaiconv.TokenTypeOutput)...)
		if k.errClass != "" {
			o.duration = newRef(in.opDuration, append([]label{labelOf(keyErrorType, k.errClass)}, g...)...)
		} else {
			o.duration = newRef(in.opDuration, g...)
		}
		return o
	}
}

// RecordRequest records one finished request on every request metric. It is
// meant to be called once per request, after it ended; with attribute values
// seen before it does not allocate beyond what the SDK needs.
//
// GenAI metrics are recorded only when Operation is set. Time to first token
// and time per output token are recorded only for successful requests (as
// the conventions define them) and only when non-zero.
func (t *Telemetry) RecordRequest(ctx context.Context, r RequestRecord) {
	in := &t.inst
	o := in.reqCache.get(recordKey{
		route: r.Route, cluster: r.Cluster, endpoint: r.Endpoint, op: r.Operation,
		reqModel: r.RequestModel, respModel: r.ResponseModel, errClass: r.ErrorClass, status: r.Status,
	})
	sm := in.exemplars.sample(ctx)
	o.requests.get().add(1, sm)
	if r.Overhead > 0 {
		o.overhead.get().observe(r.Overhead.Seconds(), sm)
	}
	if r.Attempts > 0 {
		o.attempt.get().observe(float64(r.Attempts), sm)
	}
	if r.Operation == "" {
		return
	}
	o.duration.get().observe(r.Duration.Seconds(), sm)
	if r.InputTokens > 0 {
		o.tokIn.get().observe(float64(r.InputTokens), sm)
	}
	if r.OutputTokens > 0 {
		o.tokOut.get().observe(float64(r.OutputTokens), sm)
	}
	if r.ErrorClass == "" {
		if r.TTFT > 0 {
			o.ttft.get().observe(r.TTFT.Seconds(), sm)
		}
		if r.TPOT > 0 {
			o.tpot.get().observe(r.TPOT.Seconds(), sm)
		}
	}
}

// InFlight adds delta (+1 when a request starts, -1 when it ends) to the
// in-flight gauge of route.
func (t *Telemetry) InFlight(_ context.Context, route string, delta int64) {
	t.inst.inFlightCache.get(route).get().add(delta, sample{}) // a gauge keeps no exemplar
}

// UpstreamError counts one failed upstream attempt of cluster, class being
// the error class (the values of RequestRecord.ErrorClass).
func (t *Telemetry) UpstreamError(ctx context.Context, cluster, class string) {
	t.inst.upstreamErrors.Add(ctx, 1, t.inst.upErrCache.get([2]string{cluster, class})...)
}

// ConfigReload counts one configuration load by result; a success also sets
// the last-success timestamp to now.
func (t *Telemetry) ConfigReload(ctx context.Context, ok bool) {
	if ok {
		t.inst.lastReloadOK.Store(time.Now().UnixNano())
		t.inst.reloads.Add(ctx, 1, t.inst.reloadOK...)
		return
	}
	t.inst.reloads.Add(ctx, 1, t.inst.reloadErr...)
}

// SetConfigInfo sets the version label of the sluice_config_info gauge
// (value 1); only the latest version is exported.
func (t *Telemetry) SetConfigInfo(version string) {
	opts := []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(keyVersion.String(version)))}
	t.inst.configInfo.Store(&opts)
}

func addOpts(s attribute.Set) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(s)}
}

// optCache memoizes build(key). Reads take a read lock only.
type optCache[K comparable, V any] struct {
	mu    sync.RWMutex
	m     map[K]V
	build func(K) V
}

func (c *optCache[K, V]) get(k K) V {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = c.build(k)
	c.mu.Lock()
	if c.m == nil || len(c.m) >= cacheLimit {
		c.m = make(map[K]V)
	}
	c.m[k] = v
	c.mu.Unlock()
	return v
}

type hostPort struct {
	host string
	port int
}

// parseEndpoint splits an endpoint ("http://10.0.0.5:8000", "10.0.0.5:8000"
// or a bare host) into server.address and server.port.
func parseEndpoint(ep string) hostPort {
	if ep == "" {
		return hostPort{}
	}
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err == nil && u.Host != "" {
			hp := hostPort{host: u.Hostname()}
			if p := u.Port(); p != "" {
				hp.port, _ = strconv.Atoi(p)
			} else {
				switch u.Scheme {
				case "http":
					hp.port = 80
				case "https":
					hp.port = 443
				}
			}
			return hp
		}
	}
	if h, p, err := net.SplitHostPort(ep); err == nil {
		n, _ := strconv.Atoi(p)
		return hostPort{host: h, port: n}
	}
	return hostPort{host: ep}
}
