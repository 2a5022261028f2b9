package main

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// A provider account's limits, as providers apply them: every request
// takes 1 request and its prompt plus max_tokens tokens when it arrives,
// from a meter per dimension that holds one minute's allowance. A request
// the meters cannot take gets 429 with Retry-After and the x-ratelimit-*
// headers, and takes nothing; every answer carries the headers. Providers
// keep that minute in one of three ways (Window):
//
//   - WindowBucket: a token bucket of a minute's allowance, refilled
//     continuously (what OpenAI documents);
//   - WindowRolling: the last 60 s, each request counting until 60 s after
//     it arrived;
//   - WindowFixed: the wall clock's minutes, the count reset on the minute.

// The kinds of window a provider counts its minute in.
const (
	WindowBucket  = "bucket"
	WindowRolling = "rolling"
	WindowFixed   = "fixed"
)

// limitWindow is the minute the limits are per.
const limitWindow = time.Minute

// meter is one dimension's count. The zero value (perMin 0) limits
// nothing.
type meter struct {
	kind   string
	perMin float64
	// bucket: level is what is left, as of at.
	level float64
	at    time.Time
	// rolling: what arrived when, oldest first, and its sum.
	times   []time.Time
	amounts []float64
	sum     float64
	// fixed: the minute counted (Unix minute) and what it used.
	minute int64
	used   float64
}

func newMeter(kind string, perMin float64) meter {
	return meter{kind: kind, perMin: perMin, level: perMin}
}

// validWindow reports whether kind names a window.
func validWindow(kind string) error {
	switch kind {
	case WindowBucket, WindowRolling, WindowFixed:
		return nil
	}
	return fmt.Errorf("unknown limit window %q (want %s, %s or %s)", kind, WindowBucket, WindowRolling, WindowFixed)
}

// advance brings the meter to now.
func (m *meter) advance(now time.Time) {
	if m.perMin == 0 {
		return
	}
	switch m.kind {
	case WindowRolling:
		cut := now.Add(-limitWindow)
		k := 0
		for k < len(m.times) && !m.times[k].After(cut) {
			m.sum -= m.amounts[k]
			k++
		}
		m.times, m.amounts = m.times[k:], m.amounts[k:]
		if len(m.times) == 0 {
			m.sum = 0 // no rounding left over
		}
	case WindowFixed:
		if minute := now.Unix() / 60; minute != m.minute {
			m.minute, m.used = minute, 0
		}
	default:
		if !m.at.IsZero() {
			m.level = math.Min(m.perMin, m.level+now.Sub(m.at).Seconds()*m.perMin/60)
		}
		m.at = now
	}
}

// left is what can be taken now.
func (m *meter) left() float64 {
	switch m.kind {
	case WindowRolling:
		return m.perMin - m.sum
	case WindowFixed:
		return m.perMin - m.used
	}
	return m.level
}

// wait is how long from now until n fits, 0 when it fits now.
func (m *meter) wait(now time.Time, n float64) time.Duration {
	if m.perMin == 0 || n <= m.left() {
		return 0
	}
	switch m.kind {
	case WindowRolling:
		// Until enough of the oldest arrivals have left the window.
		over := n - m.left()
		for k, a := range m.amounts {
			over -= a
			if over <= 0 {
				return m.times[k].Add(limitWindow).Sub(now)
			}
		}
		return limitWindow
	case WindowFixed:
		return m.nextMinute(now)
	}
	return time.Duration((n - m.level) / (m.perMin / 60) * float64(time.Second))
}

// take takes n.
func (m *meter) take(now time.Time, n float64) {
	if m.perMin == 0 {
		return
	}
	switch m.kind {
	case WindowRolling:
		m.times = append(m.times, now)
		m.amounts = append(m.amounts, n)
		m.sum += n
	case WindowFixed:
		m.used += n
	default:
		m.level -= n
	}
}

// reset is how long until the meter is back at its whole allowance, if
// nothing more is taken: x-ratelimit-reset-*.
func (m *meter) reset(now time.Time) time.Duration {
	switch m.kind {
	case WindowRolling:
		if len(m.times) == 0 {
			return 0
		}
		return m.times[len(m.times)-1].Add(limitWindow).Sub(now)
	case WindowFixed:
		if m.used == 0 {
			return 0
		}
		return m.nextMinute(now)
	}
	return time.Duration((m.perMin - m.level) / (m.perMin / 60) * float64(time.Second))
}

func (m *meter) nextMinute(now time.Time) time.Duration {
	return time.Unix((now.Unix()/60+1)*60, 0).Sub(now)
}

// admitLocked takes a request of tokens from the account's meters, or
// answers how long until it would fit; it sets the x-ratelimit-* headers
// either way. s.mu must be held.
func (s *Server) admitLocked(h http.Header, tokens int) (retry time.Duration) {
	now := time.Now()
	s.rpm.advance(now)
	s.tpm.advance(now)
	retry = max(s.rpm.wait(now, 1), s.tpm.wait(now, float64(tokens)))
	if retry == 0 {
		s.rpm.take(now, 1)
		s.tpm.take(now, float64(tokens))
		s.stats.ChargedTokens += uint64(tokens)
	}
	set := func(kind string, m *meter) {
		if m.perMin == 0 {
			return
		}
		h.Set("X-Ratelimit-Limit-"+kind, strconv.FormatInt(int64(m.perMin), 10))
		h.Set("X-Ratelimit-Remaining-"+kind, strconv.FormatInt(int64(math.Max(m.left(), 0)), 10))
		h.Set("X-Ratelimit-Reset-"+kind, m.reset(now).Round(time.Millisecond).String())
	}
	set("Requests", &s.rpm)
	set("Tokens", &s.tpm)
	return retry
}
