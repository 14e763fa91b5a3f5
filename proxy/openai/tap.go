package openai

import "time"

// Usage is the token usage a model server reports.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	TotalTokens      int
}

// Tap watches an answer on its way to the client and counts tokens and timing, without
// copying it: Observe each SSE event (or ObserveBody once for a non-streaming answer). The
// zero Tap is ready; set Start when the upstream request is sent.
//
// A token event is an event whose choices carry non-empty content, text, reasoning, a
// refusal or a tool-call delta (or, in a non-streaming embeddings answer, data).
// Definitions follow vLLM's `bench serve`: TTFT is Start to the first token event; the
// inter-token gaps are between successive token events; TPOT is
// (LastToken-FirstToken)/(Tokens-1).
type Tap struct {
	Start        time.Time     // set by the caller when the upstream request was sent
	FirstToken   time.Time     // first token event
	LastToken    time.Time     // last token event
	Events       int           // events with data (including [DONE])
	TokenEvents  int           // token events
	Tokens       int           // output tokens: usage.completion_tokens once seen, else an estimate (see Observe)
	Usage        Usage         // the last usage reported
	HaveUsage    bool          // a usage object was seen
	Done         bool          // [DONE] seen
	FinishReason string        // last non-empty finish_reason
	MaxGap       time.Duration // largest gap between token events
	GapSum       time.Duration // sum of gaps between token events
	Gaps         int           // number of gaps
	ErrorSeen    bool          // an in-band error from upstream: an "error" key, or an event named error

	weight int // token-estimate weight of the output text (see EstimateTextTokens)
}

// Observe takes one event into account at time now. It scans the data once, allocates
// nothing (except copying finish_reason when it changes, once per stream), and ignores
// events without data and data that is not a JSON object.
//
// Until a usage object arrives (stream_options.include_usage), Tokens is an estimate: the
// larger of the number of token events (model servers send about one token an event) and
// the EstimateTextTokens weight of the output text decoded from the JSON strings (which
// catches events carrying several tokens). A usage object sets Tokens to its
// completion_tokens.
func (t *Tap) Observe(ev Event, now time.Time) {
	if ev.Data == nil {
		return
	}
	t.Events++
	if string(ev.Name) == "error" {
		t.ErrorSeen = true
	}
	if ev.IsDone() {
		t.Done = true
		return
	}
	t.observe(ev.Data, now)
}

// ObserveBody takes a complete non-streaming answer into account at time now: usage,
// finish_reason, and the content for the estimate when there is no usage. It counts as one
// event, and as a token event at now if the answer has content.
func (t *Tap) ObserveBody(body []byte, now time.Time) {
	t.Events++
	t.observe(body, now)
}

// TTFT returns the time to the first token, or 0 if there was none (or Start is unset).
func (t *Tap) TTFT() time.Duration {
	if t.Start.IsZero() || t.FirstToken.IsZero() {
		return 0
	}
	return t.FirstToken.Sub(t.Start)
}

// TPOT returns the time per output token after the first: (LastToken-FirstToken)/(Tokens-1),
// or 0 if Tokens < 2.
func (t *Tap) TPOT() time.Duration {
	if t.Tokens < 2 || t.FirstToken.IsZero() || t.LastToken.IsZero() {
		return 0
	}
	return t.LastToken.Sub(t.FirstToken) / time.Duration(t.Tokens-1)
}

// observe walks a chunk or a response body: {"choices":[...],"usage":{...},"error":...}.
func (t *Tap) observe(data []byte, now time.Time) {
	c := cur{b: data}
	if c.peek() != '{' {
		return
	}
	c.i++
	var (
		st     textStats
		output bool // a tool call, or embeddings data
	)
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "choices":
			t.choices(&c, &st, &output)
		case "usage":
			t.usage(&c)
		case "error":
			if c.peek() != 'n' {
				t.ErrorSeen = true
			}
			c.skip(nil)
		case "data":
			if c.peek() == '[' {
				start := c.i
				c.skip(nil)
				if c.ok() && skipSpace(data, start+1) < c.i-1 {
					output = true
				}
				continue
			}
			c.skip(nil)
		default:
			c.skip(nil)
		}
	}
	if st.chars == 0 && !output {
		return
	}
	t.TokenEvents++
	t.weight += st.weight
	if t.FirstToken.IsZero() {
		t.FirstToken = now
	}
	if !t.LastToken.IsZero() {
		gap := max(now.Sub(t.LastToken), 0)
		t.GapSum += gap
		t.Gaps++
		t.MaxGap = max(t.MaxGap, gap)
	}
	t.LastToken = now
	if !t.HaveUsage {
		t.Tokens = max(t.TokenEvents, (t.weight+unitsPT-1)/unitsPT)
	}
}

func (t *Tap) choices(c *cur, st *textStats, output *bool) {
	if c.peek() != '[' {
		c.skip(nil)
		return
	}
	c.i++
	for first := true; c.elem(&first); {
		if c.peek() != '{' {
			c.skip(nil)
			continue
		}
		c.i++
		for f2 := true; ; {
			key, esc, ok := c.member(&f2)
			if !ok {
				break
			}
			var kb [32]byte
			switch string(keyText(key, esc, kb[:])) {
			case "delta", "message":
				t.delta(c, st, output)
			case "text":
				stringStats(c, st)
			case "finish_reason":
				if c.peek() == '"' {
					if raw, esc, ok := c.str(); ok {
						t.setFinish(raw, esc)
					}
					continue
				}
				c.skip(nil)
			default:
				c.skip(nil)
			}
		}
	}
}

// delta reads a chat delta (or message): content, reasoning, refusal, tool calls.
func (t *Tap) delta(c *cur, st *textStats, output *bool) {
	if c.peek() != '{' {
		c.skip(nil)
		return
	}
	c.i++
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "content", "reasoning_content", "reasoning", "refusal":
			stringStats(c, st)
		case "tool_calls":
			if c.peek() != '[' {
				c.skip(nil)
				continue
			}
			c.i++
			for f2 := true; c.elem(&f2); {
				*output = true
				functionStats(c, st, true)
			}
		case "function_call":
			if c.peek() == '{' {
				*output = true
			}
			functionStats(c, st, false)
		default:
			c.skip(nil)
		}
	}
}

// functionStats counts the name and arguments of a tool call ({"function":{...}}, when
// wrapped) or of a function call ({"name":...,"arguments":...}).
func functionStats(c *cur, st *textStats, wrapped bool) {
	if c.peek() != '{' {
		c.skip(nil)
		return
	}
	c.i++
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			return
		}
		switch {
		case wrapped && equalString(key, esc, "function"):
			functionStats(c, st, false)
		case !wrapped && (equalString(key, esc, "name") || equalString(key, esc, "arguments")):
			stringStats(c, st)
		default:
			c.skip(nil)
		}
	}
}

// stringStats counts the string at the cursor, if it is one, and skips any other value.
func stringStats(c *cur, st *textStats) {
	if c.peek() != '"' {
		c.skip(nil)
		return
	}
	c.strStats(st)
}

func (t *Tap) setFinish(raw []byte, esc bool) {
	if len(raw) == 0 {
		return
	}
	var buf [64]byte
	v := raw
	if esc {
		if v = keyText(raw, esc, buf[:]); len(v) == 0 {
			return
		}
	}
	if string(v) != t.FinishReason {
		t.FinishReason = string(v)
	}
}

func (t *Tap) usage(c *cur) {
	if c.peek() != '{' {
		c.skip(nil)
		return
	}
	c.i++
	var u Usage
	for first := true; ; {
		key, esc, ok := c.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		var dst *int
		switch string(keyText(key, esc, kb[:])) {
		case "prompt_tokens":
			dst = &u.PromptTokens
		case "completion_tokens":
			dst = &u.CompletionTokens
		case "total_tokens":
			dst = &u.TotalTokens
		default:
			c.skip(nil)
			continue
		}
		if ch := c.peek(); ch == '-' || (ch >= '0' && ch <= '9') {
			if s, ok := c.number(); ok {
				if v, ok := parseInt(s); ok && v >= 0 && v <= 1<<40 {
					*dst = int(v)
				}
			}
			continue
		}
		c.skip(nil)
	}
	if !c.ok() {
		return
	}
	t.Usage, t.HaveUsage = u, true
	t.Tokens = u.CompletionTokens
}
