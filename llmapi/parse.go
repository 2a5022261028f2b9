package llmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Fixed token costs used where text is not counted.
const (
	// ImageTokens is charged per image part. It is OpenAI's price of a
	// low-detail image; a high-detail one costs more, but its real price
	// depends on pixel sizes the gateway does not decode, and the
	// upstream's reported usage corrects the estimate afterwards.
	ImageTokens = 85
	// MessageOverhead is charged per chat message: the 3 tokens of
	// framing OpenAI documents for its chat formats, plus 1 for the
	// role, which is a single token for every standard role.
	MessageOverhead = 4
	// ReplyPriming is charged once per chat-style request for the tokens
	// that open the assistant's reply.
	ReplyPriming = 3
)

// Request is what the gateway needs to know about a request body to
// schedule it. It holds copies, never references into the body.
type Request struct {
	Kind Kind
	// Inferred reports that the path did not name an API and Kind was
	// guessed from the body's shape.
	Inferred bool
	Model    string
	Stream   bool
	// IncludeUsage is stream_options.include_usage: an OpenAI-style
	// stream carries usage only when the client asked for it.
	IncludeUsage bool
	// MaxOutput is the client's output cap (max_completion_tokens,
	// max_tokens or max_output_tokens, as the API names it), 0 if absent.
	MaxOutput int

	// Texts holds the prompt text, one entry per separately tokenized
	// string: message contents, names, tool calls and tool definitions.
	Texts []string
	// Messages counts chat-style messages, system prompts and responses
	// input messages; each costs MessageOverhead.
	Messages int
	// Names counts "name" fields on messages; each costs one token on top
	// of its text, as OpenAI documents.
	Names int
	// Images counts image parts; each costs ImageTokens.
	Images int
	// TokenIDs counts prompt tokens given as token-ID arrays.
	TokenIDs int

	noBody bool
}

// BodyError reports a request body the gateway cannot use. Its message is
// written for the API client, to be returned in a 400 response.
type BodyError struct {
	// Field is the JSON path of the offending value, such as
	// "messages[2].content"; empty when the problem is the body as a whole.
	Field string
	// Msg says what is wrong; when Field is set, it reads as a predicate
	// of the field ("must be a string, got number").
	Msg string
	// Offset is the byte offset of a JSON syntax error, -1 otherwise.
	Offset int64
	// Err is the underlying decoding error, if any.
	Err error
}

// Error returns the message for the client, naming the field first.
func (e *BodyError) Error() string {
	if e.Field != "" {
		return strconv.Quote(e.Field) + " " + e.Msg
	}
	return e.Msg
}

// Unwrap returns the underlying decoding error, for errors.As.
func (e *BodyError) Unwrap() error { return e.Err }

func fieldError(field, format string, args ...any) *BodyError {
	return &BodyError{Field: field, Msg: fmt.Sprintf(format, args...), Offset: -1}
}

// topLevel holds the raw values of interest of every supported API, as
// subslices of the body: decoding waits until the kind is known, and a value
// of the wrong type is reported with a clear message instead of a
// reflection error.
type topLevel struct {
	Model               json.RawMessage
	Stream              json.RawMessage
	StreamOptions       json.RawMessage
	MaxTokens           json.RawMessage
	MaxCompletionTokens json.RawMessage
	MaxOutputTokens     json.RawMessage
	Messages            json.RawMessage
	System              json.RawMessage
	Prompt              json.RawMessage
	Input               json.RawMessage
	Instructions        json.RawMessage
	Tools               json.RawMessage
	Functions           json.RawMessage

	// Only used to infer the kind when the path does not name it.
	AnthropicVersion   json.RawMessage
	StopSequences      json.RawMessage
	PreviousResponseID json.RawMessage
	EncodingFormat     json.RawMessage
	Dimensions         json.RawMessage
}

// Parse reads a request body sent to path. The kind comes from the path's
// suffix; for other paths it is inferred from the body's shape, and a body
// of no known shape yields KindUnknown with an empty prompt. An empty body is
// an error for the known APIs and fine otherwise (GET /v1/models).
//
// Errors are *BodyError: invalid JSON, and values of the wrong type, which
// make the cost unknowable. Missing fields are not errors; the upstream
// reports those in its own words. Parse neither modifies nor retains body.
func Parse(path string, body []byte) (*Request, error) {
	kind := KindFromPath(path)
	if len(bytes.TrimSpace(body)) == 0 {
		if kind == KindUnknown {
			return &Request{noBody: true}, nil
		}
		return nil, &BodyError{Msg: "request body is empty; expected a JSON object", Offset: -1}
	}
	var top topLevel
	if err := decodeTop(body, &top); err != nil {
		return nil, err
	}
	req := &Request{Kind: kind}
	if kind == KindUnknown {
		req.Kind = inferKind(&top)
		req.Inferred = req.Kind != KindUnknown
	}
	if err := req.parse(&top); err != nil {
		return nil, err
	}
	return req, nil
}

func decodeTop(body []byte, top *topLevel) error {
	if !json.Valid(body) {
		// Only now pay for a decode, to learn where the error is.
		var v struct{}
		err := json.Unmarshal(body, &v)
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return syntaxError(body, syn)
		}
		return &BodyError{Msg: "request body is not valid JSON", Offset: -1, Err: err}
	}
	if rawType(body) != '{' {
		return &BodyError{Msg: "request body must be a JSON object, got " + typeName(body), Offset: -1}
	}
	// The body is valid, so the byte scanner can walk it: subslices, no
	// copies, and keys matched exactly as the servers behind us match them
	// (encoding/json would also take "Messages" for "messages").
	eachMember(body, func(k, v []byte) bool {
		switch string(k) {
		case "model":
			top.Model = v
		case "stream":
			top.Stream = v
		case "stream_options":
			top.StreamOptions = v
		case "max_tokens":
			top.MaxTokens = v
		case "max_completion_tokens":
			top.MaxCompletionTokens = v
		case "max_output_tokens":
			top.MaxOutputTokens = v
		case "messages":
			top.Messages = v
		case "system":
			top.System = v
		case "prompt":
			top.Prompt = v
		case "input":
			top.Input = v
		case "instructions":
			top.Instructions = v
		case "tools":
			top.Tools = v
		case "functions":
			top.Functions = v
		case "anthropic_version":
			top.AnthropicVersion = v
		case "stop_sequences":
			top.StopSequences = v
		case "previous_response_id":
			top.PreviousResponseID = v
		case "encoding_format":
			top.EncodingFormat = v
		case "dimensions":
			top.Dimensions = v
		}
		return true
	})
	return nil
}

func syntaxError(body []byte, syn *json.SyntaxError) *BodyError {
	// encoding/json counts the offending byte in Offset.
	off := max(syn.Offset-1, 0)
	if syn.Offset >= int64(len(body)) && syn.Error() == "unexpected end of JSON input" {
		return &BodyError{
			Msg:    "request body is not valid JSON: it ends in the middle of a value (truncated?)",
			Offset: int64(len(body)), Err: syn,
		}
	}
	line := 1 + bytes.Count(body[:off], []byte{'\n'})
	col := off - int64(bytes.LastIndexByte(body[:off], '\n'))
	return &BodyError{
		Msg:    fmt.Sprintf("request body is not valid JSON: %s at offset %d (line %d, column %d)", syn.Error(), off, line, col),
		Offset: off, Err: syn,
	}
}

func inferKind(top *topLevel) Kind {
	switch {
	case rawType(top.Messages) == '[':
		// OpenAI chat puts system prompts among the messages; these
		// fields exist only in Anthropic's API.
		if present(top.System) || present(top.AnthropicVersion) || present(top.StopSequences) {
			return KindAnthropicMessages
		}
		return KindChat
	case present(top.Prompt):
		return KindCompletions
	case present(top.Input):
		if present(top.Instructions) || present(top.MaxOutputTokens) || present(top.PreviousResponseID) {
			return KindResponses
		}
		if present(top.EncodingFormat) || present(top.Dimensions) {
			return KindEmbeddings
		}
		if rawType(top.Input) == '[' {
			// Responses input lists items (objects); embeddings input
			// lists strings or token IDs.
			if first := firstElement(top.Input); first != nil {
				if rawType(first) == '{' {
					return KindResponses
				}
				return KindEmbeddings
			}
		}
	}
	return KindUnknown
}

func (r *Request) parse(top *topLevel) error {
	if r.Kind == KindUnknown {
		return nil
	}
	var err error
	if r.Model, err = getString(top.Model, "model"); err != nil {
		return err
	}
	if r.Kind != KindEmbeddings {
		if r.Stream, err = getBool(top.Stream, "stream"); err != nil {
			return err
		}
		if err := r.parseStreamOptions(top.StreamOptions); err != nil {
			return err
		}
	}
	// The first cap present wins, in the API's order of preference.
	var caps []string
	var raws []json.RawMessage
	switch r.Kind {
	case KindChat:
		caps = []string{"max_completion_tokens", "max_tokens"}
		raws = []json.RawMessage{top.MaxCompletionTokens, top.MaxTokens}
	case KindCompletions, KindAnthropicMessages:
		caps, raws = []string{"max_tokens"}, []json.RawMessage{top.MaxTokens}
	case KindResponses:
		caps, raws = []string{"max_output_tokens"}, []json.RawMessage{top.MaxOutputTokens}
	}
	for i, raw := range raws {
		n, err := getInt(raw, caps[i])
		if err != nil {
			return err
		}
		if r.MaxOutput == 0 {
			r.MaxOutput = n
		}
	}

	switch r.Kind {
	case KindChat:
		if err := r.addMessages(top.Messages, false); err != nil {
			return err
		}
		r.addTools(top.Tools)
		r.addTools(top.Functions)
	case KindAnthropicMessages:
		if err := r.addSystem(top.System); err != nil {
			return err
		}
		if err := r.addMessages(top.Messages, true); err != nil {
			return err
		}
		r.addTools(top.Tools)
	case KindCompletions:
		return r.addTokenInput(top.Prompt, "prompt")
	case KindEmbeddings:
		return r.addTokenInput(top.Input, "input")
	case KindResponses:
		if err := r.addInstructions(top.Instructions); err != nil {
			return err
		}
		if err := r.addResponsesInput(top.Input); err != nil {
			return err
		}
		r.addTools(top.Tools)
	}
	return nil
}

func (r *Request) parseStreamOptions(raw json.RawMessage) error {
	if !present(raw) {
		return nil
	}
	if rawType(raw) != '{' {
		return fieldError("stream_options", "must be an object, got %s", typeName(raw))
	}
	var err error
	r.IncludeUsage, err = getBool(member(raw, "include_usage"), "stream_options.include_usage")
	return err
}

// rawMessage is one chat or Anthropic message.
type rawMessage struct {
	Role, Content, Name, ToolCalls, FunctionCall json.RawMessage
}

func decodeMessage(raw []byte) (m rawMessage) {
	eachMember(raw, func(k, v []byte) bool {
		switch string(k) {
		case "role":
			m.Role = v
		case "content":
			m.Content = v
		case "name":
			m.Name = v
		case "tool_calls":
			m.ToolCalls = v
		case "function_call":
			m.FunctionCall = v
		}
		return true
	})
	return m
}

func (r *Request) addMessages(raw json.RawMessage, anthropic bool) error {
	msgs, err := getArray(raw, "messages")
	if err != nil {
		return err
	}
	for i, m := range msgs {
		if _, err := r.addMessage(m, "messages["+strconv.Itoa(i)+"]", anthropic); err != nil {
			return err
		}
	}
	return nil
}

// addMessage adds one message's prompt and returns its role.
func (r *Request) addMessage(raw json.RawMessage, path string, anthropic bool) (string, error) {
	if rawType(raw) != '{' {
		return "", fieldError(path, "must be an object, got %s", typeName(raw))
	}
	m := decodeMessage(raw)
	role, err := getString(m.Role, path+".role")
	if err != nil {
		return "", err
	}
	r.Messages++
	if err := r.addContent(m.Content, path+".content", anthropic); err != nil {
		return "", err
	}
	if present(m.Name) {
		name, err := getString(m.Name, path+".name")
		if err != nil {
			return "", err
		}
		r.Texts = append(r.Texts, name)
		r.Names++
	}
	if present(m.ToolCalls) {
		calls, err := getArray(m.ToolCalls, path+".tool_calls")
		if err != nil {
			return "", err
		}
		for _, c := range calls {
			r.addCall(c)
		}
	}
	if present(m.FunctionCall) {
		r.addFunction(m.FunctionCall)
	}
	return role, nil
}

// addCall adds an OpenAI tool call: its function's name and arguments.
func (r *Request) addCall(raw json.RawMessage) {
	if f := member(raw, "function"); rawType(f) == '{' {
		r.addFunction(f)
		return
	}
	r.addJSON(raw)
}

func (r *Request) addFunction(raw json.RawMessage) {
	if rawType(raw) != '{' {
		r.addJSON(raw)
		return
	}
	r.addText(member(raw, "name"))
	if args := member(raw, "arguments"); rawType(args) == '"' {
		r.addText(args)
	} else {
		r.addJSON(args)
	}
}

// rawPart is a content part or block, or a responses input item.
type rawPart struct {
	Type, Text, Refusal, Thinking, Name, Input, Content, Arguments, Output, Summary json.RawMessage
}

func decodePart(raw []byte) (p rawPart) {
	eachMember(raw, func(k, v []byte) bool {
		switch string(k) {
		case "type":
			p.Type = v
		case "text":
			p.Text = v
		case "refusal":
			p.Refusal = v
		case "thinking":
			p.Thinking = v
		case "name":
			p.Name = v
		case "input":
			p.Input = v
		case "content":
			p.Content = v
		case "arguments":
			p.Arguments = v
		case "output":
			p.Output = v
		case "summary":
			p.Summary = v
		}
		return true
	})
	return p
}

func (r *Request) addContent(raw json.RawMessage, path string, anthropic bool) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"':
		r.addText(raw)
		return nil
	case '[':
		parts, _ := getArray(raw, path)
		for i, p := range parts {
			if err := r.addPart(p, path+"["+strconv.Itoa(i)+"]", anthropic); err != nil {
				return err
			}
		}
		return nil
	}
	if anthropic {
		return fieldError(path, "must be a string or an array of content blocks, got %s", typeName(raw))
	}
	return fieldError(path, "must be a string, an array of content parts, or null, got %s", typeName(raw))
}

func (r *Request) addPart(raw json.RawMessage, path string, anthropic bool) error {
	if rawType(raw) != '{' {
		return fieldError(path, "must be an object, got %s", typeName(raw))
	}
	p := decodePart(raw)
	typ, err := getString(p.Type, path+".type")
	if err != nil {
		return err
	}
	switch typ {
	case "text", "input_text", "output_text":
		if rawType(p.Text) != '"' {
			return fieldError(path+".text", "must be a string, got %s", typeName(p.Text))
		}
		r.addText(p.Text)
	case "image_url", "input_image", "image":
		r.Images++
	case "refusal":
		r.addText(p.Refusal)
	case "thinking":
		r.addText(p.Thinking)
	case "tool_use", "server_tool_use":
		r.addText(p.Name)
		r.addJSON(p.Input)
	case "tool_result":
		return r.addContent(p.Content, path+".content", anthropic)
	default:
		// Audio, files, documents, redacted thinking: their cost is not
		// knowable from the body; count any text they carry.
		if rawType(p.Text) == '"' {
			r.addText(p.Text)
		}
	}
	return nil
}

func (r *Request) addSystem(raw json.RawMessage) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"', '[':
		r.Messages++
		return r.addContent(raw, "system", true)
	}
	return fieldError("system", "must be a string or an array of text blocks, got %s", typeName(raw))
}

func (r *Request) addInstructions(raw json.RawMessage) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"':
		r.Messages++
		r.addText(raw)
		return nil
	}
	return fieldError("instructions", "must be a string, got %s", typeName(raw))
}

func (r *Request) addResponsesInput(raw json.RawMessage) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"':
		r.Messages++ // the API wraps a string input as a user message
		r.addText(raw)
		return nil
	case '[':
	default:
		return fieldError("input", "must be a string or an array of input items, got %s", typeName(raw))
	}
	items, _ := getArray(raw, "input")
	for i, it := range items {
		path := "input[" + strconv.Itoa(i) + "]"
		if rawType(it) != '{' {
			return fieldError(path, "must be an object, got %s", typeName(it))
		}
		p := decodePart(it)
		typ, err := getString(p.Type, path+".type")
		if err != nil {
			return err
		}
		switch typ {
		case "message", "":
			r.Messages++
			if err := r.addContent(p.Content, path+".content", false); err != nil {
				return err
			}
		case "function_call":
			r.addText(p.Name)
			r.addText(p.Arguments)
		case "function_call_output", "custom_tool_call_output":
			if err := r.addContent(p.Output, path+".output", false); err != nil {
				return err
			}
		case "custom_tool_call":
			r.addText(p.Name)
			r.addText(p.Input)
		case "reasoning":
			if rawType(p.Summary) == '[' {
				_ = r.addContent(p.Summary, path+".summary", false)
			}
		default:
			if rawType(p.Text) == '"' {
				r.addText(p.Text)
			}
		}
	}
	return nil
}

// addTokenInput adds a completions prompt or an embeddings input: a
// string, an array of strings, an array of token IDs, or an array of such
// arrays.
func (r *Request) addTokenInput(raw json.RawMessage, field string) error {
	switch rawType(raw) {
	case 0, 'n':
		return nil
	case '"':
		r.addText(raw)
		return nil
	case '[':
		// The APIs accept only arrays of one element type.
		var first byte
		ok := true
		eachElement(raw, func(e []byte) {
			t := rawType(e)
			if first == 0 {
				first = t
			}
			switch {
			case t == '"' && first == '"':
				r.Texts = append(r.Texts, decodeString(e))
			case t == '[' && first == '[':
				eachElement(e, func(id []byte) {
					ok = ok && isTokenID(id)
					r.TokenIDs++
				})
			case isTokenID(e) && first != '"' && first != '[':
				r.TokenIDs++
			default:
				ok = false
			}
		})
		if ok {
			return nil
		}
		return fieldError(field, "must be a string, an array of strings, an array of token IDs or an array of token-ID arrays, with elements of one type")
	}
	return fieldError(field, "must be a string or an array, got %s", typeName(raw))
}

// addTools counts tool definitions as their compact JSON text: servers
// render them into the prompt in a form of about that size.
func (r *Request) addTools(raw json.RawMessage) {
	if present(raw) {
		r.addJSON(raw)
	}
}

// addText appends a JSON string value; other types are ignored, because
// callers only use it for fields whose type does not affect validity.
func (r *Request) addText(raw json.RawMessage) {
	if rawType(raw) != '"' {
		return
	}
	if s := decodeString(raw); s != "" {
		r.Texts = append(r.Texts, s)
	}
}

func (r *Request) addJSON(raw json.RawMessage) {
	if !present(raw) {
		return
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) == nil {
		r.Texts = append(r.Texts, b.String())
	}
}

// rawType returns the first byte of a JSON value ('{', '[', '"', 't', 'f',
// 'n', or a number's first character), or 0 for an absent value.
func rawType(raw json.RawMessage) byte {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

func present(raw json.RawMessage) bool {
	t := rawType(raw)
	return t != 0 && t != 'n'
}

func typeName(raw json.RawMessage) string {
	switch rawType(raw) {
	case 0:
		return "nothing"
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func getString(raw json.RawMessage, field string) (string, error) {
	switch rawType(raw) {
	case 0, 'n':
		return "", nil
	case '"':
		return decodeString(raw), nil
	}
	return "", fieldError(field, "must be a string, got %s", typeName(raw))
}

func getBool(raw json.RawMessage, field string) (bool, error) {
	switch rawType(raw) {
	case 0, 'n':
		return false, nil
	case 't':
		return true, nil
	case 'f':
		return false, nil
	}
	return false, fieldError(field, "must be a boolean, got %s", typeName(raw))
}

// getInt reads a non-negative integer. Integral floats (100.0) are
// accepted, as the Python servers behind these APIs do; values beyond
// int32 are clamped, which keeps cost arithmetic far from overflow.
func getInt(raw json.RawMessage, field string) (int, error) {
	switch t := rawType(raw); {
	case t == 0 || t == 'n':
		return 0, nil
	case t == '-' || t >= '0' && t <= '9':
		f, err := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
		if err == nil && f >= 0 && f == math.Trunc(f) {
			return int(min(f, math.MaxInt32)), nil
		}
		return 0, fieldError(field, "must be a non-negative integer, got %s", bytes.TrimSpace(raw))
	}
	return 0, fieldError(field, "must be a non-negative integer, got %s", typeName(raw))
}

func getArray(raw json.RawMessage, field string) ([]json.RawMessage, error) {
	switch rawType(raw) {
	case 0, 'n':
		return nil, nil
	case '[':
		var a []json.RawMessage
		eachElement(raw, func(e []byte) { a = append(a, e) })
		return a, nil
	}
	return nil, fieldError(field, "must be an array, got %s", typeName(raw))
}

// decodeString decodes a JSON string value (quotes included).
func decodeString(raw []byte) string {
	if len(raw) < 2 {
		return ""
	}
	if bytes.IndexByte(raw[1:len(raw)-1], '\\') < 0 {
		return string(raw[1 : len(raw)-1])
	}
	return string(appendString(make([]byte, 0, len(raw)), raw))
}

// firstElement returns the first element of a JSON array, or nil.
func firstElement(raw []byte) []byte {
	var first []byte
	eachElement(raw, func(e []byte) {
		if first == nil {
			first = e
		}
	})
	return first
}

// isTokenID reports whether raw is an integer literal.
func isTokenID(raw []byte) bool {
	if len(raw) > 0 && raw[0] == '-' {
		raw = raw[1:]
	}
	if len(raw) == 0 {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
