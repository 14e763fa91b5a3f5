package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestH2StalledConnection: over HTTP/2 (h2c and TLS) a client that opens its flow-control
// windows wide and then stops reading the connection stops the server's writes at the TCP
// level, where no stream reset can be written: the connection is closed within the write
// time-out, the request counted as client_stalled and its upstream request cancelled.
func TestH2StalledConnection(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	for _, tc := range []struct {
		name, extra string
		tls         bool
	}{
		{"h2c", "", false},
		{"tls", fmt.Sprintf("tls: {cert_file: %s, key_file: %s}\n", certFile, keyFile), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var upstreamDone atomic.Int64
			big := strings.Repeat("x", 32<<10)
			streamer := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				defer upstreamDone.Add(1)
				for {
					if _, err := fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}\n\n", big); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						return
					default:
					}
				}
			})
			g := startGateway(t, tc.extra+"timeouts: {write: 500ms}\n"+oneRoute("    health_check: {disabled: true}\n", "", streamer.URL))
			hc := newHTTPClient(t)

			d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
			}}
			raw, err := d.Dial("tcp", g.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			conn := raw
			if tc.tls {
				tc := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
					t.Fatalf("ALPN %q", p)
				}
				conn = tc
			}
			body := `{"model":"sim-llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			scheme := map[bool]string{false: "http", true: "https"}[tc.tls]
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", scheme}, {":authority", g.addr}, {":path", "/v1/chat/completions"},
				{"content-type", "application/json"}, {"content-length", fmt.Sprint(len(body))}} {
				_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(conn, conn)
			const window = 1<<31 - 1
			if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: window}); err != nil {
				t.Fatal(err)
			}
			_ = fr.WriteWindowUpdate(0, window-65535)
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
			_ = fr.WriteData(1, true, []byte(body))
			// Never read: the server's writes fill the socket and block.
			eventually(t, 10*time.Second, "the stalled client dropped and its upstream released", func() bool {
				return upstreamDone.Load() >= 1 && metricValue(t, hc, g.admin, "sluice_requests_total", `error_type="client_stalled"`) == 1
			})
		})
	}
}

// TestH2StalledStream: over HTTP/2 a client that reads its connection but never opens a
// stream's flow-control window holds that stream no longer than the write time-out: it is
// reset, counted as client_stalled, and its upstream request cancelled.
func TestH2StalledStream(t *testing.T) {
	var upstreamDone atomic.Int64
	streamer := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		defer upstreamDone.Add(1)
		for {
			if _, err := io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	g := startGateway(t, "timeouts: {write: 500ms}\n"+oneRoute("    health_check: {disabled: true}\n", "", streamer.URL))
	hc := newHTTPClient(t)
	conn, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"sim-llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", g.addr}, {":path", "/v1/chat/completions"},
		{"content-type", "application/json"}, {"content-length", fmt.Sprint(len(body))}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_, _ = io.WriteString(conn, http2.ClientPreface)
	fr := http2.NewFramer(conn, conn)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	_ = fr.WriteData(1, true, []byte(body))
	reset := make(chan http2.ErrCode, 1)
	go func() { // read the connection (settings, pings, headers), never open the window
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.RSTStreamFrame:
				reset <- f.ErrCode
				return
			}
		}
	}()
	select {
	case <-reset:
	case <-time.After(5 * time.Second):
		t.Fatal("the stalled stream was not reset")
	}
	eventually(t, 5*time.Second, "the stalled stream counted and its upstream released", func() bool {
		return upstreamDone.Load() >= 1 && metricValue(t, hc, g.admin, "sluice_requests_total", `error_type="client_stalled"`) == 1
	})
}

// TestH2StreamWaitsLongerThanTheWriteTimeout: over HTTP/2 the write time-out bounds writes,
// not the waits between them: a stream whose first event and next event each take longer
// than timeouts.write reaches a reading client whole.
func TestH2StreamWaitsLongerThanTheWriteTimeout(t *testing.T) {
	chunk := func(s string) string {
		return "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + s + "\"}}]}\n\n"
	}
	up := startRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(1200 * time.Millisecond) // the time to the first token
		_, _ = io.WriteString(w, chunk("one "))
		w.(http.Flusher).Flush()
		time.Sleep(1200 * time.Millisecond)
		_, _ = io.WriteString(w, chunk("two")+"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	})
	g := startGateway(t, "timeouts: {write: 500ms}\n"+oneRoute("    health_check: {disabled: true}\n", "", up.URL))
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+g.addr+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim-llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("protocol %s, want HTTP/2", resp.Proto)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(b), `"two"`) || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("the stream cut (%v):\n%s", err, b)
	}
}
