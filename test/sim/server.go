package sim

import (
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// Server is the simulated model server. It is an http.Handler; create it with New and stop
// it with Close.
type Server struct {
	cfg       Config
	fast      bool
	metrics   *metrics
	modelJSON []byte // the model name as a JSON string
	created   int64
	idBase    uint64
	idSeq     atomic.Uint64

	rngMu sync.Mutex
	rng   *rand.Rand

	requests, completed, cancelled, aborted, errs atomic.Int64
	promptTokens, genTokens                       atomic.Int64
	fastRunning, fastPeak                         atomic.Int64
	nRunning, nWaiting, nKVUsed, nKVReserved      atomic.Int64
	nKVLeaked                                     atomic.Int64
	slowdown                                      atomic.Uint64 // float64 bits: Config.Slowdown, then SetSlowdown

	// Engine state, guarded by mu.
	mu             sync.Mutex
	waiting        []*seq
	running        []*seq
	kvReserved     int // Σ prompt + max output tokens of running sequences (admission)
	kvUsed         int // Σ prompt + generated tokens of running sequences (usage gauge)
	kvLeaked       int // tokens leaked by finished sequences (LeakKVPerRequest, SetKVLeak)
	maxRunningSeen int
	maxWaitingSeen int
	closed         bool

	stored respStore // Responses API: stored responses, for previous_response_id

	embedSlot chan struct{} // the one embedding engine: held for an embeddings request's cost
	wake      chan struct{}
	retime    chan struct{} // SetSlowdown: the step under way is re-timed
	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

var _ http.Handler = (*Server)(nil)

// New builds a server from cfg with defaults applied (invalid values, which Validate
// reports, are replaced by defaults too). Unless the configuration has no simulated latency
// at all (the fast path), it starts the scheduler goroutine, which Close stops.
func New(cfg Config) *Server {
	cfg = cfg.withDefaults()
	now := time.Now()
	s := &Server{
		cfg:       cfg,
		fast:      cfg.fastPath(),
		modelJSON: openai.AppendString(nil, cfg.Model),
		created:   now.Unix(),
		idBase:    mix64(uint64(now.UnixNano())),
		rng:       rand.New(rand.NewPCG(uint64(cfg.Seed), 0x51a1ce)),
		embedSlot: make(chan struct{}, 1),
		wake:      make(chan struct{}, 1),
		retime:    make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	s.slowdown.Store(math.Float64bits(cfg.Slowdown))
	s.metrics = newMetrics(s)
	if !s.fast {
		s.wg.Add(1)
		go s.loop()
	}
	return s
}

// Config returns the configuration in use, defaults applied.
func (s *Server) Config() Config { return s.cfg }

// Close stops the scheduler and waits for it to exit. Requests still in the engine are
// answered 503 (or their stream ends without [DONE]); later requests that need the engine
// get 503. Close is safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.stop)
		s.wg.Wait()
	})
}

// Stats is a snapshot of the server's counters. Requests, Completed, Cancelled, Aborted and
// Errors count HTTP requests to the API endpoints; Running, Waiting and the peaks count
// sequences (one per chat answer, completions prompt or embeddings input), like vLLM.
type Stats struct {
	Requests         int64   // API requests received (chat, completions, responses, embeddings), errors included
	Completed        int64   // answered in full
	Cancelled        int64   // the client went away before the answer was complete
	Aborted          int64   // connections killed on purpose (x-sim-die-after)
	Errors           int64   // answered with an error status, or a stream ended by an error event (x-sim-error-after)
	Running          int     // sequences running now (generated inline, on the fast path)
	Waiting          int     // sequences waiting for admission now
	PeakRunning      int     // most sequences ever running at once
	PeakWaiting      int     // most sequences ever waiting at once
	PromptTokens     int64   // prompt tokens prefilled
	GenerationTokens int64   // output tokens generated
	KVUsedTokens     int     // prompt + generated tokens of the running sequences
	KVReservedTokens int     // prompt + max output tokens of the running sequences (admission control)
	KVLeakedTokens   int     // KV cache leaked by finished sequences (LeakKVPerRequest, SetKVLeak)
	KVUsage          float64 // (KVUsedTokens + KVLeakedTokens) / KVTokens, as in vllm:kv_cache_usage_perc
	Slowdown         float64 // the engine's step-time factor now (Config.Slowdown, SetSlowdown)
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	peakRun, peakWait := s.maxRunningSeen, s.maxWaitingSeen
	s.mu.Unlock()
	return Stats{
		Requests:         s.requests.Load(),
		Completed:        s.completed.Load(),
		Cancelled:        s.cancelled.Load(),
		Aborted:          s.aborted.Load(),
		Errors:           s.errs.Load(),
		Running:          int(s.nRunning.Load() + s.fastRunning.Load()),
		Waiting:          int(s.nWaiting.Load()),
		PeakRunning:      max(peakRun, int(s.fastPeak.Load())),
		PeakWaiting:      peakWait,
		PromptTokens:     s.promptTokens.Load(),
		GenerationTokens: s.genTokens.Load(),
		KVUsedTokens:     int(s.nKVUsed.Load()),
		KVReservedTokens: int(s.nKVReserved.Load()),
		KVLeakedTokens:   int(s.nKVLeaked.Load()),
		KVUsage:          s.kvUsage(),
		Slowdown:         s.slowdownFactor(),
	}
}

func (s *Server) kvUsage() float64 {
	return min(1, float64(s.nKVUsed.Load()+s.nKVLeaked.Load())/float64(s.cfg.KVTokens))
}

// SetKVLeak sets the KV cache the server has leaked, in tokens (clamped to 0..KVTokens): it
// counts in the reported KV use and takes room from admission until set again; 0 frees it,
// as a restart would. Finished sequences keep adding LeakKVPerRequest to it.
func (s *Server) SetKVLeak(tokens int) {
	s.mu.Lock()
	s.kvLeaked = min(max(tokens, 0), s.cfg.KVTokens)
	s.syncGaugesLocked()
	s.mu.Unlock()
	select { // admission may have room again
	case s.wake <- struct{}{}:
	default:
	}
}

// leakLocked leaks LeakKVPerRequest tokens for one finished sequence.
func (s *Server) leakLocked() {
	if n := s.cfg.LeakKVPerRequest; n > 0 {
		s.kvLeaked = min(s.kvLeaked+n, s.cfg.KVTokens)
	}
}

// SetSlowdown sets the factor every engine step's time is multiplied by, from the step under
// way on (re-timed at once): 1 is normal speed, 10 a tenth of the throughput, +Inf pauses the
// engine until a finite factor is set (0, negative and NaN mean 1). Requests keep arriving
// and queueing meanwhile. Without the scheduler (the fast path) it has no effect.
func (s *Server) SetSlowdown(f float64) {
	s.slowdown.Store(math.Float64bits(slowdownOrOne(f)))
	select {
	case s.retime <- struct{}{}:
	default:
	}
}

func (s *Server) slowdownFactor() float64 { return math.Float64frombits(s.slowdown.Load()) }

func (s *Server) randUint64() uint64 {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Uint64()
}

// ServeHTTP routes the OpenAI-compatible API, /v1/models, /health and /metrics.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch path := r.URL.Path; path {
	case "/v1/chat/completions":
		s.serveAPI(w, r, epChat)
	case "/v1/completions":
		s.serveAPI(w, r, epCompletions)
	case "/v1/responses":
		s.serveAPI(w, r, epResponses)
	case "/v1/embeddings":
		s.serveAPI(w, r, epEmbeddings)
	case "/v1/models":
		if s.allowGet(w, r) {
			s.serveModels(w, "")
		}
	case "/health":
		if s.cfg.NoHealth {
			notFound(w, path)
		} else if s.allowGet(w, r) {
			w.WriteHeader(http.StatusOK)
		}
	case "/metrics":
		if s.allowGet(w, r) {
			s.metrics.handler.ServeHTTP(w, r)
		}
	default:
		if id, ok := strings.CutPrefix(path, "/v1/models/"); ok && s.allowGet(w, r) {
			s.serveModels(w, id)
			return
		} else if ok {
			return
		}
		notFound(w, path)
	}
}

func notFound(w http.ResponseWriter, path string) {
	writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found",
		message: "Unknown path " + strconv.Quote(path) + "."})
}

func (s *Server) allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed",
		message: "Method " + r.Method + " is not allowed here."})
	return false
}

func (s *Server) appendModel(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = append(b, s.modelJSON...)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, s.created, 10)
	b = append(b, `,"owned_by":"sluice-sim","root":`...)
	b = append(b, s.modelJSON...)
	b = append(b, `,"parent":null,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.cfg.MaxModelLen), 10)
	return append(b, '}')
}

// serveModels answers GET /v1/models (id == "") or GET /v1/models/{id}.
func (s *Server) serveModels(w http.ResponseWriter, id string) {
	if id != "" && id != s.cfg.Model {
		writeError(w, s.checkModel(id))
		return
	}
	bp := getBuf()
	defer putBuf(bp)
	b := *bp
	if id == "" {
		b = append(b, `{"object":"list","data":[`...)
		b = s.appendModel(b)
		b = append(b, "]}"...)
	} else {
		b = s.appendModel(b)
	}
	*bp = b
	_ = writeJSON(w, b)
}

// fail answers an API request with an error and counts it.
func (s *Server) fail(w http.ResponseWriter, e *apiError) {
	s.errs.Add(1)
	writeError(w, e)
}

func (s *Server) injectError() *apiError {
	r5, r429 := s.cfg.ErrorRate5xx, s.cfg.ErrorRate429
	if r5 == 0 && r429 == 0 {
		return nil
	}
	s.rngMu.Lock()
	u, coin := s.rng.Float64(), s.rng.Uint64()&1
	s.rngMu.Unlock()
	switch {
	case u < r5:
		if coin == 0 {
			return statusError(http.StatusInternalServerError)
		}
		return statusError(http.StatusServiceUnavailable)
	case u < r5+r429:
		return statusError(http.StatusTooManyRequests)
	}
	return nil
}

// delay is the configured extra delay before a request is processed, scaled.
func (s *Server) delay() time.Duration {
	d := s.cfg.Delay
	if j := s.cfg.DelayJitter; j > 0 {
		s.rngMu.Lock()
		d += time.Duration(s.rng.Int64N(int64(j)))
		s.rngMu.Unlock()
	}
	return s.cfg.scale(d)
}

const maxBody = 32 << 20

func readBody(r *http.Request, bp *[]byte) ([]byte, *apiError) {
	tooLarge := func() *apiError {
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
			message: "The request body is larger than " + strconv.Itoa(maxBody) + " bytes."}
	}
	if r.ContentLength > maxBody {
		return nil, tooLarge()
	}
	b := (*bp)[:0]
	lr := io.LimitReader(r.Body, maxBody+1)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			*bp = b
			return nil, badRequest("invalid_body", "", "reading the request body: "+err.Error())
		}
	}
	*bp = b
	if len(b) > maxBody {
		return nil, tooLarge()
	}
	return b, nil
}

// outcome of serving one API request.
type outcome uint8

const (
	outDone    outcome = iota // answered in full
	outGone                   // the client went away
	outKilled                 // killed on purpose (x-sim-die-after)
	outClosed                 // the server was closed
	outErrored                // ended by an in-stream error on purpose (x-sim-error-after)
)

var (
	errGone     = errors.New("sim: client gone")
	errKilled   = errors.New("sim: connection killed")
	errClosed   = errors.New("sim: server closed")
	errInjected = errors.New("sim: in-stream error sent")
)

func outcomeOf(err error) outcome {
	switch {
	case err == nil:
		return outDone
	case errors.Is(err, errKilled):
		return outKilled
	case errors.Is(err, errClosed):
		return outClosed
	case errors.Is(err, errInjected):
		return outErrored
	}
	return outGone
}

func (s *Server) count(o outcome) {
	switch o {
	case outDone:
		s.completed.Add(1)
	case outGone:
		s.cancelled.Add(1)
	case outKilled:
		s.aborted.Add(1)
	case outClosed, outErrored:
		s.errs.Add(1)
	}
}

// kill drops the connection abruptly by hijacking and closing it. Where the connection
// cannot be hijacked (HTTP/2) it reports false: the handler must then panic with
// http.ErrAbortHandler once its bookkeeping is done, which makes net/http reset the stream
// without finishing the response.
func kill(w http.ResponseWriter) bool {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request, ep endpoint) {
	arrival := time.Now()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed",
			message: "Method " + r.Method + " is not allowed here; use POST."})
		return
	}
	s.requests.Add(1)
	kn, e := parseKnobs(r.Header)
	if e != nil {
		s.fail(w, e)
		return
	}
	if kn.status != 0 {
		s.fail(w, statusError(kn.status))
		return
	}
	if e := s.injectError(); e != nil {
		s.fail(w, e)
		return
	}
	bp := getBuf()
	body, e := readBody(r, bp)
	var p *plan
	if e == nil {
		switch ep {
		case epChat:
			p, e = s.planChat(body)
		case epCompletions:
			p, e = s.planCompletion(body)
		case epResponses:
			p, e = s.planResponses(body)
		default:
			p, e = s.planEmbedding(body)
		}
	}
	putBuf(bp)
	if e != nil {
		s.fail(w, e)
		return
	}
	if kn.loopAfter > 0 {
		p.loop(kn.loopAfter, kn.loopPeriod)
	}
	ctx := r.Context()
	if kn.dieAfter >= 0 && !p.stream {
		s.count(outKilled)
		if !kill(w) {
			panic(http.ErrAbortHandler)
		}
		return
	}
	if kn.errorAfter >= 0 && !p.stream {
		s.fail(w, engineError(-1))
		return
	}
	var st *streamer
	if p.stream {
		st = s.newStreamer(ctx, w, p, kn, arrival)
		defer func() {
			st.release()
			if st.abort {
				panic(http.ErrAbortHandler)
			}
		}()
		if err := st.start(); err != nil {
			s.count(outcomeOf(err))
			return
		}
	} else if !sleepCtx(ctx, s.stop, kn.stallFirst) {
		s.count(s.stoppedOutcome(ctx))
		return
	}
	if d := s.delay(); d > 0 && !sleepCtx(ctx, s.stop, d) {
		o := s.stoppedOutcome(ctx)
		if o == outClosed && !p.stream {
			writeError(w, statusError(http.StatusServiceUnavailable))
		}
		s.count(o)
		return
	}
	if p.ep == epEmbeddings && !s.embedBusy(ctx, len(p.choices)) {
		o := s.stoppedOutcome(ctx)
		if o == outClosed {
			writeError(w, statusError(http.StatusServiceUnavailable))
		}
		s.count(o)
		return
	}
	var err error
	if s.fast {
		err = s.runInline(w, p, st, arrival)
	} else {
		err = s.runScheduled(ctx, w, p, st, arrival)
	}
	o := outcomeOf(err)
	if o == outClosed && !p.stream {
		writeError(w, statusError(http.StatusServiceUnavailable))
	}
	s.count(o)
}

// embedBusy charges an embeddings request with n inputs its batch cost: it waits for the one
// embedding engine (FIFO among waiters, as Go queues blocked channel senders), holds it for
// scale(EmbedRequestCost + EmbedItemCost × n), and releases it. It reports false when the
// client went away or the server closed first (the engine is released at once).
func (s *Server) embedBusy(ctx context.Context, n int) bool {
	d := s.cfg.scale(s.cfg.embedCost(n))
	if d <= 0 {
		return true
	}
	select {
	case s.embedSlot <- struct{}{}:
	case <-ctx.Done():
		return false
	case <-s.stop:
		return false
	}
	defer func() { <-s.embedSlot }()
	return sleepCtx(ctx, s.stop, d)
}

func (s *Server) stoppedOutcome(ctx context.Context) outcome {
	if ctx.Err() != nil {
		return outGone
	}
	return outClosed
}

// runInline is the fast path: no scheduler, the whole answer is generated at once.
func (s *Server) runInline(w http.ResponseWriter, p *plan, st *streamer, arrival time.Time) error {
	n := s.fastRunning.Add(int64(len(p.choices)))
	for {
		peak := s.fastPeak.Load()
		if n <= peak || s.fastPeak.CompareAndSwap(peak, n) {
			break
		}
	}
	defer s.fastRunning.Add(-int64(len(p.choices)))

	gen := 0
	for i := range p.choices {
		gen += p.choices[i].n
	}
	if p.ep == epEmbeddings {
		gen = 0
	}
	s.promptTokens.Add(int64(p.promptTokens))
	s.genTokens.Add(int64(gen))
	m := s.metrics
	m.promptTokens.Add(float64(p.promptTokens))
	m.genTokens.Add(float64(gen))
	ttft := time.Since(arrival).Seconds()
	for range p.choices {
		m.queue.Observe(0)
		if p.ep != epEmbeddings {
			m.ttft.Observe(ttft)
		}
	}

	var err error
	if st != nil {
		for i := range p.choices {
			if err = st.emit(i, p.choices[i].n, true); err != nil {
				break
			}
		}
		if err == nil {
			err = st.finish()
		}
	} else {
		err = s.writeResponse(w, p, arrival)
	}
	e2e := time.Since(arrival).Seconds()
	for i := range p.choices {
		m.e2e.Observe(e2e)
		m.finished(p.choices[i].finish)
	}
	if s.cfg.LeakKVPerRequest > 0 && p.ep != epEmbeddings {
		s.mu.Lock()
		for range p.choices {
			s.leakLocked()
		}
		s.syncGaugesLocked()
		s.mu.Unlock()
	}
	return err
}

// runScheduled submits the request to the engine and relays its tokens as the scheduler
// produces them.
func (s *Server) runScheduled(ctx context.Context, w http.ResponseWriter, p *plan, st *streamer, arrival time.Time) error {
	j, ok := s.submit(p, arrival)
	if !ok {
		return errClosed
	}
	defer s.abandon(j)
	for {
		select {
		case <-j.notify:
		case <-ctx.Done():
			return errGone
		case <-s.stop:
			return errClosed
		}
		all := true
		for i := range p.choices {
			q := p.choices[i].seq
			done := q.finished.Load()
			if st != nil {
				if err := st.emit(i, int(q.generated.Load()), done); err != nil {
					return err
				}
			}
			all = all && done
		}
		if all {
			break
		}
	}
	if st != nil {
		return st.finish()
	}
	return s.writeResponse(w, p, arrival)
}
