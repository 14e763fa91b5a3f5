package load

import (
	"context"
	"errors"
	"math"
)

// SweepConfig bounds a sweep.
type SweepConfig struct {
	Start      float64 // first rate tried (default 1 req/s)
	Max        float64 // highest rate tried (default 10000)
	Steps      int     // runs in all (default 8)
	Attainment float64 // share of requests that must meet every SLO (default DefaultAttainment)
	OnStep     func(SweepStep)
}

// Sweep finds the highest rate whose run meets cfg.SLO for at least sc.Attainment of its
// requests: it doubles the rate from Start until a run fails, then bisects between the best
// pass and the first failure. Each step is one Run with cfg's Duration/Requests. It returns
// the report of the best passing step (the last step when none passed) with every step in
// Report.Sweep.
func Sweep(ctx context.Context, cfg Config, sc SweepConfig) (*Report, error) {
	if !cfg.SLO.Any() {
		return nil, errors.New("sweep: give an SLO (--slo)")
	}
	if cfg.Duration == 0 && cfg.Requests == 0 {
		return nil, errors.New("sweep: give --duration or --requests for each step")
	}
	if sc.Start <= 0 {
		sc.Start = 1
	}
	if sc.Max <= 0 {
		sc.Max = 10000
	}
	if sc.Steps <= 0 {
		sc.Steps = 8
	}
	if sc.Attainment <= 0 || sc.Attainment > 1 {
		sc.Attainment = DefaultAttainment
	}
	var steps []SweepStep
	var best, last *Report
	lo, hi := 0.0, math.Inf(1)
	rate := min(sc.Start, sc.Max)
	for range sc.Steps {
		c := cfg
		c.Rate = rate
		c.Concurrency = 0
		r, err := Run(ctx, c)
		if err != nil {
			return nil, err
		}
		s := r.Summary
		st := SweepStep{Rate: rate, Requests: r.Requests, Attainment: s.Attainment["all"], Goodput: s.Goodput,
			Throughput: s.ReqPerS, TTFTp50: s.Latency[HTTFT].P50, TTFTp99: s.Latency[HTTFT].P99,
			ITLp99: s.Latency[HITL].P99, LagP99: s.Latency[HLag].P99}
		st.Pass = st.Attainment >= sc.Attainment
		steps = append(steps, st)
		if sc.OnStep != nil {
			sc.OnStep(st)
		}
		last = r
		if st.Pass {
			best, lo = r, rate
			if math.IsInf(hi, 1) {
				if rate >= sc.Max {
					break
				}
				rate = min(rate*2, sc.Max)
				continue
			}
		} else {
			hi = rate
		}
		next := (lo + hi) / 2
		if lo == 0 {
			next = hi / 2
		}
		if math.Abs(next-rate) < 1e-3*max(rate, 1e-9) {
			break
		}
		rate = next
	}
	out := best
	if out == nil {
		out = last
	}
	out.Sweep = steps
	return out, nil
}
