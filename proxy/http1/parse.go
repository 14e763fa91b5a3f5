package http1

import (
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicegw/sluice/proxy/httphead"
)

// parseRequest reads a request head (its blank line included) into req, as the http.Request
// that http.ReadRequest makes of it, for the requests this server serves (see simple), or
// returns false for anything else, which the fallback then reads with net/http's parser.
// Every string of the request is a piece of one copy of the head: a request costs a few
// allocations, not one per header (FuzzParseRequestAgrees holds it to net/http's); req is
// the caller's (the connection's), which hands the handler a copy with its context.
func parseRequest(req *http.Request, head []byte) bool {
	s := string(head)
	line, rest, ok := httphead.Line(s)
	if !ok {
		return false
	}
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !validMethod(method) || method == http.MethodConnect || method == "PRI" {
		return false
	}
	u := requestURL(target)
	if u == nil {
		return false
	}
	h, seen, ok := httphead.Header(rest, commonKeys)
	if !ok || seen&refused != 0 {
		return false
	}
	hosts := h["Host"]
	if len(hosts) != 1 || !httpguts.ValidHostHeader(hosts[0]) {
		return false
	}
	delete(h, "Host")
	cl := int64(-1)
	if seen&httphead.NameContentLength != 0 {
		if cl, ok = httphead.OneContentLength(h); !ok {
			return false
		}
	}
	*req = http.Request{
		Method: method, URL: u, Proto: proto, ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Host: hosts[0], RequestURI: target, ContentLength: max(cl, 0),
		Close: seen&httphead.NameConnection != 0 && httphead.HasToken(h["Connection"], "close"),
	}
	if cl <= 0 {
		req.Body = http.NoBody // else the server's reader of the body
	}
	return true
}

// refused are the header names of requests the own server leaves to net/http's (which
// answers or serves them as it does): a body framed otherwise than by its length, an
// expectation, a protocol switch, and the old or rare ones.
const refused = httphead.NameTransferEncoding | httphead.NameExpect | httphead.NameUpgrade |
	httphead.NameHTTP2Settings | httphead.NamePragma | httphead.NameTE | httphead.NameTrailer

// requestURL is the URL of an origin-form request target ("/path?query"), nil for any
// other form and for bytes net/url or net/http would refuse.
func requestURL(target string) *url.URL {
	if target == "" || target[0] != '/' || strings.HasPrefix(target, "//") {
		return nil
	}
	for i := 0; i < len(target); i++ {
		if c := target[i]; c <= ' ' || c >= 0x7f || c == '#' {
			return nil
		}
	}
	path, query, _ := strings.Cut(target, "?")
	if !plainPath(path) {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return nil
		}
		return u
	}
	return &url.URL{Path: path, RawQuery: query, ForceQuery: query == "" && strings.HasSuffix(target, "?")}
}

// plainPath reports whether path is made of bytes net/url never escapes (letters, digits,
// "-._~/"): its URL is then built directly, as net/url would build it.
func plainPath(path string) bool {
	for i := 0; i < len(path); i++ {
		switch c := path[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~', c == '/':
		default:
			return false
		}
	}
	return true
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !httpguts.IsTokenRune(rune(m[i])) {
			return false
		}
	}
	return true
}

// commonKeys are header names clients send in every request: a lowercase one (HTTP/2-minded
// clients such as the OpenAI SDKs send them so) costs no allocation.
var commonKeys = httphead.Common(
	"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control", "Connection",
	"Content-Length", "Content-Type", "Cookie", "Forwarded", "Host", "Idempotency-Key", "Openai-Organization",
	"Openai-Project", "Origin", "Referer", "Traceparent", "Tracestate", "User-Agent", "X-Api-Key",
	"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id",
	"X-Stainless-Arch", "X-Stainless-Async", "X-Stainless-Lang", "X-Stainless-Os", "X-Stainless-Package-Version",
	"X-Stainless-Retry-Count", "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Timeout",
	"X-Stainless-Read-Timeout", "Baggage",
)
