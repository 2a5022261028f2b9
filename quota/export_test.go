package quota

// The bounds of config.go, for the external tests.
const (
	MaxInc  = maxInc
	MinRate = minRate
)
