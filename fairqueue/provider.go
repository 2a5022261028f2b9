package fairqueue

import (
	"math"
	"time"
)

// The provider's window: a stream that never puts more than the limits into
// any 60 s window is refused by no provider, whatever bucket it keeps. The
// account's meters keep the gateway's own sends to that (drawShare); the
// provider's reports correct it where it counts more: ProviderLevel caps
// dispatch at the level it reported, less what was sent since; and
// AccountExhausted (a 429, or 0 left) stops dispatch until its reset.

// sendLog records what was sent to the account over the last providerWindow
// plus the guard: each entry a time and the tokens and requests sent then
// (negative for a draw taken back), oldest first, with running totals of
// everything ever logged.
type sendLog struct {
	e                      []sendEntry
	head                   int // entries before head have left the window
	totalTokens, totalReqs int64
}

type sendEntry struct {
	at               int64 // Unix ns
	tokens, requests int64
}

// add logs tokens and requests sent (or taken back) at now and drops what
// has left the window.
func (l *sendLog) add(now time.Time, tokens, requests int64) {
	ns := now.UnixNano()
	if n := len(l.e); n > l.head && l.e[n-1].at >= ns {
		// The same instant (or a clock read before the last): one entry.
		l.e[n-1].tokens += tokens
		l.e[n-1].requests += requests
	} else {
		l.e = append(l.e, sendEntry{ns, tokens, requests})
	}
	l.totalTokens += tokens
	l.totalReqs += requests
	l.prune(now)
}

// prune drops the entries older than the window and the guard, and
// compacts the slice once half of it is dropped.
func (l *sendLog) prune(now time.Time) {
	cut := now.Add(-providerWindow - providerGuard).UnixNano()
	for l.head < len(l.e) && l.e[l.head].at <= cut {
		l.head++
	}
	if l.head > 64 && l.head*2 > len(l.e) {
		l.e = l.e[:copy(l.e, l.e[l.head:])]
		l.head = 0
	}
}

// since sums what was logged after t (Unix ns), within the window:
// O(entries after t), from the newest back.
func (l *sendLog) since(t int64) (tokens, requests int64) {
	for i := len(l.e) - 1; i >= l.head && l.e[i].at > t; i-- {
		tokens += l.e[i].tokens
		requests += l.e[i].requests
	}
	return tokens, requests
}

// inWindow sums what was sent in the providerWindow ending at now.
func (l *sendLog) inWindow(now time.Time) (tokens, requests int64) {
	return l.since(now.Add(-providerWindow).UnixNano())
}

// providerLevel is what the provider last reported remaining of the
// account, per dimension: the level as of asOf (the reporting request's
// dispatch), less what was sent after it up to when the report came
// (base), and the log's total then (mark), so that the level at any later
// time costs O(1): base - (total - mark) + rate x (now - asOf).
type providerLevel struct {
	asOf               int64 // Unix ns; 0: no report
	tokBase, reqBase   float64
	tokMark, reqMark   int64
	tokUntil, reqUntil int64 // Unix ns the report of each dimension lapses at; 0: not reported
}

// ProviderReport is what a provider's answer said of the account: the
// x-ratelimit-remaining-tokens and -requests (negative: absent) and the
// x-ratelimit-reset-* times until each is back at its limit (0: absent).
type ProviderReport struct {
	RemainingTokens, RemainingRequests int64
	ResetTokens, ResetRequests         time.Duration
}

// maxProviderReset bounds how long a report stands: providers counting
// per minute are back at their limit within a minute, and a garbled or
// hostile header must not hold the account longer.
const maxProviderReset = providerWindow + providerGuard

// ProviderLevel records what the provider reported remaining in its answer
// to tk: until the provider reports again or the reset passes, no request
// is sent to the account beyond that level, less what was sent since tk
// plus the meters' refill. Older news, and reports on a ticket that did
// not draw on the primary account, are ignored.
func (tk *Ticket) ProviderLevel(r ProviderReport) {
	q := tk.q
	q.mu.Lock()
	defer q.unlock()
	u := q.up
	if u == nil || tk.fallback || tk.state != stateInflight && tk.state != stateReleased {
		return
	}
	now := q.clock.Now()
	asOf := q.at(tk.dispatched).UnixNano()
	lv := &u.level
	if asOf < lv.asOf {
		return
	}
	u.sent.prune(now)
	tok, req := u.sent.since(asOf)
	*lv = providerLevel{asOf: asOf, tokMark: u.sent.totalTokens, reqMark: u.sent.totalReqs}
	// A report stands until its reset, at most maxProviderReset.
	lapse := func(reset time.Duration) int64 {
		if reset <= 0 {
			reset = maxProviderReset
		}
		return asOf + int64(min(reset, maxProviderReset))
	}
	if r.RemainingTokens >= 0 && u.tpm > 0 {
		lv.tokBase, lv.tokUntil = float64(r.RemainingTokens-tok), lapse(r.ResetTokens)
	}
	if r.RemainingRequests >= 0 && u.rpm > 0 {
		lv.reqBase, lv.reqUntil = float64(r.RemainingRequests-req), lapse(r.ResetRequests)
	}
	// A higher level may let a request go that waited for it.
	q.dispatchLocked(now)
}

// levelAt is the provider's level of each dimension at now (NaN: no
// report in force).
func (u *upstream) levelAt(now time.Time) (tokens, requests float64) {
	lv := &u.level
	ns := now.UnixNano()
	tokens, requests = math.NaN(), math.NaN()
	dt := float64(ns-lv.asOf) / 1e9
	if lv.tokUntil > ns {
		tokens = lv.tokBase - float64(u.sent.totalTokens-lv.tokMark) + u.tokensPerSec*dt
	}
	if lv.reqUntil > ns {
		requests = lv.reqBase - float64(u.sent.totalReqs-lv.reqMark) + u.requestsPerSec*dt
	}
	return tokens, requests
}

// levelAllowsLocked reports whether the provider's last report leaves
// room for tk now (a lapsed report, NaN, leaves room).
func (q *Queue) levelAllowsLocked(now time.Time, tk *Ticket) bool {
	u := q.up
	if u.level.asOf == 0 {
		return true
	}
	tok, req := u.levelAt(now)
	return !(float64(tk.tokens) > tok && u.tokensPerSec > 0) && !(1 > req && u.requestsPerSec > 0)
}
