package caddyfairqueue

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func ptr[T any](v T) *T { return &v }

func dur(d time.Duration) caddy.Duration { return caddy.Duration(d) }

// parseBlock runs UnmarshalCaddyfile on a fair_queue block; errors name the
// file "Testfile".
func parseBlock(input string) (*Handler, error) {
	h := new(Handler)
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return h, err
}

// designBlock is the fair_queue block of DESIGN.md section 7, verbatim
// (aligned columns and comments included).
const designBlock = `fair_queue {
		name        default
		tenant_key  {http.request.header.X-Tenant-ID}
		cost_unit   estimated_tokens          # or: requests
		tokenizer   cl100k_base               # o200k_base | approx
		default_max_tokens 512
		max_body    8MB
		max_inflight 16                       # per healthy upstream
		max_inflight_tokens 131072            # optional, per healthy upstream
		max_queue   10000
		max_queue_tokens 20000000             # optional

		class realtime    wait_budget 5s
		class interactive wait_budget 15s
		class batch       wait_budget 300s

		tenant marketing  weight 30 class realtime    wait_budget 5s
		tenant cs_bot     weight 30 class interactive wait_budget 15s
		tenant data_batch weight 15 class batch       wait_budget 300s max_queue 2000
		default_tenant    weight 1  class batch       # or: default_tenant reject

		anti_starvation {
			boost_share_max         0.10
			per_tenant_boost_hourly 200
		}
		degrade {
			L1 trigger 0.70 recover 0.60 pause batch
			L2 trigger 0.85 recover 0.75 light_mode interactive max_input_tokens 2048
			L3 trigger 0.95 recover 0.90 throttle realtime 20/s
		}
		reverse_proxy 127.0.0.1:8001 127.0.0.1:8002 {
			health_uri      /health
			health_interval 1s
		}
	}`

func TestUnmarshalCaddyfile(t *testing.T) {
	const proxy1 = `{"handler":"reverse_proxy","upstreams":[{"dial":"localhost:8001"}]}`
	tests := []struct {
		name  string
		input string
		want  Handler // ProxyRaw compared as JSON
	}{
		{
			name:  "design section 7",
			input: designBlock,
			want: Handler{
				Name:              "default",
				TenantKey:         "{http.request.header.X-Tenant-ID}",
				CostUnit:          "estimated_tokens",
				Tokenizer:         "cl100k_base",
				DefaultMaxTokens:  512,
				MaxBody:           8_000_000,
				MaxInflight:       16,
				MaxInflightTokens: 131072,
				MaxQueue:          10000,
				MaxQueueTokens:    20000000,
				Classes: []*ClassConfig{
					{Name: "realtime", WaitBudget: dur(5 * time.Second)},
					{Name: "interactive", WaitBudget: dur(15 * time.Second)},
					{Name: "batch", WaitBudget: dur(300 * time.Second)},
				},
				Tenants: map[string]*TenantConfig{
					"marketing":  {Weight: 30, Class: "realtime", WaitBudget: dur(5 * time.Second)},
					"cs_bot":     {Weight: 30, Class: "interactive", WaitBudget: dur(15 * time.Second)},
					"data_batch": {Weight: 15, Class: "batch", WaitBudget: dur(300 * time.Second), MaxQueue: 2000},
				},
				DefaultTenant: &TenantConfig{Weight: 1, Class: "batch"},
				AntiStarvation: &AntiStarvation{
					BoostShareMax:        ptr(0.10),
					PerTenantBoostHourly: ptr(200),
				},
				Degrade: &DegradeConfig{Steps: []*DegradeStep{
					{Name: "L1", Trigger: 0.70, Recover: 0.60, Action: "pause", Class: "batch"},
					{Name: "L2", Trigger: 0.85, Recover: 0.75, Action: "light_mode", Class: "interactive", MaxInputTokens: 2048},
					{Name: "L3", Trigger: 0.95, Recover: 0.90, Action: "throttle", Class: "realtime", Rate: "20/s"},
				}},
				ProxyRaw: json.RawMessage(`{"handler":"reverse_proxy",
					"health_checks":{"active":{"interval":1000000000,"uri":"/health"}},
					"upstreams":[{"dial":"127.0.0.1:8001"},{"dial":"127.0.0.1:8002"}]}`),
			},
		},
		{
			name:  "minimal",
			input: "fair_queue {\n reverse_proxy localhost:8001\n}",
			want:  Handler{ProxyRaw: json.RawMessage(proxy1)},
		},
		{
			name: "sizes, units and tokenizer",
			input: `fair_queue {
				cost_unit requests
				tokenizer approx
				max_body 512KiB
				tenant_key {http.auth.user.id}
				reverse_proxy localhost:8001
			}`,
			want: Handler{CostUnit: "requests", Tokenizer: "approx", MaxBody: 512 << 10,
				TenantKey: "{http.auth.user.id}", ProxyRaw: json.RawMessage(proxy1)},
		},
		{
			name: "hardening limits",
			input: `fair_queue {
				body_timeout 10s
				max_request_tokens 32768
				max_queue_bytes 64MiB
				handle_errors
				tenant bulk max_inflight 4 max_request_tokens 8192
				default_tenant weight 2 max_queue 100 max_inflight 1
				reverse_proxy localhost:8001
			}`,
			want: Handler{BodyTimeout: dur(10 * time.Second), MaxRequestTokens: 32768, MaxQueueBytes: 64 << 20,
				HandleErrors:  true,
				Tenants:       map[string]*TenantConfig{"bulk": {MaxInflight: 4, MaxRequestTokens: 8192}},
				DefaultTenant: &TenantConfig{Weight: 2, MaxQueue: 100, MaxInflight: 1},
				ProxyRaw:      json.RawMessage(proxy1)},
		},
		{
			name: "o200k_base and max_body in MiB",
			input: `fair_queue {
				tokenizer o200k_base
				max_body 8MiB
				reverse_proxy localhost:8001
			}`,
			want: Handler{Tokenizer: "o200k_base", MaxBody: 8 << 20, ProxyRaw: json.RawMessage(proxy1)},
		},
		{
			name: "default_tenant reject and bare tenants",
			input: `fair_queue {
				tenant alice
				tenant bob max_queue 5 wait_budget 1m class interactive weight 2.5
				default_tenant reject
				reverse_proxy localhost:8001
			}`,
			want: Handler{
				Tenants: map[string]*TenantConfig{
					"alice": {},
					"bob":   {Weight: 2.5, Class: "interactive", WaitBudget: dur(time.Minute), MaxQueue: 5},
				},
				RejectUnknownTenants: true,
				ProxyRaw:             json.RawMessage(proxy1),
			},
		},
		{
			name:  "anti_starvation off",
			input: "fair_queue {\n anti_starvation off\n reverse_proxy localhost:8001\n}",
			want: Handler{
				AntiStarvation: &AntiStarvation{BoostShareMax: ptr(0.0), FastFail: ptr(false)},
				ProxyRaw:       json.RawMessage(proxy1),
			},
		},
		{
			name:  "anti_starvation empty block",
			input: "fair_queue {\n anti_starvation {\n }\n reverse_proxy localhost:8001\n}",
			want:  Handler{AntiStarvation: &AntiStarvation{}, ProxyRaw: json.RawMessage(proxy1)},
		},
		{
			name: "anti_starvation all options",
			input: `fair_queue {
				anti_starvation {
					fast_fail off
					boost_share_max 0
					per_tenant_boost_hourly 0
				}
				reverse_proxy localhost:8001
			}`,
			want: Handler{
				AntiStarvation: &AntiStarvation{BoostShareMax: ptr(0.0), PerTenantBoostHourly: ptr(0), FastFail: ptr(false)},
				ProxyRaw:       json.RawMessage(proxy1),
			},
		},
		{
			name: "anti_starvation fast_fail on, full share",
			input: `fair_queue {
				anti_starvation {
					boost_share_max 1
					fast_fail on
				}
				reverse_proxy localhost:8001
			}`,
			want: Handler{
				AntiStarvation: &AntiStarvation{BoostShareMax: ptr(1.0), FastFail: ptr(true)},
				ProxyRaw:       json.RawMessage(proxy1),
			},
		},
		{
			name: "degrade with hold, custom class declared after use, token rate",
			input: `fair_queue {
				degrade {
					hold 10s
					soft trigger 0.5 recover 0.4 light_mode interactive max_tokens 256 max_input_tokens 1024
					bulk trigger 0.6 recover 0.4 pause reports
					hard trigger 1 recover 0.9 throttle realtime 5000tok/s
				}
				class reports wait_budget 10m
				class realtime wait_budget 2s
				tenant r class reports
				reverse_proxy localhost:8001
			}`,
			want: Handler{
				Classes: []*ClassConfig{
					{Name: "reports", WaitBudget: dur(10 * time.Minute)},
					{Name: "realtime", WaitBudget: dur(2 * time.Second)},
				},
				Tenants: map[string]*TenantConfig{"r": {Class: "reports"}},
				Degrade: &DegradeConfig{Hold: dur(10 * time.Second), Steps: []*DegradeStep{
					{Name: "soft", Trigger: 0.5, Recover: 0.4, Action: "light_mode", Class: "interactive", MaxInputTokens: 1024, MaxTokens: 256},
					{Name: "bulk", Trigger: 0.6, Recover: 0.4, Action: "pause", Class: "reports"},
					{Name: "hard", Trigger: 1, Recover: 0.9, Action: "throttle", Class: "realtime", Rate: "5000tok/s"},
				}},
				ProxyRaw: json.RawMessage(proxy1),
			},
		},
		{
			name: "reverse_proxy upstreams in its block",
			input: `fair_queue {
				reverse_proxy {
					to localhost:8001 localhost:8002
					lb_policy least_conn
				}
			}`,
			want: Handler{ProxyRaw: json.RawMessage(`{"handler":"reverse_proxy",
				"load_balancing":{"selection_policy":{"policy":"least_conn"}},
				"upstreams":[{"dial":"localhost:8001"},{"dial":"localhost:8002"}]}`)},
		},
		{
			name: "reverse_proxy dynamic upstreams",
			input: `fair_queue {
				reverse_proxy {
					dynamic a model.internal 8000
				}
			}`,
			want: Handler{ProxyRaw: json.RawMessage(`{"handler":"reverse_proxy",
				"dynamic_upstreams":{"name":"model.internal","port":"8000","source":"a"}}`)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseBlock(tt.input)
			if err != nil {
				t.Fatalf("UnmarshalCaddyfile: %v", err)
			}
			if !jsonEqual(t, got.ProxyRaw, tt.want.ProxyRaw) {
				t.Errorf("proxy:\n got %s\nwant %s", got.ProxyRaw, tt.want.ProxyRaw)
			}
			got.ProxyRaw, tt.want.ProxyRaw = nil, nil
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("handler:\n got %s\nwant %s", mustJSON(t, got), mustJSON(t, &tt.want))
			}
		})
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	// Each input is a fair_queue block; want lists substrings of the error,
	// which must also name the line (Testfile:<line>, the line of the
	// offending token, counting from 1 at "fair_queue {").
	tests := []struct {
		name  string
		input string
		line  int
		want  []string
	}{
		{"directive argument", "fair_queue x {\nreverse_proxy a:1\n}", 1, []string{"fair_queue takes no arguments", `"x"`}},
		{"unknown subdirective", "fair_queue {\nreverse_proxy a:1\nmax_queues 5\n}", 3, []string{`unknown subdirective "max_queues"`}},
		{"missing reverse_proxy", "fair_queue {\nmax_queue 5\n}", 1, []string{"missing reverse_proxy"}},
		{"empty block", "fair_queue", 1, []string{"missing reverse_proxy"}},
		{"reverse_proxy without upstreams", "fair_queue {\nreverse_proxy {\nlb_policy first\n}\n}", 2, []string{"reverse_proxy: no upstreams"}},
		{"reverse_proxy twice", "fair_queue {\nreverse_proxy a:1\nreverse_proxy b:1\n}", 3, []string{"reverse_proxy given twice", "Testfile:2"}},
		{"reverse_proxy bad subdirective", "fair_queue {\nreverse_proxy a:1 {\nbogus_option 1\n}\n}", 3, []string{"reverse_proxy:", "bogus_option"}},
		{"reverse_proxy bad duration", "fair_queue {\nreverse_proxy a:1 {\nhealth_interval soon\n}\n}", 3, []string{"reverse_proxy:", "soon"}},

		{"name without value", "fair_queue {\nname\nreverse_proxy a:1\n}", 2, []string{"name: want exactly one argument, got 0"}},
		{"name with two values", "fair_queue {\nname a b\nreverse_proxy a:1\n}", 2, []string{"name: want exactly one argument, got 2"}},
		{"name with a block", "fair_queue {\nname a {\nx\n}\nreverse_proxy a:1\n}", 2, []string{"name: unexpected block"}},
		{"name twice", "fair_queue {\nname a\nname b\nreverse_proxy a:1\n}", 3, []string{"name given twice", "Testfile:2"}},
		{"tenant_key missing", "fair_queue {\ntenant_key\nreverse_proxy a:1\n}", 2, []string{"tenant_key: want exactly one argument"}},
		{"tenant_key constant", "fair_queue {\ntenant_key X-Tenant-ID\nreverse_proxy a:1\n}", 2, []string{`tenant_key: "X-Tenant-ID" has no placeholder`, "{http.request.header.X-Tenant-ID}"}},
		{"cost_unit unknown", "fair_queue {\ncost_unit tokens\nreverse_proxy a:1\n}", 2, []string{"cost_unit", `"tokens"`, "estimated_tokens, requests or learned"}},
		{"tokenizer unknown", "fair_queue {\ntokenizer gpt2\nreverse_proxy a:1\n}", 2, []string{"tokenizer", `"gpt2"`, "cl100k_base"}},
		{"default_max_tokens zero", "fair_queue {\ndefault_max_tokens 0\nreverse_proxy a:1\n}", 2, []string{"default_max_tokens", `"0"`, "positive integer"}},
		{"default_max_tokens not a number", "fair_queue {\ndefault_max_tokens lots\nreverse_proxy a:1\n}", 2, []string{"default_max_tokens", `"lots"`}},
		{"max_body not a size", "fair_queue {\nmax_body big\nreverse_proxy a:1\n}", 2, []string{"max_body", `"big"`, "not a size"}},
		{"max_body zero", "fair_queue {\nmax_body 0MB\nreverse_proxy a:1\n}", 2, []string{"max_body", `"0MB"`}},
		{"max_inflight negative", "fair_queue {\nmax_inflight -1\nreverse_proxy a:1\n}", 2, []string{"max_inflight", `"-1"`, "positive integer"}},
		{"max_inflight_tokens zero", "fair_queue {\nmax_inflight_tokens 0\nreverse_proxy a:1\n}", 2, []string{"max_inflight_tokens", "positive integer"}},
		{"max_queue fraction", "fair_queue {\nmax_queue 1.5\nreverse_proxy a:1\n}", 2, []string{"max_queue", `"1.5"`}},
		{"max_queue_tokens text", "fair_queue {\nmax_queue_tokens many\nreverse_proxy a:1\n}", 2, []string{"max_queue_tokens", `"many"`}},

		{"class missing wait_budget", "fair_queue {\nclass gold\nreverse_proxy a:1\n}", 2, []string{"class: want 'class <name> wait_budget <duration>'"}},
		{"class wrong keyword", "fair_queue {\nclass gold budget 5s\nreverse_proxy a:1\n}", 2, []string{"class: want"}},
		{"class bad duration", "fair_queue {\nclass gold wait_budget soon\nreverse_proxy a:1\n}", 2, []string{`class "gold": wait_budget`, `"soon"`, "not a duration"}},
		{"class zero budget", "fair_queue {\nclass gold wait_budget 0s\nreverse_proxy a:1\n}", 2, []string{`class "gold": wait_budget`, "must be positive"}},
		{"class twice", "fair_queue {\nclass gold wait_budget 1s\nclass gold wait_budget 2s\nreverse_proxy a:1\n}", 3, []string{`class "gold" declared twice`, "Testfile:2"}},

		{"tenant without name", "fair_queue {\ntenant\nreverse_proxy a:1\n}", 2, []string{"tenant: missing tenant name"}},
		{"tenant twice", "fair_queue {\ntenant a weight 1\nreverse_proxy a:1\ntenant a weight 2\n}", 4, []string{`tenant "a" declared twice`, "Testfile:2"}},
		{"tenant weight zero", "fair_queue {\ntenant a weight 0\nreverse_proxy a:1\n}", 2, []string{`tenant "a": weight "0" must be a positive number`}},
		{"tenant weight negative", "fair_queue {\ntenant a weight -3\nreverse_proxy a:1\n}", 2, []string{`tenant "a": weight "-3"`}},
		{"tenant weight NaN", "fair_queue {\ntenant a weight NaN\nreverse_proxy a:1\n}", 2, []string{`tenant "a": weight "NaN"`}},
		{"tenant weight Inf", "fair_queue {\ntenant a weight +Inf\nreverse_proxy a:1\n}", 2, []string{`tenant "a": weight "+Inf"`}},
		{"tenant unknown option", "fair_queue {\ntenant a priority 1\nreverse_proxy a:1\n}", 2, []string{`tenant "a": unknown option "priority"`}},
		{"tenant missing value", "fair_queue {\ntenant a weight 2 class\nreverse_proxy a:1\n}", 2, []string{`tenant "a": missing value after class`}},
		{"tenant option twice", "fair_queue {\ntenant a weight 2 weight 3\nreverse_proxy a:1\n}", 2, []string{`tenant "a": weight given twice`}},
		{"tenant bad wait_budget", "fair_queue {\ntenant a wait_budget -5s\nreverse_proxy a:1\n}", 2, []string{`tenant "a": wait_budget`, "must be positive"}},
		{"tenant max_queue zero", "fair_queue {\ntenant a max_queue 0\nreverse_proxy a:1\n}", 2, []string{`tenant "a": max_queue "0" must be a positive integer`}},
		{"tenant unknown class", "fair_queue {\nreverse_proxy a:1\ntenant a class gold\n}", 3, []string{`tenant "a": unknown class "gold"`, "batch, interactive, realtime"}},
		{"tenant with a block of options", "fair_queue {\ntenant a {\nweight 2\n}\nreverse_proxy a:1\n}", 3, []string{`tenant "a": unknown line "weight" in its block`}},

		{"default_tenant bare", "fair_queue {\ndefault_tenant\nreverse_proxy a:1\n}", 2, []string{"default_tenant: want 'default_tenant reject' or options"}},
		{"default_tenant reject with options", "fair_queue {\ndefault_tenant reject weight 1\nreverse_proxy a:1\n}", 2, []string{"default_tenant: 'reject' takes no options"}},
		{"default_tenant twice", "fair_queue {\ndefault_tenant weight 1\ndefault_tenant reject\nreverse_proxy a:1\n}", 3, []string{"default_tenant given twice"}},
		{"default_tenant unknown class", "fair_queue {\ndefault_tenant class bulk\nreverse_proxy a:1\n}", 2, []string{`default_tenant: unknown class "bulk"`}},
		{"default_tenant bad option", "fair_queue {\ndefault_tenant weigth 1\nreverse_proxy a:1\n}", 2, []string{`default_tenant: unknown option "weigth"`}},

		{"anti_starvation on", "fair_queue {\nanti_starvation on\nreverse_proxy a:1\n}", 2, []string{`anti_starvation: unexpected argument "on"`}},
		{"anti_starvation bare", "fair_queue {\nanti_starvation\nreverse_proxy a:1\n}", 2, []string{"anti_starvation: want 'anti_starvation off' or a block"}},
		{"anti_starvation off with block", "fair_queue {\nanti_starvation off {\nfast_fail on\n}\nreverse_proxy a:1\n}", 2, []string{"anti_starvation off: unexpected block"}},
		{"anti_starvation twice", "fair_queue {\nanti_starvation off\nanti_starvation off\nreverse_proxy a:1\n}", 3, []string{"anti_starvation given twice"}},
		{"anti_starvation unknown option", "fair_queue {\nanti_starvation {\nboost_max 0.1\n}\nreverse_proxy a:1\n}", 3, []string{`anti_starvation: unknown option "boost_max"`}},
		{"boost_share_max above 1", "fair_queue {\nanti_starvation {\nboost_share_max 1.5\n}\nreverse_proxy a:1\n}", 3, []string{"anti_starvation: boost_share_max", `"1.5"`}},
		{"boost_share_max negative", "fair_queue {\nanti_starvation {\nboost_share_max -0.1\n}\nreverse_proxy a:1\n}", 3, []string{"anti_starvation: boost_share_max", `"-0.1"`}},
		{"boost_share_max percent", "fair_queue {\nanti_starvation {\nboost_share_max 10%\n}\nreverse_proxy a:1\n}", 3, []string{"anti_starvation: boost_share_max", `"10%"`}},
		{"boost_share_max NaN", "fair_queue {\nanti_starvation {\nboost_share_max NaN\n}\nreverse_proxy a:1\n}", 3, []string{"anti_starvation: boost_share_max", `"NaN"`}},
		{"boost_share_max missing", "fair_queue {\nanti_starvation {\nboost_share_max\n}\nreverse_proxy a:1\n}", 3, []string{"anti_starvation: boost_share_max: want exactly one argument"}},
		{"per_tenant_boost_hourly negative", "fair_queue {\nanti_starvation {\nper_tenant_boost_hourly -1\n}\nreverse_proxy a:1\n}", 3, []string{"anti_starvation: per_tenant_boost_hourly", `"-1"`}},
		{"fast_fail yes", "fair_queue {\nanti_starvation {\nfast_fail yes\n}\nreverse_proxy a:1\n}", 3, []string{"anti_starvation: fast_fail: want on or off", `"yes"`}},
		{"anti_starvation option twice", "fair_queue {\nanti_starvation {\nfast_fail on\nfast_fail off\n}\nreverse_proxy a:1\n}", 4, []string{"anti_starvation: fast_fail given twice"}},

		{"degrade argument", "fair_queue {\ndegrade on\nreverse_proxy a:1\n}", 2, []string{`degrade: unexpected argument "on"`}},
		{"degrade no steps", "fair_queue {\ndegrade {\nhold 5s\n}\nreverse_proxy a:1\n}", 2, []string{"degrade: no steps"}},
		{"degrade no block", "fair_queue {\ndegrade\nreverse_proxy a:1\n}", 2, []string{"degrade: no steps"}},
		{"degrade twice", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 pause batch\n}\ndegrade {\nL1 trigger 0.7 recover 0.6 pause batch\n}\nreverse_proxy a:1\n}", 5, []string{"degrade given twice"}},
		{"degrade hold bad", "fair_queue {\ndegrade {\nhold forever\nL1 trigger 0.7 recover 0.6 pause batch\n}\nreverse_proxy a:1\n}", 3, []string{"degrade: hold", `"forever"`}},
		{"degrade hold twice", "fair_queue {\ndegrade {\nhold 1s\nhold 2s\n}\nreverse_proxy a:1\n}", 4, []string{"degrade: hold given twice"}},
		{"degrade typo", "fair_queue {\ndegrade {\nL1 triger 0.7 recover 0.6 pause batch\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1", `"triger"`}},
		{"degrade recover above trigger", "fair_queue {\ndegrade {\nL1 trigger 0.6 recover 0.7 pause batch\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1", "recover 0.7", "below trigger"}},
		{"degrade trigger percent", "fair_queue {\ndegrade {\nL1 trigger 70 recover 60 pause batch\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1: trigger 70 is above 1"}},
		{"degrade unknown action", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 drop batch\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1", `unknown action "drop"`}},
		{"degrade light_mode without limits", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 light_mode batch\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1", "light_mode batch", "max_input_tokens"}},
		{"degrade throttle bad rate", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 throttle batch 20/h\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1", "throttle batch", `"20/h"`}},
		{"degrade throttle no rate", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 throttle batch\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1", "missing rate"}},
		{"degrade duplicate step", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 pause batch\nL1 trigger 0.8 recover 0.7 pause batch\n}\nreverse_proxy a:1\n}", 4, []string{"degrade step L1", "duplicate step name"}},
		{"degrade falling trigger", "fair_queue {\ndegrade {\nL1 trigger 0.8 recover 0.6 pause batch\nL2 trigger 0.7 recover 0.65 pause batch\n}\nreverse_proxy a:1\n}", 4, []string{"degrade step L2", "triggers must strictly increase"}},
		{"degrade unknown class", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 pause bulk\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1: unknown class \"bulk\""}},
		{"degrade step with a block", "fair_queue {\ndegrade {\nL1 trigger 0.7 recover 0.6 pause batch {\n}\n}\nreverse_proxy a:1\n}", 3, []string{"degrade step L1: unexpected block"}},
	}
	lineRE := regexp.MustCompile(`Testfile:(\d+)`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseBlock(tt.input)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			// The last position in the message is where the error is.
			m := lineRE.FindAllStringSubmatch(msg, -1)
			if len(m) == 0 {
				t.Fatalf("error %q names no line", msg)
			}
			if got := m[len(m)-1][1]; got != strconv.Itoa(tt.line) {
				t.Errorf("error %q: at line %s, want %d", msg, got, tt.line)
			}
		})
	}
}

// adaptRoutes adapts a whole Caddyfile and returns the routes of its one
// server.
func adaptRoutes(t *testing.T, body string) ([]json.RawMessage, []byte) {
	t.Helper()
	adapted, warnings, err := adaptCaddyfile(t, "Caddyfile", []byte(body))
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	for _, w := range warnings {
		if !strings.Contains(w.Message, "caddy fmt") {
			t.Errorf("adapt warning: %s", w.String())
		}
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []json.RawMessage `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Apps.HTTP.Servers) != 1 {
		t.Fatalf("want one server, got %s", adapted)
	}
	for _, s := range cfg.Apps.HTTP.Servers {
		return s.Routes, adapted
	}
	return nil, adapted
}

// TestParseCaddyfileDesign adapts the Caddyfile of DESIGN.md section 7
// verbatim, aligned columns and all, and requires the JSON of
// examples/caddy.json, the formatted copy of it.
func TestParseCaddyfileDesign(t *testing.T) {
	body := "{\n\tadmin localhost:2019\n}\n:8080 {\n\t" + designBlock + "\n}\n"
	_, adapted := adaptRoutes(t, body)
	want, err := os.ReadFile(filepath.Join("examples", "caddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, adapted, want) {
		t.Errorf("design Caddyfile adapts to\n%s\nnot examples/caddy.json", adapted)
	}
}

func TestParseCaddyfileDirective(t *testing.T) {
	t.Run("ordered before reverse_proxy, with a matcher", func(t *testing.T) {
		routes, adapted := adaptRoutes(t, `:8080 {
	reverse_proxy /other/* localhost:9000
	fair_queue /v1/* {
		reverse_proxy localhost:8001
	}
}
`)
		if len(routes) != 2 {
			t.Fatalf("want 2 routes, got %s", adapted)
		}
		var first struct {
			Match  []map[string][]string `json:"match"`
			Handle []struct {
				Handler string `json:"handler"`
			} `json:"handle"`
		}
		if err := json.Unmarshal(routes[0], &first); err != nil {
			t.Fatal(err)
		}
		if len(first.Handle) != 1 || first.Handle[0].Handler != "fair_queue" {
			t.Errorf("first route is not fair_queue: %s", routes[0])
		}
		if len(first.Match) != 1 || !reflect.DeepEqual(first.Match[0]["path"], []string{"/v1/*"}) {
			t.Errorf("fair_queue route lost its matcher: %s", routes[0])
		}
	})

	t.Run("handle_response in the inner proxy", func(t *testing.T) {
		routes, adapted := adaptRoutes(t, `:8080 {
	fair_queue {
		reverse_proxy localhost:8001 {
			@busy status 503
			handle_response @busy {
				respond "model server busy" 503
			}
		}
	}
}
`)
		hs := findHandlers(t, adapted)
		if len(routes) != 1 || len(hs) != 1 {
			t.Fatalf("want one fair_queue route, got %s", adapted)
		}
		var h Handler
		if err := json.Unmarshal(hs[0], &h); err != nil {
			t.Fatal(err)
		}
		var proxy struct {
			HandleResponse []struct {
				Match  map[string]any    `json:"match"`
				Routes []json.RawMessage `json:"routes"`
			} `json:"handle_response"`
		}
		if err := json.Unmarshal(h.ProxyRaw, &proxy); err != nil {
			t.Fatal(err)
		}
		if len(proxy.HandleResponse) != 1 || proxy.HandleResponse[0].Match == nil || len(proxy.HandleResponse[0].Routes) != 1 {
			t.Errorf("handle_response not finalized: %s", h.ProxyRaw)
		}
		roundTripHandlers(t, adapted)
	})

	t.Run("placeholder shorthand in tenant_key", func(t *testing.T) {
		_, adapted := adaptRoutes(t, ":8080 {\n\tfair_queue {\n\t\ttenant_key {header.X-Team}\n\t\treverse_proxy localhost:8001\n\t}\n}\n")
		hs := findHandlers(t, adapted)
		var h Handler
		if len(hs) != 1 || json.Unmarshal(hs[0], &h) != nil || h.TenantKey != "{http.request.header.X-Team}" {
			t.Errorf("tenant_key not expanded: %s", adapted)
		}
	})

	t.Run("errors name the directive", func(t *testing.T) {
		_, _, err := adaptCaddyfile(t, "Caddyfile", []byte(":8080 {\n\tfair_queue {\n\t\tmax_queue 0\n\t\treverse_proxy localhost:8001\n\t}\n}\n"))
		if err == nil || !strings.Contains(err.Error(), "fair_queue") || !strings.Contains(err.Error(), "max_queue") ||
			!strings.Contains(err.Error(), "Caddyfile:3") {
			t.Errorf("error = %v", err)
		}
	})

	t.Run("UnmarshalCaddyfile alone rejects handle_response", func(t *testing.T) {
		_, err := parseBlock("fair_queue {\nreverse_proxy a:1 {\nhandle_response {\nrespond 502\n}\n}\n}")
		if err == nil || !strings.Contains(err.Error(), "handle_response") || !strings.Contains(err.Error(), "Testfile:3") {
			t.Errorf("error = %v", err)
		}
	})
}
