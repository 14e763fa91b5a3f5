package shadow

import "encoding/json"

// RequestFromBody extracts what the comparison needs from an OpenAI chat or completions
// request body: the response format (and its JSON Schema) and the declared function tools.
// A body that does not parse gives an empty Request (plain text comparison).
func RequestFromBody(body []byte) Request {
	var b struct {
		ResponseFormat *struct {
			Type       string          `json:"type"`
			JSONSchema json.RawMessage `json:"json_schema"`
		} `json:"response_format"`
		ToolChoice json.RawMessage `json:"tool_choice"`
		Tools      []struct {
			Type     string `json:"type"`
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	if json.Unmarshal(body, &b) != nil {
		return Request{}
	}
	var r Request
	if rf := b.ResponseFormat; rf != nil {
		r.ResponseFormat = rf.Type
		if rf.Type == FormatJSONSchema {
			r.Schema = rf.JSONSchema
		}
	}
	r.ToolChoice = toolChoice(b.ToolChoice)
	for _, t := range b.Tools {
		if (t.Type == "" || t.Type == "function") && t.Function.Name != "" {
			r.Tools = append(r.Tools, Tool{Name: t.Function.Name, Parameters: t.Function.Parameters})
		}
	}
	return r
}

// toolChoice reads tool_choice: a string ("auto", "none", "required") or an object naming the
// one function to call ({"type":"function","function":{"name":"f"}}).
func toolChoice(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Function.Name != "" {
		return o.Function.Name
	}
	return ""
}
