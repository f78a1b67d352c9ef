package pgengine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// TestBatchRefusedAsAWhole: a decision the server refuses fails its batch's
// statement, nothing of the batch is applied, and every caller is told to
// send its own decision alone.
func TestBatchRefusedAsAWhole(t *testing.T) {
	for _, simple := range []bool{false, true} {
		s, _, ctx := migratedStore(t, 2, simple)
		c, err := s.Counter(CounterConfig{Prefix: pgstoretest.Prefix(t), Algorithm: ratekit.FixedWindow, Quota: 10, Window: farWindow, CleanupProbability: -1, Durability: Unlogged})
		if err != nil {
			t.Fatal(err)
		}
		good := &waiter{ctx: ctx, d: &decision{c: c, op: opTake, key: "a", cost: 1, idem: []byte("tx")}}
		// Cost 0 passes no validation in Go; the function refuses it.
		bad := &waiter{ctx: ctx, d: &decision{c: c, op: opTake, key: "b", cost: 0}}
		s.co.send([]*waiter{good, bad}, time.Time{}, false)
		for _, w := range []*waiter{good, bad} {
			if !w.alone || w.err != nil {
				t.Fatalf("simple %v: waiter %q: alone %v, err %v; want alone", simple, w.d.key, w.alone, w.err)
			}
		}
		_, err = s.sendBatch(ctx, []*decision{good.d, bad.d})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
			t.Fatalf("simple %v: batch error %v, want 22023", simple, err)
		}
		r, err := c.Peek(ctx, "a", 1)
		if err != nil || r.Remaining != 10 {
			t.Fatalf("simple %v: after the refused batch: %+v, %v; want nothing taken", simple, r, err)
		}
		// Alone, the good decision is applied once, the bad one refused.
		if r, err := c.Take(ctx, "a", 1, "x"); err != nil || !r.Allowed || r.Remaining != 9 || r.Duplicate {
			t.Fatalf("simple %v: alone: %+v, %v", simple, r, err)
		}
	}
}

func TestRolledBack(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "22023"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "42883"}, true},
		{&pgconn.PgError{Code: "P0001"}, true},
		{&pgconn.PgError{Code: "57014"}, true},
		{&pgconn.PgError{Code: "57P01"}, false}, // admin shutdown: the commit may have happened
		{&pgconn.PgError{Code: "08P01"}, false}, // PgBouncer: server conn crashed?
		{&pgconn.PgError{Code: "XX000"}, false},
		{&pgconn.PgError{Code: ""}, false},
		{errors.New("connection reset"), false},
		{context.DeadlineExceeded, false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := rolledBack(tt.err); got != tt.want {
			t.Errorf("rolledBack(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestBatchFunctionRefusesBadArrays: the batch function refuses arrays of
// different lengths, empty ones, a function number it does not know and
// policy counts that do not match the function or the composite arrays,
// rather than calling a decision function with missing arguments.
func TestBatchFunctionRefusesBadArrays(t *testing.T) {
	s, pool, ctx := migratedStore(t, 1, false)
	key := [][]byte{[]byte("k")}
	tests := []struct {
		name  string
		fn    []int32
		keys  [][]byte
		parts []int32
		code  string
	}{
		{"shorter key array", []int32{0, 0}, key, []int32{0, 0}, "22023"},
		{"empty arrays", []int32{}, [][]byte{}, []int32{}, "22023"},
		{"unknown function", []int32{99}, key, []int32{0}, "20000"},
		{"composite without policies", []int32{compositeIndex(Unlogged)}, key, []int32{0}, "22023"},
		{"policies missing from the composite arrays", []int32{compositeIndex(Unlogged)}, key, []int32{2}, "22023"},
		{"single-key call with policies", []int32{functionIndex(Unlogged, "fixed_window")}, key, []int32{1}, "22023"},
	}
	for _, tt := range tests {
		n := len(tt.fn)
		ints := func(v int64) []int64 {
			a := make([]int64, n)
			for i := range a {
				a[i] = v
			}
			return a
		}
		prefixes := make([]string, n)
		for i := range prefixes {
			prefixes[i] = "p"
		}
		var raw []byte
		err := pool.QueryRow(ctx, s.batchSQL, s.mode, tt.fn, ints(opTake), prefixes, tt.keys, ints(1), ints(10),
			ints(int64(time.Hour/time.Microsecond)), ints(0), make([][]byte, n), ints(1), ints(0), make([]bool, n),
			tt.parts, []int64{}, []string{}, [][]byte{}, []int64{}, []int64{}, []int64{}, []int64{}, []int64{}, []int64{}).Scan(&raw)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tt.code {
			t.Errorf("%s: result %s, error %v; want SQLSTATE %s", tt.name, raw, err, tt.code)
		}
	}
}

// migratedStore returns a Store on the test schema, migrated, with its pool
// of conns connections, and a context that ends with the test.
func migratedStore(t *testing.T, conns int32, simple bool) (*Store, *pgxpool.Pool, context.Context) {
	t.Helper()
	return migratedStoreWith(t, conns, Config{SimpleProtocol: simple})
}

// migratedStoreWith is migratedStore with cfg (its Schema set here).
func migratedStoreWith(t *testing.T, conns int32, cfg Config) (*Store, *pgxpool.Pool, context.Context) {
	t.Helper()
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), conns, "")
	cfg.Schema = pgstoretest.Schema()
	s, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s, pool, ctx
}

// TestCoalesceRule: 8 callers' decisions on distinct keys go alone, side
// by side, while fewer than MaxInFlight statements are in flight and the
// pool has a connection for each; decisions on one hot key, beyond
// MaxInFlight (by default 2) or beyond the pool's connections, queue and go
// in batches. The coalescer's counters show which.
func TestCoalesceRule(t *testing.T) {
	tests := []struct {
		name        string
		conns       int32
		maxInFlight int
		hot         bool
		batched     bool
	}{
		{"distinct keys, MaxInFlight 8", 8, 8, false, false},
		{"distinct keys, no coalescing", 8, -1, false, false},
		{"distinct keys, default MaxInFlight", 8, 0, false, true},
		{"hot key", 8, 8, true, true},
		{"pool exhausted", 2, 8, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, ctx := migratedStoreWith(t, tt.conns, Config{MaxInFlight: tt.maxInFlight})
			c, err := s.Counter(CounterConfig{Prefix: pgstoretest.Prefix(t), Algorithm: ratekit.FixedWindow, Quota: 1 << 40, Window: farWindow, CleanupProbability: -1, Durability: Unlogged})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprintf("caller-%d", g)
					if tt.hot {
						key = "hot"
					}
					for range 40 {
						if _, err := c.Take(ctx, key, 1, ""); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			queued, batches := s.co.queued.Load(), s.co.batches.Load()
			if (queued > 0) != tt.batched || (batches > 0) != tt.batched {
				t.Fatalf("%d decisions queued, %d batches; want batches %v", queued, batches, tt.batched)
			}
			if tt.hot {
				if r, err := c.Peek(ctx, "hot", 1); err != nil || r.Remaining != 1<<40-320 {
					t.Fatalf("hot key after 320 takes: %+v, %v", r, err)
				}
			}
		})
	}
}

// TestNoLoneDecisionBesideABatch: while a batch is in flight, a decision
// queues for the next batch even when a place is free and no statement
// holds its key, so that under load the places carry batches rather than
// one decision each; the batch's end hands its place to it. With no batch
// in flight the same decision goes alone.
func TestNoLoneDecisionBesideABatch(t *testing.T) {
	s, _, ctx := migratedStore(t, 4, false)
	c, err := s.Counter(CounterConfig{Prefix: pgstoretest.Prefix(t), Algorithm: ratekit.FixedWindow, Quota: 10, Window: farWindow, CleanupProbability: -1, Durability: Unlogged})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Take(ctx, "alone", 1, ""); err != nil || s.co.queued.Load() != 0 {
		t.Fatalf("with nothing in flight: %v, %d queued; want alone", err, s.co.queued.Load())
	}

	// A batch in flight on other keys, one place of two free.
	s.co.mu.Lock()
	s.co.inflight, s.co.batching = 1, 1
	s.co.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := c.Take(ctx, "beside", 1, "")
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s.co.queued.Load() == 0 {
		select {
		case err := <-done:
			t.Fatalf("the decision went alone beside a batch (err %v)", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the decision neither went nor queued")
		}
		time.Sleep(time.Millisecond)
	}
	s.co.release(nil, true) // the batch ends: its place goes to the queued decision
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.co.mu.Lock()
	inflight, batching, queue := s.co.inflight, s.co.batching, len(s.co.queue)
	s.co.mu.Unlock()
	if inflight != 0 || batching != 0 || queue != 0 {
		t.Fatalf("after the batches: %d in flight, %d batches, %d queued; want none", inflight, batching, queue)
	}
	if r, err := c.Peek(ctx, "beside", 1); err != nil || r.Remaining != 9 {
		t.Fatalf("the queued decision: %+v, %v; want one unit taken", r, err)
	}
}

// TestInOrder: a batch keeps the decisions that lock their rows in the lock
// order (key, then prefix) when sent one after another, and leaves out a
// composite whose rows would be locked out of it; a leader that would be
// left out goes alone.
func TestInOrder(t *testing.T) {
	m := &Composite{durability: Unlogged, prefixes: []string{"a", "b"}}
	single := func(prefix, key string) *waiter {
		return &waiter{d: &decision{c: &Counter{cfg: CounterConfig{Prefix: prefix, Durability: Unlogged}}, key: key}}
	}
	composite := func(k0, k1 string) *waiter {
		return &waiter{d: &decision{m: m, key: k0, keys: [][]byte{[]byte(k0), []byte(k1)}}}
	}
	logged := &waiter{d: &decision{c: &Counter{cfg: CounterConfig{Prefix: "a", Durability: Logged}}, key: "k0"}}
	tests := []struct {
		name  string
		batch []*waiter // the leader first
		want  []int     // indexes in batch of the decisions kept, in lock order
	}{
		{"composites on distinct keys", []*waiter{composite("k2", "k2"), composite("k1", "k1"), single("b", "k1")}, []int{1, 2, 0}},
		{"composites on one key", []*waiter{composite("k", "k"), composite("k", "k"), single("a", "k")}, []int{0, 1, 2}},
		// (a, k1) and (b, k3) held, (a, k2) would come before (b, k3).
		{"parts on two keys", []*waiter{single("a", "k0"), composite("k1", "k3"), single("a", "k2")}, []int{0, 1}},
		{"parts on two keys, in order", []*waiter{single("a", "k0"), composite("k1", "k2"), single("a", "k3")}, []int{0, 1, 2}},
		{"leader out of order", []*waiter{single("a", "k2"), composite("k1", "k3"), single("a", "k4")}, []int{0}},
		{"tables apart", []*waiter{logged, composite("k3", "k1"), single("a", "k2")}, []int{1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			batch := slices.Clone(tt.batch)
			slices.SortStableFunc(batch, func(x, y *waiter) int { return lockOrder(x.d, y.d) })
			got := inOrder(batch, tt.batch[0])
			want := make([]*waiter, len(tt.want))
			for i, j := range tt.want {
				want[i] = tt.batch[j]
			}
			if !slices.Equal(got, want) {
				idx := func(ws []*waiter) []int {
					var r []int
					for _, w := range ws {
						r = append(r, slices.Index(tt.batch, w))
					}
					return r
				}
				t.Fatalf("kept %v, want %v", idx(got), tt.want)
			}
		})
	}
}
