package budget

import "time"

// ColdRate bounds the throughput from above while Throughput has no sample
// yet. A request in flight for a seconds takes at least a seconds, and a
// completed one took exactly its service time, so over every request
// dispatched so far the mean of those times is at most the mean service
// time S, and
//
//	rate <= slots x mean cost / S <= slots x mean cost / mean(ages, services)
//
// The completed requests alone give a tighter bound (the first to complete
// are the short ones); Rate uses the larger mean, the latter from
// ColdCompletions completions on. An ETA at this rate is a lower bound:
// early refusal may act on it, never admission.
type ColdRate struct {
	started bool
	origin  time.Time

	inflight     int
	inflightCost float64
	dispatchSum  float64 // Σ dispatch time of the requests in flight, s since origin

	done        int
	doneCost    float64
	doneService float64 // Σ service time of completed requests, s
}

// ColdCompletions is how many completions ColdRate needs before the mean
// service time of the completed requests alone counts.
const ColdCompletions = DefaultMinCompletions

// Start records a dispatch of a request of cost units at now.
func (c *ColdRate) Start(now time.Time, cost float64) {
	c.inflight++
	c.inflightCost += cost
	c.dispatchSum += c.at(now)
}

// Finish records the completion at now of a request of cost units that
// Start recorded at dispatched.
func (c *ColdRate) Finish(now, dispatched time.Time, cost float64) {
	if c.inflight == 0 {
		return
	}
	c.Abandon(dispatched, cost)
	c.done++
	c.doneCost += cost
	c.doneService += max(now.Sub(dispatched).Seconds(), 0)
}

// Abandon undoes the Start recorded at dispatched for a request that went
// back to the queue without being served (its upstream refused it).
func (c *ColdRate) Abandon(dispatched time.Time, cost float64) {
	if c.inflight == 0 {
		return
	}
	c.inflight--
	c.inflightCost -= cost
	c.dispatchSum -= c.at(dispatched)
}

// Completions is the number of completions Finish recorded.
func (c *ColdRate) Completions() int { return c.done }

// Rate returns the upper bound of the rate, in cost units per second, with
// slots dispatch slots; 0 (unknown) before any dispatch, or while the
// cohort's mean time is still 0.
func (c *ColdRate) Rate(now time.Time, slots int) float64 {
	n := c.inflight + c.done
	if n == 0 || slots <= 0 {
		return 0
	}
	ages := float64(c.inflight)*c.at(now) - c.dispatchSum
	mean := (max(ages, 0) + c.doneService) / float64(n)
	cost := (c.inflightCost + c.doneCost) / float64(n)
	if c.done >= ColdCompletions {
		if m := c.doneService / float64(c.done); m > mean {
			mean, cost = m, c.doneCost/float64(c.done)
		}
	}
	if !(mean > 0) {
		return 0
	}
	return float64(slots) * cost / mean
}

func (c *ColdRate) at(now time.Time) float64 {
	if !c.started {
		c.started, c.origin = true, now
	}
	return now.Sub(c.origin).Seconds()
}
