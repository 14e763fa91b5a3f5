// Package httphead reads the header lines of an HTTP/1.1 head the way net/textproto does for
// the heads it accepts, with every string a piece of one copy of the head: the gateway's own
// server (proxy/http1) and upstream client (proxy/upstream) read requests and answers with
// it, and hand anything it refuses to net/http's readers.
package httphead

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// End is the length of the head at the start of b (its blank line included), or 0 and the
// offset scanning can resume at once more bytes arrived.
func End(b []byte, from int) (n, resume int) {
	for i := from; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0, i
		}
		if j == 0 || (j == 1 && b[i] == '\r') {
			return i + j + 1, 0
		}
		i += j + 1
	}
}

// Peek reads ahead in br, without consuming anything, until br's buffer holds a whole head
// at its start: the head (its blank line included), or nil with a nil error when the head
// does not fit in the buffer, or nil and the read's error when the connection failed first.
func Peek(br *bufio.Reader) ([]byte, error) {
	scanned := 0
	for {
		buf, _ := br.Peek(br.Buffered())
		n, more := End(buf, scanned)
		if n > 0 {
			return buf[:n], nil
		}
		scanned = more
		if br.Buffered() >= br.Size() {
			return nil, nil
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil, err
		}
	}
}

// Line cuts the first line (without its CRLF or LF) off s; ok is false when s holds no
// whole line or the line holds a bare CR (which net/http refuses).
func Line(s string) (line, rest string, ok bool) {
	i := strings.IndexByte(s, '\n')
	if i < 0 {
		return "", "", false
	}
	line, rest = strings.TrimSuffix(s[:i], "\r"), s[i+1:]
	if strings.IndexByte(line, '\r') >= 0 {
		return "", "", false
	}
	return line, rest, true
}

// Names is a set of the header names an HTTP/1.1 reader frames a message by, or refuses: Header
// reports those it read, so that its callers look up only the ones present.
type Names uint16

// The names of Names.
const (
	NameHost Names = 1 << iota
	NameContentLength
	NameTransferEncoding
	NameConnection
	NameTrailer
	NameExpect
	NameUpgrade
	NameHTTP2Settings
	NamePragma
	NameTE
)

// nameOf is the Names bit of a canonical header name, 0 for any other.
func nameOf(k string) Names {
	switch len(k) {
	case 2:
		if k == "Te" {
			return NameTE
		}
	case 4:
		if k == "Host" {
			return NameHost
		}
	case 6:
		switch k {
		case "Expect":
			return NameExpect
		case "Pragma":
			return NamePragma
		}
	case 7:
		switch k {
		case "Trailer":
			return NameTrailer
		case "Upgrade":
			return NameUpgrade
		}
	case 10:
		if k == "Connection" {
			return NameConnection
		}
	case 14:
		switch k {
		case "Content-Length":
			return NameContentLength
		case "Http2-Settings":
			return NameHTTP2Settings
		}
	case 17:
		if k == "Transfer-Encoding" {
			return NameTransferEncoding
		}
	}
	return 0
}

// Header reads the header lines of s up to its blank line. ok is false for anything
// net/textproto would refuse or read otherwise: a line that is not "Name: value" with a
// valid name and value, a folded line, a bare CR, no blank line. Names are canonical
// (common ones, in any case, without an allocation). seen has the framing names among them.
func Header(s string, common map[string]string) (h http.Header, seen Names, ok bool) {
	n := strings.Count(s, "\n")
	h = make(http.Header, n)
	// Each value is a one-element piece of vals, and each name goes in the map without a
	// lookup first: a name seen before shows as a map that did not grow. Its values so far
	// are then gathered from keys (names repeat rarely: once per head, then a lookup each).
	vals := make([]string, 0, n)
	var kb [24]string
	keys := kb[:0]
	repeated := false
	for {
		line, rest, ok := Line(s)
		if !ok {
			return nil, 0, false
		}
		if line == "" {
			return h, seen, true
		}
		s = rest
		colon := strings.IndexByte(line, ':')
		if colon <= 0 {
			return nil, 0, false
		}
		key, value := line[:colon], textproto.TrimString(line[colon+1:])
		if !ValidValue(value) {
			return nil, 0, false
		}
		if !canonical(key) { // a canonical name is a valid one, as most clients send them
			if !ValidName(key) {
				return nil, 0, false // includes a folded line (leading white space) and "Name :"
			}
			key = recase(key, common)
		}
		seen |= nameOf(key)
		vals = append(vals, value)
		one := vals[len(vals)-1 : len(vals) : len(vals)]
		if repeated {
			if old := h[key]; old != nil {
				one = append(old, value)
			}
			h[key] = one
			continue
		}
		before := len(h)
		h[key] = one
		if len(h) == before {
			repeated = true
			var all []string
			for i, k := range keys {
				if k == key {
					all = append(all, vals[i])
				}
			}
			h[key] = append(all, value)
			continue
		}
		keys = append(keys, key)
	}
}

// Common is a table for CanonicalKey: the lowercase form of each canonical name.
func Common(names ...string) map[string]string {
	m := make(map[string]string, len(names))
	for _, k := range names {
		m[strings.ToLower(k)] = k
	}
	return m
}

// CanonicalKey is textproto.CanonicalMIMEHeaderKey, without allocating for a name of
// common in any case.
func CanonicalKey(k string, common map[string]string) string {
	if canonical(k) {
		return k // as most clients send names: no lookup
	}
	return recase(k, common)
}

// recase is CanonicalKey for a k that is not canonical.
func recase(k string, common map[string]string) string {
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
		if c, ok := common[string(low)]; ok {
			return c
		}
	}
	return textproto.CanonicalMIMEHeaderKey(k) // no allocation when k is canonical already
}

// canonical reports whether k is a token in canonical form (upper case first and after each
// hyphen, lower case elsewhere), as textproto.CanonicalMIMEHeaderKey would return it: one
// table lookup a byte (nameByte).
func canonical(k string) bool {
	if k == "" {
		return false
	}
	mask := uint8(badFirst)
	for i := 0; i < len(k); i++ {
		t := nameByte[k[i]]
		if t&mask != 0 {
			return false
		}
		mask = t >> 4
	}
	return true
}

// ValidName reports whether k is a valid header field name (a token), as
// httpguts.ValidHeaderFieldName does, a byte at a time.
func ValidName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if nameByte[k[i]]&badAny != 0 {
			return false
		}
	}
	return true
}

// nameByte classifies the bytes of a header name: badFirst, badInside (a byte that may not
// stand first in a hyphen-separated word of a canonical name, or elsewhere in one), badAny
// (not a token byte), and in the high nibble the mask for the next byte (badFirst after a
// hyphen, badInside after anything else).
const (
	badFirst  = 1 << 0
	badInside = 1 << 1
	badAny    = 1 << 2
)

var nameByte = func() (t [256]uint8) {
	for c := range t {
		var v uint8
		switch {
		case !httpguts.IsTokenRune(rune(c)):
			v = badFirst | badInside | badAny
		case 'a' <= c && c <= 'z':
			v = badFirst
		case 'A' <= c && c <= 'Z':
			v = badInside
		}
		next := uint8(badInside)
		if c == '-' {
			next = badFirst
		}
		t[c] = v | next<<4
	}
	return t
}()

// HasToken reports whether a comma-separated header value list holds token (case-folded).
func HasToken(vv []string, token string) bool {
	for _, v := range vv {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// ContentLength is a message's Content-Length: -1 without the header; ok is false for
// values net/http refuses (not digits, differing duplicates).
func ContentLength(vv []string) (n int64, ok bool) {
	if len(vv) == 0 {
		return -1, true
	}
	first := textproto.TrimString(vv[0])
	for _, v := range vv[1:] {
		if textproto.TrimString(v) != first {
			return 0, false
		}
	}
	if first == "" || len(first) > 18 {
		return 0, false
	}
	for i := 0; i < len(first); i++ {
		if c := first[i]; c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(first[i]-'0')
	}
	return n, true
}

// OneContentLength is the length h's Content-Length values state (ContentLength), and keeps
// one of identical duplicates, as net/http does: with no room to grow, so that a header that
// shares it (CopyEndToEnd) is never written through.
func OneContentLength(h http.Header) (n int64, ok bool) {
	vv := h["Content-Length"]
	if n, ok = ContentLength(vv); ok && len(vv) > 1 {
		h["Content-Length"] = vv[:1:1]
	}
	return n, ok
}

// Body reads a message body of known length from R: N bytes, then io.EOF (with the last
// bytes); io.ErrUnexpectedEOF when R ends first. An error sticks.
type Body struct {
	R   io.Reader
	N   int64 // bytes still to read
	Err error
}

func (b *Body) Read(p []byte) (int, error) {
	if b.Err != nil {
		return 0, b.Err
	}
	if b.N <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.N {
		p = p[:b.N]
	}
	n, err := b.R.Read(p)
	b.N -= int64(n)
	switch {
	case b.N == 0:
		return n, io.EOF
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.Err = err
	}
	return n, err
}

// Get is h.Get(key) for a key in canonical form (a name the caller spells canonically, as
// every name in a header this package or net/http parsed is): one map lookup, where
// http.Header.Get canonicalizes the key first on every call.
func Get(h http.Header, key string) string {
	if vv := h[key]; len(vv) > 0 {
		return vv[0]
	}
	return ""
}

// Set is h.Set(key, value) for a key in canonical form.
func Set(h http.Header, key, value string) { h[key] = []string{value} }
