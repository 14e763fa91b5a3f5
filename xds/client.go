package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicegw/sluice/proxy/config"
)

// Defaults of the client's timing knobs.
const (
	DefaultReconnectBase = 250 * time.Millisecond
	DefaultReconnectMax  = 30 * time.Second
	DefaultNackBase      = 500 * time.Millisecond
	DefaultNackMax       = 15 * time.Second
	DefaultWarmTimeout   = 10 * time.Second
	// maxErrorDetail bounds the message of a NACK's error_detail.
	maxErrorDetail = 32 << 10
)

// ClientOptions configure a Client.
type ClientOptions struct {
	Bootstrap Bootstrap
	// Translate turns a whole set of resources into a finished, validated config, or returns
	// an error (a *config.ValidationError lists every problem). Usually
	// func(r Resources) (*config.Config, error) { return Translate(r, opts) }.
	Translate func(Resources) (*config.Config, error)
	// Apply swaps a translated config in (proxy.Server.Apply). An error NACKs the response
	// that produced the config; the previous config keeps serving.
	Apply func(*config.Config) error
	// Check, when set, tells whether Apply would take a config without applying it
	// (proxy.Server.Check). A config that waits for more resources is ACKed only when it
	// passes, so nothing is ACKed that Apply would refuse later.
	Check func(*config.Config) error
	// Logger receives the client's log (slog.Default when nil).
	Logger *slog.Logger
	// Version is sent to the control plane as the node's user agent version.
	Version string

	// ReconnectBase and ReconnectMax bound the back-off between connection attempts: it
	// doubles from base to max, with jitter, and starts over once a stream got a response.
	ReconnectBase, ReconnectMax time.Duration
	// NackBase and NackMax bound the wait before NACKing the same rejected content again: the
	// first rejection is NACKed at once, the n-th identical one after base·2^(n-2), at most max.
	NackBase, NackMax time.Duration
	// WarmTimeout bounds how long a config waits for what it lacks (the endpoints of its EDS
	// clusters, the bootstrap's route configuration) before it is applied without them.
	WarmTimeout time.Duration
	// DialOptions are added to the gRPC dial options (tests).
	DialOptions []grpc.DialOption
}

// Client is an ADS client: one stream to the management server (delta xDS by default), every
// received resource kept, each response translated whole into a config and applied, or NACKed
// with every problem while the last good config keeps serving. Run it with Run.
type Client struct {
	opts    ClientOptions
	log     *slog.Logger
	node    *corev3.Node
	tls     *tls.Config
	running atomic.Bool

	// Written only by Run's goroutine; read under mu by Status and the metrics.
	mu             sync.Mutex
	acc            *store // the ACKed resources
	served         *store // the resources of the config now applied (nil: none yet)
	configVersion  string
	lastUpdate     time.Time
	state          string
	connectedSince time.Time
	reconnects     int64
	acks, nacks    map[string]int64
	lastNack       map[string]*NackStatus
	lastErr        string
	lastErrAt      time.Time
	fromPersisted  bool
	triedPersisted bool
	warmExpired    map[string]bool // what a config stopped waiting for
	waiting        []string        // what the accepted resources wait for before they are applied
}

// Connection states in Status.
const (
	StateIdle         = "idle"
	StateConnecting   = "connecting"
	StateConnected    = "connected"
	StateDisconnected = "disconnected"
)

// NewClient checks the options and builds a client; nothing connects until Run.
func NewClient(opts ClientOptions) (*Client, error) {
	if err := opts.Bootstrap.Validate(); err != nil {
		return nil, err
	}
	if opts.Translate == nil {
		return nil, errors.New("xds client: no Translate function")
	}
	if opts.Apply == nil {
		return nil, errors.New("xds client: no Apply function")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.ReconnectBase, DefaultReconnectBase)
	def(&opts.ReconnectMax, DefaultReconnectMax)
	def(&opts.NackBase, DefaultNackBase)
	def(&opts.NackMax, DefaultNackMax)
	def(&opts.WarmTimeout, DefaultWarmTimeout)
	opts.ReconnectMax = max(opts.ReconnectMax, opts.ReconnectBase)
	opts.NackMax = max(opts.NackMax, opts.NackBase)
	tc, err := opts.Bootstrap.TLS.tlsConfig()
	if err != nil {
		return nil, err
	}
	b := opts.Bootstrap
	c := &Client{
		opts: opts,
		log:  opts.Logger.With("xds_server", b.Server, "node", b.NodeID),
		node: &corev3.Node{
			Id:                   b.NodeID,
			Cluster:              b.Cluster,
			UserAgentName:        "sluice",
			UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: opts.Version},
		},
		tls:         tc,
		acc:         newStore(),
		state:       StateIdle,
		acks:        map[string]int64{},
		nacks:       map[string]int64{},
		lastNack:    map[string]*NackStatus{},
		warmExpired: map[string]bool{},
	}
	return c, nil
}

// Run connects to the management server and follows it until ctx is done, reconnecting with
// exponential back-off and jitter whenever the stream ends; the last good config keeps
// serving meanwhile. When the server cannot be reached and no config was applied yet, the
// persisted resources (Bootstrap.PersistPath) are applied. Run returns nil once ctx is done,
// with every goroutine it started stopped; it may run once at a time.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("xds client: already running")
	}
	defer c.running.Store(false)
	defer c.setState(StateDisconnected)
	failures := 0
	for {
		began := time.Now()
		healthy, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.setErr(fmt.Errorf("stream to %s: %w", c.opts.Bootstrap.Server, err))
		if healthy && time.Since(began) >= stableStream {
			// Only a stream that lasted resets the back-off: a server that answers once and
			// then drops the stream is retried ever more slowly, not several times a second.
			failures = 0
		}
		c.mu.Lock()
		noConfig, tried := c.served == nil, c.triedPersisted
		c.mu.Unlock()
		if noConfig && !tried && c.opts.Bootstrap.PersistPath != "" {
			c.startFromPersisted()
		}
		d := c.reconnectDelay(failures)
		failures++
		c.log.Warn("xds stream ended; reconnecting", "err", err, "in", d.Round(time.Millisecond))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		c.mu.Lock()
		c.reconnects++
		c.mu.Unlock()
	}
}

// stableStream is how long a stream must have lasted for its end to count as a fresh start
// of the reconnect back-off.
const stableStream = 30 * time.Second

// reconnectDelay is base·2^n capped at max, drawn uniformly from its upper half.
func (c *Client) reconnectDelay(n int) time.Duration {
	half := expBackoff(c.opts.ReconnectBase, c.opts.ReconnectMax, n) / 2
	return half + rand.N(half+1)
}

// nackDelay is the wait before NACKing content rejected n times in a row (n ≥ 1): none the
// first time, then base·2^(n-2) capped at max.
func (c *Client) nackDelay(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	return expBackoff(c.opts.NackBase, c.opts.NackMax, n-2)
}

// expBackoff is base doubled n times, capped at max (without overflowing).
func expBackoff(base, limit time.Duration, n int) time.Duration {
	d := base
	for i := 0; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// dial opens a connection to the management server.
func (c *Client) dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Above grpc's default server enforcement (one ping per 5 minutes): a control plane
		// with default settings would otherwise GOAWAY the replica every few minutes.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5*time.Minute + 30*time.Second, Timeout: 20 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}
	opts = append(opts, c.opts.DialOptions...)
	conn, err := grpc.NewClient(c.opts.Bootstrap.Server, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", c.opts.Bootstrap.Server, err)
	}
	return conn, nil
}

// startFromPersisted applies the persisted resources, once, when nothing was applied yet.
func (c *Client) startFromPersisted() {
	c.mu.Lock()
	c.triedPersisted = true
	c.mu.Unlock()
	path := c.opts.Bootstrap.PersistPath
	s, p, err := loadStore(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			c.log.Info("no persisted xds config to start from", "file", path)
		} else {
			c.log.Error("persisted xds config not usable", "file", path, "err", err)
		}
		return
	}
	cfg, err := c.translate(s)
	if err == nil {
		cfg.Source = "xds (persisted " + path + ")"
		err = c.opts.Apply(cfg)
	}
	if err != nil {
		c.log.Error("persisted xds config rejected", "file", path, "err", err)
		return
	}
	c.mu.Lock()
	c.acc, c.served, c.fromPersisted = s, s, true
	c.configVersion, c.lastUpdate = cfg.Version, time.Now()
	c.mu.Unlock()
	c.log.Warn("control plane unreachable: serving the persisted xds config", "file", path,
		"version", cfg.Version, "saved_at", p.SavedAt)
}

func (c *Client) setState(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state = s
	if s == StateConnected {
		c.connectedSince = time.Now()
	} else {
		c.connectedSince = time.Time{}
	}
}

func (c *Client) setErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr, c.lastErrAt = err.Error(), time.Now()
}

// translate runs Translate, turning a panic on unexpected input into an error: resources come
// from the network, and a bad one must be NACKed, not crash the gateway.
func (c *Client) translate(s *store) (cfg *config.Config, err error) {
	defer func() {
		if r := recover(); r != nil {
			cfg, err = nil, fmt.Errorf("xds translate failed on these resources: %v", r)
		}
	}()
	cfg, err = c.opts.Translate(s.resources())
	if err == nil && cfg == nil {
		err = errors.New("xds translate returned no config")
	}
	return cfg, err
}

// problemsOf lists an error's problems: a ValidationError's, one by one, or the error.
func problemsOf(err error) []string {
	var ve *config.ValidationError
	if errors.As(err, &ve) && len(ve.Problems) > 0 {
		return ve.Problems
	}
	return []string{err.Error()}
}

// errorMessage joins problems into one error_detail message, bounded.
func errorMessage(problems []string) string {
	msg := strings.Join(problems, "\n")
	if len(msg) > maxErrorDetail {
		msg = msg[:maxErrorDetail] + "\n… (truncated)"
	}
	return msg
}

// Status is the client's state as /admin/xds shows it.
type Status struct {
	Server         string        `json:"server"`
	NodeID         string        `json:"node_id"`
	Cluster        string        `json:"cluster,omitempty"`
	Mode           string        `json:"mode"` // delta or sotw
	State          string        `json:"state"`
	ConnectedSince *time.Time    `json:"connected_since,omitempty"`
	Reconnects     int64         `json:"reconnects"`
	ConfigVersion  string        `json:"config_version,omitempty"`
	LastUpdate     *time.Time    `json:"last_update,omitempty"`
	FromPersisted  bool          `json:"from_persisted,omitempty"`
	LastError      string        `json:"last_error,omitempty"`
	LastErrorAt    *time.Time    `json:"last_error_at,omitempty"`
	Types          []TypeStatus  `json:"types"`
	Waiting        []string      `json:"waiting,omitempty"`
	Persist        string        `json:"persist,omitempty"`
	Backoff        BackoffStatus `json:"backoff"`
}

// TypeStatus is one subscribed resource type.
type TypeStatus struct {
	Type      string            `json:"type"` // cds, eds, rds, ecds
	TypeURL   string            `json:"type_url"`
	Version   string            `json:"version,omitempty"`
	Resources map[string]string `json:"resources"` // name → version
	ACKs      int64             `json:"acks"`
	NACKs     int64             `json:"nacks"`
	LastNack  *NackStatus       `json:"last_nack,omitempty"`
}

// NackStatus is the last rejection of a type.
type NackStatus struct {
	At      time.Time `json:"at"`
	Nonce   string    `json:"nonce"`
	Version string    `json:"version,omitempty"`
	Errors  []string  `json:"errors"`
	// Repeats counts identical rejections in a row (the same content sent again).
	Repeats int `json:"repeats"`
}

// BackoffStatus shows the configured waits.
type BackoffStatus struct {
	Reconnect [2]string `json:"reconnect"`
	Nack      [2]string `json:"nack"`
}

// Status returns a copy of the client's state; safe to call at any time.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.opts.Bootstrap
	st := Status{
		Server: b.Server, NodeID: b.NodeID, Cluster: b.Cluster, Mode: "delta", State: c.state,
		Reconnects: c.reconnects, ConfigVersion: c.configVersion, FromPersisted: c.fromPersisted,
		LastError: c.lastErr, Persist: b.PersistPath,
		Backoff: BackoffStatus{
			Reconnect: [2]string{c.opts.ReconnectBase.String(), c.opts.ReconnectMax.String()},
			Nack:      [2]string{c.opts.NackBase.String(), c.opts.NackMax.String()},
		},
	}
	if !b.Delta {
		st.Mode = "sotw"
	}
	tp := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	st.ConnectedSince, st.LastUpdate, st.LastErrorAt = tp(c.connectedSince), tp(c.lastUpdate), tp(c.lastErrAt)
	for _, t := range clientTypes {
		ts := TypeStatus{Type: shortType(t), TypeURL: t, Version: c.acc.versions[t], Resources: c.acc.resourceVersions(t),
			ACKs: c.acks[t], NACKs: c.nacks[t]}
		if n := c.lastNack[t]; n != nil {
			cp := *n
			cp.Errors = slices.Clone(n.Errors)
			ts.LastNack = &cp
		}
		st.Types = append(st.Types, ts)
	}
	st.Waiting = slices.Clone(c.waiting)
	return st
}

// Ready reports whether a config from the control plane (or the persisted one) was applied.
func (c *Client) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.served != nil
}

// RegisterMetrics exports the client's state on a meter (the gateway's telemetry meter):
// sluice_xds_connected, sluice_xds_config_info{version}, sluice_xds_last_update_timestamp_seconds,
// sluice_xds_acks_total{type}, sluice_xds_nacks_total{type}, sluice_xds_reconnects_total and
// sluice_xds_resources{type}. Unregister the returned registration when done.
func (c *Client) RegisterMetrics(m metric.Meter) (metric.Registration, error) {
	connected, err := m.Int64ObservableGauge("sluice.xds.connected",
		metric.WithDescription("1 while the stream to the xDS management server is up, 0 otherwise"))
	if err != nil {
		return nil, fmt.Errorf("sluice.xds.connected: %w", err)
	}
	info, err := m.Int64ObservableGauge("sluice.xds.config_info",
		metric.WithDescription("The version of the config last applied from xDS (value 1)"))
	if err != nil {
		return nil, fmt.Errorf("sluice.xds.config_info: %w", err)
	}
	last, err := m.Float64ObservableGauge("sluice.xds.last_update_timestamp",
		metric.WithDescription("Unix time of the last config applied from xDS"), metric.WithUnit("s"))
	if err != nil {
		return nil, fmt.Errorf("sluice.xds.last_update_timestamp: %w", err)
	}
	acks, err := m.Int64ObservableCounter("sluice.xds.acks",
		metric.WithDescription("xDS responses accepted (ACK), by resource type"))
	if err != nil {
		return nil, fmt.Errorf("sluice.xds.acks: %w", err)
	}
	nacks, err := m.Int64ObservableCounter("sluice.xds.nacks",
		metric.WithDescription("xDS responses rejected (NACK), by resource type"))
	if err != nil {
		return nil, fmt.Errorf("sluice.xds.nacks: %w", err)
	}
	reconnects, err := m.Int64ObservableCounter("sluice.xds.reconnects",
		metric.WithDescription("Reconnections to the xDS management server"))
	if err != nil {
		return nil, fmt.Errorf("sluice.xds.reconnects: %w", err)
	}
	resources, err := m.Int64ObservableGauge("sluice.xds.resources",
		metric.WithDescription("xDS resources held (accepted), by type"))
	if err != nil {
		return nil, fmt.Errorf("sluice.xds.resources: %w", err)
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		up := int64(0)
		if c.state == StateConnected {
			up = 1
		}
		o.ObserveInt64(connected, up)
		if c.configVersion != "" {
			o.ObserveInt64(info, 1, metric.WithAttributes(attribute.String("version", c.configVersion)))
		}
		if !c.lastUpdate.IsZero() {
			o.ObserveFloat64(last, float64(c.lastUpdate.UnixNano())/1e9)
		}
		o.ObserveInt64(reconnects, c.reconnects)
		for _, t := range clientTypes {
			at := metric.WithAttributes(attribute.String("type", shortType(t)))
			o.ObserveInt64(acks, c.acks[t], at)
			o.ObserveInt64(nacks, c.nacks[t], at)
			o.ObserveInt64(resources, int64(len(c.acc.types[t])), at)
		}
		return nil
	}, connected, info, last, acks, nacks, reconnects, resources)
}

// sortedKeys is a map's keys in order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
