package fairqueue

import (
	"math"
	"testing"
)

// bruteBackloggedWeight is BackloggedWeight by the former O(n) walk.
func bruteBackloggedWeight(q *Queue) float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := 0.0
	if q.group.queued > 0 {
		w = q.group.weight
	}
	for _, t := range q.tenants {
		if t.group == nil && t.queued > 0 {
			w += t.weight
		}
	}
	return w
}

// TestBackloggedWeightMatchesWalk drives random operations (reloads
// that change weights and move tenants between declared and undeclared,
// requeues, pauses, forgets) and compares the incremental sum with the
// walk after every step.
func TestBackloggedWeightMatchesWalk(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		d := newAheadDriver(t, seed)
		for step := range 3000 {
			d.step(true)
			got, want := d.q.BackloggedWeight(), bruteBackloggedWeight(d.q)
			if math.Abs(got-want) > 1e-9*max(1, want) {
				t.Fatalf("seed %d step %d: BackloggedWeight %v, walk %v", seed, step, got, want)
			}
		}
	}
}

// TestStatsMatchesMap: with nothing moving during the copy, Stats lists
// exactly the remembered tenants.
func TestStatsMatchesMap(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		d := newAheadDriver(t, seed)
		for step := range 2000 {
			d.step(true)
			s := d.q.Stats(true)
			d.q.mu.Lock()
			n := len(d.q.tenants)
			ok := len(s.Tenants) == n
			for _, ts := range s.Tenants {
				if tt := d.q.tenants[ts.Name]; tt == nil || tt.queued != ts.Queued || tt.inflight != ts.Inflight {
					ok = false
				}
			}
			d.q.mu.Unlock()
			if !ok {
				t.Fatalf("seed %d step %d: Stats lists %d tenants, map %d", seed, step, len(s.Tenants), n)
			}
		}
	}
}
