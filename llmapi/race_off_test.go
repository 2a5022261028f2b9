//go:build !race

package llmapi

const raceEnabled = false
