package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddy-fair-queue/caddy-fair-queue/fairqueue"
)

// FallbackConfig is a second upstream pool, typically another provider
// account, that the tenants it lists use when the primary cannot serve
// them: its account is out of quota, no primary upstream is healthy, or
// the request has waited half its wait budget. Responses say which channel
// served them (X-Fair-Queue-Channel: primary|fallback).
type FallbackConfig struct {
	// Tenants lists the tenants that may use the fallback.
	Tenants []string `json:"tenants,omitempty"`
	// ModelMap rewrites the request's "model" when it goes to the fallback
	// (the fallback provider may name the model differently).
	ModelMap map[string]string `json:"model_map,omitempty"`
	// MaxInflight is the fallback's concurrent requests per healthy
	// fallback upstream. Default: the queue's max_inflight.
	MaxInflight int `json:"max_inflight,omitempty"`
	// UpstreamQuota is the fallback account's requests and tokens per
	// minute.
	UpstreamQuota *UpstreamQuotaConfig `json:"upstream_quota,omitempty"`
	// ProxyRaw is the reverse_proxy that serves the fallback; its own
	// header_up sets the fallback's credentials. The caller's are not
	// passed on unless it sets them, e.g. header_up Authorization
	// {http.request.header.Authorization}.
	ProxyRaw json.RawMessage `json:"proxy,omitempty" caddy:"namespace=http.handlers inline_key=handler"`

	proxy *reverseproxy.Handler
	// strip is fallbackStripped plus the tenant_key header, if any.
	strip []string
}

// fallbackStripped are the request headers the fallback, another
// account, never receives from the caller (canonical): credentials, the
// caller's account at the primary, and the addresses behind the gateway
// as the caller sent them (the fallback's reverse_proxy still adds its
// own X-Forwarded-*). The tenant_key header is stripped as well.
var fallbackStripped = []string{
	"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key", "X-Goog-Api-Key",
	"Openai-Organization", "Openai-Project",
	"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip",
}

// fallbackRequest is r as the fallback's proxy gets it: a shallow copy
// without the caller's credentials (fallbackStripped). r keeps them, for
// a header_up that passes one on and a later attempt at the primary.
func (c *FallbackConfig) fallbackRequest(r *http.Request) *http.Request {
	out := new(http.Request)
	*out = *r
	out.Header = r.Header.Clone()
	for _, k := range c.strip {
		delete(out.Header, k)
	}
	return out
}

// headerChannel says which channel served a request.
const headerChannel = "X-Fair-Queue-Channel"

func (c *FallbackConfig) engine() *fairqueue.FallbackConfig {
	if c == nil {
		return nil
	}
	return &fairqueue.FallbackConfig{Tenants: c.Tenants, MaxInflight: c.MaxInflight,
		UpstreamQuota: c.UpstreamQuota.engine()}
}

// provisionFallback loads the fallback's proxy with the same defaults as
// the primary's.
func (h *Handler) provisionFallback() error {
	fb := h.Fallback
	if fb == nil {
		return nil
	}
	if len(fb.Tenants) == 0 {
		return fmt.Errorf("fallback: no tenants: list the tenants that may use it")
	}
	if fb.ProxyRaw == nil {
		return fmt.Errorf("fallback: needs a reverse_proxy")
	}
	if fb.MaxInflight < 0 {
		return fmt.Errorf("fallback: max_inflight must not be negative")
	}
	var err error
	if fb.proxy, err = loadReverseProxy(h.ctx, fb, &fb.ProxyRaw, "least_conn", "fallback proxy"); err != nil {
		return err
	}
	fb.strip = fallbackStripped
	if h.tenantHeader != "" && !slices.Contains(fb.strip, h.tenantHeader) {
		fb.strip = append(slices.Clip(fb.strip), h.tenantHeader)
	}
	return nil
}

// applyHealth sets the queue's capacity from the upstreams' health, the
// fallback's too.
func (h *Handler) applyHealth(q *fairqueue.Queue) {
	q.SetHealthy(countHealthy(h.proxy))
	if h.Fallback != nil {
		q.SetFallbackHealthy(countHealthy(h.Fallback.proxy))
	}
}

// fallbackBody rewrites the request's model for the fallback per
// model_map; the body is returned unchanged when no mapping applies.
func (h *Handler) fallbackBody(a *admission) []byte {
	if h.Fallback == nil || len(h.Fallback.ModelMap) == 0 || a.req == nil {
		return a.body
	}
	to, ok := h.Fallback.ModelMap[a.req.Model]
	if !ok {
		return a.body
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(a.body, &m); err != nil {
		return a.body
	}
	m["model"], _ = json.Marshal(to) // a string always marshals
	out, err := json.Marshal(m)
	if err != nil {
		return a.body
	}
	return out
}

// channelProxy is the proxy and body a dispatched request goes with:
// the fallback's when the queue dispatched it there (fallback).
func (h *Handler) channelProxy(a *admission, fallback bool, hdr http.Header) (*reverseproxy.Handler, []byte) {
	if h.Fallback == nil {
		return h.proxy, a.body
	}
	if fallback {
		hdr.Set(headerChannel, "fallback")
		fallbacks.WithLabelValues(h.Name, a.label).Inc()
		return h.Fallback.proxy, h.fallbackBody(a)
	}
	hdr.Set(headerChannel, "primary")
	return h.proxy, a.body
}

var fallbacks = counterVec("fallbacks_total",
	"Requests served by the fallback channel, by tenant.",
	"queue", "tenant")
