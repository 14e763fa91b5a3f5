package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"unicode/utf8"
)

// MaxN bounds a request's n (choices per prompt), as OpenAI's API does: every choice is a
// sequence on the model server, and n multiplies the token charge.
const MaxN = 128

// Request is what the policies need to know about a request body, parsed once.
//
// For a Responses request (KindResponses) the fields mean the same things under the
// Responses API's names: MaxTokens is max_output_tokens, Messages counts the input items,
// ResponseFormat is text.format.type, and N is 1 (the API has no n). IncludeUsage is false:
// a Responses stream always reports usage in its terminal event.
type Request struct {
	Kind           Kind
	Body           []byte   // the body exactly as received
	Model          string   // model; "" when absent or null (the route or the model server picks one)
	Stream         bool     // stream
	IncludeUsage   bool     // stream_options.include_usage
	MaxTokens      int      // max_tokens, else max_completion_tokens, else 0; Responses: max_output_tokens
	N              int      // n (default 1)
	Messages       int      // number of chat messages; Responses: input items (a string input is 1)
	Inputs         int      // number of prompts (completions) or inputs (embeddings)
	PromptChars    int      // characters of text the model will see (see ParseRequest)
	PromptTokens   int      // fast estimate of the prompt's tokens (see ParseRequest)
	Depth          int      // maximal structural depth of message content (see ParseRequest)
	Tools          int      // number of tools declared (tools, and the legacy functions)
	ToolChoice     string   // "", "auto", "none", "required", or the function name
	User           string   // user
	Temperature    *float64 // temperature, nil if absent or null
	Seed           *int64   // seed, nil if absent or null
	ResponseFormat string   // response_format.type (Responses: text.format.type): "", "text", "json_object", "json_schema"
	PrefixHash     uint64   // hash of the prompt's first PrefixHashBytes bytes; 0: none (see prefix.go)
	PrefixLen      int      // bytes of prompt text PrefixHash covers, up to PrefixHashBytes; 0 with no hash

	// Log probabilities (see logprobs.go). Logprobs: the client asked for them (chat:
	// logprobs true; completions: logprobs a number; Responses: top_logprobs above 0, or
	// include naming "message.output_text.logprobs"). LogprobsNamed: the body names logprobs
	// or top_logprobs at its top level, whatever the value (null included), so a gateway that
	// would ask the upstream for logprobs leaves the request as it is (vLLM refuses
	// top_logprobs without logprobs true). Echo: completions' echo is true (the answer
	// repeats the prompt, and its logprobs cover the prompt's tokens). They are read
	// leniently: a value of another type is the model server's to refuse.
	Logprobs, LogprobsNamed, Echo bool

	// Responses API only: the server-side state a request refers to or creates. A response
	// is stored by the model server that produced it, so a request that names one must
	// reach that server, and so must a background request's later polls.
	PreviousResponseID string // previous_response_id: the stored response this one continues; "" if none
	Store              *bool  // store: whether the server keeps the response; nil if absent or null (the server's default applies; OpenAI's is to store)
	Background         bool   // background: the server answers at once with a queued response, to be polled
}

// ReadBody reads a request body of at most limit bytes (limit <= 0: no limit). It reads at
// most limit+1 bytes; a longer body is a 413 *Error with code "request_too_large". A
// *http.MaxBytesError from r (http.MaxBytesReader) is mapped the same way. Other read errors
// are returned as they are.
func ReadBody(r io.Reader, limit int64) ([]byte, error) { return ReadBodySized(r, limit, -1) }

// sizedBodyMax bounds the buffer ReadBodySized makes before any byte arrived: a client's
// Content-Length is a claim, and a larger body is grown into as it arrives.
const sizedBodyMax = 64 << 10

// ReadBodySized is ReadBody for a body whose length the request states (size; -1: not
// stated): the buffer is made at that size (up to sizedBodyMax) at once, one allocation
// where io.ReadAll starts at 512 bytes and copies as it doubles.
func ReadBodySized(r io.Reader, limit, size int64) ([]byte, error) {
	most := int64(math.MaxInt64) // the most bytes read: limit+1 tells a longer body
	if limit > 0 && limit < math.MaxInt64 {
		most = limit + 1
	}
	initial := int64(512)
	if size >= 0 {
		initial = size + 1 // the read that sees the end needs room
	}
	buf := make([]byte, 0, min(initial, sizedBodyMax, most))
	for {
		if int64(len(buf)) >= most {
			if limit > 0 {
				return nil, tooLarge(limit)
			}
			return buf, nil
		}
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(int64(cap(buf)), most-int64(cap(buf)))))
		}
		n, err := r.Read(buf[len(buf):int(min(int64(cap(buf)), most))])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if limit > 0 && int64(len(buf)) > limit {
				return nil, tooLarge(limit)
			}
			return buf, nil
		}
		if err != nil {
			return nil, mapReadErr(err)
		}
	}
}

func mapReadErr(err error) error {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		return tooLarge(mb.Limit)
	}
	return err
}

func tooLarge(limit int64) *Error {
	return NewError(http.StatusRequestEntityTooLarge, typeInvalidRequest, codeTooLarge,
		fmt.Sprintf("Request body too large: the limit is %d bytes.", limit))
}

// ParseRequest parses the body of a chat, completion, embedding or Responses request in
// one pass over the bytes, without copying them and without building a tree. For
// KindModels and KindOther it parses nothing and returns a Request with Kind, Body and N = 1.
//
// The model is not required: when it is absent or null, Model is "" and the caller decides
// whether the route supplies one (a model server such as vLLM serves its default model).
// An empty string is an error.
//
// Errors are *Error with status 400 and type "invalid_request_error":
//
//   - "invalid_json": the body is not valid JSON (the message gives the byte offset).
//     Malformed JSON wins over every other error, so this is exactly !json.Valid(body).
//   - "invalid_type": the body is not an object, or a field has the wrong JSON type; the
//     message names the field and the expected type, Param is the field
//     ("messages[2].content", "input[1].arguments").
//   - "missing_field": messages (chat); prompt (completions); input (embeddings and
//     Responses); messages[i].role; input[i].role of a Responses message item (one with
//     no type or type "message"). A null counts as missing.
//   - "invalid_value": an empty model string, empty messages, empty prompt or input array
//     (completions and embeddings), empty embedding input string, negative max_tokens,
//     max_completion_tokens or max_output_tokens, n < 1, an integer out of range, a
//     tool_choice string other than auto/none/required, n above MaxN; and a key that
//     collides with a field Sluice measures (a top-level field such as model, messages,
//     max_tokens, input, or a message's role, content, tool_calls): given twice, or
//     differing from it only by case ("MESSAGES", "Max_Tokens"). Model servers disagree on
//     those (Go's decoder ignores case, Python's keeps the last duplicate), so the gateway
//     and the server would read different requests: a prompt hidden from the guard.
//
// Only the first error is reported. Keys match exactly (JSON keys are case-sensitive, and
// \u escapes in keys are decoded), so that the gateway and the model server read the same
// request. Unknown fields are validated and skipped.
//
// PromptChars counts the characters of: message content text (string content, and the
// "text" and "refusal" of content parts, but not images, audio or files), tool-call
// names and arguments, prompts and embedding inputs given as text, and the JSON of the
// tool declarations (which chat templates render into the prompt).
//
// PromptTokens estimates the prompt's tokens from the same text with the weights of
// EstimateTextTokens, plus the exact count of prompts and inputs given as token IDs, plus
// 4 tokens a chat message and 3 for the reply's priming (chat-template overhead).
//
// A Responses request counts the same way: the instructions (rendered as a system
// message, so 4 tokens of overhead like a message), the input (a string, or the items:
// message content, the name and arguments of a function_call, the output of a
// function_call_output or custom_tool_call_output, the name and input of a
// custom_tool_call, the text of a reasoning item's summary and content parts), and the
// JSON of the tool declarations (flat function tools and built-in tools alike). An item's
// fields are read by name whatever its type, so that it is read in one pass wherever its
// "type" is (vLLM's own types put it last); the checks that depend on the type (a
// message's role, the type of a tool output) are made at the end of the item. Items of
// other types (computer calls, web searches, item references) are validated and only
// those fields are read from them. An empty input array is accepted: a turn may add
// nothing to previous_response_id or the instructions.
//
// Depth is the maximal structural depth of message content, where 1 means flat. Structure
// counts wherever it is in the text, so that JSON pasted into prose, into a markdown code
// fence or into a tool result counts as much as JSON sent as the whole content:
//
//   - a string, number, boolean or null is depth 1; an array or object is one more than its
//     deepest element (an empty one is 1);
//   - text (a string's decoded contents) is as deep as the deepest JSON array or object
//     embedded in it, and 1 if it has none. Text is read once, left to right: each '{' or
//     '[' that is not inside an embedded value starts one, which extends as far as the text
//     continues it as JSON (RFC 8259): to its closing bracket; or to the first character
//     that cannot continue it, which is then read as text again (and may start the next
//     one); or to the end of the text. A value counts with the depth it reached, those left
//     open as if they closed where it ended;
//   - a string inside an embedded value, key or value, is text too: its escapes decoded,
//     it is measured by the same rule and adds its depth to the value's (JSON text in JSON
//     text keeps counting), down to strings 7 levels in strings; a string nested deeper
//     counts one more than the deepest nesting of its brackets. A character outside ASCII
//     (or not UTF-8) is text, which no JSON value holds outside a string;
//   - so "hello" is 1, "{\"a\":1}" is 2, "Process this: {\"a\":[1]} thanks" is 3, a ```json
//     fence counts as the JSON in it, "[[[" is 3, and "{\"a\":\"{\\\"b\\\":1}\"}" is 4. Code,
//     markdown, math and log lines count only what reads as JSON: a '{' not followed by a
//     quoted key or '}', or a '[' not followed by a JSON value or ']', ends at once, so
//     "if (ok) { f(a[i]) }" is 1, "[a link](url)" is 1 and "[[1, 2], [3, 4]]" is 3;
//   - the standard envelopes do not count: the content-parts array, each part object, and
//     the part's payload object named by its type ({"type":"image_url","image_url":{...}}),
//     so text content is 1 whether it is a string or parts; other fields of a part count
//     as values, their strings as text;
//   - tool-call arguments (tool_calls[].function.arguments, and the legacy function_call)
//     are text; when the whole text (but for white space around it) is one JSON object or
//     array, it is an envelope too, so {"city":"Paris"} is 1 and {"q":{"a":1}} is 2;
//   - tool results are message content (role "tool"), measured as above.
//
// Depth is the maximum over all messages (0 if none has content). For completions and
// embeddings, prompts and inputs given as text count the same way (token-ID arrays are 1).
// For Responses, the instructions and every input item count: message and reasoning
// content as content, function_call arguments as tool-call arguments (their object an
// envelope), the output of a function_call_output as a tool result (a string, or content
// parts), a custom tool call's input as text; an output that is an object (a computer
// call's screenshot) counts as a value. The tool declarations do not count.
//
// The measurement is part of the one pass over the body, and allocates nothing unless arrays
// and objects are open more than 256 deep: text is skipped at full speed up to the next
// '{', '[' or escape, and a character inside an embedded value costs one step for each
// level of JSON text it is in (at most 8), so the work is linear in the body whatever it
// holds.
func ParseRequest(kind Kind, body []byte) (*Request, error) {
	req := &Request{Kind: kind, Body: body, N: 1}
	switch kind {
	case KindChat, KindCompletion, KindEmbedding, KindResponses:
	default:
		return req, nil
	}
	p := parser{cur: cur{b: body}, req: req}
	p.parse()
	if p.msg != "" {
		return nil, syntaxError(body, p.off, p.msg)
	}
	if p.err != nil {
		return nil, p.err
	}
	return req, nil
}

func syntaxError(b []byte, off int, msg string) *Error {
	var s string
	if off < len(b) && msg != errEOF {
		s = fmt.Sprintf("Invalid JSON body at byte offset %d: %s (found %q).", off, msg, b[off])
	} else {
		s = fmt.Sprintf("Invalid JSON body at byte offset %d: %s.", off, msg)
	}
	return NewError(http.StatusBadRequest, typeInvalidRequest, codeInvalidJSON, s)
}

// loc names a field for error messages: name[i].field[j].sub, parts left out when empty or
// negative. It is built into a string only when an error is reported.
type loc struct {
	name  string
	i     int
	field string
	j     int
	sub   string
}

func at(name string) loc { return loc{name: name, i: -1, j: -1} }

func (l loc) String() string {
	s := l.name
	if l.i >= 0 {
		s += "[" + strconv.Itoa(l.i) + "]"
	}
	if l.field != "" {
		s += "." + l.field
	}
	if l.j >= 0 {
		s += "[" + strconv.Itoa(l.j) + "]"
	}
	if l.sub != "" {
		s += "." + l.sub
	}
	return s
}

type parser struct {
	cur
	req     *Request
	err     *Error // first semantic error
	stats   textStats
	tokenID int         // prompt tokens given as token IDs
	ts      textScanner // measures the depth of text

	prefix, toolsPrefix prefixHasher // Request.PrefixHash: prompt text, tool declarations
	instrPrefix         prefixHasher // Responses: the instructions, which may come before or after the input

	haveModel, haveMessages, havePrompt bool
	seenTop                             uint64 // measured top-level keys met (see measuredKey)
	haveInput, haveInstructions         bool   // Responses
	maxTokens, maxCompletion            int64
	haveMax, haveMaxCompletion          bool
}

func (p *parser) semantic(code string, l loc, msg string) {
	if p.err == nil {
		p.err = NewError(http.StatusBadRequest, typeInvalidRequest, code, msg)
		p.err.Param = l.String()
	}
}

// typeErr records a wrong type at the cursor and skips the value.
func (p *parser) typeErr(l loc, want string) {
	if p.err == nil {
		got := typeName(p.peek())
		p.semantic(codeInvalidType, l, fmt.Sprintf("Invalid type for '%s': expected %s, but got %s instead.", l, want, got))
	}
	p.skip(nil)
}

func (p *parser) valueErr(l loc, why string) {
	if p.err == nil {
		p.semantic(codeInvalidValue, l, fmt.Sprintf("Invalid value for '%s': %s.", l, why))
	}
}

func (p *parser) depth(d int) { p.req.Depth = max(p.req.Depth, d) }

func (p *parser) parse() {
	req := p.req
	if p.peek() != '{' {
		// Report malformed JSON as such before saying it is not an object.
		if p.i >= len(p.b) {
			p.fail(p.i, errEOF)
			return
		}
		got := typeName(p.b[p.i])
		p.skip(nil)
		if p.ok() {
			if p.peek(); p.i < len(p.b) {
				p.fail(p.i, errTrailing)
				return
			}
			p.semantic(codeInvalidType, at(""), "Invalid type for the request body: expected an object, but got "+got+" instead.")
		}
		return
	}
	p.i++
	// The Responses API names some fields differently and has no n, stream_options,
	// response_format or functions: a Responses request's fields of the other APIs, and the
	// other APIs' Responses fields, are skipped as unknown (the model server ignores them).
	resp := req.Kind == KindResponses
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		kt := keyText(key, esc, kb[:])
		var keyOK bool
		if p.seenTop, keyOK = p.measuredKey(kt, key, esc, topKeys, p.seenTop, loc{i: -1, j: -1}); !keyOK {
			p.skip(nil)
			continue
		}
		switch string(kt) {
		case "stream_options", "max_tokens", "max_completion_tokens", "n", "response_format", "functions", "messages", "prompt":
			if resp {
				p.skip(nil)
				continue
			}
		case "max_output_tokens", "instructions", "text", "previous_response_id", "store", "background":
			if !resp {
				p.skip(nil)
				continue
			}
		}
		switch string(kt) {
		case "model":
			if raw, esc, ok := p.optString(at("model"), "a string"); ok {
				p.haveModel = true
				req.Model = modelName(decoded(raw, esc))
			} else {
				p.haveModel, req.Model = false, ""
			}
		case "stream":
			req.Stream, _ = p.optBool(at("stream"))
		case "stream_options":
			p.streamOptions()
		case "max_tokens":
			p.maxTokens, p.haveMax = p.optCount(at("max_tokens"), 0)
		case "max_completion_tokens":
			p.maxCompletion, p.haveMaxCompletion = p.optCount(at("max_completion_tokens"), 0)
		case "max_output_tokens":
			p.maxTokens, p.haveMax = p.optCount(at("max_output_tokens"), 0)
		case "n":
			if n, ok := p.optCount(at("n"), 1); ok && n <= MaxN {
				req.N = int(n)
			} else {
				if ok {
					p.valueErr(at("n"), fmt.Sprintf("must be at most %d, got %d", MaxN, n))
				}
				req.N = 1
			}
		case "instructions":
			p.instructions()
		case "text":
			p.textConfig()
		case "previous_response_id":
			if raw, esc, ok := p.optString(at("previous_response_id"), "a string"); ok {
				req.PreviousResponseID = string(decoded(raw, esc))
			} else {
				req.PreviousResponseID = ""
			}
		case "store":
			req.Store = nil
			if v, ok := p.optBool(at("store")); ok {
				req.Store = &v
			}
		case "background":
			req.Background, _ = p.optBool(at("background"))
		case "user":
			if raw, esc, ok := p.optString(at("user"), "a string"); ok {
				req.User = string(decoded(raw, esc))
			} else {
				req.User = ""
			}
		case "temperature":
			req.Temperature = p.optFloat(at("temperature"))
		case "seed":
			req.Seed = nil
			if v, ok := p.optInt(at("seed")); ok {
				req.Seed = &v
			}
		case "response_format":
			p.responseFormat()
		case "tools":
			p.tools("tools")
		case "functions":
			p.tools("functions")
		case "tool_choice":
			p.toolChoice()
		case "messages":
			if req.Kind == KindChat {
				p.messages()
			} else {
				p.skip(nil)
			}
		case "prompt":
			if req.Kind == KindCompletion {
				p.prompts("prompt", false)
			} else {
				p.skip(nil)
			}
		case "input":
			switch req.Kind {
			case KindEmbedding:
				p.prompts("input", true)
			case KindResponses:
				p.input()
			default:
				p.skip(nil)
			}
		case "logprobs", "top_logprobs", "echo", "include":
			p.logprobsField(string(kt))
		default:
			p.skip(nil)
		}
	}
	if !p.ok() {
		return
	}
	if p.peek(); p.i < len(p.b) {
		p.fail(p.i, errTrailing)
		return
	}
	// Required fields and cross-field values. A missing model is the caller's to settle.
	if p.haveModel && req.Model == "" {
		p.valueErr(at("model"), "must not be empty")
	}
	switch req.Kind {
	case KindChat:
		if !p.haveMessages {
			p.semantic(codeMissingField, at("messages"), "Missing required parameter: 'messages'.")
		} else if req.Messages == 0 {
			p.valueErr(at("messages"), "must contain at least one message")
		}
	case KindCompletion:
		if !p.havePrompt {
			p.semantic(codeMissingField, at("prompt"), "Missing required parameter: 'prompt'.")
		}
	case KindEmbedding:
		if !p.havePrompt {
			p.semantic(codeMissingField, at("input"), "Missing required parameter: 'input'.")
		}
	case KindResponses:
		if !p.haveInput {
			p.semantic(codeMissingField, at("input"), "Missing required parameter: 'input'.")
		}
	}
	switch {
	case p.haveMax:
		req.MaxTokens = int(p.maxTokens)
	case p.haveMaxCompletion:
		req.MaxTokens = int(p.maxCompletion)
	}
	req.PromptChars = p.stats.chars
	switch req.Kind {
	case KindEmbedding:
	case KindResponses:
		req.PrefixHash, req.PrefixLen = prefixHashWith(&p.instrPrefix, &p.prefix, &p.toolsPrefix)
	default:
		if req.PrefixHash = prefixHash(&p.prefix, &p.toolsPrefix); req.PrefixHash != 0 {
			req.PrefixLen = p.prefix.n
		}
	}
	req.PromptTokens = p.stats.tokens() + p.tokenID
	switch msgs := req.Messages; req.Kind {
	case KindChat:
		if msgs > 0 {
			req.PromptTokens += 4*msgs + 3
		}
	case KindResponses:
		if p.haveInstructions {
			msgs++ // the instructions are the system message
		}
		if msgs > 0 {
			req.PromptTokens += 4*msgs + 3
		}
	}
}

// optString reads a string or null. present is false for null (and for a wrong type,
// which is recorded).
func (p *parser) optString(l loc, want string) (raw []byte, esc bool, present bool) {
	switch p.peek() {
	case '"':
		return p.str()
	case 'n':
		p.skip(nil)
		return nil, false, false
	}
	p.typeErr(l, want+" or null")
	return nil, false, false
}

func (p *parser) optBool(l loc) (v, present bool) {
	switch p.peek() {
	case 't', 'f':
		v = p.b[p.i] == 't'
		p.skip(nil)
		return v, p.ok()
	case 'n':
		p.skip(nil)
		return false, false
	}
	p.typeErr(l, "a boolean or null")
	return false, false
}

// optInt reads an integer or null. A number with a fraction or exponent is accepted when
// its value is integral (as Python's JSON decoders do for 2.0 with lax int fields).
func (p *parser) optInt(l loc) (int64, bool) {
	c := p.peek()
	if c == 'n' {
		p.skip(nil)
		return 0, false
	}
	if c != '-' && (c < '0' || c > '9') {
		p.typeErr(l, "an integer or null")
		return 0, false
	}
	s, ok := p.number()
	if !ok {
		return 0, false
	}
	if v, ok := parseInt(s); ok {
		return v, true
	}
	f, err := strconv.ParseFloat(string(s), 64)
	switch {
	case err == nil && f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63:
		return int64(f), true
	case err == nil && f != math.Trunc(f):
		if p.err == nil {
			p.semantic(codeInvalidType, l, fmt.Sprintf("Invalid type for '%s': expected an integer or null, but got a decimal number instead.", l))
		}
	default:
		p.valueErr(l, "integer out of range")
	}
	return 0, false
}

// optCount reads a non-negative count (or null) that must be at least lo.
func (p *parser) optCount(l loc, lo int64) (int64, bool) {
	v, ok := p.optInt(l)
	if !ok {
		return 0, false
	}
	if v < lo {
		p.valueErr(l, fmt.Sprintf("must be at least %d, got %d", lo, v))
		return 0, false
	}
	if v > math.MaxInt32 {
		p.valueErr(l, "integer out of range")
		return 0, false
	}
	return v, true
}

func (p *parser) optFloat(l loc) *float64 {
	c := p.peek()
	if c == 'n' {
		p.skip(nil)
		return nil
	}
	if c != '-' && (c < '0' || c > '9') {
		p.typeErr(l, "a number or null")
		return nil
	}
	s, ok := p.number()
	if !ok {
		return nil
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil {
		p.valueErr(l, "number out of range")
		return nil
	}
	return &f
}

func (p *parser) streamOptions() {
	switch p.peek() {
	case 'n':
		p.skip(nil)
		p.req.IncludeUsage = false
		return
	case '{':
	default:
		p.typeErr(at("stream_options"), "an object or null")
		return
	}
	p.i++
	p.req.IncludeUsage = false
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			return
		}
		if equalString(key, esc, "include_usage") {
			p.req.IncludeUsage, _ = p.optBool(loc{name: "stream_options", i: -1, j: -1, field: "include_usage"})
		} else {
			p.skip(nil)
		}
	}
}

func (p *parser) responseFormat() {
	p.req.ResponseFormat = ""
	switch p.peek() {
	case 'n':
		p.skip(nil)
		return
	case '{':
	default:
		p.typeErr(at("response_format"), "an object or null")
		return
	}
	p.i++
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			return
		}
		if equalString(key, esc, "type") {
			l := loc{name: "response_format", i: -1, j: -1, field: "type"}
			if raw, esc, ok := p.optString(l, "a string"); ok {
				p.req.ResponseFormat = formatName(raw, esc)
			}
		} else {
			p.skip(nil)
		}
	}
}

// formatName returns a response format's type, without allocating for the known ones.
func formatName(raw []byte, esc bool) string {
	var buf [16]byte
	switch string(keyText(raw, esc, buf[:])) {
	case "text":
		return "text"
	case "json_object":
		return "json_object"
	case "json_schema":
		return "json_schema"
	}
	return string(decoded(raw, esc))
}

// textConfig reads a Responses request's "text": {"format":{"type":...,"name","schema",
// "strict"},"verbosity":...}; ResponseFormat is text.format.type.
func (p *parser) textConfig() {
	p.req.ResponseFormat = ""
	switch p.peek() {
	case 'n':
		p.skip(nil)
		return
	case '{':
	default:
		p.typeErr(at("text"), "an object or null")
		return
	}
	p.i++
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			return
		}
		if !equalString(key, esc, "format") {
			p.skip(nil)
			continue
		}
		l := loc{name: "text", i: -1, field: "format", j: -1}
		p.req.ResponseFormat = ""
		switch p.peek() {
		case 'n':
			p.skip(nil)
			continue
		case '{':
		default:
			p.typeErr(l, "an object or null")
			continue
		}
		p.i++
		l.sub = "type"
		for f2 := true; ; {
			key, esc, ok := p.member(&f2)
			if !ok {
				break
			}
			if !equalString(key, esc, "type") {
				p.skip(nil)
				continue
			}
			p.req.ResponseFormat = ""
			if raw, esc, ok := p.optString(l, "a string"); ok {
				p.req.ResponseFormat = formatName(raw, esc)
			}
		}
	}
}

// instructions reads a Responses request's instructions: prompt text, rendered as the
// system message, hashed apart from the input (clients send it before or after "input").
func (p *parser) instructions() {
	p.haveInstructions = false
	p.instrPrefix = prefixHasher{} // the last "instructions" wins
	switch p.peek() {
	case 'n':
		p.skip(nil)
		return
	case '"':
		if raw, d, _, ok := p.strText(&p.stats, &p.ts); ok {
			p.haveInstructions = true
			p.depth(d)
			p.instrPrefix.write(raw)
			p.instrPrefix.sep()
		}
		return
	}
	p.typeErr(at("instructions"), "a string or null")
}

// tools counts the declared tools and adds their JSON to the prompt text.
func (p *parser) tools(name string) {
	switch p.peek() {
	case 'n':
		p.skip(nil)
		return
	case '[':
	default:
		p.typeErr(at(name), "an array or null")
		return
	}
	start := p.i
	p.i++
	n := 0
	for first := true; p.elem(&first); n++ {
		if p.peek() != '{' {
			p.typeErr(loc{name: name, i: n, j: -1}, "an object")
			continue
		}
		p.skip(nil)
	}
	if p.ok() {
		p.req.Tools += n
		p.stats.addRaw(p.b[start:p.i])
		if !p.toolsPrefix.full() {
			p.toolsPrefix.write(p.b[start:p.i])
		}
	}
}

func (p *parser) toolChoice() {
	req := p.req
	req.ToolChoice = ""
	switch p.peek() {
	case 'n':
		p.skip(nil)
		return
	case '"':
		raw, esc, ok := p.str()
		if !ok {
			return
		}
		switch {
		case equalString(raw, esc, "auto"):
			req.ToolChoice = "auto"
		case equalString(raw, esc, "none"):
			req.ToolChoice = "none"
		case equalString(raw, esc, "required"):
			req.ToolChoice = "required"
		default:
			p.valueErr(at("tool_choice"), `must be "auto", "none", "required" or an object naming a tool`)
		}
		return
	case '{':
	default:
		p.typeErr(at("tool_choice"), "a string or an object")
		return
	}
	// {"type":"function","function":{"name":"f"}} (also "custom"); Responses:
	// {"type":"function","name":"f"} (also "custom", "mcp"); else the type.
	p.i++
	var typ, name []byte
	resp := req.Kind == KindResponses
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "type":
			if p.peek() == '"' {
				raw, esc, ok := p.str()
				if ok {
					typ = decoded(raw, esc)
				}
				continue
			}
			p.skip(nil)
		case "name":
			if resp && p.peek() == '"' {
				if raw, esc, ok := p.str(); ok {
					name = decoded(raw, esc)
				}
				continue
			}
			p.skip(nil)
		case "function", "custom":
			if resp || p.peek() != '{' {
				p.skip(nil)
				continue
			}
			p.i++
			for f2 := true; ; {
				k2, e2, ok := p.member(&f2)
				if !ok {
					break
				}
				if equalString(k2, e2, "name") && p.peek() == '"' {
					if raw, esc, ok := p.str(); ok {
						name = decoded(raw, esc)
					}
					continue
				}
				p.skip(nil)
			}
		default:
			p.skip(nil)
		}
	}
	switch {
	case name != nil:
		req.ToolChoice = string(name)
	case typ != nil:
		req.ToolChoice = string(typ)
	}
}

// modelNames holds the model names requests named last, a slot for each of a few: a
// gateway's requests name a few models, whose strings are then made once each, not once a
// request. A name that meets another in its slot replaces it; names longer than
// modelNameMax are not kept. What clients send can take no more than the slots.
var modelNames [16]atomic.Pointer[string]

const modelNameMax = 128

// modelName is string(b), the string made before for the same bytes when its slot holds it.
func modelName(b []byte) string {
	if len(b) == 0 || len(b) > modelNameMax {
		return string(b)
	}
	slot := &modelNames[(len(b)*31+int(b[len(b)-1])*7+int(b[len(b)/2]))&(len(modelNames)-1)]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}

// decoded returns a string's decoded contents; raw itself when it has no escapes.
func decoded(raw []byte, esc bool) []byte {
	if !esc {
		return raw
	}
	return appendUnescape(nil, raw)
}

func (p *parser) messages() {
	switch p.peek() {
	case 'n':
		p.skip(nil)
		p.haveMessages = false
		return
	case '[':
	default:
		p.typeErr(at("messages"), "an array")
		return
	}
	p.haveMessages = true
	p.req.Messages = 0
	p.prefix = prefixHasher{} // the last "messages" wins
	p.i++
	for first, i := true, 0; p.elem(&first); i++ {
		p.message(i)
	}
}

// logprobsField reads a top-level field that asks for log probabilities (see
// Request.Logprobs), leniently: a value of another type asks for nothing and is skipped.
func (p *parser) logprobsField(key string) {
	req := p.req
	var named, asked bool
	switch {
	case key == "logprobs" && req.Kind == KindChat:
		named = true
		asked = p.peek() == 't'
		p.skip(nil)
	case key == "logprobs" && req.Kind == KindCompletion:
		named = true
		c := p.peek()
		asked = c == '-' || c >= '0' && c <= '9'
		p.skip(nil)
	case key == "top_logprobs" && (req.Kind == KindChat || req.Kind == KindResponses):
		named = true
		c := p.peek()
		if p.skip(nil); req.Kind == KindResponses && c >= '1' && c <= '9' {
			asked = true
		}
	case key == "echo" && req.Kind == KindCompletion:
		req.Echo = p.peek() == 't'
		p.skip(nil)
	case key == "include" && req.Kind == KindResponses:
		asked = p.includesLogprobs() // include is for more than logprobs: not named for them

	default:
		p.skip(nil)
	}
	req.LogprobsNamed = req.LogprobsNamed || named
	req.Logprobs = req.Logprobs || asked
}

// includesLogprobs reads the Responses API's include list: whether it names
// "message.output_text.logprobs".
func (p *parser) includesLogprobs() bool {
	if p.peek() != '[' {
		p.skip(nil)
		return false
	}
	p.i++
	found := false
	for first := true; p.elem(&first); {
		if p.peek() != '"' {
			p.skip(nil)
			continue
		}
		if raw, esc, ok := p.str(); ok && equalString(raw, esc, "message.output_text.logprobs") {
			found = true
		}
	}
	return found
}

// topKeys are the top-level fields Sluice measures, and messageKeys a message's: a key that
// differs from one of them only by case ("MESSAGES", "Max_Tokens"), or one given twice, is
// refused. Model servers disagree on both (Go's case-insensitive decoder, as Ollama's, reads
// "MESSAGES" as messages; Python's json keeps the last of two), so such a body would be
// measured one way and served another: a prompt hidden from the guard and the rate limit.
var (
	topKeys = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens",
		"n", "user", "tools", "functions", "tool_choice", "messages", "prompt", "input", "instructions", "response_format", "text",
		"previous_response_id", "store", "background", "temperature", "seed"}
	messageKeys = []string{"role", "content", "tool_calls", "function_call"}
)

// measuredKey checks one object key against the measured keys of its object (at most 64):
// false, with the 400 recorded, when it repeats one (seen holds those met, and is returned
// with this one added) or differs from one only by case. Other keys pass (true).
func (p *parser) measuredKey(kt, raw []byte, esc bool, keys []string, seen uint64, l loc) (uint64, bool) {
	if kt == nil && esc {
		kt = raw // a long escaped key is none of the measured ones exactly
	}
	wide := !ascii(kt) // once, not for each measured key shorter than it
	for i, k := range keys {
		if len(kt) < len(k) || len(kt) > len(k) && !wide {
			continue // neither equal nor folding to it (see foldEqual)
		}
		switch {
		case string(kt) == k:
			if seen&(1<<i) != 0 {
				l.sub = k
				if l.name == "" {
					l = at(k)
				}
				p.semantic(codeInvalidValue, l, fmt.Sprintf("Duplicate key '%s': servers disagree on which of the two counts, so the request is refused.", k))
				return seen, false
			}
			return seen | 1<<i, true
		case foldEqual(kt, k, wide):
			name := string(kt)
			l.sub = name
			if l.name == "" {
				l = at(name)
			}
			p.semantic(codeInvalidValue, l, "Key '"+name+"' differs from '"+k+"' only by case: some servers read it as '"+k+"', so the request is refused.")
			return seen, false
		}
	}
	return seen, true
}

// foldEqual reports whether b equals s under Unicode simple case folding, as encoding/json
// matches keys to fields (s is lower case ASCII). Beyond ASCII case, two runes fold to ASCII
// letters: the Kelvin sign K (U+212A) to k and the long s ſ (U+017F) to s, so that a Go
// server reads "max_to\u212aens" as max_tokens. b is the decoded key.
//
// Those runes are two or three bytes long, so a key that folds to s is s's length when it is
// ASCII and longer when it is not: the lengths decide first, before any byte is read (most
// keys compared are another field's). wide is whether b has a byte beyond ASCII (!ascii(b),
// which the caller works out once for the keys it compares b with).
func foldEqual(b []byte, s string, wide bool) bool {
	if len(b) != len(s) {
		return len(b) > len(s) && wide && bytes.EqualFold(b, []byte(s))
	}
	for i := range len(b) {
		c := b[i]
		if c >= utf8.RuneSelf {
			return false // a rune beyond ASCII makes the key longer than what it folds to
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func (p *parser) message(i int) {
	if p.peek() != '{' {
		p.typeErr(loc{name: "messages", i: i, j: -1}, "an object")
		return
	}
	p.i++
	p.req.Messages++
	hasRole := false
	var seen uint64
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		kt := keyText(key, esc, kb[:])
		var keyOK bool
		if seen, keyOK = p.measuredKey(kt, key, esc, messageKeys, seen, loc{name: "messages", i: i, j: -1}); !keyOK {
			p.skip(nil)
			continue
		}
		switch string(kt) {
		case "role":
			_, _, hasRole = p.optString(loc{name: "messages", i: i, field: "role", j: -1}, "a string")
		case "content":
			p.content(i)
		case "tool_calls":
			p.toolCalls(i)
		case "function_call":
			p.function(loc{name: "messages", i: i, field: "function_call", j: -1})
		default:
			p.skip(nil)
		}
	}
	if !hasRole && p.ok() {
		p.semantic(codeMissingField, loc{name: "messages", i: i, field: "role", j: -1},
			fmt.Sprintf("Missing required parameter: 'messages[%d].role'.", i))
	}
}

// text reads a string of content at the cursor, counts it, measures its depth and adds it
// to the prefix hash.
func (p *parser) text() {
	if raw, d, _, ok := p.strText(&p.stats, &p.ts); ok {
		p.depth(d)
		p.hashText(raw)
	}
}

// hashText adds one piece of prompt text (raw, as in the body) to the prefix hash.
func (p *parser) hashText(raw []byte) {
	if !p.prefix.full() {
		p.prefix.write(raw)
		p.prefix.sep()
	}
}

func (p *parser) content(i int) { p.contentAt(loc{name: "messages", i: i, field: "content", j: -1}) }

// contentAt measures message content at the cursor (a string, content parts, or null);
// l names it for errors.
func (p *parser) contentAt(l loc) {
	switch p.peek() {
	case '"':
		p.text()
		return
	case 'n':
		p.skip(nil)
		return
	case '[':
	default:
		p.typeErr(l, "a string, an array of content parts, or null")
		return
	}
	p.i++
	for first, j := true, 0; p.elem(&first); j++ {
		if p.peek() != '{' {
			l.j = j
			p.typeErr(l, "an object")
			continue
		}
		p.part()
	}
}

// part measures one content part: {"type":"text","text":"..."}, {"type":"image_url",
// "image_url":{"url":"..."}}, ...
func (p *parser) part() {
	typ, typEsc := p.partType()
	p.i++ // '{'
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			return
		}
		switch {
		case equalString(key, esc, "type"):
			p.skip(nil)
		case equalString(key, esc, "text") || equalString(key, esc, "refusal"):
			if p.peek() == '"' {
				p.text()
				continue
			}
			p.depth(p.skip(&p.ts))
		case typ != nil && p.peek() == '{' && sameKey(key, esc, typ, typEsc):
			// The payload object named by the type is an envelope.
			p.depth(max(p.skip(&p.ts)-1, 1))
		default:
			p.depth(p.skip(&p.ts))
		}
	}
}

// partType finds the raw "type" of the part object at the cursor without moving it.
func (p *parser) partType() (raw []byte, esc bool) {
	c := cur{b: p.b, i: p.i + 1}
	for first := true; ; {
		key, kesc, ok := c.member(&first)
		if !ok {
			return nil, false
		}
		if equalString(key, kesc, "type") {
			if c.peek() == '"' {
				raw, esc, _ := c.str()
				return raw, esc
			}
			return nil, false
		}
		c.skip(nil)
	}
}

func sameKey(a []byte, aesc bool, b []byte, besc bool) bool {
	if !aesc && !besc {
		return string(a) == string(b)
	}
	var ab, bb [64]byte
	ad, bd := keyText(a, aesc, ab[:]), keyText(b, besc, bb[:])
	return ad != nil && string(ad) == string(bd)
}

func (p *parser) toolCalls(i int) {
	l := loc{name: "messages", i: i, field: "tool_calls", j: -1}
	switch p.peek() {
	case 'n':
		p.skip(nil)
		return
	case '[':
	default:
		p.typeErr(l, "an array or null")
		return
	}
	p.i++
	for first, j := true, 0; p.elem(&first); j++ {
		l.j = j
		if p.peek() != '{' {
			p.typeErr(l, "an object")
			continue
		}
		p.i++
		for f2 := true; ; {
			key, esc, ok := p.member(&f2)
			if !ok {
				break
			}
			if equalString(key, esc, "function") {
				l.sub = "function"
				p.function(l)
				l.sub = ""
				continue
			}
			p.skip(nil)
		}
	}
}

// function measures {"name":"...","arguments":"..."} of a tool call or legacy function call.
func (p *parser) function(l loc) {
	switch p.peek() {
	case 'n':
		p.skip(nil)
		return
	case '{':
	default:
		p.typeErr(l, "an object")
		return
	}
	p.i++
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			return
		}
		switch {
		case equalString(key, esc, "name"):
			if p.peek() == '"' {
				if raw, _, ok := p.strStats(&p.stats); ok {
					p.hashText(raw)
				}
				continue
			}
			p.skip(nil)
		case equalString(key, esc, "arguments"):
			al := l
			switch al.sub {
			case "":
				al.sub = "arguments"
			case "function": // tool_calls[j].function: no concatenation on the common path
				al.sub = "function.arguments"
			default:
				al.sub += ".arguments"
			}
			p.arguments(al)
		default:
			p.skip(nil)
		}
	}
}

// arguments measures tool-call arguments at the cursor: a string (when it is JSON text, its
// top-level object is an envelope) or null; anything else is a type error at l.
func (p *parser) arguments(l loc) {
	switch p.peek() {
	case '"':
		raw, d, whole, ok := p.strText(&p.stats, &p.ts)
		if !ok {
			return
		}
		p.hashText(raw)
		if whole {
			d = max(d-1, 1) // the arguments object is an envelope
		}
		p.depth(d)
	case 'n':
		p.skip(nil)
	default:
		p.typeErr(l, "a string")
	}
}

// input reads a Responses request's input: a string (one user message) or an array of
// items.
func (p *parser) input() {
	req := p.req
	req.Messages = 0
	p.prefix = prefixHasher{} // the last "input" wins
	switch p.peek() {
	case 'n':
		p.skip(nil)
		p.haveInput = false
		return
	case '"':
		p.haveInput = true
		req.Messages = 1
		p.text()
		return
	case '[':
	default:
		p.typeErr(at("input"), "a string or an array of input items")
		return
	}
	p.haveInput = true
	p.i++
	for first, i := true, 0; p.elem(&first); i++ {
		p.inputItem(i)
	}
}

// inputItem measures one input item: a message ({"role","content"}, type absent or
// "message"), a function_call ({"call_id","name","arguments"}), a function_call_output
// ({"call_id","output"}), a reasoning item ({"summary","content"}), a custom tool call or
// its output, or another type (validated and skipped). The fields are read by name,
// whatever the type and wherever "type" is; the checks that need the type come at the end.
func (p *parser) inputItem(i int) {
	l := loc{name: "input", i: i, j: -1}
	if p.peek() != '{' {
		p.typeErr(l, "an object")
		return
	}
	p.i++
	p.req.Messages++
	var (
		typ              []byte
		typEsc           bool
		hasType, hasRole bool
		output           byte // the first byte of an "output" that is not a string, array or null
	)
	for first := true; ; {
		key, esc, ok := p.member(&first)
		if !ok {
			break
		}
		var kb [32]byte
		switch string(keyText(key, esc, kb[:])) {
		case "type":
			l.field = "type"
			typ, typEsc, hasType = p.optString(l, "a string")
		case "role":
			l.field = "role"
			_, _, hasRole = p.optString(l, "a string")
		case "content":
			l.field = "content"
			p.contentAt(l)
		case "summary":
			if p.peek() == '[' {
				l.field = "summary"
				p.contentAt(l)
			} else {
				p.skip(nil)
			}
		case "name": // a function's name
			if p.peek() == '"' {
				if raw, _, ok := p.strStats(&p.stats); ok {
					p.hashText(raw)
				}
				continue
			}
			p.skip(nil)
		case "input": // a custom tool call's input: text
			if p.peek() == '"' {
				p.text()
				continue
			}
			p.skip(nil)
		case "arguments":
			l.field = "arguments"
			p.arguments(l)
		case "output":
			switch c := p.peek(); c {
			case '"':
				p.text() // a tool result, measured as content
			case '[':
				l.field = "output"
				p.contentAt(l)
			case 'n':
				p.skip(nil)
			default:
				output = c // fine for other items (a computer call's screenshot object)
				p.depth(p.skip(&p.ts))
			}
		default:
			p.skip(nil)
		}
		l.field, l.j = "", -1
	}
	if !p.ok() {
		return
	}
	switch {
	case !hasType || equalString(typ, typEsc, "message"):
		if !hasRole {
			l.field = "role"
			p.semantic(codeMissingField, l, fmt.Sprintf("Missing required parameter: '%s'.", l))
		}
	case output != 0 && (equalString(typ, typEsc, "function_call_output") || equalString(typ, typEsc, "custom_tool_call_output")):
		if p.err == nil {
			l.field = "output"
			p.semantic(codeInvalidType, l, fmt.Sprintf("Invalid type for '%s': expected a string or an array of content parts, but got %s instead.", l, typeName(output)))
		}
	}
}

const promptTypes = "a string, an array of strings, an array of integers, or an array of integer arrays"

// prompts reads a completion prompt or an embedding input: string | []string | []int | [][]int.
func (p *parser) prompts(name string, embedding bool) {
	req := p.req
	req.Inputs = 0
	p.prefix = prefixHasher{} // the last "prompt" wins
	switch p.peek() {
	case 'n':
		p.skip(nil)
		p.havePrompt = false
		return
	case '"':
		p.havePrompt = true
		req.Inputs = 1
		if embedding && p.i+1 < len(p.b) && p.b[p.i+1] == '"' {
			p.valueErr(at(name), "must not be an empty string")
		}
		p.text()
		return
	case '[':
	default:
		p.typeErr(at(name), promptTypes)
		return
	}
	p.havePrompt = true
	p.i++
	var form byte // '"', '0' or '[' after the first element
	n := 0
	for first := true; p.elem(&first); n++ {
		c := p.peek()
		if c == '-' || (c >= '0' && c <= '9') {
			c = '0'
		}
		if form == 0 {
			if c != '"' && c != '0' && c != '[' {
				p.typeErr(loc{name: name, i: n, j: -1}, promptTypes)
				continue
			}
			form = c
		}
		if c != form {
			p.typeErr(loc{name: name, i: n, j: -1}, formName(form))
			continue
		}
		switch form {
		case '"':
			p.text()
		case '0':
			p.tokenIDs(loc{name: name, i: n, j: -1})
		case '[':
			p.i++
			for f2, j := true, 0; p.elem(&f2); j++ {
				if c := p.peek(); c != '-' && (c < '0' || c > '9') {
					p.typeErr(loc{name: name, i: n, j: j}, "an integer")
					continue
				}
				p.tokenIDs(loc{name: name, i: n, j: j})
			}
			p.depth(1)
		}
	}
	if !p.ok() {
		return
	}
	switch form {
	case 0:
		p.valueErr(at(name), "must not be empty")
	case '0':
		req.Inputs = 1
		p.depth(1)
	default:
		req.Inputs = n
	}
}

// tokenIDs reads one integer token ID at the cursor.
func (p *parser) tokenIDs(l loc) {
	s, ok := p.number()
	if !ok {
		return
	}
	if _, ok := parseInt(s); !ok {
		if p.err == nil {
			p.semantic(codeInvalidType, l, fmt.Sprintf("Invalid type for '%s': expected an integer token ID, but got %s instead.", l, s))
		}
		return
	}
	p.tokenID++
}

func formName(form byte) string {
	switch form {
	case '"':
		return "a string, like the first element"
	case '0':
		return "an integer, like the first element"
	}
	return "an array of integers, like the first element"
}
