//go:build !js

package redistest

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// BenchOneCaller runs decide b.N times from one goroutine, one call after
// the other, as a function instance serving one request at a time decides,
// on a context with a deadline a minute away (an invocation's). Beside the
// time and allocations per call it reports the CPU time the process spent
// per call, user and system, on every thread, where the system has
// getrusage ("cpu-ns/op": a goroutine hand-off shows there even when the
// machine is too busy for ns/op to show it), and its read and write
// system calls per call ("reads/op",
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
	c0, cok := cpuTime()
	b.ResetTimer()
	for range b.N {
		if err := decide(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if c1, cok1 := cpuTime(); cok && cok1 {
		b.ReportMetric(float64(c1-c0)/float64(b.N), "cpu-ns/op")
	}
	if r1, w1, ok1 := IOCalls(); ok && ok1 {
		b.ReportMetric(float64(r1-r0)/float64(b.N), "reads/op")
		b.ReportMetric(float64(w1-w0)/float64(b.N), "writes/op")
	}
}

// BenchOneCallerAllow runs BenchOneCaller on a tokenbucket decision in
// Atomic mode on s, a limit far above what b.N takes.
func BenchOneCallerAllow(b *testing.B, s kvstore.Store) {
	l, err := tokenbucket.New(tokenbucket.Config{Name: "onecaller", Burst: 1e9, RefillRate: tokenbucket.Rate{Tokens: 1e9, Per: time.Minute}, Mode: tokenbucket.Atomic, Store: s})
	if err != nil {
		b.Fatal(err)
	}
	BenchOneCaller(b, func(ctx context.Context) error {
		_, err := l.Allow(ctx, ratekit.Request{Key: "allow", Cost: 1})
		return err
	})
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

// CheckOneCallerAllocs checks what a lone caller's decisions on s allocate
// beside bare, a bare command through the same client, which measures what
// the client allocates for one round trip: s.Update at most as much as
// bare (the store and the engine add nothing), a tokenbucket decision in
// Atomic mode at most one allocation more (the limiter's store key, which
// a store may keep), and a tokenbucket.Planned decision of a burst and a
// monthly quota at most as much as a tokenbucket.Composite of the same two
// policies (its period bounds' text included). Each is averaged over 200
// decisions after a warm-up, each bound with a slack of AllocSlack.
func CheckOneCallerAllocs(t *testing.T, s kvstore.MultiAtomic, bare func(context.Context) error) {
	t.Helper()
	const slack = AllocSlack
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	planned, composite := plannedAndComposite(t, s, "allocs")
	single, err := tokenbucket.New(tokenbucket.Config{Name: "allocs", Burst: 1e9, RefillRate: tokenbucket.Rate{Tokens: 1e9, Per: time.Minute}, Mode: tokenbucket.Atomic, Store: s})
	if err != nil {
		t.Fatal(err)
	}
	allow := func(l ratekit.Limiter) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := l.Allow(ctx, ratekit.Request{Key: "allocs-key", Cost: 1})
			return err
		}
	}
	r := kvstore.Refill{Burst: 1e12, Rate: 1e6}
	allocs := func(f func(context.Context) error) float64 {
		t.Helper()
		for range 20 {
			if err := f(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return testing.AllocsPerRun(200, func() {
			if err := f(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	floor := allocs(bare)
	update := allocs(func(ctx context.Context) error {
		_, err := s.Update(ctx, "allocs-update", r, kvstore.OpTake, 1)
		return err
	})
	decision := allocs(allow(single))
	p, c := allocs(allow(planned)), allocs(allow(composite))
	t.Logf("allocations per call: bare command %v, Update %v, Allow %v, Planned %v, Composite %v", floor, update, decision, p, c)
	if update > floor+slack {
		t.Errorf("Update allocates %v times, the bare command %v", update, floor)
	}
	if decision > floor+1+slack {
		t.Errorf("a tokenbucket decision allocates %v times, the bare command %v", decision, floor)
	}
	if p > c+slack {
		t.Errorf("a Planned decision allocates %v times, a Composite of the same policies %v", p, c)
	}
}
