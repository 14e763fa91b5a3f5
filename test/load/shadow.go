package load

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// FormatShadow is the JSON lines that `sluice shadow export` writes: one mirrored pair per
// line, {"route","ts","endpoint","request":<the redacted request body>,"primary":{…},
// "candidate":{…},…} (see shadow.ExportJSONL). Replaying it sends each line's request body
// as recorded — messages, tools, response_format, sampling parameters and "stream" — so a
// sandbox can be fed captured traffic offline. Timing: the recorded ts gaps (multiplied by
// TimeScale), or Rate / Concurrency when given. With Config.Model the body's model is
// replaced. Only chat and text completions are replayed; other lines (embeddings, a null
// request) are skipped and counted in the workload's name.
const FormatShadow = "sluice-shadow-jsonl"

// shadowLine is what a replay reads of an exported pair.
type shadowLine struct {
	TS       *time.Time      `json:"ts"`
	Endpoint string          `json:"endpoint"`
	Request  json.RawMessage `json:"request"`
}

// shadowBody is what a replay reads of a request body.
type shadowBody struct {
	Stream              bool            `json:"stream"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
}

// looksLikeShadow reports whether the first JSON object in peek (the start of a JSON-lines
// file, possibly cut short) is an exported pair: its first key is "route", or it has a
// "request" key.
func looksLikeShadow(peek []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(peek))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return false
	}
	for i := 0; dec.More(); i++ {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		k, _ := t.(string)
		if (i == 0 && k == "route") || k == "request" {
			return true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false // cut short before a telling key
		}
	}
	return false
}

// replayEndpoint maps a recorded path (or, without one, the body's shape) to the endpoint
// Config.Endpoint names: "chat", "completions", or "" for what a replay does not send.
func replayEndpoint(path string, b shadowBody) string {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return "chat"
	case strings.HasSuffix(path, "/completions"):
		return "completions"
	case path != "":
		return ""
	case len(b.Messages) > 0 && string(b.Messages) != "null":
		return "chat"
	case len(b.Prompt) > 0 && string(b.Prompt) != "null":
		return "completions"
	}
	return ""
}

// promptTokens estimates a body's prompt size from its message contents or prompt.
func promptTokens(b shadowBody) int {
	n := 0
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(b.Messages, &msgs) == nil {
		for _, m := range msgs {
			n += contentTokens(m.Content)
		}
	}
	return n + contentTokens(b.Prompt)
}

func contentTokens(raw json.RawMessage) int {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return estimateTokens(s)
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		n := 0
		for _, p := range parts {
			n += estimateTokens(p.Text)
		}
		return n
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		n := 0
		for _, p := range ss {
			n += estimateTokens(p)
		}
		return n
	}
	return 0
}

// parseShadow reads exported pairs. Lines are ordered by ts (stably: an export of several
// routes need not be sorted); the first line's ts is time zero.
func parseShadow(r io.Reader) (*Workload, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
	w := &Workload{Name: FormatShadow}
	var times []time.Time
	allTimed, skipped := true, 0
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var l shadowLine
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		var body shadowBody
		if len(l.Request) == 0 || string(l.Request) == "null" || json.Unmarshal(l.Request, &body) != nil {
			skipped++
			continue
		}
		ep := replayEndpoint(l.Endpoint, body)
		if ep == "" {
			skipped++
			continue
		}
		it := Item{Body: append([]byte(nil), l.Request...), Stream: body.Stream, Endpoint: ep,
			InputTokens: max(promptTokens(body), 1)}
		switch {
		case body.MaxCompletionTokens != nil:
			it.OutputTokens = *body.MaxCompletionTokens
		case body.MaxTokens != nil:
			it.OutputTokens = *body.MaxTokens
		}
		it.OutputTokens = max(it.OutputTokens, 0)
		if l.TS == nil || l.TS.IsZero() {
			allTimed = false
			times = append(times, time.Time{})
		} else {
			times = append(times, *l.TS)
		}
		w.Items = append(w.Items, it)
		if len(w.Items) > MaxTraceItems {
			return nil, fmt.Errorf("more than %d requests", MaxTraceItems)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(w.Items) == 0 {
		return nil, fmt.Errorf("shadow jsonl: no replayable request (%d lines skipped: null requests or endpoints other than chat and text completions)", skipped)
	}
	if skipped > 0 {
		w.Name = fmt.Sprintf("%s, %d lines skipped", FormatShadow, skipped)
	}
	if allTimed {
		idx := make([]int, len(times))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return times[idx[a]].Before(times[idx[b]]) })
		items := make([]Item, len(idx))
		t0 := times[idx[0]]
		for k, i := range idx {
			items[k] = w.Items[i]
			at := times[i].Sub(t0)
			if at < 0 || at > 365*24*time.Hour {
				return nil, errors.New("shadow jsonl: timestamps span more than a year")
			}
			items[k].At, items[k].HasAt = at, true
		}
		w.Items = items
	}
	return w, nil
}

// buildRecorded turns a recorded item into a call: its body as recorded (the model
// replaced when Config.Model is set), to its own endpoint, streaming as recorded.
func (e *engine) buildRecorded(i int, it Item) *call {
	c := &call{index: i, maxTokens: max(it.OutputTokens, 1), input: it.InputTokens, body: it.Body,
		recorded: true, stream: it.Stream}
	if e.cfg.Model != "" {
		c.body = withModel(it.Body, e.cfg.Model)
	}
	if it.Endpoint != "" && it.Endpoint != e.cfg.Endpoint {
		c.url = endpointURL(e.cfg.Target, it.Endpoint)
	}
	if e.cfg.Abort > 0 && it.Stream && c.maxTokens > 1 {
		// The same draw as build's, so that a replay's chaos is reproducible.
		rng := rand.New(rand.NewPCG(e.cfg.Seed^0xc0ffee, uint64(i)))
		if rng.Float64() < e.cfg.Abort {
			c.abortAt = 1 + rng.IntN(c.maxTokens-1)
		}
	}
	return c
}

// withModel returns body with its "model" set to model (body itself if it is not an
// object).
func withModel(body []byte, model string) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil || m == nil {
		return body
	}
	mb, err := json.Marshal(model)
	if err != nil {
		return body
	}
	m["model"] = mb
	out, err := json.Marshal(m)
	if err != nil {
		return body
	}
	return out
}
