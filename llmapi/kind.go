package llmapi

import "strings"

// Kind is the API a request body is written for.
type Kind int

// Kinds of request body.
const (
	KindUnknown           Kind = iota
	KindChat                   // OpenAI /chat/completions
	KindCompletions            // OpenAI legacy /completions
	KindResponses              // OpenAI /responses
	KindEmbeddings             // OpenAI /embeddings
	KindAnthropicMessages      // Anthropic /messages
)

var kindNames = [...]string{
	KindUnknown:           "unknown",
	KindChat:              "chat",
	KindCompletions:       "completions",
	KindResponses:         "responses",
	KindEmbeddings:        "embeddings",
	KindAnthropicMessages: "anthropic_messages",
}

// String returns a short name suitable for logs and metric labels.
func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "unknown"
	}
	return kindNames[k]
}

// KindFromPath detects the API from the URL path's suffix, so that any
// prefix (/v1, /openai/deployments/x, a gateway route) works. The query
// string, if still attached, and trailing slashes are ignored.
func KindFromPath(path string) Kind {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	for len(path) > 0 && path[len(path)-1] == '/' {
		path = path[:len(path)-1]
	}
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return KindChat
	case strings.HasSuffix(path, "/completions"):
		return KindCompletions
	case strings.HasSuffix(path, "/responses"):
		return KindResponses
	case strings.HasSuffix(path, "/embeddings"):
		return KindEmbeddings
	case strings.HasSuffix(path, "/messages"):
		return KindAnthropicMessages
	}
	return KindUnknown
}
