package testenv

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"
)

// latenessStep is how long each of the probe's sleeps asks for.
const latenessStep = time.Millisecond

// Lateness measures how late this process's goroutines run on a busy
// machine: a probe goroutine waits for a context's deadline [latenessStep]
// away again and again, yields to every other goroutine that can run, and
// keeps the largest amount by which a wait and the wait for its turn
// overran. A call bounded by a deadline waits the same way (the context's
// timer runs a goroutine that closes Done, which wakes the caller), and a
// new context is allocated for every wait, so that while the garbage
// collector marks, the probe is made to assist it as an allocating caller
// is: on a machine whose cores are busy elsewhere, marking is slow, and an
// allocating goroutine can wait for it far longer than for its turn to run.
// A test that bounds how long a call takes adds [Lateness.Max] to the slack
// of that bound instead of assuming an idle machine. The bound itself stays:
// a call that ignores its deadline by more than the measured lateness still
// fails the test.
//
// A Lateness is safe for concurrent use.
type Lateness struct {
	mu      sync.Mutex
	cond    *sync.Cond
	max     time.Duration
	samples int
	stopped bool
}

// MeasureLateness starts measuring and stops when t and its subtests end.
func MeasureLateness(t testing.TB) *Lateness {
	l := &Lateness{}
	l.cond = sync.NewCond(&l.mu)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), latenessStep)
			select {
			case <-done:
				cancel()
				return
			case <-ctx.Done():
			}
			cancel()
			// A goroutine woken by a timer runs next on its P; one woken
			// otherwise (a reply on a socket, a channel) may wait behind
			// every goroutine that can run. Yielding once measures that
			// wait as well.
			runtime.Gosched()
			late := time.Since(start) - latenessStep
			l.mu.Lock()
			l.max = max(l.max, late)
			l.samples++
			l.cond.Broadcast()
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		close(done)
		<-stopped
		l.mu.Lock()
		l.stopped = true
		l.cond.Broadcast()
		l.mu.Unlock()
	})
	return l
}

// Max returns the largest lateness seen since measuring started. It first
// waits for a sample that began after the call, so that a stall which
// delayed the caller's last operation is included.
func (l *Lateness) Max() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	for want := l.samples + 2; l.samples < want && !l.stopped; {
		l.cond.Wait()
	}
	return l.max
}
