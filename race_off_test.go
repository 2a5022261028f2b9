//go:build !race

package caddyfairqueue

// raceEnabled: see race_on_test.go.
const raceEnabled = false
