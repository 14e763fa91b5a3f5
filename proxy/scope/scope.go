// Package scope is the context of one request and of each of its attempts: a Scope is a
// context.Context that ends when it is cancelled (with a cause), when its deadline passes,
// or when the context it was made in ends, and that serves the values of the context it was
// made from.
//
// It exists because the standard library's nesting is a large part of the request path's
// own work: context.WithCancelCause, WithTimeoutCause and AfterFunc each allocate a context,
// a closure, the parent's Done channel (made for the child to watch) and a map in the parent
// listing the child, and the runtime timer of the time-out; the four of one request (the
// server's request context, the total time-out, the attempt, the upstream connection's
// watch) took 19 allocations and about 3 µs (BenchmarkStdlibChain). A Scope made in a Scope
// is listed in its parent's intrusive list (no allocation), makes its Done channel only when
// Done is called (a select on it; nothing on the own HTTP/1.1 path does), keeps its deadline
// on the shared alarm wheel (proxy/alarm: up to alarm.Grain late), and runs the functions
// registered with AfterFunc, or with a Hook the caller holds, on the goroutine that ends it.
//
// A Scope works with the standard library both ways: made in any other context, it watches
// that context with context.AfterFunc; a context made from a Scope (context.WithCancel,
// net/http's Transport, context.AfterFunc) is told of its end through AfterFunc, which the
// standard library looks for (its "afterFuncer"), without a goroutine. context.Cause of a
// Scope is its Err (the standard library reads causes only from its own contexts); Cause in
// this package gives a Scope's own.
package scope

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicegw/sluice/proxy/alarm"
)

// Scope is a context.Context; see the package comment. Make one with New; end it with Cancel
// (every Scope must end: a Scope made in a Scope is listed there until it does).
type Scope struct {
	values context.Context // what Value asks past the Scope's own key
	parent *Scope          // the Scope it is made in (listed there while both live), or nil
	stop   func() bool     // the watch of a parent that is not a Scope (context.AfterFunc), or nil; guarded by mu

	deadline time.Time // the deadline Deadline reports (the parent's when it is earlier)
	dlCause  error     // the cause of ending at the Scope's own deadline
	timer    alarm.Alarm
	armed    bool // timer was started; guarded by mu

	state atomic.Uint32                 // live, cancelled or expired: Err without the lock
	done  atomic.Pointer[chan struct{}] // made by the first Done

	mu    sync.Mutex
	cause error
	first *node // what ends with the Scope: Scopes made in it, functions given to AfterFunc
	self  node  // the Scope's own entry in its parent's list
}

// node is an entry of a Scope's list of what ends with it: a Scope made in it (kid) or a
// function registered with AfterFunc (f). prev, next and listed are guarded by the list
// owner's mutex.
type node struct {
	prev, next *node
	listed     bool
	kid        *Scope
	f          func()
}

const (
	live uint32 = iota
	cancelled
	expired
)

// key is the key under which a Scope serves itself (Cause and New find it through values).
type key struct{}

// cancelCtxType is the type of the standard library's cancellable contexts, which each serve
// themselves under a private key that context.Cause asks for: a Scope does not pass that
// question on to the contexts it was made in (their cause is not the Scope's).
var cancelCtxType = func() reflect.Type {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	return reflect.TypeOf(ctx)
}()

// closed is the Done channel of a Scope that ended before anyone asked for it.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// New makes a Scope in parent: it ends when parent ends (with parent's Err and cause), when
// Cancel is called, or at deadline (the zero time: none) with Err context.DeadlineExceeded
// and cause (nil: context.DeadlineExceeded). Its Deadline is the earlier of deadline and
// parent's. It serves the values of values (nil: parent), which must be parent or a context
// made from parent with context.WithValue alone: what ends values is not watched.
func New(parent, values context.Context, deadline time.Time, cause error) *Scope {
	s := new(Scope)
	s.Init(parent, values, deadline, cause)
	return s
}

// Init is New for a Scope in the caller's memory (a field of a struct made for the request
// anyway: no allocation of its own). s must be a zero Scope, never used before; the Scope
// must not be copied after.
func (s *Scope) Init(parent, values context.Context, deadline time.Time, cause error) {
	if values == nil {
		values = parent
	}
	s.values, s.dlCause = values, cause
	s.self.kid = s
	own := !deadline.IsZero()
	if d, ok := parent.Deadline(); ok && (!own || d.Before(deadline)) {
		s.deadline, own = d, false // the parent's end comes first
	} else if own {
		s.deadline = deadline
	}
	s.attach(parent)
	if own && s.state.Load() == live {
		if wait := time.Until(deadline); wait > 0 {
			s.mu.Lock()
			if s.state.Load() == live {
				s.armed = true
				alarm.StartFirer(&s.timer, wait, (*expiry)(s))
			}
			s.mu.Unlock()
		} else {
			s.expire()
		}
	}
}

// attach lists s in the Scope parent is (or is made from by values alone: the same Done), or
// watches parent with context.AfterFunc; s ends at once if parent has ended.
func (s *Scope) attach(parent context.Context) {
	if p, ok := scopeOf(parent); ok {
		s.parent = p // before it is listed: p's end reads it
		if !p.listen(&s.self) {
			s.end(p.Err(), p.Cause())
		}
		return
	}
	done := parent.Done()
	if done == nil {
		return // never ends
	}
	select {
	case <-done:
		s.end(parent.Err(), context.Cause(parent))
		return
	default:
	}
	stop := context.AfterFunc(parent, func() { s.end(parent.Err(), context.Cause(parent)) })
	s.mu.Lock()
	s.stop = stop // after an end meanwhile, never called: the watch has run
	s.mu.Unlock()
}

// scopeOf is the Scope ctx is, or is made from by values alone (it ends when that Scope ends:
// the same Done channel, made for the comparison).
func scopeOf(ctx context.Context) (*Scope, bool) {
	if s, ok := ctx.(*Scope); ok {
		return s, true
	}
	if s, ok := ctx.Value(key{}).(*Scope); ok && ctx.Done() == s.Done() {
		return s, true
	}
	return nil, false
}

// push lists n first in s's list. s.mu held.
func (s *Scope) push(n *node) {
	n.listed, n.prev, n.next = true, nil, s.first
	if s.first != nil {
		s.first.prev = n
	}
	s.first = n
}

// unlink takes n out of s's list; false when it was not listed (s has ended and is running
// it, or it was taken out before). s.mu held.
func (s *Scope) unlink(n *node) bool {
	if !n.listed {
		return false
	}
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		s.first = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	}
	n.listed, n.prev, n.next = false, nil, nil
	return true
}

// Cancel ends s with Err context.Canceled and cause (nil: context.Canceled), if it has not
// ended. It ends the Scopes made in s and runs the functions given to AfterFunc, on this
// goroutine, before it returns.
func (s *Scope) Cancel(cause error) {
	s.end(context.Canceled, cause)
}

// expire ends s at its own deadline.
func (s *Scope) expire() {
	s.end(context.DeadlineExceeded, s.dlCause)
}

// expiry is a Scope as its alarm's Firer: the alarm runs expire without a method value's
// allocation, and Scope's own methods do not include a Fire.
type expiry Scope

func (e *expiry) Fire() { (*Scope)(e).expire() }

// end ends s once: its state, its Done channel, its alarm, its place in its parent, then
// what was listed in it, in the order listed (newest first).
func (s *Scope) end(err, cause error) {
	if cause == nil {
		cause = err
	}
	s.mu.Lock()
	if s.state.Load() != live {
		s.mu.Unlock()
		return
	}
	s.cause = cause
	if err == context.DeadlineExceeded {
		s.state.Store(expired)
	} else {
		s.state.Store(cancelled)
	}
	if d := s.done.Load(); d != nil {
		close(*d)
	}
	armed, stop, listed := s.armed, s.stop, s.first != nil
	s.mu.Unlock()

	if armed {
		s.timer.Stop()
	}
	if p := s.parent; p != nil {
		p.mu.Lock()
		p.unlink(&s.self)
		p.mu.Unlock()
	} else if stop != nil {
		stop()
	}
	// What was listed, newest first, each taken out under the lock before it runs (nothing is
	// listed any more: s has ended): a Stop from now on reports false, and a node taken is
	// this goroutine's alone (a Hook that its owner watches again gets a node of its own).
	for listed {
		s.mu.Lock()
		n := s.first
		if n == nil {
			s.mu.Unlock()
			return
		}
		s.unlink(n)
		kid, f := n.kid, n.f
		s.mu.Unlock()
		if kid != nil {
			kid.end(err, cause)
		} else {
			f()
		}
	}
}

// listen lists n in s, unless s has ended (false: the caller runs n's function itself).
func (s *Scope) listen(n *node) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state.Load() != live {
		return false
	}
	s.push(n)
	return true
}

// unlisten takes n out of s: false when it was not listed (s's end has taken it to run it,
// or it was taken out before).
func (s *Scope) unlisten(n *node) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unlink(n)
}

// Deadline is the earlier of the Scope's deadline and its parent's.
func (s *Scope) Deadline() (time.Time, bool) {
	return s.deadline, !s.deadline.IsZero()
}

// Done is closed when s ends. The channel is made by the first call.
func (s *Scope) Done() <-chan struct{} {
	if d := s.done.Load(); d != nil {
		return *d
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.done.Load(); d != nil {
		return *d
	}
	c := closed
	if s.state.Load() == live {
		c = make(chan struct{})
	}
	s.done.Store(&c)
	return c
}

// Err is nil while s lives, then context.DeadlineExceeded when it ended at a deadline
// (its own or a parent's), else context.Canceled.
func (s *Scope) Err() error {
	switch s.state.Load() {
	case live:
		return nil
	case expired:
		return context.DeadlineExceeded
	default:
		return context.Canceled
	}
}

// Cause is why s ended (nil while it lives): the cause given to Cancel, its deadline's
// cause, or its parent's cause when it ended with its parent.
func (s *Scope) Cause() error {
	if s.state.Load() == live {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cause
}

// Value is s itself for this package's key, else the values context's value; the standard
// library's question for its own enclosing cancellable context is not passed on.
func (s *Scope) Value(k any) any {
	if k == (key{}) {
		return s
	}
	v := s.values.Value(k)
	if v != nil && reflect.TypeOf(v) == cancelCtxType {
		return nil
	}
	return v
}

// AfterFunc arranges for f to run when s ends, on the goroutine that ends it (f must not
// block, nor wait for what that goroutine holds), or at once in a goroutine of its own if s
// has ended. stop unregisters f: it reports whether it stopped f from running. The
// standard library uses it for the contexts made from s.
func (s *Scope) AfterFunc(f func()) (stop func() bool) {
	h := &Hook{}
	h.watch(s, f)
	return h.Stop
}

// Hook is a function to run when a context ends, held in its caller's memory: watching a
// Scope with it costs no allocation (AfterFunc's entry and stop function are two). A Hook
// watches one context at a time; its zero value is ready.
type Hook struct {
	n    node
	s    *Scope
	stop func() bool // the watch of a context that is not a Scope
}

// Watch arranges for f to run when ctx ends, as AfterFunc does: listed in the Scope ctx is
// (or is made from by values alone; f then runs on the goroutine that ends it and must not
// block), else with context.AfterFunc. h must not be watching: Stop it first (once Stop has
// returned, h may watch again, even if f is still to run).
func (h *Hook) Watch(ctx context.Context, f func()) {
	s, ok := scopeOf(ctx)
	if !ok {
		h.s, h.stop = nil, context.AfterFunc(ctx, f)
		return
	}
	h.watch(s, f)
}

// watch lists h in s to run f, or runs f at once in a goroutine of its own if s has ended.
func (h *Hook) watch(s *Scope, f func()) {
	h.s, h.stop, h.n = s, nil, node{f: f}
	if !s.listen(&h.n) {
		go f()
	}
}

// Stop ends the watch: it reports whether it stopped the function from running (false when
// it ran, is running, or the Hook was not watching).
func (h *Hook) Stop() bool {
	if s := h.s; s != nil {
		return s.unlisten(&h.n)
	}
	if h.stop != nil {
		return h.stop()
	}
	return false
}

// String names the Scope for debugging output.
func (s *Scope) String() string {
	switch s.state.Load() {
	case live:
		return "scope"
	default:
		return "scope (ended: " + s.Err().Error() + ")"
	}
}

// Cause is why ctx ended (nil while it lives): the cause of the nearest Scope ctx is or is
// made from when ctx ended with it (by values alone, or as a context the standard library
// made from it, which ends with the Scope's Err as its cause), else context.Cause(ctx).
func Cause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	if s, ok := ctx.Value(key{}).(*Scope); ok {
		if c := s.Cause(); c != nil && (ctx.Done() == s.Done() || context.Cause(ctx) == s.Err()) {
			return c
		}
	}
	return context.Cause(ctx)
}
