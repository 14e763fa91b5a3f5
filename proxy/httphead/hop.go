package httphead

import (
	"net/http"
	"strings"
)

// hopByHop are the headers a proxy drops both ways (RFC 9110 §7.6.1, and the proxy
// credentials), with any the Connection header names.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// isHopByHop reports whether k is one of hopByHop: a switch, which the compiler makes a
// few comparisons by length and content, where a loop over the list is nine.
func isHopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// HopByHop lists the headers a proxy drops from a message whose Connection header has the
// values connection: the hop-by-hop ones and those the values name (canonical).
func HopByHop(connection ...string) []string {
	return append(named(connection), hopByHop...)
}

// named is the header names listed in Connection header values, canonical.
func named(connection []string) []string {
	var out []string
	for _, v := range connection {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, http.CanonicalHeaderKey(f))
			}
		}
	}
	return out
}

// CopyEndToEnd copies src into dst without the hop-by-hop headers (HopByHop of src's
// Connection), replacing what dst has under the same names.
func CopyEndToEnd(dst, src http.Header) { CopyEndToEndExcept(dst, src, nil) }

// CopyEndToEndExcept is CopyEndToEnd leaving out, besides, the headers skip reports (nil:
// none): one pass over src, where deleting them from dst afterwards looks each one up.
//
// A value list with no room to grow (its capacity its length: what Header reads for a name
// sent once or twice, and net/textproto's for a name sent once) is shared with src, not
// copied: an Add to either header copies it then. What this asks of the code that uses the
// headers: nothing writes a header's values in place, nor shortens a list and then appends
// to it (the append would write into the other header's): a list is replaced (Set, Del,
// Add on a full list) or resliced with its capacity cut too (vv[:1:1]). Any other list is
// copied, into one backing array for them all (each piece capped at its own end).
func CopyEndToEndExcept(dst, src http.Header, skip func(name string) bool) {
	conn := named(src["Connection"])
	var pool []string
next:
	for k, vs := range src {
		if isHopByHop(k) {
			continue
		}
		for _, h := range conn {
			if k == h {
				continue next
			}
		}
		if skip != nil && skip(k) {
			continue
		}
		if len(vs) == cap(vs) {
			dst[k] = vs
			continue
		}
		if pool == nil {
			pool = make([]string, 0, len(src))
		}
		start := len(pool)
		pool = append(pool, vs...)
		dst[k] = pool[start:len(pool):len(pool)]
	}
}
