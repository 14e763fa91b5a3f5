package runaway

import "github.com/sluicegw/sluice/policy"

// AdminView is the policy's view in GET /admin/policies (a policy.Viewer): its params, its
// counts by tenant and model, and the last loops found.
func (p *Policy) AdminView() any { return p.Snapshot() }

// ReportMetrics exports the counters (a policy.MetricsReporter): streams watched, and loops
// found by tenant, model and action. Tenants are the configured ones, models at most
// maxModels per policy (then "other").
func (p *Policy) ReportMetrics(emit func(policy.Sample)) {
	s := p.Stats()
	emit(policy.Sample{Name: "sluice_runaway_streams_total", Help: "Streamed answers the runaway policy watched",
		Kind: policy.Counter, Value: float64(s.Streams)})
	for _, c := range s.Counts {
		for _, a := range [...]struct {
			action string
			n      uint64
		}{{ActionCut, c.Cut}, {ActionFlag, c.Flagged}} {
			if a.n == 0 {
				continue
			}
			emit(policy.Sample{Name: "sluice_runaway_detections_total",
				Help: "Answers the runaway policy found looping, by tenant, model and action (cut or flag)",
				Kind: policy.Counter, Value: float64(a.n),
				Labels: [][2]string{{"tenant", c.Tenant}, {"model", c.Model}, {"action", a.action}}})
		}
	}
}
