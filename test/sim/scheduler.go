package sim

import (
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// Sequence states, guarded by Server.mu.
const (
	stWaiting int8 = iota
	stRunning
	stDone
	stDropped // cancelled by its handler
)

// seq is one sequence in the engine: one chat answer, one completions prompt or one
// embeddings input.
type seq struct {
	job     *job
	prompt  int
	reserve int
	outLen  int    // tokens to generate; 0 for embeddings (prefill only)
	finish  string // finish reason once outLen tokens are out

	// Progress, written by the scheduler and read lock-free by the handler. generated is
	// stored before finished.
	generated atomic.Int32
	finished  atomic.Bool

	// Guarded by Server.mu.
	state     int8
	prefilled bool
	enqueued  time.Time
	lastTok   time.Time
}

// job is one HTTP request's set of sequences and its wake-up channel. The scheduler never
// blocks on it: notify has room for one pending signal and extra signals are dropped, since
// the handler reads the progress counters anyway.
type job struct {
	notify  chan struct{}
	seqs    []*seq
	stream  bool // wake the handler per token, not just when all sequences are done
	arrival time.Time
	pending int // unfinished sequences, guarded by Server.mu
}

func (j *job) wake() {
	select {
	case j.notify <- struct{}{}:
	default:
	}
}

// maxLag bounds how far the scheduler may run behind its schedule and catch up by running
// steps back to back (timer slop, GC pauses). Catching up keeps the simulated throughput
// exact even when steps are shorter than the timer resolution.
const maxLag = 5 * time.Millisecond

// submit puts the plan's sequences in the waiting queue. It reports false when the server
// is closed.
func (s *Server) submit(p *plan, arrival time.Time) (*job, bool) {
	j := &job{notify: make(chan struct{}, 1), stream: p.stream, arrival: arrival, pending: len(p.choices)}
	j.seqs = make([]*seq, len(p.choices))
	now := time.Now()
	for i := range p.choices {
		c := &p.choices[i]
		q := &seq{job: j, prompt: c.prompt, reserve: c.reserve, outLen: c.n, finish: c.finish, enqueued: now}
		if p.ep == epEmbeddings {
			q.outLen = 0
		}
		c.seq = q
		j.seqs[i] = q
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false
	}
	s.waiting = append(s.waiting, j.seqs...)
	s.syncGaugesLocked()
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return j, true
}

// abandon removes the job's unfinished sequences from the engine at once and frees their KV
// cache. It is a no-op for a job whose sequences all finished.
func (s *Server) abandon(j *job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, q := range j.seqs {
		switch q.state {
		case stWaiting:
			if i := slices.Index(s.waiting, q); i >= 0 {
				s.waiting = slices.Delete(s.waiting, i, i+1)
			}
			s.metrics.finished("abort")
		case stRunning:
			if i := slices.Index(s.running, q); i >= 0 {
				s.running = slices.Delete(s.running, i, i+1)
			}
			s.kvReserved -= q.reserve
			if q.prefilled {
				s.kvUsed -= q.prompt + int(q.generated.Load())
			}
			s.metrics.finished("abort")
		default:
			continue
		}
		q.state = stDropped
		changed = true
	}
	if changed {
		s.syncGaugesLocked()
	}
}

func (s *Server) syncGaugesLocked() {
	s.nRunning.Store(int64(len(s.running)))
	s.nWaiting.Store(int64(len(s.waiting)))
	s.nKVUsed.Store(int64(s.kvUsed))
	s.nKVReserved.Store(int64(s.kvReserved))
	s.nKVLeaked.Store(int64(s.kvLeaked))
	s.maxRunningSeen = max(s.maxRunningSeen, len(s.running))
	s.maxWaitingSeen = max(s.maxWaitingSeen, len(s.waiting))
}

// loop is the engine: it runs steps until Close. A step admits waiting sequences (FIFO, while
// a running slot and their KV reservation are free), prefills them, and decodes one token
// for every sequence that was already running. The step lasts
//
//	Σ (TTFT + PrefillPerToken·prompt) over the admitted sequences
//	+ ITL + ITLPerRunning·(decoding−1)   if any sequence is decoding
//
// times TimeScale and the slowdown factor (SetSlowdown; re-timed when it changes, +Inf: the
// step waits until a finite factor is set); its tokens are delivered when it ends. When
// nothing is running or waiting the loop blocks on the wake channel.
func (s *Server) loop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var base time.Time // scheduled end of the previous step
	idle := true
	for {
		s.mu.Lock()
		now := time.Now()
		decoding := len(s.running)
		var d time.Duration
		if decoding > 0 {
			d = s.cfg.ITL + s.cfg.ITLPerRunning*time.Duration(decoding-1)
		}
		admitted := 0
		for len(s.waiting) > 0 && len(s.running) < s.cfg.MaxRunning {
			q := s.waiting[0]
			if s.kvReserved+s.kvLeaked+q.reserve > s.cfg.KVTokens {
				break // head-of-line: FIFO, like vLLM's FCFS policy
			}
			s.waiting[0] = nil
			s.waiting = s.waiting[1:]
			q.state = stRunning
			s.kvReserved += q.reserve
			s.running = append(s.running, q)
			s.metrics.queue.Observe(now.Sub(q.enqueued).Seconds())
			d += s.cfg.TTFT + s.cfg.PrefillPerToken*time.Duration(q.prompt)
			admitted++
		}
		if admitted == 0 && decoding == 0 {
			s.syncGaugesLocked()
			s.mu.Unlock()
			select {
			case <-s.wake:
			case <-s.stop:
				return
			}
			idle = true
			continue
		}
		s.syncGaugesLocked()
		s.mu.Unlock()

		switch {
		case idle:
			base, idle = now, false
		case base.Before(now.Add(-maxLag)):
			base = now.Add(-maxLag)
		}
		end, ok := s.waitStep(timer, base, s.cfg.scale(d))
		if !ok {
			return
		}
		base = end

		s.mu.Lock()
		s.stepDoneLocked(time.Now())
		s.mu.Unlock()
	}
}

// waitStep waits for the end of a step begun at base that lasts d times the slowdown factor,
// re-timing it whenever SetSlowdown changes the factor (an infinite factor waits for the
// next change). It returns the step's end, or false when the server is closing.
func (s *Server) waitStep(timer *time.Timer, base time.Time, d time.Duration) (time.Time, bool) {
	for {
		f := s.slowdownFactor()
		var tick <-chan time.Time
		end := base
		if !math.IsInf(f, 1) {
			end = base.Add(slowBy(d, f))
			wait := time.Until(end)
			if wait <= 0 {
				select {
				case <-s.stop:
					return end, false
				default:
					return end, true
				}
			}
			timer.Reset(wait)
			tick = timer.C
		}
		select {
		case <-tick:
			return end, true
		case <-s.retime:
			timer.Stop()
		case <-s.stop:
			return end, false
		}
	}
}

// stepDoneLocked delivers the tokens of the step that just ended.
func (s *Server) stepDoneLocked(now time.Time) {
	generated, prefilled := 0, 0
	keep := s.running[:0]
	for _, q := range s.running {
		if !q.prefilled {
			q.prefilled = true
			prefilled += q.prompt
			s.kvUsed += q.prompt
			if q.outLen == 0 { // embeddings: done after prefill
				s.finishLocked(q, now)
				continue
			}
			s.metrics.ttft.Observe(now.Sub(q.job.arrival).Seconds())
		} else {
			s.metrics.itl.Observe(now.Sub(q.lastTok).Seconds())
		}
		q.lastTok = now
		g := int(q.generated.Add(1))
		s.kvUsed++
		generated++
		if g >= q.outLen {
			s.finishLocked(q, now)
			continue
		}
		if q.job.stream {
			q.job.wake()
		}
		keep = append(keep, q)
	}
	clear(s.running[len(keep):])
	s.running = keep
	s.syncGaugesLocked()
	if prefilled > 0 {
		s.metrics.promptTokens.Add(float64(prefilled))
		s.promptTokens.Add(int64(prefilled))
	}
	if generated > 0 {
		s.metrics.genTokens.Add(float64(generated))
		s.genTokens.Add(int64(generated))
	}
}

func (s *Server) finishLocked(q *seq, now time.Time) {
	q.state = stDone
	s.kvReserved -= q.reserve
	s.kvUsed -= q.prompt + int(q.generated.Load())
	if q.outLen > 0 {
		s.leakLocked()
	}
	q.finished.Store(true)
	s.metrics.e2e.Observe(now.Sub(q.job.arrival).Seconds())
	s.metrics.finished(q.finish)
	q.job.pending--
	if q.job.stream || q.job.pending == 0 {
		q.job.wake()
	}
}
