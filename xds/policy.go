package xds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/route"
	"github.com/sluicegw/sluice/proxy/config"
)

// MetadataKey is the filter_metadata key of Sluice's cluster and endpoint metadata.
const MetadataKey = "sluice"

// Type URLs Sluice writes in the TypedStructs it sends (xds/server). Translate does not check
// a TypedStruct's type_url: the strict decoding of its value is the check.
const (
	RoutePolicyTypeURL  = "type.googleapis.com/sluice.v1.RoutePolicy"
	SplitPolicyTypeURL  = "type.googleapis.com/sluice.v1.SplitPolicy"
	GlobalPolicyTypeURL = "type.googleapis.com/sluice.v1.GlobalPolicy"
)

// The values below travel as google.protobuf.Struct (in a TypedStruct or in metadata) and are
// decoded strictly: an unknown key is an error. Their keys are the YAML keys of the file
// config, so a user writes the same thing in both; what Envoy has a field for travels in that
// field and is not accepted here.

// RoutePolicy is the value of typed_per_filter_config["sluice.policy"] on a route (or, for
// the routes that have none, on their virtual host): Sluice's per-route keys that Envoy has
// no field for.
type RoutePolicy struct {
	// Match holds the match keys Envoy has no matcher for (the request body's model).
	Match *MatchPolicy `yaml:"match,omitempty"`
	// Cluster is the route's own cluster when the route also has weighted_clusters.
	Cluster string `yaml:"cluster,omitempty"`
	// Model rewrites the request's model before it is sent upstream.
	Model string `yaml:"model,omitempty"`
	// Timeouts holds the time-outs Envoy's route has no field for (total is `timeout`, idle
	// is `idle_timeout`).
	Timeouts RouteTimeouts `yaml:"timeouts,omitempty"`
	// Policies run on the route's requests: {type, name, params}.
	Policies []policy.Spec `yaml:"policies,omitempty"`
	// Mirror holds the mirror keys beyond request_mirror_policies' cluster and fraction.
	Mirror *MirrorPolicy `yaml:"mirror,omitempty"`

	Sticky           []string         `yaml:"sticky,omitempty"`
	GrayFlagHeader   string           `yaml:"gray_flag_header,omitempty"`
	Fallback         []route.Step     `yaml:"fallback,omitempty"`
	Retry            RetryPolicy      `yaml:"retry,omitempty"`
	Breaker          route.Breaker    `yaml:"breaker,omitempty"`
	Resume           bool             `yaml:"resume,omitempty"`
	ContractMismatch []route.Contract `yaml:"contract_mismatch,omitempty"`
}

// MatchPolicy is the part of a route's match that Envoy cannot express.
type MatchPolicy struct {
	// Model matches the request's model exactly or as a glob ("llama-3*").
	Model string `yaml:"model,omitempty"`
}

// RouteTimeouts are a route's time-outs that Envoy's route has no field for.
type RouteTimeouts struct {
	Connect config.Duration `yaml:"connect,omitempty"`
	TTFT    config.Duration `yaml:"ttft,omitempty"`
}

// RetryPolicy holds the retry keys beyond Envoy's retry_policy (num_retries, per_try_timeout
// and retry_back_off travel there).
type RetryPolicy struct {
	Budget              *float64        `yaml:"budget,omitempty"`
	MinRetriesPerSecond *float64        `yaml:"min_retries_per_second,omitempty"`
	HonorRetryAfter     *bool           `yaml:"honor_retry_after,omitempty"`
	MaxRetryAfter       config.Duration `yaml:"max_retry_after,omitempty"`
}

// MirrorPolicy holds the mirror keys beyond request_mirror_policies[0] (cluster, and the
// fraction as runtime_fraction.default_value).
type MirrorPolicy struct {
	Model           string              `yaml:"model,omitempty"`
	Baseline        string              `yaml:"baseline,omitempty"`
	ReplicaFraction float64             `yaml:"replica_fraction,omitempty"`
	AbnormalFinish  []string            `yaml:"abnormal_finish,omitempty"`
	MaxQueue        int                 `yaml:"max_queue,omitempty"`
	MaxConcurrency  int                 `yaml:"max_concurrency,omitempty"`
	CaptureBytes    config.ByteSize     `yaml:"capture_bytes,omitempty"`
	CaptureTotal    config.ByteSize     `yaml:"capture_total,omitempty"`
	Timeout         config.Duration     `yaml:"timeout,omitempty"`
	StripHeaders    []string            `yaml:"strip_headers,omitempty"`
	SetHeaders      map[string]string   `yaml:"set_headers,omitempty"`
	Progression     *config.Progression `yaml:"progression,omitempty"`
}

// SplitPolicy is the value of typed_per_filter_config["sluice.policy"] on one of
// weighted_clusters' clusters: the split keys Envoy has no field for.
type SplitPolicy struct {
	// Name names the split (default: the cluster).
	Name string `yaml:"name,omitempty"`
	// GrayFlag: a request whose gray-flag header equals it always goes to this split.
	GrayFlag string `yaml:"gray_flag,omitempty"`
	// Model rewrites the request's model on this split.
	Model string `yaml:"model,omitempty"`
}

// ClusterPolicy is a cluster's metadata.filter_metadata["sluice"]: the cluster keys Envoy has
// no field for.
type ClusterPolicy struct {
	// Timeouts are defaults for the routes sending to the cluster (connect is connect_timeout).
	Timeouts            ClusterTimeouts `yaml:"timeouts,omitempty"`
	Picking             config.Picking  `yaml:"picking,omitempty"`
	MaxIdleConnsPerHost int             `yaml:"max_idle_conns_per_host,omitempty"`
	// APIKeyEnv names the environment variable (on each replica) holding the cluster's API key.
	APIKeyEnv string `yaml:"api_key_env,omitempty"`
	// HealthPathAuto: the health check's path was left to Sluice's default (/health, else
	// /v1/models for a server without one); the Envoy resource carries /health, which Envoy
	// requires.
	HealthPathAuto bool `yaml:"health_path_auto,omitempty"`
}

// ClusterTimeouts are a cluster's time-outs beyond connect_timeout.
type ClusterTimeouts struct {
	TTFT  config.Duration `yaml:"ttft,omitempty"`
	Idle  config.Duration `yaml:"idle,omitempty"`
	Total config.Duration `yaml:"total,omitempty"`
}

// EndpointPolicy is an endpoint's metadata.filter_metadata["sluice"].
type EndpointPolicy struct {
	// Metrics is the model server's Prometheus endpoint URL (load-aware picking).
	Metrics string `yaml:"metrics,omitempty"`
	// PathPrefix is appended to http(s)://host:port to make the endpoint's base URL.
	PathPrefix string `yaml:"path_prefix,omitempty"`
}

// GlobalPolicy is the value of the ECDS TypedExtensionConfig named "sluice.policy": the
// gateway-wide keys. Listen addresses and listener TLS are the replica's own (bootstrap).
type GlobalPolicy struct {
	MaxBodyBytes   config.ByteSize       `yaml:"max_body_bytes,omitempty"`
	MaxEventBytes  config.ByteSize       `yaml:"max_event_bytes,omitempty"`
	DrainTimeout   config.Duration       `yaml:"drain_timeout,omitempty"`
	DrainDelay     config.Duration       `yaml:"drain_delay,omitempty"`
	Timeouts       config.GlobalTimeouts `yaml:"timeouts,omitempty"`
	TrustedProxies []string              `yaml:"trusted_proxies,omitempty"`
	Limits         config.Limits         `yaml:"limits,omitempty"`
	CORS           config.CORS           `yaml:"cors,omitempty"`
	LoadSignals    config.LoadSignals    `yaml:"load_signals,omitempty"`
	Chaos          fault.Config          `yaml:"chaos,omitempty"`
	Tenants        []config.Tenant       `yaml:"tenants,omitempty"`
	Shadow         config.Shadow         `yaml:"shadow,omitempty"`
}

// DecodeStruct decodes a google.protobuf.Struct into v strictly, with the YAML keys of the
// file config: an unknown key is an error. A nil Struct leaves v as it is.
func DecodeStruct(s *structpb.Struct, v any) error {
	if s == nil || len(s.GetFields()) == 0 {
		return nil
	}
	js, err := protojson.Marshal(s)
	if err != nil {
		return fmt.Errorf("struct to json: %w", err)
	}
	// JSON is YAML: decoding it with the YAML decoder uses the file config's keys, units
	// ("16MiB", "30s") and strictness.
	dec := yaml.NewDecoder(bytes.NewReader(js))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return cleanYAMLError(err)
	}
	return nil
}

// cleanYAMLError drops the line numbers of a YAML error, meaningless for one line of JSON.
func cleanYAMLError(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, m := range te.Errors {
			msgs[i] = strings.TrimPrefix(m, "line 1: ")
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return errors.New(strings.TrimPrefix(strings.TrimPrefix(err.Error(), "yaml: "), "line 1: "))
}

// EncodeStruct encodes v (one of the policy types above) as a google.protobuf.Struct with the
// YAML keys DecodeStruct reads. It returns nil when v has nothing to say.
func EncodeStruct(v any) (*structpb.Struct, error) {
	y, err := yaml.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(y, &m); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	s, err := structpb.NewStruct(normalize(m).(map[string]any))
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return s, nil
}

// normalize turns what yaml.v3 decodes into `any` into what structpb.NewValue accepts.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = normalize(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	default:
		return v
	}
}

// NewTypedStruct wraps a policy value as an Any holding an xds.type.v3.TypedStruct. It
// returns nil when v has nothing to say.
func NewTypedStruct(typeURL string, v any) (*anypb.Any, error) {
	s, err := EncodeStruct(v)
	if err != nil || s == nil {
		return nil, err
	}
	a, err := anypb.New(&xdstypev3.TypedStruct{TypeUrl: typeURL, Value: s})
	if err != nil {
		return nil, fmt.Errorf("typed struct: %w", err)
	}
	return a, nil
}

// decodeTypedStruct unpacks an Any holding an xds.type.v3.TypedStruct (only that type: an
// udpa.type.v1.TypedStruct, the same shape under an older name, is refused) and decodes its
// value strictly into v.
func decodeTypedStruct(a *anypb.Any, v any) error {
	if a == nil {
		return nil
	}
	ts := &xdstypev3.TypedStruct{}
	if err := a.UnmarshalTo(ts); err != nil {
		return fmt.Errorf("want a %s, got %s: %w", "xds.type.v3.TypedStruct", a.GetTypeUrl(), err)
	}
	return DecodeStruct(ts.GetValue(), v)
}

// decodeMetadata decodes metadata.filter_metadata["sluice"] strictly into v.
func decodeMetadata(md *corev3.Metadata, v any) error {
	return DecodeStruct(md.GetFilterMetadata()[MetadataKey], v)
}

// NewMetadata returns metadata with filter_metadata["sluice"] set to v, or nil when v has
// nothing to say.
func NewMetadata(v any) (*corev3.Metadata, error) {
	s, err := EncodeStruct(v)
	if err != nil || s == nil {
		return nil, err
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: s}}, nil
}
