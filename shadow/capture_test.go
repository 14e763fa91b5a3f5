package shadow

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// TestCaptureBudget: captures share their route's capture_total; a capture reserves it in
// grabs (so the relay does not touch the shared counter per event), takes exactly what it
// needs when a grab does not fit, ends truncated when not even that fits, and gives all of it
// back on release.
func TestCaptureBudget(t *testing.T) {
	event := bytes.Repeat([]byte("x"), 1000)
	t.Run("room for grabs", func(t *testing.T) {
		var budget atomic.Int64
		c := capture{limit: 1 << 20, budget: &budget, total: 256 << 20}
		for range 10 {
			c.add(event)
		}
		if len(c.buf) != 10000 || c.truncated || budget.Load() != captureGrab {
			t.Fatalf("kept %d (truncated %v), budget %d: want 10000 kept in one grab of %d", len(c.buf), c.truncated, budget.Load(), captureGrab)
		}
		for range 100 {
			c.add(event)
		}
		if len(c.buf) != 110000 || budget.Load() != 2*captureGrab {
			t.Fatalf("kept %d, budget %d: want 110000 in two grabs", len(c.buf), budget.Load())
		}
		c.release()
		if budget.Load() != 0 || c.buf != nil {
			t.Fatalf("after release: budget %d", budget.Load())
		}
	})
	t.Run("a grab does not fit", func(t *testing.T) {
		var budget atomic.Int64
		a := capture{limit: 1 << 20, budget: &budget, total: 2500}
		b := capture{limit: 1 << 20, budget: &budget, total: 2500}
		a.add(event)
		b.add(event)
		if budget.Load() != 2000 || a.truncated || b.truncated {
			t.Fatalf("budget %d: want exactly the 2000 bytes kept", budget.Load())
		}
		a.add(event) // 3000 > 2500: a ends at its last whole event
		if !a.truncated || len(a.buf) != 1000 || budget.Load() != 2000 {
			t.Fatalf("a: kept %d, truncated %v, budget %d", len(a.buf), a.truncated, budget.Load())
		}
		a.add([]byte("y")) // a cut capture takes nothing more
		if len(a.buf) != 1000 {
			t.Fatalf("a cut capture grew to %d", len(a.buf))
		}
		a.release()
		b.add(event) // a's release made room
		if b.truncated || len(b.buf) != 2000 {
			t.Fatalf("b after a's release: kept %d, truncated %v", len(b.buf), b.truncated)
		}
		b.release()
		if budget.Load() != 0 {
			t.Fatalf("budget %d after both released", budget.Load())
		}
	})
	t.Run("the capture's own limit", func(t *testing.T) {
		var budget atomic.Int64
		c := capture{limit: 1500, budget: &budget, total: 256 << 20}
		c.add(event)
		c.add(event)
		if len(c.buf) != 1500 || !c.truncated || budget.Load() != 1500 {
			t.Fatalf("kept %d, truncated %v, budget %d: a grab never passes the limit", len(c.buf), c.truncated, budget.Load())
		}
		c.release()
	})
}

// errAfter is a body that yields b and then fails with err (a connection cut mid-answer).
type errAfter struct {
	b   []byte
	err error
}

func (r *errAfter) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, r.err
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestReadAnswer: a sandbox's answer is classified as the relay classifies the primary's —
// a stream that ends without its end marker is cut, one cut as the copy's time ran out is a
// time-out, an error status is the upstream's class (its body read as JSON, even when an
// SSE stream was asked for), a body that does not parse is unparsed unless it was only cut at
// capture_bytes — and what it held of the route's capture_total is given back.
func TestReadAnswer(t *testing.T) {
	s := Settings{Cluster: "cand", Timeout: time.Second, CaptureBytes: 1 << 16, CaptureTotal: 1 << 20, MaxEventBytes: 1 << 16}
	m := NewMirror("chat", &s, 10, nil, nil)
	j := &Job{mirror: m, settings: &s}
	chunk := func(text string) string {
		return `data: {"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}` + "\n\n"
	}
	stop := `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n"
	done := "data: [DONE]\n\n"
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	long := `{"choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("x", 1<<16) + `"},"finish_reason":"stop"}]}`
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		status int
		sse    bool
		body   io.Reader
		class  policy.Class
		text   string
		trunc  bool
	}{
		{name: "whole stream", status: 200, sse: true, body: strings.NewReader(chunk("hi ") + chunk("there") + stop + done), text: "hi there"},
		{name: "stream without its end", status: 200, sse: true, body: strings.NewReader(chunk("hi ")), class: policy.ClassStreamCut},
		{name: "stream cut by the time-out", ctx: cancelled, status: 200, sse: true,
			body: &errAfter{b: []byte(chunk("hi ")), err: context.Canceled}, class: policy.ClassTimeout},
		{name: "stream cut by the connection", status: 200, sse: true,
			body: &errAfter{b: []byte(chunk("hi ")), err: io.ErrUnexpectedEOF}, class: policy.ClassStreamCut},
		{name: "error status on a stream", status: 503, sse: true, body: strings.NewReader(`{"error":{"message":"overloaded"}}`), class: policy.ClassUpstream5xx},
		{name: "json", status: 200, body: strings.NewReader(primaryBody), text: "the answer is forty two"},
		{name: "json that does not parse", status: 200, body: strings.NewReader(`{"choices":`), class: policy.ClassUnparsed},
		{name: "json past capture_bytes", status: 200, body: strings.NewReader(long), trunc: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			resp := &http.Response{StatusCode: tc.status, Body: io.NopCloser(tc.body)}
			a := j.ReadAnswer(ctx, resp, tc.sse, time.Now().Add(-time.Second))
			if a.ErrorClass != string(tc.class) || a.Status != tc.status || a.Truncated != tc.trunc {
				t.Errorf("class %q, status %d, truncated %v; want %q, %d, %v", a.ErrorClass, a.Status, a.Truncated, tc.class, tc.status, tc.trunc)
			}
			if tc.text != "" && a.Text != tc.text {
				t.Errorf("text %q, want %q", a.Text, tc.text)
			}
			if tc.text != "" && a.E2E < time.Second {
				t.Errorf("E2E %v: want it measured from the copy's start, a second ago", a.E2E)
			}
			if n := m.captured.Load(); n != 0 {
				t.Errorf("%d bytes of capture_total still held", n)
			}
		})
	}
}
