// Package storetest is the conformance suite for [kvstore.Store]
// implementations. Every store in ratekit runs it; run it against a store of
// your own:
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) kvstore.Store {
//			s := mystore.New(...) // a fresh, empty namespace per call
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// The suite checks the [kvstore.Store] contract (round trips, overwrites,
// deletes, time to live, context errors, opaque keys) and, when the store
// implements [kvstore.Atomic], the refill rule of [kvstore.Refill.Apply]
// against the store's own clock (in the steps of a [kvstore.ClockStepper]),
// that refused takes and peeks write nothing, that a full bucket leaves no
// key behind,
// and that 64 concurrent workers taking one unit at a time from a value of
// 100 get exactly 100. For a [kvstore.MultiAtomic] it checks all-or-nothing
// updates of several keys, and for a [kvstore.PeriodCounter] period
// counters decided with buckets, on the store's clock: the period picked,
// counts of earlier and later periods, quotas that change between calls,
// clock skew, invalid bounds and 64 racing workers admitted exactly to the
// quota. It uses the store's real clock and sleeps for tens of
// milliseconds in the time-to-live tests; the whole suite takes about a
// second.
package storetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// Run runs the conformance suite as subtests of t. newStore is called once
// per subtest and must return a store whose keys are not shared with any
// other call (a fresh instance or a fresh key prefix).
func Run(t *testing.T, newStore func(t *testing.T) kvstore.Store) {
	t.Run("GetMissing", func(t *testing.T) { testGetMissing(t, newStore(t)) })
	t.Run("SetGet", func(t *testing.T) { testSetGet(t, newStore(t)) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, newStore(t)) })
	t.Run("TTL", func(t *testing.T) { testTTL(t, newStore(t)) })
	t.Run("InvalidTTL", func(t *testing.T) { testInvalidTTL(t, newStore(t)) })
	t.Run("CanceledContext", func(t *testing.T) { testCanceled(t, newStore(t)) })
	t.Run("OpaqueKeys", func(t *testing.T) { testOpaqueKeys(t, newStore(t)) })

	t.Run("Atomic", func(t *testing.T) {
		if _, ok := newStore(t).(kvstore.Atomic); !ok {
			t.Skip("storetest: store does not implement kvstore.Atomic")
		}
		atomicStore := func(t *testing.T) kvstore.Atomic { return newStore(t).(kvstore.Atomic) }
		t.Run("TakePeekRefund", func(t *testing.T) { testTakePeekRefund(t, atomicStore(t)) })
		t.Run("InvalidArguments", func(t *testing.T) { testInvalidArguments(t, atomicStore(t)) })
		t.Run("Refill", func(t *testing.T) { testRefill(t, atomicStore(t)) })
		t.Run("ExpiresWhenFull", func(t *testing.T) { testExpiresWhenFull(t, atomicStore(t)) })
		t.Run("ConcurrentTakes", func(t *testing.T) { testConcurrentTakes(t, atomicStore(t)) })
	})

	// The multi-key checks run for stores that offer them: a check that
	// skipped for the others would read as a gap in CI.
	if _, ok := newStore(t).(kvstore.MultiAtomic); ok {
		t.Run("MultiAtomic", func(t *testing.T) { runMulti(t, newStore) })
	}
	if p, ok := newStore(t).(kvstore.PeriodCounter); ok && p.CountsPeriods() {
		t.Run("PeriodCounter", func(t *testing.T) { runPeriods(t, newStore) })
	}
}

// ctx returns a context for a whole conformance test: its deadline only
// stops a hung store, and is not under test, so it is patient enough for a
// busy machine (ConcurrentTakes missed 5s under load).
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustGet(t *testing.T, s kvstore.Store, key string) (kvstore.Record, bool) {
	t.Helper()
	rec, ok, err := s.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return rec, ok
}

func mustSet(t *testing.T, s kvstore.Store, key string, rec kvstore.Record, ttl time.Duration) {
	t.Helper()
	if err := s.Set(ctx(t), key, rec, ttl); err != nil {
		t.Fatalf("Set(%q): %v", key, err)
	}
}

func testGetMissing(t *testing.T, s kvstore.Store) {
	if rec, ok := mustGet(t, s, "missing"); ok {
		t.Fatalf("Get(missing) = %+v, true; want false", rec)
	}
}

func testSetGet(t *testing.T, s kvstore.Store) {
	for _, want := range []kvstore.Record{
		{Value: 0, Time: 0},
		{Value: 42, Time: time.Now().UnixMicro()},
		{Value: kvstore.MaxValue, Time: 1<<62 + 1},
		{Value: -7, Time: -1},
	} {
		mustSet(t, s, "k", want, time.Minute)
		if got, ok := mustGet(t, s, "k"); !ok || got != want {
			t.Fatalf("after Set(%+v): Get = %+v, %v", want, got, ok)
		}
	}
}

func testDelete(t *testing.T, s kvstore.Store) {
	mustSet(t, s, "k", kvstore.Record{Value: 1, Time: 2}, time.Minute)
	mustSet(t, s, "other", kvstore.Record{Value: 3, Time: 4}, time.Minute)
	for i := 0; i < 2; i++ { // the second Delete removes a missing key
		if err := s.Delete(ctx(t), "k"); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if rec, ok := mustGet(t, s, "k"); ok {
		t.Fatalf("Get after Delete = %+v, true", rec)
	}
	if rec, ok := mustGet(t, s, "other"); !ok || rec != (kvstore.Record{Value: 3, Time: 4}) {
		t.Fatalf("Delete(k) changed another key: %+v, %v", rec, ok)
	}
}

func testTTL(t *testing.T, s kvstore.Store) {
	rec := kvstore.Record{Value: 1, Time: 1}
	// Generous times: under a loaded CI machine a goroutine can stall for
	// tens of milliseconds between two calls.
	mustSet(t, s, "short", rec, 300*time.Millisecond)
	mustSet(t, s, "long", rec, time.Minute)
	mustSet(t, s, "tiny", rec, time.Nanosecond) // rounded up to 1ms
	if _, ok := mustGet(t, s, "short"); !ok {
		t.Fatal("record missing before its ttl")
	}
	time.Sleep(700 * time.Millisecond)
	for key, want := range map[string]bool{"short": false, "tiny": false, "long": true} {
		if _, ok := mustGet(t, s, key); ok != want {
			t.Errorf("Get(%s) 700ms after Set: present %v, want %v", key, ok, want)
		}
	}
}

func testInvalidTTL(t *testing.T, s kvstore.Store) {
	for _, ttl := range []time.Duration{0, -time.Second} {
		if err := s.Set(ctx(t), "k", kvstore.Record{}, ttl); !errors.Is(err, kvstore.ErrInvalidTTL) {
			t.Errorf("Set with ttl %v: error %v, want kvstore.ErrInvalidTTL", ttl, err)
		}
	}
}

func testCanceled(t *testing.T, s kvstore.Store) {
	c, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Get(c, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Get with canceled context: %v, want context.Canceled", err)
	}
	if err := s.Set(c, "k", kvstore.Record{}, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("Set with canceled context: %v, want context.Canceled", err)
	}
	if err := s.Delete(c, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Delete with canceled context: %v, want context.Canceled", err)
	}
	if a, ok := s.(kvstore.Atomic); ok {
		_, err := a.Update(c, "k", kvstore.Refill{Burst: 10, Rate: 1}, kvstore.OpTake, 1)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Update with canceled context: %v, want context.Canceled", err)
		}
	}
}

func testOpaqueKeys(t *testing.T, s kvstore.Store) {
	keys := []string{"a", "A", "a ", "{a}", "a}", "{", "}{", "x\x00y", "x\x00z", "ключ", "a:b", strings.Repeat("k", 512)}
	for i, k := range keys {
		mustSet(t, s, k, kvstore.Record{Value: int64(i), Time: int64(i)}, time.Minute)
	}
	for i, k := range keys {
		if rec, ok := mustGet(t, s, k); !ok || rec.Value != int64(i) {
			t.Errorf("key %q: Get = %+v, %v; want value %d", k, rec, ok, i)
		}
	}
}

// present reports whether the store holds anything under key: a record, or
// one that Get cannot read (an Atomic store may keep Update's records in a
// form of its own).
func present(t *testing.T, s kvstore.Store, key string) bool {
	t.Helper()
	_, ok, err := s.Get(ctx(t), key)
	if errors.Is(err, kvstore.ErrMalformedRecord) {
		return true
	}
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return ok
}

func update(t *testing.T, s kvstore.Atomic, key string, r kvstore.Refill, op kvstore.Op, n int64) kvstore.OpResult {
	t.Helper()
	res, err := s.Update(ctx(t), key, r, op, n)
	if err != nil {
		t.Fatalf("Update(%q, %+v, op %d, %d): %v", key, r, op, n, err)
	}
	return res
}

// slow refills one token of 1e9 units every 1e9 microseconds (about 17
// minutes): nothing a test can notice refills, yet every number is in range.
const unit = 1_000_000_000

var slow = kvstore.Refill{Burst: 10 * unit, Rate: 1}

// near reports whether got is want plus at most the refill of the test's
// duration (under a second, so under 1e6 units).
func near(got, want int64) bool { return got >= want && got-want < 1_000_000 }

func testTakePeekRefund(t *testing.T, s kvstore.Atomic) {
	if res := update(t, s, "b", slow, kvstore.OpPeek, 10*unit); !res.OK || res.Remaining != 10*unit {
		t.Fatalf("Peek of an absent key = %+v; want OK, full", res)
	}
	if present(t, s, "b") {
		t.Fatal("Peek wrote a record")
	}
	if res := update(t, s, "b", slow, kvstore.OpTake, 3*unit); !res.OK || !near(res.Remaining, 7*unit) {
		t.Fatalf("Take 3 of 10 = %+v; want OK, 7", res)
	}
	if !present(t, s, "b") {
		t.Fatal("no record after a take")
	}
	if res := update(t, s, "b", slow, kvstore.OpTake, 8*unit); res.OK || !near(res.Remaining, 7*unit) {
		t.Fatalf("Take 8 of 7 = %+v; want refused, 7", res)
	}
	if res := update(t, s, "b", slow, kvstore.OpPeek, 8*unit); res.OK || !near(res.Remaining, 7*unit) {
		t.Fatalf("Peek 8 of 7 = %+v; want not OK, 7", res)
	}
	// A refused take and a peek took nothing: all 7 are still there.
	if res := update(t, s, "b", slow, kvstore.OpTake, 7*unit); !res.OK || !near(res.Remaining, 0) {
		t.Fatalf("Take 7 of 7 = %+v; want OK, 0", res)
	}
	if res := update(t, s, "b", slow, kvstore.OpRefund, 2*unit); !res.OK || !near(res.Remaining, 2*unit) {
		t.Fatalf("Refund 2 to 0 = %+v; want 2", res)
	}
	if res := update(t, s, "b", slow, kvstore.OpRefund, 100*unit); !res.OK || res.Remaining != 10*unit {
		t.Fatalf("Refund 100 to 2 = %+v; want capped at 10", res)
	}
	if present(t, s, "b") {
		t.Fatal("a record is left after refunding to full")
	}
}

func testInvalidArguments(t *testing.T, s kvstore.Atomic) {
	for _, tc := range []struct {
		r    kvstore.Refill
		op   kvstore.Op
		n    int64
		want error
	}{
		{kvstore.Refill{Burst: 0, Rate: 1}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{kvstore.Refill{Burst: kvstore.MaxValue + 1, Rate: 1}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{kvstore.Refill{Burst: 10, Rate: 0}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{kvstore.Refill{Burst: 10, Rate: 11}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{slow, kvstore.OpTake, 0, kvstore.ErrInvalidOp},
		{slow, kvstore.OpTake, slow.Burst + 1, kvstore.ErrInvalidOp},
		{slow, kvstore.OpPeek, -1, kvstore.ErrInvalidOp},
		{slow, kvstore.OpRefund, 0, kvstore.ErrInvalidOp},
		{slow, kvstore.Op(0), 1, kvstore.ErrInvalidOp},
		{slow, kvstore.Op(99), 1, kvstore.ErrInvalidOp},
	} {
		if _, err := s.Update(ctx(t), "k", tc.r, tc.op, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("Update(%+v, op %d, %d): error %v, want %v", tc.r, tc.op, tc.n, err, tc.want)
		}
	}
	if present(t, s, "k") {
		t.Error("an invalid Update wrote a record")
	}
}

func testRefill(t *testing.T, s kvstore.Atomic) {
	// One unit per microsecond: the refilled amount is the elapsed time on
	// the store's clock, which lies between the bounds measured here.
	r := kvstore.Refill{Burst: 10_000_000, Rate: 1}
	start := time.Now()
	update(t, s, "k", r, kvstore.OpTake, r.Burst)
	afterTake := time.Now()
	time.Sleep(20 * time.Millisecond)
	beforePeek := time.Now()
	res := update(t, s, "k", r, kvstore.OpPeek, 1)
	end := time.Now()
	lo, hi := beforePeek.Sub(afterTake).Microseconds(), end.Sub(start).Microseconds()+1
	if cs, ok := s.(kvstore.ClockStepper); ok {
		// The store's clock moves in steps: the take and the peek each
		// read the start of their step, which shifts the refill by up to
		// one step either way.
		step := cs.ClockStep().Microseconds()
		lo, hi = lo-step, hi+step
	}
	if res.Remaining < lo || res.Remaining > hi {
		t.Fatalf("refilled %d units in about 20ms at 1 unit/µs; want between %d and %d", res.Remaining, lo, hi)
	}
	// A long pause refills to exactly Burst, never beyond.
	r2 := kvstore.Refill{Burst: 5000, Rate: 1000} // full in 5µs
	update(t, s, "k2", r2, kvstore.OpTake, 5000)
	time.Sleep(time.Millisecond)
	if res := update(t, s, "k2", r2, kvstore.OpPeek, 1); res.Remaining != 5000 {
		t.Fatalf("value after a long pause = %d; want max 5000", res.Remaining)
	}
}

func testExpiresWhenFull(t *testing.T, s kvstore.Atomic) {
	r := kvstore.Refill{Burst: 300_000, Rate: 1} // full 300ms after a take
	update(t, s, "k", r, kvstore.OpTake, r.Burst)
	if !present(t, s, "k") {
		t.Fatal("no record after a take")
	}
	time.Sleep(700 * time.Millisecond)
	if present(t, s, "k") {
		t.Fatal("a record is still present after its time to full")
	}
}

func testConcurrentTakes(t *testing.T, s kvstore.Atomic) {
	const workers, perWorker = 64, 50
	r := kvstore.Refill{Burst: 100 * unit, Rate: 1}
	// 3,200 updates on one key: a store that serialises them (dynalite, a
	// single Node process) on a loaded machine needs more than ctx's 5s.
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				res, err := s.Update(c, "hot", r, kvstore.OpTake, unit)
				if err != nil {
					errs <- err
					return
				}
				if res.OK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := admitted.Load(); got != 100 {
		t.Fatalf("%d workers × %d takes of 1 from 100: %d admitted, want exactly 100", workers, perWorker, got)
	}
}
