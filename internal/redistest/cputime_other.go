//go:build !unix

package redistest

import "time"

// cpuTime reports that this system has no getrusage.
func cpuTime() (time.Duration, bool) { return 0, false }
