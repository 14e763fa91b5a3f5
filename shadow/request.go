package shadow

import "encoding/json"

// RequestFromBody extracts what the comparison needs from an OpenAI chat, completions or
// Responses request body: the response format (and its JSON Schema) and the declared
// function tools. Chat declares a tool as {"type":"function","function":{"name",
// "parameters"}} and its format as response_format {"type","json_schema":{"name",
// "schema"}}; the Responses API declares {"type":"function","name","parameters"} (its
// built-in tools, web_search and the like, are not functions and are left out) and its
// format as text.format {"type","name","schema","strict"}, whose schema becomes Schema. A
// body that does not parse gives an empty Request (plain text comparison).
func RequestFromBody(body []byte) Request {
	var b struct {
		ResponseFormat *struct {
			Type       string          `json:"type"`
			JSONSchema json.RawMessage `json:"json_schema"`
		} `json:"response_format"`
		Text       json.RawMessage `json:"text"` // Responses: {"format":{...}}
		ToolChoice json.RawMessage `json:"tool_choice"`
		MaxTokens  json.RawMessage `json:"max_tokens"`
		MaxCompl   json.RawMessage `json:"max_completion_tokens"`
		MaxOutput  json.RawMessage `json:"max_output_tokens"`
		Tools      []struct {
			Type       string          `json:"type"`
			Name       string          `json:"name"`       // Responses
			Parameters json.RawMessage `json:"parameters"` // Responses
			Function   struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	if json.Unmarshal(body, &b) != nil {
		return Request{}
	}
	var r Request
	for _, v := range []json.RawMessage{b.MaxTokens, b.MaxCompl, b.MaxOutput} {
		if len(v) > 0 && string(v) != "null" {
			r.MaxTokensSet = true
		}
	}
	if rf := b.ResponseFormat; rf != nil {
		r.ResponseFormat = rf.Type
		if rf.Type == FormatJSONSchema {
			r.Schema = rf.JSONSchema
		}
	} else if len(b.Text) > 0 {
		var text struct {
			Format *struct {
				Type   string          `json:"type"`
				Schema json.RawMessage `json:"schema"`
			} `json:"format"`
		}
		if json.Unmarshal(b.Text, &text) == nil && text.Format != nil {
			r.ResponseFormat = text.Format.Type
			if text.Format.Type == FormatJSONSchema {
				r.Schema = text.Format.Schema
			}
		}
	}
	r.ToolChoice = toolChoice(b.ToolChoice)
	for _, t := range b.Tools {
		if t.Type != "" && t.Type != "function" {
			continue
		}
		switch {
		case t.Function.Name != "":
			r.Tools = append(r.Tools, Tool{Name: t.Function.Name, Parameters: t.Function.Parameters})
		case t.Name != "":
			r.Tools = append(r.Tools, Tool{Name: t.Name, Parameters: t.Parameters})
		}
	}
	return r
}

// toolChoice reads tool_choice: a string ("auto", "none", "required") or an object naming the
// one function to call (chat: {"type":"function","function":{"name":"f"}}; Responses:
// {"type":"function","name":"f"}), or restricting the calls to some tools with a mode
// ({"type":"allowed_tools","mode":"required",...}; chat nests it in "allowed_tools"). An
// object forcing a built-in or custom tool is "" (auto): the answer's tool calls are
// function calls only.
func toolChoice(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	type allowed struct {
		Mode string `json:"mode"`
	}
	var o struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Mode     string `json:"mode"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
		AllowedTools allowed `json:"allowed_tools"`
	}
	if json.Unmarshal(raw, &o) != nil {
		return ""
	}
	switch {
	case o.Function.Name != "":
		return o.Function.Name
	case o.Type == "function" && o.Name != "":
		return o.Name
	case o.Type == "allowed_tools":
		return o.Mode + o.AllowedTools.Mode // "auto" or "required"
	}
	return ""
}
