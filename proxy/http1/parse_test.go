package http1

import (
	"bufio"
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicegw/sluice/proxy/httphead"
)

// The reference parseRequest must agree with: net/http's ReadRequest, then the checks that
// decided what this server served itself before it had its own parser.

// simple reports whether req is one this server serves (see the package doc).
func simple(req *http.Request) bool {
	if req.ProtoMajor != 1 || req.ProtoMinor != 1 || req.Method == http.MethodConnect || req.RequestURI == "*" ||
		len(req.TransferEncoding) > 0 || req.ContentLength < 0 || !httpguts.ValidHostHeader(req.Host) {
		return false
	}
	for k, vv := range req.Header {
		switch k {
		case "Expect", "Upgrade", "Transfer-Encoding", "Http2-Settings":
			return false
		}
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// hostLines counts the head's Host header lines (http.ReadRequest folds them into
// Request.Host; net/http's server refuses none, and more than one, with a 400).
func hostLines(head []byte) int {
	n := 0
	for i := bytes.IndexByte(head, '\n') + 1; i < len(head); {
		j := bytes.IndexByte(head[i:], '\n')
		if j < 0 {
			break
		}
		if line := head[i : i+j]; len(line) >= 5 && line[4] == ':' && strings.EqualFold(string(line[:4]), "host") {
			n++
		}
		i += j + 1
	}
	return n
}

// oracle is net/http's reading of head, nil when it refuses it or this server would not
// serve it.
func oracle(head []byte) *http.Request {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil || hostLines(head) != 1 || !simple(req) {
		return nil
	}
	return req
}

func sameRequest(a, b *http.Request) string {
	switch {
	case a.Method != b.Method:
		return "method"
	case a.URL.String() != b.URL.String() || a.URL.Path != b.URL.Path || a.URL.RawPath != b.URL.RawPath || a.URL.RawQuery != b.URL.RawQuery:
		return "url " + a.URL.String() + " vs " + b.URL.String()
	case a.RequestURI != b.RequestURI, a.Proto != b.Proto, a.Host != b.Host:
		return "request line or host"
	case a.ContentLength != b.ContentLength, a.Close != b.Close, len(a.TransferEncoding) != len(b.TransferEncoding):
		return "framing"
	case !reflect.DeepEqual(a.Header, b.Header):
		return "header"
	case (a.Body == http.NoBody) != (b.Body == http.NoBody):
		return "body"
	}
	return ""
}

// TestParseRequestServesRealClients: requests as the official SDKs, curl and proxies send
// them are read here (not handed off), as net/http reads them.
func TestParseRequestServesRealClients(t *testing.T) {
	for _, head := range []string{
		// openai-python (httpx): lowercase names
		"POST /v1/chat/completions HTTP/1.1\r\nhost: gw:8080\r\naccept-encoding: gzip, deflate\r\nconnection: keep-alive\r\naccept: application/json\r\ncontent-type: application/json\r\nuser-agent: OpenAI/Python 1.54.0\r\nx-stainless-lang: python\r\nx-stainless-package-version: 1.54.0\r\nx-stainless-os: Linux\r\nx-stainless-arch: x64\r\nx-stainless-runtime: CPython\r\nx-stainless-runtime-version: 3.12.3\r\nauthorization: Bearer sk-x\r\nx-stainless-async: false\r\nx-stainless-retry-count: 0\r\ncontent-length: 95\r\n\r\n",
		// openai-go
		"POST /v1/chat/completions?api-version=2024-06-01 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: OpenAI/Go 1.8.2\r\nContent-Length: 120\r\nAccept: application/json\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nIdempotency-Key: stainless-go-retry-1\r\nX-Stainless-Retry-Count: 0\r\nX-Stainless-Timeout: 600\r\nAccept-Encoding: gzip\r\n\r\n",
		// curl, behind a proxy that adds its headers
		"GET /v1/models HTTP/1.1\r\nHost: gw\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\nX-Forwarded-For: 10.0.0.1, 10.0.0.2\r\nX-Forwarded-Proto: https\r\nX-Request-Id: abc\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\r\n",
		// escaped path, repeated header, empty query
		"GET /v1/models/meta-llama%2FLlama-3.1-8B? HTTP/1.1\r\nHost: gw\r\nX-A: 1\r\nx-a: 2\r\nConnection: close\r\n\r\n",
	} {
		mine, want := parsed([]byte(head)), oracle([]byte(head))
		if mine == nil || want == nil {
			t.Fatalf("not served here (mine %v, net/http %v):\n%s", mine != nil, want != nil, head)
		}
		if d := sameRequest(mine, want); d != "" {
			t.Fatalf("%s differs from net/http's:\n%s\nmine %+v\nnet/http %+v", d, head, mine, want)
		}
	}
}

// FuzzParseRequestAgrees: any head parseRequest serves, net/http reads the same way (and
// this server would have served with net/http's reading).
func FuzzParseRequestAgrees(f *testing.F) {
	f.Add([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n"))
	f.Add([]byte("GET /a%20b?x=%zz HTTP/1.1\nhost: h\nconnection: Close\ncontent-length: 03\ncontent-length: 3\n\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"))
	f.Add([]byte("GET //x HTTP/1.1\r\nHost: a\r\nX : y\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, _ := httphead.End(b, 0)
		if n == 0 {
			return
		}
		head := b[:n]
		mine := parsed(head)
		if mine == nil {
			return
		}
		want := oracle(head)
		if want == nil {
			t.Fatalf("served %q, which net/http's reading would not", head)
		}
		if d := sameRequest(mine, want); d != "" {
			t.Fatalf("%s differs on %q:\nmine %+v\nnet/http %+v", d, head, mine, want)
		}
	})
}

// parsed is parseRequest into a request of its own; nil when it does not serve head.
func parsed(head []byte) *http.Request {
	var req http.Request
	if !parseRequest(&req, head) {
		return nil
	}
	return &req
}
