package pgengine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// statementLog is a pgx tracer that keeps the text of every statement a
// pool sends. It is safe for concurrent use.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	l.sql = append(l.sql, data.SQL)
	l.mu.Unlock()
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// pipelined starts the log's entry of a statement sent in a pipeline.
const pipelined = "pipelined "

// TraceBatchStart logs a pipeline, whose statements TraceBatchQuery logs
// as their results are read.
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	l.sql = append(l.sql, "pipeline")
	l.mu.Unlock()
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	l.mu.Lock()
	l.sql = append(l.sql, pipelined+data.SQL)
	l.mu.Unlock()
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// since returns what each statement after the first n of the log sends:
// "take" for a take statement, "function" for a call of a decision
// function, "batch" for a call of the batch function, "many" for one of a
// set-based take, "pipeline" for the start of a pipeline, whose statements
// follow prefixed with "pipelined ", and the text of any other.
func (l *statementLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var kinds []string
	for _, q := range l.sql[n:] {
		prefix := ""
		if strings.HasPrefix(q, pipelined) {
			prefix, q = pipelined, q[len(pipelined):]
		}
		switch {
		case q == "pipeline":
			kinds = append(kinds, q)
		case strings.Contains(q, ".take_many_"):
			kinds = append(kinds, prefix+"many")
		case strings.HasPrefix(q, "/* ratekit batch */"):
			kinds = append(kinds, prefix+"batch")
		case strings.HasPrefix(q, "WITH lock_clock AS"):
			kinds = append(kinds, prefix+"take")
		case strings.HasPrefix(q, "SELECT "):
			kinds = append(kinds, prefix+"function")
		case strings.HasPrefix(q, "DO $ratekit_migrate$"):
			kinds = append(kinds, "migrate")
		default:
			kinds = append(kinds, q[:min(len(q), 40)])
		}
	}
	return kinds
}

// texts returns the text of each entry after the first n of the log.
func (l *statementLog) texts(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sql[n:])
}

func (l *statementLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sql)
}

// TestTakeStatement: a lone take without an idempotency key goes in the
// counter's take statement, one statement, for a fresh key and a known one
// alike; a refused one then goes to the function, which decides it; any
// other decision goes to the function. Both give the same results, on
// every kind of table (unlogged, logged with and without synchronous
// commit, which the statement turns off as the function does).
func TestTakeStatement(t *testing.T) {
	var log statementLog
	pool := pgstoretest.TracedPool(t, pgstoretest.PostgresURL(t), 2, &log)
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range []ratekit.Algorithm{ratekit.TokenBucket, ratekit.FixedWindow} {
		for _, tc := range []struct {
			dur  pgengine.Durability
			sync bool
		}{{pgengine.Unlogged, false}, {pgengine.Logged, true}, {pgengine.Logged, false}} {
			t.Run(fmt.Sprintf("%v/%v/sync=%v", alg, tc.dur, tc.sync), func(t *testing.T) {
				c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 3, Window: pgengine.FarWindow,
					Durability: tc.dur, SynchronousCommit: tc.sync})
				if _, err := c.Peek(ctx, "k", 1); err != nil { // the schema is there
					t.Fatal(err)
				}
				// The same takes on two keys: without idempotency keys
				// (the take statement) and with (the function).
				for i, step := range []struct {
					cost      int64
					allowed   bool
					remaining int64
					sent      string
				}{
					{2, true, 1, "take"},
					{1, true, 0, "take"},
					{1, false, 0, "take function"},
				} {
					n := log.len()
					got, err := c.Take(ctx, "k", step.cost, "")
					if err != nil {
						t.Fatal(err)
					}
					if sent := strings.Join(log.since(n), " "); sent != step.sent {
						t.Errorf("take %d sent %q, want %q", i, sent, step.sent)
					}
					n = log.len()
					want, err := c.Take(ctx, "k-idem", step.cost, fmt.Sprint("idem-", i))
					if err != nil {
						t.Fatal(err)
					}
					if sent := strings.Join(log.since(n), " "); sent != "function" {
						t.Errorf("take %d with an idempotency key sent %q, want one function call", i, sent)
					}
					if got.Allowed != step.allowed || got.Remaining != step.remaining ||
						want.Allowed != step.allowed || want.Remaining != step.remaining {
						t.Fatalf("take %d of %d: %+v without an idempotency key, %+v with; want allowed %v, remaining %d",
							i, step.cost, got, want, step.allowed, step.remaining)
					}
					// The keys' takes were a few milliseconds apart.
					if d := got.ResetAfter - want.ResetAfter; d < -time.Second || d > time.Second ||
						(got.RetryAfter == 0) != (want.RetryAfter == 0) {
						t.Errorf("take %d: %+v without an idempotency key, %+v with", i, got, want)
					}
				}
				n := log.len()
				if _, err := c.Peek(ctx, "k", 1); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Refund(ctx, "k", 1, ""); err != nil {
					t.Fatal(err)
				}
				if sent := strings.Join(log.since(n), " "); sent != "function function" {
					t.Errorf("a peek and a refund sent %q, want two function calls", sent)
				}
			})
		}
	}
}

// TestTakeReadsTheClockAfterTheLock: a take that waits for the key's row
// lock reads the clock once it holds it. Another transaction holds the row
// while the take waits, then writes a state and commits; the take must
// decide and report as of a clock no earlier than that transaction's. A
// take that read its clock before it waited would report a reset later
// than the truth by the wait. It holds for the take statement and for the
// function (a take with an idempotency key).
func TestTakeReadsTheClockAfterTheLock(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	table := fmt.Sprintf(`"%s".counters_unlogged`, pgstoretest.Schema())
	const window = time.Hour
	for _, alg := range []ratekit.Algorithm{ratekit.TokenBucket, ratekit.FixedWindow} {
		for _, idem := range []string{"", "idem"} {
			t.Run(fmt.Sprintf("%v/idempotency key %q", alg, idem), func(t *testing.T) {
				prefix := pgstoretest.Prefix(t)
				c := newCounter(t, s, pgengine.CounterConfig{Prefix: prefix, Algorithm: alg, Quota: 2, Window: window, Durability: pgengine.Unlogged})
				if _, err := c.Take(ctx, "k", 1, ""); err != nil {
					t.Fatal(err)
				}
				tx := holdLock(ctx, t, pool, `SELECT 1 FROM `+table+` WHERE prefix = $1 AND key = $2 FOR UPDATE`, prefix, []byte("k"))
				type outcome struct {
					o   pgengine.Outcome
					err error
				}
				done := make(chan outcome, 1)
				go func() {
					o, err := c.Take(ctx, "k", 1, idem)
					done <- outcome{o, err}
				}()
				waitForLockWaiters(ctx, t, pool, 1)
				time.Sleep(100 * time.Millisecond)
				// The row as it is after nothing was taken, at the
				// transaction's clock.
				set := `tat_us = r.now_us`
				if alg == ratekit.FixedWindow {
					set = fmt.Sprintf(`window_start_us = r.now_us - r.now_us %% %d, count = 0`, window.Microseconds())
				}
				var nowUS, startUS int64
				if err := tx.QueryRow(ctx, `UPDATE `+table+` AS c SET `+set+`
FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us) AS r
WHERE c.prefix = $1 AND c.key = $2 RETURNING r.now_us, c.window_start_us`, prefix, []byte("k")).Scan(&nowUS, &startUS); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				got := <-done
				if got.err != nil {
					t.Fatal(got.err)
				}
				// The latest the reset can be: the take's clock is no
				// earlier than the transaction's.
				latest := window / 2 // one unit's emission interval
				if alg == ratekit.FixedWindow {
					latest = time.Duration(startUS+window.Microseconds()-nowUS) * time.Microsecond
				}
				if !got.o.Allowed || got.o.Remaining != 1 || got.o.ResetAfter > latest {
					t.Errorf("take after the wait = %+v, want allowed, remaining 1, reset at most %v", got.o, latest)
				}
			})
		}
	}
}

// TestTakeStatementOnFreshKeys: the first take of a key reports the state
// it left as of the clock it was decided on, even where a microsecond
// counts: a bucket that refills one unit a microsecond has quota − cost
// remaining and is full again after cost microseconds, and a window of a
// millisecond resets within it.
func TestTakeStatementOnFreshKeys(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	const quota = 1_000_000_000_000
	bucket := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.TokenBucket, Quota: quota,
		Window: quota * time.Microsecond, Durability: pgengine.Unlogged})
	window := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.FixedWindow, Quota: quota,
		Window: time.Millisecond, Durability: pgengine.Unlogged})
	for i := range 200 {
		key := fmt.Sprint("fresh-", i)
		o, err := bucket.Take(ctx, key, 3, "")
		if err != nil {
			t.Fatal(err)
		}
		if !o.Allowed || o.Remaining != quota-3 || o.ResetAfter != 3*time.Microsecond {
			t.Fatalf("bucket: first take of 3 = %+v, want allowed, %d remaining, reset after 3µs", o, int64(quota-3))
		}
		o, err = window.Take(ctx, key, 3, "")
		if err != nil {
			t.Fatal(err)
		}
		if !o.Allowed || o.Remaining != quota-3 || o.ResetAfter <= 0 || o.ResetAfter > time.Millisecond {
			t.Fatalf("window: first take of 3 = %+v, want allowed, %d remaining, reset within (0, 1ms]", o, int64(quota-3))
		}
	}
}

// TestTakeStatementUnderAFlood: while most of a counter's lone takes are
// refused, as in a flood, they go to the function alone rather than pay for
// the take statement first; once takes are admitted again, they go back to
// the take statement.
func TestTakeStatementUnderAFlood(t *testing.T) {
	var log statementLog
	pool := pgstoretest.TracedPool(t, pgstoretest.PostgresURL(t), 2, &log)
	s := newStore(t, pool)
	ctx := ctxT(t)
	c := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.FixedWindow, Quota: 1, Window: pgengine.FarWindow, Durability: pgengine.Unlogged})
	take := func(key string) (bool, string) {
		t.Helper()
		n := log.len()
		o, err := c.Take(ctx, key, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		return o.Allowed, strings.Join(log.since(n), " ")
	}
	if _, err := c.Peek(ctx, "flood", 1); err != nil { // the schema is there
		t.Fatal(err)
	}
	if ok, sent := take("flood"); !ok || sent != "take" {
		t.Fatalf("first take: allowed %v, sent %q; want allowed, one take statement", ok, sent)
	}
	var sends []string
	for range 20 {
		ok, sent := take("flood")
		if ok {
			t.Fatal("a take beyond the quota was admitted")
		}
		sends = append(sends, sent)
	}
	if sends[0] != "take function" || sends[len(sends)-1] != "function" {
		t.Fatalf("refused takes sent %q; want the take statement and the function at first, the function alone at last", sends)
	}
	for i := range 100 {
		ok, sent := take(fmt.Sprint("calm-", i))
		if !ok {
			t.Fatalf("first take of key calm-%d refused", i)
		}
		if sent == "take" {
			t.Logf("admitted takes went back to the take statement after %d", i)
			return
		}
	}
	t.Fatal("admitted takes never went back to the take statement")
}

// TestBatchOfTakesIsOnePipeline: decisions that queue behind a statement in
// flight go together in one round trip: as one call of the set-based take
// when all are takes of one counter that its take statement would decide;
// as a pipeline of take statements when each is such a take but of several
// counters; and as one call of the batch function when any is not (here, a
// take with an idempotency key). The set-based take gives a key without a
// row its first row in the same call. A take that the set-based take or its
// take statement refuses (its quota spent) has nothing written: the
// batch's refused takes then go to the function together in one more
// round trip, or alone. A pipeline with a counter
// that waits for its commit's flush never turns that off; one without
// turns it off as the counters ask.
func TestBatchOfTakesIsOnePipeline(t *testing.T) {
	log, s, admin, ctx := oneInFlight(t)
	prefix := pgstoretest.Prefix(t)
	// Quota 2 each; async and async2 do not wait for their commit's
	// flush, synced does. Each case has counters of its own, so that no
	// case's refusals steer the next one's takes to the function (see
	// refusedShareBound).
	type take struct {
		c         string // async, async2 or synced
		key, idem string
		allowed   bool
		remaining int64
		before    int // takes of the key before the batch
	}
	for i, tc := range []struct {
		name  string
		takes []take
		sent  []string
		// syncOff is whether the pipeline's statements turn off waiting
		// for the commit's flush.
		syncOff bool
	}{
		{"pipeline", []take{{c: "async", key: "a", allowed: true, remaining: 1}, {c: "async", key: "b", allowed: true, remaining: 1},
			{c: "synced", key: "c", allowed: true, remaining: 1}, {c: "async", key: "d", before: 2}},
			[]string{"pipeline", "pipelined take", "pipelined take", "pipelined take", "pipelined take", "function"}, false},
		{"async pipeline", []take{{c: "async", key: "a", allowed: true, remaining: 1}, {c: "async2", key: "b", allowed: true, remaining: 1}},
			[]string{"pipeline", "pipelined take", "pipelined take"}, true},
		{"set-based", []take{{c: "async", key: "a", allowed: true, before: 1}, {c: "async", key: "b", allowed: true, before: 1}},
			[]string{"many"}, true},
		{"set-based, one refused", []take{{c: "async", key: "a", allowed: true, before: 1}, {c: "async", key: "d", before: 2}},
			[]string{"many", "function"}, true},
		{"set-based, new keys", []take{{c: "async", key: "a", allowed: true, remaining: 1}, {c: "async", key: "b", allowed: true, remaining: 1}},
			[]string{"many", "function", "function"}, true}, // the take, then the peeks
		{"batch function", []take{{c: "async", key: "a", allowed: true, remaining: 1}, {c: "async", key: "b", idem: "i", allowed: true, remaining: 1},
			{c: "async", key: "d", before: 2}},
			[]string{"batch"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counters := map[string]*pgengine.Counter{}
			for name, alg := range map[string]ratekit.Algorithm{"async": ratekit.FixedWindow, "async2": ratekit.TokenBucket, "synced": ratekit.TokenBucket} {
				counters[name] = newCounter(t, s, pgengine.CounterConfig{Prefix: fmt.Sprint(prefix, "-", name, "-", i), Algorithm: alg,
					Quota: 2, Window: pgengine.FarWindow, Durability: pgengine.Logged, SynchronousCommit: name == "synced"})
			}
			key := func(k string) string { return tc.name + "-" + k }
			for _, tk := range tc.takes {
				for range tk.before {
					if _, err := counters[tk.c].Take(ctx, key(tk.key), 1, ""); err != nil {
						t.Fatal(err)
					}
				}
			}
			var n int
			var takes []func() (pgengine.Outcome, error)
			for _, tk := range tc.takes {
				takes = append(takes, func() (pgengine.Outcome, error) { return counters[tk.c].Take(ctx, key(tk.key), 1, tk.idem) })
			}
			got, errs := queueBehind(ctx, t, s, admin, counters["async"], key("held"), func() { n = log.len() }, takes...)
			for i, tk := range tc.takes {
				if errs[i] != nil {
					t.Fatalf("take of %s: %v", tk.key, errs[i])
				}
				if got[i].Allowed != tk.allowed || got[i].Remaining != tk.remaining || got[i].Allowed == (got[i].RetryAfter > 0) {
					t.Errorf("take of %s: %+v, want allowed %v, remaining %d", tk.key, got[i], tk.allowed, tk.remaining)
				}
				// Exactly what was admitted was counted.
				if p, err := counters[tk.c].Peek(ctx, key(tk.key), 1); err != nil || p.Remaining != tk.remaining {
					t.Errorf("peek of %s after the batch: %+v, %v; want remaining %d", tk.key, p, err, tk.remaining)
				}
			}
			sent := log.since(n) // the batch, then the peeks
			if sent = sent[:min(len(sent), len(tc.sent))]; !slices.Equal(sent, tc.sent) {
				t.Errorf("sent %q, want %q", sent, tc.sent)
			}
			for _, q := range log.texts(n) {
				if strings.HasPrefix(q, pipelined) && strings.Contains(q, "synchronous_commit") != tc.syncOff {
					t.Errorf("a pipelined take turns synchronous_commit off: %v, want %v", !tc.syncOff, tc.syncOff)
					break
				}
			}
		})
	}
}

// TestSetBasedTakeOnOneKey: takes of one counter on one key that queue
// together go as one call of the set-based take, which takes the key's
// total at once and reports each decision as if they had gone one after
// another: every remaining count from the last before the batch down to
// the last after it, once. When the total does not fit, nothing is written
// by that call and the batch function decides the takes one after another.
func TestSetBasedTakeOnOneKey(t *testing.T) {
	log, s, admin, ctx := oneInFlight(t)
	const queued = 4
	for _, tc := range []struct {
		alg      ratekit.Algorithm
		quota    int64
		admitted int // of the queued takes
		sent     []string
	}{
		{ratekit.FixedWindow, 10, queued, []string{"many"}},
		{ratekit.TokenBucket, 10, queued, []string{"many"}},
		{ratekit.FixedWindow, queued, queued - 1, []string{"many", "batch"}},
		{ratekit.TokenBucket, queued, queued - 1, []string{"many", "batch"}},
	} {
		t.Run(fmt.Sprint(tc.alg, "/", tc.quota), func(t *testing.T) {
			c := newCounter(t, s, pgengine.CounterConfig{Algorithm: tc.alg, Quota: tc.quota, Window: pgengine.FarWindow, Durability: pgengine.Logged})
			// The key's row exists, with one unit taken; a take on
			// another key holds the only place in flight while the
			// batch queues.
			if _, err := c.Take(ctx, "k", 1, ""); err != nil {
				t.Fatal(err)
			}
			var n int
			takes := make([]func() (pgengine.Outcome, error), queued)
			for i := range takes {
				takes[i] = func() (pgengine.Outcome, error) { return c.Take(ctx, "k", 1, "") }
			}
			got, errs := queueBehind(ctx, t, s, admin, c, "held", func() { n = log.len() }, takes...)
			var remaining []int64
			for i := range queued {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				if got[i].Allowed {
					remaining = append(remaining, got[i].Remaining)
				}
				if got[i].Allowed == (got[i].RetryAfter > 0) || got[i].ResetAfter <= 0 {
					t.Errorf("take %d: %+v: retry after and reset disagree with the outcome", i, got[i])
				}
			}
			slices.Sort(remaining)
			var want []int64
			for r := tc.quota - 1 - int64(tc.admitted); r < tc.quota-1; r++ {
				want = append(want, r)
			}
			if !slices.Equal(remaining, want) {
				t.Errorf("admitted takes left %v remaining, want %v", remaining, want)
			}
			if p, err := c.Peek(ctx, "k", 1); err != nil || p.Remaining != want[0] {
				t.Errorf("peek after the batch: %+v, %v; want remaining %d", p, err, want[0])
			}
			if sent := log.since(n); !slices.Equal(sent[:min(len(sent), len(tc.sent))], tc.sent) {
				t.Errorf("sent %q, want %q first", sent, tc.sent)
			}
		})
	}
}

// TestSetBasedTakePlanOutlivesASmallTable: the set-based take keeps its
// statements' plans for the session, planned at its first call. Made on an
// empty table, a plan that joined the keys to the table could read every
// row of the prefix at each call once the table has grown. The call reads
// no more index entries than it has keys, whatever the table held when it
// was planned.
func TestSetBasedTakePlanOutlivesASmallTable(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	schema := freshSchema(t)
	pool := pgstoretest.Pool(t, url, 1, "")
	admin := pgstoretest.Pool(t, url, 2, "")
	ctx := ctxT(t)
	s, err := pgengine.New(pool, pgengine.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, alg := range []string{"fixed_window", "token_bucket"} {
		prefix := "plan-" + alg
		call := `SELECT "` + schema + `".take_many_` + alg + `($1, $2, '{1}', '{1}', '{0}', 1000000, 1000, true)::text`
		take := func(key string) string {
			var out string
			if err := pool.QueryRow(ctx, call, prefix, [][]byte{[]byte(key)}).Scan(&out); err != nil {
				t.Fatal(err)
			}
			return out
		}
		// Planned on the empty table: the key has no row yet, and gets
		// one.
		if got := take("k-1"); !strings.HasPrefix(got, "{999999,0,") {
			t.Fatalf("%s on a missing row: %s, want admitted with 999999 remaining", alg, got)
		}
		if _, err := admin.Exec(ctx, `INSERT INTO "`+schema+`".counters (prefix, key, expires_at_us)
			SELECT $1, convert_to('k-' || g, 'UTF8'), 0 FROM generate_series(1, 20000) AS g
			ON CONFLICT DO NOTHING`, prefix); err != nil {
			t.Fatal(err)
		}
		read := func() int64 {
			var n int64
			if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
				t.Fatal(err)
			}
			if err := admin.QueryRow(ctx, `SELECT coalesce(sum(idx_tup_read), 0)::bigint + (SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables
				WHERE schemaname = $1 AND relname = 'counters') FROM pg_stat_user_indexes WHERE schemaname = $1 AND relname = 'counters'`, schema).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := read()
		if got := take("k-2"); got == "{-1,-1,-1}" {
			t.Fatalf("%s on an existing row refused it", alg)
		}
		if n := read() - before; n > 10 {
			t.Errorf("%s: one key's take read %d index entries or rows of a 20,000-row table", alg, n)
		}
		// A new key's insert was planned on the empty table too.
		before = read()
		if got := take("new-1"); !strings.HasPrefix(got, "{999999,0,") {
			t.Fatalf("%s on a new key of a 20,000-row table: %s, want admitted with 999999 remaining", alg, got)
		}
		if n := read() - before; n > 10 {
			t.Errorf("%s: a new key's take read %d index entries or rows of a 20,000-row table", alg, n)
		}
	}
}

// queueBehind takes c's key held once, then holds its row lock while a
// second take of it waits, so that the Store's one place in flight stays
// taken; it then calls started (a test's mark in its statement log) and
// runs the takes, each on a goroutine of its own, waits until all of them
// queue, lets the held take go, and returns the takes' outcomes and
// errors in order.
func queueBehind(ctx context.Context, t *testing.T, s *pgengine.Store, admin *pgxpool.Pool, c *pgengine.Counter, held string,
	started func(), takes ...func() (pgengine.Outcome, error)) ([]pgengine.Outcome, []error) {
	t.Helper()
	if _, err := c.Take(ctx, held, 1, ""); err != nil {
		t.Fatal(err)
	}
	tx := holdLock(ctx, t, admin, `SELECT 1 FROM "`+s.Schema()+`".counters WHERE prefix = $1 AND key = $2 FOR UPDATE`, c.Config().Prefix, []byte(held))
	blocked := make(chan error, 1)
	go func() {
		_, err := c.Take(ctx, held, 1, "")
		blocked <- err
	}()
	waitForLockWaiters(ctx, t, admin, 1)
	started()
	q0 := pgengine.Queued(s)
	got := make([]pgengine.Outcome, len(takes))
	errs := make([]error, len(takes))
	var wg sync.WaitGroup
	for i, take := range takes {
		wg.Go(func() { got[i], errs[i] = take() })
	}
	for pgengine.Queued(s) < q0+int64(len(takes)) {
		if ctx.Err() != nil {
			t.Fatal("the takes never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	return got, errs
}

// oneInFlight returns a migrated Store with one place in flight whose
// statements log records, a pool for other sessions, and t's context.
func oneInFlight(t *testing.T) (*statementLog, *pgengine.Store, *pgxpool.Pool, context.Context) {
	t.Helper()
	log := &statementLog{}
	url := pgstoretest.PostgresURL(t)
	s, err := pgengine.New(pgstoretest.TracedPool(t, url, 8, log), pgengine.Config{Schema: pgstoretest.Schema(), MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return log, s, pgstoretest.Pool(t, url, 2, ""), ctx
}

// TestSetBasedTakeWaitsBrieflyForANewKey: the set-based take inserts the
// row of a key that has none after locking the rows found, some of which
// may come after that key in the lock order. Another transaction inserting
// the same key meanwhile may be waiting for one of those rows, so the
// insert waits for it at most a few milliseconds: past that, the key is
// refused with nothing written, the other keys are decided, and the
// session's lock_timeout is as it was.
func TestSetBasedTakeWaitsBrieflyForANewKey(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	pool := pgstoretest.Pool(t, url, 2, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 10, Window: pgengine.FarWindow, Durability: pgengine.Unlogged})
			prefix := c.Config().Prefix
			if _, err := c.Take(ctx, "x", 1, ""); err != nil { // x has a row
				t.Fatal(err)
			}
			// Another transaction inserts k, which comes before x, and
			// stays open.
			other := holdLock(ctx, t, pool, `INSERT INTO "`+s.Schema()+`".counters_unlogged (prefix, key, expires_at_us) VALUES ($1, $2, 0)`, prefix, []byte("k"))

			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '7s'"); err != nil {
				t.Fatal(err)
			}
			call := `SELECT "` + s.Schema() + `".take_many_` + map[ratekit.Algorithm]string{ratekit.FixedWindow: "fixed_window", ratekit.TokenBucket: "token_bucket"}[alg] +
				`_unlogged($1, $2, '{1,1}', '{1,2}', '{0,0}', 10, $3, true)::text`
			span := pgengine.FarWindow.Microseconds()
			if alg == ratekit.TokenBucket {
				span /= 10
			}
			start := time.Now()
			var got, timeout string
			if err := tx.QueryRow(ctx, call, prefix, [][]byte{[]byte("k"), []byte("x")}, span).Scan(&got); err != nil {
				t.Fatal(err)
			}
			waited := time.Since(start)
			if err := tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&timeout); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(got, "{-1,-1,-1,8,0,") || waited > 2*time.Second || timeout != "7s" {
				t.Fatalf("set-based take of k (being inserted) and x: %s after %v, lock_timeout then %s; want k refused, x admitted with 8 remaining, at once, 7s", got, waited, timeout)
			}
			if err := other.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if o, err := c.Take(ctx, "k", 1, ""); err != nil || !o.Allowed || o.Remaining != 9 {
				t.Fatalf("k after the other transaction: %+v, %v; want its first unit taken", o, err)
			}
		})
	}
}
