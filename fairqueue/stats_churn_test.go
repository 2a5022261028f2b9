package fairqueue

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
)

// TestStatsChunkedRandomChurn: between chunks, random tenants are
// forgotten and created (the roster shrinking below the cursor, names
// seen again); every tenant remembered throughout the copy must appear
// exactly once, nothing twice.
func TestStatsChunkedRandomChurn(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		h := newHarness(t, testConfig(1, nil), 1, 1)
		h.enqueue(Request{Tenant: "holder", Cost: 1})
		next := 0
		add := func() {
			nm := "t" + strconv.Itoa(next)
			if rng.IntN(4) == 0 && next > 0 {
				nm = "t" + strconv.Itoa(rng.IntN(next)) // maybe seen again
			}
			next++
			h.enqueue(Request{Tenant: nm, Cost: 1}).Release(0)
		}
		for range statsChunk/2 + rng.IntN(6*statsChunk) {
			add()
		}
		q := h.q
		start := map[*tenant]bool{}
		q.mu.Lock()
		for _, tt := range q.tenants {
			start[tt] = true
		}
		q.mu.Unlock()
		setStatsPause(t, func() {
			for range rng.IntN(statsChunk) {
				add()
			}
			q.mu.Lock()
			k := rng.IntN(len(q.roster) + 1)
			for range k {
				if len(q.roster) <= 1 {
					break
				}
				tt := q.roster[rng.IntN(len(q.roster))]
				if tt.name == "holder" {
					continue
				}
				q.forgetLocked(tt)
				delete(start, tt)
			}
			q.mu.Unlock()
		})
		s := q.Stats(true)
		statsPause = runtime.Gosched
		seen := map[string]int{}
		for _, ts := range s.Tenants {
			if seen[ts.Name]++; seen[ts.Name] > 1 {
				t.Fatalf("seed %d: %s listed twice", seed, ts.Name)
			}
		}
		for tt := range start {
			if seen[tt.name] != 1 {
				t.Fatalf("seed %d: %s, remembered throughout, listed %d times", seed, tt.name, seen[tt.name])
			}
		}
	}
}
