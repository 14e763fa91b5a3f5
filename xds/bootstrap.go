package xds

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/sluicegw/sluice/proxy/config"
	"github.com/sluicegw/sluice/shadow"
)

// DefaultRouteConfig is the RouteConfiguration a client subscribes to when the bootstrap names
// none.
const DefaultRouteConfig = "sluice"

// Bootstrap is what a replica needs before it can talk to its control plane: who it is, where
// the management server is and how to reach it, what to subscribe to, and the listeners it
// binds before any config arrives. It is loaded from a file (LoadBootstrap) or built from
// flags; Validate lists every problem.
type Bootstrap struct {
	// NodeID identifies this replica to the control plane (Envoy's node.id); the hostname
	// when empty.
	NodeID string `yaml:"node_id" json:"node_id"`
	// Cluster is the node's cluster (Envoy's node.cluster): the fleet this replica belongs to.
	Cluster string `yaml:"cluster" json:"cluster,omitempty"`
	// Server is the management server's host:port.
	Server string `yaml:"server" json:"server"`
	// TLS to the management server; plaintext when no field is set.
	TLS BootstrapTLS `yaml:"tls" json:"tls,omitempty"`
	// RouteConfig is the RouteConfiguration subscribed to over RDS (default "sluice").
	RouteConfig string `yaml:"route_config" json:"route_config,omitempty"`
	// Delta selects incremental xDS (DeltaAggregatedResources, the default); false selects
	// state-of-the-world (StreamAggregatedResources). In a file: `sotw: true`.
	Delta bool `yaml:"-" json:"delta"`
	// PersistPath, when set, is a file where the resources of the last good config are kept;
	// a replica that cannot reach its control plane at start serves from it.
	PersistPath string `yaml:"persist" json:"persist,omitempty"`
	// Listen and Admin are the gateway's and the admin listener's addresses (the defaults of
	// `sluice serve` when empty). A control plane cannot move them.
	Listen string `yaml:"listen" json:"listen,omitempty"`
	Admin  string `yaml:"admin" json:"admin,omitempty"`
	// MetricsTokenEnv is the file config's admin.metrics_token_env: the environment variable
	// with the bearer token /metrics then requires.
	MetricsTokenEnv string `yaml:"metrics_token_env" json:"metrics_token_env,omitempty"`
	// LoadSignals and ShadowStore are the replica's own settings that a control plane cannot
	// change (they need a restart): the file config's load_signals and shadow.store (a
	// SQLite file, or the postgres:// URL of a store the fleet shares).
	LoadSignals config.LoadSignals `yaml:"load_signals" json:"load_signals"`
	// ListenTLS is the gateway listener's certificate and key (the file config's tls); the
	// files are re-read when they change.
	ListenTLS   config.ListenerTLS `yaml:"listen_tls" json:"listen_tls,omitempty"`
	ShadowStore string             `yaml:"shadow_store" json:"shadow_store,omitempty"`
}

// BootstrapTLS is TLS to the management server. CAFile alone: server-authenticated TLS;
// with CertFile and KeyFile: mutual TLS.
type BootstrapTLS struct {
	CAFile     string `yaml:"ca_file" json:"ca_file,omitempty"`
	CertFile   string `yaml:"cert_file" json:"cert_file,omitempty"`
	KeyFile    string `yaml:"key_file" json:"key_file,omitempty"`
	ServerName string `yaml:"server_name" json:"server_name,omitempty"`
}

// Enabled reports whether TLS is configured.
func (t BootstrapTLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// bootstrapFile is the file form: `sotw: true` selects state-of-the-world.
type bootstrapFile struct {
	Bootstrap `yaml:",inline"`
	SotW      bool `yaml:"sotw"`
}

// LoadBootstrap reads a bootstrap file (YAML, or JSON, which is YAML), strictly: unknown keys
// are errors. Relative paths are relative to the file's folder. Defaults are applied; call
// Validate before use.
func LoadBootstrap(file string) (Bootstrap, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Bootstrap{}, fmt.Errorf("read bootstrap: %w", err)
	}
	b, err := ParseBootstrap(data)
	if err != nil {
		return Bootstrap{}, fmt.Errorf("bootstrap %s: %w", file, err)
	}
	dir := filepath.Dir(file)
	for _, p := range []*string{&b.TLS.CAFile, &b.TLS.CertFile, &b.TLS.KeyFile, &b.PersistPath, &b.ShadowStore, &b.ListenTLS.CertFile, &b.ListenTLS.KeyFile} {
		if *p != "" && !filepath.IsAbs(*p) && !shadow.IsPostgresURL(*p) { // a shared store's URL is no path
			*p = filepath.Join(dir, *p)
		}
	}
	return b, nil
}

// ParseBootstrap decodes a bootstrap document strictly and applies the defaults.
func ParseBootstrap(data []byte) (Bootstrap, error) {
	var f bootstrapFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return Bootstrap{}, fmt.Errorf("decode: %w", err)
	}
	b := f.Bootstrap
	b.Delta = !f.SotW
	b.ApplyDefaults()
	return b, nil
}

// ApplyDefaults fills the node id (the hostname) and the route config name.
func (b *Bootstrap) ApplyDefaults() {
	if b.NodeID == "" {
		if h, err := os.Hostname(); err == nil {
			b.NodeID = h
		}
	}
	if b.RouteConfig == "" {
		b.RouteConfig = DefaultRouteConfig
	}
}

// BootstrapError lists every problem of a bootstrap.
type BootstrapError struct {
	Problems []string
}

func (e *BootstrapError) Error() string {
	return fmt.Sprintf("invalid xds bootstrap (%d problems):\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// Validate checks the bootstrap and returns a *BootstrapError listing every problem.
func (b Bootstrap) Validate() error {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	switch n := b.NodeID; {
	case n == "":
		add("node_id: required (no hostname to default to)")
	case len(n) > shadow.MaxNameLen || strings.ContainsFunc(n, unicode.IsControl) || n != strings.TrimSpace(n):
		// It also names the replica in the shadow store (shadow.instance).
		add("node_id: %q: at most %d bytes, without control characters or surrounding spaces", n, shadow.MaxNameLen)
	}
	if err := checkAddr(b.Server); err != nil {
		add("server: %v", err)
	}
	if b.RouteConfig == "" {
		add("route_config: required")
	}
	for _, f := range []struct{ name, v string }{{"listen", b.Listen}, {"admin", b.Admin}} {
		if f.v == "" {
			continue
		}
		if err := checkAddr(f.v); err != nil {
			add("%s: %v", f.name, err)
		}
	}
	t := b.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		add("tls: cert_file and key_file go together")
	}
	for _, f := range []struct{ name, v string }{{"ca_file", t.CAFile}, {"cert_file", t.CertFile}, {"key_file", t.KeyFile}} {
		if f.v == "" {
			continue
		}
		if _, err := os.Stat(f.v); err != nil {
			add("tls.%s: %v", f.name, err)
		}
	}
	if b.PersistPath != "" {
		if fi, err := os.Stat(filepath.Dir(b.PersistPath)); err != nil {
			add("persist: folder: %v", err)
		} else if !fi.IsDir() {
			add("persist: %s is not a folder", filepath.Dir(b.PersistPath))
		}
		if fi, err := os.Stat(b.PersistPath); err == nil && fi.IsDir() {
			add("persist: %s is a folder, not a file", b.PersistPath)
		}
	}
	if len(p) > 0 {
		return &BootstrapError{Problems: p}
	}
	return nil
}

func checkAddr(addr string) error {
	if addr == "" {
		return errors.New("required")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if port == "" {
		return fmt.Errorf("%q has no port", addr)
	}
	return nil
}

// tlsConfig builds the client TLS config (nil when TLS is off).
func (t BootstrapTLS) tlsConfig() (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("xds tls: read ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds tls: ca_file %s holds no PEM certificate", t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("xds tls: load client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
