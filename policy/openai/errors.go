package openai

import (
	"net/http"
	"strconv"
	"time"
)

// Error is an OpenAI-shaped error with its HTTP status. It is both a Go error and what the
// client gets: WriteError sends it as a response, SSE as an in-band stream event.
type Error struct {
	Status     int           // HTTP status
	Message    string        // human-readable
	Type       string        // "invalid_request_error", "rate_limit_error", "server_error", "timeout_error"...
	Code       string        // e.g. "invalid_json", "request_too_large", "upstream_timeout", "model_not_found"
	Param      string        // the offending parameter, if any
	RetryAfter time.Duration // if positive, WriteError sets Retry-After (whole seconds, rounded up)
}

// Error types used by this package.
const (
	typeInvalidRequest = "invalid_request_error"

	codeInvalidJSON  = "invalid_json"
	codeInvalidType  = "invalid_type"
	codeInvalidValue = "invalid_value"
	codeMissingField = "missing_field"
	codeTooLarge     = "request_too_large"
)

// NewError returns an Error with the given status, type, code and message.
func NewError(status int, typ, code, msg string) *Error {
	return &Error{Status: status, Type: typ, Code: code, Message: msg}
}

// Error implements error: "<status> <code>: <message>".
func (e *Error) Error() string {
	s := strconv.Itoa(e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	return s + ": " + e.Message
}

// Body returns the JSON body: {"error":{"message":...,"type":...,"param":...,"code":...}},
// with param and code null when empty, as OpenAI sends them.
func (e *Error) Body() []byte {
	return e.appendBody(make([]byte, 0, 64+len(e.Message)+len(e.Type)+len(e.Code)+len(e.Param)))
}

func (e *Error) appendBody(b []byte) []byte {
	b = append(b, `{"error":`...)
	b = e.appendObject(b)
	return append(b, '}')
}

// appendObject appends the error object: {"message":...,"type":...,"param":...,"code":...}.
func (e *Error) appendObject(b []byte) []byte {
	b = append(b, `{"message":`...)
	b = AppendString(b, e.Message)
	b = append(b, `,"type":`...)
	b = AppendString(b, e.Type)
	b = append(b, `,"param":`...)
	if e.Param == "" {
		b = append(b, "null"...)
	} else {
		b = AppendString(b, e.Param)
	}
	b = append(b, `,"code":`...)
	if e.Code == "" {
		b = append(b, "null"...)
	} else {
		b = AppendString(b, e.Code)
	}
	return append(b, '}')
}

// SSE returns the error as an in-band SSE event, for a stream that has already started:
//
//	event: error
//	data: {"error":{...}}
//
// The official clients (openai-go's ssestream, openai-python) turn a data object with an
// "error" key into a stream error, whatever the event name.
func (e *Error) SSE() []byte {
	b := make([]byte, 0, 96+len(e.Message)+len(e.Type)+len(e.Code)+len(e.Param))
	b = append(b, "event: error\ndata: "...)
	b = e.appendBody(b)
	return append(b, "\n\n"...)
}

// ResponsesSSE returns the error as the in-band error event of a Responses API stream
// (POST /v1/responses) that has already started, numbered seq (Tap.Seq: one more than the
// last sequence_number relayed; a negative seq is 0):
//
//	event: error
//	data: {"type":"error","code":...,"message":...,"param":...,"sequence_number":seq,"error":{...}}
//
// It carries both shapes clients look for: the Responses error event's own fields (the
// Vercel AI SDK reads type "error" and wants code and message strings, so code is Code,
// else Type, else "server_error"), and the "error" object of Body (openai-go and
// openai-python turn a data object with an "error" key into a stream error). There is no
// [DONE] in a Responses stream: the error event is the stream's last.
func (e *Error) ResponsesSSE(seq int) []byte {
	b := make([]byte, 0, 192+2*(len(e.Message)+len(e.Type)+len(e.Code)+len(e.Param)))
	b = append(b, "event: error\ndata: {\"type\":\"error\",\"code\":"...)
	switch {
	case e.Code != "":
		b = AppendString(b, e.Code)
	case e.Type != "":
		b = AppendString(b, e.Type)
	default:
		b = append(b, `"server_error"`...)
	}
	b = append(b, `,"message":`...)
	b = AppendString(b, e.Message)
	b = append(b, `,"param":`...)
	if e.Param == "" {
		b = append(b, "null"...)
	} else {
		b = AppendString(b, e.Param)
	}
	b = append(b, `,"sequence_number":`...)
	b = strconv.AppendInt(b, int64(max(seq, 0)), 10)
	b = append(b, `,"error":`...)
	b = e.appendObject(b)
	return append(b, "}\n\n"...)
}

// WriteError writes e as the response: its status (500 if unset), Content-Type
// application/json, Retry-After when e.RetryAfter is positive, and the JSON body.
func WriteError(w http.ResponseWriter, e *Error) {
	if e == nil {
		e = NewError(http.StatusInternalServerError, "server_error", "", "internal error")
	}
	status := e.Status
	if status < 100 || status > 999 {
		status = http.StatusInternalServerError
	}
	body := e.Body()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	if e.RetryAfter > 0 {
		secs := (e.RetryAfter + time.Second - 1) / time.Second
		h.Set("Retry-After", strconv.FormatInt(int64(secs), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
