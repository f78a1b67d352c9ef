package testenv

import (
	"runtime"
	"testing"
	"time"
)

// TestLatenessSeesAStall keeps the only P busy for 50ms: the probe cannot
// run until the scheduler preempts the busy goroutine (every 10ms at the
// soonest), so Max must report at least a few milliseconds. A probe that
// measured nothing, or only the timer, would report about zero.
func TestLatenessSeesAStall(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	l := MeasureLateness(t)
	time.Sleep(5 * time.Millisecond) // the probe is sleeping
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	if got := l.Max(); got < 5*time.Millisecond {
		t.Fatalf("Max() = %v after the only P was busy for 50ms, want at least 5ms", got)
	}
}

// TestLatenessMaxAfterCleanup returns at once once measuring stopped.
func TestLatenessMaxAfterCleanup(t *testing.T) {
	var l *Lateness
	t.Run("measure", func(t *testing.T) { l = MeasureLateness(t) })
	done := make(chan time.Duration)
	go func() { done <- l.Max() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Max blocked after the test that measured ended")
	}
}
