package main

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// A provider account's limits, as OpenAI-style providers apply them: a
// bucket per dimension holding at most one minute's allowance, refilled
// continuously, from which every request takes 1 request and its prompt
// plus max_tokens tokens when it arrives. A request the buckets cannot
// take gets 429 with Retry-After and the x-ratelimit-* headers, and
// takes nothing; every answer carries the headers.

// limiter is one bucket; the zero value (rate 0) limits nothing.
type limiter struct {
	perMin float64
	level  float64 // what is left
	at     time.Time
}

func newLimiter(perMin float64) limiter { return limiter{perMin: perMin, level: perMin} }

func (l *limiter) refill(now time.Time) {
	if l.perMin == 0 {
		return
	}
	if !l.at.IsZero() {
		l.level = math.Min(l.perMin, l.level+now.Sub(l.at).Seconds()*l.perMin/60)
	}
	l.at = now
}

// wait is how long until n fits, 0 when it fits now.
func (l *limiter) wait(n float64) time.Duration {
	if l.perMin == 0 || n <= l.level {
		return 0
	}
	return time.Duration((n - l.level) / (l.perMin / 60) * float64(time.Second))
}

// reset is how long until the bucket is full again.
func (l *limiter) reset() time.Duration {
	return time.Duration((l.perMin - l.level) / (l.perMin / 60) * float64(time.Second))
}

// admitLocked takes a request of tokens from the account's buckets, or
// answers how long until it would fit; it sets the x-ratelimit-* headers
// either way. s.mu must be held.
func (s *Server) admitLocked(h http.Header, tokens int) (retry time.Duration) {
	now := time.Now()
	s.rpm.refill(now)
	s.tpm.refill(now)
	retry = max(s.rpm.wait(1), s.tpm.wait(float64(tokens)))
	if retry == 0 {
		if s.rpm.perMin > 0 {
			s.rpm.level--
		}
		if s.tpm.perMin > 0 {
			s.tpm.level -= float64(tokens)
		}
	}
	set := func(kind string, l *limiter) {
		if l.perMin == 0 {
			return
		}
		h.Set("X-Ratelimit-Limit-"+kind, strconv.FormatInt(int64(l.perMin), 10))
		h.Set("X-Ratelimit-Remaining-"+kind, strconv.FormatInt(int64(math.Max(l.level, 0)), 10))
		h.Set("X-Ratelimit-Reset-"+kind, l.reset().Round(time.Millisecond).String())
	}
	set("Requests", &s.rpm)
	set("Tokens", &s.tpm)
	return retry
}
