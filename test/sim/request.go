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
	ContinueFinalMessage bool `json:"continue_final_message"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    messageContent `json:"content"`
	Name       string         `json:"name"`
	ToolCallID string         `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// messageContent is a message's content: a string, an array of content parts, or null.
type messageContent struct {
	text  string
	parts []contentPart
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
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
	one    [1]choice // backing store for the common single-choice case
}

// choice is one answer (one sequence for the scheduler).
type choice struct {
	prompt  int    // prompt tokens
	reserve int    // KV tokens reserved at admission: prompt + max output tokens
	n       int    // output tokens this answer has
	finish  string // finish_reason once all n tokens are out
	text    textGen
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

// maxTokens resolves the output budget of a request whose prompt has prompt tokens.
func (s *Server) maxTokens(explicit *int64, prompt int) (int, *apiError) {
	limit := s.cfg.MaxModelLen
	if explicit != nil {
		mt := *explicit
		if mt < 1 {
			return 0, badRequest("invalid_value", "max_tokens", fmt.Sprintf("max_tokens must be at least 1, got %d.", mt))
		}
		if mt > int64(limit-prompt) {
			return 0, contextTooLong(limit, prompt, strconv.FormatInt(mt, 10))
		}
		return int(mt), nil
	}
	mt := min(s.cfg.MaxTokensDefault, limit-prompt)
	if mt < 1 {
		return 0, contextTooLong(limit, prompt, "1")
	}
	return mt, nil
}

func contextTooLong(limit, prompt int, completion string) *apiError {
	return badRequest("context_length_exceeded", "messages", fmt.Sprintf(
		"This model's maximum context length is %d tokens. However, you requested %d tokens in the messages and %s in the completion. Please reduce the length of the messages or completion.",
		limit, prompt, completion))
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
	h := newHasher()
	h.str(s.cfg.Model)
	h.sep()
	var marks markerSet
	textTokens := 0
	text := func(t string) {
		h.str(t)
		h.sep()
		textTokens += estimateTokens(t)
		marks.scan(t)
	}
	// continue_final_message (vLLM): the final assistant message is a prefix of the answer.
	// The answer is the one the conversation without it gets, less the prefix's tokens, so a
	// stream cut and resumed elsewhere reads exactly as the uncut one.
	msgs, prefix := req.Messages, 0
	if last := len(msgs) - 1; req.ContinueFinalMessage && msgs[last].Role == "assistant" {
		msgs[last].Content.each(func(t string) { prefix += len(strings.Fields(t)) })
		msgs = msgs[:last]
	}
	for i := range msgs {
		m := &msgs[i]
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool", "function":
		default:
			return nil, badRequest("invalid_value", fmt.Sprintf("messages[%d].role", i),
				fmt.Sprintf("messages[%d].role must be one of system, developer, user, assistant, tool; got %q.", i, m.Role))
		}
		h.str(m.Role)
		h.sep()
		m.Content.each(text)
		for j := range m.ToolCalls {
			text(m.ToolCalls[j].Function.Name)
			text(m.ToolCalls[j].Function.Arguments)
		}
		if m.ToolCallID != "" {
			h.str(m.ToolCallID)
			h.sep()
		}
	}
	p := &plan{ep: epChat, stream: req.Stream, includeUsage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	c := choice{prompt: max(1, len(req.Messages)+textTokens+(len(req.Tools)+3)/4)}

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
	maxTok, e := s.maxTokens(explicit, c.prompt)
	if e != nil {
		return nil, e
	}
	if e := s.reserve(&c, maxTok); e != nil {
		return nil, e
	}
	s.sampleSeed(&h, req.Seed, req.Temperature)
	if tool != nil {
		c.tool = newToolCall(h.sum(), tool.Function.Name, tool.Function.Parameters, maxTok)
		c.n, c.finish = c.tool.n, c.tool.finish
	} else {
		c.text = newTextGen(h.sum(), marks.list, prefix+maxTok, req.IgnoreEOS)
		for range min(prefix, c.text.n) {
			_ = c.text.next(nil)
		}
		c.n, c.finish = max(0, c.text.n-prefix), c.text.finish
	}
	p.promptTokens = c.prompt
	p.one[0] = c
	p.choices = p.one[:]
	return p, nil
}

// pickTool decides whether the answer is a tool call and to which function. It returns nil
// when the answer is text.
func pickTool(rawTools, rawChoice json.RawMessage) (*toolDef, *apiError) {
	if len(rawTools) == 0 || bytes.Equal(rawTools, []byte("null")) {
		return nil, nil
	}
	var tools []toolDef
	if err := json.Unmarshal(rawTools, &tools); err != nil {
		return nil, badRequest("invalid_value", "tools", "tools must be an array of tool definitions: "+err.Error())
	}
	var fns []*toolDef
	for i := range tools {
		t := &tools[i]
		if t.Type != "function" && t.Type != "" {
			continue // other tool kinds (custom, ...) are accepted and never called
		}
		if t.Function == nil || t.Function.Name == "" {
			return nil, badRequest("invalid_value", fmt.Sprintf("tools[%d].function.name", i), "tools[].function.name is required.")
		}
		fns = append(fns, t)
	}
	want := ""
	switch c := bytes.TrimSpace(rawChoice); {
	case len(c) == 0 || bytes.Equal(c, []byte("null")):
	case c[0] == '"':
		var mode string
		if err := json.Unmarshal(c, &mode); err != nil {
			return nil, badRequest("invalid_value", "tool_choice", "invalid tool_choice: "+err.Error())
		}
		switch mode {
		case "none":
			return nil, nil
		case "auto", "required":
		default:
			return nil, badRequest("invalid_value", "tool_choice", fmt.Sprintf("tool_choice must be none, auto, required or an object; got %q.", mode))
		}
	case c[0] == '{':
		var named struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(c, &named); err != nil || named.Function.Name == "" {
			return nil, badRequest("invalid_value", "tool_choice", "tool_choice object must name a function.")
		}
		want = named.Function.Name
	default:
		return nil, badRequest("invalid_value", "tool_choice", "tool_choice must be a string or an object.")
	}
	if want == "" {
		if len(fns) == 0 {
			return nil, nil
		}
		return fns[0], nil
	}
	for _, f := range fns {
		if f.Function.Name == want {
			return f, nil
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
	p := &plan{ep: epCompletions, stream: req.Stream, includeUsage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	p.choices = make([]choice, 0, len(items))
	for _, it := range items {
		c := choice{prompt: it.count()}
		maxTok, e := s.maxTokens(req.MaxTokens, c.prompt)
		if e != nil {
			e.param = "prompt"
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
			return nil, contextTooLong(s.cfg.MaxModelLen, c.prompt, "0")
		}
		if e := s.reserve(&c, 0); e != nil {
			return nil, e
		}
		p.promptTokens += c.prompt
		p.choices = append(p.choices, c)
	}
	return p, nil
}
