package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// judgeLoop judges every mirrored route each shadow.interval until ctx ends.
func (s *Server) judgeLoop(ctx context.Context) {
	for {
		t := time.NewTimer(s.Config().Shadow.JudgeInterval())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.shadow.judgeAll(ctx, time.Now())
	}
}

// judgeAll computes and records the verdict of every mirrored route, and steps weights where
// a progression is configured. With a shared store each route is judged over the fleet's
// pairs, read from the store (judgeInput).
func (sh *shadowing) judgeAll(ctx context.Context, now time.Time) {
	sh.judging.Lock() // the loop and POST /admin/shadow/judge: one progression step at a time
	defer sh.judging.Unlock()
	st := sh.srv.state.Load()
	c := st.snap.Config
	if w := sh.writer.Load(); w != nil {
		w.SetMaxBytes(int64(c.Shadow.Buffer)) // shadow.buffer as reloaded
	}
	for _, mr := range sh.list() {
		if mr.measureRates(st, now) {
			sh.recordRates(mr, c, now)
		}
		jd := sh.judgeInput(ctx, mr, c)
		v, err := shadow.Evaluate(c.Shadow.Verdict, jd.in)
		if err != nil {
			sh.srv.log.Error("shadow verdict", "route", mr.Name(), "err", err)
			continue
		}
		mr.basis.Store(&jd)
		action := ""
		if jd.scope != shadow.ScopeInstance || v.Decision != shadow.Promote {
			// A gateway that could not read its fleet's pairs does not promote on its own
			// (a rollback is always safe).
			action = mr.progress(sh, st, v, now)
		}
		mr.mu.Lock()
		mr.verdict, mr.judged = &v, now
		if action != "" {
			mr.action = action
		}
		mr.mu.Unlock()
		if action != "" {
			sh.srv.log.Info("shadow progression", "route", mr.Name(), "decision", v.Decision, "action", action)
		}
		sh.recordVerdict(ctx, mr, v, action, now, jd.pairs, jd.replicas)
	}
}

// fleetReadTimeout bounds reading a route's fleet window from a shared store.
const fleetReadTimeout = 5 * time.Second

// judgement is what a route's verdict judged: the input, its totals, and with a shared store
// its scope (the fleet's pairs, or this gateway's alone when the store could not be read)
// and the instances behind it.
type judgement struct {
	in              shadow.Input
	pairs, replicas int64
	scope           string // "" without a shared store
	sources         []shadow.Source
}

// judgeInput is the input of the route's verdict. Without a shared store, the gateway's own
// accumulator, as always. With one, the fleet's: the window of every instance's pairs and
// their summed request rates read from the store (shadow.Store.FleetInput), the same
// whichever gateway reads it; when the store cannot be read, the gateway's own pairs
// (scope instance).
func (sh *shadowing) judgeInput(ctx context.Context, mr *mirrorRoute, c *config.Config) judgement {
	local := func(scope string) judgement {
		pairs, replicas := mr.Accumulator().Counts()
		return judgement{in: mr.input(), pairs: pairs, replicas: replicas, scope: scope}
	}
	w := sh.writer.Load()
	if w == nil {
		return local("")
	}
	st := w.Store()
	if st == nil || !w.Stats().Connected {
		return local(shadow.ScopeInstance) // known unreachable: do not wait for it
	}
	ctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
	defer cancel()
	f, err := st.FleetInput(ctx, mr.Name(), mr.Identity(), c.Shadow.Window, c.Shadow.RateFreshness())
	if err != nil {
		sh.srv.log.Warn("shadow fleet pairs not read; judging this gateway's own", "route", mr.Name(), "err", err)
		return local(shadow.ScopeInstance)
	}
	return judgement{in: f.Input, pairs: f.Pairs, replicas: f.Replicas, scope: shadow.ScopeFleet, sources: f.Sources}
}

// recordRates hands the route's request rates just measured to a shared store's writer (the
// fleet's rates are the instances' sums).
func (sh *shadowing) recordRates(mr *mirrorRoute, c *config.Config, now time.Time) {
	w := sh.writer.Load()
	if w == nil {
		return
	}
	mr.mu.Lock()
	ref, cand := mr.rate.refRate, mr.rate.candRate
	mr.mu.Unlock()
	w.AddRate(shadow.RateRecord{Route: mr.Name(), CandidateID: mr.Identity(), Instance: instance(c), Time: now,
		ReferenceRate: ref, CandidateRate: cand})
}

// referenceCluster is the cluster the candidate is judged against: the baseline, else the
// primary's (the route's cluster, or its heaviest split that is not the candidate's).
func referenceCluster(st *state, route string, m *config.Mirror) string {
	if m.Baseline != "" {
		return m.Baseline
	}
	for _, r := range st.snap.Config.Routes {
		if r.Name != route {
			continue
		}
		if r.Cluster != "" {
			return r.Cluster
		}
		best, w := "", -1
		for _, sp := range r.Splits {
			if sp.Cluster != m.Cluster && sp.Weight > w {
				best, w = sp.Cluster, sp.Weight
			}
		}
		return best
	}
	return ""
}

// measureRates updates the request rates per endpoint of the route's reference and
// candidate clusters over the time since the last call (at least a second apart). It
// reports whether they were measured now.
func (mr *mirrorRoute) measureRates(st *state, now time.Time) bool {
	m := mr.cfg.Load()
	ref := referenceCluster(st, mr.Name(), m)
	rc, cc := st.clusters[ref], st.clusters[m.Cluster]
	if rc == nil || cc == nil || len(rc.Endpoints()) == 0 || len(cc.Endpoints()) == 0 {
		return false
	}
	_, rb := rc.Load()
	_, cb := cc.Load()
	mr.mu.Lock()
	defer mr.mu.Unlock()
	r := &mr.rate
	measured := false
	if r.refName == ref && r.candName == m.Cluster && !r.at.IsZero() {
		dt := now.Sub(r.at).Seconds()
		if dt < 1 {
			return false // too short to say: keep the last interval's rates
		}
		r.refRate = float64(rb-r.reference) / dt / float64(len(rc.Endpoints()))
		r.candRate = float64(cb-r.cand) / dt / float64(len(cc.Endpoints()))
		measured = true
	} else {
		r.refRate, r.candRate = 0, 0
	}
	r.at, r.reference, r.cand, r.refName, r.candName = now, rb, cb, ref, m.Cluster
	return measured
}

// input is the route's comparison so far with the measured request rates.
func (mr *mirrorRoute) input() shadow.Input {
	in := mr.Accumulator().Input()
	mr.mu.Lock()
	in.Load.ReferenceRate, in.Load.CandidateRate = mr.rate.refRate, mr.rate.candRate
	mr.mu.Unlock()
	return in
}

// progress applies the route's weight progression for verdict v (Flagger style): promote
// steps the candidate's split weight up by step at most once per interval up to max;
// rollback sets it to 0. Under xDS the control plane owns the weights: only the
// recommendation is reported. It returns what it did ("" when nothing).
func (mr *mirrorRoute) progress(sh *shadowing, st *state, v shadow.Verdict, now time.Time) string {
	m := mr.cfg.Load()
	if m == nil || m.Progression == nil {
		return ""
	}
	p := m.Progression
	rtr := st.router(mr.Name())
	if rtr == nil {
		return ""
	}
	cur, ok := rtr.Weights()[p.Split]
	if !ok {
		return ""
	}
	next := cur
	switch v.Decision {
	case shadow.Rollback:
		next = 0
	case shadow.Promote:
		mr.mu.Lock()
		due := now.Sub(mr.stepped) >= p.Interval.D()
		mr.mu.Unlock()
		if due && cur < p.Max {
			next = min(p.Max, cur+p.Step)
		}
	}
	if next == cur {
		return ""
	}
	if st.snap.Config.Source == "xds" {
		return fmt.Sprintf("recommend %s weight %d→%d (the control plane owns the weights)", p.Split, cur, next)
	}
	if err := rtr.SetWeights(map[string]int{p.Split: next}); err != nil {
		return fmt.Sprintf("weight %s %d→%d refused: %v", p.Split, cur, next, err)
	}
	mr.mu.Lock()
	mr.stepped = now
	mr.mu.Unlock()
	return fmt.Sprintf("weight %s %d→%d", p.Split, cur, next)
}

// shadowMetrics registers the mirror counters and the verdicts as metrics.
func (s *Server) shadowMetrics(m metric.Meter) (metric.Registration, error) {
	type counter struct {
		inst metric.Int64ObservableCounter
		get  func(shadow.MirrorCounters) int64
	}
	defs := []struct {
		name, desc string
		get        func(shadow.MirrorCounters) int64
	}{
		{"sluice.shadow.offered", "Requests sampled for mirroring", func(c shadow.MirrorCounters) int64 { return c.Offered }},
		{"sluice.shadow.dropped", "Mirrored requests dropped because a mirror queue was full (before sending, or before comparing)", func(c shadow.MirrorCounters) int64 { return c.Dropped }},
		{"sluice.shadow.truncated", "Compared pairs whose answer text was cut at capture_bytes (text, schema and tool checks skipped)", func(c shadow.MirrorCounters) int64 { return c.Truncated }},
		{"sluice.shadow.pairs", "Mirrored pairs (or triples, with a baseline) compared", func(c shadow.MirrorCounters) int64 { return c.Pairs }},
		{"sluice.shadow.candidate_failures", "Mirrored copies the candidate failed", func(c shadow.MirrorCounters) int64 { return c.CandidateFailures }},
		{"sluice.shadow.baseline_failures", "Mirrored copies the baseline failed", func(c shadow.MirrorCounters) int64 { return c.BaselineFailures }},
		{"sluice.shadow.incomplete", "Mirrored copies not compared (the primary did not finish, or the mirror time-out passed)", func(c shadow.MirrorCounters) int64 { return c.Incomplete }},
		{"sluice.shadow.replicas", "Replica answers taken into the noise floor", func(c shadow.MirrorCounters) int64 { return c.Replicas }},
	}
	var cs []counter
	var insts []metric.Observable
	for _, d := range defs {
		c, err := m.Int64ObservableCounter(d.name, metric.WithDescription(d.desc))
		if err != nil {
			return nil, err
		}
		cs = append(cs, counter{c, d.get})
		insts = append(insts, c)
	}
	queued, err := m.Int64ObservableGauge("sluice.shadow.queued", metric.WithDescription("Mirrored copies waiting for a worker"))
	if err != nil {
		return nil, err
	}
	verdict, err := m.Int64ObservableGauge("sluice.shadow.verdict", metric.WithDescription("The route's latest shadow verdict: 1 for the decision it is (promote, hold, rollback)"))
	if err != nil {
		return nil, err
	}
	captured, err := m.Int64ObservableGauge("sluice.shadow.captured", metric.WithDescription("Bytes of mirror.capture_total the route's captured answers reserve now (in 64 KiB steps)"), metric.WithUnit("By"))
	if err != nil {
		return nil, err
	}
	insts = append(insts, queued, verdict, captured)
	store, err := s.storeMetrics(m)
	if err != nil {
		return nil, err
	}
	insts = append(insts, store.insts...)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if w := s.shadow.writer.Load(); w != nil {
			store.observe(o, w.Stats())
		}
		for _, mr := range s.shadow.list() {
			at := metric.WithAttributes(attribute.String("route", mr.Name()))
			mc := mr.Counters()
			for _, c := range cs {
				o.ObserveInt64(c.inst, c.get(mc), at)
			}
			o.ObserveInt64(queued, mc.Queued, at)
			o.ObserveInt64(captured, mc.Captured, at)
			mr.mu.Lock()
			v := mr.verdict
			mr.mu.Unlock()
			if v != nil {
				for _, d := range []shadow.Decision{shadow.Promote, shadow.Hold, shadow.Rollback} {
					val := int64(0)
					if v.Decision == d {
						val = 1
					}
					o.ObserveInt64(verdict, val, metric.WithAttributes(attribute.String("route", mr.Name()), attribute.String("decision", string(d))))
				}
			}
		}
		return nil
	}, insts...)
}

// storeInstruments are the metrics of a shared store's writer.
type storeInstruments struct {
	up, buffered, used, limit         metric.Int64ObservableGauge
	written, dropped, failed, retries metric.Int64ObservableCounter
	insts                             []metric.Observable
}

// storeMetrics makes the shared store's instruments (observed only with one).
func (s *Server) storeMetrics(m metric.Meter) (*storeInstruments, error) {
	si := &storeInstruments{}
	var errs []error
	gauge := func(dst *metric.Int64ObservableGauge, name, desc, unit string) {
		opts := []metric.Int64ObservableGaugeOption{metric.WithDescription(desc)}
		if unit != "" {
			opts = append(opts, metric.WithUnit(unit))
		}
		g, err := m.Int64ObservableGauge(name, opts...)
		*dst = g
		errs = append(errs, err)
		si.insts = append(si.insts, g)
	}
	counter := func(dst *metric.Int64ObservableCounter, name, desc string) {
		c, err := m.Int64ObservableCounter(name, metric.WithDescription(desc))
		*dst = c
		errs = append(errs, err)
		si.insts = append(si.insts, c)
	}
	gauge(&si.up, "sluice.shadow.store.up", "1 while the shared shadow store answers the gateway's writes, 0 while it does not (records are held)", "")
	gauge(&si.buffered, "sluice.shadow.store.buffered", "Records (pairs, verdicts, rates) held for the shared shadow store, not written yet", "")
	gauge(&si.used, "sluice.shadow.store.buffer_used", "Bytes of shadow.buffer the held records take", "By")
	gauge(&si.limit, "sluice.shadow.store.buffer_limit", "shadow.buffer: the bytes of records the gateway may hold", "By")
	counter(&si.written, "sluice.shadow.store.written", "Records written to the shared shadow store")
	counter(&si.dropped, "sluice.shadow.store.dropped", "Records not kept for the shared shadow store, by kind: shadow.buffer was full, or the gateway stopped before it could write them")
	counter(&si.failed, "sluice.shadow.store.failed", "Records the shared shadow store refused (not tried again)")
	counter(&si.retries, "sluice.shadow.store.retries", "Writes (or openings) of the shared shadow store that did not reach it and are tried again")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return si, nil
}

func (si *storeInstruments) observe(o metric.Observer, st shadow.WriterStats) {
	up := int64(0)
	if st.Connected {
		up = 1
	}
	o.ObserveInt64(si.up, up)
	o.ObserveInt64(si.buffered, int64(st.Buffered))
	o.ObserveInt64(si.used, st.BufferedBytes)
	o.ObserveInt64(si.limit, st.MaxBytes)
	o.ObserveInt64(si.written, st.Written)
	o.ObserveInt64(si.failed, st.Failed)
	o.ObserveInt64(si.retries, st.Retries)
	for _, k := range []string{shadow.KindPair, shadow.KindVerdict, shadow.KindRate, shadow.KindPrune} {
		o.ObserveInt64(si.dropped, st.Dropped[k], metric.WithAttributes(attribute.String("kind", k)))
	}
}
