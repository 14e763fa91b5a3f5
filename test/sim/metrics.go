package sim

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the vLLM v1 server metrics, on the server's own registry, labelled model_name.
// Durations are measured in real time (that is, after TimeScale).
type metrics struct {
	reg          *prometheus.Registry
	handler      http.Handler
	ttft         prometheus.Histogram
	itl          prometheus.Histogram
	e2e          prometheus.Histogram
	queue        prometheus.Histogram
	promptTokens prometheus.Counter
	genTokens    prometheus.Counter
	success      map[string]prometheus.Counter // by finished_reason: stop, length, abort
}

// Bucket boundaries follow vLLM's, with a few sub-millisecond ones in front so that runs at a
// small TimeScale still spread over the buckets.
var (
	ttftBuckets = []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets = []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
		0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	reqBuckets = []float64{0.001, 0.01, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60,
		120, 240, 480, 960, 1920, 7680}
)

func newMetrics(s *Server) *metrics {
	labels := prometheus.Labels{"model_name": s.cfg.Model}
	m := &metrics{reg: prometheus.NewRegistry(), success: map[string]prometheus.Counter{}}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		m.reg.MustRegister(h)
		return h
	}
	gauge := func(name, help string, f func() float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		m.reg.MustRegister(c)
		return c
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
		func() float64 { return float64(s.nRunning.Load() + s.fastRunning.Load()) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
		func() float64 { return float64(s.nWaiting.Load()) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kvUsage)
	gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (older vLLM name). 1 means 100 percent usage.", s.kvUsage)
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", reqBuckets)
	m.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", reqBuckets)
	m.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	m.genTokens = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	succ := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of finished requests, by finished reason.", ConstLabels: labels}, []string{"finished_reason"})
	m.reg.MustRegister(succ)
	for _, r := range []string{"stop", "length", "abort"} {
		m.success[r] = succ.WithLabelValues(r)
	}
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// finished counts a finished sequence. Tool calls count as "stop", like vLLM's engine.
func (m *metrics) finished(reason string) {
	c, ok := m.success[reason]
	if !ok {
		c = m.success["stop"]
	}
	c.Inc()
}
