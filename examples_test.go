package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var updateExamples = flag.Bool("update-examples", false, "rewrite examples/*.json from the examples' Caddyfiles")

// exampleJSON names the JSON twin of an example Caddyfile: Caddyfile ->
// caddy.json, minimal.Caddyfile -> minimal.json.
func exampleJSON(caddyfilePath string) string {
	dir, base := filepath.Split(caddyfilePath)
	if base == "Caddyfile" {
		return filepath.Join(dir, "caddy.json")
	}
	return filepath.Join(dir, strings.TrimSuffix(base, ".Caddyfile")+".json")
}

// adaptCaddyfile adapts a Caddyfile in-process, as `caddy adapt` does.
func adaptCaddyfile(t *testing.T, filename string, body []byte) ([]byte, []caddyconfig.Warning, error) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("caddyfile adapter not registered")
	}
	return adapter.Adapt(body, map[string]any{"filename": filename})
}

// TestExamples adapts every examples/*Caddyfile, requires no warnings and
// the result to equal its JSON twin, round-trips every fair_queue handler
// through the Handler struct, and provisions the whole config in-process
// with caddy.Validate (no listeners are started).
func TestExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("examples", "*Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, filepath.Join("examples", "Caddyfile")) {
		t.Fatalf("examples/Caddyfile missing; found %v", files)
	}
	isolateCaddyStorage(t)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			body, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			adapted, warnings, err := adaptCaddyfile(t, file, body)
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			// Every warning matters: the examples are `caddy fmt`
			// clean and use no deprecated syntax.
			for _, w := range warnings {
				t.Errorf("adapt warning: %s", w.String())
			}

			var pretty bytes.Buffer
			if err := json.Indent(&pretty, adapted, "", "\t"); err != nil {
				t.Fatal(err)
			}
			pretty.WriteByte('\n')
			jsonPath := exampleJSON(file)
			if *updateExamples {
				if err := os.WriteFile(jsonPath, pretty.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(jsonPath)
			if err != nil {
				t.Fatalf("%v (run go test -run TestExamples -update-examples to create it)", err)
			}
			if !jsonEqual(t, adapted, want) {
				t.Errorf("adapting %s does not give %s (run go test -run TestExamples -update-examples after checking the diff)\ngot:\n%s", file, jsonPath, pretty.String())
			}

			n := roundTripHandlers(t, adapted)
			if n == 0 {
				t.Errorf("%s has no fair_queue handler", file)
			}
			validateConfig(t, adapted)
		})
	}
}

// TestExampleJSON provisions every Caddy config among examples/*.json (a
// top-level "apps"; the Grafana board is checked by grafana_test.go),
// including any written by hand, and round-trips its fair_queue handlers.
func TestExampleJSON(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("examples", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples/*.json")
	}
	isolateCaddyStorage(t)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			body, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var top map[string]json.RawMessage
			if json.Unmarshal(body, &top) == nil && top["apps"] == nil {
				return // not a Caddy config
			}
			if n := roundTripHandlers(t, body); n == 0 {
				t.Errorf("%s has no fair_queue handler", file)
			}
			validateConfig(t, body)
		})
	}
}

// TestExampleMatchesDesign checks that examples/Caddyfile is the gateway of
// DESIGN.md section 7: the three tenants, the default tenant, the
// anti-starvation bounds and the three-step ladder.
func TestExampleMatchesDesign(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("examples", "caddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	hs := findHandlers(t, body)
	if len(hs) != 1 {
		t.Fatalf("want one fair_queue handler, got %d", len(hs))
	}
	var h Handler
	if err := json.Unmarshal(hs[0], &h); err != nil {
		t.Fatal(err)
	}
	wantTenants := map[string]*TenantConfig{
		"marketing":  {Weight: 30, Class: "realtime", WaitBudget: caddy.Duration(5e9)},
		"cs_bot":     {Weight: 30, Class: "interactive", WaitBudget: caddy.Duration(15e9)},
		"data_batch": {Weight: 15, Class: "batch", WaitBudget: caddy.Duration(300e9), MaxQueue: 2000},
	}
	if !reflect.DeepEqual(h.Tenants, wantTenants) {
		t.Errorf("tenants = %s", mustJSON(t, h.Tenants))
	}
	if !reflect.DeepEqual(h.DefaultTenant, &TenantConfig{Weight: 1, Class: "batch"}) {
		t.Errorf("default_tenant = %s", mustJSON(t, h.DefaultTenant))
	}
	if a := h.AntiStarvation; a == nil || a.BoostShareMax == nil || *a.BoostShareMax != 0.10 ||
		a.PerTenantBoostHourly == nil || *a.PerTenantBoostHourly != 200 {
		t.Errorf("anti_starvation = %s", mustJSON(t, h.AntiStarvation))
	}
	wantSteps := []*DegradeStep{
		{Name: "L1", Trigger: 0.70, Recover: 0.60, Action: "pause", Class: "batch"},
		{Name: "L2", Trigger: 0.85, Recover: 0.75, Action: "light_mode", Class: "interactive", MaxInputTokens: 2048},
		{Name: "L3", Trigger: 0.95, Recover: 0.90, Action: "throttle", Class: "realtime", Rate: "20/s"},
	}
	if h.Degrade == nil || !reflect.DeepEqual(h.Degrade.Steps, wantSteps) {
		t.Errorf("degrade = %s", mustJSON(t, h.Degrade))
	}

	var proxy struct {
		Upstreams []struct {
			Dial string `json:"dial"`
		} `json:"upstreams"`
		HealthChecks struct {
			Active struct {
				URI      string         `json:"uri"`
				Interval caddy.Duration `json:"interval"`
			} `json:"active"`
		} `json:"health_checks"`
	}
	if err := json.Unmarshal(h.ProxyRaw, &proxy); err != nil {
		t.Fatal(err)
	}
	if len(proxy.Upstreams) != 2 || proxy.Upstreams[0].Dial != "127.0.0.1:8001" || proxy.Upstreams[1].Dial != "127.0.0.1:8002" ||
		proxy.HealthChecks.Active.URI != "/health" || proxy.HealthChecks.Active.Interval != caddy.Duration(1e9) {
		t.Errorf("proxy = %s", h.ProxyRaw)
	}

	var cfg struct {
		Admin struct {
			Listen string `json:"listen"`
		} `json:"admin"`
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(body, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.Listen != "localhost:2019" {
		t.Errorf("admin listen = %q", cfg.Admin.Listen)
	}
	var listens []string
	for _, s := range cfg.Apps.HTTP.Servers {
		listens = append(listens, s.Listen...)
	}
	if !reflect.DeepEqual(listens, []string{":8080"}) {
		t.Errorf("servers listen on %v, want [:8080]", listens)
	}
}

// TestExampleValidateProvisions proves validateConfig reaches the handler's
// Provision: examples/caddy.json with a tenant in an undeclared class must
// fail.
func TestExampleValidateProvisions(t *testing.T) {
	isolateCaddyStorage(t)
	body, err := os.ReadFile(filepath.Join("examples", "caddy.json"))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(body, []byte(`"class": "realtime",`), []byte(`"class": "no_such_class",`), 1)
	if bytes.Equal(bad, body) {
		t.Fatal("examples/caddy.json has no realtime tenant to break")
	}
	var cfg caddy.Config
	if err := json.Unmarshal(bad, &cfg); err != nil {
		t.Fatal(err)
	}
	err = caddy.Validate(&cfg)
	if err == nil || !strings.Contains(err.Error(), "no_such_class") {
		t.Errorf("caddy.Validate = %v, want an error about no_such_class", err)
	}
}

// findHandlers returns every fair_queue handler object in a Caddy JSON
// config, wherever it is nested.
func findHandlers(t *testing.T, config []byte) []json.RawMessage {
	t.Helper()
	var root any
	if err := json.Unmarshal(config, &root); err != nil {
		t.Fatal(err)
	}
	var out []json.RawMessage
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "fair_queue" {
				obj := make(map[string]any, len(v))
				for k, x := range v {
					if k != "handler" {
						obj[k] = x
					}
				}
				out = append(out, mustJSON(t, obj))
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(root)
	return out
}

// roundTripHandlers decodes every fair_queue handler of config into a
// Handler, rejecting fields the struct does not have, encodes it again and
// requires the same JSON. It returns the number of handlers.
func roundTripHandlers(t *testing.T, config []byte) int {
	t.Helper()
	hs := findHandlers(t, config)
	for _, raw := range hs {
		var h Handler
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&h); err != nil {
			t.Errorf("decoding fair_queue handler: %v\n%s", err, raw)
			continue
		}
		again, err := json.Marshal(&h)
		if err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(t, raw, again) {
			t.Errorf("fair_queue handler does not round-trip through Handler:\nin:  %s\nout: %s", raw, again)
		}
	}
	return len(hs)
}

// validateConfig loads, provisions and validates a whole Caddy config
// in-process, then cleans it up; it starts no listener.
func validateConfig(t *testing.T, config []byte) {
	t.Helper()
	var cfg caddy.Config
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("decoding config: %v", err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Errorf("caddy.Validate: %v", err)
	}
}

// isolateCaddyStorage keeps caddy.Validate's storage and autosave out of the
// user's home.
func isolateCaddyStorage(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", filepath.Join(dir, "data"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%v\n%s", err, a)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	return reflect.DeepEqual(va, vb)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
