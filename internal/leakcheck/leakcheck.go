// Package leakcheck finds goroutines that outlive a test, with the standard
// library only, so that the library's modules need no test-only dependency.
// It follows go.uber.org/goleak's rules: the calling goroutine, the testing
// package's own goroutines and the runtime's signal and trace goroutines are
// expected; any other goroutine still running after retries is a leak.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// goroutine is one goroutine of a stack dump.
type goroutine struct {
	id    string
	state string   // "chan receive" in "goroutine 7 [chan receive, 2 minutes]:"
	funcs []string // the functions of its frames, innermost first, then its creator
	dump  string
}

// goroutines parses runtime.Stack(all).
func goroutines(all bool) []goroutine {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, all)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for _, block := range strings.Split(strings.TrimSpace(string(buf)), "\n\n") {
		lines := strings.Split(block, "\n")
		header, ok := strings.CutPrefix(lines[0], "goroutine ")
		if !ok {
			continue
		}
		g := goroutine{dump: block}
		g.id, g.state, _ = strings.Cut(header, " [")
		g.state, _, _ = strings.Cut(strings.TrimSuffix(g.state, "]:"), ",")
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "\t") {
				continue
			}
			if name, ok := strings.CutPrefix(l, "created by "); ok {
				name, _, _ = strings.Cut(name, " in goroutine")
				g.funcs = append(g.funcs, name)
			} else if i := strings.LastIndexByte(l, '('); i > 0 {
				g.funcs = append(g.funcs, l[:i])
			}
		}
		gs = append(gs, g)
	}
	return gs
}

func (g goroutine) top() string {
	if len(g.funcs) == 0 {
		return ""
	}
	return g.funcs[0]
}

func (g goroutine) has(f string) bool {
	for _, h := range g.funcs {
		if h == f {
			return true
		}
	}
	return false
}

// expected reports whether g runs for the testing package or the runtime.
func (g goroutine) expected() bool {
	switch g.top() {
	case "testing.RunTests", "testing.(*T).Run", "testing.(*T).Parallel", "testing.runFuzzing", "testing.runFuzzTests":
		return strings.HasPrefix(g.state, "chan receive")
	case "os/signal.signal_recv", "os/signal.loop":
		return true
	}
	// runtime.handleEvent is the goroutine that js/wasm's runtime keeps
	// for the host's events (Node, a browser, an edge runtime).
	return (g.has("runtime.goexit") && strings.HasPrefix(g.state, "syscall")) ||
		g.has("runtime.ensureSigM") || g.has("runtime.ReadTrace") || g.has("runtime.handleEvent")
}

// Find returns an error listing the goroutines other than the caller's that
// are still running after about half a second of retries, leaving out the
// expected ones and those whose innermost function is one of ignoreTop
// (fully qualified, as in "net/http.(*persistConn).readLoop"). It returns nil
// if there are none.
func Find(ignoreTop ...string) error { return find(ignoreTop, nil) }

// find is Find that also leaves out the goroutines with any of ignoreAny
// anywhere in their stacks.
func find(ignoreTop, ignoreAny []string) error {
	self := goroutines(false)[0].id
	var leaked []string
	for i := 0; ; i++ {
		leaked = leaked[:0]
		for _, g := range goroutines(true) {
			if g.id == self || g.expected() || contains(ignoreTop, g.top()) || slices.ContainsFunc(ignoreAny, g.has) {
				continue
			}
			leaked = append(leaked, g.dump)
		}
		if len(leaked) == 0 {
			return nil
		}
		if i == 20 {
			return fmt.Errorf("found unexpected goroutines:\n%s", strings.Join(leaked, "\n\n"))
		}
		time.Sleep(min(time.Microsecond<<i, 100*time.Millisecond))
	}
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// VerifyNone fails t if Find reports a leak. Call it deferred at the start
// of a test.
func VerifyNone(t testing.TB, ignoreTop ...string) {
	t.Helper()
	if err := Find(ignoreTop...); err != nil {
		t.Error(err)
	}
}

// VerifyTestMain runs the tests of m and exits; the exit status is non-zero
// if a test failed or if, after all passed, Find reports a leak. Call it as
// TestMain's body. Goroutines with any of ignoreAny (fully qualified
// function names) anywhere in their stacks are not leaks.
func VerifyTestMain(m *testing.M, ignoreAny ...string) {
	code := m.Run()
	if code == 0 {
		if err := find(nil, ignoreAny); err != nil {
			fmt.Fprintln(os.Stderr, "leakcheck:", err)
			code = 1
		}
	}
	os.Exit(code)
}
