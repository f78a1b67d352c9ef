//go:build !race && !js

package redistest

// AllocSlack is the slack a test gives an allocation bound (see race.go).
const AllocSlack = 0
