package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// hostileMaxBody is the gateway's default max_body, 8 MiB: the attack
// bodies fill it.
const hostileMaxBody = 8 << 20

// deepChatBody is a chat body whose unknown member "x" nests arrays so
// that the body's depth is depth.
func deepChatBody(depth int) []byte {
	return []byte(`{"model":"fake-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}],"x":` +
		strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`)
}

// wideToolResultsBody is the parser's most expensive legal shape that a
// fake serves: a chat message whose content is thousands of tool_result
// blocks, each nested to the deepest level allowed (64 with the body, the
// messages and the message) with its type after its content, about size
// bytes in all. The scanner this gateway had stepped over every block once
// per enclosing level.
func wideToolResultsBody(size int) []byte {
	const levels = (64 - 3) / 2
	open, close := `[{"tool_use_id":"t","content":`, `,"type":"tool_result"}]`
	block := strings.Repeat(open, levels) + `"four words of text"` + strings.Repeat(close, levels)
	block = block[1 : len(block)-1] // the outermost array is the content itself
	head, tail := `{"model":"fake-model","max_tokens":3,"messages":[{"role":"user","content":[`, `]}]}`
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString(head)
	for n := 0; b.Len()+1+len(block)+len(tail) <= size; n++ {
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(block)
	}
	b.WriteString(tail)
	return b.Bytes()
}

// TestHostileParse: bodies built to make the request parser slow, deep or
// ambiguous are answered at once with the right 400, or served, while a
// well-behaved tenant is served throughout; the estimate counts n choices.
func TestHostileParse(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 2, "hp", harness.FakeOptions{Slots: 4, TTFT: 5 * time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		tokenizer approx
		max_inflight 4
		tenant attacker weight 1 class batch
		tenant good     weight 1 class batch
		default_tenant reject
		reverse_proxy {{.Upstreams}} {
			lb_policy least_conn
			health_uri /health
			health_interval 200ms
		}
	}
}
`, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "Upstreams": addrs(fakes...)})
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	waitMetricEq(t, c, 8, "caddy_fair_queue_capacity") // 4 per healthy upstream
	ctx := context.Background()
	var refused []string // test ids that must never reach an upstream

	t.Run("nesting deeper than 64", func(t *testing.T) {
		// 64 levels are served, 65 refused; so is a body past
		// encoding/json's own limit of 10000.
		expectServed(t, send(ctx, defaultClient, base, chatReq{Tenant: "good", TestID: "depth-64", Body: deepChatBody(64)}))
		for _, tc := range []struct {
			id   string
			body []byte
		}{
			{"depth-65", deepChatBody(65)},
			{"depth-8M", append([]byte(`{"messages":`), bytes.Repeat([]byte("["), hostileMaxBody-64)...)},
		} {
			start := time.Now()
			r := send(ctx, defaultClient, base, chatReq{Tenant: "attacker", TestID: tc.id, Body: tc.body})
			e := expectError(t, r, 400, "invalid_request", "invalid_request_error", false)
			if !strings.Contains(e.Message, "nested deeper than 64 levels") {
				t.Errorf("%s: message %q should say the body is nested deeper than 64 levels", tc.id, e.Message)
			}
			t.Logf("%s (%d bytes): 400 after %v: %s", tc.id, len(tc.body), time.Since(start).Round(time.Millisecond), e.Message)
			refused = append(refused, tc.id)
		}
	})

	t.Run("escaped duplicate max_tokens", func(t *testing.T) {
		// Go and Python decoders keep the last max_tokens; the gateway
		// would have estimated 1.
		for i, body := range []string{
			`{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max\u005ftokens":100000}`,
			`{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"max_tokens":100000}`,
			`{"model":"fake-model","messages":[{"role":"user","content":"hi","c\u006fntent":"` + strings.Repeat("x ", 1000) + `"}],"max_tokens":1}`,
		} {
			id := fmt.Sprint("dup-", i)
			r := send(ctx, defaultClient, base, chatReq{Tenant: "attacker", TestID: id, Body: []byte(body)})
			e := expectError(t, r, 400, "invalid_request", "invalid_request_error", false)
			if !strings.Contains(e.Message, "appears more than once") {
				t.Errorf("%s: message %q should say a member appears more than once", id, e.Message)
			}
			t.Logf("%s: 400: %s", id, e.Message)
			refused = append(refused, id)
		}
	})

	t.Run("n multiplies the output cap", func(t *testing.T) {
		cost := func(id string, n int) int {
			body := fmt.Sprintf(`{"model":"fake-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":10,"n":%d}`, n)
			r := send(ctx, defaultClient, base, chatReq{Tenant: "good", TestID: id, Body: []byte(body)})
			expectServed(t, r)
			v, _ := strconv.Atoi(r.Header.Get("X-Fair-Queue-Cost"))
			return v
		}
		one, four := cost("n-1", 1), cost("n-4", 4)
		t.Logf("X-Fair-Queue-Cost: n=1 %d, n=4 %d", one, four)
		if four-one != 3*10 {
			t.Errorf("cost with n=4 is %d, with n=1 %d: want 3 more times the cap of 10", four, one)
		}
		r := send(ctx, defaultClient, base, chatReq{Tenant: "attacker", TestID: "n-129", Body: []byte(`{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"n":129}`)})
		e := expectError(t, r, 400, "invalid_request", "invalid_request_error", false)
		t.Logf("n-129: 400: %s", e.Message)
		refused = append(refused, "n-129")
	})

	t.Run("attack beside a well-behaved tenant", func(t *testing.T) {
		wide := wideToolResultsBody(hostileMaxBody)
		if len(wide) > hostileMaxBody || len(wide) < hostileMaxBody-4096 {
			t.Fatalf("attack body is %d bytes", len(wide))
		}
		const attackers, rounds = 3, 4
		var (
			mu      sync.Mutex
			answers []result
			wg      sync.WaitGroup
		)
		for a := range attackers {
			wg.Go(func() {
				cl := newClient(false)
				for i := range rounds {
					// The expensive legal body, then a refused one.
					r := send(ctx, cl, base, chatReq{Tenant: "attacker", TestID: fmt.Sprintf("wide-%d-%d", a, i), Body: wide})
					d := send(ctx, cl, base, chatReq{Tenant: "attacker", TestID: fmt.Sprintf("deep-%d-%d", a, i), Body: deepChatBody(65)})
					mu.Lock()
					answers = append(answers, r, d)
					mu.Unlock()
				}
			})
		}
		var good []result
		for i := range 10 {
			good = append(good, send(ctx, defaultClient, base, chatReq{Tenant: "good", TestID: fmt.Sprint("good-", i), MaxTokens: 3}))
		}
		wg.Wait()
		for _, r := range good {
			expectServed(t, r)
		}
		served := 0
		for _, r := range answers {
			switch {
			case strings.HasPrefix(r.TestID, "deep-"):
				expectError(t, r, 400, "invalid_request", "invalid_request_error", false)
				refused = append(refused, r.TestID)
			case r.Err == nil && r.Status == 200:
				expectServed(t, r)
				served++
			default:
				// Answered: a 400 is the other acceptable answer.
				expectError(t, r, 400, "invalid_request", "invalid_request_error", false)
			}
		}
		t.Logf("%d of %d wide %d-byte bodies served; %d good requests served", served, attackers*rounds, len(wide), len(good))
		// The gateway is alive and well afterwards.
		expectServed(t, send(ctx, defaultClient, base, chatReq{Tenant: "good", TestID: "after", MaxTokens: 3}))
	})

	recs := records(t, fakes...)
	for _, id := range refused {
		if r, ok := recs[id]; ok {
			t.Errorf("refused request %s reached an upstream: %+v", id, r)
		}
	}
	if want := 2 + 3 + 1 + 3*4; len(refused) != want {
		t.Errorf("%d refusals checked, want %d", len(refused), want)
	}
}
