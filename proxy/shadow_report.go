package proxy

import (
	"context"
	"time"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// ShadowReport is the shadow report of every mirrored route (what /admin/shadow.json
// serves). With judge, every route is judged first (as the interval would). With a shared
// store a route's samples are those its latest verdict judged (the fleet's), and the report
// says what the store's writer holds and dropped.
func (s *Server) ShadowReport(ctx context.Context, judge bool) (shadow.Report, error) {
	if judge {
		s.shadow.judgeAll(ctx, time.Now())
	}
	st := s.state.Load()
	c := st.snap.Config
	var ins []shadow.RouteInput
	shared := s.shadow.writer.Load() != nil
	for _, mr := range s.shadow.list() {
		m := mr.cfg.Load()
		in := mr.input()
		pairs, replicas := mr.Accumulator().Counts()
		var scope string
		var sources []shadow.Source
		if shared {
			scope = shadow.ScopeInstance // not judged yet: this gateway's own
			if jd := mr.basis.Load(); jd != nil {
				in, pairs, replicas, scope, sources = jd.in, jd.pairs, jd.replicas, jd.scope, jd.sources
			}
		}
		ri := shadow.RouteInput{
			Route: mr.Name(), CandidateCluster: m.Cluster, CandidateID: mr.Identity(), Input: &in, Pairs: pairs, Replicas: replicas,
			Config: c.Shadow.Verdict, Window: c.Shadow.Window,
			Mirror: mr.Stats(), PrimaryCluster: referenceCluster(st, mr.Name(), &config.Mirror{Cluster: m.Cluster}),
			BaselineCluster: m.Baseline, Scope: scope, Sources: sources,
		}
		mr.mu.Lock()
		ri.Verdict, ri.VerdictTime, ri.Action = mr.verdict, mr.judged, mr.action
		mr.mu.Unlock()
		ins = append(ins, ri)
	}
	store := s.shadow.store.Load()
	status := s.shadow.storeStatus()
	if !shared {
		rep, err := shadow.BuildReport(ctx, store, ins)
		rep.Store = status
		return rep, err
	}
	// A shared store may be down: the report then goes without its history rather than
	// wait for it or fail.
	if store != nil && status.Writer.Connected {
		rctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
		rep, err := shadow.BuildReport(rctx, store, ins)
		cancel()
		if err == nil {
			rep.Store = status
			return rep, nil
		}
		status.Error = "history not read: " + err.Error()
	}
	rep, err := shadow.BuildReport(ctx, nil, ins)
	rep.Store = status
	return rep, err
}
