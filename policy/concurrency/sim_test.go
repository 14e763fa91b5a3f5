package concurrency

import (
	"container/heap"
	"context"
	"testing"
	"time"

	"github.com/sluicegw/sluice/policy"
)

// toyServer models a model server with continuous batching: up to knee concurrent requests
// it runs at full speed; beyond, prefill queues (TTFT grows fast) and decode slows.
type toyServer struct {
	knee     int
	inflight int
}

func (s *toyServer) latency(c int) (ttft, tpot time.Duration) {
	over := max(0, float64(c-s.knee)) / float64(s.knee)
	ttft = time.Duration(float64(80*time.Millisecond) * (1 + 3*over))
	tpot = time.Duration(float64(15*time.Millisecond) * (1 + 0.2*min(float64(c), float64(s.knee))/float64(s.knee)) * (1 + over))
	return
}

type completion struct {
	at time.Time
	d  policy.Decision
	o  policy.Outcome
}

type completions []completion

func (h completions) Len() int           { return len(h) }
func (h completions) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h completions) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *completions) Push(x any)        { *h = append(*h, x.(completion)) }
func (h *completions) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// TestClosedLoopSettlesNearKnee offers far more load than the server's knee (100 clients
// against a knee of 24) and checks that the limit settles near the knee, so TTFT stays near
// its uncongested value instead of growing with the offered load.
func TestClosedLoopSettlesNearKnee(t *testing.T) {
	const (
		knee    = 24
		clients = 100
		tokens  = 50
		tick    = 10 * time.Millisecond
		simTime = 240 * time.Second
	)
	clk := newClock()
	l := newLimiter(t, Params{MinLimit: 2, MaxLimit: 200, InitialLimit: 8, MaxQueue: -1}, clk)
	srv := &toyServer{knee: knee}
	var pending completions
	idle := clients
	start := clk.Now()
	var limits []int
	var ttftLate []time.Duration
	nextSample := start
	for clk.Now().Sub(start) < simTime {
		now := clk.Now()
		for len(pending) > 0 && !pending[0].at.After(now) {
			c := heap.Pop(&pending).(completion)
			srv.inflight--
			idle++
			c.d.Done(c.o)
		}
		for idle > 0 {
			d, err := l.Admit(context.Background(), req("x"))
			if err != nil {
				t.Fatal(err)
			}
			if d.Reject != nil {
				break
			}
			idle--
			srv.inflight++
			ttft, tpot := srv.latency(srv.inflight)
			o := policy.Outcome{Status: 200, Cluster: "c", TTFT: ttft, TPOT: tpot, OutputTokens: tokens}
			heap.Push(&pending, completion{at: now.Add(ttft + tokens*tpot), d: d, o: o})
			if now.Sub(start) > simTime/2 {
				ttftLate = append(ttftLate, ttft)
			}
		}
		if !now.Before(nextSample) {
			limits = append(limits, l.Stats().Limit)
			if testing.Verbose() && len(limits)%3 == 0 {
				s := l.Snapshot()
				t.Logf("t=%d limit=%d base=%s/%s sample=%s/%s g=%.2f", len(limits), s.Limit, s.BaselineTTFT.D(), s.BaselineTPOT.D(), s.SampleTTFT.D(), s.SampleTPOT.D(), s.Gradient)
			}
			nextSample = nextSample.Add(time.Second)
		}
		clk.Advance(tick)
	}
	for len(pending) > 0 {
		heap.Pop(&pending).(completion).d.Done(ok200)
	}
	late := limits[len(limits)/2:]
	sum := 0
	lo, hi := late[0], late[0]
	for _, v := range late {
		sum += v
		lo, hi = min(lo, v), max(hi, v)
	}
	mean := float64(sum) / float64(len(late))
	var worst time.Duration
	var over int
	for _, v := range ttftLate {
		worst = max(worst, v)
		if v > 160*time.Millisecond {
			over++
		}
	}
	t.Logf("limit over the second half: mean %.1f, range %d..%d (knee %d); admitted TTFT max %s, %.1f%% over 2× uncongested",
		mean, lo, hi, knee, worst, 100*float64(over)/float64(len(ttftLate)))
	if mean < 0.8*knee || mean > 1.5*knee {
		t.Fatalf("mean limit %.1f, want near the knee %d (%.0f..%.0f)", mean, knee, 0.8*knee, 1.5*knee)
	}
	if p := float64(over) / float64(len(ttftLate)); p > 0.1 {
		t.Fatalf("%.0f%% of admitted TTFTs above 2× uncongested", 100*p)
	}
	if s := l.Stats(); s.InFlight != 0 {
		t.Fatalf("in flight %d at the end", s.InFlight)
	}
}
