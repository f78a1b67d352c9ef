package signedwindow

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// clientInputParsers are the functions of the package that read a value a
// client sends, each with the input in the position the client controls.
func clientInputParsers(l *Limiter) map[string]func(s string) {
	ctx := context.Background()
	return map[string]func(string){
		"VerifySolution": func(s string) { _ = l.VerifySolution(s, alice, 0) },
		"VerifyNonce":    func(s string) { _ = l.VerifyNonce(s, alice) },
		"VerifyToken":    func(s string) { _, _ = l.VerifyToken(s, alice) },
		"ParseToken":     func(s string) { _, _ = ParseToken(s) },
		"Allow":          func(s string) { _, _ = l.Allow(ctx, ratekit.Request{Key: alice, Cost: 1, State: s}) },
		"Refund":         func(s string) { _, _ = l.Refund(ctx, ratekit.Request{Key: alice, Cost: 1, State: s}) },
		"Solve": func(s string) {
			ctx, cancel := context.WithCancel(ctx)
			cancel() // a malformed challenge is refused before ctx is read
			_, _ = Solve(ctx, s)
		},
	}
}

// oversizedInputs returns client inputs of n bytes in shapes that reach as
// far into each parser as a long input can: base64url text, a solution
// whose counter part is well formed, dots, digits.
func oversizedInputs(n int) map[string]string {
	return map[string]string{
		"base64":   strings.Repeat("A", n),
		"solution": strings.Repeat("A", n-2) + ".1",
		"dots":     strings.Repeat(".", n),
		"digits":   strings.Repeat("1", n),
		"dot-last": strings.Repeat("A", n-1) + ".",
	}
}

// minDuration runs f rounds times in loops of iters calls and returns the
// shortest loop's time per call: the least disturbed by other processes on
// a shared machine.
func minDuration(rounds, iters int, f func()) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range rounds {
		start := time.Now()
		for range iters {
			f()
		}
		best = min(best, time.Since(start)/time.Duration(iters))
	}
	return best
}

// TestClientInputCostFlat checks that refusing a 1 MiB client value costs
// about what refusing a short one does: every parser rejects by length
// before it reads the input. Scanning 1 MiB takes tens of microseconds or
// more, hundreds of times a short refusal; the test allows 20 times, plus
// a microsecond, taking the fastest of several loops.
func TestClientInputCostFlat(t *testing.T) {
	l := mustNew(t, testConfig(newClock(t0)))
	short := oversizedInputs(80)
	long := oversizedInputs(1 << 20)
	for name, parse := range clientInputParsers(l) {
		for shape := range long {
			t.Run(name+"/"+shape, func(t *testing.T) {
				base := minDuration(5, 200, func() { parse(short[shape]) })
				big := minDuration(5, 200, func() { parse(long[shape]) })
				if big > 20*base+time.Microsecond {
					t.Fatalf("1 MiB input costs %v per call, 80 bytes %v", big, base)
				}
			})
		}
	}
}

// BenchmarkClientInputSize reports the cost of refusing client values of
// growing size: ns/op must stay flat.
func BenchmarkClientInputSize(b *testing.B) {
	l := mustNew(b, testConfig(newClock(t0)))
	for _, name := range []string{"VerifySolution", "VerifyNonce", "Allow"} {
		parse := clientInputParsers(l)[name]
		for _, n := range []int{64, 4 << 10, 1 << 20} {
			in := oversizedInputs(n)["solution"]
			b.Run(fmt.Sprintf("%s/%dB", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					parse(in)
				}
			})
		}
	}
}
