package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strings"

	"github.com/sluicegw/sluice/proxy/httphead"
)

// commonResponseKeys are header names model servers send in answers (uvicorn, which serves
// vLLM and SGLang, sends them lowercase): they cost no allocation.
var commonResponseKeys = httphead.Common(
	"Cache-Control", "Connection", "Content-Encoding", "Content-Length", "Content-Type", "Date",
	"Keep-Alive", "Retry-After", "Server", "Transfer-Encoding", "Vary", "X-Accel-Buffering",
	"X-Request-Id", "Openai-Processing-Ms", "Openai-Version", "Openai-Model", "Openai-Organization",
	"X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Requests",
	"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens",
)

// readResponse reads the next answer's head from br: itself when the head is in br's buffer
// and of the shapes model servers send (HTTP/1.1, a valid status, a Content-Length or
// chunked, no declared trailers), else with http.ReadResponse, which then reads the same
// bytes (nothing is consumed before the head is known good). Its answer is the one
// http.ReadResponse gives for the same bytes, body framing included (FuzzReadResponseAgrees).
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if resp, n := fastResponse(br, req); resp != nil {
		_, _ = br.Discard(n)
		return resp, nil
	}
	return http.ReadResponse(br, req)
}

// fastResponse parses the head at the start of br's buffer, reading more into the buffer
// while the head is incomplete; nil when it is not one readResponse reads itself (a read
// error too: http.ReadResponse meets the same error and reports it as it does).
func fastResponse(br *bufio.Reader, req *http.Request) (*http.Response, int) {
	head, _ := httphead.Peek(br)
	if head == nil {
		return nil, 0
	}
	return parseResponse(head, br, req), len(head)
}

func parseResponse(head []byte, br *bufio.Reader, req *http.Request) *http.Response {
	s := string(head)
	line, rest, ok := httphead.Line(s)
	if !ok {
		return nil
	}
	proto, status, ok := strings.Cut(line, " ")
	status = strings.TrimLeft(status, " ")
	if !ok || proto != "HTTP/1.1" || len(status) < 3 || (len(status) > 3 && status[3] != ' ') {
		return nil
	}
	code := 0
	for i := 0; i < 3; i++ {
		c := status[i]
		if c < '0' || c > '9' {
			return nil
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 {
		return nil // 1xx (rare): net/http's reading
	}
	h, seen, ok := httphead.Header(rest, commonResponseKeys)
	if !ok || seen&httphead.NameTrailer != 0 {
		return nil
	}
	a := &answer{resp: http.Response{
		Status: status, StatusCode: code, Proto: proto, ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Request: req, ContentLength: -1,
	}}
	resp := &a.resp
	chunked := seen&httphead.NameTransferEncoding != 0
	if chunked {
		if te := h["Transfer-Encoding"]; len(te) != 1 || !strings.EqualFold(te[0], "chunked") {
			return nil
		}
	}
	cl := int64(-1)
	if seen&httphead.NameContentLength != 0 {
		if cl, ok = httphead.OneContentLength(h); !ok || chunked {
			return nil
		}
	}
	if seen&httphead.NameConnection != 0 && httphead.HasToken(h["Connection"], "close") {
		resp.Close = true
		delete(h, "Connection")
	}
	noBody := code == http.StatusNoContent || code == http.StatusNotModified
	switch {
	case req != nil && req.Method == http.MethodHead:
		if chunked {
			return nil
		}
		resp.ContentLength = cl
		resp.Body = http.NoBody
	case noBody && (chunked || cl >= 0):
		return nil // framing headers on an answer without a body: net/http's reading keeps them
	case noBody:
		resp.ContentLength = 0
		resp.Body = http.NoBody
	case chunked:
		delete(h, "Transfer-Encoding")
		resp.TransferEncoding = []string{"chunked"}
		resp.Body = &chunkedBody{br: br, cr: httputil.NewChunkedReader(br)}
	case cl == 0:
		resp.ContentLength = 0
		resp.Body = http.NoBody
	case cl > 0:
		resp.ContentLength = cl
		a.body = lengthBody{httphead.Body{R: br, N: cl}}
		resp.Body = &a.body
	default:
		return nil // delimited by the connection's end: net/http's reader handles it
	}
	return resp
}

// answer is an answer's head and, when its length is known, its body: one allocation.
type answer struct {
	resp http.Response
	body lengthBody
}

// lengthBody is an answer's body of known length.
type lengthBody struct{ httphead.Body }

func (b *lengthBody) Close() error { return nil }

// chunkedBody is a chunked answer's body: its chunks, then its trailer section read and
// dropped, so that the connection is at the next answer.
type chunkedBody struct {
	br  *bufio.Reader
	cr  io.Reader
	err error
}

var errTrailerTooLarge = errors.New("upstream: chunked trailer too large")

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.cr.Read(p)
	if err == io.EOF {
		err = b.trailer()
		if err == nil {
			err = io.EOF
		}
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

// trailer reads the lines after the last chunk up to the blank one.
func (b *chunkedBody) trailer() error {
	buf, _ := b.br.Peek(2)
	switch {
	case len(buf) == 2 && buf[0] == '\r' && buf[1] == '\n':
		_, _ = b.br.Discard(2) // no trailer: the common case
		return nil
	case len(buf) < 2:
		return io.ErrUnexpectedEOF // as net/http reads it
	case !upcomingDoubleCRLF(b.br):
		return errTrailerTooLarge // net/http too wants the trailer's end within the buffer
	}
	// A trailer (rare): read and dropped with the reader net/http reads it with.
	if _, err := textproto.NewReader(b.br).ReadMIMEHeader(); err != nil {
		return fmt.Errorf("upstream: chunked trailer: %w", err)
	}
	return nil
}

// upcomingDoubleCRLF reports whether br's next bytes, within its buffer, end with a CRLF
// CRLF (net/http's test before it reads a trailer).
func upcomingDoubleCRLF(br *bufio.Reader) bool {
	for n := 4; n <= br.Size(); n++ {
		buf, err := br.Peek(n)
		if bytes.HasSuffix(buf, []byte("\r\n\r\n")) {
			return true
		}
		if err != nil {
			return false
		}
	}
	return false
}
func (b *chunkedBody) Close() error { return nil }
