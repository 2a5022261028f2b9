package caddyfairqueue

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/budget"
	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

// apiError is an answer the gateway gives itself, in the error shape of
// the request's API (errorShape) so official clients surface the message.
type apiError struct {
	status     int
	code       string
	message    string
	retryAfter time.Duration
	// reason is the quota dimension of a quota_exceeded answer (qps,
	// tokens, joint), in the error object's "reason" field.
	reason string
	// quota is the tenant's quota standing for the x-ratelimit-* headers,
	// when the refusal already knows it.
	quota *quota.Status
}

// errorShape is the error body a client of the request's API reads.
type errorShape uint8

const (
	// shapeOpenAI: {"error":{"message","type","code","reason"}}, for the
	// OpenAI routes and anything else.
	shapeOpenAI errorShape = iota
	// shapeAnthropic: {"type":"error","error":{"type","message","details":
	// {"error_code","reason"}}}, for Anthropic's /v1/messages, whose
	// clients would show an OpenAI body as raw JSON.
	shapeAnthropic
)

// shapeFor is the error shape of a request to path.
func shapeFor(path string) errorShape {
	if llmapi.KindFromPath(path) == llmapi.KindAnthropicMessages {
		return shapeAnthropic
	}
	return shapeOpenAI
}

// errorType maps a status to the error type clients switch on: OpenAI's
// types, which Anthropic's Messages API shares but for 413.
func errorType(status int, shape errorShape) string {
	switch status {
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusBadGateway:
		return "api_error"
	case http.StatusRequestEntityTooLarge:
		if shape == shapeAnthropic {
			return "request_too_large"
		}
	}
	return "invalid_request_error"
}

func (e *apiError) write(w http.ResponseWriter, shape errorShape) {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Cache-Control", "no-store")
	setRetryAfter(hdr, e.retryAfter)
	if e.quota != nil {
		setRateLimitHeaders(hdr, *e.quota)
	}
	w.WriteHeader(e.status)
	typ := errorType(e.status, shape)
	if shape == shapeAnthropic {
		type details struct {
			ErrorCode string `json:"error_code"`
			Reason    string `json:"reason,omitempty"`
		}
		type anthropicError struct {
			Type    string  `json:"type"`
			Message string  `json:"message"`
			Details details `json:"details"`
		}
		_ = json.NewEncoder(w).Encode(struct {
			Type  string         `json:"type"`
			Error anthropicError `json:"error"`
		}{"error", anthropicError{typ, e.message, details{e.code, e.reason}}})
		return
	}
	type openAIError struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
		Reason  string `json:"reason,omitempty"`
	}
	_ = json.NewEncoder(w).Encode(struct {
		Error openAIError `json:"error"`
	}{openAIError{e.message, typ, e.code, e.reason}})
}

// setRetryAfter sets Retry-After in whole seconds (rounded up) and
// retry-after-ms, which the official OpenAI clients read first.
func setRetryAfter(hdr http.Header, d time.Duration) {
	if d <= 0 {
		return
	}
	d = min(d, budget.MaxRetryAfter) // the one cap, for both headers
	hdr.Set("Retry-After", strconv.Itoa(budget.RetryAfterSeconds(d)))
	hdr.Set("Retry-After-Ms", strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10))
}

// rejectionError maps a scheduler rejection to the HTTP contract.
func rejectionError(rej *fairqueue.Rejection) *apiError {
	e := &apiError{retryAfter: rej.RetryAfter}
	switch rej.Reason {
	case fairqueue.ReasonTenantQueueFull:
		e.status, e.code = http.StatusTooManyRequests, "tenant_queue_full"
		e.message = "Your queue at this gateway is full (" + rej.Detail + "). Retry after the time in Retry-After, or send fewer requests at once."
	case fairqueue.ReasonClassThrottled:
		e.status, e.code = http.StatusTooManyRequests, "class_throttled"
		e.message = "The gateway is overloaded and limits this request's class (" + rej.Detail + "). It was not queued; retry after the time in Retry-After."
	case fairqueue.ReasonBudgetExceeded:
		e.status, e.code = http.StatusServiceUnavailable, "wait_budget_exceeded"
		e.message = "The gateway is busy and this request cannot start within its wait budget (" + rej.Detail + "). It was not queued; retry after the time in Retry-After."
		if rej.WhileQueued {
			e.message = "The gateway is busy and this request, while queued, turned out unable to start within its wait budget (" + rej.Detail + "). It was taken out of the queue and not sent upstream; retry after the time in Retry-After."
		}
	case fairqueue.ReasonQueueTimeout:
		e.status, e.code = http.StatusServiceUnavailable, "queue_timeout"
		e.message = "The request waited its whole wait budget in the queue without reaching a model server. It was not sent upstream; retry after the time in Retry-After."
	case fairqueue.ReasonNoCapacity:
		e.status, e.code = http.StatusServiceUnavailable, "server_busy"
		e.message = "No model server is healthy right now. The request was not queued; retry after the time in Retry-After."
	case fairqueue.ReasonClosed:
		e.status, e.code = http.StatusServiceUnavailable, "server_busy"
		e.message = "The gateway's configuration changed and this request's queue is gone (" + rej.Detail + "). It was not sent upstream; retry after the time in Retry-After."
	case fairqueue.ReasonQuotaExceeded:
		e.status, e.code, e.reason, e.quota = http.StatusTooManyRequests, "quota_exceeded", string(rej.Quota), rej.QuotaStatus
		e.message = "Your " + quotaWhat(rej.Quota) + " quota does not allow this request within its wait budget (" + rej.Detail + "). It was not queued; retry after the time in Retry-After."
		if rej.WhileQueued {
			e.message = "Your " + quotaWhat(rej.Quota) + " quota does not allow this request within its wait budget (" + rej.Detail + "). It was taken out of the queue and not sent upstream; retry after the time in Retry-After."
		}
	case fairqueue.ReasonCircuitOpen:
		e.status, e.code = http.StatusTooManyRequests, "circuit_open"
		e.message = "The gateway is overloaded and sheds your tier of service for now (" + rej.Detail + "). It was not queued; retry after the time in Retry-After."
	case fairqueue.ReasonTooLarge:
		e.status, e.code, e.retryAfter = http.StatusBadRequest, codeContextLength, 0
		e.message = "This request is larger than the gateway can ever dispatch (" + rej.Detail + "). Lower max_tokens or shorten the prompt."
	default:
		e.status, e.code = http.StatusServiceUnavailable, "server_busy"
		e.message = "The gateway's queue is full (" + rej.Detail + "). The request was not queued; retry after the time in Retry-After."
	}
	return e
}

// quotaWhat names a quota dimension for people.
func quotaWhat(d quota.Dimension) string {
	switch d {
	case quota.DimQPS:
		return "requests-per-second"
	case quota.DimTokens:
		return "tokens-per-minute"
	case quota.DimJoint:
		return "joint (requests + tokens)"
	}
	return string(d)
}
