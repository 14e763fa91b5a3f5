package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicegw/sluice/shadow"
)

// The control plane's metrics (GET /metrics on its admin listener, docs/metrics.md), read
// from the server's state at scrape time. Their label values come from the served file (route
// and split names) or from fixed sets, never from what a node sends.
var (
	descPushes = prometheus.NewDesc("sluice_xds_snapshot_pushes_total",
		"Snapshots pushed to the nodes, by cause: config (the file changed), progression (a weight step of this control plane's), store (weights read from the store's steps: recovered at start, or the leader's)",
		[]string{"cause"}, nil)
	descNodes = prometheus.NewDesc("sluice_xds_nodes_connected", "Nodes (distinct node ids) with an xDS stream open", nil, nil)
	descInfo  = prometheus.NewDesc("sluice_xds_snapshot_info", "The snapshot served: 1, labelled with its version and the file's",
		[]string{"version", "file_version"}, nil)
	descLeader = prometheus.NewDesc("sluice_xds_progression_leader",
		"1 while this control plane leads the weight progression (judges and steps), 0 while it follows the leader's weights (or the store has not opened)", nil, nil)
	descWeight = prometheus.NewDesc("sluice_xds_progression_weight", "The weight the nodes are sent for the candidate's split of a route with a progression",
		[]string{"route", "split"}, nil)
	descVerdict = prometheus.NewDesc("sluice_xds_progression_verdict",
		"The route's latest fleet verdict judged by this control plane: 1 for the decision it is (promote, hold, rollback), 0 for the others; none while following",
		[]string{"route", "decision"}, nil)
	descSteps = prometheus.NewDesc("sluice_xds_progression_steps_total", "Weight steps this control plane made (and recorded in the store), by decision (promote, rollback)",
		[]string{"route", "decision"}, nil)
	descReadFailures = prometheus.NewDesc("sluice_xds_fleet_read_failures_total",
		"Reads of a route's fleet window or weight steps from the shared store that failed", []string{"route"}, nil)

	// The store's writer, named as a gateway's (proxy's storeMetrics).
	descStoreUp       = prometheus.NewDesc("sluice_shadow_store_up", "1 while the shared shadow store answers the control plane's writes, 0 while it does not (records are held)", nil, nil)
	descStoreBuffered = prometheus.NewDesc("sluice_shadow_store_buffered", "Records (verdicts) held for the shared shadow store, not written yet", nil, nil)
	descStoreUsed     = prometheus.NewDesc("sluice_shadow_store_buffer_used_bytes", "Bytes of the writer's buffer the held records take", nil, nil)
	descStoreLimit    = prometheus.NewDesc("sluice_shadow_store_buffer_limit_bytes", "The bytes of records the writer may hold", nil, nil)
	descStoreWritten  = prometheus.NewDesc("sluice_shadow_store_written_total", "Records written to the shared shadow store", nil, nil)
	descStoreDropped  = prometheus.NewDesc("sluice_shadow_store_dropped_total", "Records not kept for the shared shadow store, by kind: the buffer was full, or the control plane stopped before it could write them",
		[]string{"kind"}, nil)
	descStoreFailed  = prometheus.NewDesc("sluice_shadow_store_failed_total", "Records the shared shadow store refused (not tried again)", nil, nil)
	descStoreRetries = prometheus.NewDesc("sluice_shadow_store_retries_total", "Writes (or openings) of the shared shadow store that did not reach it and are tried again", nil, nil)
)

var verdictDecisions = []shadow.Decision{shadow.Promote, shadow.Hold, shadow.Rollback}

// collector is the control plane's prometheus.Collector.
type collector struct{ s *Server }

// Describe implements prometheus.Collector.
func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPushes, descNodes, descInfo, descLeader, descWeight, descVerdict, descSteps, descReadFailures,
		descStoreUp, descStoreBuffered, descStoreUsed, descStoreLimit, descStoreWritten, descStoreDropped, descStoreFailed, descStoreRetries} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	s.mu.Lock()
	for _, cause := range pushCauses {
		counter(descPushes, s.published[cause], cause)
	}
	gauge(descNodes, float64(len(s.nodesLocked())))
	gauge(descInfo, 1, s.version, s.fileVersion)
	on := s.storeURL != ""
	if on {
		gauge(descLeader, boolValue(s.role == RoleLeader))
		for _, r := range s.file.Routes {
			p := progressed(r)
			if p == nil {
				continue
			}
			if w, ok := weightIn(s.served, r.Name); ok {
				gauge(descWeight, float64(w), r.Name, p.Split)
			}
			if ps := s.prog[r.Name]; ps != nil && ps.verdict != nil {
				for _, d := range verdictDecisions {
					gauge(descVerdict, boolValue(ps.verdict.Decision == d), r.Name, string(d))
				}
			}
			for _, d := range []shadow.Decision{shadow.Promote, shadow.Rollback} {
				counter(descSteps, s.stepCounts[stepKey{r.Name, d}], r.Name, string(d))
			}
			counter(descReadFailures, s.readFailures[r.Name], r.Name)
		}
	}
	s.mu.Unlock()
	if !on {
		return
	}
	if w := s.writer.Load(); w != nil {
		st := w.Stats()
		gauge(descStoreUp, boolValue(st.Connected))
		gauge(descStoreBuffered, float64(st.Buffered))
		gauge(descStoreUsed, float64(st.BufferedBytes))
		gauge(descStoreLimit, float64(st.MaxBytes))
		counter(descStoreWritten, st.Written)
		counter(descStoreFailed, st.Failed)
		counter(descStoreRetries, st.Retries)
		for _, k := range []string{shadow.KindPair, shadow.KindVerdict, shadow.KindRate, shadow.KindPrune} {
			counter(descStoreDropped, st.Dropped[k], k)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// metricsHandler serves the control plane's metrics, with the Go runtime's and the
// process's, from a registry of its own.
func (s *Server) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{s}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
