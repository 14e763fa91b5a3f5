package fault

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// Engine holds the faults and decides, per request, which ones apply. It is safe for
// concurrent use; the fault set is immutable once built and swapped atomically.
type Engine struct {
	enabled bool
	clock   policy.Clock
	nets    Config // for AllowsNetwork

	set   atomic.Pointer[faultSet]
	gen   atomic.Uint64 // bumped by Clear: injections of an older generation stop acting
	kill  atomic.Pointer[killSwitch]
	rng   atomic.Uint64 // SplitMix64 state
	ids   atomic.Uint64 // for ids of faults set without one
	mu    sync.Mutex    // serializes Set, Add and Clear
	sleep func(ctx context.Context, d time.Duration) error

	log   ring
	stats [numKinds][2]kindCounters
	rep   report
}

// killSwitch ends the waits of one generation's injections when Clear is called.
type killSwitch struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newKillSwitch() *killSwitch {
	ctx, cancel := context.WithCancel(context.Background())
	return &killSwitch{ctx: ctx, cancel: cancel}
}

type kindCounters struct {
	injected, survived, clientErrors atomic.Uint64
}

// faultSet is one immutable set of configured faults.
type faultSet struct {
	faults []*fault
}

// fault is a compiled Spec with its counters.
type fault struct {
	spec  Spec
	id    string
	kind  Kind
	side  Side
	since time.Time // when it was set (the schedule's start when Start is zero)
	until time.Time // zero: no end
	start time.Time
	// percent in units of 1/2^32 of the RNG's range; always is true for 100 %.
	threshold uint64
	always    bool
	never     bool
	header    bool
	impl      faultKind    // what its kind does
	req       requestFault // impl when it acts before forwarding, else nil
	ev        eventFault   // impl when it acts on the answer's events, else nil
	compiled  any          // what the kind compiled of the spec (a compiler's)

	matched atomic.Uint64 // matching requests (for every)
	fired   atomic.Uint64 // injections where it took effect
	planned atomic.Uint64 // injections it was planned on
	active  atomic.Int64  // injections holding it now
}

// New returns an Engine for cfg. clock drives the schedule windows; seed seeds the engine's
// random generator (percent draws, Gamma waits, corrupt choices), so a run is repeatable.
func New(cfg Config, clock policy.Clock, seed int64) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		clock = policy.SystemClock{}
	}
	size := cfg.LogSize
	if size == 0 {
		size = DefaultLogSize
	}
	e := &Engine{enabled: cfg.Enabled, clock: clock, nets: Config{AllowedNetworks: cfg.AllowedNetworks}, sleep: sleepCtx}
	e.rng.Store(uint64(seed))
	e.kill.Store(newKillSwitch())
	e.log.init(size)
	if err := e.Set(cfg.Faults); err != nil {
		return nil, err
	}
	return e, nil
}

// Enabled reports whether injection is on.
func (e *Engine) Enabled() bool { return e != nil && e.enabled }

// AllowsNetwork reports whether ip is in the config's allowed networks.
func (e *Engine) AllowsNetwork(ip net.IP) bool { return e.nets.AllowsNetwork(ip) }

// Set replaces the configured faults (PUT /admin/faults). The set is validated whole: on an
// error (Problems, each with its path) the old set stays.
func (e *Engine) Set(faults []Spec) error {
	c, err := e.Compile(faults)
	if err != nil {
		return err
	}
	e.Install(c)
	return nil
}

// Compiled is a validated, compiled set of faults, not yet installed: what a config
// generation carries, so that its faults start with its routes (Install) and checking a
// config changes nothing.
type Compiled struct {
	specs []Spec
	at    time.Time
}

// Compile validates faults whole (Problems, each with its path) and compiles them. It has
// no side effects.
func (e *Engine) Compile(faults []Spec) (*Compiled, error) {
	if p := validateSet(faults, "faults"); len(p) > 0 {
		return nil, p
	}
	at := time.Now()
	if e != nil && e.clock != nil {
		at = e.clock.Now()
	}
	return &Compiled{specs: slices.Clone(faults), at: at}, nil
}

// Install replaces the configured faults (and any set through the admin API) with c.
func (e *Engine) Install(c *Compiled) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs := &faultSet{faults: make([]*fault, 0, len(c.specs))}
	for _, s := range c.specs {
		fs.faults = append(fs.faults, e.compile(s, c.at, false))
	}
	e.set.Store(fs)
}

// Add adds one fault to the set and returns its id.
func (e *Engine) Add(s Spec) (string, error) {
	if err := s.Validate(); err != nil {
		return "", err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.set.Load()
	for _, f := range old.faults {
		if s.ID != "" && f.id == s.ID {
			return "", Problems{fmt.Sprintf("id: %q is already the id of a fault", s.ID)}
		}
	}
	f := e.compile(s, e.clock.Now(), false)
	fs := &faultSet{faults: append(append(make([]*fault, 0, len(old.faults)+1), old.faults...), f)}
	e.set.Store(fs)
	return f.id, nil
}

// Remove removes the fault with the given id and reports whether there was one.
func (e *Engine) Remove(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.set.Load()
	fs := &faultSet{}
	for _, f := range old.faults {
		if f.id != id {
			fs.faults = append(fs.faults, f)
		}
	}
	if len(fs.faults) == len(old.faults) {
		return false
	}
	e.set.Store(fs)
	return true
}

// Clear removes every fault (the kill switch, DELETE /admin/faults): no new request gets a
// fault, and requests in flight stop being faulted at their next event; a wait in progress
// (delay, ttft, stall, drip) ends at once.
func (e *Engine) Clear() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.set.Store(&faultSet{})
	e.gen.Add(1)
	old := e.kill.Swap(newKillSwitch())
	old.cancel()
}

// compile builds a fault from a valid spec.
func (e *Engine) compile(s Spec, now time.Time, header bool) *fault {
	if s.ID == "" && !header {
		s.ID = "f" + strconv.FormatUint(e.ids.Add(1), 10)
	}
	f := &fault{spec: s, id: s.ID, kind: s.Kind, side: s.side(), since: now, start: s.Start, header: header}
	if f.start.IsZero() {
		f.start = now
	}
	if s.Duration > 0 {
		f.until = f.start.Add(s.Duration.D())
	}
	switch {
	case s.Every > 0:
	case s.Percent == nil || *s.Percent >= 100:
		f.always = true
	case *s.Percent <= 0:
		f.never = true
	default:
		f.threshold = uint64(*s.Percent / 100 * (1 << 32))
	}
	f.impl = byKind[s.Kind]
	f.req, _ = f.impl.(requestFault)
	f.ev, _ = f.impl.(eventFault)
	if c, ok := f.impl.(compiler); ok {
		f.compiled = c.compile(&f.spec)
	}
	return f
}

// Status is one configured fault as List shows it.
type Status struct {
	ID      string `json:"id"`
	Spec    Spec   `json:"spec"`
	Planned uint64 `json:"planned"` // requests it was planned on
	Fired   uint64 `json:"fired"`   // requests where it took effect
	Active  int64  `json:"active"`  // requests holding it now
	// Scheduled is false when the clock is outside its start/duration window.
	Scheduled bool `json:"scheduled"`
}

// List returns the configured faults with their counts (GET /admin/faults).
func (e *Engine) List() []Status {
	fs := e.set.Load()
	now := e.clock.Now()
	out := make([]Status, 0, len(fs.faults))
	for _, f := range fs.faults {
		out = append(out, Status{ID: f.id, Spec: f.spec, Planned: f.planned.Load(), Fired: f.fired.Load(),
			Active: f.active.Load(), Scheduled: f.inWindow(now)})
	}
	return out
}

func (f *fault) inWindow(now time.Time) bool {
	if now.Before(f.start) {
		return false
	}
	return f.until.IsZero() || now.Before(f.until)
}

// next returns the next number of the engine's generator (SplitMix64: one atomic add, no
// lock, no allocation).
func (e *Engine) next() uint64 {
	z := e.rng.Add(0x9e3779b97f4a7c15)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Plan decides which faults apply to a request: the configured faults whose filters match
// (route, model, schedule) and whose draw fires (percent or every) while under max_active,
// plus the header's faults (already parsed and authorized by the caller). It returns nil
// when none applies, without allocating. A non-nil Injection must be finished with Done.
func (e *Engine) Plan(r *policy.Request, route string, header []Spec) *Injection {
	if e == nil || !e.enabled {
		return nil
	}
	fs := e.set.Load()
	if len(fs.faults) == 0 && len(header) == 0 {
		return nil
	}
	model := ""
	if r != nil && r.Request != nil {
		model = r.Model
	}
	var in *Injection
	var now time.Time
	for _, f := range fs.faults {
		if f.never || !glob(f.spec.Route, route) || !glob(f.spec.Model, model) {
			continue
		}
		if now.IsZero() {
			now = e.clock.Now()
		}
		if !f.inWindow(now) {
			continue
		}
		n := f.matched.Add(1)
		switch {
		case f.spec.Every > 0:
			if n%uint64(f.spec.Every) != 0 {
				continue
			}
		case f.always:
		default:
			if e.next()>>32 >= f.threshold {
				continue
			}
		}
		if !f.acquire() {
			continue
		}
		if in == nil {
			in = e.newInjection(r, route, model)
		}
		in.add(f)
	}
	for _, s := range header {
		if s.Validate() != nil {
			continue
		}
		f := e.compile(s, time.Time{}, true)
		if f.never || (!f.always && e.next()>>32 >= f.threshold) {
			continue
		}
		f.acquire()
		if in == nil {
			in = e.newInjection(r, route, model)
		}
		in.add(f)
	}
	return in
}

// acquire takes a slot of the fault's max_active gauge.
func (f *fault) acquire() bool {
	m := int64(f.spec.MaxActive)
	for {
		a := f.active.Load()
		if m > 0 && a >= m {
			return false
		}
		if f.active.CompareAndSwap(a, a+1) {
			f.planned.Add(1)
			return true
		}
	}
}

// glob matches name against a chaos filter's pattern (policy.Glob), "" matching anything.
func glob(pattern, name string) bool {
	return pattern == "" || policy.Glob(pattern, name)
}

// sleepCtx waits d, or until ctx ends (then it returns ctx's cause).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
