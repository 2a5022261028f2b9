package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// A provider account: the fake upstream enforces a TPM limit
// and answers 429 beyond it, as a provider does.

const providerTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 16
		upstream_quota tpm {{.TPM}} burst 6s
		tenant vip weight 70 class realtime reserve 20%
		tenant batch weight 10 class batch wait_budget 20s
		reverse_proxy {{.Upstreams}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

func startProvider(t *testing.T, prefix string, fakeTPM, gatewayTPM int) (*harness.Caddy, string, *harness.Fake) {
	fakes := startFakes(t, 1, prefix, harness.FakeOptions{Slots: 16, TTFT: 5 * time.Millisecond, PerToken: 100 * time.Microsecond,
		Args: []string{fmt.Sprintf("-tpm=%d", fakeTPM)}})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, providerTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "TPM": gatewayTPM,
		"Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 16, "caddy_fair_queue_capacity")
	return c, fmt.Sprintf("http://127.0.0.1:%d", p["Site"]), fakes[0]
}

// The gateway believes the account allows 10x what the provider really
// does: the provider answers 429, and no client ever sees it. Each request
// is requeued, uncharged, and served when the account has room, or
// answered by the gateway per its budget.
func TestProviderRefusalNeverReachesClient(t *testing.T) {
	t.Parallel()
	c, base, fake := startProvider(t, "p429", 3000, 30000)
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	reqs := make([]chatReq, 60)
	for i := range reqs {
		reqs[i] = chatReq{Tenant: "batch", TestID: fmt.Sprintf("b-%d", i), MaxTokens: 100, IgnoreEOS: true,
			Header: map[string]string{"X-Wait-Budget": "6s"}}
	}
	served := 0
	for _, r := range sendAll(context.Background(), cl, base, reqs) {
		switch {
		case r.Err == nil && r.Status == http.StatusOK:
			served++
		case r.Err == nil && strings.Contains(string(r.Body), "rate_limit_exceeded"):
			t.Errorf("%s: the provider's 429 reached the client: %v", r.TestID, r)
		case r.Err == nil && r.Status == http.StatusServiceUnavailable &&
			(isCode(timedResult{result: r}, 503, "queue_timeout") || isCode(timedResult{result: r}, 503, "wait_budget_exceeded") ||
				isCode(timedResult{result: r}, 503, "server_busy")):
		default:
			t.Errorf("%s: unexpected answer %v", r.TestID, r)
		}
	}
	st := fake.Stats()
	s := scrape(t, c)
	refusals := metric(s, "caddy_fair_queue_provider_refusals_total", "tenant", "batch")
	t.Logf("served %d of 60; the provider answered 429 %d times, all kept from clients (provider_refusals_total %v)",
		served, st.RateLimited, refusals)
	if st.RateLimited == 0 || refusals == 0 {
		t.Fatalf("the provider never refused (429s %d, counted %v): the test does not exercise it", st.RateLimited, refusals)
	}
	// 3000 tokens/min is a bucket of 3000 tokens: about 27 requests of
	// ~110 tokens at once, then one every 2.2 s.
	if served < 25 {
		t.Errorf("served %d of 60 within their 6 s budget, want >= 25 (the account's bucket)", served)
	}
}

// A batch flood exhausts the shared pool of an account the gateway paces
// exactly; the VIP tenant, with 20% reserved, is served within its 5 s
// realtime budget every time, and the provider never refuses anything.
func TestProviderReservation(t *testing.T) {
	t.Parallel()
	c, base, fake := startProvider(t, "pres", 12000, 12000)
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	batchServed := 0
	for w := 0; w < 20; w++ { // 20 closed-loop batch clients
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				r := send(ctx, cl, base, chatReq{Tenant: "batch", TestID: fmt.Sprintf("b-%d-%d", w, i), MaxTokens: 100, IgnoreEOS: true})
				if r.Err == nil && r.Status == http.StatusOK {
					mu.Lock()
					batchServed++
					mu.Unlock()
				}
			}
		})
	}
	// Once the pool is exhausted, VIP requests arrive one every 1.5 s.
	waitMetric(t, c, "the shared pool exhausted", func(s harness.Series) bool {
		return metric(s, "caddy_fair_queue_queue_depth", "tenant", "batch") >= 5
	})
	for i := 0; i < 6; i++ {
		r := send(context.Background(), cl, base, chatReq{Tenant: "vip", TestID: fmt.Sprintf("vip-%d", i), MaxTokens: 100, IgnoreEOS: true})
		expectServed(t, r)
		if w := waitMs(t, r); w > 5*time.Second {
			t.Errorf("vip-%d waited %v, past its 5 s realtime budget", i, w)
		}
		time.Sleep(1500 * time.Millisecond) // the VIP's pace, which its reservation serves, not a wait
	}
	cancel()
	wg.Wait()
	if st := fake.Stats(); st.RateLimited != 0 {
		t.Errorf("the provider refused %d requests: the gateway drew beyond the account", st.RateLimited)
	}
	if batchServed == 0 {
		t.Error("the batch flood was never served")
	}
	t.Logf("batch served %d while vip was served within budget", batchServed)
}

const fallbackTmpl = `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Site}} {
	fair_queue {
		max_inflight 8
		upstream_quota tpm 100000
		tenant vip weight 70 class realtime
		tenant batch weight 10 class interactive
		fallback {
			tenants vip
			model_map fake-model fallback-model
			reverse_proxy {{.Fallback}} {
				header_up Authorization "Bearer fallback-key"
				health_uri /health
				health_interval 200ms
			}
		}
		reverse_proxy {{.Primary}} {
			health_uri /health
			health_interval 200ms
		}
	}
}
`

// The primary account runs out (its provider answers 429): the VIP's
// requests go to the fallback, with the mapped model and the fallback's
// own credentials, and say so; the batch tenant, not listed, never does.
func TestProviderFallback(t *testing.T) {
	t.Parallel()
	primary := startFakes(t, 1, "fbp", harness.FakeOptions{Slots: 8, TTFT: 5 * time.Millisecond, PerToken: 100 * time.Microsecond,
		Args: []string{"-tpm=1000"}})[0]
	fallback := startFakes(t, 1, "fbf", harness.FakeOptions{Slots: 8, TTFT: 5 * time.Millisecond, PerToken: 100 * time.Microsecond})[0]
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, fallbackTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"],
		"Primary": addrs(primary), "Fallback": addrs(fallback)})
	waitMetricEq(t, c, 8, "caddy_fair_queue_capacity")
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	ctx := context.Background()

	// The primary's bucket holds 1000 tokens: about nine requests of ~110.
	// Batch drains it until the provider refuses.
	var batch []result
	for i := 0; primary.Stats().RateLimited == 0; i++ {
		if i == 30 {
			t.Fatal("the primary never refused: the test does not exhaust it")
		}
		batch = append(batch, send(ctx, cl, base, chatReq{Tenant: "batch", TestID: fmt.Sprintf("b-%d", i),
			MaxTokens: 100, IgnoreEOS: true, Header: map[string]string{"X-Wait-Budget": "2s"}}))
	}
	for i := 0; i < 5; i++ {
		r := send(ctx, cl, base, chatReq{Tenant: "vip", TestID: fmt.Sprintf("vip-%d", i), MaxTokens: 100, IgnoreEOS: true})
		expectServed(t, r)
		if ch := r.Header.Get("X-Fair-Queue-Channel"); ch != "fallback" {
			t.Errorf("vip-%d: X-Fair-Queue-Channel %q, want fallback while the primary is out of quota", i, ch)
		}
	}
	recs := records(t, fallback)
	for i := 0; i < 5; i++ {
		rec, ok := recs[fmt.Sprintf("vip-%d", i)]
		if !ok {
			t.Errorf("vip-%d never reached the fallback", i)
			continue
		}
		if !strings.Contains(rec.Body, `"model":"fallback-model"`) || rec.Headers["Authorization"] != "Bearer fallback-key" {
			t.Errorf("vip-%d at the fallback: model/body %q, Authorization %q; want the mapped model and the fallback's key",
				i, rec.Body, rec.Headers["Authorization"])
		}
	}
	for _, r := range batch {
		if r.Header.Get("X-Fair-Queue-Channel") == "fallback" {
			t.Errorf("%s: a tenant the fallback does not list was served by it", r.TestID)
		}
		if strings.Contains(string(r.Body), "rate_limit_exceeded") {
			t.Errorf("%s: the provider's 429 reached the client", r.TestID)
		}
	}
	for id := range recs {
		if strings.HasPrefix(id, "b-") {
			t.Errorf("%s reached the fallback", id)
		}
	}
	if n := metric(scrape(t, c), "caddy_fair_queue_fallbacks_total", "tenant", "vip"); n != 5 {
		t.Errorf("fallbacks_total vip = %v, want 5", n)
	}
}

// TestProviderRemainingZeroPauses: a served answer that says the account
// has nothing left (x-ratelimit-remaining-requests: 0) pauses the account
// for its reset time, at most 10 s, so the next request waits for the
// account instead of drawing the provider's 429. The gateway believes the
// account allows 100x what the provider does, so only the header can
// hold it back.
func TestProviderRemainingZeroPauses(t *testing.T) {
	t.Parallel()
	fakes := startFakes(t, 1, "p0left", harness.FakeOptions{Slots: 16, TTFT: 5 * time.Millisecond, PerToken: 100 * time.Microsecond,
		Args: []string{"-rpm=10"}})
	p := harness.Ports(t, "Admin", "Site")
	c := startCaddy(t, providerTmpl, map[string]any{"Admin": p["Admin"], "Site": p["Site"], "TPM": 1000000,
		"Upstreams": addrs(fakes...)})
	waitMetricEq(t, c, 16, "caddy_fair_queue_capacity")
	base := fmt.Sprintf("http://127.0.0.1:%d", p["Site"])
	cl := newClient(true)
	defer cl.CloseIdleConnections()
	req := func(i int) result {
		return send(context.Background(), cl, base, chatReq{Tenant: "batch", TestID: fmt.Sprintf("z-%d", i), MaxTokens: 10,
			IgnoreEOS: true, Header: map[string]string{"X-Wait-Budget": "20s"}})
	}
	// The account's bucket holds 10 requests: the tenth answer leaves 0,
	// with a reset of about a minute.
	for i := range 10 {
		if r := req(i); r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("request %d of the bucket: %v", i, r)
		}
	}
	// The gauge is the pause left: some, and at most the 10 s cap, not
	// the minute of the reset.
	s := scrape(t, c)
	if paused := metric(s, "caddy_fair_queue_upstream_exhausted_seconds"); paused <= 0 || paused > 10 {
		t.Errorf("upstream_exhausted_seconds = %v after the answer leaving nothing, want the reset capped at 10 s", paused)
	}
	r := req(10)
	if r.Err != nil || r.Status != http.StatusOK {
		t.Fatalf("the request after the bucket emptied: %v, want served once the pause ends", r)
	}
	// By the fake's own clock: the request reached it no sooner than the
	// pause (the reset, about a minute, capped at 10 s) after the tenth
	// answer left it; the gateway saw that answer later still.
	recs := records(t, fakes...)
	tenth, next := recs["z-9"], recs["z-10"]
	gap := time.Duration(next.ReceivedUnixNano - tenth.FinishedUnixNano)
	t.Logf("the next request reached the provider %v after the tenth answer (X-Fair-Queue-Wait-Ms %s)", gap.Round(time.Millisecond),
		r.Header.Get("X-Fair-Queue-Wait-Ms"))
	if tenth.FinishedUnixNano == 0 || gap < 10*time.Second-100*time.Millisecond {
		t.Errorf("the next request reached the provider %v after the answer leaving nothing, want the 10 s pause (two ticks' slack): it went before the account was back", gap)
	}
	if st := fakes[0].Stats(); st.RateLimited != 0 {
		t.Errorf("the provider answered 429 %d times: the gateway did not pause on remaining 0", st.RateLimited)
	}
	if n := metric(scrape(t, c), "caddy_fair_queue_provider_refusals_total"); n != 0 {
		t.Errorf("provider_refusals_total = %v, want 0", n)
	}
}
