package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

type endpoint uint8

const (
	epChat endpoint = iota
	epCompletions
	epEmbeddings
	epResponses
)

// Wire types of the requests. Unknown fields are ignored, like vLLM does by default.

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	Seed                *int64          `json:"seed"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	// ContinueFinalMessage (vLLM): the last message is an assistant prefix to continue.
	ContinueFinalMessage bool   `json:"continue_final_message"`
	Logprobs             *bool  `json:"logprobs"`
	TopLogprobs          *int64 `json:"top_logprobs"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    messageContent `json:"content"`
	Name       string         `json:"name"`
	ToolCallID string         `json:"tool_call_id"`
	ToolCalls  []chatToolCall `json:"tool_calls"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// messageContent is a message's content: a string, an array of content parts, or null.
type messageContent struct {
	text  string
	parts []contentPart
}

type contentPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text"`
	ImageURL *imageURL `json:"image_url"`
}

type imageURL struct {
	URL string `json:"url"`
}

func (c *messageContent) UnmarshalJSON(b []byte) error {
	switch b[0] {
	case '"':
		return json.Unmarshal(b, &c.text)
	case '[':
		return json.Unmarshal(b, &c.parts)
	case 'n':
		return nil
	}
	return errors.New("content must be a string, an array of content parts or null")
}

// each calls f with every piece of text in the content.
func (c *messageContent) each(f func(string)) {
	if c.text != "" {
		f(c.text)
	}
	for i := range c.parts {
		p := &c.parts[i]
		if p.Text != "" {
			f(p.Text)
		}
		if p.ImageURL != nil && p.ImageURL.URL != "" {
			f(p.ImageURL.URL)
		}
	}
}

type toolDef struct {
	Type     string `json:"type"`
	Function *struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     *int64          `json:"max_tokens"`
	Temperature   *float64        `json:"temperature"`
	Seed          *int64          `json:"seed"`
	IgnoreEOS     bool            `json:"ignore_eos"`
	Logprobs      *int64          `json:"logprobs"`
}

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	Dimensions     *int64          `json:"dimensions"`
	EncodingFormat string          `json:"encoding_format"`
}

// plan is a decoded, validated request: what to answer and what it costs.
type plan struct {
	ep           endpoint
	stream       bool
	includeUsage bool
	choices      []choice
	promptTokens int
	// embeddings
	dims   int
	base64 bool
	resp   *respPlan // Responses API
	one    [1]choice // backing store for the common single-choice case
}

// loop makes the plan's text answers loop (x-sim-loop-after): see textGen.loop.
func (p *plan) loop(after, period int) {
	for i := range p.choices {
		c := &p.choices[i]
		if c.tool != nil || p.ep == epEmbeddings {
			continue
		}
		prefix := c.text.i // tokens a continuation skipped
		c.text.loop(after, period)
		c.n, c.finish = max(0, c.text.n-prefix), c.text.finish
	}
	if p.resp != nil && len(p.choices) == 1 {
		p.resp.text0 = p.choices[0].text
	}
}

// choice is one answer (one sequence for the scheduler).
type choice struct {
	prompt  int    // prompt tokens
	reserve int    // KV tokens reserved at admission: prompt + max output tokens
	n       int    // output tokens this answer has
	finish  string // finish_reason once all n tokens are out
	text    textGen
	lp      *lpWriter // the logprobs asked for (a text answer), nil when not
	tool    *toolCall
	input   string // embeddings: the text embedded
	seq     *seq   // scheduled mode
	// streaming progress
	emitted int
	started bool
	closed  bool
}

const maxInputs = 4096

func decodeErr(err error) *apiError {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return badRequest("invalid_json", "", "invalid JSON body: "+err.Error())
	case errors.As(err, &te):
		return badRequest("invalid_type", te.Field, "invalid request: "+err.Error())
	}
	return badRequest("invalid_json", "", "invalid request body: "+err.Error())
}

func (s *Server) checkModel(model string) *apiError {
	if model == "" || model == s.cfg.Model {
		return nil
	}
	return &apiError{status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model",
		message: fmt.Sprintf("The model `%s` does not exist.", model)}
}

// maxTokens resolves the output budget of a request whose prompt has prompt tokens; param
// names the request field that sets it (max_tokens, max_output_tokens).
func (s *Server) maxTokens(explicit *int64, prompt int, param string) (int, *apiError) {
	limit := s.cfg.MaxModelLen
	if explicit != nil {
		mt := *explicit
		if mt < 1 {
			return 0, badRequest("invalid_value", param, fmt.Sprintf("%s must be at least 1, got %d.", param, mt))
		}
		if mt > int64(limit-prompt) {
			return 0, contextTooLong(limit, prompt, mt)
		}
		return int(mt), nil
	}
	mt := min(s.cfg.MaxTokensDefault, limit-prompt)
	if mt < 1 {
		return 0, contextTooLong(limit, prompt, 1)
	}
	return mt, nil
}

// contextTooLong is vLLM's answer to a prompt plus completion over the context window (param
// "messages"; callers set the field of their endpoint). completion >= 0, prompt >= 0.
func contextTooLong(limit, prompt int, completion int64) *apiError {
	total := uint64(prompt) + uint64(completion) // both non-negative: no overflow
	return badRequest("context_length_exceeded", "messages", fmt.Sprintf(
		"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
		limit, total, prompt, completion))
}

// embeddingTooLong is vLLM's answer to an embeddings input over the context window.
func embeddingTooLong(limit, prompt int) *apiError {
	return badRequest("context_length_exceeded", "input", fmt.Sprintf(
		"This model's maximum context length is %d tokens. However, you requested %d tokens in the input for embedding generation. Please reduce the length of the input.",
		limit, prompt))
}

// finishChoice fills the KV reservation and checks that it can ever be admitted.
func (s *Server) reserve(c *choice, maxTok int) *apiError {
	c.reserve = c.prompt + maxTok
	if c.reserve > s.cfg.KVTokens {
		return badRequest("kv_cache_exceeded", "", fmt.Sprintf(
			"The request needs %d KV cache tokens (%d prompt + %d output) but the cache holds %d.",
			c.reserve, c.prompt, maxTok, s.cfg.KVTokens))
	}
	return nil
}

// sampleSeed folds the sampling parameters into the request hash: a seed param makes the
// answer depend on it; temperature > 0 without a seed makes it random.
func (s *Server) sampleSeed(h *hasher, seed *int64, temperature *float64) {
	if seed != nil {
		h.sep()
		h.u64(uint64(*seed))
	}
	if seed == nil && temperature != nil && *temperature > 0 {
		h.u64(s.randUint64())
	}
}

func (s *Server) planChat(body []byte) (*plan, *apiError) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, decodeErr(err)
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("invalid_value", "messages", "messages must be a non-empty array.")
	}
	// continue_final_message (vLLM): the final assistant message is a prefix of the answer.
	// The answer is the one the conversation without it gets, less the prefix's tokens, so a
	// stream cut and resumed elsewhere reads exactly as the uncut one.
	msgs, prefix := req.Messages, 0
	if last := len(msgs) - 1; req.ContinueFinalMessage && msgs[last].Role == "assistant" {
		msgs[last].Content.each(func(t string) { prefix += len(strings.Fields(t)) })
		msgs = msgs[:last]
	}
	var sum convSum
	if e := s.hashConversation(&sum, msgs); e != nil {
		return nil, e
	}
	p := &plan{ep: epChat, stream: req.Stream, includeUsage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	c := choice{prompt: max(1, len(req.Messages)+sum.textTokens+(len(req.Tools)+3)/4)}

	tool, e := pickTool(req.Tools, req.ToolChoice)
	if e != nil {
		return nil, e
	}
	last := req.Messages[len(req.Messages)-1].Role
	if tool != nil && (last == "tool" || last == "function") {
		tool = nil
	}

	explicit := req.MaxCompletionTokens
	if explicit == nil {
		explicit = req.MaxTokens
	}
	maxTok, e := s.maxTokens(explicit, c.prompt, "max_tokens")
	if e != nil {
		return nil, e
	}
	if e := s.reserve(&c, maxTok); e != nil {
		return nil, e
	}
	k, e := chatLogprobs(req.Logprobs, req.TopLogprobs)
	if e != nil {
		return nil, e
	}
	s.planAnswer(&c, &sum, tool, maxTok, prefix, req.Seed, req.Temperature, req.IgnoreEOS)
	if k >= 0 && c.tool == nil {
		c.lp = s.newLPWriter(k, true, c.text.lpSeed)
	}
	p.promptTokens = c.prompt
	p.one[0] = c
	p.choices = p.one[:]
	return p, nil
}

// convSum is what a conversation contributes to its answer: the hash of the model name and
// every message (role, text, tool calls, tool call id), its context markers, and the prompt
// tokens of its text. Chat and the Responses API share it, so the same conversation gets the
// same answer from both.
type convSum struct {
	h          hasher
	marks      markerSet
	textTokens int
}

func (cs *convSum) text(t string) {
	cs.h.str(t)
	cs.h.sep()
	cs.textTokens += estimateTokens(t)
	cs.marks.scan(t)
}

// hashConversation fills sum from msgs (validating their roles).
func (s *Server) hashConversation(sum *convSum, msgs []chatMessage) *apiError {
	sum.h = newHasher()
	sum.h.str(s.cfg.Model)
	sum.h.sep()
	for i := range msgs {
		m := &msgs[i]
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool", "function":
		default:
			return badRequest("invalid_value", fmt.Sprintf("messages[%d].role", i),
				fmt.Sprintf("messages[%d].role must be one of system, developer, user, assistant, tool; got %q.", i, m.Role))
		}
		sum.h.str(m.Role)
		sum.h.sep()
		m.Content.each(sum.text)
		for j := range m.ToolCalls {
			sum.text(m.ToolCalls[j].Function.Name)
			sum.text(m.ToolCalls[j].Function.Arguments)
		}
		if m.ToolCallID != "" {
			sum.h.str(m.ToolCallID)
			sum.h.sep()
		}
	}
	return nil
}

// planAnswer plans the answer to a conversation into c (whose prompt and reservation are
// set): a call to tool when it is not nil, else text; prefix tokens of the text are skipped
// (continue_final_message).
func (s *Server) planAnswer(c *choice, sum *convSum, tool *funcDef, maxTok, prefix int, seed *int64, temperature *float64, ignoreEOS bool) {
	s.sampleSeed(&sum.h, seed, temperature)
	if tool != nil {
		c.tool = newToolCall(sum.h.sum(), tool.name, tool.params, maxTok)
		c.n, c.finish = c.tool.n, c.tool.finish
		return
	}
	c.text = newTextGen(sum.h.sum(), sum.marks.list, prefix+maxTok, ignoreEOS)
	for range min(prefix, c.text.n) {
		_ = c.text.next(nil)
	}
	c.n, c.finish = max(0, c.text.n-prefix), c.text.finish
}

// chatLogprobs validates chat's logprobs and top_logprobs as vLLM does and returns the
// number of alternatives asked per token, -1 when logprobs were not asked for.
func chatLogprobs(logprobs *bool, top *int64) (int, *apiError) {
	on := logprobs != nil && *logprobs
	if top != nil {
		switch {
		case !on:
			return 0, badRequest("invalid_value", "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
		case *top < 0 || *top > lpMaxTop:
			return 0, badRequest("invalid_value", "top_logprobs", fmt.Sprintf("`top_logprobs` must be within [0, %d], got %d.", lpMaxTop, *top))
		}
	}
	switch {
	case !on:
		return -1, nil
	case top == nil:
		return 0, nil
	}
	return int(*top), nil
}

// newLPWriter returns the logprobs writer of one answer.
func (s *Server) newLPWriter(k int, chat bool, seed uint64) *lpWriter {
	return &lpWriter{k: k, chat: chat, temp: s.cfg.LogprobTemperature, seed: seed}
}

// funcDef is a declared function tool.
type funcDef struct {
	name   string
	params json.RawMessage
}

// pickTool decides whether a chat answer is a tool call and to which function. It returns
// nil when the answer is text.
func pickTool(rawTools, rawChoice json.RawMessage) (*funcDef, *apiError) {
	if len(rawTools) == 0 || bytes.Equal(rawTools, []byte("null")) {
		return nil, nil
	}
	var tools []toolDef
	if err := json.Unmarshal(rawTools, &tools); err != nil {
		return nil, badRequest("invalid_value", "tools", "tools must be an array of tool definitions: "+err.Error())
	}
	var fns []funcDef
	for i := range tools {
		t := &tools[i]
		if t.Type != "function" && t.Type != "" {
			continue // other tool kinds (custom, ...) are accepted and never called
		}
		if t.Function == nil || t.Function.Name == "" {
			return nil, badRequest("invalid_value", fmt.Sprintf("tools[%d].function.name", i), "tools[].function.name is required.")
		}
		fns = append(fns, funcDef{name: t.Function.Name, params: t.Function.Parameters})
	}
	none, want, e := parseToolChoice(rawChoice, func(c []byte) (string, bool) {
		var named struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(c, &named); err != nil || named.Function.Name == "" {
			return "", false
		}
		return named.Function.Name, true
	})
	if e != nil {
		return nil, e
	}
	if none {
		return nil, nil
	}
	return chooseTool(fns, want)
}

// parseToolChoice reads a tool_choice: absent, null, "auto" and "required" pick the first
// function, "none" none, an object (read by named) the function it names.
func parseToolChoice(raw json.RawMessage, named func([]byte) (string, bool)) (none bool, want string, e *apiError) {
	switch c := bytes.TrimSpace(raw); {
	case len(c) == 0 || bytes.Equal(c, []byte("null")):
	case c[0] == '"':
		var mode string
		if err := json.Unmarshal(c, &mode); err != nil {
			return false, "", badRequest("invalid_value", "tool_choice", "invalid tool_choice: "+err.Error())
		}
		switch mode {
		case "none":
			return true, "", nil
		case "auto", "required":
		default:
			return false, "", badRequest("invalid_value", "tool_choice", fmt.Sprintf("tool_choice must be none, auto, required or an object; got %q.", mode))
		}
	case c[0] == '{':
		name, ok := named(c)
		if !ok {
			return false, "", badRequest("invalid_value", "tool_choice", "tool_choice object must name a function.")
		}
		want = name
	default:
		return false, "", badRequest("invalid_value", "tool_choice", "tool_choice must be a string or an object.")
	}
	return false, want, nil
}

// chooseTool returns the function named want, or the first one when want is "" (nil when
// there is none: the answer is text).
func chooseTool(fns []funcDef, want string) (*funcDef, *apiError) {
	if want == "" {
		if len(fns) == 0 {
			return nil, nil
		}
		return &fns[0], nil
	}
	for i := range fns {
		if fns[i].name == want {
			return &fns[i], nil
		}
	}
	return nil, badRequest("invalid_value", "tool_choice", fmt.Sprintf("tool_choice names function %q, which is not in tools.", want))
}

// promptList decodes the OpenAI prompt/input union: a string, an array of strings, an array
// of token ids, or an array of arrays of token ids. Token-id prompts are rendered as their
// decimal ids joined by spaces (for hashing) and count one token per id.
type promptItem struct {
	text   string
	tokens int // -1: estimate from text
}

func decodePrompts(raw json.RawMessage, field string) ([]promptItem, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("invalid_value", field, field+" is required.")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, decodeErr(err)
		}
		return []promptItem{{text: s, tokens: -1}}, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, badRequest("invalid_type", field, field+" must be a string, an array of strings or an array of token ids.")
	}
	if len(elems) == 0 {
		return nil, badRequest("invalid_value", field, field+" must not be empty.")
	}
	if c := elems[0][0]; c == '-' || c >= '0' && c <= '9' {
		item, e := tokenPrompt(raw, field)
		if e != nil {
			return nil, e
		}
		return []promptItem{item}, nil
	}
	if len(elems) > maxInputs {
		return nil, badRequest("invalid_value", field, fmt.Sprintf("%s has %d items; at most %d are accepted.", field, len(elems), maxInputs))
	}
	items := make([]promptItem, 0, len(elems))
	for _, el := range elems {
		switch el[0] {
		case '"':
			var s string
			if err := json.Unmarshal(el, &s); err != nil {
				return nil, decodeErr(err)
			}
			items = append(items, promptItem{text: s, tokens: -1})
		case '[':
			item, e := tokenPrompt(el, field)
			if e != nil {
				return nil, e
			}
			items = append(items, item)
		default:
			return nil, badRequest("invalid_type", field, field+" items must be strings or arrays of token ids.")
		}
	}
	return items, nil
}

func tokenPrompt(raw json.RawMessage, field string) (promptItem, *apiError) {
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		return promptItem{}, badRequest("invalid_type", field, field+": token id arrays must hold integers.")
	}
	if len(ids) == 0 {
		return promptItem{}, badRequest("invalid_value", field, field+": token id arrays must not be empty.")
	}
	b := make([]byte, 0, len(ids)*6)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return promptItem{text: string(b), tokens: len(ids)}, nil
}

func (it promptItem) count() int {
	if it.tokens >= 0 {
		return it.tokens
	}
	return max(1, estimateTokens(it.text))
}

func (s *Server) planCompletion(body []byte) (*plan, *apiError) {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, decodeErr(err)
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	items, e := decodePrompts(req.Prompt, "prompt")
	if e != nil {
		return nil, e
	}
	k := -1
	if lp := req.Logprobs; lp != nil {
		if *lp < 0 || *lp > lpMaxTop {
			return nil, badRequest("invalid_value", "logprobs", fmt.Sprintf("logprobs must be within [0, %d], got %d.", lpMaxTop, *lp))
		}
		k = int(*lp)
	}
	p := &plan{ep: epCompletions, stream: req.Stream, includeUsage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	p.choices = make([]choice, 0, len(items))
	for _, it := range items {
		c := choice{prompt: it.count()}
		maxTok, e := s.maxTokens(req.MaxTokens, c.prompt, "max_tokens")
		if e != nil && e.code == "context_length_exceeded" {
			e.param = "prompt"
		}
		if e != nil {
			return nil, e
		}
		if e := s.reserve(&c, maxTok); e != nil {
			return nil, e
		}
		h := newHasher()
		h.str(s.cfg.Model)
		h.sep()
		h.str(it.text)
		s.sampleSeed(&h, req.Seed, req.Temperature)
		var marks markerSet
		if it.tokens < 0 {
			marks.scan(it.text)
		}
		c.text = newTextGen(h.sum(), marks.list, maxTok, req.IgnoreEOS)
		c.n, c.finish = c.text.n, c.text.finish
		if k >= 0 {
			c.lp = s.newLPWriter(k, false, c.text.lpSeed)
		}
		p.promptTokens += c.prompt
		p.choices = append(p.choices, c)
	}
	return p, nil
}

func (s *Server) planEmbedding(body []byte) (*plan, *apiError) {
	var req embeddingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, decodeErr(err)
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	p := &plan{ep: epEmbeddings, dims: s.cfg.EmbeddingDim}
	switch req.EncodingFormat {
	case "", "float":
	case "base64":
		p.base64 = true
	default:
		return nil, badRequest("invalid_value", "encoding_format", fmt.Sprintf("encoding_format must be float or base64, got %q.", req.EncodingFormat))
	}
	if req.Dimensions != nil {
		if d := *req.Dimensions; d < 1 || d > maxEmbeddingDim {
			return nil, badRequest("invalid_value", "dimensions", fmt.Sprintf("dimensions must be within [1, %d], got %d.", maxEmbeddingDim, d))
		}
		p.dims = int(*req.Dimensions)
	}
	items, e := decodePrompts(req.Input, "input")
	if e != nil {
		return nil, e
	}
	p.choices = make([]choice, 0, len(items))
	for _, it := range items {
		c := choice{prompt: it.count(), input: it.text, finish: "stop"}
		if c.prompt > s.cfg.MaxModelLen {
			return nil, embeddingTooLong(s.cfg.MaxModelLen, c.prompt)
		}
		if e := s.reserve(&c, 0); e != nil {
			return nil, e
		}
		p.promptTokens += c.prompt
		p.choices = append(p.choices, c)
	}
	return p, nil
}
