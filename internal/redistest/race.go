//go:build race && !js

package redistest

// raceEnabled reports whether the race detector is on, under which
// sync.Pool drops a quarter of what is put back: allocation counts then
// vary from run to run.
const raceEnabled = true
