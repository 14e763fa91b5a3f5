package telemetry

import (
	"context"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/trace"
)

// The per-request instruments (requests, in-flight, overhead, attempts and the four GenAI
// histograms) are aggregated here rather than in the OpenTelemetry SDK: the SDK's
// measurement resolves and normalises its attribute set and looks its series up on every
// call, 1.6–2 µs each on the live path (9 calls a request, 8% of the gateway's CPU at 2,000
// req/s), where a series kept by the request's cached attributes costs an atomic add or
// two. The exposition is the SDK exporter's own, pinned by TestExpositionGolden: names,
// help, label names, buckets (upper bounds inclusive), the 2000-series limit per instrument
// with its otel_metric_overflow="true" series, and exemplars (trace_id, span_id; the last
// one per bucket) under OTEL_METRICS_EXEMPLAR_FILTER's rules.

// seriesLimit is the SDK's default cardinality limit: 1999 label sets and the overflow one.
const seriesLimit = 2000

// exemplarFilter says which measurements keep an exemplar.
type exemplarFilter uint8

const (
	exemplarsOff        exemplarFilter = iota
	exemplarsTraceBased                // only with a sampled span in the context
	exemplarsAlwaysOn
)

// exemplarFilterFor is the SDK's choice: OTEL_METRICS_EXEMPLAR_FILTER when set (always_on,
// always_off, trace_based; anything else is trace_based, the spec's default), else
// trace_based when traces are exported and off when not.
func exemplarFilterFor(tracing bool) exemplarFilter {
	switch strings.TrimSpace(os.Getenv("OTEL_METRICS_EXEMPLAR_FILTER")) {
	case "always_on":
		return exemplarsAlwaysOn
	case "always_off":
		return exemplarsOff
	case "":
		if !tracing {
			return exemplarsOff
		}
	}
	return exemplarsTraceBased
}

// sdk is f as the SDK's option, for the instruments that stay in the SDK.
func (f exemplarFilter) sdk() exemplar.Filter {
	switch f {
	case exemplarsOff:
		return exemplar.AlwaysOffFilter
	case exemplarsAlwaysOn:
		return exemplar.AlwaysOnFilter
	}
	return exemplar.TraceBasedFilter
}

// kept is one measurement kept with its trace.
type kept struct {
	value float64
	at    time.Time
	sc    trace.SpanContext
	set   bool
}

// sample says whether a measurement made under ctx keeps an exemplar, and with which span.
type sample struct {
	keep bool
	sc   trace.SpanContext
	at   time.Time
}

func (f exemplarFilter) sample(ctx context.Context) sample {
	switch f {
	case exemplarsOff:
		return sample{}
	case exemplarsAlwaysOn:
		return sample{keep: true, sc: trace.SpanContextFromContext(ctx), at: time.Now()}
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsSampled() {
		return sample{}
	}
	return sample{keep: true, sc: sc, at: time.Now()}
}

// kind is what a family exposes.
type kind uint8

const (
	kindCounter kind = iota
	kindGauge
	kindHistogram
)

// family is one instrument: its series by label set, at most seriesLimit of them.
type family struct {
	name, help string
	kind       kind
	bounds     []float64 // histograms: the buckets' upper bounds

	mu       sync.Mutex
	byKey    map[string]*series
	list     []*series // in creation order; Collect walks it
	overflow *series
}

func newFamily(name, help string, k kind, bounds []float64) *family {
	return &family{name: name, help: help, kind: k, bounds: bounds, byKey: map[string]*series{}}
}

// label is one label of a series, by its Prometheus name.
type label struct{ name, value string }

// labelOf is k's label as the SDK's exporter names it (dots become underscores).
func labelOf(k attribute.Key, v string) label {
	return label{strings.ReplaceAll(string(k), ".", "_"), v}
}

// get returns the series of labels, made on first use; past the limit, the overflow one.
func (f *family) get(labels []label) *series {
	var b strings.Builder
	for _, l := range labels {
		b.WriteString(l.name)
		b.WriteByte(0)
		b.WriteString(l.value)
		b.WriteByte(0)
	}
	key := b.String()
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.byKey[key]; s != nil {
		return s
	}
	if len(f.byKey) >= seriesLimit-1 {
		if f.overflow == nil {
			f.overflow = f.newSeries([]label{{"otel_metric_overflow", "true"}})
			f.list = append(f.list, f.overflow)
		}
		return f.overflow
	}
	s := f.newSeries(labels)
	f.byKey[key] = s
	f.list = append(f.list, s)
	return s
}

func (f *family) newSeries(labels []label) *series {
	names := make([]string, len(labels))
	values := make([]string, len(labels))
	for i, l := range labels {
		names[i], values[i] = l.name, l.value
	}
	s := &series{desc: prometheus.NewDesc(f.name, f.help, names, nil), values: values, bounds: f.bounds}
	n := 1
	if f.kind == kindHistogram {
		n = len(f.bounds) + 1
		s.counts = make([]atomic.Uint64, n)
	}
	s.exemplars = make([]kept, n)
	return s
}

// series is one label set's value: a count or level (counters, gauges) or a histogram's
// bucket counts and sum.
type series struct {
	desc   *prometheus.Desc
	values []string
	bounds []float64 // histograms: the family's

	n       atomic.Int64    // counters and gauges
	counts  []atomic.Uint64 // histograms: per bucket, not cumulative; the last is +Inf
	sumBits atomic.Uint64   // histograms: float64 sum

	exMu      sync.Mutex
	exemplars []kept // per bucket (one for a counter); under exMu
}

// add adds d to a counter or gauge.
func (s *series) add(d int64, sm sample) {
	s.n.Add(d)
	if sm.keep {
		s.keep(0, float64(d), sm)
	}
}

// observe records v in a histogram.
func (s *series) observe(v float64, sm sample) {
	i := sort.SearchFloat64s(s.bounds, v) // the first bound ≥ v: upper bounds are inclusive
	s.counts[i].Add(1)
	for {
		old := s.sumBits.Load()
		if s.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			break
		}
	}
	if sm.keep {
		s.keep(i, v, sm)
	}
}

// keep makes v the exemplar of bucket i (the last one wins, as in the SDK's reservoir).
func (s *series) keep(i int, v float64, sm sample) {
	s.exMu.Lock()
	s.exemplars[i] = kept{value: v, at: sm.at, sc: sm.sc, set: true}
	s.exMu.Unlock()
}

// ref is a series a cached attribute set points at, looked up on first use (so that a
// label set nothing was measured with takes no series and no place under the limit).
type ref struct {
	f      *family
	labels []label
	s      atomic.Pointer[series]
}

func newRef(f *family, labels ...label) *ref { return &ref{f: f, labels: labels} }

func (r *ref) get() *series {
	if s := r.s.Load(); s != nil {
		return s
	}
	s := r.f.get(r.labels)
	r.s.Store(s)
	return s
}

// collector serves the families on the registry. Its series' label sets differ (error_type
// only on failures, the overflow series), so it describes nothing (an unchecked collector).
type collector struct{ families []*family }

func (c *collector) Describe(chan<- *prometheus.Desc) {}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.families {
		f.mu.Lock()
		list := f.list[:len(f.list):len(f.list)]
		f.mu.Unlock()
		for _, s := range list {
			if m := f.metric(s); m != nil {
				ch <- m
			}
		}
	}
}

// metric is s as the registry takes it, with its exemplars.
func (f *family) metric(s *series) prometheus.Metric {
	var (
		m   prometheus.Metric
		err error
	)
	switch f.kind {
	case kindCounter:
		m, err = prometheus.NewConstMetric(s.desc, prometheus.CounterValue, float64(s.n.Load()), s.values...)
	case kindGauge:
		m, err = prometheus.NewConstMetric(s.desc, prometheus.GaugeValue, float64(s.n.Load()), s.values...)
	default:
		buckets := make(map[float64]uint64, len(f.bounds))
		var cum uint64
		for i, b := range f.bounds {
			cum += s.counts[i].Load()
			buckets[b] = cum
		}
		cum += s.counts[len(f.bounds)].Load()
		m, err = prometheus.NewConstHistogram(s.desc, cum, math.Float64frombits(s.sumBits.Load()), buckets, s.values...)
	}
	if err != nil {
		return prometheus.NewInvalidMetric(s.desc, err)
	}
	var exs []prometheus.Exemplar
	s.exMu.Lock()
	defer s.exMu.Unlock()
	for i := range s.exemplars {
		e := &s.exemplars[i]
		if !e.set {
			continue
		}
		// Without a span (always_on) the SDK's exporter writes both labels empty.
		l := prometheus.Labels{"trace_id": "", "span_id": ""}
		if e.sc.IsValid() {
			l["trace_id"], l["span_id"] = e.sc.TraceID().String(), e.sc.SpanID().String()
		}
		exs = append(exs, prometheus.Exemplar{Value: e.value, Labels: l, Timestamp: e.at})
	}
	if len(exs) == 0 {
		return m
	}
	mx, err := prometheus.NewMetricWithExemplars(m, exs...)
	if err != nil {
		return m
	}
	return mx
}
