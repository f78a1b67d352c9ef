package leakcheck

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestFindReportsALeakAndItsEnd(t *testing.T) {
	if err := Find(); err != nil {
		t.Fatalf("before the leak: %v", err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-stop
	}()
	err := Find()
	if err == nil || !strings.Contains(err.Error(), "TestFindReportsALeakAndItsEnd") {
		t.Fatalf("Find with a blocked goroutine = %v, want the goroutine", err)
	}
	close(stop)
	<-done
	if err := Find(); err != nil {
		t.Fatalf("after the goroutine ended: %v", err)
	}
}

func TestFindIgnoresTopFunction(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go parked(stop, done)
	defer func() { close(stop); <-done }()
	waitParked(t)
	if err := Find("github.com/ratekit/ratekit/internal/leakcheck.parked"); err != nil {
		t.Fatalf("Find ignoring parked: %v", err)
	}
}

// waitParked waits until a goroutine blocks in parked, so that its top
// frame is parked and not yet the function that started it.
func waitParked(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "[chan receive") && strings.Contains(g, "leakcheck.parked(") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the goroutine did not block in parked within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

//go:noinline
func parked(stop, done chan struct{}) {
	defer close(done)
	<-stop
}

func TestFindIgnoresAFunctionAnywhereInTheStack(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go outer(stop, done)
	defer func() { close(stop); <-done }()
	waitParked(t)
	const fn = "github.com/ratekit/ratekit/internal/leakcheck.outer"
	if err := Find(fn); err == nil {
		t.Fatal("Find ignoring outer by its top frame: nil, want the goroutine (parked is on top)")
	}
	if err := find(nil, []string{fn}); err != nil {
		t.Fatalf("find ignoring outer anywhere: %v", err)
	}
}

//go:noinline
func outer(stop, done chan struct{}) { parked(stop, done) }
