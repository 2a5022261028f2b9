package fairqueue

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddy-fair-queue/caddy-fair-queue/quota"
)

func TestCheckTenantID(t *testing.T) {
	for _, id := range []string{
		"", "acme", "team a", "data_batch-2", "Zürich-研究所", "ok 🙂", "a/b:c@d.e", "\uFFFD",
		strings.Repeat("t", MaxTenantIDLen), strings.Repeat("é", MaxTenantIDLen/2),
	} {
		if err := CheckTenantID(id); err != nil {
			t.Errorf("CheckTenantID(%q) = %v, want valid", id, err)
		}
	}
	for _, c := range []struct {
		id     string
		offset int
		want   string
	}{
		{"\x00upstream", 0, "control character (U+0000) at byte 0"},
		{"a\tb", 1, "control character (U+0009)"},
		{"a\r\nb", 1, "control character (U+000D)"},
		{"ab\x7f", 2, "control character (U+007F)"},
		{"x\u0085", 1, "control character (U+0085)"},
		{"bad\xff", 3, "not UTF-8 at byte 3"},
		{"\xc3", 0, "not UTF-8"},
		{"admin\u202eevil", 5, "invisible or unassigned character (U+202E)"},
		{"a\u200bb", 1, "(U+200B)"},
		{"a\u00a0b", 1, "(U+00A0)"},
		{"\ue000", 0, "(U+E000)"},
		{strings.Repeat("t", MaxTenantIDLen+1), MaxTenantIDLen, "longer than 256 bytes"},
	} {
		err := CheckTenantID(c.id)
		var te *TenantIDError
		if !errors.As(err, &te) {
			t.Errorf("CheckTenantID(%q) = %v, want a *TenantIDError", c.id, err)
			continue
		}
		if te.Offset != c.offset || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckTenantID(%q) = %q at %d, want %q at %d", c.id, err, te.Offset, c.want, c.offset)
		}
	}
}

// Every name the queue keeps a meter of its own under is refused as a
// tenant ID, whatever the reserved tenant's name.
func TestInternalMeterNamesAreNoTenantIDs(t *testing.T) {
	for _, name := range []string{upstreamPoolKey, upstreamReservePfx, upstreamReservePfx + "vip",
		fallbackAccountKey} {
		if CheckTenantID(name) == nil {
			t.Errorf("internal meter %q is a valid tenant ID: a caller could name itself into it", name)
		}
	}
}

func TestValidateRefusesInvalidTenantNames(t *testing.T) {
	cfg := testConfig(1, map[string]float64{"\x00upstream": 1})
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "not a valid tenant ID") {
		t.Errorf("a declared tenant named \\x00upstream: Validate = %v, want a refusal", err)
	}
	cfg = testConfig(1, map[string]float64{"vip": 1})
	cfg.Fallback = &FallbackConfig{Tenants: []string{"vip", "\x00fallback"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "fallback") {
		t.Errorf("a fallback tenant named \\x00fallback: Validate = %v, want a refusal", err)
	}
}

// keyCall is one call to the quota store: the meter's key and limits.
type keyCall struct {
	key string
	l   *quota.Limits
}

// recordingStore is a quota.Memory that records every key it is asked
// about.
type recordingStore struct {
	*quota.Memory
	calls []keyCall
}

func (s *recordingStore) note(key string, l *quota.Limits) {
	s.calls = append(s.calls, keyCall{key, l})
}

func (s *recordingStore) Peek(ctx context.Context, key string, l *quota.Limits, ahead quota.Backlog) (quota.Decision, error) {
	s.note(key, l)
	return s.Memory.Peek(ctx, key, l, ahead)
}

func (s *recordingStore) Charge(ctx context.Context, key string, l *quota.Limits, tokens int64) (quota.Decision, error) {
	s.note(key, l)
	return s.Memory.Charge(ctx, key, l, tokens)
}

func (s *recordingStore) Reconcile(ctx context.Context, key string, l *quota.Limits, estimated, actual int64) (quota.Status, error) {
	s.note(key, l)
	return s.Memory.Reconcile(ctx, key, l, estimated, actual)
}

func (s *recordingStore) Book(ctx context.Context, key string, l *quota.Limits, tokens int64, maxWait, lead time.Duration) (quota.Decision, error) {
	s.note(key, l)
	return s.Memory.Book(ctx, key, l, tokens, maxWait, lead)
}

func (s *recordingStore) Refund(ctx context.Context, key string, l *quota.Limits, tokens int64) (quota.Status, error) {
	s.note(key, l)
	return s.Memory.Refund(ctx, key, l, tokens)
}

func (s *recordingStore) Status(ctx context.Context, key string, l *quota.Limits) (quota.Status, error) {
	s.note(key, l)
	return s.Memory.Status(ctx, key, l)
}

// FuzzTenantKeys: a valid tenant ID is isolated to its own keys. Two
// requests of tenant id go through a queue with a quota on every
// undeclared tenant, a provider account with a reservation, and a
// fallback account; the store is asked about the tenant's quota under
// the key id only, about the accounts under their own keys only, and no
// account key is id. (An invalid ID never reaches the queue: the handler
// refuses it, FuzzTenantHeader.)
func FuzzTenantKeys(f *testing.F) {
	for _, s := range []string{"", "acme", "vip", "\x00upstream", "\x00reserve\x00vip", "\x00fallback",
		"\x00probe", "upstream", "slots", "shares", "{x}", "a b", "🙂", "\xff"} {
		f.Add(s)
	}
	tenantQuota := quota.MustCompile(quota.Config{QPS: 100, TokensPerMin: 1e6})
	f.Fuzz(func(t *testing.T, id string) {
		if CheckTenantID(id) != nil {
			return
		}
		cfg := testConfig(10, map[string]float64{"vip": 1, "fb": 1})
		vip := cfg.Tenants["vip"]
		vip.Reserve = 0.2
		cfg.Tenants["vip"] = vip
		cfg.Default.Quota = tenantQuota
		cfg.UpstreamQuota = &UpstreamQuota{TPM: 1e6, RPM: 1e4}
		cfg.Fallback = &FallbackConfig{Tenants: []string{"fb"}, UpstreamQuota: &UpstreamQuota{TPM: 1e6}}
		clk := NewManualClock(t0)
		store := &recordingStore{Memory: quota.NewMemory(clk.Now)}
		cfg.QuotaStore = store
		q, err := New(cfg, clk)
		if err != nil {
			t.Fatal(err)
		}
		q.SetHealthy(1)
		q.SetFallbackHealthy(1)
		tenant := q.undeclared.Quota
		if tc, ok := q.cfg.Tenants[id]; ok {
			tenant = tc.Quota
		}
		// sent waits for tk's dispatch, as the tenant's quota (100
		// requests/s) allows it.
		sent := func(tk *Ticket) {
			for i := 0; ; i++ {
				q.mu.Lock()
				st := tk.state
				q.mu.Unlock()
				if st == stateInflight {
					return
				}
				if i == 100 {
					t.Fatalf("tenant %q: a request was not dispatched within a second", id)
				}
				clk.Advance(10 * time.Millisecond)
				q.Tick()
			}
		}
		var tks []*Ticket
		for range 2 {
			tk, err := q.Enqueue(Request{Tenant: id, Cost: 100, Prompt: 60, Deadline: t0.Add(time.Minute)})
			if err != nil {
				t.Fatalf("tenant %q: Enqueue: %v", id, err)
			}
			sent(tk)
			tks = append(tks, tk)
		}
		// One served with more than its estimate, one refused by the
		// provider and sent again.
		tks[0].Release(150)
		if !tks[1].Requeue() {
			t.Fatal("Requeue of a request in flight failed")
		}
		sent(tks[1])
		tks[1].Release(80)
		account := map[*quota.Limits]bool{q.up.acct: true, q.fb.pool: true}
		for _, l := range q.up.res {
			account[l] = true
		}
		own := 0
		for _, c := range store.calls {
			switch {
			case account[c.l] && (c.key == id || !strings.HasPrefix(c.key, "\x00")):
				t.Fatalf("tenant %q: an account's meter is kept under %q", id, c.key)
			case account[c.l]:
			case c.l == tenant && c.key != id:
				t.Fatalf("tenant %q: its quota is kept under %q", id, c.key)
			case c.l == tenant:
				own++
			default:
				t.Fatalf("tenant %q: the store was asked about %q with limits of nobody's", id, c.key)
			}
		}
		if tenant != nil && own == 0 {
			t.Fatalf("tenant %q: its quota was never asked about", id)
		}
		if !utf8.ValidString(id) {
			t.Fatalf("CheckTenantID accepted %q, which is not UTF-8", id)
		}
		q.Close("test over")
	})
}

// The check runs on every request: it allocates nothing for a valid ID.
func TestCheckTenantIDAllocatesNothing(t *testing.T) {
	for _, id := range []string{"acme", strings.Repeat("é", MaxTenantIDLen/2)} {
		if n := testing.AllocsPerRun(100, func() { _ = CheckTenantID(id) }); n != 0 {
			t.Errorf("CheckTenantID(%d bytes) allocates %v times", len(id), n)
		}
	}
}

func BenchmarkCheckTenantID(b *testing.B) {
	for _, c := range []struct{ name, id string }{
		{"ascii_12", "team-support"},
		{"ascii_256", strings.Repeat("t", MaxTenantIDLen)},
		{"utf8_256", strings.Repeat("é", MaxTenantIDLen/2)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.id)))
			for b.Loop() {
				if CheckTenantID(c.id) != nil {
					b.Fatal("refused")
				}
			}
		})
	}
}
