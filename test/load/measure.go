package load

import (
	"time"
)

// Event is one SSE event as the client saw it.
type Event struct {
	At      time.Duration // since send
	Content bool          // choices carry non-empty content/text
	Tokens  int           // tokenizer count of the event's text (>= 1 when Content)
	Usage   int           // cumulative completion_tokens on this chunk, -1 when absent
}

// Timeline is what Measure derives from a request's events.
type Timeline struct {
	FirstEvent time.Duration   // first event of any kind (-1 when none)
	TTFT       time.Duration   // first content event (-1 when none)
	E2E        time.Duration   // last content event
	TPOT       time.Duration   // (E2E − TTFT)/(tokens − 1); -1 with fewer than 2 tokens
	TokenTimes []time.Duration // one per output token
	ITL        []time.Duration // len(TokenTimes) − 1 gaps
	Tokens     int
	FromUsage  bool // token counts came from usage
}

// Measure computes a request's timeline from its events and the final usage
// (completion_tokens, or -1 when the server sent none). See the package doc for the rules.
func Measure(events []Event, finalUsage int) Timeline {
	tl := Timeline{FirstEvent: -1, TTFT: -1, TPOT: -1}
	if len(events) > 0 {
		tl.FirstEvent = events[0].At
	}
	var idx []int // content events
	continuous := true
	for i, e := range events {
		if e.Content {
			idx = append(idx, i)
			if e.Usage < 0 {
				continuous = false
			}
		}
	}
	if len(idx) == 0 {
		if finalUsage > 0 {
			tl.Tokens, tl.FromUsage = finalUsage, true
		}
		return tl
	}
	counts := make([]int, len(idx))
	switch {
	case continuous:
		prev := 0
		j := 0
		for i, e := range events {
			if e.Usage >= 0 {
				if j < len(idx) && idx[j] == i {
					counts[j] = max(e.Usage-prev, 0)
					j++
				}
				prev = max(prev, e.Usage)
			}
		}
		tl.FromUsage = true
	default:
		w := make([]int, len(idx))
		for j, i := range idx {
			w[j] = max(events[i].Tokens, 1)
		}
		if finalUsage > 0 {
			counts = apportion(w, finalUsage)
			tl.FromUsage = true
		} else {
			counts = w
		}
	}
	var prev time.Duration = -1
	for j, i := range idx {
		n, at := counts[j], events[i].At
		if n <= 0 {
			continue
		}
		if prev < 0 {
			for range n {
				tl.TokenTimes = append(tl.TokenTimes, at)
			}
		} else {
			gap := at - prev
			for k := 1; k <= n; k++ {
				tl.TokenTimes = append(tl.TokenTimes, prev+gap*time.Duration(k)/time.Duration(n))
			}
		}
		prev = at
	}
	tl.Tokens = len(tl.TokenTimes)
	if tl.Tokens == 0 {
		return tl
	}
	tl.TTFT = tl.TokenTimes[0]
	tl.E2E = tl.TokenTimes[tl.Tokens-1]
	tl.ITL = make([]time.Duration, 0, tl.Tokens-1)
	for k := 1; k < tl.Tokens; k++ {
		tl.ITL = append(tl.ITL, tl.TokenTimes[k]-tl.TokenTimes[k-1])
	}
	if tl.Tokens >= 2 {
		tl.TPOT = (tl.E2E - tl.TTFT) / time.Duration(tl.Tokens-1)
	}
	return tl
}

// apportion splits total in proportion to weights by cumulative rounding (exact sum).
func apportion(w []int, total int) []int {
	sum := 0
	for _, x := range w {
		sum += x
	}
	out := make([]int, len(w))
	if sum == 0 {
		return out
	}
	cum, prev := 0, 0
	for i, x := range w {
		cum += x
		c := int((int64(total)*int64(cum) + int64(sum)/2) / int64(sum))
		out[i] = c - prev
		prev = c
	}
	return out
}

// Error classes.
const (
	ErrNone      = ""
	ErrConnect   = "connect"      // no response (dial, reset before headers)
	ErrTimeout   = "timeout"      // the request timeout passed
	ErrHTTP4xx   = "http_4xx"     // 4xx other than 429
	ErrHTTP429   = "http_429"     // rate limited
	ErrHTTP5xx   = "http_5xx"     // 5xx
	ErrStream    = "stream_error" // an SSE error event or an error body in the stream
	ErrTruncated = "truncated"    // the stream ended without [DONE] / finish
	ErrEmpty     = "empty"        // a successful answer with no tokens
	ErrCanceled  = "canceled"     // the run was stopped
)

// Result is one request's measurement.
type Result struct {
	Index     int
	Session   string
	Turn      int
	Scheduled time.Time // when the pacer wanted it sent
	Sent      time.Time // when it was written
	Done      time.Time
	Timeline      // TTFT etc. relative to Sent
	Input     int // prompt tokens sent
	Status    int
	Class     string // ErrNone when it succeeded
	Err       string
	Upstream  string // x-sluice-upstream
	Attempts  int    // x-sluice-attempts (0 when absent)
	Aborted   bool   // client-side chaos cut it short on purpose
	Expected  int    // markers planted in earlier turns
	Found     int    // of those, repeated in the answer
	Text      string // answer text (sessions only)
}

// Lag is the scheduling lag: actual send minus scheduled time.
func (r *Result) Lag() time.Duration {
	if r.Scheduled.IsZero() {
		return 0
	}
	return max(r.Sent.Sub(r.Scheduled), 0)
}

// OK reports whether the request succeeded.
func (r *Result) OK() bool { return r.Class == ErrNone && !r.Aborted }
