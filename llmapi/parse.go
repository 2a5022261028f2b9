package llmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
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

// MaxChoices is the largest n (and best_of) a request may ask for, OpenAI's
// limit for n. A larger count is refused, not clamped: the upstream would
// generate what the client asked for.
const MaxChoices = 128

// Request is what the gateway needs to know about a request body to
// schedule it. It refers to its body instead of copying the prompt, so the
// caller must neither modify nor reuse the body while it is in use.
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
	// MaxOutput is the client's output cap per choice
	// (max_completion_tokens, max_tokens or max_output_tokens, as the API
	// names it), 0 if absent. Caps beyond CostLimit saturate at it.
	MaxOutput int
	// Choices is how many completions the upstream generates: the larger
	// of n and best_of where the API has them (chat, completions), else 1.
	Choices int

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

	body      []byte // the body parsed, which holds the prompt text
	nTexts    int    // texts in the prompt
	textBytes int64  // and their size, as they stand in the body
	noBody    bool
	// texts are the first texts of the prompt as the walk met them, and
	// more the others when Parse kept them (see keptTexts); when Parse
	// set walked and they are all of them, Estimate counts them without
	// walking the body a second time.
	texts  [inlineTexts]textRef
	more   []textRef
	walked bool
}

// inlineTexts is how many prompt texts a Request keeps in itself, so a
// short conversation allocates nothing more.
const inlineTexts = 8

// keptTexts is how many texts Parse keeps from a body of n bytes: at most
// a sixteenth of the body. Estimate walks larger ones again, sampling.
func keptTexts(n int) int { return min(n/16/textRefSize, maxTexts) }

// textRefSize is the size of a textRef: a slice and a flag.
const textRefSize = 32

// allTexts reports whether Parse kept all of r's texts.
func (r *Request) allTexts() bool {
	return r.walked && (r.nTexts <= inlineTexts || len(r.more) == r.nTexts-inlineTexts)
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
	// Offset is the byte offset of a JSON syntax error or of the bracket
	// that nests too deep, -1 otherwise.
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

// seg is one step of the JSON path to the value a walker is at, turned
// into a string only when an error names it.
type seg struct {
	name string // member name; "" for an array element
	idx  int
}

func appendPath(b []byte, segs []seg) []byte {
	for _, sg := range segs {
		if sg.name == "" {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(sg.idx), 10)
			b = append(b, ']')
			continue
		}
		if len(b) > 0 {
			b = append(b, '.')
		}
		b = append(b, sg.name...)
	}
	return b
}

func fieldError(field, format string, args ...any) *BodyError {
	return &BodyError{Field: field, Msg: fmt.Sprintf(format, args...), Offset: -1}
}

// duplicateMsg refuses a member given twice. JSON decoders disagree on
// duplicates (first or last wins), so refusing them is the only way to
// estimate what the upstream will serve.
const duplicateMsg = "appears more than once in the same object (keys are compared after decoding escapes such as \\u005f); send it once"

func depthError(off int) *BodyError {
	return &BodyError{
		Msg:    fmt.Sprintf("request body is nested deeper than %d levels of arrays and objects (at offset %d); flatten it", MaxDepth, off),
		Offset: int64(off),
	}
}

// topLevel holds the raw values of the top-level members the gateway
// reads, as subslices of the body indexed by the constants below; they are
// decoded once the kind is known.
type topLevel [topFields][]byte

// Top-level members, named in topNames.
const (
	tModel = iota
	tStream
	tStreamOptions
	tMaxTokens
	tMaxCompletionTokens
	tMaxOutputTokens
	tN
	tBestOf
	tMessages
	tSystem
	tPrompt
	tInput
	tInstructions
	tTools
	tFunctions
	// Only read to infer the kind when the path does not name it.
	tAnthropicVersion
	tStopSequences
	tPreviousResponseID
	tEncodingFormat
	tDimensions
	topFields
)

var topNames = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens",
	"max_output_tokens", "n", "best_of", "messages", "system", "prompt", "input", "instructions", "tools",
	"functions", "anthropic_version", "stop_sequences", "previous_response_id", "encoding_format", "dimensions"}

// Parse reads a request body sent to path. The kind comes from the path's
// suffix, else from the body's shape (KindUnknown with an empty prompt if
// none). An empty body is an error for the known APIs only.
//
// Errors are *BodyError: invalid JSON, nesting deeper than MaxDepth, a
// member the gateway reads given twice, and values of the wrong type.
// Missing fields are not errors. Parse never modifies body, its work is
// linear in len(body), and the Request refers to body (see Request).
func Parse(path string, body []byte) (*Request, error) {
	req := new(Request)
	if err := ParseTo(req, path, body); err != nil {
		return nil, err
	}
	return req, nil
}

// ParseTo is Parse into a Request the caller holds, which it overwrites
// whole (no allocation of its own). On an error *req is left zero.
func ParseTo(req *Request, path string, body []byte) error {
	sc := getScratch()
	defer sc.release()
	return sc.parse(req, path, body)
}

// parse is ParseTo with sc as the walk's working memory.
func (sc *scratch) parse(req *Request, path string, body []byte) error {
	*req = Request{}
	kind := KindFromPath(path)
	if len(bytes.TrimSpace(body)) == 0 {
		if kind == KindUnknown {
			req.noBody, req.Choices = true, 1
			return nil
		}
		return &BodyError{Msg: "request body is empty; expected a JSON object", Offset: -1}
	}
	req.Kind, req.Choices, req.body = kind, 1, body
	w := sc.walker(req, false, 1)
	w.keep = keptTexts(len(body))
	err := w.walk(body)
	sc.path, sc.calls, sc.texts = w.path[:0], w.calls[:0], w.texts[:0]
	if err != nil {
		*req = Request{}
		return err
	}
	req.Inferred = kind == KindUnknown && req.Kind != KindUnknown
	req.walked = true
	if req.nTexts > inlineTexts && req.nTexts <= w.keep {
		req.more = slices.Clone(w.texts[inlineTexts:])
	}
	return nil
}

// invalidBody is the error for a body the reader stopped in (err): invalid
// JSON in encoding/json's words, or nesting deeper than MaxDepth. topErr,
// a problem found at the top level before the reader stopped, comes first.
func invalidBody(body []byte, err, topErr error) error {
	var v struct{}
	jerr := json.Unmarshal(body, &v)
	var syn *json.SyntaxError
	if errors.As(jerr, &syn) && !strings.HasSuffix(syn.Error(), "exceeded max depth") {
		return syntaxError(body, syn)
	}
	if topErr != nil && syn == nil {
		return topErr
	}
	var deep *depthErr
	if errors.As(err, &deep) {
		return depthError(deep.offset)
	}
	if syn != nil { // deeper than the decoder goes
		return depthError(firstTooDeep(body, MaxDepth))
	}
	return &BodyError{Msg: "request body is not valid JSON", Offset: -1, Err: err}
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
	case rawType(top[tMessages]) == '[':
		// OpenAI chat puts system prompts among the messages; these
		// fields exist only in Anthropic's API.
		if present(top[tSystem]) || present(top[tAnthropicVersion]) || present(top[tStopSequences]) {
			return KindAnthropicMessages
		}
		return KindChat
	case present(top[tPrompt]):
		return KindCompletions
	case present(top[tInput]):
		if present(top[tInstructions]) || present(top[tMaxOutputTokens]) || present(top[tPreviousResponseID]) {
			return KindResponses
		}
		if present(top[tEncodingFormat]) || present(top[tDimensions]) {
			return KindEmbeddings
		}
		// Responses input lists items (objects); embeddings input lists
		// strings or token IDs.
		if rawType(top[tInput]) == '[' {
			switch rawType(bytes.TrimLeft(top[tInput][1:], " \t\r\n")) {
			case ']':
			case '{':
				return KindResponses
			default:
				return KindEmbeddings
			}
		}
	}
	return KindUnknown
}

func getString(raw []byte, field string) (string, error) {
	switch rawType(raw) {
	case 0, 'n':
		return "", nil
	case '"':
		return string(stringBytes(raw)), nil
	}
	return "", fieldError(field, "must be a string, got %s", typeName(rawType(raw)))
}

// stringIs reports whether raw is the JSON string s, without allocating
// unless raw holds escapes.
func stringIs(raw []byte, s string) bool {
	return rawType(raw) == '"' && string(stringBytes(raw)) == s
}

// stringBytes returns the contents of the JSON string raw, decoded,
// allocating only for a string with escapes.
func stringBytes(raw []byte) []byte {
	if rawType(raw) != '"' {
		return nil
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	return unquote(nil, raw)
}

func getBool(raw []byte, field string) (bool, error) {
	switch rawType(raw) {
	case 0, 'n', 'f':
		return false, nil
	case 't':
		return true, nil
	}
	return false, fieldError(field, "must be a boolean, got %s", typeName(rawType(raw)))
}

// getInt reads an integer of at least least (0 or 1), or least when
// absent. Integral floats (100.0, 1e3) are accepted, as the Python servers
// do. Larger values saturate at CostLimit, keeping cost arithmetic far
// from overflow.
func getInt(raw []byte, field string, least int) (int, error) {
	want := "a non-negative integer"
	if least > 0 {
		want = "a positive integer"
	}
	if n, ok := smallInt(raw); ok && n >= least {
		return min(n, CostLimit), nil
	}
	switch t := rawType(raw); {
	case t == 0 || t == 'n':
		return least, nil
	case t != '-' && (t < '0' || t > '9'):
		return 0, fieldError(field, "must be %s, got %s", want, typeName(t))
	}
	if f := number(raw); f >= float64(least) && f == math.Trunc(f) {
		return int(min(f, CostLimit)), nil
	}
	return 0, fieldError(field, "must be %s, got %s", want, clip(raw))
}

// getChoices reads n or best_of: 1 when absent, else 1 to MaxChoices.
func getChoices(raw []byte, field string) (int, error) {
	n, err := getInt(raw, field, 1)
	if n > MaxChoices {
		return 0, fieldError(field, "must be at most %d, got %s", MaxChoices, clip(raw))
	}
	return n, err
}

// number reads raw, a JSON number, as a float64: beyond float64's range
// (1e400) it is an infinity.
func number(raw []byte) float64 {
	f, _ := strconv.ParseFloat(string(raw), 64)
	return f
}

// smallInt reads raw when it is nothing but up to 15 digits, exactly and
// faster than strconv.ParseFloat.
func smallInt(raw []byte) (int, bool) {
	if len(raw) == 0 || len(raw) > 15 {
		return 0, false
	}
	n := 0
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// clip shortens a number quoted in an error message.
func clip(b []byte) string {
	const n = 40
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
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
