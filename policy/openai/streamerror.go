package openai

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// StreamErrorBody turns an error a model server sent as a stream event into an HTTP status
// and an OpenAI error body, for when that event came before anything reached the client.
// It reads the shapes servers use in their own words:
//
//	{"error":{"message":…,"type":…,"param":…,"code":400}}             OpenAI, vLLM
//	{"object":"error","message":…,"type":"BadRequestError","code":400}  older vLLM
//	{"error":"…","error_type":"…"}                                      TGI
//	{"type":"error","code":"…","message":…,"param":…}                   Responses API
//
// The status is the error's numeric code when it is one (400–599), else one its type names
// (BadRequestError 400, NotFoundError 404, rate limits 429, …), else 502. The message is the
// server's.
func StreamErrorBody(data []byte) (status int, body []byte) {
	var v struct {
		Error     json.RawMessage `json:"error"`
		Object    string          `json:"object"`
		Type      string          `json:"type"`
		ErrorType string          `json:"error_type"`
		Message   string          `json:"message"`
		Code      json.RawMessage `json:"code"`
		Param     json.RawMessage `json:"param"`
		Response  struct {
			Error json.RawMessage `json:"error"` // response.failed: {"code","message"}
		} `json:"response"`
	}
	e := &Error{Status: http.StatusBadGateway, Type: "server_error", Message: "the model server reported an error in the stream"}
	if json.Unmarshal(data, &v) != nil {
		return e.Status, e.Body()
	}
	var code json.RawMessage
	var param json.RawMessage
	if len(v.Error) == 0 && len(v.Response.Error) > 0 && v.Response.Error[0] == '{' {
		v.Error = v.Response.Error // a Responses response.failed event
	}
	switch {
	case len(v.Error) > 0 && v.Error[0] == '{':
		var inner struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
			Param   json.RawMessage `json:"param"`
		}
		if json.Unmarshal(v.Error, &inner) == nil {
			e.Message, e.Type, code, param = nonEmpty(inner.Message, e.Message), nonEmpty(inner.Type, e.Type), inner.Code, inner.Param
		}
	case len(v.Error) > 0 && v.Error[0] == '"':
		var msg string
		_ = json.Unmarshal(v.Error, &msg)
		e.Message, e.Type = nonEmpty(msg, e.Message), nonEmpty(v.ErrorType, e.Type)
	default: // {"object":"error",...} or a Responses error event
		e.Message, code, param = nonEmpty(v.Message, e.Message), v.Code, v.Param
		if v.Object == "error" {
			e.Type = nonEmpty(v.Type, e.Type)
		}
	}
	var p string
	if json.Unmarshal(param, &p) == nil {
		e.Param = p
	}
	var n int
	var s string
	switch {
	case json.Unmarshal(code, &n) == nil:
		e.Code = strconv.Itoa(n)
		if n >= 400 && n <= 599 {
			e.Status = n
		}
	case json.Unmarshal(code, &s) == nil:
		e.Code = s
		if n, err := strconv.Atoi(s); err == nil && n >= 400 && n <= 599 {
			e.Status = n
		}
	}
	if e.Status == http.StatusBadGateway {
		if st := statusOfCode(e.Code); st != 0 {
			e.Status = st
		} else if st := statusOfType(e.Type); st != 0 && e.Type != "server_error" {
			e.Status = st // a type the server named (server_error is ours when it named none)
		}
	}
	return e.Status, e.Body()
}

// statusOfCode is the status an OpenAI error code names (the Responses API sends codes, not
// statuses), 0 when it names none.
func statusOfCode(c string) int {
	switch c = strings.ToLower(c); {
	case c == "context_length_exceeded", strings.HasPrefix(c, "invalid_"), c == "unsupported_value", c == "missing_required_parameter":
		return http.StatusBadRequest
	case strings.HasPrefix(c, "rate_limit"), c == "insufficient_quota":
		return http.StatusTooManyRequests
	case c == "model_not_found", c == "previous_response_not_found":
		return http.StatusNotFound
	case c == "server_error", c == "internal_error":
		return http.StatusInternalServerError
	case c == "server_overloaded", c == "overloaded", c == "service_unavailable":
		return http.StatusServiceUnavailable
	}
	return 0
}

// statusOfType is the status an error type names (Python exception names as vLLM uses
// them, and OpenAI's types), 0 when it names none.
func statusOfType(t string) int {
	switch t = strings.ToLower(t); {
	case t == "badrequesterror" || t == "invalid_request_error":
		return http.StatusBadRequest
	case t == "notfounderror" || t == "not_found_error":
		return http.StatusNotFound
	case strings.Contains(t, "rate_limit") || strings.Contains(t, "ratelimit"):
		return http.StatusTooManyRequests
	case t == "authenticationerror" || t == "authentication_error":
		return http.StatusUnauthorized
	case t == "permissiondeniederror" || t == "permission_error":
		return http.StatusForbidden
	case t == "internalservererror" || t == "server_error":
		return http.StatusInternalServerError
	case t == "serviceunavailableerror" || t == "overloaded_error":
		return http.StatusServiceUnavailable
	}
	return 0
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
