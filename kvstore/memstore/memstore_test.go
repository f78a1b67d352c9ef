package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/fakeclock"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/storetest"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) kvstore.Store {
		s, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// clock is the shared fake clock.
type clock = fakeclock.Clock

func newClock() *clock { return fakeclock.New(time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)) }

func newStore(t *testing.T, cfg memstore.Config) *memstore.Store {
	t.Helper()
	s, err := memstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewInvalid(t *testing.T) {
	if _, err := memstore.New(memstore.Config{MaxKeys: -1}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("New(MaxKeys -1): %v, want ratekit.ErrInvalidConfig", err)
	}
}

func TestLazyExpiryOnInjectedClock(t *testing.T) {
	c := newClock()
	s := newStore(t, memstore.Config{Now: c.Now})
	ctx := context.Background()
	if err := s.Set(ctx, "k", kvstore.Record{Value: 1}, time.Second); err != nil {
		t.Fatal(err)
	}
	c.Add(999 * time.Millisecond)
	if _, ok, _ := s.Get(ctx, "k"); !ok {
		t.Fatal("record gone 1ms before its ttl")
	}
	c.Add(time.Millisecond)
	if _, ok, _ := s.Get(ctx, "k"); ok {
		t.Fatal("record present at its ttl")
	}
	// The expired entry stays for the write that follows to reuse.
	if n := s.Len(); n != 1 {
		t.Fatalf("Len after a Get found the record expired = %d, want 1 (kept for reuse)", n)
	}
	if err := s.Set(ctx, "k", kvstore.Record{Value: 2}, time.Second); err != nil {
		t.Fatal(err)
	}
	if rec, ok, _ := s.Get(ctx, "k"); !ok || rec.Value != 2 {
		t.Fatalf("Get after Set on the expired key = %+v, %v; want value 2", rec, ok)
	}
	if n := s.Len(); n != 1 {
		t.Fatalf("Len after Set on the expired key = %d, want 1", n)
	}
}

func TestUpdateUsesStoreClock(t *testing.T) {
	c := newClock()
	s := newStore(t, memstore.Config{Now: c.Now})
	ctx := context.Background()
	r := kvstore.Refill{Burst: 10_000, Rate: 10} // full 1ms after empty
	res, err := s.Update(ctx, "k", r, kvstore.OpTake, 10_000)
	if err != nil || !res.OK || res.Remaining != 0 {
		t.Fatalf("Take all = %+v, %v", res, err)
	}
	rec, ok, _ := s.Get(ctx, "k")
	if !ok || rec != (kvstore.Record{Value: 0, Time: c.Now().UnixMicro()}) {
		t.Fatalf("record = %+v, %v; want value 0 at the injected time", rec, ok)
	}
	c.Add(250 * time.Microsecond)
	if res, _ := s.Update(ctx, "k", r, kvstore.OpPeek, 1); res.Remaining != 2500 {
		t.Fatalf("after 250µs at 10 units/µs: %d units, want 2500", res.Remaining)
	}
	c.Add(750*time.Microsecond - time.Nanosecond)
	if _, ok, _ := s.Get(ctx, "k"); !ok {
		t.Fatal("record expired before the bucket was full")
	}
	c.Add(time.Nanosecond)
	if _, ok, _ := s.Get(ctx, "k"); ok {
		t.Fatal("record present once the bucket is full")
	}
	// The clock steps back: nothing refills, the take still works.
	s.Update(ctx, "b", r, kvstore.OpTake, 10_000)
	c.Add(-time.Hour)
	if res, _ := s.Update(ctx, "b", r, kvstore.OpPeek, 1); res.OK || res.Remaining != 0 {
		t.Fatalf("after the clock stepped back an hour: %+v, want 0 units", res)
	}
}

func TestBoundAndEviction(t *testing.T) {
	c := newClock()
	for _, maxKeys := range []int{1, 3, 64, 100, 1000} {
		t.Run(strconv.Itoa(maxKeys), func(t *testing.T) {
			s := newStore(t, memstore.Config{MaxKeys: maxKeys, Now: c.Now})
			for i := 0; i < 10*maxKeys+100; i++ {
				if err := s.Set(context.Background(), fmt.Sprint("k", i), kvstore.Record{}, time.Hour); err != nil {
					t.Fatal(err)
				}
				if n := s.Len(); n > maxKeys {
					t.Fatalf("after %d inserts Len = %d > MaxKeys %d", i+1, n, maxKeys)
				}
			}
		})
	}
}

func TestNewKeyEvictsWhenFull(t *testing.T) {
	c := newClock()
	ctx := context.Background()
	s := newStore(t, memstore.Config{MaxKeys: 1, Now: c.Now})
	s.Set(ctx, "a", kvstore.Record{Value: 1}, time.Hour)
	s.Set(ctx, "a", kvstore.Record{Value: 2}, time.Hour) // an overwrite evicts nothing
	if rec, ok, _ := s.Get(ctx, "a"); !ok || rec.Value != 2 {
		t.Fatalf("overwrite in a full store: %+v, %v", rec, ok)
	}
	s.Set(ctx, "b", kvstore.Record{Value: 3}, time.Hour)
	if _, ok, _ := s.Get(ctx, "a"); ok {
		t.Fatal("MaxKeys 1 holds two keys")
	}
	if rec, ok, _ := s.Get(ctx, "b"); !ok || rec.Value != 3 {
		t.Fatalf("new key in a full store: %+v, %v", rec, ok)
	}
}

func TestConcurrentMixedUse(t *testing.T) {
	s := newStore(t, memstore.Config{MaxKeys: 50})
	ctx := context.Background()
	r := kvstore.Refill{Burst: 1000, Rate: 1}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				k := strconv.Itoa((w*7 + i) % 120)
				switch i % 4 {
				case 0:
					s.Set(ctx, k, kvstore.Record{Value: int64(i)}, time.Minute)
				case 1:
					s.Get(ctx, k)
				case 2:
					s.Update(ctx, k, r, kvstore.OpTake, 1)
				default:
					s.Delete(ctx, k)
				}
			}
		}()
	}
	wg.Wait()
	if n := s.Len(); n > 50 {
		t.Fatalf("Len = %d > MaxKeys 50", n)
	}
}

func BenchmarkUpdate(b *testing.B) {
	s, _ := memstore.New(memstore.Config{})
	r := kvstore.Refill{Burst: 1 << 40, Rate: 1}
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.Update(ctx, "k", r, kvstore.OpTake, 1)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.Update(ctx, "k", r, kvstore.OpTake, 1)
			}
		})
	})
}

// TestSystemClock checks the default clock (wall clock at New advanced by the
// monotonic clock): an update stamps the record with the current Unix time in
// microseconds, and a later update stamps a later time. A clock in the wrong
// unit, without its wall-clock base or running backwards fails one of the
// checks.
func TestSystemClock(t *testing.T) {
	t.Parallel()
	s := newStore(t, memstore.Config{})
	ctx := context.Background()
	r := kvstore.Refill{Burst: 1 << 40, Rate: 1}
	var prev int64
	for i := range 3 {
		before := time.Now().UnixMicro()
		if _, err := s.Update(ctx, "k", r, kvstore.OpTake, 1<<30); err != nil {
			t.Fatal(err)
		}
		after := time.Now().UnixMicro()
		rec, ok, err := s.Get(ctx, "k")
		if err != nil || !ok {
			t.Fatalf("Get: %v, %v", ok, err)
		}
		// The monotonic and the wall clock may part by NTP slewing only:
		// far less than 10ms over a test.
		if rec.Time < before-10_000 || rec.Time > after+10_000 {
			t.Fatalf("update %d stamped %d, want between %d and %d", i, rec.Time, before, after)
		}
		if rec.Time <= prev {
			t.Fatalf("update %d stamped %d, not after the previous %d", i, rec.Time, prev)
		}
		prev = rec.Time
		time.Sleep(2 * time.Millisecond)
	}
}

// TestUpdateExpiredEntry checks what Update leaves behind when it finds a
// record past its time to live: a take writes a fresh record from a full
// bucket into the key (one key held, the new level and time), and a peek
// removes the key. Reading the expired record as live, or keeping it after
// the peek, fails a check.
func TestUpdateExpiredEntry(t *testing.T) {
	t.Parallel()
	c := newClock()
	s := newStore(t, memstore.Config{Now: c.Now})
	ctx := context.Background()
	r := kvstore.Refill{Burst: 100, Rate: 1} // full 100µs after empty
	for _, k := range []string{"take", "peek"} {
		if _, err := s.Update(ctx, k, r, kvstore.OpTake, 100); err != nil {
			t.Fatal(err)
		}
	}
	c.Add(time.Second)
	res, err := s.Update(ctx, "take", r, kvstore.OpTake, 30)
	if err != nil || !res.OK || res.Remaining != 70 {
		t.Fatalf("take on an expired record = %+v, %v; want OK at 70 (from full)", res, err)
	}
	rec, ok, _ := s.Get(ctx, "take")
	if !ok || rec != (kvstore.Record{Value: 70, Time: c.Now().UnixMicro()}) {
		t.Fatalf("record = %+v, %v; want 70 at now", rec, ok)
	}
	if res, _ := s.Update(ctx, "peek", r, kvstore.OpPeek, 1); !res.OK || res.Remaining != 100 {
		t.Fatalf("peek on an expired record = %+v; want full", res)
	}
	if n := s.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1 (the peeked expired key removed)", n)
	}
}

func TestScopeConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) kvstore.Store {
		return newStore(t, memstore.Config{}).Prefixed("limiter:")
	})
}

// TestScopes checks that a prefix always gives the same scope, that scopes
// and the store's own keys are separate key spaces, and that they share the
// store's bound.
func TestScopes(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, memstore.Config{MaxKeys: 4})
	a, b := s.Prefixed("a:"), s.Prefixed("b:")
	if s.Prefixed("a:") != a || a == b {
		t.Fatal("Prefixed does not give one scope per prefix")
	}
	if s.Prefixed("") != &s.Scope {
		t.Fatal(`Prefixed("") is not the store's own key space`)
	}
	if err := a.Set(ctx, "k", kvstore.Record{Value: 1}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if rec, ok, err := a.Get(ctx, "k"); err != nil || !ok || rec.Value != 1 {
		t.Fatalf("a.Get(k) = %+v, %v, %v; want value 1", rec, ok, err)
	}
	for name, kv := range map[string]kvstore.Store{"b": b, "store": s} {
		for _, k := range []string{"k", "a:k"} {
			if _, ok, err := kv.Get(ctx, k); err != nil || ok {
				t.Fatalf("%s.Get(%q) = %v, %v: a key of scope a leaked", name, k, ok, err)
			}
		}
	}
	r := kvstore.Refill{Burst: 10, Rate: 1}
	if res, err := b.(kvstore.Atomic).Update(ctx, "k", r, kvstore.OpTake, 3); err != nil || !res.OK || res.Remaining != 7 {
		t.Fatalf("b.Update(k) = %+v, %v; want a fresh bucket at 7", res, err)
	}
	for i := range 8 {
		if err := b.Set(ctx, strconv.Itoa(i), kvstore.Record{}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// Each of the four shards holds at most one key; which shards the ten
	// keys fall into depends on the hash seed, so only the bound is sure.
	if n := s.Len(); n < 1 || n > 4 {
		t.Fatalf("Len = %d after 10 keys in two scopes of a store bounded at 4", n)
	}
}

// BenchmarkUpdateChurn measures the insert and eviction path: every update
// is to a key the store does not hold, in a store bounded at 1,000 keys.
func BenchmarkUpdateChurn(b *testing.B) {
	s, _ := memstore.New(memstore.Config{MaxKeys: 1000})
	r := kvstore.Refill{Burst: 1 << 40, Rate: 1}
	ctx := context.Background()
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Update(ctx, keys[i%len(keys)], r, kvstore.OpTake, 1)
		i++
	}
}

// TestTakeIsUpdateWithOpTake runs the same takes through Take on one key
// and through Update with OpTake on another, in lock step on an injected
// clock, and through both on scopes: the results, the records left behind
// and the errors (an invalid refill, a cost out of range, a done context)
// agree.
func TestTakeIsUpdateWithOpTake(t *testing.T) {
	c := newClock()
	s := newStore(t, memstore.Config{Now: c.Now})
	ctx := context.Background()
	done, cancel := context.WithCancel(ctx)
	cancel()
	r := kvstore.Refill{Burst: 1000, Rate: 3}
	steps := []struct {
		ctx     context.Context
		r       kvstore.Refill
		n       int64
		advance time.Duration
	}{
		{ctx, r, 400, 0}, {ctx, r, 400, 0}, {ctx, r, 400, 0}, // the third is refused
		{ctx, r, 1, 10 * time.Microsecond}, {ctx, r, 1000, 0}, {ctx, r, 200, time.Millisecond},
		{ctx, r, 0, 0}, {ctx, r, 1001, 0}, {ctx, kvstore.Refill{Burst: 10, Rate: 20}, 1, 0},
		{done, r, 1, 0}, {ctx, r, 5, -time.Second}, {ctx, r, 1, time.Hour}, // full: the record goes
	}
	for _, scope := range []kvstore.Atomic{s, s.Prefixed("p:").(kvstore.Atomic)} {
		take := scope.(interface {
			Take(context.Context, string, kvstore.Refill, int64) (bool, int64, error)
		})
		for i, st := range steps {
			c.Add(st.advance)
			want, wantErr := scope.Update(st.ctx, "update", st.r, kvstore.OpTake, st.n)
			ok, remaining, err := take.Take(st.ctx, "take", st.r, st.n)
			if ok != want.OK || remaining != want.Remaining || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("step %d: Take = %v, %d, %v; Update = %+v, %v", i, ok, remaining, err, want, wantErr)
			}
			if errors.Is(err, context.Canceled) != errors.Is(wantErr, context.Canceled) {
				t.Fatalf("step %d: Take's error %v, Update's %v", i, err, wantErr)
			}
			recU, okU, _ := scope.Get(ctx, "update")
			recT, okT, _ := scope.Get(ctx, "take")
			if recU != recT || okU != okT {
				t.Fatalf("step %d: Take left %+v, %v; Update %+v, %v", i, recT, okT, recU, okU)
			}
		}
	}
}
