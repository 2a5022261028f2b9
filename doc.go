// Package caddyfairqueue is the Caddy glue of caddy-fair-queue: the
// http.handlers.fair_queue handler and its fair_queue Caddyfile directive.
//
// The handler sits in front of its own reverse_proxy. For each request it
// resolves the tenant (a placeholder, by default the X-Tenant-ID header),
// reads and parses the body (OpenAI chat/completions, completions, responses,
// embeddings; Anthropic messages), estimates its token cost, and hands it to
// the scheduler in package fairqueue, which holds it in the tenant's
// sub-queue until weighted fair queuing grants it a slot on a healthy
// upstream. When the response ends, the usage the model server reported (or
// the streamed text, counted) back-fills the tenant's account.
//
// Scheduling logic lives in fairqueue, budget and degrade; this package only
// adapts HTTP to them: module.go (config, provisioning), caddyfile.go
// (parsing), serve.go (the request path), body.go (reading bodies within
// bounds of bytes and time, lingering after a refusal), record.go (reading
// usage from responses), respond.go (the error contract), refusal.go
// (answering the scheduler's refusals), pool.go (state that survives
// reloads), metrics.go and degrade.go (wiring of the ladder).
package caddyfairqueue
