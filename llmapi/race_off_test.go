//go:build !race

package llmapi

// raceEnabled: see race_on_test.go.
const raceEnabled = false
