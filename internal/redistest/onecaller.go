//go:build !js

package redistest

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchOneCaller runs decide b.N times from one goroutine, one call after
// the other, as a function instance serving one request at a time decides,
// on a context with a deadline a minute away (an invocation's). Beside the
// time and allocations per call it reports the CPU time the process spent
// per call, user and system, on every thread ("cpu-ns/op": a goroutine
// hand-off shows there even when the machine is too busy for ns/op to
// show it), and its read and write system calls per call ("reads/op",
// "writes/op", from /proc/self/io, on Linux only): a call that costs one
// round trip on its caller's goroutine makes one write and one or two
// reads (the second when the first came before the reply and the
// goroutine waited in the network poller). An error fails b.
func BenchOneCaller(b *testing.B, decide func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 100 { // dials, loads scripts, warms the pool
		if err := decide(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	r0, w0, ok := IOCalls()
	c0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		if err := decide(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
	if r1, w1, ok1 := IOCalls(); ok && ok1 {
		b.ReportMetric(float64(r1-r0)/float64(b.N), "reads/op")
		b.ReportMetric(float64(w1-w0)/float64(b.N), "writes/op")
	}
}

// IOCalls returns the read and write system calls the process has made
// (syscr and syscw of /proc/self/io, which count every read and write,
// those that found no data included), and false where the file is
// missing.
func IOCalls() (reads, writes int64, ok bool) {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, 0, false
	}
	var found int
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, value, _ := bytes.Cut(sc.Bytes(), []byte(": "))
		n, err := strconv.ParseInt(string(value), 10, 64)
		if err != nil {
			continue
		}
		switch string(name) {
		case "syscr":
			reads, found = n, found+1
		case "syscw":
			writes, found = n, found+1
		}
	}
	return reads, writes, found == 2
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
