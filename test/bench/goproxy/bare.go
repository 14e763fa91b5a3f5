package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicegw/sluice/proxy/http1"
	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/proxy/upstream"
)

// The bare proxies forward every request as it came, minus hop-by-hop headers (the gateway's
// own rule, httphead.CopyEndToEnd), and relay the answer; no policy, no parsing of the body,
// no telemetry. Each is one machinery alone: what a gateway built on it costs before it does
// anything.

// bare are the bare proxies by subcommand: each serves listen, forwarding to target.
var bare = map[string]func(target, listen string) error{
	"serve-reverse-proxy":  serveReverseProxy,
	"serve-own-proxy":      serveOwnProxy,
	"serve-fasthttp-proxy": serveFastProxy,
}

// serveOwnProxy is Sluice's own machinery, bare: its HTTP/1.1 server (proxy/http1, net/http's
// server as its fallback) and its upstream client (a proxy/upstream cluster's transport: the
// HTTP/1.1 client on the handler's goroutine), with a handler that only forwards.
func serveOwnProxy(target, listen string) error {
	h, closeFn, err := ownProxy(target)
	if err != nil {
		return err
	}
	defer closeFn()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return ownServer(h).Serve(ln)
}

// ownServer is the own HTTP/1.1 server with the gateway's defaults around h.
func ownServer(h http.Handler) *http1.Server {
	return &http1.Server{Handler: h, Fallback: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, WatchAfter: 20 * time.Millisecond}
}

// ownProxy is the bare own proxy's handler, forwarding to target through a cluster's
// transport; closeFn closes the cluster.
func ownProxy(target string) (h http.Handler, closeFn func(), err error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, nil, err
	}
	cl, err := upstream.NewCluster(upstream.Options{Name: "bare", Endpoints: []upstream.EndpointSpec{{URL: target}}})
	if err != nil {
		return nil, nil, err
	}
	rt := cl.Transport()
	h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := (&http.Request{
			Method: r.Method, URL: &url.URL{Scheme: u.Scheme, Host: u.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery},
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: make(http.Header, len(r.Header)), Host: u.Host,
		}).WithContext(r.Context())
		httphead.CopyEndToEnd(out.Header, r.Header)
		if r.ContentLength != 0 {
			// Read whole, as the gateway reads a body to parse it: the own client takes a
			// body it can send again (GetBody) and gives any other to net/http's Transport.
			b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
			if err != nil {
				var tooLarge *http.MaxBytesError
				if errors.As(err, &tooLarge) {
					http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
					return
				}
				http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
				return
			}
			out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		}
		resp, err := rt.RoundTrip(out)
		if err != nil {
			http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		httphead.CopyEndToEnd(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		relay(w, resp.Body, resp.ContentLength)
	})
	return h, cl.Close, nil
}

// maxBody bounds a request body the bare own proxy reads (the gateway's default
// max_body_bytes is larger; goproxy's requests are about 100 bytes).
const maxBody = 1 << 20

// relay copies an answer to the client: one of known length as the server's buffered writer
// takes it (written once the handler returns, as the gateway writes a whole answer), any
// other as it comes, flushed after each read (as the gateway and the reverse proxy with
// FlushInterval -1 relay a stream). An answer cut short aborts the client's connection, so
// that the client sees it cut and not complete.
func relay(w http.ResponseWriter, body io.Reader, length int64) {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	f, _ := w.(http.Flusher)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if length < 0 && f != nil {
				f.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			panic(http.ErrAbortHandler)
		}
	}
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// serveFastProxy is valyala/fasthttp alone: its server and its HostClient over a keep-alive
// pool, the request forwarded as fasthttp parsed it and the answer as the client read it
// (whole: fasthttp buffers a body unless told to stream it, which this non-streaming load
// does not need).
func serveFastProxy(target, listen string) error {
	h, closeFn, err := fastProxy(target)
	if err != nil {
		return err
	}
	defer closeFn()
	return fastServer(h).ListenAndServe(listen)
}

// fastServer is fasthttp's server around h.
func fastServer(h fasthttp.RequestHandler) *fasthttp.Server {
	return &fasthttp.Server{Handler: h, ReadTimeout: 10 * time.Second, IdleTimeout: time.Minute, NoDefaultServerHeader: true}
}

// fastProxy is the bare fasthttp proxy's handler, forwarding to target's host and port;
// closeFn closes the client's idle connections.
func fastProxy(target string) (h fasthttp.RequestHandler, closeFn func(), err error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, nil, err
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, nil, fmt.Errorf("fasthttp proxy: want http://HOST:PORT, got %q", target)
	}
	hc := &fasthttp.HostClient{Addr: u.Host, MaxConns: 1024, ReadTimeout: time.Minute, WriteTimeout: time.Minute}
	return func(ctx *fasthttp.RequestCtx) {
		// The server keeps a client's Connection: close from before the handler ran;
		// deleting the header does not undo it (TestBareProxies holds that).
		req := &ctx.Request
		for _, k := range httphead.HopByHop(string(req.Header.Peek("Connection"))) {
			req.Header.Del(k)
		}
		if err := hc.Do(req, &ctx.Response); err != nil {
			ctx.Error("upstream: "+err.Error(), fasthttp.StatusBadGateway)
			return
		}
		for _, k := range httphead.HopByHop(string(ctx.Response.Header.Peek("Connection"))) {
			ctx.Response.Header.Del(k)
		}
	}, hc.CloseIdleConnections, nil
}
