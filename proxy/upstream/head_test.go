package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"reflect"
	"testing"
)

// reading is one answer read: the response, its body, the read's error, and what was left
// on the connection after it.
type reading struct {
	resp *http.Response
	body []byte
	err  error
	rest []byte
}

// readBoth reads the answer at the start of b with readResponse's fast path and with
// http.ReadResponse; ok is false when the fast path left it to net/http.
func readBoth(t *testing.T, b []byte, method string) (fast, slow reading, ok bool) {
	t.Helper()
	req := &http.Request{Method: method}
	r1 := bufio.NewReaderSize(bytes.NewReader(b), 8<<10)
	resp, n := fastResponse(r1, req)
	if resp == nil {
		return fast, slow, false
	}
	_, _ = r1.Discard(n)
	fast.resp = resp
	fast.body, fast.err = io.ReadAll(resp.Body)
	fast.rest, _ = io.ReadAll(r1)
	r2 := bufio.NewReaderSize(bytes.NewReader(b), 8<<10)
	resp, err := http.ReadResponse(r2, req)
	if err != nil {
		t.Fatalf("read %q itself; net/http refuses it: %v", b, err)
	}
	slow.resp = resp
	slow.body, slow.err = io.ReadAll(resp.Body)
	slow.rest, _ = io.ReadAll(r2)
	return fast, slow, true
}

func compareAnswers(t *testing.T, b []byte, method string) bool {
	t.Helper()
	f, sl, ok := readBoth(t, b, method)
	if !ok {
		return false
	}
	fast, slow := f.resp, sl.resp
	switch {
	case fast.Status != slow.Status || fast.StatusCode != slow.StatusCode || fast.Proto != slow.Proto:
		t.Fatalf("%q: status %q %d, net/http %q %d", b, fast.Status, fast.StatusCode, slow.Status, slow.StatusCode)
	case !reflect.DeepEqual(fast.Header, slow.Header):
		t.Fatalf("%q: header %v, net/http %v", b, fast.Header, slow.Header)
	case fast.ContentLength != slow.ContentLength || fast.Close != slow.Close ||
		!reflect.DeepEqual(fast.TransferEncoding, slow.TransferEncoding):
		t.Fatalf("%q: framing %d %v %v, net/http %d %v %v", b, fast.ContentLength, fast.Close, fast.TransferEncoding,
			slow.ContentLength, slow.Close, slow.TransferEncoding)
	case (fast.Body == http.NoBody) != (slow.Body == http.NoBody):
		t.Fatalf("%q: body NoBody %v, net/http %v", b, fast.Body == http.NoBody, slow.Body == http.NoBody)
	case !bytes.Equal(f.body, sl.body) || (f.err == nil) != (sl.err == nil):
		t.Fatalf("%q: body %q (%v), net/http %q (%v)", b, f.body, f.err, sl.body, sl.err)
	case f.err == nil && !bytes.Equal(f.rest, sl.rest):
		t.Fatalf("%q: the next answer starts at %q, net/http's at %q", b, f.rest, sl.rest)
	}
	return true
}

// TestReadResponseModelServers: answers as vLLM (uvicorn), TGI, Ollama and llama.cpp send
// them are read on the fast path, as net/http reads them, the next answer on the
// connection where net/http finds it.
func TestReadResponseModelServers(t *testing.T) {
	next := "HTTP/1.1 204 No Content\r\n\r\n"
	for _, tc := range []struct{ name, answer string }{
		{"uvicorn json", "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 12\r\ncontent-type: application/json\r\n\r\n{\"ok\":true}\n"},
		{"uvicorn sse", "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n" +
			"e\r\ndata: {\"a\":1}\n\n\r\n" + "e\r\ndata: [DONE]\n\n\r\n" + "0\r\n\r\n"},
		{"chunked with trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Checksum: 1\r\n\r\n"},
		{"error, close", "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\nRetry-After: 1\r\n\r\n{}"},
		{"no reason", "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n"},
		{"LF only", "HTTP/1.1 200 OK\nContent-Length: 1\n\nx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !compareAnswers(t, []byte(tc.answer+next), http.MethodPost) {
				t.Fatal("left to net/http")
			}
		})
	}
}

// FuzzReadResponseAgrees: any answer the fast path reads, net/http reads the same way: the
// status, the header, the framing, the body and where the next answer starts.
func FuzzReadResponseAgrees(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\n\r\n"), false)
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nT: 1\r\n\r\nrest"), false)
	f.Add([]byte("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"), true)
	f.Add([]byte("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"), false)
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"), false)
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nhi"), false)
	f.Fuzz(func(t *testing.T, b []byte, head bool) {
		method := http.MethodPost
		if head {
			method = http.MethodHead
		}
		compareAnswers(t, b, method)
	})
}

// TestParseResponseAllocs: a model server's answer of known length is read in five
// allocations: the head's string, the header map, its group and its values, and the
// answer with its body in one.
func TestParseResponseAllocs(t *testing.T) {
	head := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nDate: Mon, 07 Dec 2026 23:00:00 GMT\r\n\r\n")
	br := bufio.NewReader(bytes.NewReader(nil))
	req := &http.Request{Method: http.MethodPost}
	a := testing.AllocsPerRun(100, func() {
		if resp := parseResponse(head, br, req); resp == nil || resp.ContentLength != 2 {
			t.Fatalf("parseResponse: %+v", resp)
		}
	})
	if a > 5 {
		t.Errorf("%v allocations an answer, want at most 5", a)
	}
}
