//go:build race

package llmapi

// raceEnabled: under the race detector sync.Pool drops a share of what is
// put back, so the pooled scratch is allocated again now and then.
const raceEnabled = true
