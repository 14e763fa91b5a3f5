package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluicegw/sluice/policy/openai"
)

// The OpenAI Responses API (POST /v1/responses) as vLLM serves it. A request is turned into
// the chat conversation it stands for (instructions as a system message, then the stored
// conversation of previous_response_id, then one message per input item) and answered by the
// same planner as chat, so both endpoints give the same answer to the same conversation.

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Stream             bool            `json:"stream"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Seed               *int64          `json:"seed"`
	IgnoreEOS          bool            `json:"ignore_eos"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	User               *string         `json:"user"`
	Metadata           json.RawMessage `json:"metadata"`
	Store              *bool           `json:"store"`
	Text               json.RawMessage `json:"text"`
}

// respItem is one input item: a message ({role, content}, with or without type "message"), a
// function_call, a function_call_output, or a reasoning item (ignored).
type respItem struct {
	Type      string      `json:"type"`
	Role      string      `json:"role"`
	Content   respContent `json:"content"`
	CallID    string      `json:"call_id"`
	Name      string      `json:"name"`
	Arguments *string     `json:"arguments"`
	Output    respContent `json:"output"`
}

// respContent is a message's content or a function call's output: a string or an array of
// content parts.
type respContent struct {
	set   bool
	text  string
	parts []respPart
}

type respPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL string `json:"image_url"`
}

func (c *respContent) UnmarshalJSON(b []byte) error {
	switch b[0] {
	case '"':
		c.set = true
		return json.Unmarshal(b, &c.text)
	case '[':
		c.set = true
		return json.Unmarshal(b, &c.parts)
	case 'n':
		return nil
	}
	return errors.New("content must be a string or an array of content parts")
}

// chat converts the content to a chat message's: the text of input_text and output_text
// parts (any part's "text"), and input_image URLs, as chat reads text and image_url parts.
func (c *respContent) chat() messageContent {
	mc := messageContent{text: c.text}
	for i := range c.parts {
		p := &c.parts[i]
		cp := contentPart{Type: p.Type, Text: p.Text}
		if p.ImageURL != "" {
			cp.ImageURL = &imageURL{URL: p.ImageURL}
		}
		mc.parts = append(mc.parts, cp)
	}
	return mc
}

// respTool is a Responses tool definition: flat, {type, name, description, parameters, strict}.
type respTool struct {
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Parameters json.RawMessage `json:"parameters"`
}

// respPlan is the Responses-specific part of a plan.
type respPlan struct {
	id      string // resp_…
	itemID  string // msg_… or fc_…
	created int64
	text0   textGen       // the text answer's generator before its first token
	echo    []byte        // the request fields a response object echoes, as `,"key":value` pairs
	conv    []chatMessage // previous conversation + input, without instructions (what is stored)
	store   bool
}

func badValue(param, format string, args ...any) *apiError {
	return badRequest("invalid_value", param, fmt.Sprintf(format, args...))
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

func (s *Server) planResponses(body []byte) (*plan, *apiError) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, decodeErr(err)
	}
	if e := s.checkModel(req.Model); e != nil {
		return nil, e
	}
	rp := &respPlan{store: req.Store == nil || *req.Store, created: time.Now().Unix()}

	var msgs []chatMessage
	if req.Instructions != nil {
		msgs = append(msgs, chatMessage{Role: "system", Content: messageContent{text: *req.Instructions}})
	}
	start := len(msgs)
	if id := req.PreviousResponseID; id != nil && *id != "" {
		prev, ok := s.stored.get(*id)
		if !ok {
			return nil, &apiError{status: 404, typ: "invalid_request_error", code: "previous_response_not_found",
				param: "previous_response_id", message: fmt.Sprintf("Previous response with id '%s' not found.", *id)}
		}
		msgs = append(msgs, prev...)
	}
	msgs, e := appendInput(msgs, req.Input)
	if e != nil {
		return nil, e
	}
	if len(msgs) == 0 {
		return nil, badValue("input", "input must not be empty.")
	}
	rp.conv = slices.Clip(msgs[start:])

	tool, e := pickResponsesTool(req.Tools, req.ToolChoice)
	if e != nil {
		return nil, e
	}
	if tool != nil && msgs[len(msgs)-1].Role == "tool" {
		tool = nil // the answer to a function call's output is text
	}
	echo, e := responsesEcho(&req)
	if e != nil {
		return nil, e
	}
	rp.echo = echo

	var sum convSum
	if e := s.hashConversation(&sum, msgs); e != nil {
		return nil, e
	}
	c := choice{prompt: max(1, len(msgs)+sum.textTokens+(len(req.Tools)+3)/4)}
	maxTok, e := s.maxTokens(req.MaxOutputTokens, c.prompt, "max_output_tokens")
	if e != nil {
		if e.code == "context_length_exceeded" {
			e.param = "input"
		}
		return nil, e
	}
	if e := s.reserve(&c, maxTok); e != nil {
		return nil, e
	}
	s.planAnswer(&c, &sum, tool, maxTok, 0, req.Seed, req.Temperature, req.IgnoreEOS)
	rp.text0 = c.text
	rp.id = string(s.appendID(nil, "resp_"))
	if c.tool != nil {
		rp.itemID = string(s.appendID(nil, "fc_"))
	} else {
		rp.itemID = string(s.appendID(nil, "msg_"))
	}
	p := &plan{ep: epResponses, stream: req.Stream, promptTokens: c.prompt, resp: rp}
	p.one[0] = c
	p.choices = p.one[:]
	return p, nil
}

// appendInput appends the messages the input stands for: a string is one user message; an
// array holds input items, one message each (a function_call is an assistant message with that
// one tool call, a function_call_output a tool message; reasoning items are skipped).
func appendInput(msgs []chatMessage, raw json.RawMessage) ([]chatMessage, *apiError) {
	raw = bytes.TrimSpace(raw)
	if isNull(raw) {
		return nil, badValue("input", "input is required.")
	}
	if raw[0] == '"' {
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, decodeErr(err)
		}
		return append(msgs, chatMessage{Role: "user", Content: messageContent{text: text}}), nil
	}
	var elems []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &elems) != nil {
		return nil, badRequest("invalid_type", "input", "input must be a string or an array of input items.")
	}
	for i, el := range elems {
		field := fmt.Sprintf("input[%d]", i)
		if el[0] != '{' {
			return nil, badRequest("invalid_type", field, field+" must be an object.")
		}
		var it respItem
		if err := json.Unmarshal(el, &it); err != nil {
			return nil, badRequest("invalid_type", field, "invalid "+field+": "+err.Error())
		}
		typ := it.Type
		if typ == "" && it.Role != "" {
			typ = "message"
		}
		switch typ {
		case "message":
			switch it.Role {
			case "user", "assistant", "system", "developer":
			default:
				return nil, badValue(field+".role", "%s.role must be one of user, assistant, system, developer; got %q.", field, it.Role)
			}
			if !it.Content.set {
				return nil, badValue(field+".content", "%s.content is required.", field)
			}
			msgs = append(msgs, chatMessage{Role: it.Role, Content: it.Content.chat()})
		case "function_call":
			if it.CallID == "" {
				return nil, badValue(field+".call_id", "%s.call_id is required.", field)
			}
			if it.Name == "" {
				return nil, badValue(field+".name", "%s.name is required.", field)
			}
			if it.Arguments == nil {
				return nil, badValue(field+".arguments", "%s.arguments is required.", field)
			}
			tc := chatToolCall{ID: it.CallID}
			tc.Function.Name, tc.Function.Arguments = it.Name, *it.Arguments
			msgs = append(msgs, chatMessage{Role: "assistant", ToolCalls: []chatToolCall{tc}})
		case "function_call_output":
			if it.CallID == "" {
				return nil, badValue(field+".call_id", "%s.call_id is required.", field)
			}
			if !it.Output.set {
				return nil, badValue(field+".output", "%s.output is required.", field)
			}
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: it.CallID, Content: it.Output.chat()})
		case "reasoning":
		case "":
			return nil, badValue(field+".type", "%s needs a type or a role.", field)
		default:
			return nil, badValue(field+".type", "%s.type %q is not supported; use message, function_call or function_call_output.", field, typ)
		}
	}
	return msgs, nil
}

// pickResponsesTool is pickTool for Responses tools and tool_choice ({type: "function", name}).
func pickResponsesTool(rawTools, rawChoice json.RawMessage) (*funcDef, *apiError) {
	if isNull(rawTools) {
		return nil, nil
	}
	var tools []respTool
	if err := json.Unmarshal(rawTools, &tools); err != nil {
		return nil, badRequest("invalid_value", "tools", "tools must be an array of tool definitions: "+err.Error())
	}
	var fns []funcDef
	for i := range tools {
		t := &tools[i]
		if t.Type != "function" && t.Type != "" {
			continue // hosted and custom tools are accepted and never called
		}
		if t.Name == "" {
			return nil, badRequest("invalid_value", fmt.Sprintf("tools[%d].name", i), "tools[].name is required.")
		}
		fns = append(fns, funcDef{name: t.Name, params: t.Parameters})
	}
	none, want, e := parseToolChoice(rawChoice, func(c []byte) (string, bool) {
		var named struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(c, &named); err != nil || named.Type != "function" || named.Name == "" {
			return "", false
		}
		return named.Name, true
	})
	if e != nil {
		if e.message == "tool_choice object must name a function." {
			e.message = `tool_choice object must be {"type": "function", "name": ...}.`
		}
		return nil, e
	}
	if none {
		return nil, nil
	}
	return chooseTool(fns, want)
}

// responsesEcho validates the request fields a response object echoes and renders them.
func responsesEcho(req *responsesRequest) ([]byte, *apiError) {
	var b bytes.Buffer
	raw := func(key string, v json.RawMessage, def string) {
		b.WriteString(`,"` + key + `":`)
		if isNull(v) {
			b.WriteString(def)
			return
		}
		_ = json.Compact(&b, v) // valid: decoded already; compact keeps each SSE data line whole
	}
	str := func(key string, v *string) {
		b.WriteString(`,"` + key + `":`)
		if v == nil {
			b.WriteString("null")
			return
		}
		b.Write(openai.AppendString(nil, *v))
	}
	num := func(key string, v *float64, def string) {
		b.WriteString(`,"` + key + `":`)
		if v == nil {
			b.WriteString(def)
			return
		}
		b.Write(strconv.AppendFloat(nil, *v, 'g', -1, 64))
	}
	if !isNull(req.Metadata) {
		var m map[string]string
		if err := json.Unmarshal(req.Metadata, &m); err != nil {
			return nil, badRequest("invalid_type", "metadata", "metadata must be an object of string values.")
		}
	}
	if !isNull(req.Text) {
		var t struct {
			Format *struct {
				Type   string          `json:"type"`
				Name   string          `json:"name"`
				Schema json.RawMessage `json:"schema"`
			} `json:"format"`
		}
		if err := json.Unmarshal(req.Text, &t); err != nil {
			return nil, badRequest("invalid_type", "text", "text must be an object: "+err.Error())
		}
		if f := t.Format; f != nil {
			switch f.Type {
			case "text", "json_object":
			case "json_schema":
				if f.Name == "" {
					return nil, badValue("text.format.name", "text.format.name is required for json_schema.")
				}
				if s := bytes.TrimSpace(f.Schema); len(s) == 0 || s[0] != '{' {
					return nil, badValue("text.format.schema", "text.format.schema must be a JSON Schema object.")
				}
			default:
				return nil, badValue("text.format.type", "text.format.type must be text, json_object or json_schema; got %q.", f.Type)
			}
		}
	}
	str("instructions", req.Instructions)
	b.WriteString(`,"max_output_tokens":`)
	if req.MaxOutputTokens != nil {
		b.Write(strconv.AppendInt(nil, *req.MaxOutputTokens, 10))
	} else {
		b.WriteString("null")
	}
	b.WriteString(`,"max_tool_calls":null`)
	raw("metadata", req.Metadata, "{}")
	b.WriteString(`,"parallel_tool_calls":` + strconv.FormatBool(req.ParallelToolCalls == nil || *req.ParallelToolCalls))
	prev := req.PreviousResponseID
	if prev != nil && *prev == "" {
		prev = nil
	}
	str("previous_response_id", prev)
	b.WriteString(`,"reasoning":null,"service_tier":"auto","store":` + strconv.FormatBool(req.Store == nil || *req.Store))
	num("temperature", req.Temperature, "1.0")
	raw("text", req.Text, `{"format":{"type":"text"}}`)
	raw("tool_choice", req.ToolChoice, `"auto"`)
	raw("tools", req.Tools, "[]")
	b.WriteString(`,"top_logprobs":0`)
	num("top_p", req.TopP, "1.0")
	b.WriteString(`,"truncation":"disabled"`)
	str("user", req.User)
	return b.Bytes(), nil
}

// Stored responses, for previous_response_id: the conversation a response ended (its input
// and output, after the conversation of its own previous response, without instructions).
// Bounded: the oldest go first past maxStoredResponses entries or maxStoredBytes of text.
const (
	maxStoredResponses = 1024
	maxStoredBytes     = 64 << 20
)

type respStore struct {
	mu    sync.Mutex
	m     map[string]storedResp
	order []string // ids, oldest first
	bytes int
}

type storedResp struct {
	conv  []chatMessage
	bytes int
}

func (rs *respStore) get(id string) ([]chatMessage, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.m[id]
	return r.conv, ok
}

func convBytes(conv []chatMessage) int {
	n := 0
	for i := range conv {
		m := &conv[i]
		n += 64 + len(m.ToolCallID)
		m.Content.each(func(t string) { n += len(t) })
		for j := range m.ToolCalls {
			n += len(m.ToolCalls[j].ID) + len(m.ToolCalls[j].Function.Name) + len(m.ToolCalls[j].Function.Arguments)
		}
	}
	return n
}

func (rs *respStore) put(id string, conv []chatMessage) {
	size := convBytes(conv)
	if size > maxStoredBytes {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = make(map[string]storedResp)
	}
	rs.m[id] = storedResp{conv: conv, bytes: size}
	rs.order = append(rs.order, id)
	rs.bytes += size
	for len(rs.m) > maxStoredResponses || rs.bytes > maxStoredBytes {
		old := rs.order[0]
		rs.order[0] = ""
		rs.order = rs.order[1:]
		rs.bytes -= rs.m[old].bytes
		delete(rs.m, old)
	}
}

// storeResponse keeps the finished response's conversation when the request asked for it
// (store, default true). It runs before the response is written, so a client that reads the
// answer can use its id at once.
func (s *Server) storeResponse(p *plan) {
	rp := p.resp
	if !rp.store {
		return
	}
	c := &p.choices[0]
	out := chatMessage{Role: "assistant"}
	if c.tool != nil {
		tc := chatToolCall{ID: c.tool.id}
		tc.Function.Name, tc.Function.Arguments = c.tool.name, c.tool.emittedArgs()
		out.ToolCalls = []chatToolCall{tc}
	} else {
		out.Content.text = string(rp.appendText(nil, c.n))
	}
	s.stored.put(rp.id, append(rp.conv, out))
}

// appendText appends the first n tokens of the text answer (from a copy of its generator).
func (rp *respPlan) appendText(b []byte, n int) []byte {
	g := rp.text0
	for range n {
		b = g.next(b)
	}
	return b
}

func respStatus(c *choice) string {
	if c.finish == "length" {
		return "incomplete"
	}
	return "completed"
}

// appendOutputText appends an output_text content part holding the first n tokens.
func (rp *respPlan) appendOutputText(b []byte, n int) []byte {
	b = append(b, `{"type":"output_text","text":"`...)
	b = rp.appendText(b, n)
	return append(b, `","annotations":[],"logprobs":[]}`...)
}

// appendItem appends the answer's output item: in progress (empty content or arguments) or
// done (all of it).
func (rp *respPlan) appendItem(b []byte, c *choice, done bool) []byte {
	status := "in_progress"
	if done {
		status = respStatus(c)
	}
	if c.tool != nil {
		b = append(b, `{"type":"function_call","id":"`...)
		b = append(b, rp.itemID...)
		b = append(b, `","call_id":"`...)
		b = append(b, c.tool.id...)
		b = append(b, `","name":`...)
		b = openai.AppendString(b, c.tool.name)
		b = append(b, `,"arguments":`...)
		if done {
			b = openai.AppendString(b, c.tool.emittedArgs())
		} else {
			b = append(b, `""`...)
		}
		b = append(b, `,"status":"`...)
		b = append(b, status...)
		return append(b, `"}`...)
	}
	b = append(b, `{"type":"message","id":"`...)
	b = append(b, rp.itemID...)
	b = append(b, `","status":"`...)
	b = append(b, status...)
	b = append(b, `","role":"assistant","content":[`...)
	if done {
		b = rp.appendOutputText(b, c.n)
	}
	return append(b, "]}"...)
}

// appendResponse appends the response object: in progress (no output, no usage) or final.
func (s *Server) appendResponse(b []byte, p *plan, final bool) []byte {
	rp, c := p.resp, &p.choices[0]
	status := "in_progress"
	if final {
		status = respStatus(c)
	}
	b = append(b, `{"id":"`...)
	b = append(b, rp.id...)
	b = append(b, `","object":"response","created_at":`...)
	b = strconv.AppendInt(b, rp.created, 10)
	b = append(b, `,"status":"`...)
	b = append(b, status...)
	b = append(b, `","background":false,"error":null,"incomplete_details":`...)
	if status == "incomplete" {
		b = append(b, `{"reason":"max_output_tokens"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"model":`...)
	b = append(b, s.modelJSON...)
	b = append(b, `,"output":[`...)
	if final {
		b = rp.appendItem(b, c, true)
	}
	b = append(b, `],"usage":`...)
	if final {
		b = append(b, `{"input_tokens":`...)
		b = strconv.AppendInt(b, int64(p.promptTokens), 10)
		b = append(b, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
		b = strconv.AppendInt(b, int64(c.n), 10)
		b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		b = strconv.AppendInt(b, int64(p.promptTokens+c.n), 10)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, rp.echo...)
	return append(b, '}')
}

// Streaming. Every event is `event: TYPE\ndata: {"type":"TYPE","sequence_number":N,...}\n\n`,
// N counting the stream's events from 0; the knobs count these events like chat chunks.

// revent starts event typ in the streamer's buffer (the JSON object is left open).
func (st *streamer) revent(typ string) []byte {
	b := append((*st.bp)[:0], "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: {\"type\":\""...)
	b = append(b, typ...)
	b = append(b, `","sequence_number":`...)
	return strconv.AppendInt(b, int64(st.events), 10)
}

// rsend closes the event's JSON object and sends it.
func (st *streamer) rsend(b []byte) error {
	*st.bp = append(b, "}\n\n"...)
	return st.send()
}

// ritem starts an event about the output item: `,"item_id":…,"output_index":0`.
func (st *streamer) ritem(typ string) []byte {
	b := st.revent(typ)
	b = append(b, `,"item_id":"`...)
	b = append(b, st.p.resp.itemID...)
	return append(b, `","output_index":0`...)
}

// respOpen sends response.created and response.in_progress (right after the headers, before
// the engine, as vLLM does).
func (st *streamer) respOpen() error {
	for _, typ := range [...]string{"response.created", "response.in_progress"} {
		b := append(st.revent(typ), `,"response":`...)
		if err := st.rsend(st.s.appendResponse(b, st.p, false)); err != nil {
			return err
		}
	}
	return nil
}

// respItemAdded sends response.output_item.added (and, for a message, content_part.added).
func (st *streamer) respItemAdded(c *choice) error {
	b := append(st.revent("response.output_item.added"), `,"output_index":0,"item":`...)
	if err := st.rsend(st.p.resp.appendItem(b, c, false)); err != nil {
		return err
	}
	if c.tool != nil {
		return nil
	}
	b = append(st.ritem("response.content_part.added"), `,"content_index":0,"part":`...)
	return st.rsend(st.p.resp.appendOutputText(b, 0))
}

// emitResponses is emit for the Responses API: output_item.added with the first token, then
// a delta event per TokensPerEvent tokens, then the done events once the answer is complete.
func (st *streamer) emitResponses(avail int, done bool) error {
	c := &st.p.choices[0]
	rp := st.p.resp
	tpe := st.s.cfg.TokensPerEvent
	avail = min(avail, c.n)
	for c.emitted < avail {
		if !c.started {
			c.started = true
			if err := st.respItemAdded(c); err != nil {
				return err
			}
			if c.tool != nil {
				c.emitted = 1 // the call header
				continue
			}
		}
		k := min(tpe, avail-c.emitted)
		if k < tpe && !done {
			break
		}
		from, to := c.emitted, c.emitted+k
		var b []byte
		if c.tool != nil {
			b = append(st.ritem("response.function_call_arguments.delta"), `,"delta":`...)
			b = openai.AppendString(b, c.tool.fragment(from, to))
		} else {
			b = append(st.ritem("response.output_text.delta"), `,"content_index":0,"delta":"`...)
			b = c.appendTokens(b, from, to)
			b = append(b, `","logprobs":[]`...)
		}
		c.emitted = to
		if err := st.rsend(b); err != nil {
			return err
		}
	}
	if !done || c.emitted < c.n || c.closed {
		return nil
	}
	c.closed = true
	if !c.started {
		c.started = true
		if err := st.respItemAdded(c); err != nil {
			return err
		}
	}
	if c.tool != nil {
		b := append(st.ritem("response.function_call_arguments.done"), `,"arguments":`...)
		b = openai.AppendString(b, c.tool.emittedArgs())
		if err := st.rsend(b); err != nil {
			return err
		}
	} else {
		b := append(st.ritem("response.output_text.done"), `,"content_index":0,"text":"`...)
		b = rp.appendText(b, c.n)
		if err := st.rsend(append(b, `","logprobs":[]`...)); err != nil {
			return err
		}
		b = append(st.ritem("response.content_part.done"), `,"content_index":0,"part":`...)
		if err := st.rsend(rp.appendOutputText(b, c.n)); err != nil {
			return err
		}
	}
	b := append(st.revent("response.output_item.done"), `,"output_index":0,"item":`...)
	return st.rsend(rp.appendItem(b, c, true))
}

// finishResponses stores the response (unless a knob replaces the last event) and sends response.completed (response.incomplete when
// max_output_tokens cut the answer). The Responses API sends no [DONE].
func (st *streamer) finishResponses() error {
	if st.events != st.kn.dieAfter && st.events != st.kn.errorAfter {
		st.s.storeResponse(st.p) // a response whose last event is replaced by a knob failed
	}
	typ := "response.completed"
	if respStatus(&st.p.choices[0]) == "incomplete" {
		typ = "response.incomplete"
	}
	b := append(st.revent(typ), `,"response":`...)
	return st.rsend(st.s.appendResponse(b, st.p, true))
}
