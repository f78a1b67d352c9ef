package httplimit

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// minPerCall runs f in 5 loops of 200 calls and returns the fastest loop's
// time per call: the least disturbed by other processes on a shared machine.
func minPerCall(f func()) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range 5 {
		start := time.Now()
		for range 200 {
			f()
		}
		best = min(best, time.Since(start)/200)
	}
	return best
}

// TestKeyInputCostFlat checks that the key parsers refuse a 1 MiB header
// value at about the cost of a short one: they refuse by length before
// reading (or hashing) the value. Reading 1 MiB takes tens of microseconds
// or more; the test allows 20 times the short input's cost plus a
// microsecond.
func TestKeyInputCostFlat(t *testing.T) {
	shapes := map[string]func(n int) string{
		"spaces":  func(n int) string { return strings.Repeat(" ", n) },
		"letters": func(n int) string { return strings.Repeat("a", n) },
		"digits":  func(n int) string { return "1" + strings.Repeat(".1", n/2) },
		"colons":  func(n int) string { return strings.Repeat(":", n) },
	}
	// Each parser prepares its call on an input once, outside the timing.
	parsers := map[string]func(s string) func(){
		"ParseIPKey": func(s string) func() { return func() { _, _ = ParseIPKey(s) } },
		"ForwardedForClient": func(s string) func() {
			return func() { _, _ = ForwardedForClient([]string{s}, 1) }
		},
		"ForwardedForClient/lines": func(s string) func() {
			// The client's own field line, then the one a proxy added.
			return func() { _, _ = ForwardedForClient([]string{s, "192.0.2.1"}, 2) }
		},
		"ForwardedForClient/joined": func(s string) func() {
			v := []string{s + ", 192.0.2.1"}
			return func() { _, _ = ForwardedForClient(v, 2) }
		},
		"APIKey": func(s string) func() { return func() { _, _ = APIKey(s) } },
	}
	for name, prepare := range parsers {
		for shape, gen := range shapes {
			short, long := prepare(gen(80)), prepare(gen(1<<20))
			t.Run(name+"/"+shape, func(t *testing.T) {
				base := minPerCall(short)
				big := minPerCall(long)
				if big > 20*base+time.Microsecond {
					t.Fatalf("1 MiB input costs %v per call, 80 bytes %v", big, base)
				}
			})
		}
	}
}

// TestKeyInputBounds checks the length bounds at their edges, and that a
// long value to the left of the entries used does not matter.
func TestKeyInputBounds(t *testing.T) {
	pad := func(n int, ip string) string { return strings.Repeat(" ", n-len(ip)) + ip }
	junk := strings.Repeat("a", 1<<20)
	for _, c := range []struct {
		values  []string
		trusted int
		want    string // "" for an error matching ErrNoKey
	}{
		{[]string{pad(100, "192.0.2.1")}, 1, "ip:192.0.2.1"},
		{[]string{pad(101, "192.0.2.1")}, 1, ""},
		{[]string{"192.0.2.7," + pad(100, "192.0.2.1")}, 1, "ip:192.0.2.1"},
		{[]string{"192.0.2.7," + pad(100, "192.0.2.1")}, 2, "ip:192.0.2.7"},
		{[]string{"192.0.2.7," + pad(101, "192.0.2.1")}, 2, ""},
		{[]string{junk + ",192.0.2.1"}, 1, "ip:192.0.2.1"},
		{[]string{junk + ", 192.0.2.7, 192.0.2.1"}, 2, "ip:192.0.2.7"},
		{[]string{junk, "192.0.2.7", "192.0.2.1"}, 2, "ip:192.0.2.7"},
		{[]string{junk + ", 192.0.2.1"}, 2, ""},
	} {
		got, err := ForwardedForClient(c.values, c.trusted)
		if c.want == "" {
			if !errors.Is(err, ErrNoKey) {
				t.Errorf("ForwardedForClient(%.40q…, %d) = %q, %v; want ErrNoKey", c.values, c.trusted, got, err)
			}
		} else if got != c.want || err != nil {
			t.Errorf("ForwardedForClient(%.40q…, %d) = %q, %v; want %q", c.values, c.trusted, got, err, c.want)
		}
	}
	if _, err := APIKey(strings.Repeat("k", maxAPIKeyLen)); err != nil {
		t.Errorf("APIKey of %d bytes: %v", maxAPIKeyLen, err)
	}
	if _, err := APIKey(strings.Repeat("k", maxAPIKeyLen+1)); !errors.Is(err, ErrNoKey) {
		t.Errorf("APIKey of %d bytes: %v, want ErrNoKey", maxAPIKeyLen+1, err)
	}
}
