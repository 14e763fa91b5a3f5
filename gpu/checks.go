package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Flags is a set of model-server states that the Scraper's checks found from the server's
// own metrics. The zero value is none.
type Flags uint8

// The flags.
const (
	// FlagKVLeak: the KV cache stayed in use while the server had nothing running or
	// waiting (see LeakCheck).
	FlagKVLeak Flags = 1 << iota
	// FlagStall: the queue grew while throughput fell (see StallCheck).
	FlagStall
)

// CheckNames are the names of the checks, in the order of their flags' bits: the `check`
// label of metrics, the admin view and logs.
var CheckNames = [...]string{"kv_leak", "stall"}

// Has reports whether every flag of g is in f.
func (f Flags) Has(g Flags) bool { return f&g == g }

// Names returns the names of f's flags, in CheckNames order.
func (f Flags) Names() []string {
	var out []string
	for i, n := range CheckNames {
		if f&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// String is Names joined by commas ("" for none).
func (f Flags) String() string { return strings.Join(f.Names(), ",") }

// MarshalJSON writes f as a list of names.
func (f Flags) MarshalJSON() ([]byte, error) {
	names := f.Names()
	if names == nil {
		names = []string{}
	}
	b := []byte{'['}
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, n...)
		b = append(b, '"')
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads a list of names, as MarshalJSON writes it.
func (f *Flags) UnmarshalJSON(b []byte) error {
	var names []string
	if err := json.Unmarshal(b, &names); err != nil {
		return fmt.Errorf("gpu: flags: %w", err)
	}
	var out Flags
	for _, n := range names {
		i := slices.Index(CheckNames[:], n)
		if i < 0 {
			return fmt.Errorf("gpu: flags: unknown check %q", n)
		}
		out |= 1 << i
	}
	*f = out
	return nil
}

// Check defaults (see Checks).
const (
	DefaultLeakMinKVUsage          = 0.1
	DefaultLeakFor                 = 5 * time.Minute
	DefaultStallWindow             = 30 * time.Second
	DefaultStallMinWaiting         = 2
	DefaultStallMaxThroughputRatio = 0.5
)

// Checks configures the model-server state checks the Scraper runs on every good scrape of
// an endpoint (a failed scrape neither confirms nor breaks a condition). The zero value runs
// both checks with the defaults.
type Checks struct {
	Disabled bool // no checks at all: Load.Flags stays empty
	Leak     LeakCheck
	Stall    StallCheck
}

// LeakCheck flags a KV-cache leak: KV-cache use of at least MinKVUsage on every scrape for
// For, each one with nothing running and nothing waiting. vLLM's kv_cache_usage_perc (and
// gpu_cache_usage_perc) counts the blocks held by requests; blocks that only the prefix
// cache keeps are free, so an idle vLLM reads about 0 and KV use that outlives every request
// is blocks nobody will free. For is long so that blocks held a while after a request ends
// (a disaggregated prefill's blocks waiting for the decoder to read them) do not trip it.
// The flag clears on the first scrape that reads KV use below ClearBelow, busy or not.
// It needs the server to report its running requests and KV use (TGI reports no KV use:
// never flagged).
type LeakCheck struct {
	Disabled   bool
	MinKVUsage float64       // 0–1; default 0.1
	For        time.Duration // default 5m
	ClearBelow float64       // 0–1, below MinKVUsage; default MinKVUsage / 2
}

// StallCheck flags a stall: over the last Window, the queue grew (more waiting now than at
// the window's start) and stayed at MinWaiting or more through the window's second half,
// while throughput (the rate of the Names.Throughput counter: generated tokens) over the
// second half fell to at most MaxThroughputRatio of the first half's (a server that
// generated nothing in both halves with such a queue counts too). A queue that is only
// forming (a burst), a queue that drains, and a busy server whose throughput holds or rises
// are not stalls. The flag clears when the queue falls below MinWaiting, or when throughput
// over the last half window is back above MaxThroughputRatio of what it was before the
// stall. It needs the server to report its queue and a throughput counter.
type StallCheck struct {
	Disabled           bool
	Window             time.Duration // default 30s
	MinWaiting         float64       // default 2
	MaxThroughputRatio float64       // in (0, 1); default 0.5
}

// Validate reports every problem at once (joined with errors.Join), or nil. Zero values
// mean the defaults.
func (c Checks) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("gpu: Checks."+format, args...)) }
	l, s := c.Leak, c.Stall
	if !inUnit(l.MinKVUsage) || l.MinKVUsage > 1 {
		bad("Leak.MinKVUsage: must be within 0..1 (0 means %v), got %v", DefaultLeakMinKVUsage, l.MinKVUsage)
	}
	if !inUnit(l.ClearBelow) || l.ClearBelow > 1 {
		bad("Leak.ClearBelow: must be within 0..1, got %v", l.ClearBelow)
	} else if l.ClearBelow > 0 && inUnit(l.MinKVUsage) && l.ClearBelow >= c.withDefaults().Leak.MinKVUsage {
		bad("Leak.ClearBelow: %v must be below MinKVUsage %v", l.ClearBelow, c.withDefaults().Leak.MinKVUsage)
	}
	if l.For < 0 {
		bad("Leak.For: must not be negative, got %v", l.For)
	}
	if s.Window < 0 {
		bad("Stall.Window: must not be negative, got %v", s.Window)
	}
	if !(s.MinWaiting >= 0 && s.MinWaiting <= maxMinWaiting) {
		bad("Stall.MinWaiting: must be a number >= 0 (0 means %v), got %v", float64(DefaultStallMinWaiting), s.MinWaiting)
	}
	if !inUnit(s.MaxThroughputRatio) || s.MaxThroughputRatio >= 1 {
		bad("Stall.MaxThroughputRatio: must be within 0..1, 1 excluded (0 means %v), got %v", DefaultStallMaxThroughputRatio, s.MaxThroughputRatio)
	}
	return errors.Join(errs...)
}

// maxMinWaiting bounds StallCheck.MinWaiting (a queue no server holds).
const maxMinWaiting = 1e9

// inUnit reports whether v is a number >= 0 and <= 1.
func inUnit(v float64) bool { return v >= 0 && v <= 1 }

// withDefaults fills in zero values.
func (c Checks) withDefaults() Checks {
	l, s := &c.Leak, &c.Stall
	if l.MinKVUsage == 0 {
		l.MinKVUsage = DefaultLeakMinKVUsage
	}
	if l.For == 0 {
		l.For = DefaultLeakFor
	}
	if l.ClearBelow == 0 {
		l.ClearBelow = l.MinKVUsage / 2
	}
	if s.Window == 0 {
		s.Window = DefaultStallWindow
	}
	if s.MinWaiting == 0 {
		s.MinWaiting = DefaultStallMinWaiting
	}
	if s.MaxThroughputRatio == 0 {
		s.MaxThroughputRatio = DefaultStallMaxThroughputRatio
	}
	return c
}

// Which metrics a scrape found (a page may lack some of the configured ones).
const (
	hasWaiting uint8 = 1 << iota
	hasRunning
	hasKV
	hasThroughput
)

// historySize is the number of samples the stall check keeps per endpoint: fixed, so that
// memory and the cost of a check do not depend on the window or the scrape interval. A power
// of two (indices wrap with a mask).
const historySize = 16

// sample is one slot of the history: the last scrape merged into it, and the smallest queue
// seen by the scrapes merged into it (so that "the queue stayed at MinWaiting" is judged on
// every scrape, not only on the ones the history keeps).
type sample struct {
	at         int64 // unix nanoseconds
	waiting    float64
	minWaiting float64
	throughput float64
}

// checker is the check state of one endpoint. It is used by the endpoint's scrapes (one at
// a time, under the endpoint's checkMu) and read by Snapshot under the same lock.
type checker struct {
	ring  [historySize]sample
	n     int // samples held
	head  int // index of the newest sample
	flags Flags

	leakSince int64         // unix ns of the first scrape of the current run of leak evidence; 0: none
	leakHeld  time.Duration // how long that run has lasted, while not flagged
	stallRef  float64       // throughput before the stall (per second), while flagged
	flaggedAt [len(CheckNames)]time.Time
	clearedAt [len(CheckNames)]time.Time
	times     [len(CheckNames)]uint64
	detail    [len(CheckNames)]string
}

// transition is a flag entered (on) or left by one observation, for the log.
type transition struct {
	check  int
	on     bool
	detail string
	after  time.Duration // how long the flag was on (leaving)
}

// observe runs the checks on one good scrape and returns the endpoint's flags after it;
// transitions it caused are appended to tr. It does not allocate unless a flag changes.
func (k *checker) observe(c *Checks, l *Load, has uint8, at time.Time, tr []transition) (Flags, []transition) {
	now := at.UnixNano()
	if !c.Leak.Disabled {
		tr = k.leak(&c.Leak, l, has, now, at, tr)
	} else if k.flags.Has(FlagKVLeak) {
		tr = k.clear(0, at, "check disabled", tr)
	}
	if !c.Stall.Disabled {
		tr = k.stall(&c.Stall, l, has, now, at, tr)
	} else if k.flags.Has(FlagStall) {
		tr = k.clear(1, at, "check disabled", tr)
	}
	return k.flags, tr
}

func (k *checker) set(i int, at time.Time, detail string, tr []transition) []transition {
	k.flags |= 1 << i
	k.flaggedAt[i], k.detail[i] = at, detail
	k.times[i]++
	return append(tr, transition{check: i, on: true, detail: detail})
}

func (k *checker) clear(i int, at time.Time, detail string, tr []transition) []transition {
	k.flags &^= 1 << i
	k.clearedAt[i], k.detail[i] = at, detail
	return append(tr, transition{check: i, detail: detail, after: at.Sub(k.flaggedAt[i])})
}

func (k *checker) leak(c *LeakCheck, l *Load, has uint8, now int64, at time.Time, tr []transition) []transition {
	if k.flags.Has(FlagKVLeak) {
		if has&hasKV != 0 && l.KVCacheUsage < c.ClearBelow {
			k.leakSince = 0
			return k.clear(0, at, fmt.Sprintf("KV cache %.0f%% used, below %.0f%%", 100*l.KVCacheUsage, 100*c.ClearBelow), tr)
		}
		return tr
	}
	idle := has&(hasRunning|hasKV) == hasRunning|hasKV && l.Running == 0 && l.Waiting == 0
	if !idle || l.KVCacheUsage < c.MinKVUsage {
		k.leakSince, k.leakHeld = 0, 0
		return tr
	}
	if k.leakSince == 0 {
		k.leakSince = now
	}
	held := time.Duration(now - k.leakSince)
	if held < c.For {
		k.leakHeld = held
		return tr
	}
	k.leakHeld = 0
	return k.set(0, at, fmt.Sprintf("KV cache %.0f%% used with nothing running or waiting for %v", 100*l.KVCacheUsage, held), tr)
}

// push adds a scrape to the history: it merges into the newest slot while that slot is less
// than step after the one before it, and otherwise opens a new slot (dropping the oldest
// when the history is full). Kept slots are thus at least step apart, and the history spans
// at least (historySize-2) × step once full.
func (k *checker) push(s sample, step int64) {
	if k.n > 0 {
		last := &k.ring[k.head]
		if s.at < last.at {
			return // a scrape that finished after a later one (Poll beside the pollers)
		}
		if s.throughput < last.throughput {
			k.n = 0 // the counter went back: the server restarted
		} else if k.n >= 2 && last.at-k.at(1).at < step {
			s.minWaiting = min(s.minWaiting, last.minWaiting)
			*last = s
			return
		}
	}
	k.head = (k.head + 1) & (historySize - 1)
	k.ring[k.head] = s
	k.n = min(k.n+1, historySize)
}

// at returns the i-th newest sample (0: the newest); i < k.n.
func (k *checker) at(i int) *sample { return &k.ring[uint(k.head-i)&(historySize-1)] }

// find returns the indices (as for at) of the newest samples taken at or before mid and at
// or before start (start <= mid), -1 where there is none, in one pass.
func (k *checker) find(mid, start int64) (int, int) {
	m := -1
	for i := range k.n {
		t := k.ring[uint(k.head-i)&(historySize-1)].at
		if m < 0 && t <= mid {
			m = i
		}
		if t <= start {
			return m, i
		}
	}
	return m, -1
}

func rate(from, to *sample) float64 {
	return (to.throughput - from.throughput) / (float64(to.at-from.at) / float64(time.Second))
}

func (k *checker) stall(c *StallCheck, l *Load, has uint8, now int64, at time.Time, tr []transition) []transition {
	if has&(hasWaiting|hasThroughput) != hasWaiting|hasThroughput {
		k.n = 0
		if k.flags.Has(FlagStall) {
			return k.clear(1, at, "the server no longer reports its queue and throughput", tr)
		}
		return tr
	}
	w := int64(c.Window)
	k.push(sample{at: now, waiting: l.Waiting, minWaiting: l.Waiting, throughput: l.Throughput}, w/(historySize-2))
	cur := k.at(0)
	mid, start := k.find(now-w/2, now-w)
	if k.flags.Has(FlagStall) {
		switch {
		case l.Waiting < c.MinWaiting:
			return k.clear(1, at, fmt.Sprintf("queue down to %v", l.Waiting), tr)
		case mid > 0:
			if r := rate(k.at(mid), cur); r > 0 && r > c.MaxThroughputRatio*k.stallRef {
				return k.clear(1, at, fmt.Sprintf("throughput back to %.1f/s (%.1f/s before the stall)", r, k.stallRef), tr)
			}
		}
		return tr
	}
	if start < 0 || mid <= 0 || start <= mid {
		return tr // not a window of history yet
	}
	s, m := k.at(start), k.at(mid)
	if cur.waiting <= s.waiting || m.waiting < c.MinWaiting {
		return tr
	}
	for i := range mid {
		if k.at(i).minWaiting < c.MinWaiting {
			return tr
		}
	}
	before, after := rate(s, m), rate(m, cur)
	if after > c.MaxThroughputRatio*before {
		return tr
	}
	k.stallRef = before
	return k.set(1, at, fmt.Sprintf("queue %v → %v while throughput fell from %.1f/s to %.1f/s over %v",
		s.waiting, cur.waiting, before, after, time.Duration(now-s.at)), tr)
}

// CheckStatus is one check of one endpoint as the admin page shows it.
type CheckStatus struct {
	Check        string    `json:"check"` // a CheckNames entry
	Flagged      bool      `json:"flagged"`
	FlaggedAt    time.Time `json:"flagged_at,omitzero"` // the last time it was flagged
	ClearedAt    time.Time `json:"cleared_at,omitzero"` // the last time the flag cleared
	TimesFlagged uint64    `json:"times_flagged"`
	// PendingSeconds: the leak condition has held this long without being flagged yet.
	PendingSeconds float64 `json:"pending_seconds,omitempty"`
	Detail         string  `json:"detail,omitempty"` // what the last transition saw
}

func (k *checker) status(c *Checks) []CheckStatus {
	out := make([]CheckStatus, 0, len(CheckNames))
	for i, name := range CheckNames {
		if (i == 0 && c.Leak.Disabled) || (i == 1 && c.Stall.Disabled) {
			continue
		}
		out = append(out, CheckStatus{
			Check: name, Flagged: k.flags&(1<<i) != 0, FlaggedAt: k.flaggedAt[i], ClearedAt: k.clearedAt[i],
			TimesFlagged: k.times[i], Detail: k.detail[i],
		})
		if i == 0 {
			out[len(out)-1].PendingSeconds = k.leakHeld.Seconds()
		}
	}
	return out
}
