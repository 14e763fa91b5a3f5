package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// ev is an expected event; data and name "<nil>" mean nil.
type ev struct{ raw, data, name string }

const null = "<nil>"

func str(b []byte) string {
	if b == nil {
		return null
	}
	return string(b)
}

// readAll reads every event and the final error.
func readAll(r *Reader) ([]ev, error) {
	var out []ev
	for {
		e, err := r.Next()
		if err != nil {
			if len(e.Raw) > 0 {
				out = append(out, ev{string(e.Raw), str(e.Data), str(e.Name)})
			}
			return out, err
		}
		out = append(out, ev{string(e.Raw), str(e.Data), str(e.Name)})
	}
}

func TestReader(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []ev
		err  error
	}{
		{"one event", "data: a\n\n", []ev{{"data: a\n\n", "a", null}}, io.EOF},
		{"empty stream", "", nil, io.EOF},
		{"two events", "data: a\n\ndata: b\n\n", []ev{{"data: a\n\n", "a", null}, {"data: b\n\n", "b", null}}, io.EOF},
		{"CRLF", "data: a\r\nevent: x\r\n\r\ndata: b\r\n\r\n",
			[]ev{{"data: a\r\nevent: x\r\n\r\n", "a", "x"}, {"data: b\r\n\r\n", "b", null}}, io.EOF},
		{"CR", "data: a\rdata: b\r\rdata: c\r\r",
			[]ev{{"data: a\rdata: b\r\r", "a\nb", null}, {"data: c\r\r", "c", null}}, io.EOF},
		{"mixed endings", "data: a\r\ndata: b\rdata: c\n\r\n",
			[]ev{{"data: a\r\ndata: b\rdata: c\n\r\n", "a\nb\nc", null}}, io.EOF},
		{"multi-line data", "data: {\"a\":\ndata:  1}\ndata\n\n",
			[]ev{{"data: {\"a\":\ndata:  1}\ndata\n\n", "{\"a\":\n 1}\n", null}}, io.EOF},
		{"no space after colon", "data:x\nevent:y\n\n", []ev{{"data:x\nevent:y\n\n", "x", "y"}}, io.EOF},
		{"empty data", "data:\n\n", []ev{{"data:\n\n", "", null}}, io.EOF},
		{"comment only", ": keep-alive\n\n", []ev{{": keep-alive\n\n", null, null}}, io.EOF},
		{"comment in event", ": hi\ndata: x\n:\n\n", []ev{{": hi\ndata: x\n:\n\n", "x", null}}, io.EOF},
		{"other fields", "id: 7\nretry: 100\nfoo\ndata: x\n\n", []ev{{"id: 7\nretry: 100\nfoo\ndata: x\n\n", "x", null}}, io.EOF},
		{"event name", "event: error\ndata: {\"error\":{}}\n\n", []ev{{"event: error\ndata: {\"error\":{}}\n\n", "{\"error\":{}}", "error"}}, io.EOF},
		{"last event name wins", "event: a\nevent: b\ndata: x\n\n", []ev{{"event: a\nevent: b\ndata: x\n\n", "x", "b"}}, io.EOF},
		{"blank lines are events", "\n\ndata: x\n\n\n", []ev{{"\n", null, null}, {"\n", null, null}, {"data: x\n\n", "x", null}, {"\n", null, null}}, io.EOF},
		{"field names are exact", "Data: x\ndata : y\n\n", []ev{{"Data: x\ndata : y\n\n", null, null}}, io.EOF},
		{"byte-order mark", "\xef\xbb\xbfdata: x\n\n", []ev{{"\xef\xbb\xbfdata: x\n\n", "x", null}}, io.EOF},
		{"byte-order mark only at the start", "data: x\n\n\xef\xbb\xbfdata: y\n\n",
			[]ev{{"data: x\n\n", "x", null}, {"\xef\xbb\xbfdata: y\n\n", null, null}}, io.EOF},
		{"DONE", "data: [DONE]\n\n", []ev{{"data: [DONE]\n\n", "[DONE]", null}}, io.EOF},
		{"truncated after a line", "data: a\n\ndata: b\n", []ev{{"data: a\n\n", "a", null}, {"data: b\n", null, null}}, io.ErrUnexpectedEOF},
		{"truncated mid-line", "data: a\n\ndata: b", []ev{{"data: a\n\n", "a", null}, {"data: b", null, null}}, io.ErrUnexpectedEOF},
		{"truncated after CR", "data: b\r", []ev{{"data: b\r", null, null}}, io.ErrUnexpectedEOF},
		{"truncated comment", ": x", []ev{{": x", null, null}}, io.ErrUnexpectedEOF},
	}
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"one byte", iotest.OneByteReader},
		{"half", iotest.HalfReader},
		{"data+EOF", iotest.DataErrReader},
	}
	for _, tt := range tests {
		for _, rd := range readers {
			t.Run(tt.name+"/"+rd.name, func(t *testing.T) {
				got, err := readAll(NewReader(rd.wrap(strings.NewReader(tt.in)), 0))
				if err != tt.err {
					t.Errorf("err = %v, want %v", err, tt.err)
				}
				// Reading byte by byte may split a "\r\n" after the '\r' that ends an event;
				// the '\n' then opens the next event's Raw. Data and names never change, and
				// the Raws always add up to the input.
				var cat strings.Builder
				for _, e := range got {
					cat.WriteString(e.raw)
				}
				if cat.String() != tt.in {
					t.Errorf("Raws add up to %q, want %q", cat.String(), tt.in)
				}
				if rd.name != "whole" && len(got) == len(tt.want)+1 && got[len(got)-1] == (ev{"\n", null, null}) {
					got = got[:len(got)-1] // the '\n' of a final "\r\n" split from its '\r'
				}
				if len(got) != len(tt.want) {
					t.Fatalf("got %d events %q, want %d %q", len(got), got, len(tt.want), tt.want)
				}
				for i := range got {
					g, w := got[i], tt.want[i]
					if rd.name == "whole" && g.raw != w.raw {
						t.Errorf("event %d Raw = %q, want %q", i, g.raw, w.raw)
					}
					if g.data != w.data || g.name != w.name {
						t.Errorf("event %d = data %q name %q, want %q %q", i, g.data, g.name, w.data, w.name)
					}
				}
			})
		}
	}
}

func TestReaderSplitCRLF(t *testing.T) {
	// The '\r' that ends an event arrives without its '\n': the event must come back at
	// once, and the '\n' must not make a blank line of its own.
	pr, pw := io.Pipe()
	defer pr.Close()
	r := NewReader(pr, 0)
	writes := []string{"data: a\r\n\r", "\ndata: b\r\n\r", "\n"}
	go func() {
		for _, w := range writes {
			if _, err := pw.Write([]byte(w)); err != nil {
				return
			}
		}
		pw.Close()
	}()
	e, err := r.Next()
	if err != nil || string(e.Raw) != "data: a\r\n\r" || string(e.Data) != "a" {
		t.Fatalf("%q %q %v", e.Raw, e.Data, err)
	}
	e, err = r.Next()
	if err != nil || string(e.Raw) != "\ndata: b\r\n\r" || string(e.Data) != "b" {
		t.Fatalf("%q %q %v", e.Raw, e.Data, err)
	}
	if e, err = r.Next(); err != nil || string(e.Raw) != "\n" || e.Data != nil {
		t.Fatalf("%q %v, want the last '\n' without data", e.Raw, err)
	}
	if e, err = r.Next(); err != io.EOF {
		t.Fatalf("%q %v, want EOF", e.Raw, err)
	}
}

func TestReaderReturnsWithoutReadingAhead(t *testing.T) {
	// Each event must come back as soon as its blank line has been read, with the writer
	// still holding the rest: a relay must never sit on a complete event.
	for _, end := range []string{"\n\n", "\r\n\r\n", "\r\r"} {
		pr, pw := io.Pipe()
		r := NewReader(pr, 0)
		got := make(chan string)
		go func() {
			for {
				e, err := r.Next()
				if err != nil {
					close(got)
					return
				}
				got <- string(e.Data)
			}
		}()
		for i, d := range []string{"one", "two", "three"} {
			go func() { _, _ = pw.Write([]byte("data: " + d + end)) }()
			select {
			case g := <-got:
				if g != d {
					t.Fatalf("%q: event %d = %q, want %q", end, i, g, d)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%q: event %d not returned before more bytes arrived", end, i)
			}
		}
		pw.Close()
		for range got {
		}
	}
}

func TestReaderMaxEvent(t *testing.T) {
	in := "data: 12345678\n\n" // 16 bytes
	for _, wrap := range []func(io.Reader) io.Reader{func(r io.Reader) io.Reader { return r }, iotest.OneByteReader} {
		r := NewReader(wrap(strings.NewReader(in+in)), 16)
		for i := 0; i < 2; i++ {
			if e, err := r.Next(); err != nil || string(e.Raw) != in {
				t.Fatalf("event of exactly the bound: %q %v", e.Raw, err)
			}
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("got %v, want EOF", err)
		}

		r = NewReader(wrap(strings.NewReader("data: a\n\ndata: 123456789\n\ndata: b\n\n")), 16)
		if e, err := r.Next(); err != nil || string(e.Data) != "a" {
			t.Fatalf("%q %v", e.Data, err)
		}
		for i := 0; i < 2; i++ { // sticky
			if _, err := r.Next(); !errors.Is(err, ErrEventTooLarge) {
				t.Fatalf("got %v, want ErrEventTooLarge", err)
			}
		}
	}
	// A line that never ends is cut off at the bound, not read forever.
	r := NewReader(io.MultiReader(strings.NewReader("data: "), neverEnding('x')), 1<<10)
	if _, err := r.Next(); !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("got %v", err)
	}
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

func TestReaderErrors(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom)), 0)
	if e, err := r.Next(); err != nil || string(e.Data) != "a" {
		t.Fatal(err)
	}
	e, err := r.Next()
	if err != boom || string(e.Raw) != "data: b" {
		t.Fatalf("%q %v", e.Raw, err)
	}
	if _, err := r.Next(); err != boom {
		t.Fatalf("not sticky: %v", err)
	}
	// A reader that returns nothing forever.
	r = NewReader(zeroReader{}, 0)
	if _, err := r.Next(); err != io.ErrNoProgress {
		t.Fatalf("got %v", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read([]byte) (int, error) { return 0, nil }

func TestReaderSlicesAreBounded(t *testing.T) {
	r := NewReader(strings.NewReader("data: a\nevent: n\n\ndata: b\n\n"), 0)
	e, _ := r.Next()
	for _, s := range [][]byte{e.Raw, e.Data, e.Name} {
		if cap(s) != len(s) {
			t.Errorf("cap %d > len %d: an append would overwrite the next event", cap(s), len(s))
		}
	}
}

func TestReaderAllocs(t *testing.T) {
	stream := loadSSE(t, "chat_usage.sse")
	src := &cycle{data: stream, chunk: 100}
	r := NewReader(src, 0)
	for i := 0; i < 100; i++ { // warm up: buffers reach their size
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}
	var tap Tap
	now := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		e, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		tap.Observe(e, now)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per event", allocs)
	}
}

func TestWriteEvent(t *testing.T) {
	for _, tt := range []struct{ data, want, back string }{
		{"a", "data: a\n\n", "a"},
		{"", "data: \n\n", ""},
		{`{"x":1}`, "data: {\"x\":1}\n\n", `{"x":1}`},
		{"a\nb", "data: a\ndata: b\n\n", "a\nb"},
		{"a\r\nb\rc\n", "data: a\ndata: b\ndata: c\ndata: \n\n", "a\nb\nc\n"},
	} {
		var buf bytes.Buffer
		w := &countWriter{w: &buf}
		if err := WriteEvent(w, []byte(tt.data)); err != nil {
			t.Fatal(err)
		}
		if buf.String() != tt.want || w.n != 1 {
			t.Errorf("WriteEvent(%q) wrote %q in %d writes, want %q in 1", tt.data, buf.String(), w.n, tt.want)
		}
		e, err := NewReader(&buf, 0).Next()
		if err != nil || string(e.Data) != tt.back {
			t.Errorf("read back %q %v, want %q", e.Data, err, tt.back)
		}
	}
	if string(DoneEvent) != "data: [DONE]\n\n" {
		t.Error("DoneEvent")
	}
	if e, _ := NewReader(bytes.NewReader(DoneEvent), 0).Next(); !e.IsDone() {
		t.Error("IsDone")
	}
	if (Event{Data: []byte("[DONE] ")}).IsDone() || (Event{}).IsDone() {
		t.Error("IsDone is too lax")
	}
	if err := WriteEvent(iotestErrWriter{}, []byte("x")); err == nil {
		t.Error("write error lost")
	}
}

type countWriter struct {
	w io.Writer
	n int
}

func (c *countWriter) Write(p []byte) (int, error) { c.n++; return c.w.Write(p) }

type iotestErrWriter struct{}

func (iotestErrWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// cycle repeats data forever, chunk bytes a Read (a model server flushing small writes).
type cycle struct {
	data  []byte
	off   int
	chunk int
}

func (c *cycle) Read(p []byte) (int, error) {
	n := min(len(p), c.chunk, len(c.data)-c.off)
	copy(p, c.data[c.off:c.off+n])
	c.off = (c.off + n) % len(c.data)
	return n, nil
}

func TestReaderPending(t *testing.T) {
	tests := []struct {
		name    string
		stream  string
		pending []bool // after each Next
	}{
		{"burst then end", "data: a\n\ndata: b\n\ndata: c\n\n", []bool{true, true, false}},
		{"partial next event", "data: a\n\ndata: b\n", []bool{false}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []bool{true, false}},
		{"cr", "data: a\r\rdata: b\r\r", []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(strings.NewReader(tt.stream), 0)
			for i, want := range tt.pending {
				if _, err := r.Next(); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if got := r.Pending(); got != want {
					t.Fatalf("after event %d: Pending = %v, want %v", i, got, want)
				}
			}
		})
	}
}

// TestReaderLineEndsAcrossRefills: a long stream mixing LF, CRLF and lone CR line ends, read
// in odd sizes so that lines straddle the buffer's refills and compactions, reads as the
// reference reading of the spec does (the reader's memory of where no CR is must follow the
// buffer's moves).
func TestReaderLineEndsAcrossRefills(t *testing.T) {
	var in []byte
	ends := []string{"\n", "\r\n", "\r"}
	for i := range 600 {
		e := ends[i%3]
		if i%7 == 0 {
			e = "\n" // runs of LF-only events between the others
		}
		in = fmt.Appendf(in, "data: {\"i\":%d,\"pad\":%q}%s%s", i, strings.Repeat("x", i%97), e, e)
	}
	ref := referenceSSE(in)
	for _, sizes := range [][]int{{1}, {7, 3}, {4095, 2}, {500}, {4097}} {
		got := readEvents(t, &chunkReader{b: in, sizes: sizes}, 1<<16)
		if got.err != io.EOF || len(got.events) != len(ref.events) {
			t.Fatalf("sizes %v: %d events (%v), reference %d", sizes, len(got.events), got.err, len(ref.events))
		}
		for i, e := range got.events {
			if e.data != ref.events[i].data {
				t.Fatalf("sizes %v: event %d data %q, reference %q", sizes, i, e.data, ref.events[i].data)
			}
		}
	}
}
