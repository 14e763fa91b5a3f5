// Package procs sizes the Go runtime's processors (GOMAXPROCS) to the gateway's load.
//
// With two or more processors the runtime hands a goroutine made ready by the network poller
// to an idle processor, waking a thread that looks for more work, finds none and sleeps
// again. At a moderate rate, when one processor would do, that costs the gateway about a
// tenth of its CPU a request (docs/performance.md: 2,000 req/s, GOMAXPROCS=1 against 2). A
// Controller keeps one processor while one keeps up and adds processors, up to the runtime's
// own number, as soon as the load needs them:
//
//   - every Every (every Idle while one processor is idle) it reads the process's CPU time
//     (getrusage: user and system, every thread) and divides what it grew by the time that
//     passed: the processors' use in that sample; on one processor, when the requests in
//     flight reach a multiple of 16, and at the first request after an idle sample (Begin),
//     it also takes a sample of Probe from then on;
//   - on one processor, requests in flight that grew by Jump or more since the last sample
//     (Begin: a burst of arrivals, not a level of long streams) count as a sample with the
//     processor saturated, at once: the burst's first requests are not served on one
//     processor while a sample is taken;
//   - it raises the processors at once when one sample's use exceeds Burst of those there are
//     (a burst: they are nearly all busy), the mean of the last Short samples exceeds Up of
//     them, or, on one processor, a sample right after an idle one (under 5%) exceeds Up (a
//     load that came at once after a quiet time), to enough for that use at Up each, at least
//     one more;
//   - it lowers them when the mean use over the last Window samples fits in fewer at Down
//     each (Down below Up: a fewer-processor gateway costs less, and the two must not take
//     turns), to that fewer.
//
// Each change is a stop of the world of a few tens of microseconds (a rise at most two: the
// runtime's default is read again by setting it), at most one change every sample when rising
// and one every Window when falling.
//
// GOMAXPROCS is the whole process's: one Controller runs for the process while at least one
// owner holds it (Acquire), and the last release puts the processors back where they were.
// The ceiling is the runtime's default, read again each time the processors rise (it follows
// the CPU limit of the container and the CPU affinity, as the runtime does), and the last
// release hands the sizing back to the runtime's own. An operator who
// sets the GOMAXPROCS environment variable has chosen: no Controller runs.
package procs

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Params are a Controller's thresholds.
type Params struct {
	Every  time.Duration // between two samples
	Idle   time.Duration // between two samples on one processor while the last was idle (under 5%)
	Probe  time.Duration // a short sample taken when requests pile up on one processor (Begin)
	Jump   int           // requests in flight grown by this many since the last sample rise at once (0: never)
	Burst  float64       // raise when one sample's use exceeds Burst × processors
	Up     float64       // raise when the Short samples' mean exceeds Up × processors
	Down   float64       // lower when the Window samples' mean fits in fewer at Down each
	Short  int           // samples in the short mean
	Window int           // samples in the long mean; also the least between two changes down
}

// Defaults are the gateway's thresholds: a burst is noticed at the next sample (50 ms; 250
// ms from idle, or 5 ms once 16 requests are in flight; at once when 64 more are in flight
// than at the last sample), a falling load after 40 samples;
// one processor is kept while it is at most 40% busy (so that a request seldom waits for
// another's: at 60% a first version kept one processor at 5,000 req/s and its p99 grew from
// 5–13 to 16–156 ms, docs/performance.md), and is gone back to when two together are at
// most a third busy.
var Defaults = Params{Every: 50 * time.Millisecond, Idle: 250 * time.Millisecond, Probe: 5 * time.Millisecond, Jump: 64, Burst: 0.75, Up: 0.4, Down: 1.0 / 3, Short: 4, Window: 40}

// Decider turns the samples of use into the processors to run with. It is the Controller's
// arithmetic, without clocks or the runtime.
type Decider struct {
	p       Params
	procs   int
	ceiling int
	ring    []float64 // the last Window samples since the last change, oldest overwritten
	n       int       // samples in ring
	next    int       // where the next sample goes
	last    float64   // the last sample's use, whatever the processors then
}

// idleUse is the use under which a sample finds the gateway idle.
const idleUse = 0.05

// NewDecider starts at procs processors with ceiling as the most.
func NewDecider(p Params, procs, ceiling int) *Decider {
	return &Decider{p: p, procs: max(1, min(procs, ceiling)), ceiling: max(1, ceiling), ring: make([]float64, max(1, p.Window))}
}

// Procs is the processors the Decider holds now.
func (d *Decider) Procs() int { return d.procs }

// SetCeiling changes the most processors (the runtime's default moved); the processors
// held fall to it when above.
func (d *Decider) SetCeiling(c int) {
	d.ceiling = max(1, c)
	if d.procs > d.ceiling {
		d.procs = d.ceiling
		d.reset()
	}
}

// Observe takes one sample's use (CPUs busy on average over the sample) and returns the
// processors to run with, and whether they changed.
func (d *Decider) Observe(use float64) (procs int, changed bool) {
	if math.IsNaN(use) || use < 0 {
		use = 0
	}
	d.ring[d.next] = use
	d.next = (d.next + 1) % len(d.ring)
	d.n = min(d.n+1, len(d.ring))
	p := float64(d.procs)
	// A load that came at once after an idle sample rises with its first sample over Up, as
	// the short mean of such samples would: one processor is then what the load shares the
	// machine with its clients and model server on, while the gateway's heap and pools are
	// at their smallest, and a backlog grown then feeds itself (more connections, more
	// memory, more collections). Otherwise the short mean only once it has its samples: one
	// sample alone rises only as a burst, so that a load near the fall threshold does not
	// take turns.
	onset := d.procs == 1 && d.last < idleUse && use > d.p.Up
	d.last = use
	if d.procs < d.ceiling && (use > d.p.Burst*p || onset || (d.n >= d.p.Short && d.mean(d.p.Short) > d.p.Up*p)) {
		want := int(math.Ceil(max(use, d.mean(d.p.Short)) / d.p.Up))
		return d.set(min(d.ceiling, max(d.procs+1, want)))
	}
	if d.procs > 1 && d.n == len(d.ring) {
		if want := max(1, int(math.Ceil(d.mean(len(d.ring))/d.p.Down))); want < d.procs {
			return d.set(want)
		}
	}
	return d.procs, false
}

// mean is the mean of the last k samples (all there are when fewer).
func (d *Decider) mean(k int) float64 {
	k = min(max(k, 1), d.n)
	if k == 0 {
		return 0
	}
	var sum float64
	for i := 1; i <= k; i++ {
		sum += d.ring[(d.next-i+len(d.ring))%len(d.ring)]
	}
	return sum / float64(k)
}

func (d *Decider) set(n int) (int, bool) {
	d.procs = n
	d.reset()
	return n, true
}

// reset forgets the samples taken with the processors before a change.
func (d *Decider) reset() {
	d.n, d.next = 0, 0
}

// runtimeProcs is what a Controller changes: the runtime's processors, and its default.
type runtimeProcs interface {
	Current() int
	// Default is the runtime's own number (the container's CPU limit, the affinity); it may
	// set the processors to it.
	Default() int
	Set(n int)
}

type goRuntime struct{}

func (goRuntime) Current() int { return runtime.GOMAXPROCS(0) }

func (goRuntime) Default() int {
	runtime.SetDefaultGOMAXPROCS()
	return runtime.GOMAXPROCS(0)
}

// Set sets n processors, and takes the sizing back from the runtime's own (after Default):
// unchanged, it stops nothing.
func (goRuntime) Set(n int) { runtime.GOMAXPROCS(n) }

// Controller samples the process's CPU use and sizes the processors until its context ends.
type Controller struct {
	p   Params
	rt  runtimeProcs
	cpu func() (time.Duration, bool) // the process's CPU time so far
	log *slog.Logger
}

// run samples until ctx ends, starting at start processors; at the end the runtime sizes
// them again.
func (c *Controller) run(ctx context.Context, start int) {
	d := NewDecider(c.p, start, start)
	defer c.rt.Default()
	t := time.NewTimer(c.p.Every)
	defer t.Stop()
	last, ok := c.cpu()
	if !ok {
		return
	}
	lastAt := time.Now()
	single.Store(start == 1)
	defer single.Store(false)
	defer quiet.Store(false)
	probing := false
	sampled := inflight.Load() // requests in flight at the last sample
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
			if n := inflight.Load(); d.Procs() == 1 && c.p.Jump > 0 && n-sampled >= int64(c.p.Jump) {
				// A burst of arrivals: as many requests as Jump came in since the last
				// sample and are still running. It is served on one processor for as long as
				// a probe would take to say so: rise as a saturated sample would.
				c.apply(d, float64(d.Procs()), "requests_in_flight", n)
				sampled, probing, lastAt = n, false, time.Now()
				quiet.Store(false)
				if last, ok = c.cpu(); !ok {
					return
				}
				t.Reset(c.p.Every)
				continue
			}
			// Requests pile up on one processor: a short sample from now says at once
			// whether it is saturated (a burst), instead of the next regular one (up to
			// Idle away). Kicks during a probe, and within Every of a sample, are ignored:
			// no more samples than the regular ones under a steady load.
			// A kick while quiet (the first request after an idle sample) starts one at once.
			if probing || d.Procs() != 1 || c.p.Probe <= 0 || (!quiet.Load() && time.Since(lastAt) < c.p.Every) {
				continue
			}
			if cpu, ok := c.cpu(); ok {
				quiet.Store(false)
				last, lastAt, probing = cpu, time.Now(), true
				if !t.Stop() {
					select {
					case <-t.C:
					default:
					}
				}
				t.Reset(c.p.Probe)
			}
		case <-t.C:
			probing = false
			cpu, ok := c.cpu()
			now := time.Now() // not the tick's: a busy process reads late
			wall := now.Sub(lastAt)
			if !ok || wall <= 0 {
				t.Reset(c.p.Every)
				continue
			}
			use := float64(cpu-last) / float64(wall)
			last, lastAt, sampled = cpu, now, inflight.Load()
			c.apply(d, use, "cpu_use", math.Round(use*100)/100)
			next := c.p.Every
			q := d.Procs() == 1 && use < idleUse && c.p.Idle > next
			if q {
				next = c.p.Idle // an idle gateway wakes 4 times a second, not 20
			}
			quiet.Store(q)
			t.Reset(next)
		}
	}
}

// apply gives d one sample's use and sets the runtime's processors when they change; why
// and its value say what moved them in the log.
func (c *Controller) apply(d *Decider, use float64, why string, value any) {
	before := d.Procs()
	n, changed := d.Observe(use)
	if !changed {
		return
	}
	if n > before {
		// Rising: the runtime's ceiling may have moved (a resized container).
		d.SetCeiling(c.rt.Default())
	}
	c.rt.Set(d.Procs()) // also after Default: the sizing is the Controller's again
	if d.Procs() == before {
		return // the ceiling fell to where it was
	}
	single.Store(d.Procs() == 1)
	c.log.Debug("processors resized to the load", "gomaxprocs", d.Procs(), "was", before, why, value)
}

// kickEvery is how many requests in flight, at each multiple, wake the Controller for a
// short sample while it runs one processor.
const kickEvery = 16

var (
	inflight atomic.Int64
	single   atomic.Bool // a Controller runs, on one processor
	quiet    atomic.Bool // and its last sample found it idle: it samples every Idle
	kick     = make(chan struct{}, 1)
)

// Begin counts a request starting and End one finished. While a Controller runs one
// processor, each time the requests in flight reach a multiple of 16, and at the first
// request after a sample that found the gateway idle, it takes a short sample (Probe) at
// once, so that a burst gets its processors within milliseconds rather than at the next
// regular sample (up to Idle away: a load that comes at once after a quiet time, at a rate
// one processor cannot serve, need not pile up requests in flight before the sample).
// Cheap: one atomic add and one or two loads a call.
func Begin() {
	if n := inflight.Add(1); n%kickEvery == 0 && single.Load() || quiet.Load() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
}

// End counts a request begun with Begin as finished.
func End() { inflight.Add(-1) }

var (
	mu      sync.Mutex
	holders int
	stop    context.CancelFunc
	done    chan struct{}
)

// Held is how many owners hold the process's Controller (whether or not one runs).
func Held() int {
	mu.Lock()
	defer mu.Unlock()
	return holders
}

// Running is whether the process's Controller runs.
func Running() bool {
	mu.Lock()
	defer mu.Unlock()
	return stop != nil
}

// Acquire starts the process's Controller unless it runs (or the GOMAXPROCS environment
// variable is set, or the runtime has one processor, or the process's CPU time cannot be
// read); release stops it when the last holder releases, handing the sizing back to the
// runtime. Later calls of a release do nothing.
func Acquire(log *slog.Logger) (release func()) {
	return acquire(log, Defaults, goRuntime{}, processCPU, os.Getenv("GOMAXPROCS") != "")
}

func acquire(log *slog.Logger, p Params, rt runtimeProcs, cpu func() (time.Duration, bool), fixed bool) func() {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mu.Lock()
	defer mu.Unlock()
	holders++
	if holders == 1 && !fixed {
		if _, ok := cpu(); ok {
			if start := rt.Current(); start > 1 {
				ctx, cancel := context.WithCancel(context.Background())
				stop, done = cancel, make(chan struct{})
				c := &Controller{p: p, rt: rt, cpu: cpu, log: log}
				go func(done chan struct{}) {
					defer close(done)
					c.run(ctx, start)
				}(done)
			}
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			holders--
			if holders == 0 && stop != nil {
				stop()
				<-done
				stop, done = nil, nil
			}
		})
	}
}
