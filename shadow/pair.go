package shadow

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Response formats of Request.ResponseFormat.
const (
	FormatText       = "text"
	FormatJSONObject = "json_object"
	FormatJSONSchema = "json_schema"
)

// Tool is a function the request declared, with its JSON Schema parameters
// (empty: any arguments that parse as JSON are accepted).
type Tool struct {
	Name       string
	Parameters json.RawMessage
}

// Request holds the parts of a mirrored request that the comparison needs.
// Schema is the JSON Schema of a json_schema response format; the OpenAI
// wrapper {"name":…,"schema":{…}} is also accepted and unwrapped.
type Request struct {
	ResponseFormat string
	Schema         json.RawMessage
	Tools          []Tool
	// ToolChoice is "auto" (or empty), "none", "required", or the name of the one function
	// the request forces.
	ToolChoice string
	// MaxTokensSet: the request set an output bound (max_tokens, max_completion_tokens,
	// max_output_tokens), so finishing by "length" is the end it asked for.
	MaxTokensSet bool
	// AbnormalFinish, when set, lists the finish reasons that count as abnormal (the route's
	// mirror.abnormal_finish; "missing" for an answer without one). Nil: DefaultAbnormal.
	AbnormalFinish []string
}

// FinishMissing names an answer without a finish reason in AbnormalFinish lists.
const FinishMissing = "missing"

// abnormal reports whether an OK answer's finish reason is abnormal for r: one of the
// route's list, or by default content_filter, a missing one, or length when the request set
// no output bound (a model running into the bound it was given has ended normally).
func (r Request) abnormal(a Answer) bool {
	fr := a.FinishReason
	if fr == "" {
		if a.Truncated {
			return false // the capture ended before the answer said how it ended
		}
		fr = FinishMissing
	}
	if r.AbnormalFinish != nil {
		return slices.Contains(r.AbnormalFinish, fr)
	}
	switch fr {
	case "content_filter", FinishMissing:
		return true
	case "length":
		return !r.MaxTokensSet
	}
	return false
}

// forcesCall reports whether the request requires a tool call.
func (r Request) forcesCall() bool {
	switch r.ToolChoice {
	case "", "auto", "none":
		return false
	}
	return true
}

// ToolCall is one function call of an answer; Arguments is the raw string.
type ToolCall struct {
	Name      string
	Arguments string
}

// Answer is one captured answer. ITL is the mean inter-token latency; zero
// latencies count as not measured. An answer is OK when ErrorClass is empty
// and Status is 0 (unset) or 2xx.
type Answer struct {
	Status       int
	ErrorClass   string
	TTFT, ITL    time.Duration
	E2E          time.Duration
	OutputTokens int
	FinishReason string
	Text         string
	ToolCalls    []ToolCall
	// Truncated: the capture of the answer hit its bound, so its text and tool calls are
	// incomplete and are not compared (latencies, status and finish still are).
	Truncated bool
	// Confidence summarises the logprobs of its first choice, when it carried them.
	Confidence Confidence
}

// OK reports whether the answer succeeded.
func (a Answer) OK() bool {
	return a.ErrorClass == "" && (a.Status == 0 || a.Status >= 200 && a.Status < 300)
}

// SideResult holds the checks of one side of a pair. Checks are made only on
// OK answers. Problems says why a check broke.
type SideResult struct {
	OK              bool
	AbnormalFinish  bool
	TTFT, ITL, E2E  time.Duration
	OutputTokens    int
	JSONValid       bool // the text parsed as JSON (meaningful when SchemaChecked)
	SchemaChecked   bool
	SchemaBroken    bool
	ToolCallChecked bool
	ToolCallBroken  bool
	Problems        []string
	// Confidence is the answer's (an OK, whole answer that carried logprobs; else zero).
	Confidence Confidence
}

// PairResult is the comparison of a candidate answer against the primary's.
// Deltas are candidate minus primary. Similarity is RougeL of the answers'
// texts with tool calls appended, and is valid only when both sides are OK
// (SimilarityValid).
type PairResult struct {
	StatusMatch, ErrorClassMatch, FinishMatch bool
	TTFTDelta, ITLDelta, E2EDelta             time.Duration
	TokenDelta                                int
	Similarity                                float64
	SimilarityValid                           bool
	// ToolNamesMatch: the multisets of called function names are equal.
	ToolNamesMatch     bool
	Primary, Candidate SideResult
	// Notes holds problems of the request itself, such as a schema that does
	// not compile (the affected checks are then not made).
	Notes []string

	// Baseline holds the checks of the baseline's answer (the primary's version, asked in
	// its sandbox at the same moment as the candidate): nil without a baseline.
	Baseline *SideResult
	// NoiseSimilarity is RougeL of the baseline's answer against the primary's, this
	// request's noise-floor sample; valid when NoiseValid (both OK and whole).
	NoiseSimilarity float64
	NoiseValid      bool
	// Loads are how loaded each side's cluster was when the request was sent to it.
	Loads Loads
}

// Loads are the requests in flight per endpoint of each side's cluster at the moment the
// request was sent to it (the request itself included). Valid is false when unmeasured.
type Loads struct {
	Primary, Baseline, Candidate float64
	Valid                        bool
}

// CompareTriple compares the candidate's answer against the primary's (similarity,
// schema and tool-call checks) and, when a baseline answered (baseline not nil), checks the
// baseline's answer the same way and measures the primary-against-baseline similarity: the
// noise floor, for nothing extra sent to production.
func (c *SchemaCache) CompareTriple(req Request, primary Answer, baseline *Answer, candidate Answer) PairResult {
	r := c.Compare(req, primary, candidate)
	if baseline == nil {
		return r
	}
	b := c.side(req, *baseline, func(string) {})
	r.Baseline = &b
	if primary.OK() && baseline.OK() && !primary.Truncated && !baseline.Truncated {
		r.NoiseSimilarity, r.NoiseValid = RougeL(render(*baseline), render(primary)), true
	}
	return r
}

// Compare compares candidate against primary for req, using the package's
// shared schema cache.
func Compare(req Request, primary, candidate Answer) PairResult {
	return defaultCache.Compare(req, primary, candidate)
}

// Compare compares candidate against primary for req, compiling schemas
// through c.
func (c *SchemaCache) Compare(req Request, primary, candidate Answer) PairResult {
	r := PairResult{
		StatusMatch:     primary.Status == candidate.Status,
		ErrorClassMatch: primary.ErrorClass == candidate.ErrorClass,
		FinishMatch:     primary.FinishReason == candidate.FinishReason,
		TTFTDelta:       candidate.TTFT - primary.TTFT,
		ITLDelta:        candidate.ITL - primary.ITL,
		E2EDelta:        candidate.E2E - primary.E2E,
		TokenDelta:      candidate.OutputTokens - primary.OutputTokens,
		ToolNamesMatch:  sameNames(primary.ToolCalls, candidate.ToolCalls),
	}
	if primary.OK() && candidate.OK() && !primary.Truncated && !candidate.Truncated {
		r.Similarity, r.SimilarityValid = RougeL(render(candidate), render(primary)), true
	}
	var notes []string
	note := func(s string) {
		for _, n := range notes {
			if n == s {
				return
			}
		}
		notes = append(notes, s)
	}
	r.Primary = c.side(req, primary, note)
	r.Candidate = c.side(req, candidate, note)
	r.Notes = notes
	return r
}

// side checks one answer on its own, the same way for both sides, so that the two arms'
// breakage rates are comparable. Which functions were called is not a breakage (a model may
// choose differently run to run): that difference shows in ToolNamesMatch and in the text
// similarity, judged against the noise floor. A truncated answer is not checked.
func (c *SchemaCache) side(req Request, a Answer, note func(string)) SideResult {
	s := SideResult{OK: a.OK(), TTFT: a.TTFT, ITL: a.ITL, E2E: a.E2E, OutputTokens: a.OutputTokens}
	if !s.OK {
		return s
	}
	s.AbnormalFinish = req.abnormal(a)
	if a.Truncated {
		return s
	}
	if a.Confidence.Valid() {
		s.Confidence = a.Confidence
	}
	broke := func(b *bool, format string, args ...any) {
		*b = true
		s.Problems = append(s.Problems, fmt.Sprintf(format, args...))
	}
	// Response format: checked when JSON was asked for and the answer is text.
	if (req.ResponseFormat == FormatJSONObject || req.ResponseFormat == FormatJSONSchema) && len(a.ToolCalls) == 0 {
		var sch *jsonschema.Schema
		ok := true
		if req.ResponseFormat == FormatJSONSchema {
			var err error
			if sch, err = c.Get(unwrapSchema(req.Schema)); err != nil {
				note("response schema: " + err.Error())
				ok = false
			}
		}
		if ok {
			s.SchemaChecked = true
			v, err := decode(a.Text)
			switch {
			case err != nil:
				broke(&s.SchemaBroken, "text is not JSON: %v", err)
			case req.ResponseFormat == FormatJSONObject:
				s.JSONValid = true
				if _, isObj := v.(map[string]any); !isObj {
					broke(&s.SchemaBroken, "text is JSON but not an object")
				}
			default:
				s.JSONValid = true
				if err := sch.Validate(v); err != nil {
					broke(&s.SchemaBroken, "text does not conform to the schema: %v", oneLine(err))
				}
			}
		}
	}
	// Tool calls: checked whenever tools were declared (and not turned off). Broken: calls
	// announced by finish_reason but missing, a required call not made, a call of an
	// undeclared function, arguments that do not parse or do not validate.
	if len(req.Tools) > 0 && req.ToolChoice != "none" {
		s.ToolCallChecked = true
		switch {
		case len(a.ToolCalls) == 0 && (a.FinishReason == "tool_calls" || a.FinishReason == "function_call"):
			broke(&s.ToolCallBroken, "finish_reason %q but no tool call in the answer", a.FinishReason)
		case len(a.ToolCalls) == 0 && req.forcesCall():
			broke(&s.ToolCallBroken, "tool_choice %q requires a call; the answer made none", req.ToolChoice)
		}
		for _, tc := range a.ToolCalls {
			t, found := findTool(req.Tools, tc.Name)
			if !found {
				broke(&s.ToolCallBroken, "call of undeclared function %q", tc.Name)
				continue
			}
			args := tc.Arguments
			if strings.TrimSpace(args) == "" {
				args = "{}"
			}
			v, err := decode(args)
			if err != nil {
				broke(&s.ToolCallBroken, "%s: arguments are not JSON: %v", tc.Name, err)
				continue
			}
			if len(bytes.TrimSpace(t.Parameters)) == 0 {
				continue
			}
			sch, err := c.Get(t.Parameters)
			if err != nil {
				note(fmt.Sprintf("tool %s parameters: %v", tc.Name, err))
				continue
			}
			if err := sch.Validate(v); err != nil {
				broke(&s.ToolCallBroken, "%s: arguments do not validate: %v", tc.Name, oneLine(err))
			}
		}
	}
	return s
}

func findTool(tools []Tool, name string) (Tool, bool) {
	for _, t := range tools {
		if t.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}

func names(calls []ToolCall) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Name
	}
	sort.Strings(out)
	return out
}

func sameNames(a, b []ToolCall) bool {
	x, y := names(a), names(b)
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// render is the text similarity is computed on: the text, then each tool
// call's name and arguments.
func render(a Answer) string {
	if len(a.ToolCalls) == 0 {
		return a.Text
	}
	var b strings.Builder
	b.WriteString(a.Text)
	for _, c := range a.ToolCalls {
		b.WriteString(" ")
		b.WriteString(c.Name)
		b.WriteString(" ")
		b.WriteString(c.Arguments)
	}
	return b.String()
}

func decode(s string) (any, error) {
	return jsonschema.UnmarshalJSON(strings.NewReader(s))
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// unwrapSchema returns the inner schema of an OpenAI json_schema wrapper
// ({"name":…,"schema":{…}}), or raw itself.
func unwrapSchema(raw json.RawMessage) json.RawMessage {
	var w struct {
		Name   *string         `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Type   json.RawMessage `json:"type"`
		Props  json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(raw, &w) == nil && w.Name != nil && len(w.Schema) > 0 && w.Type == nil && w.Props == nil {
		return w.Schema
	}
	return raw
}

// DefaultSchemaCacheSize bounds the package's shared schema cache.
const DefaultSchemaCacheSize = 256

var defaultCache = NewSchemaCache(DefaultSchemaCacheSize)

// SchemaCache compiles JSON Schemas once per distinct schema text (keyed by
// the SHA-256 of the bytes), holding at most max entries; when full, the
// oldest entry is evicted. Compile errors are cached too. It is safe for
// concurrent use.
type SchemaCache struct {
	mu    sync.Mutex
	max   int
	m     map[[32]byte]schemaEntry
	order [][32]byte
}

type schemaEntry struct {
	s   *jsonschema.Schema
	err error
}

// NewSchemaCache returns a cache of at most max schemas (at least 1).
func NewSchemaCache(max int) *SchemaCache {
	if max < 1 {
		max = 1
	}
	return &SchemaCache{max: max, m: make(map[[32]byte]schemaEntry)}
}

// Len returns the number of cached schemas.
func (c *SchemaCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Get returns the compiled schema of raw. Remote references are not loaded.
func (c *SchemaCache) Get(raw json.RawMessage) (*jsonschema.Schema, error) {
	key := sha256.Sum256(raw)
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return e.s, e.err
	}
	e.s, e.err = compileSchema(raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; !ok {
		for len(c.order) >= c.max {
			delete(c.m, c.order[0])
			c.order = c.order[1:]
		}
		c.m[key] = e
		c.order = append(c.order, key)
	}
	return e.s, e.err
}

func compileSchema(raw json.RawMessage) (*jsonschema.Schema, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("empty schema")
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	const loc = "mem://shadow/schema.json"
	comp := jsonschema.NewCompiler()
	comp.UseLoader(jsonschema.SchemeURLLoader{}) // no file or network access
	if err := comp.AddResource(loc, doc); err != nil {
		return nil, err
	}
	s, err := comp.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("schema does not compile: %s", oneLine(err))
	}
	return s, nil
}

// chatMessage and chatToolCall are the parts of an OpenAI chat completion
// (or of a streamed chunk's delta) that answers are built from.
type chatToolCall struct {
	Index    *int `json:"index"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatMessage struct {
	Content   *string        `json:"content"`
	ToolCalls []chatToolCall `json:"tool_calls"`
}

type chatBody struct {
	Object  string          `json:"object"` // "response" for a Responses API answer
	Output  json.RawMessage `json:"output"` // Responses: the output items
	Choices []struct {
		Index        int         `json:"index"`
		Message      chatMessage `json:"message"`
		Delta        chatMessage `json:"delta"`
		Text         *string     `json:"text"` // completions (/v1/completions)
		FinishReason *string     `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// AnswerFromChat builds an Answer from a non-streaming chat completion (or completions) body:
// the first choice's content, tool calls and finish_reason, and
// usage.completion_tokens. Status and latencies are left for the caller. A
// body with an "error" object gives ErrorClass "upstream_error".
//
// A Responses API body ({"object":"response",...}, or one with "output" and no
// "choices") is read as by AnswerFromResponse.
func AnswerFromChat(body []byte) (Answer, error) {
	var b chatBody
	if err := json.Unmarshal(body, &b); err != nil {
		return Answer{}, fmt.Errorf("shadow: chat completion: %w", err)
	}
	if b.Object == "response" || (len(b.Output) > 0 && b.Choices == nil) {
		return AnswerFromResponse(body)
	}
	var a Answer
	if isError(b.Error) {
		a.ErrorClass = "upstream_error"
		return a, nil
	}
	cf := newConfidenceOf()
	cf.body(body)
	a.Confidence = cf.result()
	if b.Usage != nil {
		a.OutputTokens = b.Usage.CompletionTokens
	}
	for _, c := range b.Choices {
		if c.Index != 0 {
			continue
		}
		if c.Message.Content != nil {
			a.Text = *c.Message.Content
		} else if c.Text != nil {
			a.Text = *c.Text
		}
		for _, tc := range c.Message.ToolCalls {
			a.ToolCalls = append(a.ToolCalls, ToolCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		if c.FinishReason != nil {
			a.FinishReason = *c.FinishReason
		}
		break
	}
	return a, nil
}

func isError(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

// AnswerFromSSE assembles an Answer from a streamed chat completion (the raw
// server-sent events): the first choice's content deltas concatenated, tool
// call fragments joined by their index (name and arguments appended), the
// last finish_reason and usage.completion_tokens when present. It stops at
// "data: [DONE]". An event with an "error" object gives ErrorClass
// "stream_error". Status and latencies are left for the caller; an
// undecodable event is an error.
//
// A Responses API stream (events whose data has a "type" of "response.*" or
// "error") is assembled the same way: Text is the response.output_text.delta
// deltas concatenated; each function call is named by its
// response.output_item.added (or .done) item and its arguments are the
// response.function_call_arguments.delta deltas joined (replaced by the
// .done event's whole arguments, and by the done item's); the terminal event
// (response.completed, response.incomplete) gives OutputTokens
// (usage.output_tokens) and FinishReason (mapped to chat's as the gateway's
// Tap maps it: "stop", "tool_calls", "length", "content_filter", or the
// incomplete reason), and its output stands in for the text and calls when
// no delta carried them. An "error" event or response.failed gives
// ErrorClass "stream_error".
func AnswerFromSSE(stream []byte) (Answer, error) {
	var a Answer
	var text strings.Builder
	type frag struct{ name, args strings.Builder }
	var calls []*frag
	byIndex := map[int]*frag{}
	var rs responsesStream
	cf := newConfidenceOf()
	sc := bufio.NewScanner(bytes.NewReader(stream))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue // comments, event:, id:, blank separators
		}
		data = strings.TrimSpace(data)
		if data == "" {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var b streamEvent
		raw := []byte(data)
		if err := json.Unmarshal(raw, &b); err != nil {
			return Answer{}, fmt.Errorf("shadow: stream event: %w", err)
		}
		cf.chunk(raw)
		if isError(b.Error) {
			a.ErrorClass = "stream_error"
			continue
		}
		if b.Type == "error" || strings.HasPrefix(b.Type, "response.") {
			if err := rs.event(&b); err != nil {
				return Answer{}, fmt.Errorf("shadow: stream event %s: %w", b.Type, err)
			}
			continue
		}
		if b.Usage != nil && b.Usage.CompletionTokens > 0 {
			a.OutputTokens = b.Usage.CompletionTokens
		}
		for _, c := range b.Choices {
			if c.Index != 0 {
				continue
			}
			if c.Delta.Content != nil {
				text.WriteString(*c.Delta.Content)
			} else if c.Text != nil {
				text.WriteString(*c.Text)
			}
			for i, tc := range c.Delta.ToolCalls {
				idx := i
				if tc.Index != nil {
					idx = *tc.Index
				}
				f := byIndex[idx]
				if f == nil {
					f = &frag{}
					byIndex[idx] = f
					calls = append(calls, f)
				}
				f.name.WriteString(tc.Function.Name)
				f.args.WriteString(tc.Function.Arguments)
			}
			if c.FinishReason != nil && *c.FinishReason != "" {
				a.FinishReason = *c.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Answer{}, fmt.Errorf("shadow: stream: %w", err)
	}
	a.Confidence = cf.result()
	if rs.seen {
		rs.answer(&a)
		return a, nil
	}
	a.Text = text.String()
	for _, f := range calls {
		a.ToolCalls = append(a.ToolCalls, ToolCall{Name: f.name.String(), Arguments: f.args.String()})
	}
	return a, nil
}

// streamEvent is the data of a stream event: a chat chunk, or a Responses API event.
type streamEvent struct {
	chatBody
	Type        string          `json:"type"`
	Delta       json.RawMessage `json:"delta"`
	ItemID      string          `json:"item_id"`
	OutputIndex *int            `json:"output_index"`
	Arguments   *string         `json:"arguments"` // response.function_call_arguments.done
	Item        json.RawMessage `json:"item"`
	Response    json.RawMessage `json:"response"`
}

// responsesItem is an item of a Responses API answer's output (or of an output_item event).
type responsesItem struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Content   []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
}

// responsesBody is the part of a Responses API response object answers are built from.
type responsesBody struct {
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []json.RawMessage `json:"output"`
	Usage  *struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// responsesFinishReason maps the end of a Responses answer to chat's finish_reason, as
// the gateway's Tap does (openai.ResponsesFinishReason; the shadow tests check that they
// agree): "completed" is "stop", or "tool_calls" with a function call in the output;
// "incomplete" is "length" for max_output_tokens, "content_filter", another reason as it
// is, or "incomplete"; other statuses have none.
func responsesFinishReason(status, reason string, toolCall bool) string {
	switch status {
	case "completed":
		if toolCall {
			return "tool_calls"
		}
		return "stop"
	case "incomplete":
		switch reason {
		case "max_output_tokens":
			return "length"
		case "content_filter":
			return "content_filter"
		case "":
			return "incomplete"
		}
		return reason
	}
	return ""
}

// answer fills a from the response object: the text of its output_text parts, its function
// calls, its usage and its finish. A failed response (or one with an error) gives
// errorClass.
func (r *responsesBody) answer(a *Answer, errorClass string) error {
	if isError(r.Error) || r.Status == "failed" {
		a.ErrorClass = errorClass
	}
	if r.Usage != nil {
		a.OutputTokens = r.Usage.OutputTokens
	}
	var text strings.Builder
	for _, raw := range r.Output {
		var it responsesItem
		if err := json.Unmarshal(raw, &it); err != nil {
			var probe struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(raw, &probe) == nil && probe.Type != "message" && probe.Type != "function_call" {
				continue // another kind of item, shaped otherwise
			}
			return fmt.Errorf("output item: %w", err)
		}
		switch it.Type {
		case "message":
			for _, p := range it.Content {
				if p.Type == "output_text" {
					text.WriteString(p.Text)
				}
			}
		case "function_call":
			a.ToolCalls = append(a.ToolCalls, ToolCall{Name: it.Name, Arguments: it.Arguments})
		}
	}
	a.Text = text.String()
	reason := ""
	if r.IncompleteDetails != nil {
		reason = r.IncompleteDetails.Reason
	}
	a.FinishReason = responsesFinishReason(r.Status, reason, len(a.ToolCalls) > 0)
	return nil
}

// AnswerFromResponse builds an Answer from a non-streaming Responses API body
// ({"object":"response","status",...,"output":[...],"usage":{...}}): Text is the
// output_text parts of its message items, ToolCalls its function_call items, OutputTokens
// usage.output_tokens, FinishReason its status mapped to chat's (see AnswerFromSSE). A
// failed response, or one with an "error" object, gives ErrorClass "upstream_error".
// Status and latencies are left for the caller.
func AnswerFromResponse(body []byte) (Answer, error) {
	var r responsesBody
	if err := json.Unmarshal(body, &r); err != nil {
		return Answer{}, fmt.Errorf("shadow: response: %w", err)
	}
	var a Answer
	if err := r.answer(&a, "upstream_error"); err != nil {
		return Answer{}, fmt.Errorf("shadow: response: %w", err)
	}
	if a.ErrorClass != "" {
		return Answer{ErrorClass: a.ErrorClass}, nil
	}
	cf := newConfidenceOf()
	cf.body(body)
	a.Confidence = cf.result()
	return a, nil
}

// responsesStream assembles a Responses API stream.
type responsesStream struct {
	seen  bool // a Responses event was seen
	text  strings.Builder
	calls []*responsesCall
	byID  map[string]*responsesCall
	byIdx map[int]*responsesCall
	final *Answer // from the terminal event
	err   bool    // an error event, or response.failed
}

type responsesCall struct {
	name string
	args strings.Builder
}

// call returns the function call an event is about (by item id, else output index),
// creating it when create is set; nil when there is none.
func (s *responsesStream) call(id string, idx *int, create bool) *responsesCall {
	if c := s.byID[id]; id != "" && c != nil {
		return c
	}
	if idx != nil {
		if c := s.byIdx[*idx]; c != nil {
			if id != "" {
				s.byID[id] = c
			}
			return c
		}
	}
	if !create {
		return nil
	}
	c := &responsesCall{}
	s.calls = append(s.calls, c)
	if id != "" {
		s.byID[id] = c
	}
	if idx != nil {
		s.byIdx[*idx] = c
	}
	return c
}

func (s *responsesStream) event(e *streamEvent) error {
	if !s.seen {
		s.seen = true
		s.byID, s.byIdx = map[string]*responsesCall{}, map[int]*responsesCall{}
	}
	delta := func() string {
		var d string
		if json.Unmarshal(e.Delta, &d) != nil {
			return ""
		}
		return d
	}
	switch e.Type {
	case "error", "response.failed":
		s.err = true
	case "response.output_text.delta":
		s.text.WriteString(delta())
	case "response.output_item.added", "response.output_item.done":
		var it responsesItem
		if json.Unmarshal(e.Item, &it) != nil || it.Type != "function_call" {
			return nil // not a function call (or shaped like none)
		}
		if it.ID == "" {
			it.ID = e.ItemID
		}
		c := s.call(it.ID, e.OutputIndex, true)
		if it.Name != "" {
			c.name = it.Name
		}
		if e.Type == "response.output_item.done" || it.Arguments != "" {
			c.args.Reset()
			c.args.WriteString(it.Arguments)
		}
	case "response.function_call_arguments.delta":
		s.call(e.ItemID, e.OutputIndex, true).args.WriteString(delta())
	case "response.function_call_arguments.done":
		if e.Arguments != nil {
			c := s.call(e.ItemID, e.OutputIndex, true)
			c.args.Reset()
			c.args.WriteString(*e.Arguments)
		}
	}
	switch e.Type {
	case "response.completed", "response.incomplete", "response.failed":
		var r responsesBody
		if err := json.Unmarshal(e.Response, &r); err != nil {
			return err
		}
		r.Status = strings.TrimPrefix(e.Type, "response.") // the event's type says how it ended, as for the Tap
		var f Answer
		if err := r.answer(&f, "stream_error"); err != nil {
			return err
		}
		s.final = &f
	}
	return nil
}

// answer fills a from the assembled stream.
func (s *responsesStream) answer(a *Answer) {
	a.Text = s.text.String()
	for _, c := range s.calls {
		a.ToolCalls = append(a.ToolCalls, ToolCall{Name: c.name, Arguments: c.args.String()})
	}
	if f := s.final; f != nil {
		a.OutputTokens, a.FinishReason = f.OutputTokens, f.FinishReason
		if a.Text == "" && len(a.ToolCalls) == 0 {
			a.Text, a.ToolCalls = f.Text, f.ToolCalls
		}
		if f.ErrorClass != "" {
			s.err = true
		}
	}
	if s.err {
		a.ErrorClass = "stream_error"
	}
}

// DefaultWindow is the default number of pairs an Accumulator keeps.
const DefaultWindow = 10000

// Per-side flags of a pair kept in the Accumulator's window.
const (
	flagRequest uint8 = 1 << iota
	flagError
	flagAbnormal
	flagSchemaChecked
	flagSchemaBroken
	flagToolChecked
	flagToolBroken
)

// ring keeps the last len(buf) values appended.
type ring[T any] struct {
	buf  []T
	next int
	full bool
}

func newRing[T any](n int) ring[T] { return ring[T]{buf: make([]T, n)} }

func (r *ring[T]) add(v T) {
	r.buf[r.next] = v
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
}

// values returns a copy of the kept values, in no particular order.
func (r *ring[T]) values() []T {
	n := r.next
	if r.full {
		n = len(r.buf)
	}
	return append([]T(nil), r.buf[:n]...)
}

// Accumulator collects PairResults and replica comparisons into the Input of
// Evaluate. It keeps the last Window values of each latency and similarity
// metric and the flags of the last Window pairs (so counts and samples cover
// recent traffic). Latencies are in milliseconds and taken from OK answers
// only; zero latencies are not recorded. With a baseline it also keeps the
// (baseline, candidate) latency pairs of the same requests. It is safe for
// concurrent use.
type Accumulator struct {
	mu                      sync.Mutex
	pTTFT, pITL, pE2E       ring[float64]
	bTTFT, bITL, bE2E       ring[float64]
	cTTFT, cITL, cE2E       ring[float64]
	pairTTFT, pairITL, pair ring[[2]float64] // (baseline, candidate): TTFT, ITL, E2E
	loads                   ring[[2]float64] // (reference, candidate) in flight per endpoint
	sim, noise              ring[float64]
	flags                   ring[[3]uint8] // primary, baseline (0 without), candidate
	conf                    ring[confidencePair]
	pairs, replicas         int64
	triples                 int64
}

// NewAccumulator returns an accumulator keeping window values per metric
// (DefaultWindow when window ≤ 0).
func NewAccumulator(window int) *Accumulator {
	if window <= 0 {
		window = DefaultWindow
	}
	a := &Accumulator{}
	for _, r := range []*ring[float64]{&a.pTTFT, &a.pITL, &a.pE2E, &a.bTTFT, &a.bITL, &a.bE2E, &a.cTTFT, &a.cITL, &a.cE2E, &a.sim, &a.noise} {
		*r = newRing[float64](window)
	}
	for _, r := range []*ring[[2]float64]{&a.pairTTFT, &a.pairITL, &a.pair, &a.loads} {
		*r = newRing[[2]float64](window)
	}
	a.flags = newRing[[3]uint8](window)
	a.conf = newRing[confidencePair](window)
	return a
}

func addLatency(r *ring[float64], d time.Duration) {
	if d > 0 {
		r.add(durMS(d))
	}
}

func addPair(r *ring[[2]float64], b, c time.Duration) {
	if b > 0 && c > 0 {
		r.add([2]float64{durMS(b), durMS(c)})
	}
}

func sideFlags(s SideResult) uint8 {
	f := flagRequest
	set := func(cond bool, bit uint8) {
		if cond {
			f |= bit
		}
	}
	set(!s.OK, flagError)
	set(s.AbnormalFinish, flagAbnormal)
	set(s.SchemaChecked, flagSchemaChecked)
	set(s.SchemaBroken, flagSchemaBroken)
	set(s.ToolCallChecked, flagToolChecked)
	set(s.ToolCallBroken, flagToolBroken)
	return f
}

func addSide(s SideResult, ttft, itl, e2e *ring[float64]) {
	if s.OK {
		addLatency(ttft, s.TTFT)
		addLatency(itl, s.ITL)
		addLatency(e2e, s.E2E)
	}
}

// Add records one compared pair (or triple: r.Baseline set).
func (a *Accumulator) Add(r PairResult) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pairs++
	fl := [3]uint8{sideFlags(r.Primary), 0, sideFlags(r.Candidate)}
	addSide(r.Primary, &a.pTTFT, &a.pITL, &a.pE2E)
	addSide(r.Candidate, &a.cTTFT, &a.cITL, &a.cE2E)
	if b := r.Baseline; b != nil {
		a.triples++
		fl[1] = sideFlags(*b)
		addSide(*b, &a.bTTFT, &a.bITL, &a.bE2E)
		if b.OK && r.Candidate.OK {
			addPair(&a.pairTTFT, b.TTFT, r.Candidate.TTFT)
			addPair(&a.pairITL, b.ITL, r.Candidate.ITL)
			addPair(&a.pair, b.E2E, r.Candidate.E2E)
		}
		if r.NoiseValid {
			a.noise.add(r.NoiseSimilarity)
		}
	}
	a.flags.add(fl)
	ref := r.Primary
	if r.Baseline != nil {
		ref = *r.Baseline
	}
	if ref.OK && r.Candidate.OK && ref.Confidence.Valid() && r.Candidate.Confidence.Valid() {
		a.conf.add(confidencePair{ref: ref.Confidence, cand: r.Candidate.Confidence, triple: r.Baseline != nil})
	}
	if l := r.Loads; l.Valid {
		ref := l.Primary
		if r.Baseline != nil {
			ref = l.Baseline
		}
		a.loads.add([2]float64{ref, l.Candidate})
	}
	if r.SimilarityValid {
		a.sim.add(r.Similarity)
	}
}

// AddReplica records the similarity of a replica answer (the same request
// sent to the primary cluster again) to the primary's, the noise floor. Pairs
// where either side failed are ignored.
func (a *Accumulator) AddReplica(primary, replica Answer) {
	if !primary.OK() || !replica.OK() {
		return
	}
	s := RougeL(render(replica), render(primary))
	a.mu.Lock()
	defer a.mu.Unlock()
	a.replicas++
	a.noise.add(s)
}

// Counts returns how many pairs and replica comparisons were ever added.
func (a *Accumulator) Counts() (pairs, replicas int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pairs, a.replicas
}

// Input returns a snapshot of the accumulated data for Evaluate.
func (a *Accumulator) Input() Input {
	a.mu.Lock()
	defer a.mu.Unlock()
	in := Input{
		Primary:             Arm{TTFT: a.pTTFT.values(), ITL: a.pITL.values(), E2E: a.pE2E.values()},
		Candidate:           Arm{TTFT: a.cTTFT.values(), ITL: a.cITL.values(), E2E: a.cE2E.values()},
		CandidateSimilarity: a.sim.values(),
		NoiseFloor:          a.noise.values(),
	}
	for _, l := range a.loads.values() {
		in.Load.Reference = append(in.Load.Reference, l[0])
		in.Load.Candidate = append(in.Load.Candidate, l[1])
	}
	flags := a.flags.values()
	baseline := a.triples > 0
	if baseline {
		in.Baseline = &Arm{TTFT: a.bTTFT.values(), ITL: a.bITL.values(), E2E: a.bE2E.values()}
		in.Paired = Paired{TTFT: a.pairTTFT.values(), ITL: a.pairITL.values(), E2E: a.pair.values()}
	}
	for _, c := range a.conf.values() {
		if baseline && !c.triple {
			continue // a pair from before the baseline: judged against the primary
		}
		in.Confidence.Entropy = append(in.Confidence.Entropy, [2]float64{c.ref.MeanEntropy, c.cand.MeanEntropy})
		in.Confidence.LowMargin = append(in.Confidence.LowMargin, [2]float64{c.ref.LowMargin, c.cand.LowMargin})
	}
	for _, f := range flags {
		count(&in.Primary, f[0])
		count(&in.Candidate, f[2])
		ref := f[0]
		if baseline {
			if f[1] == 0 {
				continue // a pair from before the baseline: not part of this comparison
			}
			count(in.Baseline, f[1])
			ref = f[1]
		}
		if f[2]&flagSchemaBroken != 0 && ref&flagSchemaChecked != 0 && ref&flagSchemaBroken == 0 {
			in.SchemaBrokeAlone++
		}
		if f[2]&flagToolBroken != 0 && ref&flagToolChecked != 0 && ref&flagToolBroken == 0 {
			in.ToolBrokeAlone++
		}
	}
	return in
}

func count(arm *Arm, f uint8) {
	b := func(bit uint8) int {
		if f&bit != 0 {
			return 1
		}
		return 0
	}
	arm.Requests += b(flagRequest)
	arm.Errors += b(flagError)
	arm.AbnormalFinish += b(flagAbnormal)
	arm.SchemaChecked += b(flagSchemaChecked)
	arm.SchemaBroken += b(flagSchemaBroken)
	arm.ToolCallChecked += b(flagToolChecked)
	arm.ToolCallBroken += b(flagToolBroken)
}
