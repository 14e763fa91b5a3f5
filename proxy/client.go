package proxy

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluicegw/sluice/proxy/config"
)

// trust is the set of trusted proxies: peers whose X-Forwarded-For (or Forwarded) headers
// are believed. It is compiled once per config generation.
type trust []netip.Prefix

func newTrust(cidrs []string) trust {
	var t trust
	for _, c := range cidrs {
		if p, err := config.ParsePrefix(c); err == nil { // validated with the config
			t = append(t, p)
		}
	}
	return t
}

func (t trust) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// maxForwardedHops bounds how many forwarded addresses are examined, whatever a client sends.
const maxForwardedHops = 32

// clientOf is the request's client address. Without trusted proxies it is the peer's (any
// client could write X-Forwarded-For) and known is false: the peer may be a load balancer
// or a sidecar in front of many clients. With them, when the peer is trusted, the forwarded
// addresses are read right to left (X-Forwarded-For, else Forwarded's for=) and the first
// that is not a trusted proxy is the client; known is true. A client cannot forge its way
// past a trusted proxy: each appends the address it saw.
//
// A proxy appends to one of the two headers and passes the other through as the client sent
// it. When a request has both and their last entries name different addresses, a client
// wrote one of them and which one cannot be told: neither is believed, and the client is
// unknown ("", known false: nothing per client applies to it, no allowed network matches it).
func (t trust) clientOf(r *http.Request) (client string, known bool) {
	peer := peerAddr(r.RemoteAddr)
	if len(t) == 0 {
		return peerString(r.RemoteAddr, peer), false
	}
	if !peer.IsValid() || !t.contains(peer) {
		return peerString(r.RemoteAddr, peer), true
	}
	hasX, hasF := len(r.Header["X-Forwarded-For"]) > 0, len(r.Header["Forwarded"]) > 0
	x, f := xffHops(r.Header), forwardedFor(r.Header)
	if hasX && hasF && !forwardedAgree(x, f) {
		return "", false
	}
	hops := f // every X-Forwarded-For value, else the for= parameters of Forwarded (RFC 7239)
	if hasX {
		hops = x
	}
	client = peer.String()
	for i := len(hops) - 1; i >= 0 && len(hops)-i <= maxForwardedHops; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			break // garbage left of a trusted proxy's entry: the last address seen stands
		}
		client = a.String()
		if !t.contains(a) {
			break
		}
	}
	return client, true
}

// peerString is peer.String() for peer = peerAddr(remote), without formatting (and
// allocating) it again when remote already holds it.
func peerString(remote string, peer netip.Addr) string {
	// With one colon and no bracket, peerAddr parsed peer from remote[:i] (otherwise from an
	// IPv4-mapped IPv6 address, unmapped); an IPv4 address parses only from its canonical text.
	if peer.Is4() && remote[0] != '[' {
		if i := strings.IndexByte(remote, ':'); i > 0 && strings.LastIndexByte(remote, ':') == i {
			return remote[:i]
		}
	}
	return peer.String()
}

// peerAddr is the IP of a RemoteAddr ("ip:port"); invalid when it is none.
func peerAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap()
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, _ := netip.ParseAddr(host)
	return a.Unmap()
}

// forwardedAgree reports whether the X-Forwarded-For and Forwarded hops of a request that has
// both headers end with the same address (what the trusted peer appended to each, or to one
// while the client wrote the other to match it).
func forwardedAgree(x, f []string) bool {
	if len(x) == 0 || len(f) == 0 {
		return len(x) == len(f)
	}
	a, okA := parseHop(x[len(x)-1])
	b, okB := parseHop(f[len(f)-1])
	return okA && okB && a == b
}

// xffHops lists X-Forwarded-For's addresses, leftmost first, and forwardedFor Forwarded's
// for= parameters.
func xffHops(h http.Header) []string {
	var out []string
	for _, v := range h.Values("X-Forwarded-For") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
	}
	return out
}

func forwardedFor(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Forwarded") {
		for _, elem := range strings.Split(v, ",") {
			for _, pair := range strings.Split(elem, ";") {
				k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(k, "for") {
					out = append(out, strings.Trim(val, `"`))
				}
			}
		}
	}
	return out
}

// parseHop parses one forwarded address: "192.0.2.60", "192.0.2.60:4711", "2001:db8::17",
// "[2001:db8::17]:4711".
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
