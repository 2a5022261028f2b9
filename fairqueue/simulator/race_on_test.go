//go:build race

package simulator

// raceEnabled makes the heaviest tests lighter under the race detector,
// which slows the engine's locking by an order of magnitude.
const raceEnabled = true
