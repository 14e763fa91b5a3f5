package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// Message is a chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// call is one request ready to send.
type call struct {
	index     int
	messages  []Message // chat
	prompt    string    // completions
	input     int
	maxTokens int
	session   string
	turn      int
	abortAt   int // abort after this many tokens (0: never)
	markers   []string
	keepText  bool
	body      []byte // the encoded request (nil: do encodes it)
	recorded  bool   // body is a recorded request: stream as recorded, not as configured
	stream    bool
	url       string // the endpoint when not the run's own
}

type chatBody struct {
	Model         string         `json:"model,omitempty"`
	Messages      []Message      `json:"messages,omitempty"`
	Prompt        *string        `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	IgnoreEOS     bool           `json:"ignore_eos"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options,omitempty"`
}

// toolCallDelta is a tool call (or a streamed fragment of one): its name and arguments
// are generated output like content.
type toolCallDelta struct {
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chunk struct {
	Choices []struct {
		Delta *struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			ToolCalls        []toolCallDelta `json:"tool_calls"`
		} `json:"delta"`
		Message *struct {
			Content   string          `json:"content"`
			ToolCalls []toolCallDelta `json:"tool_calls"`
		} `json:"message"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func (c *chunk) text() string {
	var sb strings.Builder
	for _, ch := range c.Choices {
		if ch.Delta != nil {
			sb.WriteString(ch.Delta.ReasoningContent)
			sb.WriteString(ch.Delta.Content)
			writeToolCalls(&sb, ch.Delta.ToolCalls)
		}
		if ch.Message != nil {
			sb.WriteString(ch.Message.Content)
			writeToolCalls(&sb, ch.Message.ToolCalls)
		}
		sb.WriteString(ch.Text)
	}
	return sb.String()
}

func writeToolCalls(sb *strings.Builder, calls []toolCallDelta) {
	for _, tc := range calls {
		sb.WriteString(tc.Function.Name)
		sb.WriteString(tc.Function.Arguments)
	}
}

func (c *chunk) finished() bool {
	for _, ch := range c.Choices {
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			return true
		}
	}
	return false
}

// encode returns c's request body.
func (e *engine) encode(c *call) []byte {
	body := chatBody{Model: e.cfg.Model, MaxTokens: c.maxTokens, IgnoreEOS: !e.cfg.NoIgnoreEOS, Stream: !e.cfg.NoStream}
	if e.cfg.Endpoint == "completions" {
		p := c.prompt
		body.Prompt = &p
	} else {
		body.Messages = c.messages
	}
	if body.Stream {
		body.StreamOptions = map[string]any{"include_usage": true}
		if e.cfg.ContinuousUsage {
			body.StreamOptions["continuous_usage_stats"] = true
		}
	}
	b, err := json.Marshal(body) // cannot fail: strings, ints and bools
	if err != nil {
		panic(err)
	}
	return b
}

// do sends one request and measures it. scheduled is when the pacer wanted it sent.
func (e *engine) do(ctx context.Context, c *call, scheduled time.Time) *Result {
	res := &Result{Index: c.index, Session: c.session, Turn: c.turn, Scheduled: scheduled, Input: c.input}
	res.Timeline = Timeline{FirstEvent: -1, TTFT: -1, TPOT: -1}
	stream := !e.cfg.NoStream
	if c.recorded {
		stream = c.stream
	}
	u := e.url
	if c.url != "" {
		u = c.url
	}
	b := c.body
	if b == nil {
		b = e.encode(c)
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		res.Class, res.Err = ErrConnect, err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if e.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+e.cfg.APIKey)
	}
	if c.session != "" {
		req.Header.Set("X-Session-ID", c.session)
		req.Header.Set("X-Turn-Index", strconv.Itoa(c.turn))
	}
	res.Sent = time.Now()
	defer func() { res.Done = time.Now() }()
	resp, err := e.client.Do(req)
	if err != nil {
		res.Class, res.Err = classifyErr(ctx, rctx, err), err.Error()
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Upstream = resp.Header.Get("X-Sluice-Upstream")
	res.Attempts, _ = strconv.Atoi(resp.Header.Get("X-Sluice-Attempts"))
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		res.Err = errMessage(msg)
		switch {
		case resp.StatusCode == 429:
			res.Class = ErrHTTP429
		case resp.StatusCode >= 500:
			res.Class = ErrHTTP5xx
		default:
			res.Class = ErrHTTP4xx
		}
		return res
	}
	a := answer{final: -1}
	if !stream {
		if !e.readBody(ctx, rctx, resp.Body, res, &a) {
			return res
		}
	} else {
		e.readStream(ctx, rctx, cancel, c, resp.Body, res, &a)
	}
	events, text, final, completed := a.events, &a.text, a.final, a.completed
	if !res.Aborted && !completed && res.Class == ErrNone {
		res.Class, res.Err = ErrTruncated, "stream ended without a finish_reason or [DONE]"
	}
	// A stream whose usage arrived only at the end: apportion it across events.
	if e.cfg.ContinuousUsage {
		final = -1
	}
	if res.Aborted {
		final = -1
	}
	res.Timeline = Measure(events, final)
	if res.Class == ErrNone && !res.Aborted && res.Tokens == 0 {
		res.Class, res.Err = ErrEmpty, "answer had no tokens"
	}
	res.Text = text.String()
	for _, m := range c.markers {
		res.Expected++
		if strings.Contains(res.Text, m) {
			res.Found++
		}
	}
	return res
}

// answer is what was read of a 200 answer: its events, its text (kept when the call asks),
// the usage's completion tokens at the end (-1: none) and whether it finished.
type answer struct {
	events    []Event
	text      strings.Builder
	final     int
	completed bool
}

// readBody reads a non-streaming answer into a; false when it failed (res says why) and
// there is nothing to measure.
func (e *engine) readBody(ctx, rctx context.Context, body io.Reader, res *Result, a *answer) bool {
	raw, err := io.ReadAll(io.LimitReader(body, 64<<20))
	at := time.Since(res.Sent)
	if err != nil {
		res.Class, res.Err = classifyErr(ctx, rctx, err), err.Error()
		return false
	}
	var ch chunk
	if err := json.Unmarshal(raw, &ch); err != nil {
		res.Class, res.Err = ErrStream, "bad JSON answer: "+err.Error()
		return false
	}
	t := ch.text()
	if ch.Usage != nil {
		a.final = ch.Usage.CompletionTokens
	}
	a.events = append(a.events, Event{At: at, Content: t != "", Tokens: max(e.count(t), 1), Usage: -1})
	a.text.WriteString(t)
	a.completed = true
	return true
}

// readStream reads an SSE answer into a, event by event, aborting it (cancel) where the call
// asks; a failure is recorded in res.
func (e *engine) readStream(ctx, rctx context.Context, cancel context.CancelFunc, c *call, body io.Reader, res *Result, a *answer) {
	// The project's SSE reader (policy/openai): events split on blank lines, several
	// data: lines joined, comments and CR line endings as the spec has them.
	rd := openai.NewReader(body, maxEvent)
	tokens := 0
read:
	for {
		sse, err := rd.Next()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
				// The end, clean or mid-event: judged below (truncated without a finish).
			case errors.Is(err, openai.ErrEventTooLarge):
				res.Class, res.Err = ErrStream, err.Error()
			case res.Class == ErrNone && !res.Aborted:
				res.Class, res.Err = classifyErr(ctx, rctx, err), err.Error()
			}
			break
		}
		if sse.Data == nil {
			continue // a comment, or an event without data
		}
		at := time.Since(res.Sent)
		if sse.IsDone() {
			a.completed = true
			break
		}
		data := sse.Data
		isErrEvent := string(sse.Name) == "error"
		var ch chunk
		if err := json.Unmarshal(data, &ch); err != nil {
			res.Class, res.Err = ErrStream, "bad SSE data: "+err.Error()
			break
		}
		if isErrEvent || len(ch.Error) > 0 {
			res.Class, res.Err = ErrStream, errMessage(data)
			break
		}
		ev := Event{At: at, Usage: -1}
		if ch.Usage != nil {
			a.final = ch.Usage.CompletionTokens
			ev.Usage = a.final
		}
		if t := ch.text(); t != "" {
			ev.Content = true
			ev.Tokens = max(e.count(t), 1)
			if c.keepText {
				a.text.WriteString(t)
			}
			if ev.Usage >= 0 {
				tokens = ev.Usage
			} else {
				tokens += ev.Tokens
			}
		}
		if ch.finished() {
			a.completed = true // [DONE] may still follow with usage
		}
		a.events = append(a.events, ev)
		if c.abortAt > 0 && tokens >= c.abortAt {
			res.Aborted = true
			cancel()
			break read
		}
	}
}

func (e *engine) count(s string) int {
	if n := CountTokens(s); n > 0 {
		return n
	}
	return estimateTokens(s)
}

// maxEvent bounds one SSE event of an answer (16 MiB: a tool call's arguments, or a whole
// answer in one event, fit).
const maxEvent = 16 << 20

func classifyErr(run, req context.Context, err error) string {
	var ne net.Error
	switch {
	case run.Err() != nil:
		return ErrCanceled
	case req.Err() != nil || (errors.As(err, &ne) && ne.Timeout()):
		return ErrTimeout
	}
	return ErrConnect
}

// errMessage pulls error.message out of an OpenAI error body (else the body, shortened).
func errMessage(b []byte) string {
	var v struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &v) == nil && len(v.Error) > 0 {
		var o struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(v.Error, &o) == nil && o.Message != "" {
			return o.Message
		}
		return string(v.Error)
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200]
	}
	return fmt.Sprintf("%q", s)
}
