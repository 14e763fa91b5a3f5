package fault

import (
	"context"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Injection is the faults planned for one request. Its methods are nil-safe: on a nil
// Injection (no fault applies) they do nothing and return their input.
type Injection struct {
	e                *Engine
	gen              uint64
	kill             context.Context // done when Clear is called after the injection was planned
	seed             uint64
	streams          atomic.Uint64 // streams wrapped so far (each gets its own generator)
	requestID, route string
	model            string
	at               time.Time
	faults           []*active
	done             atomic.Bool
}

// active is one fault within one injection.
type active struct {
	f        *fault
	fired    atomic.Bool
	attempts atomic.Int32 // upstream attempts it hit
}

func (e *Engine) newInjection(r *policy.Request, route, model string) *Injection {
	// gen before kill: a Clear in between leaves the injection dead, never live with its
	// waits already ended.
	in := &Injection{e: e, gen: e.gen.Load(), seed: e.next(), route: route, model: model, at: e.clock.Now()}
	in.kill = e.kill.Load().ctx
	if r != nil {
		in.requestID = r.ID
	}
	return in
}

func (in *Injection) add(f *fault) { in.faults = append(in.faults, &active{f: f}) }

// live reports whether the kill switch has not been pulled since the injection was planned.
func (in *Injection) live() bool { return in.e.gen.Load() == in.gen }

// sleep waits d for a fault: until ctx ends (then it returns ctx's cause) or the kill switch
// is pulled (then it returns nil: the request goes on unfaulted).
func (in *Injection) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 || !in.live() {
		return nil
	}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(in.kill, cancel)
	defer stop()
	err := in.e.sleep(kctx, d)
	if err != nil && ctx.Err() == nil {
		return nil // ended by the kill switch
	}
	return err
}

// fire marks a fault as having taken effect.
func (in *Injection) fire(a *active) {
	if a.fired.CompareAndSwap(false, true) {
		a.f.fired.Add(1)
	}
}

func (in *Injection) rng(stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(in.seed, stream))
}

// Kinds lists the kinds of the planned faults (for logs and metrics).
func (in *Injection) Kinds() []string {
	if in == nil {
		return nil
	}
	out := make([]string, 0, len(in.faults))
	for _, a := range in.faults {
		out = append(out, string(a.f.kind))
	}
	return out
}

// Fired reports whether any of the request's faults acted (was injected) so far.
func (in *Injection) Fired() bool {
	if in == nil {
		return false
	}
	for _, a := range in.faults {
		if a.fired.Load() {
			return true
		}
	}
	return false
}

// Before runs the downstream request faults, once per request before it is forwarded: it
// sleeps the delays (returning ctx's cause if ctx ends first) and returns the first abort
// (Side Downstream: answer the client with openai.WriteError(w, abort.Err)), or nil.
func (in *Injection) Before(ctx context.Context) (*Abort, error) {
	if in == nil {
		return nil, nil
	}
	return in.before(ctx, in.faults, Downstream, 0)
}

func (in *Injection) before(ctx context.Context, faults []*active, side Side, stream uint64) (*Abort, error) {
	if !in.live() {
		return nil, nil
	}
	b := beforeStep{in: in, side: side, stream: stream}
	for _, a := range faults {
		if a.f.side != side || a.f.req == nil {
			continue
		}
		var fired bool
		if b, fired = a.f.req.before(b, a.f); !fired {
			continue
		}
		in.fire(a)
		if d := b.wait; d > 0 {
			b.wait = 0
			if err := in.sleep(ctx, d); err != nil {
				return nil, err
			}
		}
	}
	return b.abort, nil
}

// beforeStep is one Before at work: each request fault in turn gets it, may ask for a wait
// or choose the abort, and returns it. It goes by value, so nothing of it escapes.
type beforeStep struct {
	in     *Injection
	side   Side
	stream uint64
	rng    *rand.Rand    // drawn on first use (rand), shared by the waits of this Before
	abort  *Abort        // the first abort chosen
	wait   time.Duration // the wait the fault at hand asks for
}

// rand returns the step's generator.
func (b *beforeStep) rand() *rand.Rand {
	if b.rng == nil {
		b.rng = b.in.rng(b.stream)
	}
	return b.rng
}

// Attempt is the upstream faults of one upstream attempt. Its methods are nil-safe.
type Attempt struct {
	in     *Injection
	faults []*active
	stream uint64
}

// Attempt returns the upstream faults that apply to the next attempt on cluster (nil when
// none): those whose cluster glob matches and that have hit fewer attempts than their
// attempts (default 1). Call it once per upstream attempt, in order.
func (in *Injection) Attempt(cluster string) *Attempt {
	return in.attempt(cluster, false)
}

// AttemptNamed is Attempt for a request the client never sees (a mirrored copy): only
// faults whose cluster filter is set and matches apply, so faults meant for the primary's
// path do not also act on its copies.
func (in *Injection) AttemptNamed(cluster string) *Attempt {
	return in.attempt(cluster, true)
}

func (in *Injection) attempt(cluster string, named bool) *Attempt {
	if in == nil || !in.live() {
		return nil
	}
	var at *Attempt
	for _, a := range in.faults {
		if a.f.side != Upstream || !glob(a.f.spec.Cluster, cluster) || named && a.f.spec.Cluster == "" {
			continue
		}
		limit := int32(max(a.f.spec.Attempts, 1))
		if a.attempts.Add(1) > limit {
			continue
		}
		if at == nil {
			at = &Attempt{in: in, stream: in.streams.Add(1)}
		}
		at.faults = append(at.faults, a)
	}
	return at
}

// Before runs the attempt's request faults before the round trip: it sleeps the delays and
// returns the first abort (Side Upstream: use abort.Response(req) as the model server's
// answer), or nil.
func (a *Attempt) Before(ctx context.Context) (*Abort, error) {
	if a == nil {
		return nil, nil
	}
	return a.in.before(ctx, a.faults, Upstream, a.stream)
}

// wait draws a wait: fixed + uniform [0, jitter) + Gamma(shape, scale), at most maxWait.
func wait(rng *rand.Rand, fixed, jitter time.Duration, shape float64, scale time.Duration) time.Duration {
	d := float64(fixed)
	if jitter > 0 {
		d += rng.Float64() * float64(jitter)
	}
	if shape > 0 && scale > 0 {
		d += gamma(rng, shape) * float64(scale)
	}
	return time.Duration(min(d, float64(maxWait)))
}

// maxWait bounds one drawn wait (a Gamma tail is long).
const maxWait = 10 * time.Minute

// gamma draws from Gamma(shape, 1) (Marsaglia and Tsang).
func gamma(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		u := rng.Float64()
		return gamma(rng, shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

// Outcome is what the gateway reports of a faulted request.
type Outcome struct {
	Status         int    // the status the client got (499 when it went away)
	ErrorClass     string // "" on success
	Cluster        string // the cluster that served (or failed last)
	Attempts       int    // upstream attempts
	ClientSawError bool   // an error reached the client (an error status or an in-band error)
	Fallback       bool   // a fallback candidate served
	BreakerOpened  bool   // a breaker opened because of this request
}

// Verdicts of a fault in the log and the report.
const (
	VerdictSurvived     = "survived"      // upstream fault; the client got a complete 2xx answer, unaware
	VerdictClientError  = "client_error"  // upstream fault; the client saw an error
	VerdictClientGone   = "client_gone"   // the client went away
	VerdictToClient     = "to_client"     // downstream fault: delivered to the client as meant
	VerdictNotTriggered = "not_triggered" // planned, but it never acted (e.g. the stream ended first)
)

func verdict(a *active, o Outcome) string {
	switch {
	case !a.fired.Load():
		return VerdictNotTriggered
	case a.f.side == Downstream:
		return VerdictToClient
	case o.Status == 499:
		return VerdictClientGone
	case o.Status >= 200 && o.Status < 300 && !o.ClientSawError:
		return VerdictSurvived
	}
	return VerdictClientError
}

// Done reports how the request ended: every planned fault is logged with its verdict and
// counted, and releases its max_active slot. Only the first call counts.
func (in *Injection) Done(o Outcome) {
	if in == nil || !in.done.CompareAndSwap(false, true) {
		return
	}
	e := in.e
	now := e.clock.Now()
	for _, a := range in.faults {
		a.f.active.Add(-1)
		v := verdict(a, o)
		id := a.f.id
		if a.f.header {
			id = "header"
		}
		e.log.add(Record{Time: now, RequestID: in.requestID, Route: in.route, Model: in.model,
			FaultID: id, Kind: a.f.kind, Side: a.f.side, Verdict: v, Status: o.Status,
			ErrorClass: o.ErrorClass, Cluster: o.Cluster, Attempts: o.Attempts,
			Fallback: o.Fallback, BreakerOpened: o.BreakerOpened})
		if v != VerdictNotTriggered {
			k := &e.stats[a.f.kind.index()][a.f.side.index()]
			k.injected.Add(1)
			switch v {
			case VerdictSurvived:
				k.survived.Add(1)
			case VerdictClientError:
				k.clientErrors.Add(1)
			}
		}
		e.rep.add(id, a.f.kind, a.f.side, v, o)
	}
}
