package httphead

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/textproto"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"golang.org/x/net/http/httpguts"
)

func TestHeader(t *testing.T) {
	common := Common("Content-Type", "X-Request-Id")
	for _, tc := range []struct {
		in   string
		want http.Header
		ok   bool
	}{
		{"content-type: a/b\r\nx-request-id:  7 \r\nX-Other: 1\r\nx-other: 2\r\n\r\n",
			http.Header{"Content-Type": {"a/b"}, "X-Request-Id": {"7"}, "X-Other": {"1", "2"}}, true},
		{"A: 1\nB: 2\n\n", http.Header{"A": {"1"}, "B": {"2"}}, true},
		{"\r\n", http.Header{}, true},
		{"A: 1\r\n folded\r\n\r\n", nil, false},
		{"A : 1\r\n\r\n", nil, false},
		{"A: 1\rB: 2\r\n\r\n", nil, false},
		{"A: \x01\r\n\r\n", nil, false},
		{"A: 1\r\n", nil, false}, // no blank line
		{"NoColon\r\n\r\n", nil, false},
	} {
		h, _, ok := Header(tc.in, common)
		if ok != tc.ok || (ok && !reflect.DeepEqual(h, tc.want)) {
			t.Errorf("Header(%q) = %v, %v; want %v, %v", tc.in, h, ok, tc.want, tc.ok)
		}
	}
}

// TestHeaderRepeats: a name that comes again, at any place and any number of times, has all
// its values in order; the names around it keep theirs (Header puts a name in the map without
// a lookup first, and gathers a repeated name's values when the map does not grow).
func TestHeaderRepeats(t *testing.T) {
	var many strings.Builder
	want := http.Header{}
	for i := range 40 { // more names than Header's list on its stack holds
		k := fmt.Sprintf("X-N%d", i)
		fmt.Fprintf(&many, "%s: %d\r\n", k, i)
		want[k] = []string{strconv.Itoa(i)}
	}
	for _, tc := range []struct {
		name string
		in   string
		want http.Header
	}{
		{"first and last", "A: 1\r\nB: 2\r\nC: 3\r\nA: 4\r\n\r\n", http.Header{"A": {"1", "4"}, "B": {"2"}, "C": {"3"}}},
		{"three times", "A: 1\r\nA: 2\r\nB: x\r\nA: 3\r\n\r\n", http.Header{"A": {"1", "2", "3"}, "B": {"x"}}},
		{"two names repeated", "A: 1\r\nB: 1\r\nA: 2\r\nB: 2\r\nC: 1\r\nB: 3\r\n\r\n",
			http.Header{"A": {"1", "2"}, "B": {"1", "2", "3"}, "C": {"1"}}},
		{"in any case", "x-a: 1\r\nX-A: 2\r\nx-A: 3\r\n\r\n", http.Header{"X-A": {"1", "2", "3"}}},
		{"after many", many.String() + "X-N0: again\r\nX-N39: again\r\nX-New: 1\r\nX-N39: more\r\n\r\n",
			func() http.Header {
				h := maps.Clone(want)
				h["X-N0"] = []string{"0", "again"}
				h["X-N39"] = []string{"39", "again", "more"}
				h["X-New"] = []string{"1"}
				return h
			}()},
	} {
		h, _, ok := Header(tc.in, nil)
		if !ok || !reflect.DeepEqual(h, tc.want) {
			t.Errorf("%s: Header = %v, %v; want %v", tc.name, h, ok, tc.want)
		}
		// A value list shared with another name's would be written by an Add to either.
		for k, vv := range h {
			h[k] = append(vv, "added")
		}
		for k, vv := range h {
			if n := len(vv); n == 0 || vv[n-1] != "added" || slices.Index(vv, "added") != n-1 {
				t.Errorf("%s: %s = %q after an append to each name", tc.name, k, vv)
			}
		}
	}
}

// TestHeaderNames: Header tells the framing names it read, in any case, and no others.
func TestHeaderNames(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Names
	}{
		{"Content-Type: a\r\n\r\n", 0},
		{"host: h\r\ncontent-length: 3\r\n\r\n", NameHost | NameContentLength},
		{"Transfer-Encoding: chunked\r\nConnection: close\r\nTrailer: X\r\n\r\n", NameTransferEncoding | NameConnection | NameTrailer},
		{"TE: trailers\r\nExpect: 100-continue\r\nUPGRADE: h2c\r\nHTTP2-Settings: x\r\nPragma: no-cache\r\n\r\n",
			NameTE | NameExpect | NameUpgrade | NameHTTP2Settings | NamePragma},
		{"Hosts: h\r\nContent-Lengths: 1\r\nTe-X: 1\r\nX-Connection: 1\r\n\r\n", 0},
	} {
		if _, got, ok := Header(tc.in, nil); !ok || got != tc.want {
			t.Errorf("Header(%q) names = %b, %v; want %b", tc.in, got, ok, tc.want)
		}
	}
}

func TestContentLength(t *testing.T) {
	for _, tc := range []struct {
		vv   []string
		n    int64
		okay bool
	}{
		{nil, -1, true}, {[]string{"0"}, 0, true}, {[]string{"12"}, 12, true}, {[]string{"12", "12"}, 12, true},
		{[]string{"12", "13"}, 0, false}, {[]string{"+1"}, 0, false}, {[]string{"-1"}, 0, false}, {[]string{""}, 0, false},
		{[]string{"1 2"}, 0, false}, {[]string{"9999999999999999999"}, 0, false},
	} {
		if n, ok := ContentLength(tc.vv); n != tc.n && ok || ok != tc.okay {
			t.Errorf("ContentLength(%q) = %d, %v; want %d, %v", tc.vv, n, ok, tc.n, tc.okay)
		}
	}
}

func TestEnd(t *testing.T) {
	head := []byte("GET / HTTP/1.1\r\nHost: h\r\n\r\nbody")
	if n, _ := End(head, 0); n != len(head)-4 {
		t.Fatalf("End = %d", n)
	}
	part := []byte("GET / HTTP/1.1\r\nHo")
	n, resume := End(part, 0)
	if n != 0 || resume != len("GET / HTTP/1.1\r\n") {
		t.Fatalf("End(partial) = %d, %d", n, resume)
	}
}

func TestBody(t *testing.T) {
	b := &Body{R: iotest.OneByteReader(strings.NewReader("hello, and more")), N: 5}
	got, err := io.ReadAll(b)
	if string(got) != "hello" || err != nil {
		t.Fatalf("read %q, %v", got, err)
	}
	short := &Body{R: strings.NewReader("hi"), N: 5}
	if _, err := io.ReadAll(short); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	if _, err := short.Read(make([]byte, 1)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("the error does not stick: %v", err)
	}
}

// FuzzHeader: a header Header accepts is the one net/textproto reads from the same lines.
func FuzzHeader(f *testing.F) {
	f.Add("Content-Type: a\r\nx-a: 1\r\nX-A: 2\r\n\r\n")
	f.Add("A: 1\r\n b\r\n\r\n")
	f.Add("A: 1\r\nB: 2\r\nA: 3\r\nB: 4\r\nA: 5\r\n\r\n")
	f.Add("Host: h\r\nTE: x\r\ncontent-length: 1\r\n\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		h, seen, ok := Header(s, Common("Content-Type"))
		if !ok {
			return
		}
		var names Names
		for k := range h {
			names |= nameOf(k)
		}
		if seen != names {
			t.Fatalf("%q: names %b, of the map's %b", s, seen, names)
		}
		want, err := textproto.NewReader(bufio.NewReader(strings.NewReader(s))).ReadMIMEHeader()
		if err != nil {
			t.Fatalf("accepted %q; textproto refuses it: %v", s, err)
		}
		if !reflect.DeepEqual(h, http.Header(want)) {
			t.Fatalf("%q: %v, textproto %v", s, h, want)
		}
	})
}

// FuzzCanonicalKey: CanonicalKey is textproto.CanonicalMIMEHeaderKey for any name: canonical
// ones (returned as they are), common ones in any case, others, and names that are not tokens.
func FuzzCanonicalKey(f *testing.F) {
	for _, k := range []string{"Content-Type", "content-type", "CONTENT-TYPE", "X-Stainless-Os", "x-stainless-os",
		"X-A", "x", "", "-", "A-", "-A", "X Y", "X_Y", "Ä-B", "1-2", "Accept\x00", "aBc-dEf"} {
		f.Add(k)
	}
	common := Common("Content-Type", "X-Stainless-Os", "Accept")
	f.Fuzz(func(t *testing.T, k string) {
		if got, want := CanonicalKey(k, common), textproto.CanonicalMIMEHeaderKey(k); got != want {
			t.Fatalf("CanonicalKey(%q) = %q, textproto %q", k, got, want)
		}
	})
}

// TestPeek: a head is found across reads without consuming anything; a head larger than the
// buffer, and a connection that ends first, are told apart.
func TestPeek(t *testing.T) {
	head := "GET / HTTP/1.1\r\nHost: h\r\n\r\n"
	br := bufio.NewReaderSize(iotest.OneByteReader(strings.NewReader(head+"body")), 64)
	got, err := Peek(br)
	if string(got) != head || err != nil || br.Buffered() < len(head) {
		t.Fatalf("Peek = %q, %v (buffered %d)", got, err, br.Buffered())
	}
	big := bufio.NewReaderSize(strings.NewReader("GET / HTTP/1.1\r\nX: "+strings.Repeat("a", 100)+"\r\n\r\n"), 16)
	if got, err := Peek(big); got != nil || err != nil {
		t.Fatalf("head over the buffer: %q, %v", got, err)
	}
	cut := bufio.NewReaderSize(strings.NewReader("GET / HTTP/1.1\r\nHo"), 64)
	if got, err := Peek(cut); got != nil || !errors.Is(err, io.EOF) {
		t.Fatalf("cut head: %q, %v", got, err)
	}
}

// BenchmarkEnd: the end of a request's head as Go's client sends one (six lines).
func BenchmarkEnd(b *testing.B) {
	head := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:22101\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 108\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n")
	for b.Loop() {
		if n, _ := End(head, 0); n != len(head) {
			b.Fatalf("End = %d, want %d", n, len(head))
		}
	}
}

// BenchmarkCanonicalKey: the names a request and an answer carry, in the cases clients and
// servers send them.
func BenchmarkCanonicalKey(b *testing.B) {
	common := Common("Accept", "Authorization", "Content-Length", "Content-Type", "Date", "Host",
		"Server", "Transfer-Encoding", "User-Agent", "X-Request-Id", "X-Stainless-Retry-Count")
	names := []string{"Host", "Content-Type", "Content-Length", "content-type", "date", "server",
		"transfer-encoding", "x-stainless-retry-count", "Authorization", "User-Agent"}
	b.ReportAllocs()
	for b.Loop() {
		for _, k := range names {
			_ = CanonicalKey(k, common)
		}
	}
}

// FuzzValidValue: ValidValue is httpguts.ValidHeaderFieldValue, on the eight-byte words and
// the tail alike (the seeds put a byte at each place that matters; they run in every go test).
func FuzzValidValue(f *testing.F) {
	for _, v := range []string{"", "a", "application/json", "Bearer sk-0123456789abcdef", "tab\there", "\t", "x\x7f",
		"0123456\x7f", "01234567\x7f", "\x00", "0123456789abcdef\x01", "ünïcödé obs-text \xff\x80", "line\r\nInjected: 1",
		"01234567\t", "\x1f1234567", "abcdefg\x1f", strings.Repeat("a", 64) + "\n", "\xff\x80\x7f\x20\x1f"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if got, want := ValidValue(v), httpguts.ValidHeaderFieldValue(v); got != want {
			t.Errorf("ValidValue(%q) = %v, httpguts says %v", v, got, want)
		}
	})
}

func BenchmarkValidValue(b *testing.B) {
	v := "Bearer sk-proj-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP"
	b.Run("httpguts", func(b *testing.B) {
		for b.Loop() {
			_ = httpguts.ValidHeaderFieldValue(v)
		}
	})
	b.Run("ValidValue", func(b *testing.B) {
		for b.Loop() {
			_ = ValidValue(v)
		}
	})
}

func FuzzValidName(f *testing.F) {
	for _, k := range []string{"Content-Type", "x-a", "", "X Y", "Ä", "A\x7f", "!#$%&'*+-.^_`|~", "a:b"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, k string) {
		if got, want := ValidName(k), httpguts.ValidHeaderFieldName(k); got != want {
			t.Errorf("ValidName(%q) = %v, httpguts says %v", k, got, want)
		}
		// A canonical name is a valid one, and CanonicalKey returns it as it is.
		if canonical(k) && (!ValidName(k) || textproto.CanonicalMIMEHeaderKey(k) != k) {
			t.Errorf("canonical(%q), but valid %v and textproto makes it %q", k, ValidName(k), textproto.CanonicalMIMEHeaderKey(k))
		}
	})
}

// TestCanonical: canonical says what textproto would leave as it is, for valid names.
func TestCanonical(t *testing.T) {
	for _, k := range []string{"Content-Type", "content-type", "X-Stainless-Os", "X-A", "X", "x", "-", "A-", "-A", "A--B",
		"1-2", "X-1a", "X-1A", "Www-Authenticate", "WWW-Authenticate", "X_Y", "X.y", "X.Y", "Te", "TE", "A-b"} {
		want := ValidName(k) && textproto.CanonicalMIMEHeaderKey(k) == k
		if got := canonical(k); got != want {
			t.Errorf("canonical(%q) = %v, want %v (textproto: %q)", k, got, want, textproto.CanonicalMIMEHeaderKey(k))
		}
	}
}

// TestOneContentLength: identical duplicates keep one value, with no room to grow (a header
// that shares the list, CopyEndToEnd, is not written through by an Add to either); differing
// ones are refused; none is -1.
func TestOneContentLength(t *testing.T) {
	h, _, _ := Header("Content-Length: 5\r\nContent-Length: 5\r\nX: y\r\n\r\n", nil)
	if n, ok := OneContentLength(h); n != 5 || !ok {
		t.Fatalf("duplicates: %d, %v", n, ok)
	}
	if vv := h["Content-Length"]; len(vv) != 1 || cap(vv) != 1 {
		t.Errorf("kept %q with capacity %d, want one value and no room", vv, cap(vv))
	}
	dst := http.Header{}
	CopyEndToEnd(dst, h)
	h.Add("Content-Length", "9")
	if got := dst.Values("Content-Length"); len(got) != 1 || got[0] != "5" {
		t.Errorf("the copy reads %q after an Add to the source, want [5]", got)
	}
	if _, ok := OneContentLength(http.Header{"Content-Length": {"5", "6"}}); ok {
		t.Error("differing lengths accepted")
	}
	if n, ok := OneContentLength(http.Header{}); n != -1 || !ok {
		t.Errorf("no length: %d, %v", n, ok)
	}
}
