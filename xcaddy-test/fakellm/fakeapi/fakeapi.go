// Package fakeapi holds the bodies of fakellm's /debug endpoints, shared by
// the fake and the harness that reads them.
package fakeapi

// Outcomes recorded in /debug/requests.
const (
	OutcomeInFlight   = "in_flight"
	OutcomeOK         = "ok"
	OutcomeClientGone = "client_gone"  // client disconnected while waiting or generating
	OutcomeBadRequest = "bad_request"  // body was not a valid request (400)
	OutcomeAborted    = "aborted"      // the server shut down mid-request
	OutcomeLimited    = "rate_limited" // beyond the account's TPM/RPM (429)
)

// Record is one request as the fake saw it: an entry of /debug/requests.
type Record struct {
	Seq  uint64 `json:"seq"`
	Path string `json:"path"`
	// Tenant and TestID are the X-Tenant-ID and X-Test-Id request headers.
	Tenant string `json:"tenant"`
	TestID string `json:"test_id"`
	// Headers holds the first value of every request header, so a test can
	// prove what the gateway added or stripped.
	Headers map[string]string `json:"headers"`
	// Body is the first 64 KiB of the body; BodyBytes its full length.
	Body      string `json:"body"`
	BodyBytes int    `json:"body_bytes"`
	Stream    bool   `json:"stream"`
	// PromptTokens and OutputTokens are the fake's own counts (words).
	PromptTokens     int   `json:"prompt_tokens"`
	OutputTokens     int   `json:"output_tokens"`
	ReceivedUnixNano int64 `json:"received_unix_nano"`
	// StartedUnixNano is when the request got a slot (0: never). StartSeq
	// numbers slot grants 1, 2, 3... so start order is exact even when two
	// clock readings tie.
	StartedUnixNano int64  `json:"started_unix_nano"`
	StartSeq        uint64 `json:"start_seq"`
	// GeneratedUnixNano is when the generation ended, just before the
	// answer's last bytes were written (0: never): a request sent on this
	// one's completion arrives after it, however late the server's own
	// bookkeeping (FinishedUnixNano) runs on a busy machine.
	GeneratedUnixNano int64  `json:"generated_unix_nano"`
	FinishedUnixNano  int64  `json:"finished_unix_nano"`
	Status            int    `json:"status"`
	Outcome           string `json:"outcome"`
}

// Stats is the body of /debug/stats: counters since the last reset, and
// live gauges.
type Stats struct {
	Received   uint64 `json:"received"`
	Completed  uint64 `json:"completed"`
	ClientGone uint64 `json:"client_gone"`
	BadRequest uint64 `json:"bad_request"`
	// RateLimited counts 429s for the account's TPM/RPM; ChargedTokens
	// what the account counted of the requests it took (prompt +
	// max_tokens).
	RateLimited   uint64 `json:"rate_limited"`
	ChargedTokens uint64 `json:"charged_tokens"`
	Running       int    `json:"running"`
	Waiting       int    `json:"waiting"`
	// Held counts the requests holding a slot, before their first token,
	// until Resume: with the server paused and Held at Slots, no slot frees.
	Held    int  `json:"held"`
	Paused  bool `json:"paused"`
	Healthy bool `json:"healthy"`
}
