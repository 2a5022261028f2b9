//go:build race

package caddyfairqueue

// raceEnabled: under the race detector sync.Pool drops a share of what is
// put back, so pooled scratch memory is allocated again now and then.
const raceEnabled = true
