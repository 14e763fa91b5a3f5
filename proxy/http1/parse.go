package http1

import (
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// parseRequest reads a request head (its blank line included) into the http.Request that
// http.ReadRequest makes of it, for the requests this server serves (see simple), or
// returns nil for anything else, which the fallback then reads with net/http's parser.
// Every string of the request is a piece of one copy of the head: a request costs a few
// allocations, not one per header (FuzzParseRequestAgrees holds it to net/http's).
func parseRequest(head []byte) *http.Request {
	s := string(head)
	line, rest, ok := nextLine(s)
	if !ok {
		return nil
	}
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !validMethod(method) || method == http.MethodConnect || method == "PRI" {
		return nil
	}
	u := requestURL(target)
	if u == nil {
		return nil
	}
	n := strings.Count(rest, "\n")
	h := make(http.Header, n)
	vals := make([]string, 0, n)
	host, hosts := "", 0
	for {
		if line, rest, ok = nextLine(rest); !ok {
			return nil
		}
		if line == "" {
			break
		}
		colon := strings.IndexByte(line, ':')
		if colon <= 0 {
			return nil
		}
		key, value := line[:colon], textproto.TrimString(line[colon+1:])
		if !httpguts.ValidHeaderFieldName(key) || !httpguts.ValidHeaderFieldValue(value) {
			return nil // includes obs-fold (a line starting with white space) and "Name :"
		}
		key = canonicalKey(key)
		switch key {
		case "Host":
			host, hosts = value, hosts+1
			continue
		case "Transfer-Encoding", "Expect", "Upgrade", "Http2-Settings", "Pragma", "Te", "Trailer":
			return nil
		}
		if old := h[key]; old == nil {
			vals = append(vals, value)
			h[key] = vals[len(vals)-1 : len(vals) : len(vals)]
		} else {
			h[key] = append(old, value)
		}
	}
	if hosts != 1 || !httpguts.ValidHostHeader(host) {
		return nil
	}
	cl, ok := contentLength(h["Content-Length"])
	if !ok {
		return nil
	}
	req := &http.Request{
		Method: method, URL: u, Proto: proto, ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Host: host, RequestURI: target, ContentLength: cl,
		Close: hasToken(h["Connection"], "close"),
	}
	if cl == 0 {
		req.Body = http.NoBody // else the server's reader of the body
	}
	return req
}

// nextLine cuts the first line (without its CRLF or LF) off s.
func nextLine(s string) (line, rest string, ok bool) {
	i := strings.IndexByte(s, '\n')
	if i < 0 {
		return "", "", false
	}
	line, rest = strings.TrimSuffix(s[:i], "\r"), s[i+1:]
	if strings.IndexByte(line, '\r') >= 0 {
		return "", "", false // a bare CR: net/http refuses it
	}
	return line, rest, true
}

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

// contentLength is the request's body length: 0 without the header; ok is false for
// values net/http refuses (not digits, differing duplicates).
func contentLength(vv []string) (int64, bool) {
	if len(vv) == 0 {
		return 0, true
	}
	first := textproto.TrimString(vv[0])
	for _, v := range vv[1:] {
		if textproto.TrimString(v) != first {
			return 0, false
		}
	}
	if first == "" || first[0] < '0' || first[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseUint(first, 10, 63)
	if err != nil {
		return 0, false
	}
	return int64(n), true
}

// commonKeys are header names clients send in every request, canonical: a lowercase one
// (HTTP/2-minded clients such as the OpenAI SDKs send them so) costs no allocation.
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control", "Connection",
		"Content-Length", "Content-Type", "Cookie", "Forwarded", "Host", "Idempotency-Key", "Openai-Organization",
		"Openai-Project", "Origin", "Referer", "Traceparent", "Tracestate", "User-Agent", "X-Api-Key",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id",
		"X-Stainless-Arch", "X-Stainless-Async", "X-Stainless-Lang", "X-Stainless-Os", "X-Stainless-Package-Version",
		"X-Stainless-Retry-Count", "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Timeout",
		"X-Stainless-Read-Timeout", "Baggage",
	} {
		m[strings.ToLower(k)] = k
	}
	return m
}()

// canonicalKey is textproto.CanonicalMIMEHeaderKey, without allocating for a common name
// in any case.
func canonicalKey(k string) string {
	if len(k) <= 32 {
		var buf [32]byte
		low := buf[:len(k)]
		for i := 0; i < len(k); i++ {
			b := k[i]
			if 'A' <= b && b <= 'Z' {
				b += 'a' - 'A'
			}
			low[i] = b
		}
		if common, ok := commonKeys[string(low)]; ok {
			return common
		}
	}
	return textproto.CanonicalMIMEHeaderKey(k) // no allocation when k is canonical already
}
