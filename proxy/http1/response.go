package http1

import (
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicegw/sluice/proxy/httphead"
)

// bufferBeforeChunking is how much of an answer is held before its head is sent: an answer
// the handler ends within it gets a Content-Length (net/http's figure).
const bufferBeforeChunking = 2048

// sniffLen is how much of an answer sniffing a Content-Type reads (http.DetectContentType's).
const sniffLen = 512

// response is the http.ResponseWriter (and Flusher, and the deadlines
// http.ResponseController sets) of one request on a connection.
type response struct {
	c      *conn
	req    *http.Request
	header http.Header

	status     int
	wrote      bool   // the status is set
	head       []byte // the status line and the handler's headers, taken at WriteHeader
	sent       bool   // the head is written
	chunked    bool
	noBody     bool  // the status or the method has no body
	clen       int64 // the handler's Content-Length, -1 if none
	hasCT      bool
	hasDate    bool
	conn       []string // the handler's Connection values (written in the head unless it closes)
	written    int64
	buf        []byte // the answer's start, until the head is sent
	closeAfter bool
	err        error    // the first write error: every later write fails with it
	scratch    [18]byte // a chunk's size line
}

func (r *response) reset(c *conn, req *http.Request) {
	head, buf := r.head[:0], r.buf[:0]
	// The header map is the connection's, emptied for each request (a handler must not
	// use its ResponseWriter once it returned, as net/http's says): two allocations a
	// request fewer. One that grew past a small map's size is made anew: iterating a large
	// table costs its size however few headers it holds.
	h := r.header
	if h == nil || len(h) > smallHeader {
		h = make(http.Header, smallHeader)
	} else {
		clear(h)
	}
	*r = response{c: c, req: req, header: h, head: head, buf: buf, clen: -1, closeAfter: req.Close}
}

// smallHeader is the most headers a Go map holds in its small form (one group of 8 slots).
const smallHeader = 8

func (r *response) Header() http.Header { return r.header }

// WriteHeader takes the status and a snapshot of the headers, as net/http does. An
// informational status (1xx but 101) is written at once.
func (r *response) WriteHeader(code int) {
	if r.wrote {
		return
	}
	if code < 100 || code > 999 {
		code = http.StatusInternalServerError
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		r.informational(code)
		return
	}
	r.wrote, r.status = true, code
	r.noBody = code == http.StatusNoContent || code == http.StatusNotModified || r.req.Method == http.MethodHead
	r.head = appendStatus(r.head, code)
	r.head = r.appendHeaders(r.head)
}

func (r *response) informational(code int) {
	if r.err != nil {
		return
	}
	closeAfter := r.closeAfter
	b := appendStatus(nil, code)
	b = r.appendHeaders(b)
	b = appendConnection(b, r.conn)
	b = append(b, "\r\n"...)
	r.hasCT, r.hasDate, r.conn, r.clen, r.closeAfter = false, false, nil, -1, closeAfter
	if _, err := r.c.bw.Write(b); err != nil {
		r.fail(err)
		return
	}
	if err := r.c.bw.Flush(); err != nil {
		r.fail(err)
	}
}

func appendStatus(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if t := http.StatusText(code); t != "" {
		b = append(b, t...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(code), 10)
	}
	return append(b, "\r\n"...)
}

// appendHeaders writes the handler's headers, sorted, except the framing ones the server
// writes itself (Content-Length is kept to frame the answer, Transfer-Encoding dropped),
// with invalid names dropped and line breaks in values made spaces, as net/http does.
func (r *response) appendHeaders(b []byte) []byte {
	// The headers in name order (as net/http writes them), each with its values: one pass
	// over the map, no second lookup of each name.
	var arr [24]headerField
	fields := arr[:0]
	for k, vv := range r.header {
		fields = append(fields, headerField{k, vv})
	}
	sortFields(fields)
	for _, f := range fields {
		k, vv := f.k, f.vv
		switch k {
		case "Content-Length":
			if len(vv) > 0 {
				if n, err := strconv.ParseInt(strings.TrimSpace(vv[0]), 10, 64); err == nil && n >= 0 {
					r.clen = n
				}
			}
			continue
		case "Transfer-Encoding", "Trailer":
			continue
		case "Content-Type":
			r.hasCT = true
		case "Date":
			r.hasDate = true
		case "Connection":
			// Written with the framing: Connection: close replaces it when the server
			// closes after the answer, as net/http does.
			r.conn = vv
			if httphead.HasToken(vv, "close") {
				r.closeAfter = true
			}
			continue
		}
		if !httphead.ValidName(k) {
			continue
		}
		for _, v := range vv {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// headerField is a header's name and values.
type headerField struct {
	k  string
	vv []string
}

// sortFields sorts an answer's headers by name: by insertion, as slices.Sort does a short
// slice (an answer has a dozen headers or so), without a comparison function's calls.
func sortFields(f []headerField) {
	if len(f) > 32 {
		slices.SortFunc(f, func(a, b headerField) int { return strings.Compare(a.k, b.k) })
		return
	}
	for i := 1; i < len(f); i++ {
		for j := i; j > 0 && f[j].k < f[j-1].k; j-- {
			f[j], f[j-1] = f[j-1], f[j]
		}
	}
}

func appendConnection(b []byte, vv []string) []byte {
	for _, v := range vv {
		b = append(b, "Connection: "...)
		b = appendValue(b, v)
		b = append(b, "\r\n"...)
	}
	return b
}

func appendValue(b []byte, v string) []byte {
	v = textproto.TrimString(v)
	if strings.IndexByte(v, '\n') < 0 && strings.IndexByte(v, '\r') < 0 {
		return append(b, v...)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return b
}

func (r *response) Write(p []byte) (int, error) {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	switch {
	case r.err != nil:
		return 0, r.err
	case r.req.Method == http.MethodHead:
		r.written += int64(len(p)) // the length a GET would have, when it fits the buffer
		if !r.sent && len(r.buf) < sniffLen {
			r.buf = append(r.buf, p[:min(len(p), sniffLen-len(r.buf))]...) // to sniff, never written
		}
		return len(p), nil
	case r.noBody:
		return 0, http.ErrBodyNotAllowed
	case r.clen >= 0 && r.written+int64(len(p)) > r.clen:
		return 0, http.ErrContentLength
	}
	r.written += int64(len(p))
	if !r.sent {
		if len(r.buf)+len(p) <= bufferBeforeChunking {
			r.buf = append(r.buf, p...)
			return len(p), nil
		}
		if !r.hasCT && len(r.buf) < sniffLen {
			// The type is sniffed from the answer's first 512 bytes, as net/http does.
			k := min(len(p), sniffLen-len(r.buf))
			r.buf = append(r.buf, p[:k]...)
			p = p[k:]
		}
		r.sendHead(false)
		r.writeBody(r.buf)
		r.buf = r.buf[:0]
	}
	r.writeBody(p)
	if r.err != nil {
		return 0, r.err
	}
	return len(p), nil
}

// sendHead writes the head: the framing (the handler's Content-Length; else, when the
// handler is done, the length of what it wrote; else chunked), the sniffed Content-Type,
// Date and Connection: close when the server closes after this answer.
func (r *response) sendHead(final bool) {
	if r.sent {
		return
	}
	r.sent = true
	b := r.head
	switch {
	case r.noBody && r.req.Method != http.MethodHead, r.status < 200:
	case r.clen >= 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, r.clen, 10)
		b = append(b, "\r\n"...)
	case r.req.Method == http.MethodHead:
		if final && r.written > 0 && r.written <= bufferBeforeChunking {
			b = append(b, "Content-Length: "...)
			b = strconv.AppendInt(b, r.written, 10)
			b = append(b, "\r\n"...)
		}
	case final:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(r.buf)), 10)
		b = append(b, "\r\n"...)
	default:
		r.chunked = true
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if !r.hasCT && len(r.buf) > 0 && r.status != http.StatusNoContent && r.status != http.StatusNotModified {
		b = append(b, "Content-Type: "...)
		b = append(b, http.DetectContentType(r.buf)...)
		b = append(b, "\r\n"...)
	}
	if !r.hasDate {
		b = append(b, "Date: "...)
		b = append(b, r.c.srv.date(time.Now())...)
		b = append(b, "\r\n"...)
	}
	switch {
	case r.closeAfter:
		b = append(b, "Connection: close\r\n"...)
	case len(r.conn) > 0:
		b = appendConnection(b, r.conn)
	}
	b = append(b, "\r\n"...)
	r.head = b
	if r.err == nil {
		if _, err := r.c.bw.Write(b); err != nil {
			r.fail(err)
		}
	}
}

func (r *response) writeBody(p []byte) {
	if len(p) == 0 || r.err != nil || r.req.Method == http.MethodHead {
		return
	}
	bw := r.c.bw
	if r.chunked {
		h := strconv.AppendInt(r.scratch[:0], int64(len(p)), 16) // not on the stack: Write's argument escapes
		h = append(h, '\r', '\n')
		if _, err := bw.Write(h); err != nil {
			r.fail(err)
			return
		}
	}
	if _, err := bw.Write(p); err != nil {
		r.fail(err)
		return
	}
	if r.chunked {
		if _, err := bw.WriteString("\r\n"); err != nil {
			r.fail(err)
		}
	}
}

func (r *response) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.closeAfter = true
}

// Flush sends what the handler wrote so far.
func (r *response) Flush() { _ = r.FlushError() }

// FlushError is Flush with its error, for http.ResponseController.
func (r *response) FlushError() error {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	if !r.sent {
		r.sendHead(false)
		r.writeBody(r.buf)
		r.buf = r.buf[:0]
	}
	if r.err != nil {
		return r.err
	}
	if err := r.c.bw.Flush(); err != nil {
		r.fail(err)
	}
	return r.err
}

// SetReadDeadline and SetWriteDeadline are the connection's, for http.ResponseController
// (kept by alarms: up to alarm.Grain late).
func (r *response) SetReadDeadline(t time.Time) error  { return r.c.rd.Set(t) }
func (r *response) SetWriteDeadline(t time.Time) error { return r.c.wd.Set(t) }

// finish ends the answer after the handler returned: the head if not sent yet, the rest of
// the body, the last chunk, the flush. It reports whether the connection may serve another
// request; closing reports Connection: close when the head is still to be sent (the body
// left unread is too large to drop).
func (r *response) finish(closing bool) bool {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	if !r.sent {
		if closing || r.c.srv.closed.Load() {
			r.closeAfter = true
		}
		r.sendHead(true)
		r.writeBody(r.buf)
		r.buf = r.buf[:0]
	}
	if r.chunked && r.err == nil {
		if _, err := r.c.bw.WriteString("0\r\n\r\n"); err != nil {
			r.fail(err)
		}
	}
	if r.err == nil {
		if err := r.c.bw.Flush(); err != nil {
			r.fail(err)
		}
	}
	if r.clen >= 0 && r.written != r.clen && !r.noBody {
		r.closeAfter = true // the client cannot find the answer's end
	}
	if cap(r.buf) > 4*bufferBeforeChunking {
		r.buf = nil
	}
	if cap(r.head) > bufSize {
		r.head = nil
	}
	return !r.closeAfter && r.err == nil && !r.c.srv.closed.Load()
}
