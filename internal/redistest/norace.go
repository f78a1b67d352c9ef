//go:build !race && !js

package redistest

// raceEnabled reports whether the race detector is on (see race.go).
const raceEnabled = false
