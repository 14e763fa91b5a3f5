package upstream

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCAFile writes srv's certificate as a PEM file and returns its path.
func writeCAFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	block := &pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func get(c *Cluster, url string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Transport().RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Proto + " " + string(b), err
}

func TestTLSTransportTrustsCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}))
	t.Cleanup(srv.Close)
	ca := writeCAFile(t, srv)

	tests := []struct {
		name    string
		tls     TLS
		wantErr bool
	}{
		{"trusted CA file", TLS{CAFile: ca}, false},
		{"no CA file", TLS{}, true},
		{"CA file and matching server name", TLS{CAFile: ca, ServerName: "example.com"}, false},
		{"CA file and wrong server name", TLS{CAFile: ca, ServerName: "other.test"}, true},
		{"insecure skip verify", TLS{InsecureSkipVerify: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCluster(t, Options{Endpoints: []EndpointSpec{{URL: srv.URL}}, TLS: tt.tls})
			body, err := get(c, srv.URL+"/x")
			if tt.wantErr {
				var uerr x509.UnknownAuthorityError
				var herr x509.HostnameError
				if err == nil || !(errors.As(err, &uerr) || errors.As(err, &herr)) {
					t.Fatalf("err = %v, want a certificate verification error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("GET: %v", err)
			}
			if !strings.HasSuffix(body, " hello") {
				t.Fatalf("body = %q", body)
			}
		})
	}
}

func TestTLSHealthCheckWithCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	c := newTestCluster(t, Options{
		Endpoints:   []EndpointSpec{{URL: srv.URL}},
		TLS:         TLS{CAFile: writeCAFile(t, srv)},
		HealthCheck: HealthCheck{Interval: 5 * time.Millisecond, UnhealthyThreshold: 1},
	})
	c.Start(t.Context())
	waitFor(t, "unhealthy", func() bool { return !c.Endpoints()[0].Healthy() })
	if got := c.Snapshot()[0].LastHealthError; !strings.Contains(got, "503") {
		t.Fatalf("last health error = %q, want the 503 (TLS must have succeeded)", got)
	}
}

func TestTransportSettings(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		wantHTTP2 bool
		wantIdle  int
		wantDial  time.Duration
	}{
		{"http defaults", Options{Endpoints: specs(1)}, false, DefaultMaxIdleConnsPerHost, DefaultConnectTimeout},
		{"https attempts http2", Options{Endpoints: []EndpointSpec{{URL: "https://a.test"}}}, true, DefaultMaxIdleConnsPerHost, DefaultConnectTimeout},
		{"custom", Options{Endpoints: specs(1), MaxIdleConnsPerHost: 8, ConnectTimeout: time.Second}, false, 8, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCluster(t, tt.opts)
			h, ok := c.Transport().(*h1)
			if !ok {
				t.Fatalf("Transport is %T, want *h1", c.Transport())
			}
			tr := h.fallback
			if h.maxIdle != tt.wantIdle {
				t.Errorf("h1 keeps %d idle connections per host, want %d", h.maxIdle, tt.wantIdle)
			}
			if tr.ForceAttemptHTTP2 != tt.wantHTTP2 {
				t.Errorf("ForceAttemptHTTP2 = %v, want %v", tr.ForceAttemptHTTP2, tt.wantHTTP2)
			}
			if !tr.DisableCompression {
				t.Error("DisableCompression = false: bytes must be relayed as they are")
			}
			if tr.ResponseHeaderTimeout != 0 {
				t.Errorf("ResponseHeaderTimeout = %v, want 0 (the gateway enforces TTFT)", tr.ResponseHeaderTimeout)
			}
			if tr.Proxy != nil {
				t.Error("Proxy set: upstream traffic must not follow proxy environment variables")
			}
			if tr.MaxIdleConnsPerHost != tt.wantIdle {
				t.Errorf("MaxIdleConnsPerHost = %d, want %d", tr.MaxIdleConnsPerHost, tt.wantIdle)
			}
			if tr.TLSHandshakeTimeout != tt.wantDial {
				t.Errorf("TLSHandshakeTimeout = %v, want %v", tr.TLSHandshakeTimeout, tt.wantDial)
			}
		})
	}
}

func TestCompressedBodyRelayedAsIs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") != "" {
			t.Errorf("transport added Accept-Encoding %q", r.Header.Get("Accept-Encoding"))
		}
		_, _ = io.WriteString(w, "plain")
	}))
	t.Cleanup(srv.Close)
	c := newTestCluster(t, Options{Endpoints: []EndpointSpec{{URL: srv.URL}}})
	if body, err := get(c, srv.URL); err != nil || body != "HTTP/1.1 plain" {
		t.Fatalf("GET = %q, %v; want HTTP/1.1 plain", body, err)
	}
}
