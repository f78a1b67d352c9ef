package testenv

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"
)

// latenessStep is how long each of a probe's waits asks for.
const latenessStep = time.Millisecond

// latenessProbes is how many probes measure at once. Of many goroutines
// woken together (a test's callers whose deadlines expire during one
// stall), some run later than others; one probe is one of them, several
// come closer to the latest.
const latenessProbes = 4

// Lateness measures how late this process's goroutines run on a busy
// machine: [latenessProbes] probe goroutines each wait for a context's
// deadline [latenessStep] away again and again, yield to every other
// goroutine that can run, and keep the largest amount by which a wait and
// the wait for its turn overran. A call bounded by a deadline waits the
// same way (the context's timer runs a goroutine that closes Done, which
// wakes the caller), and a new context is allocated for every wait, so that
// while the garbage collector marks, a probe is made to assist it as an
// allocating caller is: on a machine whose cores are busy elsewhere, marking is slow, and an
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
	var probes sync.WaitGroup
	for range latenessProbes {
		probes.Go(func() { l.probe(done) })
	}
	t.Cleanup(func() {
		close(done)
		probes.Wait()
		l.mu.Lock()
		l.stopped = true
		l.cond.Broadcast()
		l.mu.Unlock()
	})
	return l
}

// probe measures until done is closed.
func (l *Lateness) probe(done <-chan struct{}) {
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
}

// Max returns the largest lateness seen since measuring started. It first
// waits for samples that began after the call, so that a stall which
// delayed the caller's last operation is included.
func (l *Lateness) Max() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	for want := l.samples + 2*latenessProbes; l.samples < want && !l.stopped; {
		l.cond.Wait()
	}
	return l.max
}
