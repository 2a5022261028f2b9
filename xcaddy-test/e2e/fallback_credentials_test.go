package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-fair-queue/caddy-fair-queue/xcaddy-test/harness"
)

// callerHeaders are the credentials, account names and forwarding headers
// a caller sends that a fallback must not get unless told to.
var callerHeaders = map[string]string{
	"Authorization":       "Bearer client-key",
	"Proxy-Authorization": "Basic Y2xpZW50OnB3",
	"Cookie":              "session=client-session",
	"X-Api-Key":           "client-anthropic-key",
	"Api-Key":             "client-azure-key",
	"X-Goog-Api-Key":      "client-google-key",
	"OpenAI-Organization": "org-client",
	"OpenAI-Project":      "proj_client",
	"Forwarded":           "for=10.1.2.3",
	"X-Forwarded-For":     "10.1.2.3",
	"X-Real-IP":           "10.1.2.3",
}

// TestFallbackGetsNoCallerCredentials: through the binary, a provider
// that refuses for want of quota sends vip's request to the fallback.
// Where the fallback's reverse_proxy sets only its own key, the fallback
// gets none of the caller's headers above nor the tenant header; where it
// passes the caller's Authorization on with header_up, it gets that one
// and still none of the others. The primary got the caller's key.
func TestFallbackGetsNoCallerCredentials(t *testing.T) {
	t.Parallel()
	var primaryKeys atomic.Int64
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer client-key" {
			primaryKeys.Add(1)
		}
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"Rate limit reached","type":"tokens","code":"rate_limit_exceeded"}}`)
	}))
	defer primary.Close()
	fakes := startFakes(t, 1, "fbcred", harness.FakeOptions{Slots: 4, TTFT: time.Millisecond, PerToken: time.Millisecond})
	p := harness.Ports(t, "Admin", "Strip", "Pass")
	startCaddy(t, `{
	admin 127.0.0.1:{{.Admin}}
	default_bind 127.0.0.1
}
http://127.0.0.1:{{.Strip}} {
	fair_queue {
		name strip
		upstream_quota tpm 600000
		tenant vip weight 1 class interactive
		fallback {
			tenants vip
			reverse_proxy {{.Fallback}} {
				header_up Authorization "Bearer fallback-key"
			}
		}
		reverse_proxy {{.Primary}}
	}
}
http://127.0.0.1:{{.Pass}} {
	fair_queue {
		name pass
		upstream_quota tpm 600000
		tenant vip weight 1 class interactive
		fallback {
			tenants vip
			reverse_proxy {{.Fallback}} {
				header_up Authorization {http.request.header.Authorization}
			}
		}
		reverse_proxy {{.Primary}}
	}
}
`, map[string]any{"Admin": p["Admin"], "Strip": p["Strip"], "Pass": p["Pass"],
		"Primary": strings.TrimPrefix(primary.URL, "http://"), "Fallback": addrs(fakes...)})
	for _, site := range []struct {
		port int
		id   string
		auth string // the Authorization the fallback must get
	}{{p["Strip"], "strip", "Bearer fallback-key"}, {p["Pass"], "pass", "Bearer client-key"}} {
		r := send(context.Background(), defaultClient, fmt.Sprintf("http://127.0.0.1:%d", site.port),
			chatReq{Tenant: "vip", TestID: site.id, MaxTokens: 4, Header: callerHeaders})
		expectServed(t, r)
		if ch := r.Header.Get("X-Fair-Queue-Channel"); ch != "fallback" {
			t.Fatalf("%s: served by %q, want the fallback", site.id, ch)
		}
		got, ok := records(t, fakes...)[site.id]
		if !ok {
			t.Fatalf("%s: the fallback has no record of the request", site.id)
		}
		for k, v := range callerHeaders {
			if k == "Authorization" {
				continue
			}
			for hk, hv := range got.Headers {
				if strings.EqualFold(hk, k) && strings.Contains(hv, v) {
					t.Errorf("%s: the fallback got the caller's %s: %q", site.id, k, hv)
				}
			}
		}
		if got.Headers["Authorization"] != site.auth {
			t.Errorf("%s: the fallback got Authorization %q, want %q", site.id, got.Headers["Authorization"], site.auth)
		}
		if got.Tenant != "" {
			t.Errorf("%s: the fallback got the tenant header %q", site.id, got.Tenant)
		}
	}
	if n := primaryKeys.Load(); n != 2 {
		t.Errorf("the primary got the caller's key %d times, want 2 (once per site)", n)
	}
}
