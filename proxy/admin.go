package proxy

import (
	"context"
	"net/http"

	"github.com/sluicegw/sluice/proxy/admin"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/shadow"
)

// adminHandler is the admin listener's handler (package admin), reading this server through
// gatewayView.
func (s *Server) adminHandler() http.Handler {
	return admin.Handler(admin.Options{
		Gateway: gatewayView{s},
		Metrics: s.tel.Handler(),
		Chaos:   s.chaos,
		XDS:     s.opts.XDSStatus,
		Log:     s.log,
	})
}

// gatewayView is what the admin API reads and changes on the server (admin.Gateway): each
// call reads the generation serving at that moment.
type gatewayView struct{ s *Server }

func (g gatewayView) Config() *config.Config { return g.s.Config() }
func (g gatewayView) NotReady() string       { return g.s.notReady() }
func (g gatewayView) Reload() error          { return g.s.Reload() }

func (g gatewayView) Endpoints() map[string][]upstream.EndpointStatus {
	out := map[string][]upstream.EndpointStatus{}
	for name, cl := range g.s.state.Load().clusters {
		out[name] = cl.Snapshot()
	}
	return out
}

func (g gatewayView) Routes() []admin.RouteState {
	st := g.s.state.Load()
	out := make([]admin.RouteState, 0, len(st.snap.Routes))
	for i, r := range st.snap.Routes {
		out = append(out, admin.RouteState{Route: r.Name, State: st.routers[i].Snapshot()})
	}
	return out
}

func (g gatewayView) Router(name string) admin.Router {
	if rtr := g.s.state.Load().router(name); rtr != nil {
		return rtr
	}
	return nil // not a typed nil
}

func (g gatewayView) Policies() []admin.Policy {
	st := g.s.state.Load()
	out := make([]admin.Policy, 0, len(st.policies))
	for _, bp := range st.policies {
		out = append(out, admin.Policy{Route: bp.route, Type: bp.typ, Name: bp.name, Contracts: contractsOf(bp.impl), Plugin: bp.impl})
	}
	return out
}

func (g gatewayView) ShadowReport(ctx context.Context, judge bool) (shadow.Report, error) {
	return g.s.ShadowReport(ctx, judge)
}

func (g gatewayView) ShadowStore() *shadow.Store { return g.s.shadow.store.Load() }

func (g gatewayView) Signals(ctx context.Context) any { return g.s.scraper.Snapshot(ctx) }

// notReady says why /readyz is 503 ("" when ready): no config yet, draining, or a cluster
// of admin.ready_clusters without a healthy endpoint.
func (s *Server) notReady() string {
	switch {
	case s.draining.Load():
		return "draining"
	case !s.ready.Load():
		return "no config yet"
	}
	st := s.state.Load()
	for _, name := range st.snap.Config.Admin.ReadyClusters {
		if cl := st.clusters[name]; cl != nil && !cl.Ready() {
			return "cluster " + name + " has no healthy endpoint"
		}
	}
	return ""
}
