package pgengine

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultMaxInFlight is the bound on a Store's decisions in flight used when
// [Config.MaxInFlight] is zero. Beyond it, decisions queue and go to
// PostgreSQL together, one statement for the whole queue. Two keeps a
// lone caller and a pair of callers from waiting for each other, and lets
// batches form from the third concurrent caller on, where one statement
// and one commit for many decisions beat one each (benchmarks/README.md
// has the measurements). A server with many cores can use more places in
// flight: raise it towards their number.
const DefaultMaxInFlight = 2

// maxBatch bounds the decisions of one statement, so that its arrays stay
// small whatever the queue holds; the rest wait for the next one.
const maxBatch = 256

// minShare is the fewest decisions a batch takes from the queue when as
// many wait; a larger queue is shared among the places in flight.
const minShare = 8

// batchMarker starts the text of every statement that carries more than one
// decision, so that a query tracer can tell them apart.
const batchMarker = "/* ratekit batch */ "

// A decision is one call of a decision function, with its arguments fixed
// before it is sent or queued.
type decision struct {
	c       *Counter
	op      int64
	key     string
	cost    int64
	idem    []byte // nil for none
	lock    int64
	cleanup int64
}

// A rowID names a key's row: its table and primary key.
type rowID struct {
	durability  Durability
	prefix, key string
}

func (d *decision) row() rowID { return rowID{d.c.cfg.Durability, d.c.cfg.Prefix, d.key} }

// coalescer sends a Store's decisions. A decision that finds fewer than max
// decisions in flight goes at once, alone, on its caller's goroutine and
// context, as it would without coalescing. A decision that finds max in
// flight joins a queue. When a decision in flight ends, its caller hands its
// place to one queued caller (the leader), which takes the queue and sends it
// as one statement on its own goroutine; when that ends, it hands its place
// on in turn. No goroutine is started: decisions are sent only by goroutines
// of callers that wait for them.
//
// The statement calls the schema's batch function, which calls the same
// decision functions as a lone decision, one after another in (durability,
// prefix, key, idempotency key) order, in one implicit transaction: one round
// trip, one commit. Every transaction that takes more than one key's locks
// takes them in that order, so two batches cannot deadlock over keys; a
// decision still sees every earlier one, in its batch or committed before,
// as it would alone.
type coalescer struct {
	store *Store
	max   int // decisions in flight at most; 0 turns coalescing off

	mu       sync.Mutex
	inflight int       // guarded by mu
	queue    []*waiter // guarded by mu

	batches atomic.Int64 // statements that carried more than one decision
}

const (
	stateQueued = iota // in the queue
	stateLeader        // given a place in flight, to send the queue
	stateTaken         // in a batch that a leader sends
)

// A waiter is a queued decision. ready receives one value when the waiter
// becomes the leader or when its result (out, err, alone) is set; state is
// guarded by the coalescer's mu.
type waiter struct {
	ctx   context.Context
	d     *decision
	state int
	ready chan struct{}

	out   [5]int64
	err   error
	alone bool // the batch was rolled back as a whole: send d alone
}

// do decides d and returns the function's result. When ctx ends first, do
// returns ctx.Err() at once; a decision still in the queue then is never
// sent.
func (co *coalescer) do(ctx context.Context, d *decision) ([5]int64, error) {
	if co.max == 0 {
		return co.store.sendOne(ctx, d)
	}
	co.mu.Lock()
	if co.inflight < co.max {
		co.inflight++
		co.mu.Unlock()
		out, err := co.store.sendOne(ctx, d)
		co.release()
		return out, err
	}
	w := &waiter{ctx: ctx, d: d, ready: make(chan struct{}, 1)}
	co.queue = append(co.queue, w)
	co.mu.Unlock()
	select {
	case <-w.ready:
	case <-ctx.Done():
		co.mu.Lock()
		switch w.state {
		case stateQueued:
			co.queue = slices.DeleteFunc(co.queue, func(q *waiter) bool { return q == w })
			co.mu.Unlock()
		case stateLeader:
			// Chosen to lead while leaving: pass the place on.
			co.mu.Unlock()
			co.release()
		default:
			// Taken into a batch: it may be applied, and nobody reads
			// its result.
			co.mu.Unlock()
		}
		return [5]int64{}, ctx.Err()
	}
	if w.state == stateLeader { // set before ready was signalled
		co.lead(w)
	}
	if w.alone {
		return co.store.sendOne(ctx, d)
	}
	return w.out, w.err
}

// release ends a decision in flight: its place goes to a queued caller, the
// one with the latest deadline (no deadline counts as latest), which then
// sends the queue.
func (co *coalescer) release() {
	co.mu.Lock()
	best := -1
	var bestDL time.Time
	for i, q := range co.queue {
		if q.ctx.Err() != nil {
			continue
		}
		dl, ok := q.ctx.Deadline()
		if !ok {
			best = i
			break
		}
		if best < 0 || dl.After(bestDL) {
			best, bestDL = i, dl
		}
	}
	if best < 0 && len(co.queue) > 0 {
		best = 0 // all gone: the first passes the place on
	}
	if best < 0 {
		co.inflight--
		co.mu.Unlock()
		return
	}
	w := co.queue[best]
	co.queue = slices.Delete(co.queue, best, best+1)
	w.state = stateLeader
	co.mu.Unlock()
	w.ready <- struct{}{}
}

// lead sends, on the leader's goroutine, the leader's decision with every
// queued one whose deadline is not after the leader's (all of them when the
// leader has none), then releases the leader's place. The round trip ends at
// the leader's deadline, the latest of the batch, or when every caller in
// the batch has stopped waiting; each caller in it returns at its own
// deadline meanwhile.
func (co *coalescer) lead(w *waiter) {
	dl, bounded := w.ctx.Deadline()
	batch := []*waiter{w}
	// At most one decision per key with an idempotency key: a key's
	// idempotency records are then written by one decision of the batch,
	// under its key's lock, as by a lone decision.
	var idem map[rowID]bool
	if w.d.idem != nil {
		idem = map[rowID]bool{w.d.row(): true}
	}
	co.mu.Lock()
	// A fair share of the queue, so that every place in flight carries a
	// batch of about the same size: a whole queue in one statement would
	// run its decisions one after another in one server process while the
	// other places send lone decisions, and make that batch's callers the
	// slowest by far.
	most := min(maxBatch, max(minShare, 1+(len(co.queue)+co.max-1)/co.max))
	keep := co.queue[:0]
	for _, q := range co.queue {
		qdl, ok := q.ctx.Deadline()
		fits := len(batch) < most && (!bounded || (ok && !qdl.After(dl)))
		if fits && q.d.idem != nil {
			if idem == nil {
				idem = map[rowID]bool{}
			}
			r := q.d.row()
			fits = !idem[r]
			idem[r] = true
		}
		if fits {
			q.state = stateTaken
			batch = append(batch, q)
		} else {
			keep = append(keep, q)
		}
	}
	clear(co.queue[len(keep):])
	co.queue = keep
	co.mu.Unlock()

	live := batch[:0]
	for _, q := range batch {
		if q.ctx.Err() == nil {
			live = append(live, q)
		} else if q == w {
			w.err = w.ctx.Err()
		}
	}
	if len(live) > 0 {
		co.send(live, dl, bounded)
	}
	for _, q := range live {
		if q != w {
			q.ready <- struct{}{}
		}
	}
	co.release()
}

// send decides the decisions of live in one round trip and stores each
// result in its waiter.
func (co *coalescer) send(live []*waiter, dl time.Time, bounded bool) {
	base := context.WithoutCancel(live[0].ctx)
	if bounded {
		var cancel context.CancelFunc
		base, cancel = context.WithDeadline(base, dl)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(base)
	defer cancel()
	var gone atomic.Int32
	for _, q := range live {
		stop := context.AfterFunc(q.ctx, func() {
			if gone.Add(1) == int32(len(live)) {
				cancel()
			}
		})
		defer stop()
	}
	if len(live) == 1 {
		live[0].out, live[0].err = co.store.sendOne(ctx, live[0].d)
		return
	}
	ds := make([]*decision, len(live))
	for i, q := range live {
		ds[i] = q.d
	}
	outs, err := co.store.sendBatch(ctx, ds)
	co.batches.Add(1)
	refused := rolledBack(err) && base.Err() == nil
	for i, q := range live {
		switch {
		case err == nil:
			q.out = outs[i]
		case refused:
			// The server refused the statement: its implicit
			// transaction rolled back and none of its decisions was
			// applied. Each caller sends its own again, alone, so that
			// one decision's failure is not the others'.
			q.alone = true
		default:
			q.err = err
		}
	}
}

// rolledBack reports whether err is an error response from PostgreSQL that
// ends a statement before its implicit transaction commits: bad data or
// arguments (class 22), constraint violations (23), serialization failures
// and deadlocks (40), undefined objects (42), errors raised by a function
// (P0), lock and object state (55) and a cancelled statement (57014). Other
// errors, including connection errors that a pooler reports as error
// responses (class 08) after the server may have committed, do not tell.
func rolledBack(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "40", "42", "P0", "55":
		return true
	}
	return pgErr.Code == "57014"
}

// lockOrder compares x and y in the order a batch decides them, the lock
// order: durability (table), prefix, key (a decision touches its
// idempotency records only while it holds its key's lock), then decisions
// with an idempotency key before those without.
func lockOrder(x, y *decision) int {
	if c := cmp.Compare(x.c.cfg.Durability, y.c.cfg.Durability); c != 0 {
		return c
	}
	if c := cmp.Compare(x.c.cfg.Prefix, y.c.cfg.Prefix); c != 0 {
		return c
	}
	if c := cmp.Compare(x.key, y.key); c != 0 {
		return c
	}
	if (x.idem == nil) != (y.idem == nil) {
		if x.idem == nil {
			return 1
		}
		return -1
	}
	return bytes.Compare(x.idem, y.idem)
}

// sendBatch decides ds in one statement and returns their results in the
// order of ds. Errors are the statement's: when it fails, no result is
// valid.
func (s *Store) sendBatch(ctx context.Context, ds []*decision) ([][5]int64, error) {
	order := make([]int, len(ds))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return lockOrder(ds[a], ds[b]) })
	// One commit for the batch: it waits for its flush unless no decision
	// in it asks for that.
	syncAll := false
	for _, d := range ds {
		if d.c.cfg.Durability == Logged && d.c.cfg.SynchronousCommit {
			syncAll = true
		}
	}
	n := len(ds)
	a := batchArgs{}
	a.grow(n + 1)
	var cleaners []*decision
	for _, i := range order {
		d := ds[i]
		c := d.c
		a.add(c, d.op, d.key, d.cost, d.lock, d.idem, 0, c.keepSyncCommit || syncAll)
		if d.cleanup > 0 && !slices.ContainsFunc(cleaners, func(e *decision) bool { return e.c == c }) {
			cleaners = append(cleaners, d)
		}
	}
	// Inline cleanup runs last, as a peek that takes no lock of its own: it
	// skips locked rows, so it never waits while the batch holds locks.
	for _, d := range cleaners {
		a.add(d.c, opPeek, d.key, 1, 0, nil, d.cleanup, true)
	}
	raw, err := s.query(ctx, s.batchSQL, s.mode,
		a.fn, a.op, a.prefix, a.key, a.cost, a.quota, a.window, a.lock, a.idem, a.ttl, a.cleanup, a.sync)
	if err != nil {
		return nil, wrapErr(ctx, "batch", err)
	}
	all, ok := parseBatchResult(raw, len(a.fn))
	if !ok {
		return nil, wrapErr(ctx, "batch", errors.New("unexpected batch result (schema version mismatch?)"))
	}
	outs := make([][5]int64, n)
	for j, i := range order {
		outs[i] = all[j]
	}
	return outs, nil
}

// batchArgs are the batch statement's array arguments, one element per
// function call.
type batchArgs struct {
	fn                                          []int32
	op, cost, quota, window, lock, ttl, cleanup []int64
	prefix                                      []string
	key, idem                                   [][]byte
	sync                                        []bool
}

func (a *batchArgs) grow(n int) {
	a.fn = make([]int32, 0, n)
	a.op, a.cost, a.quota, a.window = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	a.lock, a.ttl, a.cleanup = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	a.prefix, a.key, a.idem, a.sync = make([]string, 0, n), make([][]byte, 0, n), make([][]byte, 0, n), make([]bool, 0, n)
}

func (a *batchArgs) add(c *Counter, op int64, key string, cost, lock int64, idem []byte, cleanup int64, sync bool) {
	a.fn = append(a.fn, functionIndex(c.cfg.Durability, algName(c.cfg.Algorithm)))
	a.op = append(a.op, op)
	a.prefix = append(a.prefix, c.cfg.Prefix)
	a.key = append(a.key, []byte(key))
	a.cost = append(a.cost, cost)
	a.quota = append(a.quota, c.quota)
	a.window = append(a.window, c.windowUS)
	a.lock = append(a.lock, lock)
	a.idem = append(a.idem, idem)
	a.ttl = append(a.ttl, c.ttlUS)
	a.cleanup = append(a.cleanup, cleanup)
	a.sync = append(a.sync, sync)
}

// batchSQL returns the statement that calls the schema's batch function:
// element i of the array arguments is one decision, and the result is the
// decisions' results as one two-dimensional array in text form, in the same
// order.
func batchSQL(quoted string) string {
	return batchMarker + "SELECT " + quoted + ".batch($1::int[], $2::bigint[], $3::text[], $4::bytea[], $5::bigint[], " +
		"$6::bigint[], $7::bigint[], $8::bigint[], $9::bytea[], $10::bigint[], $11::bigint[], $12::boolean[])::text"
}

// parseBatchResult parses the text form of n decision results as a
// two-dimensional bigint array, "{{1,4,0,123,0},{0,0,5,6,0}}".
func parseBatchResult(raw []byte, n int) ([][5]int64, bool) {
	if n < 1 || len(raw) < 4 || raw[0] != '{' || raw[len(raw)-1] != '}' {
		return nil, false
	}
	rest := raw[1 : len(raw)-1]
	outs := make([][5]int64, n)
	for i := range outs {
		end := bytes.IndexByte(rest, '}')
		if end < 0 || !parseResult(rest[:end+1], &outs[i]) {
			return nil, false
		}
		rest = rest[end+1:]
		if i < n-1 {
			if len(rest) == 0 || rest[0] != ',' {
				return nil, false
			}
			rest = rest[1:]
		}
	}
	return outs, len(rest) == 0
}
