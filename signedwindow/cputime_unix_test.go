//go:build unix

package signedwindow

import (
	"syscall"
	"testing"
	"time"
)

// processCPU returns the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU runs f (a serial benchmark loop) and reports the process CPU
// time per operation as "cpu-ns/op" besides the wall-clock ns/op. On a
// shared, oversubscribed machine wall time includes waiting for a core;
// CPU time does not (it still includes the garbage collector's share).
func reportCPU(b *testing.B, f func()) {
	start := processCPU()
	f()
	if used := processCPU() - start; used > 0 && b.N > 0 {
		b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}
