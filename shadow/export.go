package shadow

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
)

// MaxRedactedBytes bounds a redacted request body. A larger body has its longest strings
// cut (each marked with a "…[cut N bytes]" suffix) until it fits, so it stays valid JSON.
const MaxRedactedBytes = 256 << 10

// keptRequestFields are the top-level request fields Redact keeps: what the model sees and
// the sampling parameters, so a replay asks the same question the same way. Anything else
// (user, metadata, safety_identifier, prompt_cache_key, unknown vendor fields) is dropped.
var keptRequestFields = map[string]bool{
	// what is asked
	"model": true, "messages": true, "prompt": true, "suffix": true, "input": true,
	"tools": true, "tool_choice": true, "parallel_tool_calls": true, "functions": true, "function_call": true,
	"response_format": true, "modalities": true, "reasoning_effort": true, "instructions": true,
	// how it is answered
	"stream": true, "stream_options": true, "max_tokens": true, "max_completion_tokens": true, "min_tokens": true,
	"temperature": true, "top_p": true, "top_k": true, "min_p": true, "n": true, "best_of": true, "stop": true,
	"stop_token_ids": true, "presence_penalty": true, "frequency_penalty": true, "repetition_penalty": true,
	"logit_bias": true, "logprobs": true, "top_logprobs": true, "echo": true, "seed": true, "ignore_eos": true,
	"skip_special_tokens": true, "include_stop_str_in_output": true, "dimensions": true, "encoding_format": true,
	// the Responses API (previous_response_id is dropped: no replay target holds it)
	"text": true, "max_output_tokens": true, "reasoning": true, "truncation": true, "max_tool_calls": true,
	// vLLM structured outputs
	"guided_json": true, "guided_regex": true, "guided_choice": true, "guided_grammar": true, "structured_outputs": true,
}

// credentialKey reports whether a field name looks like it holds a credential; such fields
// are dropped at any depth.
func credentialKey(k string) bool {
	n := strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r == '.' || r == ' ' {
			return -1
		}
		return r
	}, strings.ToLower(k))
	for _, s := range []string{"apikey", "authorization", "password", "passwd", "secret", "cookie", "credential",
		"credentials", "privatekey", "bearer"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	// "token" and "*token" (access_token, id_token) but not "max_tokens" or "stop_token_ids".
	return n == "auth" || strings.HasSuffix(n, "token")
}

// secretPattern matches credentials pasted into text: OpenAI-style and other "sk-" keys,
// bearer tokens, AWS access key ids, GitHub and Slack tokens, JWTs.
var secretPattern = regexp.MustCompile(`\b(?:sk-[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}|xox[abposr]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})|(?i:bearer\s+)[A-Za-z0-9._~+/=-]{16,}`)

// maskSecrets replaces credentials found in s by "[redacted]".
func maskSecrets(s string) string {
	return secretPattern.ReplaceAllString(s, "[redacted]")
}

// Redact returns the request body with what identifies people or grants access removed,
// bounded to MaxRedactedBytes, or nil when body is not a JSON object:
//   - top-level fields other than the prompt, the tools, the response format, the model
//     and the sampling parameters are dropped (user, metadata, safety_identifier,
//     prompt_cache_key and unknown fields among them);
//   - fields named like credentials (api_key, authorization, password, secret, token,
//     access_token, cookie, …) are dropped at any depth;
//   - a message's "name" (a participant's name) is dropped, except on tool and function
//     messages where it names the function;
//   - credentials pasted into strings (sk-… keys, bearer tokens, AWS key ids, GitHub and
//     Slack tokens, JWTs) are replaced by "[redacted]".
//
// Keys of the result are sorted (JSON objects are re-encoded).
func Redact(body []byte) []byte {
	var top map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&top); err != nil || top == nil {
		return nil
	}
	for k := range top {
		if !keptRequestFields[k] || credentialKey(k) {
			delete(top, k)
		}
	}
	if msgs, ok := top["messages"].([]any); ok {
		for _, m := range msgs {
			if o, ok := m.(map[string]any); ok {
				if role, _ := o["role"].(string); role != "tool" && role != "function" {
					delete(o, "name")
				}
			}
		}
	}
	for k, x := range top {
		// Schemas name properties (a tool may well take a "password" argument): their keys
		// are kept, their strings masked.
		top[k] = scrub(x, !schemaFields[k])
	}
	v := any(top)
	out, err := marshalNoEscape(v)
	if err != nil {
		return nil
	}
	if len(out) <= MaxRedactedBytes {
		return out
	}
	return shrink(v, len(out))
}

// schemaFields are the top-level fields that hold JSON Schemas.
var schemaFields = map[string]bool{"tools": true, "functions": true, "response_format": true, "guided_json": true,
	"structured_outputs": true, "text": true}

// scrub masks secrets in strings and, with dropKeys, drops credential-named fields,
// recursively.
func scrub(v any, dropKeys bool) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if dropKeys && credentialKey(k) {
				delete(t, k)
				continue
			}
			t[k] = scrub(x, dropKeys)
		}
	case []any:
		for i, x := range t {
			t[i] = scrub(x, dropKeys)
		}
	case string:
		return maskSecrets(t)
	}
	return v
}

func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// capStrings returns a copy of v with every string longer than c bytes cut to c bytes and
// marked.
func capStrings(v any, c int) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[k] = capStrings(x, c)
		}
		return m
	case []any:
		s := make([]any, len(t))
		for i, x := range t {
			s[i] = capStrings(x, c)
		}
		return s
	case string:
		if len(t) > c {
			return cut(t, c) + fmt.Sprintf("…[cut %d bytes]", len(t)-len(cut(t, c)))
		}
	}
	return v
}

// shrink finds the largest string cap under which v encodes within MaxRedactedBytes; when
// even short strings do not fit (a huge array), it gives a small stub.
func shrink(v any, size int) []byte {
	lo, hi := 64, size // lo: candidate cap known small enough after the first check
	best, err := marshalNoEscape(capStrings(v, lo))
	if err != nil || len(best) > MaxRedactedBytes {
		return []byte(fmt.Sprintf(`{"redacted":"request too large to keep","bytes":%d}`, size))
	}
	for i := 0; i < 24 && hi-lo > 64; i++ {
		mid := lo + (hi-lo)/2
		b, err := marshalNoEscape(capStrings(v, mid))
		if err == nil && len(b) <= MaxRedactedBytes {
			lo, best = mid, b
		} else {
			hi = mid
		}
	}
	return best
}

// ExportToolCall is a tool call of an exported answer.
type ExportToolCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ExportAnswer is one side of an exported pair.
type ExportAnswer struct {
	Status       int              `json:"status"`
	ErrorClass   string           `json:"error_class,omitempty"`
	TTFTms       float64          `json:"ttft_ms"`
	ITLms        float64          `json:"itl_ms"`
	E2Ems        float64          `json:"e2e_ms"`
	OutputTokens int              `json:"output_tokens"`
	FinishReason string           `json:"finish_reason,omitempty"`
	Text         string           `json:"text"`
	ToolCalls    []ExportToolCall `json:"tool_calls,omitempty"`
	Problems     []string         `json:"problems,omitempty"`
}

// ExportLine is one line of ExportJSONL. The field order below is the order on the line;
// "route" comes first, which is how `sluice load --trace` tells the format apart.
type ExportLine struct {
	Route     string    `json:"route"`
	TS        time.Time `json:"ts"`
	RequestID string    `json:"request_id,omitempty"`
	Session   string    `json:"session,omitempty"`
	Endpoint  string    `json:"endpoint,omitempty"`
	// Instance is the gateway that mirrored the pair (in a store a fleet shares).
	Instance string          `json:"instance,omitempty"`
	Request  json.RawMessage `json:"request"`
	Primary  ExportAnswer    `json:"primary"`
	// Baseline is the baseline's answer, when the route has one (the primary's version asked
	// in a sandbox at the same moment as the candidate).
	Baseline          *ExportAnswer `json:"baseline,omitempty"`
	Candidate         ExportAnswer  `json:"candidate"`
	Replica           *ExportAnswer `json:"replica,omitempty"`
	Similarity        *float64      `json:"similarity,omitempty"`
	ReplicaSimilarity *float64      `json:"replica_similarity,omitempty"`
	// NoiseSimilarity is the primary's similarity to the baseline (the pair's noise-floor
	// sample), when both answered whole.
	NoiseSimilarity *float64 `json:"noise_similarity,omitempty"`
	// Loads are the requests in flight per endpoint of each side's cluster when the request
	// was sent to it, when measured.
	Loads *ExportLoads `json:"loads,omitempty"`
	Notes []string     `json:"notes,omitempty"`
}

// ExportLoads are the loads of an exported pair; Baseline is set for a triple.
type ExportLoads struct {
	Primary   float64  `json:"primary"`
	Baseline  *float64 `json:"baseline,omitempty"`
	Candidate float64  `json:"candidate"`
}

func exportAnswer(a Answer, problems []string) ExportAnswer {
	a = boundAnswer(a)
	e := ExportAnswer{Status: a.Status, ErrorClass: a.ErrorClass, TTFTms: durMS(a.TTFT), ITLms: durMS(a.ITL),
		E2Ems: durMS(a.E2E), OutputTokens: a.OutputTokens, FinishReason: a.FinishReason, Text: a.Text,
		Problems: boundList(problems)}
	for _, c := range a.ToolCalls {
		e.ToolCalls = append(e.ToolCalls, ExportToolCall(c))
	}
	if len(e.Problems) == 0 {
		e.Problems = nil
	}
	return e
}

// NewExportLine converts a stored pair to its export line. The request is redacted again
// (redaction is idempotent), so a record that bypassed NewPairRecord is still safe.
func NewExportLine(p PairRecord) ExportLine {
	l := ExportLine{Route: p.Route, TS: p.Time.UTC(), RequestID: p.RequestID, Session: p.Session,
		Endpoint: p.Endpoint, Instance: p.Instance, Request: Redact(p.Request),
		Primary:   exportAnswer(p.Primary, p.Result.Primary.Problems),
		Candidate: exportAnswer(p.Candidate, p.Result.Candidate.Problems),
		Notes:     boundList(p.Result.Notes)}
	if l.Request == nil {
		l.Request = json.RawMessage("null")
	}
	if p.Baseline != nil {
		var probs []string
		if p.Result.Baseline != nil {
			probs = p.Result.Baseline.Problems
		}
		b := exportAnswer(*p.Baseline, probs)
		l.Baseline = &b
	}
	if p.Replica != nil {
		r := exportAnswer(*p.Replica, nil)
		l.Replica = &r
	}
	if p.Result.NoiseValid {
		s := finiteOr(p.Result.NoiseSimilarity)
		l.NoiseSimilarity = &s
	}
	if ld := p.Result.Loads; loadsValid(ld) {
		l.Loads = &ExportLoads{Primary: ld.Primary, Candidate: ld.Candidate}
		if p.Baseline != nil || p.Result.Baseline != nil {
			b := ld.Baseline
			l.Loads.Baseline = &b
		}
	}
	if p.Result.SimilarityValid {
		s := finiteOr(p.Result.Similarity)
		l.Similarity = &s
	}
	if p.ReplicaValid {
		s := finiteOr(p.ReplicaSimilarity)
		l.ReplicaSimilarity = &s
	}
	if len(l.Notes) == 0 {
		l.Notes = nil
	}
	return l
}

// ExportJSONL writes pairs as JSON lines, in the order given (Store.Pairs returns newest
// first; reverse it to replay in time order, `sluice load` sorts by ts anyway). Each line is
// an ExportLine:
//
//	{"route":"chat","ts":"2025-01-02T03:04:05.123Z","request_id":"…","session":"<hash>",
//	 "endpoint":"/v1/chat/completions",
//	 "request":{…the redacted request body, as sent, "stream" included…},
//	 "primary":{"status":200,"error_class":"","ttft_ms":41.2,"itl_ms":8.1,"e2e_ms":512,
//	            "output_tokens":57,"finish_reason":"stop","text":"…","tool_calls":[{"name":…,"arguments":…}],
//	            "problems":["…"]},
//	 "baseline":{…the same, when the route has a baseline…},
//	 "candidate":{…the same…},
//	 "replica":{…the same, when the request was also replayed on the primary…},
//	 "similarity":0.83,"replica_similarity":0.91,"noise_similarity":0.88,
//	 "loads":{"primary":3,"baseline":2,"candidate":2.5},"notes":["…"]}
//
// Empty and zero fields other than the latencies, status, tokens and text are omitted;
// "request" is null when no body was kept. Answers' texts are bounded by MaxStoredText.
// Unknown fields are to be ignored by readers, so the format may grow.
func ExportJSONL(ctx context.Context, w io.Writer, pairs []PairRecord) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for i, p := range pairs {
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("shadow: export: %w", err)
			}
		}
		if err := enc.Encode(NewExportLine(p)); err != nil {
			return fmt.Errorf("shadow: export pair %d of %q: %w", p.ID, p.Route, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("shadow: export: %w", err)
	}
	return nil
}

// SortOldestFirst sorts pairs by time, oldest first (ties by id), for export in replay
// order.
func SortOldestFirst(pairs []PairRecord) {
	sort.SliceStable(pairs, func(i, j int) bool {
		if !pairs[i].Time.Equal(pairs[j].Time) {
			return pairs[i].Time.Before(pairs[j].Time)
		}
		return pairs[i].ID < pairs[j].ID
	})
}
