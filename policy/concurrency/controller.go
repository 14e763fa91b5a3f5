package concurrency

import (
	"math"
	"slices"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// LoadSource gives a cluster's model-server load (policy.LoadSource).
type LoadSource = policy.LoadSource

// LoadFunc adapts a function to a LoadSource (policy.LoadFunc).
type LoadFunc = policy.LoadFunc

const (
	maxWindowSamples  = 1024 // samples kept per signal per window (later ones are dropped)
	maxWindowClusters = 4    // clusters whose load is read per window
	maxPressureGrad   = 0.95 // any GPU pressure lowers the limit by at least 5% before smoothing
)

// minWindow is a sliding-window minimum (monotonic deque) of window samples.
type minWindow struct {
	span time.Duration
	q    []minEntry
	base time.Duration // the baseline: falls with every lower sample, rises only via rebase
}

type minEntry struct {
	t time.Time
	v time.Duration
}

func (w *minWindow) push(t time.Time, v time.Duration) {
	for len(w.q) > 0 && w.q[len(w.q)-1].v >= v {
		w.q = w.q[:len(w.q)-1]
	}
	w.q = append(w.q, minEntry{t, v})
	cut := 0
	for cut < len(w.q)-1 && t.Sub(w.q[cut].t) > w.span {
		cut++
	}
	if cut > 0 {
		w.q = append(w.q[:0], w.q[cut:]...)
	}
	if w.base == 0 || v < w.base {
		w.base = v
	}
}

// rebase lets the baseline rise to the minimum of the last span.
func (w *minWindow) rebase() {
	if len(w.q) > 0 {
		w.base = w.q[0].v
	}
}

func (w *minWindow) min() time.Duration {
	if len(w.q) == 0 {
		return 0
	}
	return w.q[0].v
}

// controller is the gradient controller. It is not safe for concurrent use (the Limiter
// holds its lock).
type controller struct {
	p     Params
	limit float64

	winStart    time.Time
	ttft, tpot  []time.Duration
	drops       int
	maxInflight int
	clusters    []string
	scratch     []time.Duration

	baseTTFT, baseTPOT minWindow
	atMinSince         time.Time // when the limit came down to min_limit (zero: it is above)
	prevWaiting        map[string]float64

	// last update, for Snapshot
	sampleTTFT, sampleTPOT time.Duration
	gradient, latGradient  float64
	pressGradient          float64
	pressure               string
	windows                uint64
	lastUpdate             time.Time
}

func newController(p Params, now time.Time) *controller {
	return &controller{
		p:             p,
		limit:         float64(p.InitialLimit),
		winStart:      now,
		ttft:          make([]time.Duration, 0, 64),
		tpot:          make([]time.Duration, 0, 64),
		baseTTFT:      minWindow{span: p.MinRTT.D()},
		baseTPOT:      minWindow{span: p.MinRTT.D()},
		prevWaiting:   map[string]float64{},
		gradient:      1,
		latGradient:   1,
		pressGradient: 1,
	}
}

// current is the limit in whole requests.
func (c *controller) current() int {
	return min(max(int(math.Floor(c.limit+1e-9)), c.p.MinLimit), c.p.MaxLimit)
}

// noteInflight records the in-flight count reached in the window (to tell an app-limited
// window: one that never used half its limit does not raise it).
func (c *controller) noteInflight(n int) {
	if n > c.maxInflight {
		c.maxInflight = n
	}
}

// isDrop tells an outcome that says "overloaded" without a latency: the model server's 429 or
// 5xx, or a TTFT time-out.
func isDrop(o policy.Outcome) bool {
	switch o.ErrorClass {
	case "upstream_429", "upstream_5xx", "ttft_timeout":
		return true
	}
	return o.Status == 429 || o.Status == 503
}

// observe adds o to the window. It reports whether the sample counts.
func (c *controller) observe(o policy.Outcome) {
	switch {
	case o.TTFT > 0 && o.Status < 400 && o.ErrorClass == "":
		if len(c.ttft) < maxWindowSamples {
			c.ttft = append(c.ttft, o.TTFT)
		}
		if o.TPOT > 0 && len(c.tpot) < maxWindowSamples {
			c.tpot = append(c.tpot, o.TPOT)
		}
	case isDrop(o):
		c.drops++
	default:
		return // client gone, 4xx...: says nothing about the server's latency
	}
	if o.Cluster != "" && len(c.clusters) < maxWindowClusters && !slices.Contains(c.clusters, o.Cluster) {
		c.clusters = append(c.clusters, o.Cluster)
	}
}

// maybeUpdate closes the window and updates the limit when the window is due. It reports
// whether it did.
func (c *controller) maybeUpdate(now time.Time, src LoadSource) bool {
	n := len(c.ttft) + c.drops
	if now.Sub(c.winStart) < c.p.SampleWindow.D() || n < c.p.MinSamples {
		return false
	}
	c.update(now, src)
	c.winStart = now
	c.ttft, c.tpot, c.drops, c.clusters = c.ttft[:0], c.tpot[:0], 0, c.clusters[:0]
	c.maxInflight = 0
	return true
}

func (c *controller) percentile(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	c.scratch = append(c.scratch[:0], xs...)
	slices.Sort(c.scratch)
	i := int(math.Ceil(c.p.Percentile*float64(len(c.scratch)))) - 1
	return c.scratch[min(max(i, 0), len(c.scratch)-1)]
}

// signalGradient is ref / sample for one signal, ref = min(baseline × (1+tolerance), target).
func (c *controller) signalGradient(now time.Time, w *minWindow, sample, target time.Duration) float64 {
	if sample <= 0 {
		return math.Inf(1)
	}
	w.push(now, sample)
	ref := float64(w.base) * (1 + c.p.Tolerance)
	if target > 0 && float64(target) < ref {
		ref = float64(target)
	}
	return ref / float64(sample)
}

func (c *controller) update(now time.Time, src LoadSource) {
	c.windows++
	c.lastUpdate = now
	c.sampleTTFT = c.percentile(c.ttft)
	c.sampleTPOT = c.percentile(c.tpot)
	lat := math.Min(
		c.signalGradient(now, &c.baseTTFT, c.sampleTTFT, c.p.TargetTTFT.D()),
		c.signalGradient(now, &c.baseTPOT, c.sampleTPOT, c.p.TargetTPOT.D()))
	if c.drops > 0 {
		lat = math.Min(lat, 1-float64(c.drops)/float64(len(c.ttft)+c.drops))
	}
	if math.IsInf(lat, 1) {
		lat = 1
	}
	c.latGradient = lat
	press, reason := c.pressureGradient(src)
	c.pressGradient, c.pressure = press, reason

	g := lat
	if press < 1 {
		g = math.Min(lat, press)
	}
	congested := g < 1
	g = math.Min(math.Max(g, c.p.MinGradient), c.p.MaxGradient)
	appLimited := float64(c.maxInflight) < c.limit/2
	if appLimited && g > 1 {
		g = 1
	}
	c.gradient = g
	h := 0.0
	if !congested && !appLimited {
		h = c.p.Headroom
		if h == 0 {
			h = math.Sqrt(c.limit)
		}
	}
	raw := c.limit*g + h
	next := (1-c.p.Smoothing)*c.limit + c.p.Smoothing*raw
	c.limit = math.Min(math.Max(next, float64(c.p.MinLimit)), float64(c.p.MaxLimit))
	// The baseline rises only after the limit has sat at min_limit for min_rtt: latency that
	// stays high with the least concurrency is the server's new normal, not congestion.
	// (A sliding minimum alone drifts up under sustained overload and the limit with it.)
	switch {
	case c.limit > float64(c.p.MinLimit):
		c.atMinSince = time.Time{}
	case c.atMinSince.IsZero():
		c.atMinSince = now
	case now.Sub(c.atMinSince) >= c.p.MinRTT.D():
		c.baseTTFT.rebase()
		c.baseTPOT.rebase()
		c.atMinSince = now
	}
}

// pressureGradient reads the model servers' signals of the clusters that served in the window.
func (c *controller) pressureGradient(src LoadSource) (float64, string) {
	if src == nil {
		return 1, ""
	}
	g, reason := 1.0, ""
	for _, cl := range c.clusters {
		waiting, kv, fresh := src.ClusterLoad(cl)
		if !fresh {
			delete(c.prevWaiting, cl)
			continue
		}
		if kv > c.p.KVHigh && c.p.KVHigh < 1 {
			gk := math.Min(maxPressureGrad, 1-(kv-c.p.KVHigh)/(2*(1-c.p.KVHigh)))
			if gk < g {
				g, reason = gk, "kv_cache:"+cl
			}
		}
		if prev, ok := c.prevWaiting[cl]; ok && waiting > prev && waiting >= 1 {
			gq := math.Min(maxPressureGrad, (prev+1)/(waiting+1))
			if gq < g {
				g, reason = gq, "queue_growing:"+cl
			}
		}
		c.prevWaiting[cl] = waiting
	}
	return math.Max(g, c.p.MinGradient), reason
}
