// Package xds makes Sluice a mesh component: an ADS client (delta xDS first) that receives
// clusters, endpoints, routes and Sluice's own policy from a control plane, translates them
// into the one config model (proxy/config) and swaps them in whole, NACKing anything bad and
// keeping the last good config.
package xds

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

// PolicyName is the ECDS resource (TypedExtensionConfig) carrying Sluice's global policy, and
// the typed_per_filter_config key carrying a route's Sluice policy.
const PolicyName = "sluice.policy"

// Resources is one set of xDS resources as the client holds them after an update: every
// resource received so far, by name. Translate turns it into a config.
type Resources struct {
	Clusters  map[string]*clusterv3.Cluster
	Endpoints map[string]*endpointv3.ClusterLoadAssignment
	Routes    map[string]*routev3.RouteConfiguration
	// Policy is the ECDS resource named PolicyName (nil until received).
	Policy *corev3.TypedExtensionConfig
}
