package openai

import (
	"net/http"
	"strings"
)

// Kind is the kind of endpoint a request is for, from its method and URL path.
type Kind uint8

// The endpoint kinds.
const (
	KindOther      Kind = iota // anything else: passed through without a body parse
	KindChat                   // POST /v1/chat/completions
	KindCompletion             // POST /v1/completions
	KindEmbedding              // POST /v1/embeddings
	KindModels                 // GET /v1/models and GET /v1/models/{id}
	KindResponses              // POST /v1/responses (the OpenAI Responses API)
)

// KindOf classifies a request by method and URL path (the path without the query).
func KindOf(method, path string) Kind {
	switch method {
	case http.MethodPost:
		switch path {
		case "/v1/chat/completions":
			return KindChat
		case "/v1/completions":
			return KindCompletion
		case "/v1/embeddings":
			return KindEmbedding
		case "/v1/responses":
			return KindResponses
		}
	case http.MethodGet:
		if path == "/v1/models" || (strings.HasPrefix(path, "/v1/models/") && len(path) > len("/v1/models/")) {
			return KindModels
		}
	}
	return KindOther
}

// Operation returns the GenAI semantic-convention operation name (gen_ai.operation.name):
// "chat", "text_completion", "embeddings", or "" for the other kinds. A Responses request
// is "chat": the conventions name no operation of its own for it.
func (k Kind) Operation() string {
	switch k {
	case KindChat, KindResponses:
		return "chat"
	case KindCompletion:
		return "text_completion"
	case KindEmbedding:
		return "embeddings"
	}
	return ""
}

// String returns a short name for logs: "chat", "completion", "embedding", "models",
// "responses", "other".
func (k Kind) String() string {
	switch k {
	case KindChat:
		return "chat"
	case KindCompletion:
		return "completion"
	case KindEmbedding:
		return "embedding"
	case KindModels:
		return "models"
	case KindResponses:
		return "responses"
	}
	return "other"
}

// HasModel reports whether requests of the kind carry a body with a model: chat, completions,
// embeddings and responses (the kinds ParseRequest parses).
func (k Kind) HasModel() bool {
	switch k {
	case KindChat, KindCompletion, KindEmbedding, KindResponses:
		return true
	}
	return false
}
