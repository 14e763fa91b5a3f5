package proxy

import (
	"io"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicegw/sluice/policy"
)

// contractsOf names what a plugin implements, as the gateway discovers it.
func contractsOf(p policy.Plugin) []string {
	var out []string
	add := func(ok bool, name string) {
		if ok {
			out = append(out, name)
		}
	}
	_, a := p.(policy.Admitter)
	_, o := p.(policy.Observer)
	_, f := p.(policy.StreamFilter)
	_, bf := p.(policy.BodyFilter)
	_, b := p.(batcher)
	_, v := p.(policy.Viewer)
	_, m := p.(policy.MetricsReporter)
	_, r := p.(policy.Resetter)
	_, c := p.(io.Closer)
	add(a, "admitter")
	add(o, "observer")
	add(f, "stream_filter")
	add(bf, "body_filter")
	add(b, "batcher")
	add(v, "admin_view")
	add(m, "metrics")
	add(r, "tenant_reset")
	add(c, "closer")
	return out
}

// pluginCollector exports the metrics of every policy that reports its own
// (policy.MetricsReporter), read from the generation serving at scrape time, with the
// policy's route and name as labels.
type pluginCollector struct{ s *Server }

// Describe sends nothing: the plugins' metrics depend on the config (an unchecked collector).
func (c pluginCollector) Describe(chan<- *prometheus.Desc) {}

func (c pluginCollector) Collect(ch chan<- prometheus.Metric) {
	for _, bp := range c.s.state.Load().policies {
		r, ok := bp.impl.(policy.MetricsReporter)
		if !ok {
			continue
		}
		r.ReportMetrics(func(sm policy.Sample) {
			if m, err := sampleMetric(bp, sm); err == nil {
				ch <- m
			}
		})
	}
}

// sampleMetric turns one plugin sample into a Prometheus metric.
func sampleMetric(bp *builtPolicy, sm policy.Sample) (prometheus.Metric, error) {
	names := make([]string, 0, len(sm.Labels)+2)
	values := make([]string, 0, len(sm.Labels)+2)
	names, values = append(names, "route", "policy"), append(values, bp.route, bp.name)
	for _, l := range sm.Labels {
		names, values = append(names, l[0]), append(values, l[1])
	}
	desc := prometheus.NewDesc(sm.Name, sm.Help, names, nil)
	switch sm.Kind {
	case policy.Counter:
		return prometheus.NewConstMetric(desc, prometheus.CounterValue, sm.Value, values...)
	case policy.Gauge:
		return prometheus.NewConstMetric(desc, prometheus.GaugeValue, sm.Value, values...)
	default:
		buckets := make(map[float64]uint64, len(sm.Bounds))
		var cum uint64
		for i, b := range sm.Bounds {
			if i < len(sm.Counts) {
				cum += sm.Counts[i]
			}
			if !math.IsInf(b, 1) {
				buckets[b] = cum
			}
		}
		return prometheus.NewConstHistogram(desc, sm.Count, sm.Sum, buckets, values...)
	}
}
