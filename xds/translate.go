package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// Source is config.Config.Source of a config that came from a control plane.
const Source = "xds"

// CircuitBreakerPolicyName names the concurrency policy Translate adds to a route whose
// clusters have circuit_breakers max_requests (see Translate).
const CircuitBreakerPolicyName = "circuit_breakers"

// TranslateOptions are the replica's own settings, which the control plane does not send.
type TranslateOptions struct {
	// Listen is config.Config.Listen (default config.DefaultListen).
	Listen string
	// TLS is the listener's certificate and key (config.Config.TLS).
	TLS config.ListenerTLS
	// AdminListen, AdminTokenEnv and AdminMetricsTokenEnv are config.Config.Admin's.
	AdminListen          string
	AdminTokenEnv        string
	AdminMetricsTokenEnv string
	// RouteConfig names the RouteConfiguration (RDS) whose routes the gateway serves. Empty:
	// the only one received (a problem when there are several).
	RouteConfig string
	// The replica's own settings, which need a restart to change and so are not the control
	// plane's: load signals, whether fault injection is on (`--chaos`), the shadow store file
	// (or the URL of the store the fleet shares) and the replica's name in it (shadow.instance:
	// `sluice serve --xds` gives its node id).
	LoadSignals    config.LoadSignals
	Chaos          bool
	ShadowStore    string
	ShadowInstance string
}

// InitialConfig is the config a replica starts with before the first push: the options' listen
// addresses, defaults, no clusters and no routes (every request gets 404 no_route). Start
// the proxy with proxy.Options.AwaitConfig so /readyz stays false until the first Apply.
func InitialConfig(opts TranslateOptions) (*config.Config, error) {
	c := &config.Config{
		Listen: opts.Listen, TLS: opts.TLS,
		Admin:   config.Admin{Listen: opts.AdminListen, TokenEnv: opts.AdminTokenEnv, MetricsTokenEnv: opts.AdminMetricsTokenEnv},
		Dynamic: true, Source: Source, Version: "bootstrap",
	}
	local(c, opts)
	if err := c.Finish(); err != nil {
		return nil, fmt.Errorf("xds initial config: %w", err)
	}
	return c, nil
}

// local sets the replica's own settings on c.
func local(c *config.Config, opts TranslateOptions) {
	c.LoadSignals = opts.LoadSignals
	c.Chaos.Enabled = opts.Chaos
	c.Shadow.Store = opts.ShadowStore
	c.Shadow.Instance = opts.ShadowInstance
}

// Translate turns a set of xDS resources into a finished config (defaults applied and
// validated) with Envoy's semantics; see docs/xds.md for the mapping. Every problem of every
// resource is reported at once, in a *config.ValidationError whose problems name their
// resource (`cluster "llama": load_assignment...`). A route naming a cluster that has not
// been received gets a Pending cluster (503 until it arrives), not an error.
//
// Policy params (the policies' own keys) are checked when the proxy builds them
// (proxy.Server.Apply), not here.
func Translate(res Resources, opts TranslateOptions) (*config.Config, error) {
	t := &translator{clusterCaps: map[string]clusterCap{}}
	c := &config.Config{
		Listen: opts.Listen, TLS: opts.TLS,
		Admin:   config.Admin{Listen: opts.AdminListen, TokenEnv: opts.AdminTokenEnv, MetricsTokenEnv: opts.AdminMetricsTokenEnv},
		Dynamic: true, Source: Source,
	}
	t.global(c, res.Policy)
	local(c, opts)
	for _, name := range namesOf(res.Clusters) {
		if cl, ok := t.cluster(name, res.Clusters[name], res.Endpoints); ok {
			c.Clusters = append(c.Clusters, cl)
		}
	}
	for _, name := range namesOf(res.Endpoints) {
		if cla := res.Endpoints[name]; cla == nil {
			t.add(fmt.Sprintf("cluster_load_assignment %q", name), "empty resource")
		} else if err := cla.ValidateAll(); err != nil {
			t.addErr(fmt.Sprintf("cluster_load_assignment %q", name), err)
		}
	}
	if rc := t.pickRouteConfig(res.Routes, opts.RouteConfig); rc != nil {
		c.Routes = t.routeConfig(rc)
	}
	t.addPending(c)
	t.addCircuitBreakers(c)
	c.Version = Version(res, opts.RouteConfig)

	err := c.Finish()
	var ve *config.ValidationError
	if err != nil {
		if !errors.As(err, &ve) {
			return nil, fmt.Errorf("xds: %w", err)
		}
		t.problems = append(t.problems, renameProblems(c, ve.Problems)...)
	}
	if len(t.problems) > 0 {
		return nil, &config.ValidationError{Problems: t.problems}
	}
	return c, nil
}

// Version is a short hash of the resources' content (deterministic proto encoding, resources
// in name order): the same resources give the same version on every replica.
func Version(res Resources, routeConfig string) string {
	h := sha256.New()
	mo := proto.MarshalOptions{Deterministic: true}
	write := func(kind, name string, m proto.Message) {
		fmt.Fprintf(h, "%s\x00%s\x00", kind, name)
		if m != nil {
			b, err := mo.Marshal(m)
			if err != nil {
				fmt.Fprintf(h, "error %v", err) // still deterministic
			}
			fmt.Fprintf(h, "%d\x00", len(b))
			h.Write(b)
		}
	}
	fmt.Fprintf(h, "route_config\x00%s\x00", routeConfig)
	for _, n := range namesOf(res.Clusters) {
		write("cluster", n, res.Clusters[n])
	}
	for _, n := range namesOf(res.Endpoints) {
		write("endpoints", n, res.Endpoints[n])
	}
	for _, n := range namesOf(res.Routes) {
		write("routes", n, res.Routes[n])
	}
	if res.Policy != nil {
		write("policy", PolicyName, res.Policy)
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

type clusterCap struct {
	maxRequests int // 0: none
	maxPending  int // -1: not set
}

type translator struct {
	problems    []string
	clusterCaps map[string]clusterCap
}

func (t *translator) add(at, format string, args ...any) {
	t.problems = append(t.problems, at+": "+fmt.Sprintf(format, args...))
}

// addErr adds a ValidateAll error, one problem per violation.
func (t *translator) addErr(at string, err error) {
	var multi interface{ AllErrors() []error }
	if errors.As(err, &multi) {
		for _, e := range multi.AllErrors() {
			t.add(at, "%v", e)
		}
		return
	}
	t.add(at, "%v", err)
}

// unsupported adds a problem for every field set in m that is not in handled.
func (t *translator) unsupported(at string, m proto.Message, handled ...string) {
	if m == nil || !m.ProtoReflect().IsValid() {
		return
	}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !slices.Contains(handled, string(fd.Name())) {
			t.add(at, "%s: not supported by Sluice", fd.Name())
		}
		return true
	})
}

func (t *translator) global(c *config.Config, ext *corev3.TypedExtensionConfig) {
	if ext == nil {
		return
	}
	const at = "extension_config \"" + PolicyName + "\""
	if err := ext.ValidateAll(); err != nil {
		t.addErr(at, err)
		return
	}
	if ext.GetName() != PolicyName {
		t.add(at, "name: %q is not %q", ext.GetName(), PolicyName)
	}
	var g GlobalPolicy
	if err := decodeTypedStruct(ext.GetTypedConfig(), &g); err != nil {
		t.add(at, "typed_config: %v", err)
		return
	}
	// What needs a restart is the replica's own (its bootstrap and flags), not the control
	// plane's: every replica would otherwise NACK it forever.
	if g.LoadSignals != (config.LoadSignals{}) {
		t.add(at, "load_signals: a replica's own setting (it needs a restart): give it in the bootstrap file")
	}
	if g.Chaos.Enabled {
		t.add(at, "chaos.enabled: fault injection is turned on at a replica's start (sluice serve --chaos); the control plane may send chaos.faults")
	}
	if g.Shadow.Store != "" {
		t.add(at, "shadow.store: a replica's own file: give it in the bootstrap file")
	}
	if g.Shadow.Instance != "" {
		t.add(at, "shadow.instance: a replica's own name (its node id): not the control plane's")
	}
	c.MaxBodyBytes, c.MaxEventBytes, c.DrainTimeout, c.DrainDelay = g.MaxBodyBytes, g.MaxEventBytes, g.DrainTimeout, g.DrainDelay
	c.Timeouts, c.Chaos = g.Timeouts, g.Chaos
	c.TrustedProxies, c.Limits, c.CORS = g.TrustedProxies, g.Limits, g.CORS
	c.Tenants, c.Shadow = g.Tenants, g.Shadow
}

// Cluster fields Translate reads, and those it accepts without effect (they tune Envoy's own
// machinery: DNS, stats, buffers, connection pools).
var clusterFields = []string{
	"name", "type", "eds_cluster_config", "connect_timeout", "load_assignment", "health_checks",
	"outlier_detection", "circuit_breakers", "transport_socket", "metadata", "lb_policy",
	"alt_stat_name", "dns_lookup_family", "dns_refresh_rate", "dns_failure_refresh_rate",
	"respect_dns_ttl", "use_tcp_for_dns_lookups", "per_connection_buffer_limit_bytes",
	"common_lb_config", "typed_extension_protocol_options", "upstream_connection_options",
	"track_cluster_stats", "close_connections_on_host_health_failure",
	"ignore_health_on_host_removal", "least_request_lb_config", "round_robin_lb_config",
	"wait_for_warm_on_init",
}

func (t *translator) cluster(name string, in *clusterv3.Cluster, eds map[string]*endpointv3.ClusterLoadAssignment) (config.Cluster, bool) {
	at := fmt.Sprintf("cluster %q", name)
	if in == nil {
		t.add(at, "empty resource")
		return config.Cluster{}, false
	}
	if err := in.ValidateAll(); err != nil {
		t.addErr(at, err)
		return config.Cluster{}, false
	}
	if in.GetName() != name {
		t.add(at, "name: %q differs from the resource name", in.GetName())
	}
	before := len(t.problems)
	t.unsupported(at, in, clusterFields...)
	out := config.Cluster{Name: name}

	var cp ClusterPolicy
	if err := decodeMetadata(in.GetMetadata(), &cp); err != nil {
		t.add(at, "metadata.filter_metadata.%s: %v", MetadataKey, err)
	}
	out.Timeouts = config.Timeouts{Connect: dur(in.GetConnectTimeout()), TTFT: cp.Timeouts.TTFT, Idle: cp.Timeouts.Idle, Total: cp.Timeouts.Total}
	out.Picking, out.MaxIdleConnsPerHost, out.APIKeyEnv = cp.Picking, cp.MaxIdleConnsPerHost, cp.APIKeyEnv

	switch in.GetLbPolicy() {
	case clusterv3.Cluster_ROUND_ROBIN, clusterv3.Cluster_LEAST_REQUEST, clusterv3.Cluster_RANDOM:
		// Sluice picks by in-flight requests (and load signals) whatever Envoy's policy says.
	default:
		t.add(at, "lb_policy: %s is not supported (use ROUND_ROBIN or LEAST_REQUEST)", in.GetLbPolicy())
	}

	scheme := "http"
	if ts := in.GetTransportSocket(); ts != nil {
		scheme = "https"
		out.TLS = t.upstreamTLS(at+": transport_socket", ts)
	}

	var cla *endpointv3.ClusterLoadAssignment
	switch in.GetType() {
	case clusterv3.Cluster_EDS:
		if in.GetLoadAssignment() != nil {
			t.add(at, "load_assignment: an EDS cluster takes its endpoints from EDS")
		}
		svc := in.GetEdsClusterConfig().GetServiceName()
		if svc == "" {
			svc = name
		}
		cla = eds[svc]
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
		if in.GetEdsClusterConfig() != nil {
			t.add(at, "eds_cluster_config: only for type EDS")
		}
		cla = in.GetLoadAssignment()
	default:
		if in.GetClusterType() == nil {
			t.add(at, "type: %s is not supported (use STATIC, STRICT_DNS, LOGICAL_DNS or EDS)", in.GetType())
		}
	}
	out.Endpoints = t.endpoints(at, scheme, cla)
	out.Pending = len(out.Endpoints) == 0

	if hcs := in.GetHealthChecks(); len(hcs) == 0 {
		out.HealthCheck.Disabled = true // Envoy: no health_checks, no active checking
	} else {
		if len(hcs) > 1 {
			t.add(at, "health_checks: Sluice runs one health check per cluster, got %d", len(hcs))
		}
		hc := hcs[0]
		hat := at + ": health_checks[0]"
		if hc.GetHttpHealthCheck() == nil {
			t.add(hat, "only http_health_check is supported")
		}
		path := hc.GetHttpHealthCheck().GetPath()
		if cp.HealthPathAuto && path == upstream.AutoHealthPaths[0] {
			path = "" // Sluice's default: /health, else /v1/models
		}
		out.HealthCheck = config.HealthCheck{
			Path:     path,
			Interval: dur(hc.GetInterval()), Timeout: dur(hc.GetTimeout()),
			UnhealthyThreshold: u32(hc.GetUnhealthyThreshold()), HealthyThreshold: u32(hc.GetHealthyThreshold()),
		}
	}

	if od := in.GetOutlierDetection(); od == nil {
		out.Outlier.Disabled = true // Envoy: no outlier_detection, no ejection
	} else {
		// Envoy's defaults for the fields left unset.
		out.Outlier = config.Outlier{
			ConsecutiveFailures: u32Or(od.GetConsecutive_5Xx(), 5),
			BaseEjection:        durOr(od.GetBaseEjectionTime(), 30*time.Second),
			MaxEjection:         durOr(od.GetMaxEjectionTime(), 300*time.Second),
			MaxEjectionPercent:  u32Or(od.GetMaxEjectionPercent(), 10),
		}
		if od.GetConsecutive_5Xx() != nil && od.GetConsecutive_5Xx().GetValue() == 0 {
			out.Outlier.Disabled = true
		}
	}

	capc := clusterCap{maxPending: -1}
	for _, th := range in.GetCircuitBreakers().GetThresholds() {
		if th.GetPriority() != corev3.RoutingPriority_DEFAULT {
			continue // Sluice has one priority
		}
		if v := th.GetMaxRequests(); v != nil {
			capc.maxRequests = int(min(v.GetValue(), math.MaxInt32))
			if capc.maxRequests == 0 {
				t.add(at, "circuit_breakers.thresholds.max_requests: 0 would reject every request")
			}
		}
		if v := th.GetMaxPendingRequests(); v != nil {
			capc.maxPending = int(min(v.GetValue(), 1<<16))
		}
	}
	t.clusterCaps[name] = capc
	return out, len(t.problems) == before
}

func (t *translator) upstreamTLS(at string, ts *corev3.TransportSocket) config.UpstreamTLS {
	var out config.UpstreamTLS
	utc := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(utc); err != nil {
		t.add(at, "typed_config: want an envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, got %s", ts.GetTypedConfig().GetTypeUrl())
		return out
	}
	if err := utc.ValidateAll(); err != nil {
		t.addErr(at, err)
		return out
	}
	t.unsupported(at, utc, "sni", "common_tls_context")
	out.ServerName = utc.GetSni()
	ctc := utc.GetCommonTlsContext()
	t.unsupported(at+": common_tls_context", ctc, "validation_context", "alpn_protocols", "tls_params")
	if vc := ctc.GetValidationContext(); vc != nil {
		vat := at + ": common_tls_context.validation_context"
		t.unsupported(vat, vc, "trusted_ca", "trust_chain_verification")
		if ca := vc.GetTrustedCa(); ca != nil {
			if ca.GetFilename() == "" {
				t.add(vat, "trusted_ca: only filename is supported")
			}
			out.CAFile = ca.GetFilename()
		}
		out.InsecureSkipVerify = vc.GetTrustChainVerification() == tlsv3.CertificateValidationContext_ACCEPT_UNTRUSTED
	}
	return out
}

func (t *translator) endpoints(at, scheme string, cla *endpointv3.ClusterLoadAssignment) []config.Endpoint {
	if cla == nil {
		return nil
	}
	var out []config.Endpoint
	for i, lle := range cla.GetEndpoints() {
		lat := fmt.Sprintf("%s: endpoints[%d]", at, i)
		if lle.GetPriority() != 0 {
			t.add(lat, "priority: %d is not supported (Sluice has no failover priorities; use a fallback)", lle.GetPriority())
		}
		for j, lb := range lle.GetLbEndpoints() {
			eat := fmt.Sprintf("%s.lb_endpoints[%d]", lat, j)
			switch lb.GetHealthStatus() {
			case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_DRAINING, corev3.HealthStatus_TIMEOUT:
				continue // Envoy does not route to them
			}
			ep := lb.GetEndpoint()
			if ep == nil {
				t.add(eat, "endpoint: required (endpoint_name is not supported)")
				continue
			}
			sa := ep.GetAddress().GetSocketAddress()
			if sa == nil {
				t.add(eat, "endpoint.address: only socket_address is supported")
				continue
			}
			if sa.GetNamedPort() != "" || sa.GetResolverName() != "" || sa.GetProtocol() != corev3.SocketAddress_TCP {
				t.add(eat, "endpoint.address.socket_address: only TCP with port_value is supported")
				continue
			}
			var ev EndpointPolicy
			if err := decodeMetadata(lb.GetMetadata(), &ev); err != nil {
				t.add(eat, "metadata.filter_metadata.%s: %v", MetadataKey, err)
			}
			if ev.PathPrefix != "" && !strings.HasPrefix(ev.PathPrefix, "/") {
				t.add(eat, "metadata.filter_metadata.%s.path_prefix: %q must start with /", MetadataKey, ev.PathPrefix)
			}
			host := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
			if p := sa.GetPortValue(); (scheme == "http" && p == 80) || (scheme == "https" && p == 443) {
				host = sa.GetAddress() // the scheme's default port stays implicit
				if strings.Contains(host, ":") {
					host = "[" + host + "]"
				}
			}
			u := url.URL{Scheme: scheme, Host: host, Path: ev.PathPrefix}
			w := 0
			if v := lb.GetLoadBalancingWeight(); v != nil {
				w = int(min(v.GetValue(), math.MaxInt32))
			}
			out = append(out, config.Endpoint{URL: u.String(), Metrics: ev.Metrics, Weight: w})
		}
	}
	return out
}

func (t *translator) pickRouteConfig(rcs map[string]*routev3.RouteConfiguration, name string) *routev3.RouteConfiguration {
	if name == "" {
		switch len(rcs) {
		case 0:
			return nil
		case 1:
			for n := range rcs {
				name = n
			}
		default:
			t.add("route_configuration", "%d received (%s); name the one to serve", len(rcs), strings.Join(namesOf(rcs), ", "))
			return nil
		}
	}
	rc, ok := rcs[name]
	if !ok {
		return nil // not received yet: no routes, every request gets 404
	}
	at := fmt.Sprintf("route_configuration %q", name)
	if rc == nil {
		t.add(at, "empty resource")
		return nil
	}
	if err := rc.ValidateAll(); err != nil {
		t.addErr(at, err)
		return nil
	}
	t.unsupported(at, rc, "name", "virtual_hosts", "validate_clusters", "max_direct_response_body_size_bytes")
	return rc
}

func (t *translator) routeConfig(rc *routev3.RouteConfiguration) []config.Route {
	var out []config.Route
	for i, vh := range rc.GetVirtualHosts() {
		vat := fmt.Sprintf("route_configuration %q: virtual_host %q", rc.GetName(), vh.GetName())
		if vh.GetName() == "" {
			vat = fmt.Sprintf("route_configuration %q: virtual_hosts[%d]", rc.GetName(), i)
		}
		t.unsupported(vat, vh, "name", "domains", "routes", "typed_per_filter_config", "retry_policy",
			"metadata", "include_request_attempt_count", "include_attempt_count_in_response", "per_request_buffer_limit_bytes")
		vhPolicy := vh.GetTypedPerFilterConfig()[PolicyName]
		for k := range vh.GetTypedPerFilterConfig() {
			if k != PolicyName {
				t.add(vat, "typed_per_filter_config[%q]: only %q is supported", k, PolicyName)
			}
		}
		for j, r := range vh.GetRoutes() {
			rat := fmt.Sprintf("%s: route %q", vat, r.GetName())
			if r.GetName() == "" {
				rat = fmt.Sprintf("%s: routes[%d]", vat, j)
			}
			if cr, ok := t.route(rat, r, vh.GetRetryPolicy(), vhPolicy); ok {
				out = append(out, cr)
			}
		}
	}
	return out
}

var routeFields = []string{"name", "match", "route", "typed_per_filter_config", "metadata", "decorator", "tracing", "stat_prefix", "per_request_buffer_limit_bytes"}

var actionFields = []string{"cluster", "weighted_clusters", "request_mirror_policies", "retry_policy", "timeout", "idle_timeout", "cluster_not_found_response_code"}

// route translates one route; vhRetry and vhPolicy are its virtual host's retry policy and
// sluice.policy, which apply when the route has none of its own (Envoy's most specific wins).
func (t *translator) route(at string, r *routev3.Route, vhRetry *routev3.RetryPolicy, vhPolicy *anypb.Any) (config.Route, bool) {
	before := len(t.problems)
	t.unsupported(at, r, routeFields...)
	out := config.Route{Name: r.GetName()}

	var rp RoutePolicy
	pol := r.GetTypedPerFilterConfig()[PolicyName]
	if pol == nil {
		pol = vhPolicy
	}
	if err := decodeTypedStruct(pol, &rp); err != nil {
		t.add(at, "typed_per_filter_config[%q]: %v", PolicyName, err)
	}
	for k := range r.GetTypedPerFilterConfig() {
		if k != PolicyName {
			t.add(at, "typed_per_filter_config[%q]: only %q is supported", k, PolicyName)
		}
	}

	m := r.GetMatch()
	t.unsupported(at+": match", m, "prefix", "path", "headers", "case_sensitive")
	if cs := m.GetCaseSensitive(); cs != nil && !cs.GetValue() {
		t.add(at, "match.case_sensitive: false is not supported")
	}
	switch {
	case m.GetPrefix() != "":
		out.Match.PathPrefix = m.GetPrefix()
	case m.GetPath() != "":
		out.Match.PathPrefix = m.GetPath() // no exact-path match in Sluice: a prefix (docs/xds.md)
	}
	for k, h := range m.GetHeaders() {
		hat := fmt.Sprintf("%s: match.headers[%d] (%s)", at, k, h.GetName())
		t.unsupported(hat, h, "name", "exact_match", "string_match", "present_match", "treat_missing_header_as_empty",
			"safe_regex_match", "range_match", "prefix_match", "suffix_match", "contains_match") // the last ones: below
		var v string
		switch {
		case h.GetPresentMatch():
			v = "*"
		case exactMatch(h) != "":
			v = exactMatch(h)
		case h.GetStringMatch() != nil:
			sm := h.GetStringMatch()
			if sm.GetExact() == "" || sm.GetIgnoreCase() {
				t.add(hat, "string_match: only a case-sensitive exact match is supported")
				continue
			}
			v = sm.GetExact()
		default:
			t.add(hat, "only exact and present matches are supported")
			continue
		}
		if out.Match.Headers == nil {
			out.Match.Headers = map[string]string{}
		}
		out.Match.Headers[h.GetName()] = v
	}
	if rp.Match != nil {
		out.Match.Model = rp.Match.Model
	}

	act := r.GetRoute()
	if act == nil {
		t.add(at, "route: a route action is required (redirect, direct_response and others are not supported)")
		return out, false
	}
	t.unsupported(at+": route", act, actionFields...)
	if act.GetClusterNotFoundResponseCode() != routev3.RouteAction_SERVICE_UNAVAILABLE {
		t.add(at, "route.cluster_not_found_response_code: only SERVICE_UNAVAILABLE (503) is supported")
	}
	switch {
	case act.GetCluster() != "":
		out.Cluster = act.GetCluster()
		if rp.Cluster != "" {
			t.add(at, "typed_per_filter_config[%q].cluster: only with weighted_clusters", PolicyName)
		}
	case act.GetWeightedClusters() != nil:
		out.Cluster = rp.Cluster
		wc := act.GetWeightedClusters()
		t.unsupported(at+": route.weighted_clusters", wc, "clusters", "total_weight", "runtime_key_prefix")
		for k, cw := range wc.GetClusters() {
			cat := fmt.Sprintf("%s: route.weighted_clusters.clusters[%d]", at, k)
			t.unsupported(cat, cw, "name", "weight", "typed_per_filter_config")
			sp := route.Split{Cluster: cw.GetName(), Weight: int(min(cw.GetWeight().GetValue(), math.MaxInt32))}
			var spol SplitPolicy
			if err := decodeTypedStruct(cw.GetTypedPerFilterConfig()[PolicyName], &spol); err != nil {
				t.add(cat, "typed_per_filter_config[%q]: %v", PolicyName, err)
			}
			sp.Name, sp.GrayFlag, sp.Model = spol.Name, spol.GrayFlag, spol.Model
			out.Splits = append(out.Splits, sp)
		}
	}
	out.Model = rp.Model
	out.Timeouts = config.Timeouts{Connect: rp.Timeouts.Connect, TTFT: rp.Timeouts.TTFT, Idle: envoyTimeout(act.GetIdleTimeout()), Total: envoyTimeout(act.GetTimeout())}
	out.Policies = rp.Policies
	out.Sticky, out.GrayFlagHeader, out.Fallback = rp.Sticky, rp.GrayFlagHeader, rp.Fallback
	out.Breaker, out.Resume, out.ContractMismatch = rp.Breaker, rp.Resume, rp.ContractMismatch

	rpol := act.GetRetryPolicy()
	if rpol == nil {
		rpol = vhRetry
	}
	out.Retry = t.retry(at+": route.retry_policy", rpol)
	out.Retry.Budget, out.Retry.MinRetriesPerSecond = rp.Retry.Budget, rp.Retry.MinRetriesPerSecond
	out.Retry.HonorRetryAfter, out.Retry.MaxRetryAfter = rp.Retry.HonorRetryAfter, rp.Retry.MaxRetryAfter

	mirrors := act.GetRequestMirrorPolicies()
	if len(mirrors) > 1 {
		t.add(at, "route.request_mirror_policies: Sluice mirrors to one cluster, got %d", len(mirrors))
	}
	if len(mirrors) > 0 {
		mp := mirrors[0]
		mat := at + ": route.request_mirror_policies[0]"
		t.unsupported(mat, mp, "cluster", "runtime_fraction", "trace_sampled", "disable_shadow_host_suffix_append")
		mi := &config.Mirror{Cluster: mp.GetCluster(), Fraction: 1}
		if rf := mp.GetRuntimeFraction(); rf != nil {
			mi.Fraction = fraction(rf.GetDefaultValue())
		}
		if mi.Fraction == 0 {
			// Envoy's "mirror nothing" (a staged rollout's first step): no mirror, no error.
			mi = nil
		}
		if x := rp.Mirror; x != nil {
			mi.Model, mi.Baseline, mi.ReplicaFraction, mi.AbnormalFinish = x.Model, x.Baseline, x.ReplicaFraction, x.AbnormalFinish
			mi.MaxQueue, mi.MaxConcurrency, mi.CaptureTotal = x.MaxQueue, x.MaxConcurrency, x.CaptureTotal
			mi.CaptureBytes, mi.Timeout, mi.StripHeaders, mi.SetHeaders, mi.Progression = x.CaptureBytes, x.Timeout, x.StripHeaders, x.SetHeaders, x.Progression
		}
		if mi != nil {
			out.Mirror = mi
		}
	} else if rp.Mirror != nil {
		t.add(at, "typed_per_filter_config[%q].mirror: the route has no request_mirror_policies", PolicyName)
	}
	return out, len(t.problems) == before
}

// Envoy's retry_on conditions, and the Sluice failures each stands for ("": Sluice cannot
// tell it apart; accepted, no effect).
var retryOn = map[string]string{
	"5xx": policy.Cond5xx, "gateway-error": policy.Cond5xx, "reset": policy.CondConnect,
	"reset-before-request": policy.CondConnect, "connect-failure": policy.CondConnect,
	"refused-stream": policy.CondConnect, "retriable-status-codes": "status",
	"retriable-4xx": "", "retriable-headers": "", "envoy-ratelimited": "",
	"http3-post-connect-failure": "", "cancelled": "", "deadline-exceeded": "", "internal": "",
	"resource-exhausted": "", "unavailable": "",
}

// retry maps Envoy's retry policy: num_retries (default 1) + 1 attempts per candidate, when
// retry_on names a failure Sluice retries (connection failures, 5xx, 429 as a retriable
// status code); the gateway itself decides which failures are retryable (before the first
// byte, replayable body).
func (t *translator) retry(at string, rp *routev3.RetryPolicy) route.Retry {
	var out route.Retry
	if rp == nil {
		return out
	}
	t.unsupported(at, rp, "retry_on", "num_retries", "per_try_timeout", "retry_back_off",
		"retriable_status_codes", "retry_host_predicate", "host_selection_retry_max_attempts", "rate_limited_retry_back_off")
	retries := false
	for _, c := range strings.Split(rp.GetRetryOn(), ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		cond, known := retryOn[c]
		switch {
		case !known:
			t.add(at, "retry_on: unknown condition %q", c)
		case cond == "status":
			for _, s := range rp.GetRetriableStatusCodes() {
				if s == 429 || (s >= 500 && s <= 599) {
					retries = true
				}
			}
		case cond != "":
			retries = true
		}
	}
	n := 1
	if v := rp.GetNumRetries(); v != nil {
		n = int(min(v.GetValue(), math.MaxInt32))
	}
	if retries && n > 0 {
		out.Attempts = n + 1
	}
	out.PerTryTimeout = dur(rp.GetPerTryTimeout())
	if bo := rp.GetRetryBackOff(); bo != nil {
		out.BackoffBase = dur(bo.GetBaseInterval())
		out.BackoffMax = dur(bo.GetMaxInterval())
		if out.BackoffMax == 0 {
			out.BackoffMax = 10 * out.BackoffBase // Envoy's default
		}
	}
	return out
}

func (t *translator) addPending(c *config.Config) {
	have := map[string]bool{}
	for _, cl := range c.Clusters {
		have[cl.Name] = true
	}
	want := func(name string) {
		if name != "" && !have[name] {
			have[name] = true
			c.Clusters = append(c.Clusters, config.Cluster{Name: name, Pending: true})
		}
	}
	for _, r := range c.Routes {
		want(r.Cluster)
		for _, n := range r.Spec.Clusters() {
			want(n)
		}
		if r.Mirror != nil {
			want(r.Mirror.Cluster)
		}
	}
	sort.SliceStable(c.Clusters, func(i, j int) bool { return c.Clusters[i].Name < c.Clusters[j].Name })
}

// addCircuitBreakers maps circuit_breakers max_requests, a cap on a cluster's requests in
// flight, onto the one hard cap Sluice has: a route's concurrency policy. A route without its
// own concurrency policy whose clusters (cluster and splits) all have max_requests gets
// {type: concurrency, name: circuit_breakers, params: {adaptive: false, max_limit: sum}} with
// max_queue from max_pending_requests. The cap is per route (Envoy's is per cluster, across
// routes).
func (t *translator) addCircuitBreakers(c *config.Config) {
	for i := range c.Routes {
		r := &c.Routes[i]
		if slices.ContainsFunc(r.Policies, func(s policy.Spec) bool { return s.Type == "concurrency" }) {
			continue
		}
		names := []string{}
		if r.Cluster != "" {
			names = append(names, r.Cluster)
		}
		for _, sp := range r.Splits {
			if !slices.Contains(names, sp.Cluster) {
				names = append(names, sp.Cluster)
			}
		}
		total, queue, ok := 0, -1, len(names) > 0
		for _, n := range names {
			cc, known := t.clusterCaps[n]
			if !known || cc.maxRequests <= 0 {
				ok = false
				break
			}
			total += cc.maxRequests
			if cc.maxPending >= 0 {
				queue = max(queue, 0) + cc.maxPending
			}
		}
		if !ok {
			continue
		}
		params := map[string]any{"adaptive": false, "max_limit": total, "min_limit": total}
		if queue == 0 {
			params["max_queue"] = -1
		} else if queue > 0 {
			params["max_queue"] = queue
		}
		r.Policies = append(slices.Clone(r.Policies), policy.Spec{Type: "concurrency", Name: CircuitBreakerPolicyName, Params: params})
	}
}

var problemIndex = regexp.MustCompile(`^(routes|clusters)\[(\d+)\]\.?`)

// renameProblems turns Validate's config paths (`routes[2].cluster: ...`) into the names of
// the resources they came from (`route "chat": cluster: ...`).
func renameProblems(c *config.Config, ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p
		m := problemIndex.FindStringSubmatch(p)
		if m == nil {
			if !strings.HasPrefix(p, "listen") && !strings.HasPrefix(p, "admin") && !strings.HasPrefix(p, "tls") {
				out[i] = "extension_config \"" + PolicyName + "\": " + p
			}
			continue
		}
		k, _ := strconv.Atoi(m[2])
		rest := strings.TrimPrefix(p, m[0])
		if !strings.HasPrefix(rest, ":") {
			rest = " " + rest
		}
		switch {
		case m[1] == "routes" && k < len(c.Routes):
			out[i] = fmt.Sprintf("route %q:%s", c.Routes[k].Name, strings.TrimPrefix(rest, ":"))
		case m[1] == "clusters" && k < len(c.Clusters):
			out[i] = fmt.Sprintf("cluster %q:%s", c.Clusters[k].Name, strings.TrimPrefix(rest, ":"))
		}
	}
	return out
}

func fraction(fp *typev3.FractionalPercent) float64 {
	if fp == nil {
		return 0
	}
	d := 100.0
	switch fp.GetDenominator() {
	case typev3.FractionalPercent_TEN_THOUSAND:
		d = 1e4
	case typev3.FractionalPercent_MILLION:
		d = 1e6
	}
	return math.Min(float64(fp.GetNumerator())/d, 1)
}

func dur(d *durationpb.Duration) config.Duration {
	if d == nil {
		return 0
	}
	return config.Duration(d.AsDuration())
}

func durOr(d *durationpb.Duration, def time.Duration) config.Duration {
	if d == nil {
		return config.Duration(def)
	}
	return dur(d)
}

type u32Value interface{ GetValue() uint32 }

func u32(v u32Value) int {
	if v == nil {
		return 0
	}
	return int(min(v.GetValue(), math.MaxInt32))
}

func u32Or[V interface {
	comparable
	u32Value
}](v V, def int) int {
	var zero V
	if v == zero {
		return def
	}
	return u32(v)
}

// namesOf is a map's keys in order.
func namesOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// exactMatch is a header matcher's deprecated exact_match, which older control planes still
// send and Envoy still honours.
func exactMatch(h *routev3.HeaderMatcher) string {
	//lint:ignore SA1019 accepted for compatibility, as Envoy does
	return h.GetExactMatch()
}

// NoTimeout stands for Envoy's explicit 0s route timeout or idle_timeout ("disabled"): a
// day, since Sluice's zero means "inherit".
const NoTimeout = 24 * time.Hour

// envoyTimeout is a route time-out with Envoy's meaning: unset inherits, 0s disables.
func envoyTimeout(d *durationpb.Duration) config.Duration {
	if d != nil && d.AsDuration() == 0 {
		return config.Duration(NoTimeout)
	}
	return dur(d)
}
