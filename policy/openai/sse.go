package openai

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// Event is one server-sent event. Its slices point into the Reader's buffer and are valid
// until the next call to Reader.Next.
type Event struct {
	Raw  []byte // the complete event as received, including its terminating blank line
	Data []byte // the data payload (several data: lines joined by '\n'); nil if none
	Name []byte // the event: field; nil if none
}

// IsDone reports whether the event is the OpenAI end-of-stream marker "data: [DONE]".
func (e Event) IsDone() bool { return string(e.Data) == "[DONE]" }

// DoneEvent is the OpenAI end-of-stream event.
var DoneEvent = []byte("data: [DONE]\n\n")

// ErrEventTooLarge is returned by Reader.Next for an event longer than the Reader's bound.
var ErrEventTooLarge = errors.New("openai: SSE event exceeds the size limit")

// DefaultMaxEvent bounds one event when NewReader is given no bound.
const DefaultMaxEvent = 1 << 20

// Reader reads server-sent events (the WHATWG EventSource format) from a stream, one event
// at a time, for a relay: each event comes back with its exact bytes (Raw) so that the
// relay can write them through unchanged, plus its parsed data and name.
//
// Lines may end in "\n", "\r\n" or "\r"; comments (lines starting with ':') and other
// fields (id:, retry:) stay in Raw and are otherwise ignored; a field's value may or may not
// start with a space after the colon. Every blank line ends an event, so an event may have
// no data (a keep-alive comment, or a stray blank line): relay it, nothing else.
//
// Next returns an event as soon as its blank line has arrived: it never reads ahead of
// what it needs. When a "\r\n" is split between two reads so that the "\r" ends an event,
// the "\n" that follows becomes the first byte of the next event's Raw (and is not a blank
// line), or, at the end of the stream, an event of its own without data. So concatenating
// every Raw (including the partial one that comes with io.ErrUnexpectedEOF) gives back the
// stream exactly.
//
// In steady state Next does not allocate: events are parsed in place in one buffer that
// grows to the largest event seen (at most the bound), and multi-line data is joined in a
// second reused buffer.
type Reader struct {
	rd      io.Reader
	buf     []byte
	r, w    int // buf[r:w] is read but not yet returned
	max     int
	data    []byte // joined multi-line data
	err     error  // the read error, once the reader returned one
	final   error  // what every later Next returns
	cr      bool   // the last line ended with a '\r' at the end of the buffered bytes
	started bool   // past the optional byte-order mark
}

// NewReader returns a Reader of r. maxEvent bounds one event's Raw size in bytes; past it,
// Next returns ErrEventTooLarge (and keeps returning it). maxEvent <= 0 means
// DefaultMaxEvent.
func NewReader(r io.Reader, maxEvent int) *Reader {
	if maxEvent <= 0 {
		maxEvent = DefaultMaxEvent
	}
	return &Reader{rd: r, max: maxEvent, buf: make([]byte, min(4096, maxEvent))}
}

// Next returns the next event. At a clean end of stream (after a blank line) it returns
// io.EOF; if the stream ends in the middle of an event it returns io.ErrUnexpectedEOF
// with the partial event's bytes in Raw (Data and Name nil). Other read errors are
// returned as they are, also with the partial bytes in Raw. The error is then returned
// by every later call.
func (r *Reader) Next() (Event, error) {
	if r.final != nil {
		return Event{}, r.final
	}
	var (
		pos      int // start of the current line, relative to r.r
		scan     int // where to resume looking for a line end, relative to r.r
		lines    int // lines of this event so far
		nData    int
		ds, de   int // the single data line's value, relative to r.r
		ns, ne   int // the event name, relative to r.r
		haveName bool
	)
	if r.w == r.r {
		r.r, r.w = 0, 0
	}
	for {
		b := r.buf[r.r:r.w]
		if r.cr && pos < len(b) {
			// The '\n' of a "\r\n" split across reads.
			r.cr = false
			if b[pos] == '\n' {
				pos++
			}
		}
		if !r.started && pos < len(b) {
			if len(b)-pos < len(bom) && r.err == nil && string(b[pos:]) == bom[:len(b)-pos] {
				goto more // could still be a byte-order mark
			}
			r.started = true
			if len(b)-pos >= len(bom) && string(b[pos:pos+len(bom)]) == bom {
				pos += len(bom)
			}
		}
		scan = max(scan, pos)
		{
			seg := b[scan:]
			n := bytes.IndexByte(seg, '\n')
			if n < 0 {
				n = len(seg)
			}
			if c := bytes.IndexByte(seg[:n], '\r'); c >= 0 {
				n = c
			}
			if n == len(seg) {
				scan = len(b)
				goto more
			}
			eol := scan + n
			next := eol + 1
			if b[eol] == '\r' {
				if next < len(b) {
					if b[next] == '\n' {
						next++
					}
				} else {
					r.cr = true
				}
			}
			line := b[pos:eol]
			if len(line) == 0 {
				if next > r.max {
					r.final = ErrEventTooLarge
					return Event{}, r.final
				}
				raw := b[:next:next]
				ev := Event{Raw: raw}
				switch {
				case nData == 1:
					ev.Data = raw[ds:de:de]
				case nData > 1:
					ev.Data = r.data[:len(r.data):len(r.data)]
				}
				if haveName {
					ev.Name = raw[ns:ne:ne]
				}
				r.r += next
				return ev, nil
			}
			lines++
			if line[0] != ':' {
				name, vs := line, len(line)
				if c := bytes.IndexByte(line, ':'); c >= 0 {
					name, vs = line[:c], c+1
					if vs < len(line) && line[vs] == ' ' {
						vs++
					}
				}
				switch string(name) {
				case "data":
					nData++
					switch nData {
					case 1:
						ds, de = pos+vs, eol
					case 2:
						r.data = append(r.data[:0], b[ds:de]...)
						fallthrough
					default:
						r.data = append(r.data, '\n')
						r.data = append(r.data, line[vs:]...)
					}
				case "event":
					ns, ne, haveName = pos+vs, eol, true
				}
			}
			pos, scan = next, next
			continue
		}
	more:
		if r.w-r.r >= r.max {
			r.final = ErrEventTooLarge
			return Event{}, r.final
		}
		if r.err != nil {
			rest := r.buf[r.r:r.w:r.w]
			r.r = r.w
			switch {
			case r.err != io.EOF:
				r.final = r.err
			case lines == 0 && pos == len(rest):
				// Nothing, or only the '\n' of the last event's "\r\n" (or a byte-order
				// mark): a clean end. Those bytes still go out, as an event without data.
				r.final = io.EOF
				if len(rest) == 0 {
					return Event{}, r.final
				}
				return Event{Raw: rest}, nil
			default:
				r.final = io.ErrUnexpectedEOF
			}
			if len(rest) == 0 {
				return Event{}, r.final
			}
			return Event{Raw: rest}, r.final
		}
		r.fill()
	}
}

// Pending reports whether a whole event is already buffered, so that the next call of Next
// returns without reading. A relay uses it to flush once per burst of events that arrived
// together, instead of once per event, without ever holding an event back.
func (r *Reader) Pending() bool {
	b := r.buf[r.r:r.w]
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\r\n\r\n")) || bytes.Contains(b, []byte("\r\r"))
}

const bom = "\xef\xbb\xbf"

// fill reads once into the buffer, making room first (moving the pending bytes to the
// front, or growing up to the bound).
func (r *Reader) fill() {
	if r.w == len(r.buf) {
		if r.r > 0 {
			r.w = copy(r.buf, r.buf[r.r:r.w])
			r.r = 0
		} else {
			nb := make([]byte, min(2*len(r.buf), r.max))
			copy(nb, r.buf[:r.w])
			r.buf = nb
		}
	}
	for range 100 {
		n, err := r.rd.Read(r.buf[r.w:])
		if n < 0 || n > len(r.buf)-r.w {
			r.err = errors.New("openai: invalid Read count")
			return
		}
		r.w += n
		if err != nil {
			r.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	r.err = io.ErrNoProgress
}

var writeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// WriteEvent writes data as one event in a single Write: "data: " + data + "\n\n". Data
// with line breaks is written as one data: line per line, so the receiver's data is data
// with its line breaks normalized to "\n".
func WriteEvent(w io.Writer, data []byte) error {
	bp := writeBufs.Get().(*[]byte)
	b := appendEvent((*bp)[:0], data)
	_, err := w.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b
		writeBufs.Put(bp)
	}
	return err
}

func appendEvent(b, data []byte) []byte {
	for {
		b = append(b, "data: "...)
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			b = append(b, data...)
			return append(b, "\n\n"...)
		}
		b = append(b, data[:i]...)
		b = append(b, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
}
