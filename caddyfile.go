package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/dustin/go-humanize"

	"github.com/caddy-fair-queue/caddy-fair-queue/degrade"
	"github.com/caddy-fair-queue/caddy-fair-queue/llmapi"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("fair_queue", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("fair_queue", httpcaddyfile.Before, "reverse_proxy")
}

// parseCaddyfile is UnmarshalCaddyfile, with the inner reverse_proxy
// finalized by the Caddyfile helper its handle_response blocks need.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	fq := new(Handler)
	rp, _, err := fq.unmarshalCaddyfile(h.Dispenser)
	if err == nil {
		fq.ProxyRaw, err = finalizedProxy(rp, h)
	}
	if err != nil {
		return nil, err
	}
	return fq, nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens; the syntax
// is in docs/configuration.md. It rejects a handle_response block in the
// inner reverse_proxy, which needs the helper only the fair_queue
// directive has.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	rp, handleResponse, err := h.unmarshalCaddyfile(d)
	if err != nil {
		return err
	}
	if handleResponse != nil {
		return handleResponse.Err("reverse_proxy: handle_response inside fair_queue is only supported when parsed as the fair_queue directive of a Caddyfile")
	}
	h.ProxyRaw, err = finalizedProxy(rp, httpcaddyfile.Helper{})
	return err
}

// cfParser holds the state of one fair_queue block being parsed.
type cfParser struct {
	d *caddyfile.Dispenser
	h *Handler

	// once records where each once-only subdirective was first given.
	once map[string]caddyfile.Token
	// classes and tenants record where each class and tenant was declared.
	classes map[string]caddyfile.Token
	tenants map[string]caddyfile.Token
	// refs are the class names used by tenants and degrade steps, checked
	// once the whole block is read (a class may be declared after its use).
	refs []classRef

	rp *reverseproxy.Handler
	// handleResponse points at the inner proxy's first handle_response.
	handleResponse *caddyfile.Dispenser
}

type classRef struct {
	tok   caddyfile.Token
	who   string // e.g. `tenant "marketing"`, "degrade step L1"
	class string
}

// unmarshalCaddyfile parses a fair_queue block into h and returns the inner
// reverse_proxy, not yet finalized, and, if that proxy has handle_response
// blocks, a dispenser at the first of them.
func (h *Handler) unmarshalCaddyfile(d *caddyfile.Dispenser) (*reverseproxy.Handler, *caddyfile.Dispenser, error) {
	d.Next() // consume the directive name
	start := d.Token()
	if d.NextArg() {
		return nil, nil, d.Errf("fair_queue takes no arguments, got %q: settings go in its block", d.Val())
	}
	p := &cfParser{
		d:       d,
		h:       h,
		once:    make(map[string]caddyfile.Token),
		classes: make(map[string]caddyfile.Token),
		tenants: make(map[string]caddyfile.Token),
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := p.subdirective(); err != nil {
			return nil, nil, err
		}
	}
	if p.rp == nil {
		return nil, nil, errAt(start, "fair_queue: missing reverse_proxy: add a 'reverse_proxy <upstreams...>' line to the fair_queue block")
	}
	if err := p.checkClassRefs(); err != nil {
		return nil, nil, err
	}
	return p.rp, p.handleResponse, nil
}

// subdirective parses the subdirective at the cursor, the first token of a
// line in the fair_queue block.
func (p *cfParser) subdirective() error {
	d, h := p.d, p.h
	sub := d.Val()
	if sub != "class" && sub != "tenant" {
		if err := p.onlyOnce(sub); err != nil {
			return err
		}
	}
	var err error
	switch sub {
	case "name":
		h.Name, err = p.oneArg(sub)
	case "tenant_key":
		h.TenantKey, err = p.oneArg(sub)
		if v := h.TenantKey; err == nil && !strings.Contains(v, "{") {
			err = d.Errf("tenant_key: %q has no placeholder, so every request would be one tenant; "+
				"use a placeholder such as {http.request.header.%s} or {http.auth.user.id}", v, v)
		}
	case "cost_unit":
		h.CostUnit, err = p.choiceArg(sub, "unit", "estimated_tokens", "requests", "learned")
	case "tokenizer":
		h.Tokenizer, err = p.choiceArg(sub, "tokenizer", llmapi.CL100kBase, llmapi.O200kBase, llmapi.Approx)
	case "default_max_tokens":
		err = posArg(p, sub, &h.DefaultMaxTokens)
	case "max_body":
		err = p.sizeArg(sub, &h.MaxBody)
	case "max_queue_bytes":
		err = p.sizeArg(sub, &h.MaxQueueBytes)
	case "body_timeout":
		h.BodyTimeout, err = p.durationArg(sub)
	case "max_request_tokens":
		err = posArg(p, sub, &h.MaxRequestTokens)
	case "handle_errors":
		if d.NextArg() {
			return d.Errf("handle_errors takes no arguments, got %q", d.Val())
		}
		h.HandleErrors = true
		err = p.noBlock(sub)
	case "max_inflight":
		err = posArg(p, sub, &h.MaxInflight)
	case "max_inflight_tokens":
		err = posArg(p, sub, &h.MaxInflightTokens)
	case "max_queue":
		err = posArg(p, sub, &h.MaxQueue)
	case "max_queue_tokens":
		err = posArg(p, sub, &h.MaxQueueTokens)
	case "class":
		err = p.class()
	case "tenant":
		err = p.tenant()
	case "default_tenant":
		err = p.defaultTenant()
	case "anti_starvation":
		err = p.antiStarvation()
	case "degrade":
		err = p.degrade()
	case "quota_defaults":
		err = p.quotaDefaults()
	case "circuit_break":
		err = p.circuitBreak()
	case "upstream_quota":
		h.UpstreamQuota, err = p.upstreamQuota(sub)
	case "fallback":
		err = p.fallback()
	case "cluster":
		err = p.cluster()
	case "reverse_proxy":
		err = p.reverseProxy()
	default:
		return d.Errf("unknown subdirective %q in fair_queue (want name, tenant_key, cost_unit, tokenizer, "+
			"default_max_tokens, max_body, body_timeout, max_request_tokens, max_inflight, max_inflight_tokens, "+
			"max_queue, max_queue_tokens, max_queue_bytes, class, tenant, default_tenant, handle_errors, "+
			"quota_defaults, circuit_break, upstream_quota, fallback, cluster, anti_starvation, degrade or reverse_proxy)", sub)
	}
	return err
}

// class parses `class <name> wait_budget <duration>`.
func (p *cfParser) class() error {
	d := p.d
	tok := d.Token()
	args := d.RemainingArgs()
	if len(args) != 3 || args[1] != "wait_budget" {
		return d.Errf("class: want 'class <name> wait_budget <duration>', got %q", strings.Join(append([]string{"class"}, args...), " "))
	}
	if err := p.noBlock("class"); err != nil {
		return err
	}
	name := args[0]
	if prev, ok := p.classes[name]; ok {
		return d.Errf("class %q declared twice (first at %s:%d)", name, prev.File, prev.Line)
	}
	p.classes[name] = tok
	budget, err := p.duration("class "+strconv.Quote(name)+": wait_budget", args[2])
	if err != nil {
		return err
	}
	p.h.Classes = append(p.h.Classes, &ClassConfig{Name: name, WaitBudget: budget})
	return nil
}

// tenant parses `tenant <name> [options...]`.
func (p *cfParser) tenant() error {
	d := p.d
	tok := d.Token()
	if !d.NextArg() {
		return d.Errf("tenant: missing tenant name: want 'tenant <name> [weight <n>] [class <class>] [wait_budget <duration>] [max_queue <n>]'")
	}
	name := d.Val()
	who := "tenant " + strconv.Quote(name)
	if prev, dup := p.tenants[name]; dup {
		return d.Errf("%s declared twice (first at %s:%d)", who, prev.File, prev.Line)
	}
	p.tenants[name] = tok
	tc, err := p.tenantOptions(who, tok, d.RemainingArgs())
	if err != nil {
		return err
	}
	if p.h.Tenants == nil {
		p.h.Tenants = make(map[string]*TenantConfig)
	}
	p.h.Tenants[name] = tc
	return nil
}

// defaultTenant parses `default_tenant [options...]` and
// `default_tenant reject`.
func (p *cfParser) defaultTenant() error {
	d := p.d
	tok := d.Token()
	args := d.RemainingArgs()
	switch {
	case len(args) == 0:
		return d.Errf("default_tenant: want 'default_tenant reject' or options: [weight <n>] [class <class>] [wait_budget <duration>] [max_queue <n>]")
	case args[0] == "reject":
		if err := p.noBlock("default_tenant"); err != nil {
			return err
		}
		if len(args) > 1 {
			return d.Errf("default_tenant: 'reject' takes no options, got %q", strings.Join(args[1:], " "))
		}
		p.h.RejectUnknownTenants = true
		return nil
	}
	tc, err := p.tenantOptions("default_tenant", tok, args)
	p.h.DefaultTenant = tc
	return err
}

// tenantBlock parses a tenant's optional block: `quota <pairs...>`.
func (p *cfParser) tenantBlock(who string, tc *TenantConfig) error {
	d := p.d
	return p.block(who, func(key string) error {
		if key != "quota" {
			return d.Errf("%s: unknown line %q in its block (want 'quota qps <n> tokens_per_min <n> ...')", who, key)
		}
		q := new(QuotaConfig)
		if err := p.quotaPairs(q, make(map[string]bool), who+": quota", d.RemainingArgs(), true); err != nil {
			return err
		}
		if q.QPS == 0 && q.TokensPerMin == 0 {
			return d.Errf("%s: quota sets no rate: want 'quota qps <n>', 'quota tokens_per_min <n>' or both", who)
		}
		tc.Quota = q
		return p.noBlock(who + ": quota")
	})
}

// fallback parses the fallback block: tenants, model_map, max_inflight,
// upstream_quota and its reverse_proxy.
func (p *cfParser) fallback() error {
	start := p.d.Token()
	fb := new(FallbackConfig)
	if err := p.block("fallback", func(key string) error { return p.fallbackSetting(fb, key) }, "model_map"); err != nil {
		return err
	}
	if fb.Tenants == nil || fb.ProxyRaw == nil {
		return errAt(start, "fallback: want 'tenants <name>...' and a 'reverse_proxy <upstreams...>' in its block")
	}
	p.h.Fallback = fb
	return nil
}

// fallbackSetting parses one line of the fallback block.
func (p *cfParser) fallbackSetting(fb *FallbackConfig, key string) error {
	d := p.d
	var err error
	switch key {
	case "tenants":
		fb.Tenants = d.RemainingArgs()
		if len(fb.Tenants) == 0 {
			return d.Errf("fallback: tenants wants the tenants that may use the fallback")
		}
		return p.noBlock("fallback: tenants")
	case "model_map":
		args := d.RemainingArgs()
		if len(args) != 2 {
			return d.Errf("fallback: want 'model_map <model> <fallback model>'")
		}
		if _, dup := fb.ModelMap[args[0]]; dup {
			return d.Errf("fallback: model_map for %q given twice", args[0])
		}
		if fb.ModelMap == nil {
			fb.ModelMap = map[string]string{}
		}
		fb.ModelMap[args[0]] = args[1]
		return p.noBlock("fallback: model_map")
	case "max_inflight":
		return posArg(p, "fallback: max_inflight", &fb.MaxInflight)
	case "upstream_quota":
		fb.UpstreamQuota, err = p.upstreamQuota("fallback: upstream_quota")
		return err
	case "reverse_proxy":
		rp, err := parseProxy(d.NextSegment())
		if err == nil {
			fb.ProxyRaw, err = finalizedProxy(rp, httpcaddyfile.Helper{})
		}
		if err != nil {
			return fmt.Errorf("fallback: %w", err)
		}
		return nil
	}
	return d.Errf("fallback: unknown setting %q (want tenants, model_map, max_inflight, upstream_quota or reverse_proxy)", key)
}

// upstreamQuota parses the arguments of an upstream_quota line: [tpm <n>]
// [rpm <n>] [burst <duration>] [reserve_burst <duration>].
func (p *cfParser) upstreamQuota(who string) (*UpstreamQuotaConfig, error) {
	d := p.d
	args := d.RemainingArgs()
	if err := p.noBlock(who); err != nil {
		return nil, err
	}
	uq := new(UpstreamQuotaConfig)
	err := p.pairs(who, args, make(map[string]bool), func(key, v string) error {
		var err error
		switch key {
		case "tpm", "rpm":
			f, perr := strconv.ParseFloat(v, 64)
			if perr != nil || !(f > 0) || math.IsInf(f, 0) {
				return d.Errf("%s: %s %q must be a positive number per minute", who, key, v)
			}
			if key == "tpm" {
				uq.TPM = f
			} else {
				uq.RPM = f
			}
		case "burst":
			uq.Burst, err = p.duration(who+": burst", v)
		case "reserve_burst":
			uq.ReserveBurst, err = p.duration(who+": reserve_burst", v)
		default:
			return d.Errf("%s: unknown setting %q (want tpm, rpm, burst or reserve_burst)", who, key)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if uq.TPM == 0 && uq.RPM == 0 {
		return nil, d.Errf("%s: want 'upstream_quota tpm <n> rpm <n>' (at least one of them)", who)
	}
	return uq, nil
}

// circuitBreak parses the circuit_break block: trigger, recover, hold,
// window, saturation and order, one per line. The engine checks the ranges
// (degrade.CircuitConfig.Validate) and that tenants' tiers are in order.
func (p *cfParser) circuitBreak() error {
	cb := new(CircuitBreakConfig)
	if err := p.block("circuit_break", func(key string) error { return p.circuitSetting(cb, key) }); err != nil {
		return err
	}
	if cb.Order == nil {
		return p.d.Errf("circuit_break: missing 'order <lowest tier> ... <highest tier>'")
	}
	p.h.CircuitBreak = cb
	return nil
}

// circuitSetting parses one line of the circuit_break block.
func (p *cfParser) circuitSetting(cb *CircuitBreakConfig, key string) error {
	d := p.d
	args := d.RemainingArgs()
	if err := p.noBlock("circuit_break: " + key); err != nil {
		return err
	}
	if key == "order" {
		if len(args) < 2 || slices.Contains(args, "}") {
			return d.Errf("circuit_break: order wants at least two tiers, lowest first, on its line (e.g. 'order low mid high')")
		}
		cb.Order = args
		return nil
	}
	if len(args) != 1 {
		return d.Errf("circuit_break: %s wants one value, got %d", key, len(args))
	}
	v := args[0]
	var err error
	switch key {
	case "trigger", "recover":
		f, perr := strconv.ParseFloat(v, 64)
		if perr != nil || !(f > 0) || math.IsInf(f, 0) {
			return d.Errf("circuit_break: %s %q must be a positive number (a ratio of demand to capacity, e.g. 1.3)", key, v)
		}
		if key == "trigger" {
			cb.Trigger = f
		} else {
			cb.Recover = f
		}
	case "saturation":
		f, perr := parseShare(v)
		if perr != nil || !(f > 0 && f <= 1) {
			return d.Errf("circuit_break: saturation %q must be a share of the window in (0, 1] (e.g. 0.9 or 90%%)", v)
		}
		cb.Saturation = f
	case "hold":
		cb.Hold, err = p.duration("circuit_break: hold", v)
	case "window":
		cb.Window, err = p.duration("circuit_break: window", v)
	default:
		return d.Errf("circuit_break: unknown setting %q (want trigger, recover, hold, window, saturation or order)", key)
	}
	return err
}

// quotaDefaults parses the quota_defaults block: one setting per line, or
// several pairs on a line.
func (p *cfParser) quotaDefaults() error {
	q := new(QuotaConfig)
	seen := make(map[string]bool)
	err := p.block("quota_defaults", func(key string) error {
		return p.quotaPairs(q, seen, "quota_defaults", append([]string{key}, p.d.RemainingArgs()...), false)
	})
	if err != nil {
		return err
	}
	p.h.QuotaDefaults = q
	return nil
}

// quotaPairs parses `<setting> <value>` pairs of a quota into q: qps and
// tokens_per_min (rates, only when rates is set), token_to_qps_weight,
// joint_cap, burst_window and burst_allow, each once (seen). Ranges are
// checked when the quota is compiled (package quota names the field and
// the range).
func (p *cfParser) quotaPairs(q *QuotaConfig, seen map[string]bool, who string, args []string, rates bool) error {
	d := p.d
	want := "token_to_qps_weight, joint_cap, burst_window or burst_allow"
	if rates {
		want = "qps, tokens_per_min, " + want
	}
	if slices.Contains(args, "}") {
		return d.Errf("%s: a closing brace must be on a line of its own (Caddyfile blocks span lines)", who)
	}
	return p.pairs(who, args, seen, func(key, v string) error {
		return p.quotaPair(q, who, key, v, rates, want)
	})
}

// pairs calls set for each `<key> <value>` pair of args, each key at most
// once (seen). A key not among known, when given, is refused before its
// value is looked at; without known, set refuses unknown keys.
func (p *cfParser) pairs(who string, args []string, seen map[string]bool, set func(key, v string) error, known ...string) error {
	for i := 0; i < len(args); i += 2 {
		key := args[i]
		if known != nil && !slices.Contains(known, key) {
			return p.d.Errf("%s: unknown option %q (want %s)", who, key, oneOf(known))
		}
		if seen[key] {
			return p.d.Errf("%s: %s given twice", who, key)
		}
		seen[key] = true
		if i+1 >= len(args) {
			return p.d.Errf("%s: missing value after %s", who, key)
		}
		if err := set(key, args[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// quotaPair sets one `<setting> <value>` pair of a quota (see quotaPairs).
func (p *cfParser) quotaPair(q *QuotaConfig, who, key, v string, rates bool, want string) error {
	d := p.d
	num := func() (float64, error) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, d.Errf("%s: %s %q must be a number >= 0", who, key, v)
		}
		return f, nil
	}
	switch key {
	case "qps", "tokens_per_min":
		if !rates {
			return d.Errf("%s: %s belongs in a tenant's quota (want %s)", who, key, want)
		}
		f, err := num()
		if key == "qps" {
			q.QPS = f
		} else {
			q.TokensPerMin = f
		}
		return err
	case "token_to_qps_weight", "joint_cap", "burst_allow":
		if key == "token_to_qps_weight" && v == "auto" {
			q.TokenToQPSWeightAuto = true
			return nil
		}
		f, err := num()
		if err != nil {
			return err
		}
		switch key {
		case "token_to_qps_weight":
			q.TokenToQPSWeight = &f
		case "joint_cap":
			q.JointCap = &f
		default:
			q.BurstAllow = &f
		}
		return nil
	case "burst_window":
		var err error
		q.BurstWindow, err = p.duration(who+": burst_window", v)
		return err
	}
	return d.Errf("%s: unknown setting %q (want %s)", who, key, want)
}

// tenantOptions parses a tenant's options ([weight <n>] [class <class>]
// ..., in any order, each at most once) and its block.
func (p *cfParser) tenantOptions(who string, tok caddyfile.Token, args []string) (*TenantConfig, error) {
	d := p.d
	tc := new(TenantConfig)
	opts := []string{"weight", "class", "wait_budget", "max_queue", "max_inflight", "max_request_tokens", "tier", "reserve"}
	err := p.pairs(who, args, make(map[string]bool), func(opt, v string) error {
		var err error
		switch opt {
		case "weight":
			w, perr := strconv.ParseFloat(v, 64)
			if perr != nil || !(w > 0) || math.IsInf(w, 0) {
				return d.Errf("%s: weight %q must be a positive number", who, v)
			}
			tc.Weight = w
		case "tier":
			tc.Tier = v
		case "reserve":
			if tc.Reserve, err = parseReserve(v); err != nil {
				err = d.Errf("%s: %v", who, err)
			}
		case "class":
			tc.Class = v
			p.refs = append(p.refs, classRef{tok: tok, who: who, class: v})
		case "wait_budget":
			tc.WaitBudget, err = p.duration(who+": wait_budget", v)
		case "max_queue":
			err = parsePositive(p, who+": max_queue", v, &tc.MaxQueue)
		case "max_inflight":
			err = parsePositive(p, who+": max_inflight", v, &tc.MaxInflight)
		case "max_request_tokens":
			err = parsePositive(p, who+": max_request_tokens", v, &tc.MaxRequestTokens)
		}
		return err
	}, opts...)
	if err != nil {
		return nil, err
	}
	return tc, p.tenantBlock(who, tc)
}

// antiStarvation parses `anti_starvation off` and the anti_starvation block.
func (p *cfParser) antiStarvation() error {
	d := p.d
	as := new(AntiStarvation)
	p.h.AntiStarvation = as
	args := d.RemainingArgs()
	switch {
	case len(args) == 1 && args[0] == "off":
		zero, off := 0.0, false
		as.BoostShareMax, as.FastFail = &zero, &off
		return p.noBlock("anti_starvation off")
	case len(args) > 0:
		return d.Errf("anti_starvation: unexpected argument %q (want 'anti_starvation off' or a block)", args[0])
	}
	opened := false
	err := p.block("anti_starvation", func(opt string) error {
		opened = true
		return p.antiStarvationOption(as, opt)
	})
	if err != nil {
		return err
	}
	// NextBlock stops on the "}" of an empty block: anti_starvation {}
	// means all defaults. Without a block the cursor is still on the
	// subdirective.
	if !opened && !isCloseBrace(d.Token()) {
		return d.Errf("anti_starvation: want 'anti_starvation off' or a block with boost_share_max, per_tenant_boost_hourly or fast_fail")
	}
	return nil
}

// antiStarvationOption parses one line of the anti_starvation block.
func (p *cfParser) antiStarvationOption(as *AntiStarvation, opt string) error {
	d := p.d
	if !slices.Contains([]string{"boost_share_max", "per_tenant_boost_hourly", "fast_fail", "throughput_prior"}, opt) {
		return d.Errf("anti_starvation: unknown option %q (want boost_share_max, per_tenant_boost_hourly, fast_fail or throughput_prior)", opt)
	}
	what := "anti_starvation: " + opt
	v, err := p.oneArg(what)
	if err != nil {
		return err
	}
	switch opt {
	case "boost_share_max":
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return d.Errf("%s: %q must be a fraction of capacity from 0 (no boosting) to 1", what, v)
		}
		as.BoostShareMax = &f
	case "per_tenant_boost_hourly":
		n, err := strconv.ParseInt(v, 10, strconv.IntSize)
		if err != nil || n < 0 {
			return d.Errf("%s: %q must be a whole number >= 0 (0: no per-tenant cap)", what, v)
		}
		ni := int(n)
		as.PerTenantBoostHourly = &ni
	case "fast_fail":
		if v != "on" && v != "off" {
			return d.Errf("%s: want on or off, got %q", what, v)
		}
		b := v == "on"
		as.FastFail = &b
	case "throughput_prior":
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0) || math.IsInf(f, 0) {
			return d.Errf("%s: %q must be a rate in cost units per second per upstream, >= 0", what, v)
		}
		as.ThroughputPrior = f
	}
	return nil
}

// degrade parses the degrade block.
func (p *cfParser) degrade() error {
	d := p.d
	if args := d.RemainingArgs(); len(args) > 0 {
		return d.Errf("degrade: unexpected argument %q (the ladder goes in a block)", args[0])
	}
	start := d.Token()
	dc := new(DegradeConfig)
	var steps []degrade.Step
	var stepClasses []string
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		tok := d.Token()
		name := d.Val()
		if name == "hold" {
			err := p.onlyOnce("degrade: hold")
			if err == nil {
				dc.Hold, err = p.durationArg("degrade: hold")
			}
			if err != nil {
				return err
			}
			continue
		}
		args := append([]string{name}, d.RemainingArgs()...)
		if err := p.noBlock("degrade step " + name); err != nil {
			return err
		}
		// ParseStep checks the step on its own; errors read
		// "degrade step <name>: ...".
		step, err := degrade.ParseStep(args)
		if err != nil {
			return d.WrapErr(err)
		}
		if step.Trigger > 1 {
			return d.Errf("degrade step %s: trigger %s is above 1, a full queue, so the step would never engage (levels are fractions of the queue: 0.70 is 70%%)",
				step.Name, args[2])
		}
		// NewLadder checks the step against the ones before it (duplicate
		// name, rising triggers, recovery lines); classes are checked when
		// the whole fair_queue block is read.
		steps = append(steps, step)
		stepClasses = append(stepClasses, step.Action.Class)
		if _, err := degrade.NewLadder(steps, 0, stepClasses); err != nil {
			return d.WrapErr(err)
		}
		ds := &DegradeStep{Name: step.Name, Trigger: step.Trigger, Recover: step.Recover,
			Action: step.Action.Kind.String(), Class: step.Action.Class,
			MaxInputTokens: step.Action.MaxInputTokens, MaxTokens: step.Action.MaxTokens}
		if step.Action.Kind == degrade.ActionThrottle {
			ds.Rate = args[len(args)-1] // as written; ParseStep validated it
		}
		dc.Steps = append(dc.Steps, ds)
		p.refs = append(p.refs, classRef{tok: tok, who: "degrade step " + step.Name, class: step.Action.Class})
	}
	if len(dc.Steps) == 0 {
		return errAt(start, "degrade: no steps: want lines like 'L1 trigger 0.70 recover 0.60 pause batch' in a block")
	}
	p.h.Degrade = dc
	return nil
}

// reverseProxy parses the inner reverse_proxy with Caddy's own parser.
func (p *cfParser) reverseProxy() error {
	seg := p.d.NextSegment()
	rp, err := parseProxy(seg)
	if err != nil {
		return err
	}
	p.rp = rp
	// Find a handle_response subdirective, which only the Caddyfile helper
	// can finalize.
	sd := caddyfile.NewDispenser(seg)
	sd.Next()
	sd.RemainingArgs()
	for sd.NextBlock(0) {
		if sd.Nesting() == 1 && sd.Val() == "handle_response" {
			p.handleResponse = caddyfile.NewDispenser([]caddyfile.Token{sd.Token()})
			p.handleResponse.Next()
			break
		}
	}
	return nil
}

// parseProxy parses one reverse_proxy segment and requires upstreams.
func parseProxy(seg caddyfile.Segment) (*reverseproxy.Handler, error) {
	rp := new(reverseproxy.Handler)
	if err := rp.UnmarshalCaddyfile(caddyfile.NewDispenser(seg)); err != nil {
		return nil, fmt.Errorf("reverse_proxy: %w", err)
	}
	if len(rp.Upstreams) == 0 && rp.DynamicUpstreamsRaw == nil {
		return nil, errAt(seg[0], "reverse_proxy: no upstreams: list them after reverse_proxy, or use 'to' or 'dynamic' in its block")
	}
	return rp, nil
}

// finalizedProxy finalizes a parsed reverse_proxy with the Caddyfile helper
// and returns it as a handler's JSON.
func finalizedProxy(rp *reverseproxy.Handler, h httpcaddyfile.Helper) (json.RawMessage, error) {
	if err := rp.FinalizeUnmarshalCaddyfile(h); err != nil {
		return nil, fmt.Errorf("reverse_proxy: %w", err)
	}
	return caddyconfig.JSONModuleObject(rp, "handler", "reverse_proxy", nil), nil
}

// checkClassRefs checks that every class named by a tenant or a degrade
// step is a built-in class or declared by a class line.
func (p *cfParser) checkClassRefs() error {
	known := slices.Collect(maps.Keys(p.classes))
	for _, c := range builtinClasses {
		known = append(known, c.Name)
	}
	slices.Sort(known)
	known = slices.Compact(known)
	for _, r := range p.refs {
		if !slices.Contains(known, r.class) {
			return errAt(r.tok, "%s: unknown class %q (known classes: %s; declare others with 'class <name> wait_budget <duration>')",
				r.who, r.class, strings.Join(known, ", "))
		}
	}
	return nil
}

// onlyOnce fails if sub (a subdirective, or "degrade: hold") was already
// given in this block.
func (p *cfParser) onlyOnce(sub string) error {
	if prev, ok := p.once[sub]; ok {
		return p.d.Errf("%s given twice (first at %s:%d)", sub, prev.File, prev.Line)
	}
	p.once[sub] = p.d.Token()
	return nil
}

// oneArg returns the single argument of the subdirective at the cursor.
func (p *cfParser) oneArg(what string) (string, error) {
	args := p.d.RemainingArgs()
	if len(args) != 1 {
		return "", p.d.Errf("%s: want exactly one argument, got %d", what, len(args))
	}
	return args[0], p.noBlock(what)
}

// choiceArg returns the single argument of the subdirective at the
// cursor, one of valid (a noun names them in the error).
func (p *cfParser) choiceArg(sub, noun string, valid ...string) (string, error) {
	v, err := p.oneArg(sub)
	if err == nil && !slices.Contains(valid, v) {
		err = p.d.Errf("%s: unknown %s %q (want %s)", sub, noun, v, oneOf(valid))
	}
	return v, err
}

// oneOf lists choices for an error: "a, b or c".
func oneOf(choices []string) string {
	last := len(choices) - 1
	return strings.Join(choices[:last], ", ") + " or " + choices[last]
}

// block parses a block of settings, one per line: the line has no
// arguments, and each setting is given at most once unless repeatable;
// set parses the line at the cursor, whose first token is key.
func (p *cfParser) block(sub string, set func(key string) error, repeatable ...string) error {
	d := p.d
	if args := d.RemainingArgs(); len(args) > 0 {
		return d.Errf("%s: unexpected argument %q (the settings go in a block)", sub, args[0])
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		if seen[key] && !slices.Contains(repeatable, key) {
			return d.Errf("%s: %s given twice", sub, key)
		}
		seen[key] = true
		if err := set(key); err != nil {
			return err
		}
	}
	return nil
}

// noBlock fails if a block opens after the current line.
func (p *cfParser) noBlock(what string) error {
	tok := p.d.Token()
	// NextBlock enters a block, or consumes an empty one ("{}") and
	// stops on its "}".
	if p.d.NextBlock(p.d.Nesting()) || (isCloseBrace(p.d.Token()) && !isCloseBrace(tok)) {
		return errAt(tok, "%s: unexpected block", what)
	}
	return nil
}

// posArg parses the single argument of sub, a positive integer.
func posArg[T int | int64](p *cfParser, sub string, dst *T) error {
	v, err := p.oneArg(sub)
	if err != nil {
		return err
	}
	return parsePositive(p, sub+":", v, dst)
}

// parsePositive sets *dst to v, a positive integer; what prefixes the
// error.
func parsePositive[T int | int64](p *cfParser, what, v string, dst *T) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || int64(T(n)) != n {
		return p.d.Errf("%s %q must be a positive integer", what, v)
	}
	*dst = T(n)
	return nil
}

// sizeArg parses a positive size with units (8MB, 512KiB).
func (p *cfParser) sizeArg(sub string, dst *int64) error {
	v, err := p.oneArg(sub)
	if err != nil {
		return err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return p.d.Errf("%s: %q is not a size (e.g. 8MB, 512KiB)", sub, v)
	}
	if n == 0 || n > math.MaxInt64 {
		return p.d.Errf("%s: %q must be above 0 and below 8EiB", sub, v)
	}
	*dst = int64(n)
	return nil
}

// duration parses a positive Caddy duration.
func (p *cfParser) duration(what, v string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, p.d.Errf("%s: %q is not a duration (e.g. 500ms, 15s, 5m): %v", what, v, err)
	}
	if dur <= 0 {
		return 0, p.d.Errf("%s: %q must be positive", what, v)
	}
	return caddy.Duration(dur), nil
}

func isCloseBrace(t caddyfile.Token) bool { return t.Text == "}" }

// errAt is Dispenser.Errf for a token the cursor has left: the error names
// the token's file and line.
func errAt(tok caddyfile.Token, format string, args ...any) error {
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.Errf(format, args...)
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
