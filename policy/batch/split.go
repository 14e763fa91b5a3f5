package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/sluicegw/sluice/policy/openai"
)

// parsed is one caller's request as the batcher needs it: its other fields, its inputs as a
// list, and the key of the batches it may join.
type parsed struct {
	fields  map[string]json.RawMessage
	list    string            // "input" (embeddings) or "prompt" (completions)
	items   []json.RawMessage // inputs (prompts), normalised to a list, in order
	key     string
	tokens  int // estimated prompt tokens
	choices int // answers per input: 1 for embeddings, n for completions
}

// parse reads the body of an embeddings (or completions) request. The key is the tenant, the
// kind, the input form (text or token IDs: one request cannot mix them) and every other field
// of the body, compacted and in key order, so only requests that would get the same treatment
// are merged (model, encoding_format, dimensions, user, sampling parameters, ...).
func parse(r *openai.Request, tenant string) (*parsed, error) {
	p := &parsed{list: "input", choices: 1}
	if r.Kind == openai.KindCompletion {
		p.list, p.choices = "prompt", max(r.N, 1)
	}
	if err := json.Unmarshal(r.Body, &p.fields); err != nil {
		return nil, err
	}
	raw := bytes.TrimSpace(p.fields[p.list])
	delete(p.fields, p.list)
	var form byte
	switch {
	case len(raw) == 0:
		return nil, errors.New("no " + p.list)
	case raw[0] == '"':
		form, p.items = 't', []json.RawMessage{raw}
	case raw[0] == '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil || len(elems) == 0 {
			return nil, errors.New("bad " + p.list)
		}
		switch c := bytes.TrimSpace(elems[0]); {
		case len(c) > 0 && c[0] == '"':
			form, p.items = 't', elems
		case len(c) > 0 && c[0] == '[':
			form, p.items = 'i', elems
		default: // one list of token IDs is one input
			form, p.items = 'i', []json.RawMessage{raw}
		}
	default:
		return nil, errors.New("bad " + p.list)
	}
	names := make([]string, 0, len(p.fields))
	for k := range p.fields {
		names = append(names, k)
	}
	sort.Strings(names)
	var key bytes.Buffer
	key.WriteString(tenant)
	key.WriteByte(0)
	key.WriteString(r.Kind.String())
	key.WriteByte(form)
	for _, k := range names {
		key.WriteByte(0)
		key.WriteString(strconv.Quote(k))
		key.WriteByte(':')
		if err := json.Compact(&key, p.fields[k]); err != nil {
			return nil, err
		}
	}
	p.key = key.String()
	p.tokens = max(r.PromptTokens, 0)
	return p, nil
}

// mergeBody is the upstream body of a batch: the first caller's fields (the others' are the
// same, by the key) with the callers' inputs concatenated in order.
func mergeBody(cs []*caller) ([]byte, error) {
	first := cs[0].p
	n := 0
	for _, c := range cs {
		n += len(c.p.items)
	}
	list := make([]json.RawMessage, 0, n)
	for _, c := range cs {
		list = append(list, c.p.items...)
	}
	rawList, err := json.Marshal(list)
	if err != nil {
		return nil, err
	}
	out := make(map[string]json.RawMessage, len(first.fields)+1)
	for k, v := range first.fields {
		out[k] = v
	}
	out[first.list] = rawList
	return json.Marshal(out)
}

// split cuts a batch's 2xx answer into one body per caller: each gets its own items (data for
// embeddings, choices for completions) re-indexed from 0, the other top-level fields as they
// are (model, object, id, ...), and its share of usage: prompt_tokens in proportion to its
// estimated prompt tokens, completion_tokens in proportion to the estimated tokens of its
// choices' text, each summing exactly to the batch's total.
func split(cs []*caller, body []byte) ([][]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("batch answer: %w", err)
	}
	listKey := "data"
	if cs[0].p.list == "prompt" {
		listKey = "choices"
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(top[listKey], &raw); err != nil {
		return nil, fmt.Errorf("batch answer: %s: %w", listKey, err)
	}
	total := 0
	for _, c := range cs {
		total += len(c.p.items) * c.p.choices
	}
	if len(raw) != total {
		return nil, fmt.Errorf("batch answer: %d %s for %d expected", len(raw), listKey, total)
	}
	items := make([]map[string]json.RawMessage, total)
	for _, r := range raw {
		var it map[string]json.RawMessage
		if err := json.Unmarshal(r, &it); err != nil {
			return nil, fmt.Errorf("batch answer: %s item: %w", listKey, err)
		}
		i, err := strconv.Atoi(string(it["index"]))
		if err != nil || i < 0 || i >= total || items[i] != nil {
			return nil, fmt.Errorf("batch answer: bad or repeated index %s", it["index"])
		}
		items[i] = it
	}

	// Usage.
	var usage struct {
		Prompt     *int `json:"prompt_tokens"`
		Completion *int `json:"completion_tokens"`
	}
	hasUsage := len(top["usage"]) > 0 && string(top["usage"]) != "null"
	if hasUsage {
		if err := json.Unmarshal(top["usage"], &usage); err != nil {
			return nil, fmt.Errorf("batch answer: usage: %w", err)
		}
	}
	pw := make([]int, len(cs))
	cw := make([]int, len(cs))
	lo := 0
	for k, c := range cs {
		pw[k] = max(c.p.tokens, 1)
		for _, it := range items[lo : lo+len(c.p.items)*c.p.choices] {
			var s string
			if json.Unmarshal(it["text"], &s) == nil {
				cw[k] += openai.EstimateTextTokens([]byte(s))
			}
		}
		lo += len(c.p.items) * c.p.choices
	}
	var prompt, completion []int
	if usage.Prompt != nil {
		prompt = apportion(*usage.Prompt, pw)
	}
	if usage.Completion != nil {
		completion = apportion(*usage.Completion, cw)
	}

	out := make([][]byte, len(cs))
	lo = 0
	for k, c := range cs {
		n := len(c.p.items) * c.p.choices
		mine := make([]json.RawMessage, n)
		for i := range n {
			it := items[lo+i]
			it["index"] = strconv.AppendInt(nil, int64(i), 10)
			b, err := json.Marshal(it)
			if err != nil {
				return nil, err
			}
			mine[i] = b
		}
		lo += n
		t := make(map[string]json.RawMessage, len(top))
		for key, v := range top {
			t[key] = v
		}
		lb, err := json.Marshal(mine)
		if err != nil {
			return nil, err
		}
		t[listKey] = lb
		if hasUsage {
			u := map[string]int{}
			sum := 0
			if prompt != nil {
				u["prompt_tokens"] = prompt[k]
				sum += prompt[k]
			}
			if completion != nil {
				u["completion_tokens"] = completion[k]
				sum += completion[k]
			}
			u["total_tokens"] = sum
			if t["usage"], err = json.Marshal(u); err != nil {
				return nil, err
			}
		}
		if out[k], err = json.Marshal(t); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// apportion splits total in proportion to weights (largest remainder, ties to the earlier),
// so the parts sum exactly to total. All-zero weights split evenly.
func apportion(total int, weights []int) []int {
	out := make([]int, len(weights))
	total = max(total, 0)
	if len(weights) == 0 {
		return out
	}
	var sum int64
	for _, w := range weights {
		sum += int64(max(w, 0))
	}
	w := func(i int) int64 {
		if sum == 0 {
			return 1
		}
		return int64(max(weights[i], 0))
	}
	if sum == 0 {
		sum = int64(len(weights))
	}
	rem := make([]int64, len(weights))
	given := 0
	for i := range weights {
		// total × w / sum without overflow for any realistic token count.
		q := float64(total) * float64(w(i)) / float64(sum)
		out[i] = int(q)
		rem[i] = int64((q - float64(out[i])) * 1e9)
		given += out[i]
	}
	order := make([]int, len(weights))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return rem[order[a]] > rem[order[b]] })
	for i := 0; given < total; i = (i + 1) % len(order) {
		out[order[i]]++
		given++
	}
	for i := len(order) - 1; given > total; i = (i + len(order) - 1) % len(order) {
		if out[order[i]] > 0 {
			out[order[i]]--
			given--
		}
	}
	return out
}
