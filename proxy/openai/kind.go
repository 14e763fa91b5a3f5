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
		}
	case http.MethodGet:
		if path == "/v1/models" || (strings.HasPrefix(path, "/v1/models/") && len(path) > len("/v1/models/")) {
			return KindModels
		}
	}
	return KindOther
}

// Operation returns the GenAI semantic-convention operation name (gen_ai.operation.name):
// "chat", "text_completion", "embeddings", or "" for the other kinds.
func (k Kind) Operation() string {
	switch k {
	case KindChat:
		return "chat"
	case KindCompletion:
		return "text_completion"
	case KindEmbedding:
		return "embeddings"
	}
	return ""
}

// String returns a short name for logs: "chat", "completion", "embedding", "models", "other".
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
	}
	return "other"
}
