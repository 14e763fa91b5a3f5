package proxy

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicegw/sluice/gpu"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// upstreamFlags maps the scraper's check flags to the picker's.
func upstreamFlags(f gpu.Flags) upstream.Flags {
	var u upstream.Flags
	if f.Has(gpu.FlagKVLeak) {
		u |= upstream.FlagKVLeak
	}
	if f.Has(gpu.FlagStall) {
		u |= upstream.FlagStall
	}
	return u
}

// signalMetrics exports the load signals at scrape time: the model servers' queue, running
// batch and KV-cache use as Sluice sees them (fresh signals only), their state checks (a
// series per endpoint and check: endpoints are configured, checks fixed), and the local GPUs.
func (s *Server) signalMetrics(m metric.Meter) (metric.Registration, error) {
	waiting, err := m.Float64ObservableGauge("sluice.endpoint.requests.waiting", metric.WithDescription("Requests waiting in the model server's queue (scraped, fresh only)"))
	if err != nil {
		return nil, err
	}
	running, err := m.Float64ObservableGauge("sluice.endpoint.requests.running", metric.WithDescription("Requests running on the model server (scraped, fresh only)"))
	if err != nil {
		return nil, err
	}
	kv, err := m.Float64ObservableGauge("sluice.endpoint.kv_cache.usage", metric.WithDescription("Model server KV-cache use, 0-1 (scraped, fresh only)"))
	if err != nil {
		return nil, err
	}
	fails, err := m.Int64ObservableCounter("sluice.endpoint.scrape.failures", metric.WithDescription("Failed scrapes of the model server's metrics"))
	if err != nil {
		return nil, err
	}
	flagged, err := m.Int64ObservableGauge("sluice.endpoint.flagged", metric.WithDescription("1 while the state check flags the model server (kv_leak, stall), else 0"))
	if err != nil {
		return nil, err
	}
	flags, err := m.Int64ObservableCounter("sluice.endpoint.flags", metric.WithDescription("Times the state check flagged the model server"))
	if err != nil {
		return nil, err
	}
	util, err := m.Float64ObservableGauge("sluice.gpu.utilization", metric.WithDescription("GPU utilization, 0-1 (NVML)"))
	if err != nil {
		return nil, err
	}
	mem, err := m.Int64ObservableGauge("sluice.gpu.memory.used", metric.WithUnit("By"), metric.WithDescription("GPU memory used (NVML)"))
	if err != nil {
		return nil, err
	}
	memTotal, err := m.Int64ObservableGauge("sluice.gpu.memory.total", metric.WithUnit("By"), metric.WithDescription("GPU memory (NVML)"))
	if err != nil {
		return nil, err
	}
	temp, err := m.Float64ObservableGauge("sluice.gpu.temperature", metric.WithUnit("Cel"), metric.WithDescription("GPU temperature (NVML)"))
	if err != nil {
		return nil, err
	}
	power, err := m.Float64ObservableGauge("sluice.gpu.power", metric.WithUnit("W"), metric.WithDescription("GPU power draw (NVML)"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		snap := s.scraper.Snapshot(ctx)
		for _, e := range snap.Endpoints {
			ep := metric.WithAttributes(attribute.String("endpoint", e.Endpoint))
			o.ObserveInt64(fails, int64(e.Failures), ep)
			if e.Fresh && e.Load != nil {
				o.ObserveFloat64(waiting, e.Load.Waiting, ep)
				o.ObserveFloat64(running, e.Load.Running, ep)
				o.ObserveFloat64(kv, e.Load.KVCacheUsage, ep)
			}
			for _, c := range e.Checks {
				at := metric.WithAttributes(attribute.String("endpoint", e.Endpoint), attribute.String("check", c.Check))
				v := int64(0)
				if c.Flagged {
					v = 1
				}
				o.ObserveInt64(flagged, v, at)
				o.ObserveInt64(flags, int64(c.TimesFlagged), at)
			}
		}
		for _, d := range snap.Devices {
			g := metric.WithAttributes(attribute.Int("gpu", d.Index), attribute.String("uuid", d.UUID), attribute.String("name", d.Name))
			o.ObserveFloat64(util, d.UtilizationGPU, g)
			o.ObserveInt64(mem, int64(d.MemoryUsed), g)
			o.ObserveInt64(memTotal, int64(d.MemoryTotal), g)
			o.ObserveFloat64(temp, d.TemperatureC, g)
			o.ObserveFloat64(power, d.PowerW, g)
		}
		return nil
	}, waiting, running, kv, fails, flagged, flags, util, mem, memTotal, temp, power)
}
