package sim

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Per-request test knobs, read from request headers (the gateway forwards headers, so
// end-to-end tests steer the simulator request by request). Durations use Go syntax
// ("150ms", "2s") or a plain number of seconds; they are real time, never scaled.
const (
	// HeaderDieAfter: after N SSE events, kill the connection abruptly (no terminating
	// chunk, no [DONE]). 0 kills it right after the response headers. A non-streaming
	// request is closed at once without any response.
	HeaderDieAfter = "X-Sim-Die-After"
	// HeaderStallFirst: hold the response this long: before the headers for a
	// non-streaming request, after the headers and before the first event for a stream.
	HeaderStallFirst = "X-Sim-Stall-First"
	// HeaderStallAfter and HeaderStallFor: after N SSE events, pause for the given time.
	HeaderStallAfter = "X-Sim-Stall-After"
	HeaderStallFor   = "X-Sim-Stall-For"
	// HeaderStatus: answer this HTTP status (400-599) at once with an OpenAI error body
	// (429 and 503 carry Retry-After: 1).
	HeaderStatus = "X-Sim-Status"
	// HeaderErrorAfter: after N SSE events, end the stream with an in-stream error the way
	// vLLM does: `data: {"error":{"message":…,"type":"InternalServerError","param":null,"code":500}}`
	// then `data: [DONE]` (chat, completions), or an `event: error` event
	// {"type":"error","code":"server_error","message":…,"param":null,"sequence_number":N}
	// (Responses API, no [DONE]). A non-streaming request is answered 500 with that error
	// body at once.
	HeaderErrorAfter = "X-Sim-Error-After"
	// HeaderErrorEvent: "1" or "true" sends the chat/completions error above as a named
	// event (an `event: error` line before its data line), as some servers do. Needs
	// HeaderErrorAfter. Responses API errors are always named events.
	HeaderErrorEvent = "X-Sim-Error-Event"
	// HeaderLoopAfter: the text answer falls into a loop after N tokens (N ≥ 1): from token
	// N on, it repeats its own last P tokens (HeaderLoopPeriod, default min(16, N)) again
	// and again, never reaching EOS, up to max tokens (finish_reason "length", a Responses
	// answer "incomplete"). Deterministic: the same request loops the same way, streamed or
	// not. An answer that would end before token N, and a tool call, are left as they are.
	HeaderLoopAfter = "X-Sim-Loop-After"
	// HeaderLoopPeriod: the tokens of the block the loop repeats, 1 to N (a 1-token loop
	// repeats one word; 64 a paragraph). Needs HeaderLoopAfter.
	HeaderLoopPeriod = "X-Sim-Loop-Period"
)

// defaultLoopPeriod is the block a loop repeats when HeaderLoopPeriod is absent.
const defaultLoopPeriod = 16

const maxKnobDuration = time.Hour

type knobs struct {
	dieAfter   int // -1: off
	stallFirst time.Duration
	stallAfter int // -1: off
	stallFor   time.Duration
	status     int
	errorAfter int // -1: off
	errorEvent bool
	loopAfter  int // -1: off
	loopPeriod int
}

func knobErr(header, msg string) *apiError {
	return badRequest("invalid_header", header, header+": "+msg)
}

func parseKnobs(h http.Header) (knobs, *apiError) {
	k := knobs{dieAfter: -1, stallAfter: -1, errorAfter: -1, loopAfter: -1}
	get := func(name string) (string, bool) {
		v := h[name] // names are canonical: no allocation
		if len(v) == 0 {
			return "", false
		}
		return v[0], true
	}
	count := func(name string, dst *int) *apiError {
		if v, ok := get(name); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return knobErr(name, fmt.Sprintf("want a count >= 0, got %q", v))
			}
			*dst = n
		}
		return nil
	}
	dur := func(name string, dst *time.Duration) *apiError {
		if v, ok := get(name); ok {
			d, err := parseKnobDuration(v)
			if err != nil {
				return knobErr(name, err.Error())
			}
			*dst = d
		}
		return nil
	}
	if e := count(HeaderDieAfter, &k.dieAfter); e != nil {
		return k, e
	}
	if e := count(HeaderStallAfter, &k.stallAfter); e != nil {
		return k, e
	}
	if e := count(HeaderErrorAfter, &k.errorAfter); e != nil {
		return k, e
	}
	if v, ok := get(HeaderErrorEvent); ok {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return k, knobErr(HeaderErrorEvent, fmt.Sprintf("want 1 or 0 (true or false), got %q", v))
		}
		if on && k.errorAfter < 0 {
			return k, knobErr(HeaderErrorEvent, "needs "+HeaderErrorAfter)
		}
		k.errorEvent = on
	}
	if e := count(HeaderLoopAfter, &k.loopAfter); e != nil {
		return k, e
	}
	if k.loopAfter == 0 {
		return k, knobErr(HeaderLoopAfter, "want a count >= 1 (a loop repeats tokens already written), got 0")
	}
	if k.loopAfter > 0 {
		k.loopPeriod = min(defaultLoopPeriod, k.loopAfter)
	}
	if v, ok := get(HeaderLoopPeriod); ok {
		n, err := strconv.Atoi(v)
		switch {
		case k.loopAfter < 0:
			return k, knobErr(HeaderLoopPeriod, "needs "+HeaderLoopAfter)
		case err != nil || n < 1 || n > k.loopAfter:
			return k, knobErr(HeaderLoopPeriod, fmt.Sprintf("want a count within [1, %d] (%s), got %q", k.loopAfter, HeaderLoopAfter, v))
		}
		k.loopPeriod = n
	}
	if e := dur(HeaderStallFirst, &k.stallFirst); e != nil {
		return k, e
	}
	if e := dur(HeaderStallFor, &k.stallFor); e != nil {
		return k, e
	}
	if k.stallAfter >= 0 {
		if _, ok := get(HeaderStallFor); !ok {
			return k, knobErr(HeaderStallAfter, "needs "+HeaderStallFor)
		}
	}
	if v, ok := get(HeaderStatus); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 400 || n > 599 {
			return k, knobErr(HeaderStatus, fmt.Sprintf("want an HTTP status within [400, 599], got %q", v))
		}
		k.status = n
	}
	return k, nil
}

func parseKnobDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil {
			return 0, fmt.Errorf("want a duration such as 150ms or 2s, got %q", v)
		}
		if f < 0 || f > maxKnobDuration.Seconds() {
			return 0, fmt.Errorf("want a duration within [0, %v], got %q", maxKnobDuration, v)
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 0 || d > maxKnobDuration {
		return 0, fmt.Errorf("want a duration within [0, %v], got %q", maxKnobDuration, v)
	}
	return d, nil
}

// sleepCtx waits for d, or less if ctx is done or stop is closed; it reports whether the
// whole duration passed.
func sleepCtx(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}
