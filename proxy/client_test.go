package proxy

import (
	"net/http"
	"testing"
)

func TestClientOf(t *testing.T) {
	lb := newTrust([]string{"10.0.0.0/8", "::1"})
	for _, tc := range []struct {
		name   string
		trust  trust
		peer   string
		xff    []string
		fwd    string
		client string
		known  bool
	}{
		{"no trusted proxies: the peer, not known", nil, "10.1.1.1:5000", []string{"1.2.3.4"}, "", "10.1.1.1", false},
		{"untrusted peer: itself", lb, "192.0.2.7:5000", []string{"1.2.3.4"}, "", "192.0.2.7", true},
		{"trusted peer: rightmost untrusted", lb, "10.0.0.1:5000", []string{"6.6.6.6, 1.2.3.4"}, "", "1.2.3.4", true},
		{"chain of trusted proxies", lb, "10.0.0.1:5000", []string{"1.2.3.4", "10.0.0.9"}, "", "1.2.3.4", true},
		{"a client forges the left", lb, "10.0.0.1:5000", []string{"10.0.0.5, 198.51.100.1, 10.0.0.2"}, "", "198.51.100.1", true},
		{"garbage left of the proxies", lb, "10.0.0.1:5000", []string{"not-an-ip, 10.0.0.3"}, "", "10.0.0.3", true},
		{"IPv6 peer and ports", lb, "[::1]:7000", []string{"[2001:db8::17]:4711"}, "", "2001:db8::17", true},
		{"Forwarded when no X-Forwarded-For", lb, "10.0.0.1:5000", nil, `for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"`, "2001:db8:cafe::17", true},
		{"trusted, nothing forwarded", lb, "10.0.0.1:5000", nil, "", "10.0.0.1", true},
		{"v4-mapped peer", lb, "[::ffff:10.0.0.1]:5000", []string{"1.2.3.4"}, "", "1.2.3.4", true},
		// A proxy appends to one of the two headers and passes the other through: when both
		// name different clients, a client wrote one of them, and neither is believed.
		{"Forwarded-writing proxy, forged X-Forwarded-For", lb, "10.0.0.1:5000", []string{"198.51.100.9"}, "for=203.0.113.5", "", false},
		{"X-Forwarded-For-writing proxy, forged Forwarded", lb, "10.0.0.1:5000", []string{"203.0.113.5"}, "for=198.51.100.9", "", false},
		{"forged header naming a trusted proxy", lb, "10.0.0.1:5000", []string{"10.0.0.7"}, "for=203.0.113.5", "", false},
		{"both appended by the proxy", lb, "10.0.0.1:5000", []string{"6.6.6.6, 203.0.113.5"}, `for=203.0.113.5`, "203.0.113.5", true},
		{"a forger repeating its own address", lb, "10.0.0.1:5000", []string{"198.51.100.9, 203.0.113.5"}, `for="203.0.113.5:4711"`, "203.0.113.5", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tc.peer, Header: http.Header{}}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if tc.fwd != "" {
				r.Header.Set("Forwarded", tc.fwd)
			}
			c, known := tc.trust.clientOf(r)
			if c != tc.client || known != tc.known {
				t.Errorf("clientOf = %q %v, want %q %v", c, known, tc.client, tc.known)
			}
		})
	}
}

func FuzzClientOf(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "10.0.0.1, 1.2.3.4", "[::1]:1", "", ",,,", "for=x;by=y"} {
		f.Add(s, s)
	}
	lb := newTrust([]string{"10.0.0.0/8"})
	f.Fuzz(func(t *testing.T, xff, fwd string) {
		r := &http.Request{RemoteAddr: "10.0.0.1:1", Header: http.Header{"X-Forwarded-For": {xff}, "Forwarded": {fwd}}}
		c, known := lb.clientOf(r)
		if known == (c == "") || len(c) > 64 {
			t.Fatalf("clientOf(%q, %q) = %q %v", xff, fwd, c, known)
		}
	})
}

// TestPeerString: the client's address as netip formats it, taken from RemoteAddr when that
// holds it already (IPv4), formatted otherwise.
// FuzzPeerString: peerString is peer.String() for any RemoteAddr (the seeds, every go test,
// are the forms a listener, a proxy protocol or a test writes, and near misses).
func FuzzPeerString(f *testing.F) {
	for _, remote := range []string{"1.2.3.4:5678", "127.0.0.1:1", "[::1]:80", "[::ffff:10.0.0.1]:443", "[fe80::1%eth0]:9", "10.0.0.1", "junk", "",
		"1.2.3.4:junk", "01.2.3.4:5", "1.2.3.4%eth0:5", "::ffff:1.2.3.4", "1.2.3.4:", ":5", "1.2.3.4:5:6", "[1.2.3.4]:5", "1.2.3.4::5"} {
		f.Add(remote)
	}
	f.Fuzz(func(t *testing.T, remote string) {
		peer := peerAddr(remote)
		if got, want := peerString(remote, peer), peer.String(); got != want {
			t.Errorf("%q: %q, want %q", remote, got, want)
		}
	})
}

// TestPeerString: an IPv4 peer is the text RemoteAddr holds, without an allocation
// (FuzzPeerString holds every form to peer.String()).
func TestPeerString(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = peerString("192.168.1.20:443", peerAddr("192.168.1.20:443")) }); n != 0 {
		t.Errorf("%.0f allocations for an IPv4 peer", n)
	}
}
