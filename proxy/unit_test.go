package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/heapfloor"
	"github.com/sluicegw/sluice/proxy/upstream"
)

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// causeFunc is a standard cancel function as the watchdog's ender.
type causeFunc context.CancelCauseFunc

func (f causeFunc) Cancel(cause error) { f(cause) }

// waitCause waits (boundedly) for ctx to end and returns its cause.
func waitCause(t *testing.T, ctx context.Context) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("watchdog did not fire within 10s")
		return nil
	}
}

func TestWatchdog(t *testing.T) {
	const d = 20 * time.Millisecond
	t.Run("no first byte is a TTFT time-out", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		wd := startWatchdog(d, time.Hour, causeFunc(cancel))
		defer wd.stop()
		if got := waitCause(t, ctx); !errors.Is(got, errTTFTTimeout) {
			t.Fatalf("cause = %v, want errTTFTTimeout", got)
		}
		if c := causeClass(ctx); c != policy.ClassTTFTTimeout {
			t.Fatalf("class = %q, want %q", c, policy.ClassTTFTTimeout)
		}
	})
	t.Run("silence after a beat is an idle time-out", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		wd := startWatchdog(time.Hour, d, causeFunc(cancel))
		defer wd.stop()
		wd.beat()
		if got := waitCause(t, ctx); !errors.Is(got, errIdleTimeout) {
			t.Fatalf("cause = %v, want errIdleTimeout", got)
		}
		if c := causeClass(ctx); c != policy.ClassIdleTimeout {
			t.Fatalf("class = %q, want %q", c, policy.ClassIdleTimeout)
		}
	})
	t.Run("idle time-out without a TTFT time-out", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		wd := startWatchdog(0, d, causeFunc(cancel))
		defer wd.stop()
		wd.beat()
		if got := waitCause(t, ctx); !errors.Is(got, errIdleTimeout) {
			t.Fatalf("cause = %v, want errIdleTimeout", got)
		}
	})
	t.Run("beats keep it from firing", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		// Beats every 5ms against a 1s idle time-out: nothing fires however slow the machine.
		wd := startWatchdog(time.Second, time.Second, causeFunc(cancel))
		for range 20 {
			wd.beat()
			time.Sleep(5 * time.Millisecond)
		}
		wd.stop()
		if ctx.Err() != nil {
			t.Fatalf("fired despite beats: %v", context.Cause(ctx))
		}
	})
	t.Run("stop and no idle time-out disarm it", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			idle time.Duration
			run  func(*watchdog)
		}{
			{"stop before the first byte", time.Hour, func(w *watchdog) { w.stop() }},
			{"beat with idle 0", 0, func(w *watchdog) { w.beat() }},
		} {
			ctx, cancel := context.WithCancelCause(context.Background())
			wd := startWatchdog(d, tc.idle, causeFunc(cancel))
			tc.run(wd)
			time.Sleep(5 * d)
			if ctx.Err() != nil {
				t.Errorf("%s: fired: %v", tc.name, context.Cause(ctx))
			}
			wd.stop()
			cancel(nil)
		}
	})
	t.Run("zero time-outs never fire", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		wd := startWatchdog(0, 0, causeFunc(cancel))
		wd.beat()
		wd.beat()
		wd.stop()
		time.Sleep(2 * d)
		if ctx.Err() != nil {
			t.Fatalf("fired: %v", context.Cause(ctx))
		}
	})
}

func TestClassFailure(t *testing.T) {
	tests := []struct {
		class      policy.Class
		status     int
		typ        string
		code       policy.Class
		retryAfter time.Duration
	}{
		{policy.ClassClientCancel, statusClientClosed, "invalid_request_error", policy.ClassClientCancel, 0},
		{policy.ClassTTFTTimeout, http.StatusGatewayTimeout, "timeout_error", policy.ClassTTFTTimeout, 0},
		{policy.ClassIdleTimeout, http.StatusGatewayTimeout, "timeout_error", policy.ClassIdleTimeout, 0},
		{policy.ClassTimeout, http.StatusGatewayTimeout, "timeout_error", policy.ClassTimeout, 0},
		{policy.ClassNoEndpoint, http.StatusServiceUnavailable, "server_error", policy.ClassNoEndpoint, 3 * time.Second},
		{policy.ClassShutdown, http.StatusServiceUnavailable, "server_error", policy.ClassShutdown, time.Second},
		{policy.ClassConnect, http.StatusBadGateway, "server_error", policy.ClassConnect, 0},
		{policy.ClassStreamCut, http.StatusBadGateway, "server_error", policy.ClassStreamCut, 0},
		{policy.ClassEmptyResponse, http.StatusBadGateway, "server_error", policy.ClassEmptyResponse, 0},
		{policy.ClassUpstreamError, http.StatusBadGateway, "server_error", policy.ClassUpstreamError, 0},
		{"something-new", http.StatusBadGateway, "server_error", policy.ClassUpstreamError, 0},
	}
	for _, tt := range tests {
		t.Run(string(tt.class), func(t *testing.T) {
			f := classFailure(tt.class, 3*time.Second)
			e := f.OpenAI()
			if e.Status != tt.status || e.Type != tt.typ || e.Code != string(tt.code) || f.Class != tt.code {
				t.Errorf("classFailure(%q) = %d %s %s (class %s), want %d %s %s", tt.class, e.Status, e.Type, e.Code, f.Class, tt.status, tt.typ, tt.code)
			}
			if e.RetryAfter != tt.retryAfter {
				t.Errorf("RetryAfter = %v, want %v", e.RetryAfter, tt.retryAfter)
			}
			if e.Message == "" {
				t.Error("empty message")
			}
			// The body is OpenAI's error shape.
			if b := string(e.Body()); !strings.HasPrefix(b, `{"error":{"message":`) || !strings.Contains(b, `"code":"`+string(tt.code)+`"`) {
				t.Errorf("body = %s", b)
			}
		})
	}
}

func TestCauseClass(t *testing.T) {
	tests := []struct {
		cause error
		want  policy.Class
	}{
		{errTTFTTimeout, policy.ClassTTFTTimeout},
		{errIdleTimeout, policy.ClassIdleTimeout},
		{errTotalTimeout, policy.ClassTimeout},
		{errShutdown, policy.ClassShutdown},
		{errClientWrite, policy.ClassClientCancel},
		{nil, policy.ClassClientCancel}, // plain cancel: the client went away
		{context.DeadlineExceeded, policy.ClassClientCancel},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(tt.cause)
		if got := causeClass(ctx); got != tt.want {
			t.Errorf("causeClass(%v) = %q, want %q", tt.cause, got, tt.want)
		}
	}
	// The cause of a parent reaches the attempt's context (the drain deadline).
	parent, cancelParent := context.WithCancelCause(context.Background())
	child, cancelChild := context.WithCancelCause(parent)
	defer cancelChild(nil)
	cancelParent(errShutdown)
	if got := causeClass(child); got != policy.ClassShutdown {
		t.Errorf("child of a shut-down parent: %q, want %q", got, policy.ClassShutdown)
	}
	if got := transportClass(context.Background()); got != policy.ClassConnect {
		t.Errorf("transportClass(live ctx) = %q, want %q", got, policy.ClassConnect)
	}
	if got := transportClass(child); got != policy.ClassShutdown {
		t.Errorf("transportClass(shut-down ctx) = %q, want %q", got, policy.ClassShutdown)
	}
}

func TestReadBounded(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789"), 2000) // 20000 bytes: several buffer growths
	boom := errors.New("boom")
	tests := []struct {
		name         string
		r            io.Reader
		limit        int
		wantBody     []byte
		wantComplete bool
		wantErr      error
		wantBeat     bool
	}{
		{"empty", bytes.NewReader(nil), 100, []byte{}, true, nil, false},
		{"small", strings.NewReader("hello"), 100, []byte("hello"), true, nil, true},
		{"one byte at a time", iotest.OneByteReader(strings.NewReader("hello")), 100, []byte("hello"), true, nil, true},
		{"data with EOF", iotest.DataErrReader(strings.NewReader("hello")), 100, []byte("hello"), true, nil, true},
		{"large, under the limit", bytes.NewReader(big), len(big) + 1, big, true, nil, true},
		{"over the limit", bytes.NewReader(big), 5000, big[:5000], false, nil, true},
		{"over a small limit", strings.NewReader("hello world"), 5, []byte("hello"), false, nil, true},
		{"read error", io.MultiReader(strings.NewReader("part"), iotest.ErrReader(boom)), 100, nil, false, boom, true},
		{"timeout error", iotest.TimeoutReader(strings.NewReader("hello")), 100, nil, false, iotest.ErrTimeout, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			wd := startWatchdog(0, time.Hour, causeFunc(cancel))
			defer wd.stop()
			var res result
			body, complete, err := readBounded(tt.r, tt.limit, 0, nil, wd, &res)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && !bytes.Equal(body, tt.wantBody) {
				t.Errorf("body = %d bytes %.40q, want %d bytes %.40q", len(body), body, len(tt.wantBody), tt.wantBody)
			}
			if complete != tt.wantComplete {
				t.Errorf("complete = %v, want %v", complete, tt.wantComplete)
			}
			if len(body) > tt.limit {
				t.Errorf("read %d bytes past the limit %d", len(body), tt.limit)
			}
			if got := wd.started.Load(); got != tt.wantBeat {
				t.Errorf("watchdog beaten = %v, want %v", got, tt.wantBeat)
			}
		})
	}
}

func TestFailBeforeFirstByte(t *testing.T) {
	shutdown, cancelShutdown := context.WithCancelCause(context.Background())
	cancelShutdown(errShutdown)
	gone, cancelGone := context.WithCancel(context.Background())
	cancelGone()
	tests := []struct {
		name      string
		ctx       context.Context
		err       error
		class     policy.Class
		status    int
		retryable bool
		reported  bool // counted against the endpoint
	}{
		{"closed without an answer", context.Background(), io.EOF, policy.ClassEmptyResponse, 502, true, true},
		{"broken connection", context.Background(), io.ErrUnexpectedEOF, policy.ClassConnect, 502, true, true},
		{"event over the gateway's bound", context.Background(), openai.ErrEventTooLarge, policy.ClassUpstreamError, 502, true, false},
		{"client gone", gone, context.Canceled, policy.ClassClientCancel, statusClientClosed, false, false},
		{"drain deadline", shutdown, context.Canceled, policy.ClassShutdown, 503, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, err := upstream.NewCluster(upstream.Options{
				Name:      "c",
				Endpoints: []upstream.EndpointSpec{{URL: "http://127.0.0.1:1"}},
				Outlier:   upstream.Outlier{ConsecutiveFailures: 1, BaseEjection: time.Minute, MaxEjection: time.Minute, MaxEjectionPercent: 100},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ep := cl.Endpoints()[0]
			var res result
			(&Handler{}).failBeforeFirstByte(tt.ctx, tt.err, ep, &res)
			if res.class() != tt.class || res.status != tt.status || res.fail.Retryable() != tt.retryable {
				t.Errorf("class %q status %d retryable %v, want %q %d %v", res.class(), res.status, res.fail.Retryable(), tt.class, tt.status, tt.retryable)
			}
			if res.fail == nil || res.fail.Code != string(tt.class) {
				t.Errorf("failure = %v, want code %q", res.fail, tt.class)
			}
			if got := cl.Snapshot()[0].Failures == 1; got != tt.reported {
				t.Errorf("reported against the endpoint = %v, want %v", got, tt.reported)
			}
		})
	}
}

// TestCommitKeepsRequestID: the client gets the gateway's request id (its own, or the one
// generated), even when the upstream answers with an X-Request-Id of its own.
func TestCommitKeepsRequestID(t *testing.T) {
	for _, clientID := range []string{"client-id-1", ""} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		if clientID != "" {
			r.Header.Set("X-Request-Id", clientID)
		}
		w := httptest.NewRecorder()
		ex := newExchange(w, r, 0)
		if clientID != "" && ex.id != clientID {
			t.Fatalf("exchange id %q, want the client's %q", ex.id, clientID)
		}
		ex.commit(http.StatusOK, http.Header{
			"X-Request-Id": {"upstream-id"}, "Content-Length": {"12"}, "Connection": {"X-Up"}, "X-Up": {"1"}, "X-Other": {"kept"},
		}, &result{cluster: "c", attempts: 2})
		h := w.Result().Header
		if got := h.Get("X-Request-Id"); got != ex.id {
			t.Errorf("client %q: response X-Request-Id = %q, want %q", clientID, got, ex.id)
		}
		if h.Get("Content-Length") != "" || h.Get("X-Up") != "" || h.Get("X-Other") != "kept" {
			t.Errorf("response headers: %v", h)
		}
		if h.Get("X-Sluice-Upstream") != "c" || h.Get("X-Sluice-Attempts") != "2" {
			t.Errorf("sluice headers: %v", h)
		}
	}
}

func TestIsAPIPath(t *testing.T) {
	tests := []struct {
		path string
		want bool
	}{
		{"/v1", true},
		{"/v1/", true},
		{"/v1/chat/completions", true},
		{"/v1/models/org/name", true},
		{"/v1/models/v1.5", true},
		{"/v1/models/..hidden", true},
		{"/v1/models/...", true},
		{"/", false},
		{"/v2/chat", false},
		{"/v1x", false},
		{"/metrics", false},
		{"/v1/..", false},
		{"/v1/../metrics", false},
		{"/v1/chat/../embeddings", false},
		{"/v1/./models", false},
		{"/v1/models/.", false},
	}
	for _, tt := range tests {
		// What parse lets through: under /v1, and no dot segment.
		if got := underV1(tt.path) && !hasDotSegment(tt.path); got != tt.want {
			t.Errorf("%q served = %v, want %v", tt.path, got, tt.want)
		}
	}
}

// FuzzHasDotSegment: a path without a dot is decided without walking its segments, as the
// walk decides it (the seeds, every go test, hold the "//" cases at each end).
func FuzzHasDotSegment(f *testing.F) {
	for _, p := range []string{"", "/", "//", "///", "/v1", "/v1/", "/v1//", "/v1///", "//v1", "/v1//chat",
		"/v1/chat/completions", "/v1/chat/completions/", "v1//", "a//b", "/;x", "/v1/;/x", "/v1/models/a;b",
		"\\", "/v1\\chat", "/v1/./x", "/v1/x.y", "/v1//x", "/v1/../x", "/v1/..;a/x"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if got, want := hasDotSegment(p), strings.IndexByte(p, '\\') >= 0 || walkDotSegments(p); got != want {
			t.Errorf("hasDotSegment(%q) = %v, the walk says %v", p, got, want)
		}
	})
}

// attemptsValue's header values are shared for small counts (capped, so an Add copies).
func TestAttemptsValue(t *testing.T) {
	if v := attemptsValue(3); !reflect.DeepEqual(v, []string{"3"}) || cap(v) != 1 {
		t.Errorf("attemptsValue(3) = %v (cap %d)", v, cap(v))
	}
	if v := attemptsValue(99); !reflect.DeepEqual(v, []string{"99"}) {
		t.Errorf("attemptsValue(99) = %v", v)
	}
}

func TestMemoryWatch(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const mib = 1 << 20
	type step struct {
		at   time.Duration // after t0
		m    memSample
		want bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"mostly free after a burst", []step{{0, memSample{inUse: 40 * mib, retained: 400 * mib, goroutines: 20}, true}}},
		{"steady load: free share small", []step{
			{0, memSample{inUse: 200 * mib, retained: 120 * mib, goroutines: 4000}, false},
			{time.Minute, memSample{inUse: 210 * mib, retained: 110 * mib, goroutines: 3900}, false},
		}},
		{"little to return", []step{{0, memSample{inUse: 10 * mib, retained: 50 * mib, goroutines: 20}, false}}},
		{"released just now, then again after the gap", []step{
			{0, memSample{inUse: 40 * mib, retained: 400 * mib}, true},
			{10 * time.Second, memSample{inUse: 40 * mib, retained: 400 * mib}, false},
			{time.Minute, memSample{inUse: 40 * mib, retained: 400 * mib}, true},
		}},
		// The burst's garbage is not collected yet: the heap "in use" is still its size.
		{"burst ended, garbage not collected", []step{
			{0, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 16}, false},
			{time.Second, memSample{inUse: 480 * mib, retained: 10 * mib, goroutines: 18018}, false},
			{2 * time.Second, memSample{inUse: 470 * mib, retained: 20 * mib, goroutines: 18}, true},
			{40 * time.Second, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 18}, false},
		}},
		{"burst ended, little held", []step{
			{0, memSample{inUse: 10 * mib, retained: 5 * mib, goroutines: 3000}, false},
			{time.Second, memSample{inUse: 30 * mib, retained: 10 * mib, goroutines: 20}, false},
		}},
		{"load fell by half: not a burst's end", []step{
			{0, memSample{inUse: 300 * mib, retained: 10 * mib, goroutines: 8000}, false},
			{time.Second, memSample{inUse: 300 * mib, retained: 10 * mib, goroutines: 4000}, false},
		}},
		{"a small pool emptied: not a burst", []step{
			{0, memSample{inUse: 100 * mib, retained: 10 * mib, goroutines: 400}, false},
			{time.Second, memSample{inUse: 100 * mib, retained: 10 * mib, goroutines: 16}, false},
		}},
		// A load of small requests: no goroutines left behind, but garbage and free memory.
		{"a load ended", []step{
			{0, memSample{inUse: 10 * mib, retained: 2 * mib, goroutines: 18, allocs: 5 * mib}, false},
			{time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 150, allocs: 300 * mib}, false},
			{2 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 18, allocs: 300*mib + 100<<10}, false},
			{3 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 18, allocs: 300*mib + 200<<10}, false},
			{4 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 18, allocs: 300*mib + 300<<10}, true},
			// At rest again: quiet, but nothing allocated since the release to speak of.
			{time.Minute, memSample{inUse: 17 * mib, retained: 2 * mib, goroutines: 18, allocs: 310 * mib}, false},
		}},
		// The last of a few loads with pauses: the one before was released 12 s ago.
		{"a second load ended soon after a release", []step{
			{0, memSample{inUse: 10 * mib, retained: 2 * mib, allocs: 0}, false},
			{time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 100 * mib}, false},
			{2 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 100 * mib}, false},
			{3 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 100 * mib}, false},
			{4 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 100 * mib}, true},
			{10 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 300 * mib}, false},
			{11 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 300 * mib}, false},
			{12 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 300 * mib}, false},
			{13 * time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, allocs: 300 * mib}, true},
		}},
		// Thousands of idle streams: their quiet after they opened looks like a load's end;
		// that release does not hold back the one when they go.
		{"a load's release, then a burst's end", []step{
			{0, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 16, allocs: 0}, false},
			{time.Second, memSample{inUse: 480 * mib, retained: 10 * mib, goroutines: 18018, allocs: 400 * mib}, false},
			{2 * time.Second, memSample{inUse: 480 * mib, retained: 10 * mib, goroutines: 18018, allocs: 400 * mib}, false},
			{3 * time.Second, memSample{inUse: 480 * mib, retained: 10 * mib, goroutines: 18018, allocs: 400 * mib}, false},
			{4 * time.Second, memSample{inUse: 480 * mib, retained: 10 * mib, goroutines: 18018, allocs: 400 * mib}, true},
			{20 * time.Second, memSample{inUse: 470 * mib, retained: 20 * mib, goroutines: 18, allocs: 410 * mib}, true},
		}},
		// 100 small requests a second (7 KiB each): a light load, not an idle gateway.
		{"a light load goes on", []step{
			{0, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 20, allocs: 0}, false},
			{time.Minute, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 20, allocs: 41 * mib}, false},
			{time.Minute + time.Second, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 20, allocs: 41*mib + 700<<10}, false},
			{time.Minute + 2*time.Second, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 20, allocs: 41*mib + 1400<<10}, false},
			{time.Minute + 3*time.Second, memSample{inUse: 20 * mib, retained: 5 * mib, goroutines: 20, allocs: 41*mib + 2100<<10}, false},
		}},
		{"a load goes on", []step{
			{0, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 40, allocs: 0}, false},
			{time.Minute, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 40, allocs: 800 * mib}, false},
			{time.Minute + time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 40, allocs: 813 * mib}, false},
			{time.Minute + 2*time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 40, allocs: 826 * mib}, false},
			{time.Minute + 3*time.Second, memSample{inUse: 30 * mib, retained: 20 * mib, goroutines: 40, allocs: 839 * mib}, false},
		}},
		{"a load ended, little held", []step{
			{0, memSample{inUse: 8 * mib, retained: 2 * mib, allocs: 0}, false},
			{time.Second, memSample{inUse: 8 * mib, retained: 2 * mib, allocs: 200 * mib}, false},
			{2 * time.Second, memSample{inUse: 8 * mib, retained: 2 * mib, allocs: 200 * mib}, false},
			{3 * time.Second, memSample{inUse: 8 * mib, retained: 2 * mib, allocs: 200 * mib}, false},
			{4 * time.Second, memSample{inUse: 8 * mib, retained: 2 * mib, allocs: 200 * mib}, false},
		}},
		{"the peak starts over at a release", []step{
			{0, memSample{inUse: 300 * mib, retained: 10 * mib, goroutines: 5000}, false},
			{time.Second, memSample{inUse: 40 * mib, retained: 400 * mib, goroutines: 20}, true},
			{time.Minute, memSample{inUse: 100 * mib, retained: 10 * mib, goroutines: 1000}, false},
		}},
	} {
		var w memoryWatch
		for i, st := range tc.steps {
			if got := w.observe(st.m, t0.Add(st.at)); got != st.want {
				t.Errorf("%s: step %d: observe = %v, want %v", tc.name, i, got, st.want)
			}
		}
	}
}

// TestMemoryWatchIdle: the watch is idle after quietSamples quiet samples in a row (the
// sample whose quiet releases the memory after a load included), and not from the first
// sample that allocates quietAlloc or more; the memory loop drops the heap floor while idle.
func TestMemoryWatchIdle(t *testing.T) {
	const kib = 1 << 10
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var w memoryWatch
	allocs := uint64(0)
	for i, st := range []struct {
		alloc uint64 // since the previous sample
		idle  bool
	}{
		{0, false}, {10 * kib, false}, {10 * kib, true}, // a gateway just started: quiet
		{64 << 20, false}, {13 << 20, false}, // a load
		{100 * kib, false}, {100 * kib, false}, {100 * kib, true}, // its end (and its release)
		{100 * kib, true},
		{quietAlloc, false}, // a trickle of requests is not idle
		{0, false}, {0, false}, {0, true},
	} {
		allocs += st.alloc
		w.observe(memSample{inUse: 30 << 20, retained: 10 << 20, goroutines: 18, allocs: allocs}, t0.Add(time.Duration(i)*time.Second))
		if w.idle() != st.idle {
			t.Errorf("sample %d (%d KiB allocated): idle %v, want %v", i, st.alloc/kib, w.idle(), st.idle)
		}
	}
}

// TestBusyFloor: the floor is held at hold, let go at drop, held again at the next hold, and
// never again once closed.
func TestBusyFloor(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: heapfloor holds nothing")
	}
	base := heapfloor.Held()
	f := &busyFloor{bytes: 32 << 20}
	for i, st := range []struct {
		op   func()
		held int
	}{
		{f.hold, 1}, {f.hold, 1}, {f.drop, 0}, {f.drop, 0}, {f.hold, 1}, {f.close, 0}, {f.hold, 0},
	} {
		st.op()
		if got := heapfloor.Held() - base; got != st.held {
			t.Errorf("step %d: %d floors held, want %d", i, got, st.held)
		}
	}
}

// TestBusyFloorRequests: while the floor is let go, requests at a load's rate (floorRearm
// within floorRearmWithin) hold it again at once; slower ones do not (the memory loop's
// samples decide for them); a held or closed floor is left as it is.
func TestBusyFloorRequests(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: heapfloor holds nothing")
	}
	base := heapfloor.Held()
	held := func() int { return heapfloor.Held() - base }
	f := &busyFloor{bytes: 32 << 20}
	defer f.close()
	f.hold()
	for range 10 * floorRearm {
		f.request() // held: nothing to do
	}
	if held() != 1 {
		t.Fatalf("%d floors held after requests on a held floor, want 1", held())
	}
	f.drop()
	// A trickle: each floorRearm requests more than floorRearmWithin after the last ones.
	for range 5 {
		f.mark.Store(int64(time.Since(floorEpoch) - 2*floorRearmWithin))
		for range floorRearm {
			f.request()
		}
		if held() != 0 {
			t.Fatalf("%d floors held after a trickle of requests, want 0", held())
		}
	}
	// A load: floorRearm requests at once.
	for range floorRearm {
		f.request()
	}
	if held() != 1 || f.dropped.Load() {
		t.Fatalf("%d floors held after a burst of requests (dropped %v), want 1", held(), f.dropped.Load())
	}
	f.close()
	for range 4 * floorRearm {
		f.request()
	}
	if held() != 0 {
		t.Fatalf("%d floors held after requests on a closed floor, want 0", held())
	}
}

// readMem samples the runtime's memory, as the memory loop does.
func readMem() memSample { return newMemReader().read() }

// TestMemoryWatchSeesABurstEnd: with the runtime's own figures, a burst of goroutines holding
// memory that ended, its garbage not yet collected, is a release, and the release returns it.
func TestMemoryWatchSeesABurstEnd(t *testing.T) {
	var w memoryWatch
	now := time.Now()
	var wg sync.WaitGroup
	stop, held := make(chan struct{}), make(chan struct{}, 2000)
	for range 2000 {
		wg.Go(func() {
			b := make([]byte, 64<<10)
			b[0] = 1
			held <- struct{}{}
			<-stop
			b[len(b)-1] = b[0]
		})
	}
	for range 2000 {
		<-held
	}
	if w.observe(readMem(), now) {
		t.Fatal("observe released while the burst was held")
	}
	close(stop)
	wg.Wait()
	m := readMem()
	if !w.observe(m, now.Add(time.Second)) {
		t.Fatalf("observe did not release after the burst ended (in use %d MiB, retained %d MiB, %d goroutines, peak %d)",
			m.inUse>>20, m.retained>>20, m.goroutines, w.peak)
	}
	releaseMemory()
	if after := readMem(); after.inUse+after.retained > (m.inUse+m.retained)/2 {
		t.Errorf("held %d MiB before the release, %d MiB after; want at most half", (m.inUse+m.retained)>>20, (after.inUse+after.retained)>>20)
	}
}

// TestReadMemAfterABurst: after a burst of goroutines and garbage, the retained free memory
// readMem reports is what FreeOSMemory gives back.
func TestReadMemAfterABurst(t *testing.T) {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	sink := make([][]byte, 0, 2000)
	var mu sync.Mutex
	for range 2000 {
		wg.Go(func() {
			b := make([]byte, 64<<10)
			mu.Lock()
			sink = append(sink, b)
			mu.Unlock()
			<-stop
		})
	}
	close(stop)
	wg.Wait()
	sink = nil
	_ = sink
	runtime.GC()
	before := readMem()
	debug.FreeOSMemory()
	after := readMem()
	if before.retained < 64<<20 || after.retained >= before.retained/4 {
		t.Errorf("retained free memory %d MiB before FreeOSMemory, %d MiB after; want ≥ 64 MiB returned", before.retained>>20, after.retained>>20)
	}
}

func TestJSONContentType(t *testing.T) {
	for _, tc := range []struct {
		ct   string
		want bool
	}{
		{"application/json", true},
		{"Application/JSON", true},
		{"application/json; charset=utf-8", true},
		{"application/json;charset=UTF-8", true},
		{"application/vnd.api+json", true},
		{"application/jsonx", false},
		{"application/jso", false},
		{"text/json", false},
		{"text/plain", false},
		{"multipart/form-data; boundary=x", false},
		{"", false},
		{"application/json; =bad", false},
	} {
		if got := jsonContentType(tc.ct); got != tc.want {
			t.Errorf("jsonContentType(%q) = %v, want %v", tc.ct, got, tc.want)
		}
	}
}

// startWatchdog starts a watchdog of its own (the attempt's is in its attemptScope).
func startWatchdog(ttft, idle time.Duration, cancel ender) *watchdog {
	w := new(watchdog)
	w.start(ttft, idle, cancel)
	return w
}

// TestServedModels: a name learnt is had (by readers at any time: -race runs the learners
// beside them), an empty or overlong one is not learnt, and past maxServedModels no new
// name is.
func TestServedModels(t *testing.T) {
	var s servedModels
	if s.has("m") {
		t.Fatal("an empty set has a name")
	}
	s.learn("")
	s.learn(strings.Repeat("x", 257))
	if s.has("") || s.has(strings.Repeat("x", 257)) {
		t.Error("an empty or overlong name was learnt")
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = s.has("model-7")
			}
		}
	}()
	for i := range maxServedModels + 10 {
		s.learn(fmt.Sprintf("model-%d", i))
		s.learn(fmt.Sprintf("model-%d", i)) // again: nothing changes
	}
	close(stop)
	wg.Wait()
	for i := range maxServedModels + 10 {
		if got, want := s.has(fmt.Sprintf("model-%d", i)), i < maxServedModels; got != want {
			t.Errorf("model-%d: has %v, want %v", i, got, want)
		}
	}
	if n := len(*s.names.Load()); n != maxServedModels {
		t.Errorf("%d names kept, want %d", n, maxServedModels)
	}
}

// deadlineRecorder is a ResponseWriter whose read and write deadlines are recorded.
type deadlineRecorder struct {
	http.ResponseWriter
	reads, writes []time.Time
}

func (d *deadlineRecorder) SetReadDeadline(t time.Time) error {
	d.reads = append(d.reads, t)
	return nil
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.writes = append(d.writes, t)
	return nil
}

// TestDeadlineWriterFinish: over HTTP/1 the end of a request moves the connection's write
// deadline as a write does: not when it was moved within a quarter of the time-out (the
// flush after the handler keeps at least three quarters), and when it was moved longer ago.
func TestDeadlineWriterFinish(t *testing.T) {
	rec := &deadlineRecorder{ResponseWriter: httptest.NewRecorder()}
	rc := http.NewResponseController(rec)
	w := &deadlineWriter{ResponseWriter: rec, rc: rc, d: time.Minute}
	w.push(time.Now())
	w.finish()
	if len(rec.writes) != 1 {
		t.Fatalf("a request that ended at once moved its deadline %d times, want 1 (its start)", len(rec.writes))
	}
	w.set -= 2 * time.Second // moved two seconds ago: more than min(1 s, a quarter of a minute)
	before := time.Now()
	w.finish()
	if len(rec.writes) != 2 || rec.writes[1].Before(before.Add(w.d)) {
		t.Fatalf("a request that ended two seconds after its last move: deadlines %v", rec.writes)
	}
}

// arrivedBody is a request body that says whether it is in its server's buffer whole.
type arrivedBody struct {
	io.Reader
	whole bool
}

func (b *arrivedBody) Close() error  { return nil }
func (b *arrivedBody) Arrived() bool { return b.whole }

// TestBodyDeadlineOnlyWhileComing: the body time-out is a read deadline set while the body
// may still be coming, lifted once it was read; a body the server holds whole already gets
// none (no deadline set, none lifted).
func TestBodyDeadlineOnlyWhileComing(t *testing.T) {
	srv := newTestServer(t, "http://127.0.0.1:1") // refused: the answer is a 502, after the body was read
	h := &Handler{srv: srv}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, whole := range []bool{true, false} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.Body = &arrivedBody{Reader: strings.NewReader(body), whole: whole}
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Type", "application/json")
		w := &deadlineRecorder{ResponseWriter: httptest.NewRecorder()}
		h.ServeHTTP(w, r)
		switch {
		case whole && len(w.reads) != 0:
			t.Errorf("a body held whole: read deadlines %v, want none", w.reads)
		case !whole && (len(w.reads) != 2 || w.reads[0].IsZero() || !w.reads[1].IsZero()):
			t.Errorf("a body still coming: read deadlines %v, want one set and lifted", w.reads)
		}
	}
}
