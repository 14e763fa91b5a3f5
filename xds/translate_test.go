package xds

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy"
	"github.com/sluicegw/sluice/proxy/config"
)

// ---- builders ----

func sec(s float64) *durationpb.Duration {
	return durationpb.New(time.Duration(s * float64(time.Second)))
}

func u32p(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }

func mustStruct(t testing.TB, v map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func typedStruct(t testing.TB, v map[string]any) *anypb.Any {
	t.Helper()
	a, err := anypb.New(&xdstypev3.TypedStruct{TypeUrl: RoutePolicyTypeURL, Value: mustStruct(t, v)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func sluiceMD(t testing.TB, v map[string]any) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: mustStruct(t, v)}}
}

func lbEndpoint(host string, port uint32) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}}},
	}}}
}

func cla(name string, eps ...*endpointv3.LbEndpoint) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}}}
}

func staticCluster(name string, eps ...*endpointv3.LbEndpoint) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment:       cla(name, eps...),
	}
}

func edsCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}},
	}
}

func routeTo(name, prefix, cluster string) *routev3.Route {
	return &routev3.Route{
		Name:  name,
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
		}},
	}
}

func routeConfig(routes ...*routev3.Route) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: "sluice", VirtualHosts: []*routev3.VirtualHost{{Name: "all", Domains: []string{"*"}, Routes: routes}}}
}

func tlsSocket(t testing.TB, utc *tlsv3.UpstreamTlsContext) *corev3.TransportSocket {
	a, err := anypb.New(utc)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: a}}
}

var testOpts = TranslateOptions{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", RouteConfig: "sluice"}

// defaulted applies the file loader's defaults to a cluster, as Translate's Finish does.
func defaulted(t testing.TB, cl config.Cluster) config.Cluster {
	t.Helper()
	c := config.Config{Dynamic: true, Clusters: []config.Cluster{cl}}
	_ = c.Finish()
	return c.Clusters[0]
}

func jsonOf(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func translateOK(t *testing.T, res Resources) *config.Config {
	t.Helper()
	c, err := Translate(res, testOpts)
	if err != nil {
		t.Fatalf("Translate: %v", err)
	}
	return c
}

// ---- clusters ----

func TestTranslateClusters(t *testing.T) {
	ca := t.TempDir() + "/ca.pem"
	writeFile(t, ca, "not checked by Translate")

	full := staticCluster("llama", func() *endpointv3.LbEndpoint {
		e := lbEndpoint("10.0.0.5", 8000)
		e.LoadBalancingWeight = u32p(3)
		e.Metadata = sluiceMD(t, map[string]any{"metrics": "http://10.0.0.5:8000/metrics", "path_prefix": "/base"})
		return e
	}(), lbEndpoint("10.0.0.6", 8000), func() *endpointv3.LbEndpoint {
		e := lbEndpoint("10.0.0.7", 8000)
		e.HealthStatus = corev3.HealthStatus_DRAINING
		return e
	}())
	full.ConnectTimeout = sec(1.5)
	full.HealthChecks = []*corev3.HealthCheck{{
		Timeout: sec(2), Interval: sec(7), UnhealthyThreshold: u32p(4), HealthyThreshold: u32p(1),
		HealthChecker: &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{Path: "/ready"}},
	}}
	full.OutlierDetection = &clusterv3.OutlierDetection{Consecutive_5Xx: u32p(3), BaseEjectionTime: sec(10), MaxEjectionTime: sec(60), MaxEjectionPercent: u32p(34)}
	full.Metadata = sluiceMD(t, map[string]any{
		"timeouts":                map[string]any{"ttft": "20s", "idle": "30s"},
		"picking":                 map[string]any{"strategy": "load_aware", "kv_weight": 2},
		"max_idle_conns_per_host": 32,
	})

	tlsCl := staticCluster("secure", lbEndpoint("llm.example.com", 443))
	tlsCl.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
	tlsCl.TransportSocket = tlsSocket(t, &tlsv3.UpstreamTlsContext{
		Sni: "llm.example.com",
		CommonTlsContext: &tlsv3.CommonTlsContext{ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: ca}}},
		}},
	})

	defaultOutlier := staticCluster("od", lbEndpoint("127.0.0.1", 9000))
	defaultOutlier.OutlierDetection = &clusterv3.OutlierDetection{}

	eds := edsCluster("pool")
	edsOther := edsCluster("svc")
	edsOther.EdsClusterConfig.ServiceName = "svc-endpoints"

	tests := []struct {
		name  string
		cl    *clusterv3.Cluster
		eds   map[string]*endpointv3.ClusterLoadAssignment
		want  config.Cluster
		extra func(t *testing.T, got config.Cluster)
	}{{
		name: "static with everything",
		cl:   full,
		want: config.Cluster{
			Name: "llama",
			Endpoints: []config.Endpoint{
				{URL: "http://10.0.0.5:8000/base", Metrics: "http://10.0.0.5:8000/metrics", Weight: 3},
				{URL: "http://10.0.0.6:8000"},
			},
			Timeouts:            config.Timeouts{Connect: config.Duration(1500 * time.Millisecond), TTFT: config.Duration(20 * time.Second), Idle: config.Duration(30 * time.Second)},
			HealthCheck:         config.HealthCheck{Path: "/ready", Interval: config.Duration(7 * time.Second), Timeout: config.Duration(2 * time.Second), UnhealthyThreshold: 4, HealthyThreshold: 1},
			Outlier:             config.Outlier{ConsecutiveFailures: 3, BaseEjection: config.Duration(10 * time.Second), MaxEjection: config.Duration(time.Minute), MaxEjectionPercent: 34},
			Picking:             config.Picking{Strategy: "load_aware", KVWeight: 2},
			MaxIdleConnsPerHost: 32,
		},
	}, {
		name: "tls from the transport socket, no checks without health_checks and outlier_detection",
		cl:   tlsCl,
		want: config.Cluster{
			Name:        "secure",
			Endpoints:   []config.Endpoint{{URL: "https://llm.example.com"}},
			TLS:         config.UpstreamTLS{ServerName: "llm.example.com", CAFile: ca},
			HealthCheck: config.HealthCheck{Disabled: true},
			Outlier:     config.Outlier{Disabled: true},
		},
	}, {
		name: "outlier_detection with Envoy's defaults",
		cl:   defaultOutlier,
		want: config.Cluster{
			Name:        "od",
			Endpoints:   []config.Endpoint{{URL: "http://127.0.0.1:9000"}},
			HealthCheck: config.HealthCheck{Disabled: true},
			Outlier:     config.Outlier{ConsecutiveFailures: 5, BaseEjection: config.Duration(30 * time.Second), MaxEjection: config.Duration(300 * time.Second), MaxEjectionPercent: 10},
		},
	}, {
		name: "EDS endpoints by cluster name",
		cl:   eds,
		eds:  map[string]*endpointv3.ClusterLoadAssignment{"pool": cla("pool", lbEndpoint("::1", 8000))},
		want: config.Cluster{
			Name:        "pool",
			Endpoints:   []config.Endpoint{{URL: "http://[::1]:8000"}},
			HealthCheck: config.HealthCheck{Disabled: true}, Outlier: config.Outlier{Disabled: true},
		},
	}, {
		name: "EDS endpoints by service name",
		cl:   edsOther,
		eds:  map[string]*endpointv3.ClusterLoadAssignment{"svc-endpoints": cla("svc-endpoints", lbEndpoint("10.1.1.1", 80))},
		want: config.Cluster{
			Name:        "svc",
			Endpoints:   []config.Endpoint{{URL: "http://10.1.1.1"}},
			HealthCheck: config.HealthCheck{Disabled: true}, Outlier: config.Outlier{Disabled: true},
		},
	}, {
		name: "EDS without its assignment yet: pending",
		cl:   eds,
		want: config.Cluster{Name: "pool", Pending: true, HealthCheck: config.HealthCheck{Disabled: true}, Outlier: config.Outlier{Disabled: true}},
	}, {
		name: "EDS with an empty assignment: pending",
		cl:   eds,
		eds:  map[string]*endpointv3.ClusterLoadAssignment{"pool": cla("pool")},
		want: config.Cluster{Name: "pool", Pending: true, HealthCheck: config.HealthCheck{Disabled: true}, Outlier: config.Outlier{Disabled: true}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := translateOK(t, Resources{Clusters: map[string]*clusterv3.Cluster{tc.cl.GetName(): tc.cl}, Endpoints: tc.eds})
			if len(c.Clusters) != 1 {
				t.Fatalf("clusters = %s", jsonOf(c.Clusters))
			}
			want := defaulted(t, tc.want)
			if got := c.Clusters[0]; !reflect.DeepEqual(got, want) {
				t.Errorf("cluster:\n got %s\nwant %s", jsonOf(got), jsonOf(want))
			}
			if c.Source != Source || c.Version == "" || !c.Dynamic {
				t.Errorf("source %q version %q dynamic %v", c.Source, c.Version, c.Dynamic)
			}
		})
	}
}

// ---- routes ----

func TestTranslateRoutes(t *testing.T) {
	clusters := map[string]*clusterv3.Cluster{}
	for _, n := range []string{"llama", "cand", "small"} {
		clusters[n] = staticCluster(n, lbEndpoint("127.0.0.1", 8000))
	}
	withAction := func(r *routev3.Route, f func(a *routev3.RouteAction)) *routev3.Route {
		f(r.GetRoute())
		return r
	}

	tests := []struct {
		name string
		vh   func(vh *routev3.VirtualHost)
		r    *routev3.Route
		want config.Route
	}{{
		name: "prefix and cluster",
		r:    routeTo("chat", "/v1/chat/", "llama"),
		want: config.Route{Name: "chat", Match: config.Match{PathPrefix: "/v1/chat/"}, Cluster: "llama"},
	}, {
		name: "path is taken as a prefix",
		r: func() *routev3.Route {
			r := routeTo("models", "", "llama")
			r.Match.PathSpecifier = &routev3.RouteMatch_Path{Path: "/v1/models"}
			return r
		}(),
		want: config.Route{Name: "models", Match: config.Match{PathPrefix: "/v1/models"}, Cluster: "llama"},
	}, {
		name: "unnamed route with an empty prefix",
		r:    routeTo("", "", "llama"),
		want: config.Route{Name: "route-0", Match: config.Match{PathPrefix: "/"}, Cluster: "llama"},
	}, {
		name: "header matchers, gray flag included",
		r: func() *routev3.Route {
			r := routeTo("gray", "/", "cand")
			r.Match.Headers = []*routev3.HeaderMatcher{
				{Name: "x-gray-flag", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "v2"}}}},
				//lint:ignore SA1019 the deprecated form is still accepted, as Envoy does
				{Name: "x-team", HeaderMatchSpecifier: &routev3.HeaderMatcher_ExactMatch{ExactMatch: "a"}},
				{Name: "x-debug", HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}},
			}
			return r
		}(),
		want: config.Route{Name: "gray", Match: config.Match{PathPrefix: "/", Headers: map[string]string{"x-gray-flag": "v2", "x-team": "a", "x-debug": "*"}}, Cluster: "cand"},
	}, {
		name: "weighted clusters become splits, with the split policy",
		r: withAction(routeTo("split", "/v1/", "x"), func(a *routev3.RouteAction) {
			a.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: []*routev3.WeightedCluster_ClusterWeight{
				{Name: "llama", Weight: u32p(95)},
				{Name: "cand", Weight: u32p(5), TypedPerFilterConfig: map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"gray_flag": "v2", "model": "llama-next", "name": "canary"})}},
			}}}
		}),
		want: config.Route{Name: "split", Match: config.Match{PathPrefix: "/v1/"}, Spec: route.Spec{Splits: []route.Split{
			{Cluster: "llama", Weight: 95}, {Name: "canary", Cluster: "cand", Weight: 5, GrayFlag: "v2", Model: "llama-next"},
		}}},
	}, {
		name: "mirror with runtime fraction and the policy's extras",
		r: func() *routev3.Route {
			r := withAction(routeTo("mirror", "/", "llama"), func(a *routev3.RouteAction) {
				a.RequestMirrorPolicies = []*routev3.RouteAction_RequestMirrorPolicy{{Cluster: "cand", RuntimeFraction: &corev3.RuntimeFractionalPercent{
					DefaultValue: &typev3.FractionalPercent{Numerator: 1000, Denominator: typev3.FractionalPercent_TEN_THOUSAND},
				}}}
			})
			r.TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"mirror": map[string]any{
				"model": "cand-model", "baseline": "small", "max_queue": 8, "max_concurrency": 2, "capture_bytes": "64KiB",
				"abnormal_finish": []any{"content_filter"}, "capture_total": "128MiB",
				"strip_headers": []any{"x-user"}, "set_headers": map[string]any{"x-shadow": "1"},
			}})}
			return r
		}(),
		want: config.Route{Name: "mirror", Match: config.Match{PathPrefix: "/"}, Cluster: "llama", Mirror: &config.Mirror{
			Cluster: "cand", Fraction: 0.1, Model: "cand-model", Baseline: "small", MaxQueue: 8, MaxConcurrency: 2,
			AbnormalFinish: []string{"content_filter"}, CaptureTotal: 128 << 20,
			CaptureBytes: 64 << 10, StripHeaders: []string{"x-user"}, SetHeaders: map[string]string{"x-shadow": "1"},
		}},
	}, {
		name: "mirror without runtime fraction mirrors everything",
		r: withAction(routeTo("all", "/", "llama"), func(a *routev3.RouteAction) {
			a.RequestMirrorPolicies = []*routev3.RouteAction_RequestMirrorPolicy{{Cluster: "cand"}}
		}),
		want: config.Route{Name: "all", Match: config.Match{PathPrefix: "/"}, Cluster: "llama", Mirror: &config.Mirror{Cluster: "cand", Fraction: 1}},
	}, {
		name: "retry policy and time-outs",
		r: withAction(routeTo("retry", "/", "llama"), func(a *routev3.RouteAction) {
			a.Timeout, a.IdleTimeout = sec(120), sec(15)
			a.RetryPolicy = &routev3.RetryPolicy{RetryOn: "5xx,connect-failure", NumRetries: u32p(2), PerTryTimeout: sec(10),
				RetryBackOff: &routev3.RetryPolicy_RetryBackOff{BaseInterval: sec(0.05)}}
		}),
		want: config.Route{Name: "retry", Match: config.Match{PathPrefix: "/"}, Cluster: "llama",
			Timeouts: config.Timeouts{Total: config.Duration(2 * time.Minute), Idle: config.Duration(15 * time.Second)},
			Spec: route.Spec{Retry: route.Retry{Attempts: 3, PerTryTimeout: config.Duration(10 * time.Second),
				BackoffBase: config.Duration(50 * time.Millisecond), BackoffMax: config.Duration(500 * time.Millisecond)}}},
	}, {
		name: "retry_on without a condition Sluice retries: no retries",
		r: withAction(routeTo("noretry", "/", "llama"), func(a *routev3.RouteAction) {
			a.RetryPolicy = &routev3.RetryPolicy{RetryOn: "retriable-4xx", NumRetries: u32p(2)}
		}),
		want: config.Route{Name: "noretry", Match: config.Match{PathPrefix: "/"}, Cluster: "llama"},
	}, {
		name: "num_retries defaults to 1; 429 as a retriable status",
		r: withAction(routeTo("r429", "/", "llama"), func(a *routev3.RouteAction) {
			a.RetryPolicy = &routev3.RetryPolicy{RetryOn: "retriable-status-codes", RetriableStatusCodes: []uint32{429}}
		}),
		want: config.Route{Name: "r429", Match: config.Match{PathPrefix: "/"}, Cluster: "llama", Spec: route.Spec{Retry: route.Retry{Attempts: 2}}},
	}, {
		name: "virtual host retry policy applies to routes without one",
		vh: func(vh *routev3.VirtualHost) {
			vh.RetryPolicy = &routev3.RetryPolicy{RetryOn: "gateway-error", NumRetries: u32p(1)}
		},
		r:    routeTo("vhretry", "/", "llama"),
		want: config.Route{Name: "vhretry", Match: config.Match{PathPrefix: "/"}, Cluster: "llama", Spec: route.Spec{Retry: route.Retry{Attempts: 2}}},
	}, {
		name: "sluice.policy on the route",
		r: func() *routev3.Route {
			r := routeTo("pol", "/v1/", "llama")
			r.TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{
				"match":    map[string]any{"model": "llama-3*"},
				"model":    "llama-3-70b",
				"timeouts": map[string]any{"ttft": "5s"},
				"policies": []any{
					map[string]any{"type": "guard", "params": map[string]any{"max_depth": 5}},
					map[string]any{"type": "ratelimit", "name": "rl", "params": map[string]any{"tokens_per_minute": 200000, "per": "tenant"}},
				},
				"fallback":          []any{map[string]any{"cluster": "small", "model": "qwen", "on": []any{"5xx", "429"}}},
				"sticky":            []any{"header:X-Session-ID"},
				"gray_flag_header":  "x-canary",
				"retry":             map[string]any{"budget": 0.5, "honor_retry_after": false},
				"breaker":           map[string]any{"min_requests": 10, "failure_ratio": 0.25, "open_for": "10s"},
				"resume":            true,
				"contract_mismatch": []any{map[string]any{"status": 404, "code": "model_not_found"}},
			})}
			return r
		}(),
		want: config.Route{Name: "pol", Match: config.Match{PathPrefix: "/v1/", Model: "llama-3*"}, Cluster: "llama", Model: "llama-3-70b",
			Timeouts: config.Timeouts{TTFT: config.Duration(5 * time.Second)},
			Policies: []policy.Spec{
				{Type: "guard", Params: map[string]any{"max_depth": 5}},
				{Type: "ratelimit", Name: "rl", Params: map[string]any{"tokens_per_minute": 200000, "per": "tenant"}},
			},
			Spec: route.Spec{
				Fallback: []route.Step{{Cluster: "small", Model: "qwen", On: []string{"5xx", "429"}}},
				Sticky:   []string{"header:X-Session-ID"}, GrayFlagHeader: "x-canary",
				Retry:   route.Retry{Budget: ptr(0.5), HonorRetryAfter: ptr(false)},
				Breaker: route.Breaker{MinRequests: 10, FailureRatio: 0.25, OpenFor: config.Duration(10 * time.Second)},
				Resume:  true, ContractMismatch: []route.Contract{{Status: 404, Code: "model_not_found"}},
			}},
	}, {
		name: "sluice.policy on the virtual host applies to routes without one",
		vh: func(vh *routev3.VirtualHost) {
			vh.TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"model": "from-vhost"})}
		},
		r:    routeTo("vhpol", "/", "llama"),
		want: config.Route{Name: "vhpol", Match: config.Match{PathPrefix: "/"}, Cluster: "llama", Model: "from-vhost"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := routeConfig(tc.r)
			if tc.vh != nil {
				tc.vh(rc.VirtualHosts[0])
			}
			c := translateOK(t, Resources{Clusters: clusters, Routes: map[string]*routev3.RouteConfiguration{"sluice": rc}})
			want := tc.want
			if want.Mirror != nil {
				cc := config.Config{Dynamic: true, Routes: []config.Route{want}}
				_ = cc.Finish()
				want = cc.Routes[0]
			}
			if len(c.Routes) != 1 || !reflect.DeepEqual(c.Routes[0], want) {
				t.Errorf("routes:\n got %s\nwant %s", jsonOf(c.Routes), jsonOf(want))
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// ---- ECDS ----

func TestTranslateGlobalPolicy(t *testing.T) {
	t.Setenv("XDS_TEST_KEYS", "k1,k2")
	ext := &corev3.TypedExtensionConfig{Name: PolicyName, TypedConfig: typedStruct(t, map[string]any{
		"max_body_bytes": "8MiB", "drain_timeout": "5s",
		"timeouts": map[string]any{"ttft": "20s"},
		"chaos":    map[string]any{"faults": []any{map[string]any{"kind": "abort", "status": 503, "percent": 1}}},
		"tenants":  []any{map[string]any{"name": "team-a", "keys_env": "XDS_TEST_KEYS", "priority": 2}},
		"shadow":   map[string]any{"window": 50, "verdict": map[string]any{"min_samples": 20}},
	})}
	c := translateOK(t, Resources{Policy: ext})
	if c.MaxBodyBytes != 8<<20 || c.DrainTimeout.D() != 5*time.Second || c.Timeouts.TTFT.D() != 20*time.Second ||
		c.Timeouts.Total.D() != config.DefaultTotalTimeout {
		t.Errorf("global keys: %s", jsonOf(c))
	}
	if c.Chaos.Enabled || len(c.Chaos.Faults) != 1 || c.Chaos.Faults[0].Kind != fault.KindAbort {
		t.Errorf("chaos: %s", jsonOf(c.Chaos))
	}
	if len(c.Tenants) != 1 || c.Tenants[0].Priority != 2 || c.Shadow.Window != 50 || c.Shadow.Verdict.MinSamples != 20 {
		t.Errorf("tenants/shadow: %s %s", jsonOf(c.Tenants), jsonOf(c.Shadow))
	}

	// Absent: defaults, the same as the initial config's.
	c = translateOK(t, Resources{})
	ini, err := InitialConfig(testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if c.LoadSignals != ini.LoadSignals || c.Timeouts != ini.Timeouts || c.MaxBodyBytes != ini.MaxBodyBytes || c.Chaos.Enabled {
		t.Errorf("defaults differ from the initial config's:\n%s\n%s", jsonOf(c), jsonOf(ini))
	}
	if len(c.Routes) != 0 || len(c.Clusters) != 0 {
		t.Errorf("empty resources gave routes or clusters")
	}
}

// ---- problems ----

func TestTranslateProblems(t *testing.T) {
	unknownField := routeTo("chat", "/", "llama")
	unknownField.TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"polices": []any{}})}

	rewrite := routeTo("rewrite", "/", "llama")
	rewrite.GetRoute().PrefixRewrite = "/v2/"

	regex := routeTo("regex", "/", "llama")
	//lint:ignore SA1019 a deprecated matcher Sluice does not support
	regex.Match.Headers = []*routev3.HeaderMatcher{{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_PrefixMatch{PrefixMatch: "a"}}}

	badEndpoint := staticCluster("pipe", &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/tmp/sock"}}},
	}}})
	badMeta := staticCluster("meta", lbEndpoint("127.0.0.1", 1))
	badMeta.Metadata = sluiceMD(t, map[string]any{"timeouts": map[string]any{"connect": "1s"}})
	invalid := &clusterv3.Cluster{Name: ""} // fails ValidateAll
	badGlobal := &corev3.TypedExtensionConfig{Name: PolicyName, TypedConfig: typedStruct(t, map[string]any{"max_body_bytes": 10})}

	res := Resources{
		Clusters: map[string]*clusterv3.Cluster{
			"llama": staticCluster("llama", lbEndpoint("127.0.0.1", 8000)),
			"pipe":  badEndpoint, "meta": badMeta, "invalid": invalid, "nil": nil,
		},
		Routes: map[string]*routev3.RouteConfiguration{"sluice": routeConfig(unknownField, rewrite, regex)},
		Policy: badGlobal,
	}
	_, err := Translate(res, testOpts)
	var ve *config.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Translate = %v, want a *config.ValidationError", err)
	}
	want := []string{
		`extension_config "sluice.policy": max_body_bytes: 10 is too small`,
		`cluster "invalid": invalid Cluster.Name`,
		`cluster "nil": empty resource`,
		`cluster "pipe": endpoints[0].lb_endpoints[0]: endpoint.address: only socket_address is supported`,
		`cluster "meta": metadata.filter_metadata.sluice: field connect not found`,
		`route "chat": typed_per_filter_config["sluice.policy"]: field polices not found`,
		`route "rewrite": route: prefix_rewrite: not supported by Sluice`,
		`route "regex": match.headers[0] (x-a): only exact and present matches are supported`,
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("missing problem %q in:\n%s", w, msg)
		}
	}
}

func TestTranslateUnknownTypedStructFields(t *testing.T) {
	tests := []struct {
		name  string
		where func(res *Resources)
		want  string
	}{
		{"route", func(res *Resources) {
			res.Routes["sluice"].VirtualHosts[0].Routes[0].TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"nope": 1})}
		}, `field nope not found`},
		{"route field Envoy has (timeouts.total)", func(res *Resources) {
			res.Routes["sluice"].VirtualHosts[0].Routes[0].TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"timeouts": map[string]any{"total": "1s"}})}
		}, `field total not found`},
		{"nested policy key", func(res *Resources) {
			res.Routes["sluice"].VirtualHosts[0].Routes[0].TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"breaker": map[string]any{"windw": "1s"}})}
		}, `field windw not found`},
		{"virtual host", func(res *Resources) {
			res.Routes["sluice"].VirtualHosts[0].TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"nope": 1})}
		}, `field nope not found`},
		{"global", func(res *Resources) {
			res.Policy = &corev3.TypedExtensionConfig{Name: PolicyName, TypedConfig: typedStruct(t, map[string]any{"listen": ":1"})}
		}, `field listen not found`},
		{"endpoint metadata", func(res *Resources) {
			res.Clusters["llama"].LoadAssignment.Endpoints[0].LbEndpoints[0].Metadata = sluiceMD(t, map[string]any{"metric": "x"})
		}, `field metric not found`},
		{"not a TypedStruct", func(res *Resources) {
			a, _ := anypb.New(wrapperspb.String("x"))
			res.Routes["sluice"].VirtualHosts[0].Routes[0].TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: a}
		}, `want a xds.type.v3.TypedStruct`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := Resources{
				Clusters: map[string]*clusterv3.Cluster{"llama": staticCluster("llama", lbEndpoint("127.0.0.1", 8000))},
				Routes:   map[string]*routev3.RouteConfiguration{"sluice": routeConfig(routeTo("chat", "/", "llama"))},
			}
			tc.where(&res)
			_, err := Translate(res, testOpts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Translate = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestTranslatePendingClusters(t *testing.T) {
	r := routeTo("chat", "/", "later")
	r.GetRoute().RequestMirrorPolicies = []*routev3.RouteAction_RequestMirrorPolicy{{Cluster: "sandbox"}}
	r.TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"fallback": []any{map[string]any{"cluster": "fb"}}})}
	c := translateOK(t, Resources{Routes: map[string]*routev3.RouteConfiguration{"sluice": routeConfig(r)}})
	var names []string
	for _, cl := range c.Clusters {
		if !cl.Pending || len(cl.Endpoints) != 0 {
			t.Errorf("cluster %q not pending: %s", cl.Name, jsonOf(cl))
		}
		names = append(names, cl.Name)
	}
	if want := []string{"fb", "later", "sandbox"}; !reflect.DeepEqual(names, want) {
		t.Errorf("pending clusters %v, want %v", names, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestTranslateCircuitBreakers(t *testing.T) {
	capped := func(name string, maxReq, pending uint32) *clusterv3.Cluster {
		cl := staticCluster(name, lbEndpoint("127.0.0.1", 8000))
		th := &clusterv3.CircuitBreakers_Thresholds{MaxRequests: u32p(maxReq)}
		if pending > 0 {
			th.MaxPendingRequests = u32p(pending)
		}
		cl.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{
			th, {Priority: corev3.RoutingPriority_HIGH, MaxRequests: u32p(1)},
		}}
		return cl
	}
	split := routeTo("split", "/s", "")
	split.GetRoute().ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: []*routev3.WeightedCluster_ClusterWeight{
		{Name: "a", Weight: u32p(1)}, {Name: "b", Weight: u32p(1)},
	}}}
	own := routeTo("own", "/o", "a")
	own.TypedPerFilterConfig = map[string]*anypb.Any{PolicyName: typedStruct(t, map[string]any{"policies": []any{map[string]any{"type": "concurrency"}}})}
	res := Resources{
		Clusters: map[string]*clusterv3.Cluster{"a": capped("a", 10, 20), "b": capped("b", 6, 0), "free": staticCluster("free", lbEndpoint("127.0.0.1", 1))},
		Routes: map[string]*routev3.RouteConfiguration{"sluice": routeConfig(
			routeTo("one", "/1", "a"), split, routeTo("free", "/f", "free"), own,
		)},
	}
	c := translateOK(t, res)
	want := map[string][]policy.Spec{
		"one":   {{Type: "concurrency", Name: CircuitBreakerPolicyName, Params: map[string]any{"adaptive": false, "max_limit": 10, "min_limit": 10, "max_queue": 20}}},
		"split": {{Type: "concurrency", Name: CircuitBreakerPolicyName, Params: map[string]any{"adaptive": false, "max_limit": 16, "min_limit": 16, "max_queue": 20}}},
		"free":  nil,
		"own":   {{Type: "concurrency"}},
	}
	for _, r := range c.Routes {
		if !reflect.DeepEqual(r.Policies, want[r.Name]) {
			t.Errorf("route %s policies %s, want %s", r.Name, jsonOf(r.Policies), jsonOf(want[r.Name]))
		}
	}
}

func TestVersionDeterministic(t *testing.T) {
	mk := func(port uint32) Resources {
		return Resources{
			Clusters: map[string]*clusterv3.Cluster{"a": staticCluster("a", lbEndpoint("127.0.0.1", port)), "b": staticCluster("b", lbEndpoint("127.0.0.1", 2))},
			Routes:   map[string]*routev3.RouteConfiguration{"sluice": routeConfig(routeTo("r", "/", "a"))},
		}
	}
	v1, v2, v3 := Version(mk(1), "sluice"), Version(mk(1), "sluice"), Version(mk(3), "sluice")
	if v1 != v2 || v1 == v3 || len(v1) != 12 {
		t.Errorf("versions %q %q %q", v1, v2, v3)
	}
	if Version(mk(1), "other") == v1 {
		t.Errorf("version ignores the route config name")
	}
}

func TestTranslateNilSafety(t *testing.T) {
	res := Resources{
		Clusters:  map[string]*clusterv3.Cluster{"x": {}},
		Endpoints: map[string]*endpointv3.ClusterLoadAssignment{"x": nil},
		Routes:    map[string]*routev3.RouteConfiguration{"sluice": {Name: "sluice", VirtualHosts: []*routev3.VirtualHost{{Name: "v", Domains: []string{"*"}, Routes: []*routev3.Route{{}}}}}},
		Policy:    &corev3.TypedExtensionConfig{},
	}
	if _, err := Translate(res, testOpts); err == nil {
		t.Fatal("Translate accepted empty resources")
	}
}

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A replica starts from InitialConfig (no routes: 404 no_route, not ready), and a route to a
// cluster not received yet answers 503 no_endpoint until the cluster arrives.
func TestProxyServesInitialAndPendingConfigs(t *testing.T) {
	ini, err := InitialConfig(testOpts)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Config: ini, AwaitConfig: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("proxy.New(initial config): %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	get := func(base, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+base+path, strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	ready := func() int {
		resp, err := http.Get("http://" + srv.AdminAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code, body := get(srv.Addr(), "/v1/chat/completions"); code != http.StatusNotFound || !strings.Contains(body, "no_route") {
		t.Errorf("before any config: %d %s, want 404 no_route", code, body)
	}
	if code := ready(); code == http.StatusOK {
		t.Errorf("/readyz = 200 before the first config")
	}

	c := translateOK(t, Resources{Routes: map[string]*routev3.RouteConfiguration{"sluice": routeConfig(routeTo("chat", "/v1/", "later"))}})
	if err := srv.Apply(c); err != nil {
		t.Fatalf("Apply(pending): %v", err)
	}
	if code, body := get(srv.Addr(), "/v1/chat/completions"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no_endpoint") {
		t.Errorf("pending cluster: %d %s, want 503 no_endpoint", code, body)
	}
	if code := ready(); code != http.StatusOK {
		t.Errorf("/readyz = %d after the first config", code)
	}
}

// TestTranslateReplicaOwnSettings: what needs a restart is the replica's own (bootstrap and
// flags); a control plane sending it would be NACKed by every replica forever, so Translate
// says where it belongs.
func TestTranslateReplicaOwnSettings(t *testing.T) {
	ext := &corev3.TypedExtensionConfig{Name: PolicyName, TypedConfig: typedStruct(t, map[string]any{
		"load_signals": map[string]any{"names": "tgi"},
		"chaos":        map[string]any{"enabled": true},
		"shadow":       map[string]any{"store": "/var/lib/sluice/shadow.db", "instance": "gw-1"},
	})}
	_, err := Translate(Resources{Policy: ext}, TranslateOptions{})
	for _, want := range []string{"load_signals: a replica's own setting", "chaos.enabled: fault injection is turned on at a replica's start", "shadow.store: a replica's own file",
		"shadow.instance: a replica's own name"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	c, err := Translate(Resources{}, TranslateOptions{LoadSignals: config.LoadSignals{Names: "tgi"}, Chaos: true, ShadowStore: "s.db", ShadowInstance: "edge-7"})
	if err != nil {
		t.Fatal(err)
	}
	if c.LoadSignals.Names != "tgi" || !c.Chaos.Enabled || c.Shadow.Store != "s.db" || c.Shadow.Instance != "edge-7" {
		t.Errorf("the options' own settings were not kept: %+v %+v %q %q", c.LoadSignals, c.Chaos, c.Shadow.Store, c.Shadow.Instance)
	}
	if c, err := InitialConfig(TranslateOptions{ShadowInstance: "edge-7"}); err != nil || c.Shadow.Instance != "edge-7" {
		t.Errorf("initial config: instance %q, %v", c.Shadow.Instance, err)
	}
}

// TestTranslateEnvoyZeroes: Envoy's explicit zeroes mean "off": a 0s route timeout or
// idle_timeout disables it, a mirror runtime_fraction of 0 mirrors nothing.
func TestTranslateEnvoyZeroes(t *testing.T) {
	llama := staticCluster("llama", lbEndpoint("10.0.0.1", 8000))
	shadowCl := staticCluster("shadow", lbEndpoint("10.0.0.2", 8000))
	r := routeTo("chat", "/", "llama")
	ra := r.GetRoute()
	ra.Timeout, ra.IdleTimeout = sec(0), sec(0)
	ra.RequestMirrorPolicies = []*routev3.RouteAction_RequestMirrorPolicy{{Cluster: "shadow",
		RuntimeFraction: &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{Numerator: 0}}}}
	c := translateOK(t, Resources{Clusters: map[string]*clusterv3.Cluster{"llama": llama, "shadow": shadowCl},
		Routes: map[string]*routev3.RouteConfiguration{"sluice": routeConfig(r)}})
	rt := c.Routes[0]
	if rt.Timeouts.Total.D() != NoTimeout || rt.Timeouts.Idle.D() != NoTimeout || rt.Mirror != nil {
		t.Errorf("timeouts %+v, mirror %+v", rt.Timeouts, rt.Mirror)
	}
}

// TestTranslateKeepsAdmin: the replica's own admin settings (listen, token, scrape token) are
// in the initial config and in every translated one; the control plane cannot move them.
func TestTranslateKeepsAdmin(t *testing.T) {
	t.Setenv("XDS_TEST_SCRAPE_TOKEN", "s")
	opts := testOpts
	opts.AdminMetricsTokenEnv = "XDS_TEST_SCRAPE_TOKEN"
	ini, err := InitialConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Translate(Resources{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]config.Admin{"initial": ini.Admin, "translated": c.Admin} {
		if got.MetricsTokenEnv != "XDS_TEST_SCRAPE_TOKEN" || got.Listen != opts.AdminListen {
			t.Errorf("%s config's admin = %+v", name, got)
		}
	}
	// The variable must be set, as for a file config.
	t.Setenv("XDS_TEST_SCRAPE_TOKEN", "")
	if _, err := InitialConfig(opts); err == nil || !strings.Contains(err.Error(), "admin.metrics_token_env") {
		t.Errorf("InitialConfig with the scrape token unset: %v", err)
	}
}
