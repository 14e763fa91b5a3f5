package proxy

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
	"github.com/sluicegw/sluice/policy/fault"
	"github.com/sluicegw/sluice/policy/openai"
	"github.com/sluicegw/sluice/proxy/httphead"
	"github.com/sluicegw/sluice/proxy/scope"
	"github.com/sluicegw/sluice/shadow"
)

// exchange is one client request's bookkeeping on its way through the handler.
type exchange struct {
	w         http.ResponseWriter
	r         *http.Request
	rc        http.ResponseController // the client connection's deadlines
	flusher   http.Flusher
	id        string
	idv       [1]string // id as a header value (idHeader), shared by the answer's and the upstream requests' headers
	start     time.Time
	preq      *policy.Request
	committed bool // headers went to the client: no more retries, errors go in-band
	sse       bool // what was committed is an event stream (an in-band error event can end it)
	// policyHeader holds the headers the admission policies set (x-ratelimit-*): they win
	// over the upstream's headers of the same name, which describe the gateway's own key.
	policyHeader http.Header
	outcome      policy.Outcome

	// Resuming a cut stream (route resume: true, chat only).
	capture  bool              // collect the streamed text
	streamed openai.StreamText // what was relayed so far, and whether a continuation can carry it
	contBody []byte            // when set, sent instead of the request's body (a continuation)
	carryTap *openai.Tap       // the cut attempt's tap, continued by the resumed one

	inj      *fault.Injection      // chaos faults of this request, nil when none
	filters  []policy.StreamFilter // the route's stream filters
	bodies   []policy.BodyFilter   // the route's body filters
	flags    []policy.Class        // what the stream watchers flagged, for the Outcome
	mirror   *shadow.Job           // the request's mirrored copy, nil when not mirrored
	streamID []byte                // the first stream's chunk id (raw JSON), kept by the resumed one
	home     string                // the endpoint holding the stored answer the request refers to ("": none)

	corsOrigin string          // the request's Origin when cors allows it
	held       int64           // bytes of the answer buffers this request holds (given back at the end)
	body       *bodyDeadline   // the body under the body time-out, nil when none
	write      *deadlineWriter // the write time-out on the client's writer (under any chaos wrapper), nil when none

	// What write, body and preq point to when set, held here: one allocation, not four.
	writev deadlineWriter
	bodyv  bodyDeadline
	preqv  policy.Request

	// scope is the request's scope (ServeHTTP: the total time-out), and dones the backing of
	// its admission's Done callbacks (a guard and a limiter: no allocation), held here for
	// the same reason.
	scope scope.Scope
	dones [4]func(policy.Outcome)
}

func newExchange(w http.ResponseWriter, r *http.Request, write time.Duration) *exchange {
	ex := &exchange{r: r, start: time.Now()}
	ex.rc = *http.NewResponseController(w)
	if write > 0 {
		ex.writev = deadlineWriter{ResponseWriter: w, rc: &ex.rc, d: write, h2: r.ProtoMajor == 2}
		ex.write = &ex.writev
		if !ex.write.h2 {
			// Every write on the connection is bounded from the request's start: the
			// server's own (100 Continue, its flush after the handler returns) included.
			ex.write.push(ex.start)
		}
		w = ex.write
	}
	ex.w = w
	ex.flusher, _ = w.(http.Flusher)
	ex.id = httphead.Get(r.Header, "X-Request-Id")
	if ex.id == "" || len(ex.id) > 128 {
		ex.id = newRequestID()
	}
	w.Header()["X-Request-Id"] = ex.idHeader()
	return ex
}

// epoch is the origin of mono, read with its monotonic clock.
var epoch = time.Now()

// mono is the time since epoch: one clock read, where time.Now reads the wall clock too
// (twice the cost of a clock read on the relay's path, which reads it for every event).
func mono() time.Duration { return time.Since(epoch) }

// deadlineWriter bounds each write to the client by the write time-out: a client that stops
// reading (or reads a byte a second) fails the write, which ends the request and releases
// its upstream.
//
// HTTP/1: the connection's deadline bounds only the writes made while it runs, so it is
// pushed forward at most every quarter of the time-out (and at most once a second): a clock
// read per write, and a write has at least three quarters of the time-out.
//
// HTTP/2: a stream's deadline is a timer that resets the stream when it fires, writing or
// not, which would cut a stream waiting on its model server. Each write arms a timer of its
// own instead, stopped when the write returns; when it fires, the stream is reset at once.
// A connection that takes no bytes at all (a client that stops reading the TCP connection,
// where no reset can be written) is closed by the server's HTTP/2 WriteByteTimeout.
type deadlineWriter struct {
	http.ResponseWriter
	rc  *http.ResponseController
	d   time.Duration
	set time.Duration // HTTP/1: when the deadline was last pushed forward (a mono reading)

	h2      bool
	t       *time.Timer // HTTP/2: armed while a write runs
	mu      sync.Mutex  // HTTP/2: orders the timer's reset with the end of the request
	ended   bool
	expired atomic.Bool // HTTP/2: the timer fired and reset the stream
}

// push sets the deadline to now plus the time-out.
func (w *deadlineWriter) push(now time.Time) {
	_ = w.rc.SetWriteDeadline(now.Add(w.d))
	w.set = now.Sub(epoch)
}

// begin bounds the write that starts now, and returns when (a mono reading): the wall
// clock is read only when the deadline moves.
func (w *deadlineWriter) begin() time.Duration {
	now := mono()
	switch {
	case !w.h2:
		if now-w.set >= min(time.Second, w.d/4) {
			w.push(time.Now())
		}
	case w.t == nil:
		w.t = time.AfterFunc(w.d, w.expire)
	default:
		w.t.Reset(w.d)
	}
	return now
}

// end is the write's end: a write that failed after the client held it up (the time-out
// fired on it, or it waited half of it) failed because the client stopped reading, whatever
// error the connection reports.
func (w *deadlineWriter) end(start time.Duration, err error) error {
	if w.h2 {
		w.t.Stop()
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && (w.expired.Load() || mono()-start >= w.d/2) {
		err = fmt.Errorf("%w: %w", os.ErrDeadlineExceeded, err)
	}
	return err
}

// expire resets the HTTP/2 stream whose write outlasted the time-out.
func (w *deadlineWriter) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	w.expired.Store(true)
	_ = w.rc.SetWriteDeadline(time.Unix(1, 0)) // in the past: the stream is reset now
}

// finish bounds what the server writes after the handler returns (the rest of the answer).
func (w *deadlineWriter) finish() {
	if w.h2 {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
		if w.t != nil {
			w.t.Stop()
		}
		if w.expired.Load() {
			return // reset already
		}
	}
	// HTTP/1: the connection's deadline, moved as begin moves it (a request that ends soon
	// after its last write leaves its flush at least three quarters of the time-out: no
	// clock read of the wall time, nor alarm moved, for most requests); HTTP/2: the stream's
	// own timer, which the server stops when the stream ends.
	if !w.h2 && mono()-w.set < min(time.Second, w.d/4) {
		return
	}
	w.push(time.Now())
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	start := w.begin()
	n, err := w.ResponseWriter.Write(p)
	return n, w.end(start, err)
}

func (w *deadlineWriter) WriteHeader(code int) {
	start := w.begin()
	w.ResponseWriter.WriteHeader(code)
	_ = w.end(start, nil)
}

func (w *deadlineWriter) Flush() {
	start := w.begin()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	_ = w.end(start, nil)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// release gives back what the request holds of the gateway once it has ended: its share of
// the answer buffers, and its connection's read deadline (which a keep-alive connection
// would otherwise carry into its next request). The write deadline is pushed forward, not
// lifted: the server flushes the answer after the handler returns, and that write is bounded
// too (the next request sets its own).
func (ex *exchange) release(b *answerBuffers) {
	ex.giveBack(b)
	ex.settleDeadlines()
}

// giveBack returns the request's share of the answer buffers: at the end, and before each
// further attempt (the answer of the one before is dropped).
func (ex *exchange) giveBack(b *answerBuffers) {
	if ex.held > 0 {
		b.give(ex.held)
		ex.held = 0
	}
}

func (ex *exchange) settleDeadlines() {
	// The read deadline is the body's (ServeHTTP), lifted by the body's own read of its
	// end (bodyDeadline.Read); a body cut off by its time-out, or left unread, keeps it: the
	// server would otherwise wait for the rest of it, holding the connection, before
	// closing it.
	if ex.write != nil {
		ex.write.finish()
	}
}

// bodyDeadline lifts the body's read deadline when the body has been read to its end, and
// records whether the body time-out cut it off. A pass-through body is read by the upstream
// transport's own goroutine, and both marks by the handler's.
type bodyDeadline struct {
	io.ReadCloser
	rc       *http.ResponseController
	done     atomic.Bool // read to its end
	timedOut atomic.Bool // a read failed on the body time-out
}

func (b *bodyDeadline) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		if b.done.CompareAndSwap(false, true) {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.timedOut.Store(true)
	}
	return n, err
}

// bodyTimedOut reports whether the request's body was cut off by the body time-out.
func (ex *exchange) bodyTimedOut() bool { return ex.body != nil && ex.body.timedOut.Load() }

// writeFailed is the failure of a write to the client: it stopped reading (the write
// time-out), or went away.
func writeFailed(err error) *policy.Failure {
	c := policy.ClassClientCancel
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c = policy.ClassClientStalled
	}
	f := policy.Failf(c, err, "")
	f.Phase = policy.InStream
	return f
}

// commit writes the response headers: the upstream's (hop-by-hop and length dropped) plus
// Sluice's own.
func (ex *exchange) commit(status int, upstream http.Header, res *result) {
	h := ex.w.Header()
	// The model server's CORS headers are dropped (only Sluice's own allowance stands), and
	// its length (the answer is relayed as it comes).
	httphead.CopyEndToEndExcept(h, upstream, answerSkips)
	if ex.corsOrigin != "" {
		setCORS(h, ex.corsOrigin)
	}
	for k, vs := range ex.policyHeader {
		h[k] = vs
	}
	h["X-Request-Id"] = ex.idHeader() // ours, even if the upstream answered with its own
	if res.named != nil && res.named[0] == res.cluster {
		h["X-Sluice-Upstream"] = res.named
	} else {
		httphead.Set(h, "X-Sluice-Upstream", res.cluster)
	}
	h["X-Sluice-Attempts"] = attemptsValue(res.attempts)
	ex.w.WriteHeader(status)
	ex.committed = true
}

// answerSkips reports the model server's answer headers the client does not get.
func answerSkips(k string) bool {
	return k == "Content-Length" || strings.HasPrefix(k, "Access-Control-")
}

// writePending sends a complete buffered upstream answer.
func (ex *exchange) writePending(p *pending, res *result) {
	ex.commit(p.status, p.header, res)
	_, _ = ex.w.Write(p.body)
	if ex.mirror != nil {
		if p.orig != nil {
			ex.mirror.Capture(p.orig, false) // the model server's answer is what is compared
		} else {
			ex.mirror.Capture(p.body, false)
		}
	}
}

func (ex *exchange) flush() {
	if ex.flusher != nil {
		ex.flusher.Flush()
	}
}

// result is what an attempt (and then the whole forward loop) ended with.
type result struct {
	status int
	// fail is why it failed, nil on success: one class, its cause, what the client is told,
	// and its phase. Before the first byte the client gets it as an HTTP error (unless pending
	// holds the model server's own error answer, which is relayed instead); in the stream, as
	// an in-band error event.
	fail    *policy.Failure
	pending *pending // a complete upstream answer not yet written (relayed unless retried)
	// upstreamErr is the model server's own in-stream error event (raw), sent instead of
	// fail's rendering when the stream is not resumed.
	upstreamErr []byte
	cluster     string
	named       []string // cluster as a header value when it is the state's (clusterState.named)
	endpoint    string
	model       string
	attempts    int
	tap         openai.Tap
	wait        time.Duration // time waiting on the network (upstream reads, client writes)
	// cut is the class of the stream filter that ended the stream on its own word (the
	// client got the filter's tail and a whole stream): not a failure of the attempt, but
	// the request's error class.
	cut policy.Class
}

// class is the result's failure class, "" on success.
func (r *result) class() policy.Class {
	if r.fail == nil {
		return ""
	}
	return r.fail.Class
}

// failWith records f as the result's failure. Its status is the one the client gets, unless
// the client already has the answer's (a stream that broke in-band; a client that went away
// is 499 whenever it left).
func (r *result) failWith(f *policy.Failure) {
	r.fail = f
	if f.Phase == policy.BeforeFirstByte || clientSide(f.Class) {
		r.status = f.Status
	}
}

// pending is a buffered upstream answer.
type pending struct {
	status int
	header http.Header
	body   []byte
	orig   []byte // the model server's body when a body filter replaced it, else nil
}

// errorCode is the error code of a buffered upstream error answer ({"error":{"code":...}}).
func (r *result) errorCode() string {
	if r.pending == nil || r.pending.status < 400 {
		return ""
	}
	var b struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(r.pending.body, &b) != nil || b.Error.Code == nil {
		return ""
	}
	return fmt.Sprint(b.Error.Code)
}

// retryAfter is a buffered upstream answer's Retry-After (seconds), 0 when absent.
func (r *result) retryAfter() time.Duration {
	if r.pending == nil {
		return 0
	}
	v := r.pending.header.Get("Retry-After")
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// failed is the result of a request that failed before any attempt.
func failed(f *policy.Failure) result { return result{fail: f, status: f.Status} }

// idHeader is the request id as a header value, the exchange's own (however the exchange was
// built: the batcher makes its own), its capacity its length as headerValue's: an Add to one
// map copies it.
func (ex *exchange) idHeader() []string {
	if ex.idv[0] == "" {
		ex.idv[0] = ex.id
	}
	return ex.idv[:1:1]
}

// headerValue is a header's value list of v alone, for values shared between header maps and
// requests (the request id, constants): its capacity is its length, 1, so an Add to one map
// copies it rather than writing into the others'.
func headerValue(v string) []string { return []string{v} }

// attemptsValues are the X-Sluice-Attempts values of the usual attempt counts, shared.
var attemptsValues = func() [][]string {
	out := make([][]string, 16)
	for i := range out {
		out[i] = headerValue(strconv.Itoa(i))
	}
	return out
}()

// attemptsValue is the X-Sluice-Attempts value of n attempts.
func attemptsValue(n int) []string {
	if n >= 0 && n < len(attemptsValues) {
		return attemptsValues[n]
	}
	return headerValue(strconv.Itoa(n))
}

func newRequestID() string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rand.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	var s [32]byte
	hex.Encode(s[:], b[:])
	return string(s[:])
}

// sessionOf is the request's session: X-Session-ID, else the body's user field.
func sessionOf(r *http.Request, req *openai.Request) string {
	if s := httphead.Get(r.Header, "X-Session-Id"); s != "" {
		return s
	}
	return req.User
}

// underV1 reports whether p is /v1 or below it: the OpenAI API. (A path with a dot segment is
// refused as well, by hasDotSegment: an upstream that normalises it would serve a path outside
// /v1/, or another route's endpoint than the one matched.)
func underV1(p string) bool { return strings.HasPrefix(p, "/v1/") || p == "/v1" }

// hasDotSegment reports whether a path has a segment that some server or proxy would read
// as "." or "..": the plain ones, ones with path parameters ("..;x", which Tomcat and others
// strip), a backslash anywhere (read as a separator by some), or an empty segment ("//").
func hasDotSegment(p string) bool {
	if strings.IndexByte(p, '\\') >= 0 {
		return true
	}
	if strings.IndexByte(p, '.') < 0 {
		// No "." or ".." segment without a dot (every request of the API's paths): only an
		// empty segment is left, a "//" that neither starts the path nor ends it.
		k := strings.Index(p, "//")
		return k >= 0 && k+2 < len(p)
	}
	return walkDotSegments(p)
}

// walkDotSegments is hasDotSegment's walk over the segments of p, for a p with a dot.
func walkDotSegments(p string) bool {
	for i := 0; p != ""; i++ {
		var seg string
		seg, p, _ = strings.Cut(p, "/")
		if i > 0 && seg == "" && p != "" {
			return true // "//"
		}
		if k := strings.IndexByte(seg, ';'); k >= 0 {
			seg = seg[:k]
		}
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

func modelSuffix(m string) string {
	if m == "" {
		return ""
	}
	return " for model " + strconv.Quote(truncate(m, 256))
}

// truncate bounds a client-given string quoted back in a message or a log line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// jsonContentType reports whether a Content-Type names JSON: application/json or any
// application/*+json, parameters allowed.
func jsonContentType(ct string) bool {
	if len(ct) == len("application/json") && strings.EqualFold(ct, "application/json") {
		return true // what SDKs send: no parameters to parse (ParseMediaType allocates)
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
