package sim

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/sluicegw/sluice/policy/openai"
)

// Responses are encoded by hand into pooled buffers: the fast path serves thousands of
// requests a second and encoding/json's reflection would dominate its cost.

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > 1<<20 {
		return // do not keep huge buffers alive
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

const hexDigits = "0123456789abcdef"

func appendUsage(b []byte, prompt, completion int, withCompletion bool) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	if withCompletion {
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(completion), 10)
	}
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	return append(b, '}')
}

// apiError is an answer in OpenAI's error shape.
type apiError struct {
	status  int
	typ     string
	code    string // "" is null
	param   string
	message string
	numCode bool // vLLM's engine errors: "code" is the HTTP status as a number
}

func badRequest(code, param, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: code, param: param, message: msg}
}

func (e *apiError) appendJSON(b []byte) []byte {
	b = append(b, `{"error":{"message":`...)
	b = openai.AppendString(b, e.message)
	b = append(b, `,"type":`...)
	b = openai.AppendString(b, e.typ)
	b = append(b, `,"param":`...)
	if e.param == "" {
		b = append(b, "null"...)
	} else {
		b = openai.AppendString(b, e.param)
	}
	b = append(b, `,"code":`...)
	if e.numCode {
		b = strconv.AppendInt(b, int64(e.status), 10)
	} else if e.code == "" {
		b = append(b, "null"...)
	} else {
		b = openai.AppendString(b, e.code)
	}
	return append(b, "}}"...)
}

// writeError writes e as the whole response.
func writeError(w http.ResponseWriter, e *apiError) {
	bp := getBuf()
	*bp = e.appendJSON(*bp)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(*bp)))
	if e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(*bp)
	putBuf(bp)
}

// writeJSON writes b as a 200 application/json response.
func writeJSON(w http.ResponseWriter, b []byte) error {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(b)
	return err
}

// engineError is vLLM's error for a request that failed in the engine (x-sim-error-after)
// after events SSE events (-1: a non-streaming request):
// {"error":{"message":…,"type":"InternalServerError","param":null,"code":500}}.
func engineError(events int) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: "InternalServerError", numCode: true,
		message: engineErrorMessage(events)}
}

func engineErrorMessage(events int) string {
	if events < 0 {
		return "Simulated engine failure (" + HeaderErrorAfter + ")."
	}
	return "Simulated engine failure after " + strconv.Itoa(events) + " events (" + HeaderErrorAfter + ")."
}

// statusError builds the error body for an injected or requested status code.
func statusError(code int) *apiError {
	e := &apiError{status: code, typ: "server_error", message: http.StatusText(code)}
	if e.message == "" {
		e.message = "status " + strconv.Itoa(code)
	}
	switch {
	case code == http.StatusTooManyRequests:
		e.typ, e.code, e.message = "rate_limit_error", "rate_limit_exceeded", "Rate limit reached (simulated)"
	case code == http.StatusServiceUnavailable:
		e.code, e.message = "service_unavailable", "The server is overloaded (simulated)"
	case code >= 500:
		e.code, e.message = "internal_error", "Internal server error (simulated)"
	case code == http.StatusNotFound:
		e.typ, e.code = "invalid_request_error", "not_found"
	case code == http.StatusUnauthorized:
		e.typ, e.code = "authentication_error", "invalid_api_key"
	default:
		e.typ = "invalid_request_error"
	}
	return e
}
