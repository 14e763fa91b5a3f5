// Package server is a small xDS control plane for development and small fleets: it serves a
// Sluice config file as xDS resources (clusters, endpoints, one route configuration and the
// sluice.policy extension config) with go-control-plane's snapshot cache, and pushes a new
// snapshot when the file changes. `sluice xds --config FILE` runs it; replicas started with
// `sluice serve --xds ADDR` follow it.
//
// Resources is the inverse of xds.Translate: Translate(Resources(c)) gives c back, apart from
// the fields that cannot travel (see docs/xds.md).
package server

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"sort"
	"strconv"

	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/upstream"
	"github.com/sluicegw/sluice/xds"
)

// DefaultRouteConfig is the name of the RouteConfiguration served when none is given (the
// client's default too).
const DefaultRouteConfig = "sluice"

// VirtualHostName is the one virtual host of the route configuration.
const VirtualHostName = "sluice"

// Resources turns a finished file config into xDS resources by type: a Cluster per cluster
// (type EDS with a ClusterLoadAssignment when every endpoint host is an IP address, else
// STRICT_DNS with an inline load_assignment), one RouteConfiguration named routeConfig with
// one virtual host (domains ["*"]), and the ECDS TypedExtensionConfig "sluice.policy". What
// Envoy has no field for travels as Sluice metadata or typed_per_filter_config (docs/xds.md).
// Every problem is returned at once.
func Resources(c *config.Config, routeConfig string) (map[resource.Type][]types.Resource, error) {
	if c == nil {
		return nil, errors.New("xds server: no config")
	}
	if routeConfig == "" {
		routeConfig = DefaultRouteConfig
	}
	var errs []error
	out := map[resource.Type][]types.Resource{}
	for _, cc := range c.Clusters {
		if cc.Pending {
			continue // a placeholder of a translated config, not a cluster
		}
		cl, cla, err := clusterResource(cc)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %q: %w", cc.Name, err))
			continue
		}
		out[resource.ClusterType] = append(out[resource.ClusterType], cl)
		if cla != nil {
			out[resource.EndpointType] = append(out[resource.EndpointType], cla)
		}
	}
	vh := &routev3.VirtualHost{Name: VirtualHostName, Domains: []string{"*"}}
	for i, r := range c.Routes {
		rr, err := routeResource(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("routes[%d] (%s): %w", i, r.Name, err))
			continue
		}
		vh.Routes = append(vh.Routes, rr)
	}
	out[resource.RouteType] = []types.Resource{&routev3.RouteConfiguration{Name: routeConfig, VirtualHosts: []*routev3.VirtualHost{vh}}}

	// load_signals, chaos.enabled, shadow.store and shadow.instance are each replica's own
	// (they need a restart, or name the replica): they stay in the replicas' bootstraps and
	// flags and never travel.
	chaos, shadowCfg := c.Chaos, c.Shadow
	chaos.Enabled, shadowCfg.Store, shadowCfg.Instance = false, "", ""
	g := xds.GlobalPolicy{
		MaxBodyBytes: c.MaxBodyBytes, MaxEventBytes: c.MaxEventBytes, DrainTimeout: c.DrainTimeout, DrainDelay: c.DrainDelay,
		Timeouts: c.Timeouts, Chaos: chaos, Tenants: c.Tenants, Shadow: shadowCfg,
		TrustedProxies: c.TrustedProxies, Limits: c.Limits, CORS: c.CORS,
	}
	ts, err := xds.NewTypedStruct(xds.GlobalPolicyTypeURL, g)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", xds.PolicyName, err))
	}
	if ts == nil {
		ts, _ = anypb.New(emptyTypedStruct(xds.GlobalPolicyTypeURL))
	}
	out[resource.ExtensionConfigType] = []types.Resource{&corev3.TypedExtensionConfig{Name: xds.PolicyName, TypedConfig: ts}}

	for typ, rs := range out {
		for _, r := range rs {
			if v, ok := r.(interface{ ValidateAll() error }); ok {
				if err := v.ValidateAll(); err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w", typ, resourceName(r), err))
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func resourceName(r types.Resource) string {
	if n, ok := r.(interface{ GetName() string }); ok {
		return strconv.Quote(n.GetName())
	}
	if n, ok := r.(interface{ GetClusterName() string }); ok {
		return strconv.Quote(n.GetClusterName())
	}
	return ""
}

func clusterResource(cc config.Cluster) (*clusterv3.Cluster, *endpointv3.ClusterLoadAssignment, error) {
	var errs []error
	cl := &clusterv3.Cluster{Name: cc.Name, LbPolicy: clusterv3.Cluster_LEAST_REQUEST}
	if d := cc.Timeouts.Connect; d > 0 {
		cl.ConnectTimeout = durationpb.New(d.D())
	}
	cp := xds.ClusterPolicy{
		Timeouts: xds.ClusterTimeouts{TTFT: cc.Timeouts.TTFT, Idle: cc.Timeouts.Idle, Total: cc.Timeouts.Total},
		Picking:  cc.Picking, MaxIdleConnsPerHost: cc.MaxIdleConnsPerHost, APIKeyEnv: cc.APIKeyEnv,
		HealthPathAuto: !cc.HealthCheck.Disabled && cc.HealthCheck.Path == "",
	}
	md, err := xds.NewMetadata(cp)
	if err != nil {
		errs = append(errs, err)
	}
	cl.Metadata = md

	cla := &endpointv3.ClusterLoadAssignment{ClusterName: cc.Name}
	lle := &endpointv3.LocalityLbEndpoints{}
	scheme, allIP := "", true
	for i, ep := range cc.Endpoints {
		u, err := url.Parse(ep.URL)
		if err != nil || u.Host == "" {
			errs = append(errs, fmt.Errorf("endpoints[%d].url: %q is not an absolute URL", i, ep.URL))
			continue
		}
		if scheme != "" && u.Scheme != scheme {
			errs = append(errs, fmt.Errorf("endpoints[%d].url: %s and %s endpoints in one cluster cannot travel over xDS (TLS is per cluster)", i, scheme, u.Scheme))
		}
		scheme = u.Scheme
		if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			errs = append(errs, fmt.Errorf("endpoints[%d].url: a query, fragment or user cannot travel over xDS", i))
		}
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoints[%d].url: port %q: %w", i, port, err))
			continue
		}
		if _, err := netip.ParseAddr(host); err != nil {
			allIP = false
		}
		lb := &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)},
				}}},
			}},
		}
		if ep.Weight > 0 {
			lb.LoadBalancingWeight = wrapperspb.UInt32(uint32(min(ep.Weight, math.MaxInt32)))
		}
		path := u.EscapedPath()
		if path == "/" {
			path = ""
		}
		emd, err := xds.NewMetadata(xds.EndpointPolicy{Metrics: ep.Metrics, PathPrefix: path})
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoints[%d]: %w", i, err))
		}
		lb.Metadata = emd
		lle.LbEndpoints = append(lle.LbEndpoints, lb)
	}
	cla.Endpoints = []*endpointv3.LocalityLbEndpoints{lle}

	if scheme == "https" {
		vc := &tlsv3.CertificateValidationContext{}
		if cc.TLS.CAFile != "" {
			vc.TrustedCa = &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: cc.TLS.CAFile}}
		}
		if cc.TLS.InsecureSkipVerify {
			vc.TrustChainVerification = tlsv3.CertificateValidationContext_ACCEPT_UNTRUSTED
		}
		utc := &tlsv3.UpstreamTlsContext{Sni: cc.TLS.ServerName, CommonTlsContext: &tlsv3.CommonTlsContext{
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: vc},
		}}
		a, err := anypb.New(utc)
		if err != nil {
			errs = append(errs, err)
		}
		cl.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: a}}
	}

	if hc := cc.HealthCheck; !hc.Disabled {
		if hc.Path == "" {
			hc.Path = upstream.AutoHealthPaths[0] // Envoy wants a path; the metadata says it is the default
		}
		cl.HealthChecks = []*corev3.HealthCheck{{
			Timeout: durationpb.New(hc.Timeout.D()), Interval: durationpb.New(hc.Interval.D()),
			UnhealthyThreshold: wrapperspb.UInt32(uint32(max(hc.UnhealthyThreshold, 0))),
			HealthyThreshold:   wrapperspb.UInt32(uint32(max(hc.HealthyThreshold, 0))),
			HealthChecker:      &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{Path: hc.Path}},
		}}
	}
	if od := cc.Outlier; !od.Disabled {
		cl.OutlierDetection = &clusterv3.OutlierDetection{
			Consecutive_5Xx:    wrapperspb.UInt32(uint32(max(od.ConsecutiveFailures, 0))),
			BaseEjectionTime:   durationpb.New(od.BaseEjection.D()),
			MaxEjectionTime:    durationpb.New(od.MaxEjection.D()),
			MaxEjectionPercent: wrapperspb.UInt32(uint32(max(od.MaxEjectionPercent, 0))),
		}
	}

	if allIP {
		cl.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		cl.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ResourceApiVersion:    corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}}
	} else {
		cl.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
		cl.LoadAssignment, cla = cla, nil
	}
	return cl, cla, errors.Join(errs...)
}

// retryOn is what Sluice retries, in Envoy's words (Translate maps it back).
const retryOn = "connect-failure,reset,5xx,retriable-status-codes"

func routeResource(r config.Route) (*routev3.Route, error) {
	var errs []error
	out := &routev3.Route{
		Name:  r.Name,
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: r.Match.PathPrefix}},
	}
	names := make([]string, 0, len(r.Match.Headers))
	for h := range r.Match.Headers {
		names = append(names, h)
	}
	sort.Strings(names)
	for _, h := range names {
		hm := &routev3.HeaderMatcher{Name: h}
		if v := r.Match.Headers[h]; v == "*" {
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
		} else {
			hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v}}}
		}
		out.Match.Headers = append(out.Match.Headers, hm)
	}

	act := &routev3.RouteAction{}
	rp := xds.RoutePolicy{
		Model: r.Model, Timeouts: xds.RouteTimeouts{Connect: r.Timeouts.Connect, TTFT: r.Timeouts.TTFT},
		Policies: r.Policies, Sticky: r.Sticky, GrayFlagHeader: r.GrayFlagHeader, Fallback: r.Fallback,
		Retry: xds.RetryPolicy{Budget: r.Retry.Budget, MinRetriesPerSecond: r.Retry.MinRetriesPerSecond,
			HonorRetryAfter: r.Retry.HonorRetryAfter, MaxRetryAfter: r.Retry.MaxRetryAfter},
		Breaker: r.Breaker, Resume: r.Resume, ContractMismatch: r.ContractMismatch,
	}
	if r.Match.Model != "" {
		rp.Match = &xds.MatchPolicy{Model: r.Match.Model}
	}
	if len(r.Splits) > 0 {
		rp.Cluster = r.Cluster
		wc := &routev3.WeightedCluster{}
		for _, sp := range r.Splits {
			cw := &routev3.WeightedCluster_ClusterWeight{Name: sp.Cluster, Weight: wrapperspb.UInt32(uint32(max(sp.Weight, 0)))}
			a, err := xds.NewTypedStruct(xds.SplitPolicyTypeURL, xds.SplitPolicy{Name: sp.Name, GrayFlag: sp.GrayFlag, Model: sp.Model})
			if err != nil {
				errs = append(errs, err)
			}
			if a != nil {
				cw.TypedPerFilterConfig = map[string]*anypb.Any{xds.PolicyName: a}
			}
			wc.Clusters = append(wc.Clusters, cw)
		}
		act.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}
	} else {
		act.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: r.Cluster}
	}
	if d := r.Timeouts.Total; d > 0 {
		act.Timeout = durationpb.New(d.D())
	}
	if d := r.Timeouts.Idle; d > 0 {
		act.IdleTimeout = durationpb.New(d.D())
	}
	if rt := r.Retry; rt.Attempts > 1 || rt.PerTryTimeout > 0 || rt.BackoffBase > 0 || rt.BackoffMax > 0 {
		rpol := &routev3.RetryPolicy{RetryOn: retryOn, RetriableStatusCodes: []uint32{429}, NumRetries: wrapperspb.UInt32(uint32(max(rt.Attempts-1, 0)))}
		if rt.PerTryTimeout > 0 {
			rpol.PerTryTimeout = durationpb.New(rt.PerTryTimeout.D())
		}
		if rt.BackoffBase > 0 || rt.BackoffMax > 0 {
			base := rt.BackoffBase
			if base == 0 {
				base = config.Duration(25e6) // route.DefaultBackoffBase; Envoy requires a base
			}
			rpol.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(base.D())}
			if rt.BackoffMax > 0 {
				rpol.RetryBackOff.MaxInterval = durationpb.New(rt.BackoffMax.D())
			}
		}
		act.RetryPolicy = rpol
	}
	if m := r.Mirror; m != nil {
		act.RequestMirrorPolicies = []*routev3.RouteAction_RequestMirrorPolicy{{
			Cluster: m.Cluster,
			RuntimeFraction: &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{
				Numerator: uint32(math.Round(min(max(m.Fraction, 0), 1) * 1e6)), Denominator: typev3.FractionalPercent_MILLION,
			}},
		}}
		rp.Mirror = &xds.MirrorPolicy{
			Model: m.Model, Baseline: m.Baseline, ReplicaFraction: m.ReplicaFraction, AbnormalFinish: m.AbnormalFinish,
			MaxQueue: m.MaxQueue, MaxConcurrency: m.MaxConcurrency, CaptureBytes: m.CaptureBytes, CaptureTotal: m.CaptureTotal, Timeout: m.Timeout, StripHeaders: m.StripHeaders, SetHeaders: m.SetHeaders, Progression: m.Progression,
		}
	}
	out.Action = &routev3.Route_Route{Route: act}
	a, err := xds.NewTypedStruct(xds.RoutePolicyTypeURL, rp)
	if err != nil {
		errs = append(errs, err)
	}
	if a != nil {
		out.TypedPerFilterConfig = map[string]*anypb.Any{xds.PolicyName: a}
	}
	return out, errors.Join(errs...)
}

func emptyTypedStruct(typeURL string) *xdstypev3.TypedStruct {
	return &xdstypev3.TypedStruct{TypeUrl: typeURL}
}
