//go:build race

package llmapi

// raceEnabled lets accuracy tests that tokenize megabytes skip under the
// race detector, which slows tiktoken-go about twentyfold and finds nothing
// in single-goroutine arithmetic.
const raceEnabled = true
