package pgengine

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultMaxInFlight is the bound on a Store's statements in flight used
// when [Config.MaxInFlight] is zero (and the pool is larger). Below it, a
// decision on keys that no statement in flight holds goes at once, alone,
// on its caller's connection while no decision waits and no batch is in
// flight, so one or two callers never wait for each other. Beyond it,
// decisions queue and go to
// PostgreSQL together, where one statement and one commit for many
// decisions cost the server less than one each: with prepared statements
// that wins over a statement per decision from the third caller on, even
// on distinct keys whose commits group commit would share
// (docs/postgres.md states the rule and the measurements).
const DefaultMaxInFlight = 2

// keyInFlight is how many statements in flight may hold one key before a
// decision on it queues. With one, a hot key's decisions go in batches, each
// carrying what arrived while the statement before held the key's lock
// until its commit: a second statement on the key would only wait for that
// lock in the server, with fewer decisions.
const keyInFlight = 1

// batchesInFlight bounds the batches in flight: while decisions wait, the
// places of statements that end go to at most this many batches, so that
// under load the queue goes in a few large batches, each one round trip and
// one commit, rather than in many small ones.
const batchesInFlight = 2

// maxBatch bounds the decisions of one statement, so that its arrays stay
// small whatever the queue holds; the rest wait for the next one.
const maxBatch = 256

// minShare is the fewest decisions a batch takes from the queue when as
// many wait; a larger queue is shared among the places in flight.
const minShare = 8

// maxPipeline bounds the decisions sendTakes sends as a pipeline of take
// statements: a larger batch goes as one call of the batch function, whose
// one statement costs the client less than many (with 64 callers on 2
// cores, pipelines of 30 made fewer decisions a second than the function).
// docs/postgres.md has the measurements.
const maxPipeline = 16

// batchMarker starts the text of every statement that carries more than one
// decision, so that a query tracer can tell them apart.
const batchMarker = "/* ratekit batch */ "

// A decision is one call of a decision function, with its arguments fixed
// before it is sent or queued: a single-key decision of a Counter (c set)
// or a composite's (m set).
type decision struct {
	c       *Counter
	m       *Composite
	op      int64
	key     string
	cost    int64  // single-key only
	idem    []byte // nil for none
	lock    int64  // single-key only
	cleanup int64
	// refused is set once a take statement refused the take (writing
	// nothing): the function decides it afresh. A decision in a batch
	// is never refused before the batch is sent: a refused take goes
	// alone.
	refused bool

	// A composite's arguments, one element per counter (four of bounds).
	keys                 [][]byte
	costs, locks, bounds []int64
}

// A result is a decision function's result: five integers for a
// single-key decision, 1 + 6 × its counters for a composite's.
type result struct {
	one  [5]int64
	many []int64
	// refused is set when a take statement or the set-based take refused
	// the decision, writing nothing: it has no result yet.
	refused bool
}

// A rowID names a key's row: its table and primary key.
type rowID struct {
	durability  Durability
	prefix, key string
}

func (d *decision) durability() Durability {
	if d.m != nil {
		return d.m.durability
	}
	return d.c.cfg.Durability
}

// row is the row whose lock guards the decision's idempotency records.
func (d *decision) row() rowID {
	if d.m != nil {
		return rowID{d.m.durability, d.m.idemPrefix, d.key}
	}
	return rowID{d.c.cfg.Durability, d.c.cfg.Prefix, d.key}
}

// rows calls fn with the prefix and key of each row (or sliding-log lock)
// the decision locks.
func (d *decision) rows(fn func(prefix string, key []byte)) {
	if d.m == nil {
		fn(d.c.cfg.Prefix, []byte(d.key))
		return
	}
	for i, p := range d.m.prefixes {
		fn(p, d.keys[i])
	}
}

// firstRow returns the first row the decision locks in the lock order (see
// lockOrder).
func (d *decision) firstRow() (key []byte, prefix string) {
	if d.m == nil {
		return []byte(d.key), d.c.cfg.Prefix
	}
	key, prefix = d.keys[0], d.m.prefixes[0]
	for i, p := range d.m.prefixes[1:] {
		if k := d.keys[i+1]; rowLess(k, p, key, prefix) {
			key, prefix = k, p
		}
	}
	return key, prefix
}

// rowLess reports whether row (k1, p1) comes before (k2, p2) in the lock
// order of one table: by key, then prefix, in byte order.
func rowLess(k1 []byte, p1 string, k2 []byte, p2 string) bool {
	if c := bytes.Compare(k1, k2); c != 0 {
		return c < 0
	}
	return p1 < p2
}

// coalescer sends a Store's decisions. A decision goes at once, alone, on
// its caller's goroutine and context, as it would without coalescing, when
// fewer than max statements are in flight, none of them is a batch, fewer
// than keyInFlight of them hold any of its keys, and no decision waits.
// Otherwise it joins a queue. A batch in flight means the Store is under
// load: a decision sent beside it would take a place, a round trip and a
// commit for itself alone, while the next batch carries it with the others
// for one statement and one commit.
// When a statement in flight ends, decisions wait and fewer than
// batchesInFlight batches are in flight, its caller hands its place to one
// queued caller (the leader), which takes a share of the queue and sends it
// in one round trip on its own goroutine; when that ends, it wakes the
// batch's callers and lets them run before it hands its place on in turn,
// so that the decisions they make next join the following batch. No
// goroutine is started: decisions are sent only by goroutines of callers
// that wait for them.
//
// A batch of plain takes of one counter goes as one call of the counter's
// set-based take (see Store.sendMany), which locks the batch's keys in the
// lock order and takes each key's total at once; other batches go as the
// take statements a lone decision would send, in a pipeline (see
// Store.sendTakes), or as one statement that calls the schema's batch
// function, which calls the same decision functions as a lone decision one
// after another in the lock order (durability, key, prefix, idempotency
// key). Each is one implicit transaction: one round trip, one commit. The
// takes that the set-based take or a take statement refused, writing
// nothing, go on together to the batch function in one more round trip.
// Every transaction that takes more than one key's locks takes them in
// that order, so two batches cannot deadlock over keys; a decision still sees every earlier one, in its batch
// or committed before, as it would alone. A composite decision whose keys
// would be locked out of that order after the batch's earlier decisions
// waits for the next batch.
type coalescer struct {
	store   *Store
	max     int // statements in flight at most; 0 turns coalescing off
	streams int // batches in flight at most: batchesInFlight, at most max
	seed    maphash.Seed

	mu       sync.Mutex
	inflight int              // statements in flight; guarded by mu
	batching int              // batches in flight, within inflight; guarded by mu
	queue    []*waiter        // guarded by mu
	held     map[uint64]int32 // statements in flight per key hash; guarded by mu

	batches atomic.Int64 // statements that carried more than one decision
	queued  atomic.Int64 // decisions that waited in the queue
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

	out   result
	err   error
	alone bool // the batch was rolled back as a whole, or refused d: send d alone
}

// hashes appends to dst the hash of each row d locks.
func (co *coalescer) hashes(dst []uint64, d *decision) []uint64 {
	dur := byte(d.durability())
	if d.m == nil {
		var h maphash.Hash
		co.startHash(&h, dur, d.c.cfg.Prefix)
		h.WriteString(d.key)
		return append(dst, h.Sum64())
	}
	for i, p := range d.m.prefixes {
		var h maphash.Hash
		co.startHash(&h, dur, p)
		h.Write(d.keys[i])
		dst = append(dst, h.Sum64())
	}
	return dst
}

// startHash starts h as the hash of a row of durability dur and prefix,
// to which the row's key is written next.
func (co *coalescer) startHash(h *maphash.Hash, dur byte, prefix string) {
	h.SetSeed(co.seed)
	h.WriteByte(dur)
	h.WriteString(prefix)
	h.WriteByte(0)
}

// free reports whether fewer than keyInFlight statements in flight hold each
// of hs; the caller holds mu.
func (co *coalescer) free(hs []uint64) bool {
	for _, h := range hs {
		if co.held[h] >= keyInFlight {
			return false
		}
	}
	return true
}

// hold adds delta to the statements in flight that hold each of hs (a
// statement counts once per key: hs has no duplicates); the caller holds
// mu.
func (co *coalescer) hold(hs []uint64, delta int32) {
	for _, h := range hs {
		if n := co.held[h] + delta; n > 0 {
			co.held[h] = n
		} else {
			delete(co.held, h)
		}
	}
}

// do decides d and returns the function's result. When ctx ends first, do
// returns ctx.Err() at once; a decision still in the queue then is never
// sent.
func (co *coalescer) do(ctx context.Context, d *decision) (result, error) {
	if co.max == 0 {
		return co.store.sendOne(ctx, d)
	}
	var buf [1]uint64
	hs := dedupe(co.hashes(buf[:0], d))
	co.mu.Lock()
	if co.inflight < co.max && co.batching == 0 && len(co.queue) == 0 && co.free(hs) {
		co.inflight++
		co.hold(hs, 1)
		co.mu.Unlock()
		out, err := co.store.sendOne(ctx, d)
		co.release(hs, false)
		return out, err
	}
	w := &waiter{ctx: ctx, d: d, ready: make(chan struct{}, 1)}
	co.queue = append(co.queue, w)
	co.mu.Unlock()
	co.queued.Add(1)
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
			co.release(nil, true)
		default:
			// Taken into a batch: it may be applied, and nobody reads
			// its result.
			co.mu.Unlock()
		}
		return result{}, ctx.Err()
	}
	if w.state == stateLeader { // set before ready was signalled
		co.lead(w)
	}
	if w.alone {
		return co.store.sendOne(ctx, d)
	}
	return w.out, w.err
}

// dedupe sorts hs and removes repeated values.
func dedupe(hs []uint64) []uint64 {
	if len(hs) < 2 {
		return hs
	}
	slices.Sort(hs)
	return slices.Compact(hs)
}

// release ends a statement in flight, a batch or not, that held the keys
// hs. While decisions wait and fewer than streams batches are in flight, its
// place goes to a queued caller, the one with the latest deadline (no
// deadline counts as latest), which then sends a batch.
func (co *coalescer) release(hs []uint64, batch bool) {
	co.mu.Lock()
	co.hold(hs, -1)
	if batch {
		co.batching--
	}
	best := -1
	if co.batching >= co.streams {
		co.inflight--
		co.mu.Unlock()
		return
	}
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
	co.batching++
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
	co.mu.Lock()
	batch := co.take(w, dl, bounded)
	var hs []uint64
	for _, q := range batch {
		hs = co.hashes(hs, q.d)
	}
	hs = dedupe(hs)
	co.hold(hs, 1)
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
	woken := 0
	for _, q := range live {
		if q != w {
			q.ready <- struct{}{}
			woken++
		}
	}
	if woken > 0 {
		// The callers just woken usually decide again at once. Letting
		// them run before the place is released queues their next
		// decisions in time for the next batch, rather than sending the
		// first of them alone on the freed place (a round trip and a
		// commit for one decision) while the rest wait behind it.
		runtime.Gosched()
	}
	co.release(hs, true)
}

// take moves from the queue into a batch led by w, in the lock order, a fair
// share of the queued decisions whose deadlines are not after dl (any when
// not bounded); the caller holds mu.
func (co *coalescer) take(w *waiter, dl time.Time, bounded bool) []*waiter {
	batch := []*waiter{w}
	// At most one decision per key with an idempotency key: a key's
	// idempotency records are then written by one decision of the batch,
	// under its key's lock, as by a lone decision.
	var idem map[rowID]bool
	if w.d.idem != nil {
		idem = map[rowID]bool{w.d.row(): true}
	}
	// A fair share of the queue, so that every batch in flight carries
	// about as many decisions: a whole queue in one statement would
	// run its decisions one after another in one server process while the
	// other places send lone decisions, and make that batch's callers the
	// slowest by far.
	most := min(maxBatch, max(minShare, 1+(len(co.queue)+co.streams-1)/co.streams))
	composites := w.d.m != nil
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
			batch = append(batch, q)
			composites = composites || q.d.m != nil
		}
	}
	slices.SortStableFunc(batch, func(x, y *waiter) int { return lockOrder(x.d, y.d) })
	if composites {
		batch = inOrder(batch, w)
	}
	for _, q := range batch {
		if q != w {
			q.state = stateTaken
		}
	}
	co.queue = slices.DeleteFunc(co.queue, func(q *waiter) bool { return q.state == stateTaken })
	return batch
}

// inOrder returns the decisions of batch, which is sorted by lockOrder,
// that lock their rows in the lock order when sent one after another: each
// row a decision locks is locked by an earlier one or comes after every row
// locked before it (a composite locks its own rows in that order). A
// decision that would break the order is left out; when the leader w would
// be, the batch is w alone.
func inOrder(batch []*waiter, w *waiter) []*waiter {
	type row struct {
		durability Durability
		prefix     string
		key        []byte
	}
	before := func(x, y row) bool {
		if x.durability != y.durability {
			return x.durability < y.durability
		}
		return rowLess(x.key, x.prefix, y.key, y.prefix)
	}
	var held, fresh []row
	var last row // the last row in the lock order of held
	kept := batch[:0:0]
	for _, q := range batch {
		dur := q.d.durability()
		fresh = fresh[:0]
		ok := true
		q.d.rows(func(prefix string, key []byte) {
			r := row{dur, prefix, key}
			if slices.ContainsFunc(held, func(h row) bool {
				return h.durability == r.durability && h.prefix == r.prefix && bytes.Equal(h.key, r.key)
			}) {
				return
			}
			if len(held) > 0 && !before(last, r) {
				ok = false
			}
			fresh = append(fresh, r)
		})
		if !ok {
			if q == w {
				return []*waiter{w}
			}
			continue
		}
		for _, r := range fresh {
			if len(held) == 0 || before(last, r) {
				last = r
			}
			held = append(held, r)
		}
		kept = append(kept, q)
	}
	return kept
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
	var again []*waiter
	for i, q := range live {
		switch {
		case err == nil && outs[i].refused:
			// Refused by its take statement or the set-based take,
			// writing nothing: the function decides it, with the
			// batch's other refused decisions or alone.
			again = append(again, q)
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
	if len(again) > 1 && ctx.Err() == nil {
		// One more round trip, through the batch function (a refused
		// take goes by its function), rather than one per decision.
		co.send(again, dl, bounded)
		return
	}
	for _, q := range again {
		q.alone = true
	}
}

// rolledBack reports whether err is an error response from PostgreSQL that
// ends a statement before its implicit transaction commits: bad data or
// arguments (class 22), constraint violations (23), serialization failures
// and deadlocks (40), undefined objects (42), errors raised by a function
// (P0), lock and object state (55), a cancelled statement (57014) and a
// composite's clock skew (RK001, raised by the function). Other
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
	return pgErr.Code == "57014" || pgErr.Code == clockSkewCode
}

// lockOrder compares x and y in the order a batch decides them, the lock
// order: durability (table), then the first row each locks by key and
// prefix (a decision touches its idempotency records only while it holds
// its rows' locks), then decisions with an idempotency key before those
// without.
func lockOrder(x, y *decision) int {
	if c := cmp.Compare(x.durability(), y.durability()); c != 0 {
		return c
	}
	var c int
	if x.m == nil && y.m == nil {
		// Strings compare in byte order too, without a conversion.
		c = cmp.Or(strings.Compare(x.key, y.key), strings.Compare(x.c.cfg.Prefix, y.c.cfg.Prefix))
	} else {
		xk, xp := x.firstRow()
		yk, yp := y.firstRow()
		c = cmp.Or(bytes.Compare(xk, yk), strings.Compare(xp, yp))
	}
	if c != 0 {
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

// waitsForFlush reports whether the one commit of a batch of ds waits for
// its flush: when any decision in it asks for that.
func waitsForFlush(ds []*decision) bool {
	for _, d := range ds {
		if d.durability() == Logged && (d.m == nil && d.c.cfg.SynchronousCommit || d.m != nil && d.m.keepSync) {
			return true
		}
	}
	return false
}

// sendBatch decides ds, which are in the lock order, in one round trip and
// one implicit transaction, and returns their results in the order of ds:
// as one call of the set-based take when sendMany can, as a pipeline of
// take statements when sendTakes can, and otherwise as one statement that
// calls the batch function. Errors are the round trip's: when it fails, no
// result is valid.
func (s *Store) sendBatch(ctx context.Context, ds []*decision) ([]result, error) {
	syncAll := waitsForFlush(ds)
	if outs, sent, err := s.sendMany(ctx, ds, syncAll); sent {
		return outs, err
	}
	if outs, sent, err := s.sendTakes(ctx, ds, syncAll); sent {
		return outs, err
	}
	a := batchArgs{}
	a.grow(len(ds) + 1)
	var cleaners []*Counter
	var cleanupKeys [][]byte
	var cleanups []int64
	size := 0
	for _, d := range ds {
		if d.m == nil {
			c := d.c
			a.single(c, d.op, d.key, d.cost, d.lock, d.idem, 0, c.ttlUS, c.keepSyncCommit || syncAll)
			size += 5
		} else {
			a.composite(d, d.m.keepSync || syncAll)
			size += 1 + 6*len(d.m.counters)
		}
		if d.cleanup == 0 {
			continue
		}
		counters := []*Counter{d.c}
		keys := [][]byte{[]byte(d.key)}
		if d.m != nil {
			counters, keys = d.m.counters, d.keys
		}
		for i, c := range counters {
			if !slices.Contains(cleaners, c) {
				cleaners, cleanupKeys, cleanups = append(cleaners, c), append(cleanupKeys, keys[i]), append(cleanups, d.cleanup)
			}
		}
	}
	// Inline cleanup runs last, as a peek that takes no lock of its own: it
	// skips locked rows, so it never waits while the batch holds locks.
	// It deletes what expired more than the counter's keepUS ago.
	for i, c := range cleaners {
		a.single(c, opPeek, string(cleanupKeys[i]), 1, 0, nil, cleanups[i], c.keepUS, true)
	}
	raw, err := s.query(ctx, s.batchSQL, textResult, s.queryMode(),
		a.fn, a.op, a.prefix, a.key, a.cost, a.quota, a.window, a.lock, a.idem, a.ttl, a.cleanup, a.sync,
		a.parts, a.cAlgs, a.cPrefixes, a.cKeys, a.cCosts, a.cQuotas, a.cWindows, a.cTTLs, a.cLocks, a.cBounds)
	if err != nil {
		return nil, wrapErr(ctx, "batch", err)
	}
	all := make([]int64, size+5*len(cleaners))
	if !parseInts(raw, all) {
		return nil, wrapErr(ctx, "batch", errors.New("unexpected batch result (schema version mismatch?)"))
	}
	outs := make([]result, len(ds))
	for i, d := range ds {
		if d.m == nil {
			copy(outs[i].one[:], all[:5])
			all = all[5:]
			if d.plainTake() && !d.refused {
				// Counted as a lone one is (see sendSingle), so that
				// a counter whose takes went to the function only
				// in batches goes back to its take statement.
				d.c.noteTake(outs[i].one[0] == 1)
			}
		} else {
			n := 1 + 6*len(d.m.counters)
			outs[i].many = all[:n:n]
			all = all[n:]
		}
	}
	return outs, nil
}

// sendMany decides ds, which are in the lock order, with one call of their
// counter's set-based take (schema.sql's "many"), when every decision goes
// by its take statement (see decision.byTake) and all are of one counter.
// The call costs the server less than a pipeline of take statements or the
// batch function, the more so the more decisions share a key. sent is false
// when ds did not qualify or when nothing reached the server: the caller
// then sends ds another way. A decision whose key's row did not exist or
// whose key's decisions did not fit together is marked refused, and has no
// result: nothing was written for its key.
func (s *Store) sendMany(ctx context.Context, ds []*decision, syncAll bool) (outs []result, sent bool, err error) {
	c := ds[0].c
	if c == nil || c.many == "" {
		return nil, false, nil
	}
	for _, d := range ds {
		if d.c != c || !d.byTake() {
			return nil, false, nil
		}
	}
	// Keys in the lock order, each once, with the total cost of its
	// decisions; per decision, its key's index (from 1) and the cost of
	// the key's decisions after it.
	keys := make([][]byte, 0, len(ds))
	totals := make([]int64, 0, len(ds))
	at := make([]int32, len(ds))
	after := make([]int64, len(ds))
	for i, d := range ds {
		if i == 0 || d.key != ds[i-1].key {
			keys, totals = append(keys, []byte(d.key)), append(totals, 0)
		}
		k := len(keys) - 1
		if d.cost > c.quota-totals[k] {
			// The key's decisions cannot all fit: they go one
			// after another.
			return nil, false, nil
		}
		totals[k] += d.cost
		at[i], after[i] = int32(k+1), totals[k] // the cost up to d, for now
	}
	for i := range ds {
		after[i] = totals[at[i]-1] - after[i]
	}
	mode := s.queryMode()
	raw, err := s.query(ctx, c.many, textResult, mode, c.args.prefix, keys, totals, at, after,
		c.args.quota, c.args.window, c.keepSyncCommit || syncAll)
	if err != nil {
		if s.neverRan(ctx, mode, err) {
			return nil, false, nil
		}
		return nil, true, wrapErr(ctx, "batch", err)
	}
	all := make([]int64, 3*len(ds))
	if !parseInts(raw, all) {
		return nil, true, wrapErr(ctx, "batch", fmt.Errorf("set-based take returned %q, want a bigint[%d] in text form (schema version mismatch?)", raw, len(all)))
	}
	outs = make([]result, len(ds))
	for i, d := range ds {
		v := all[3*i : 3*i+3]
		d.refused, outs[i].refused = v[0] < 0, v[0] < 0
		if !d.refused {
			outs[i].one = [5]int64{1, v[0], v[1], v[2], 0}
		}
		c.noteTake(!d.refused)
	}
	return outs, true, nil
}

// batchSender is the part of a pgx pool or connection that sends a batch
// of statements as a pipeline.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// sendTakes decides ds, which are in the lock order, as a pipeline of their
// counters' take statements in one implicit transaction (one round trip,
// one commit), when every decision goes by its take statement (see
// decision.byTake), s's DB sends pipelines and s prepares its statements
// (a pgx batch goes in the connection's own mode). A take statement costs
// the server less than a decision function, in a batch as alone. sent is
// false when ds did not qualify or when nothing reached the server (a
// pooler that refused the prepared statements, a dead connection): the
// caller then sends ds as a call of the batch function. Results are valid
// only once the transaction committed; a decision whose take statement
// refused it is marked refused, and has no result.
func (s *Store) sendTakes(ctx context.Context, ds []*decision, syncAll bool) (outs []result, sent bool, err error) {
	db, ok := s.db.(batchSender)
	mode := s.queryMode()
	if !ok || mode != pgx.QueryExecModeCacheStatement || len(ds) > maxPipeline {
		return nil, false, nil
	}
	for _, d := range ds {
		if !d.byTake() {
			return nil, false, nil
		}
	}
	var b pgx.Batch
	for _, d := range ds {
		c := d.c
		q := c.take
		if syncAll {
			q = c.takeFlushed // no statement may turn the wait off
		}
		b.Queue(q, c.args.prefix, []byte(d.key), d.cost, c.args.quota, c.args.window)
	}
	outs, err = readTakes(db.SendBatch(ctx, &b), ds)
	if err != nil {
		// The transaction rolled back or may not have committed: no
		// refusal stands either.
		for _, d := range ds {
			d.refused = false
		}
		if s.neverRan(ctx, mode, err) {
			return nil, false, nil
		}
		return nil, true, wrapErr(ctx, "batch", err)
	}
	for _, d := range ds {
		d.c.noteTake(!d.refused)
	}
	return outs, true, nil
}

// readTakes reads the results of the take statements of ds sent as br,
// and then the outcome of their commit: no result counts before it. It
// sets refused on a decision whose statement refused it.
func readTakes(br pgx.BatchResults, ds []*decision) ([]result, error) {
	outs := make([]result, len(ds))
	var err error
	for i, d := range ds {
		err = d.c.scanTake(br.QueryRow(), &outs[i].one)
		if errors.Is(err, pgx.ErrNoRows) {
			d.refused, outs[i].refused, err = true, true, nil
		}
		if err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return outs, err
}

// batchArgs are the batch statement's array arguments: one element of the
// first ones per function call, one of the c ones per counter of a
// composite's call.
type batchArgs struct {
	fn, parts                                   []int32
	op, cost, quota, window, lock, ttl, cleanup []int64
	prefix                                      []string
	key, idem                                   [][]byte
	sync                                        []bool

	cAlgs, cCosts, cQuotas, cWindows, cTTLs, cLocks, cBounds []int64
	cPrefixes                                                []string
	cKeys                                                    [][]byte
}

func (a *batchArgs) grow(n int) {
	a.fn, a.parts = make([]int32, 0, n), make([]int32, 0, n)
	a.op, a.cost, a.quota, a.window = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	a.lock, a.ttl, a.cleanup = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	a.prefix, a.key, a.idem, a.sync = make([]string, 0, n), make([][]byte, 0, n), make([][]byte, 0, n), make([]bool, 0, n)
	// Empty rather than nil, which pgx sends as NULL.
	a.cAlgs, a.cCosts, a.cQuotas, a.cWindows = []int64{}, []int64{}, []int64{}, []int64{}
	a.cTTLs, a.cLocks, a.cBounds, a.cPrefixes, a.cKeys = []int64{}, []int64{}, []int64{}, []string{}, [][]byte{}
}

// single adds a call of c's single-key function; ttl is its p_idem_ttl_us,
// which also bounds what its cleanup deletes.
func (a *batchArgs) single(c *Counter, op int64, key string, cost, lock int64, idem []byte, cleanup, ttl int64, sync bool) {
	a.fn = append(a.fn, functionIndex(c.cfg.Durability, algName(c.cfg.Algorithm)))
	a.parts = append(a.parts, 0)
	a.op = append(a.op, op)
	a.prefix = append(a.prefix, c.cfg.Prefix)
	a.key = append(a.key, []byte(key))
	a.cost = append(a.cost, cost)
	a.quota = append(a.quota, c.quota)
	a.window = append(a.window, c.windowUS)
	a.lock = append(a.lock, lock)
	a.idem = append(a.idem, idem)
	a.ttl = append(a.ttl, ttl)
	a.cleanup = append(a.cleanup, cleanup)
	a.sync = append(a.sync, sync)
}

// composite adds a call of d's composite function, without its cleanup
// (which the batch runs last).
func (a *batchArgs) composite(d *decision, sync bool) {
	m := d.m
	a.fn = append(a.fn, compositeIndex(m.durability))
	a.parts = append(a.parts, int32(len(m.counters)))
	a.op = append(a.op, d.op)
	a.prefix = append(a.prefix, m.idemPrefix)
	a.key = append(a.key, []byte(d.key))
	a.cost = append(a.cost, 0)
	a.quota = append(a.quota, 0)
	a.window = append(a.window, 0)
	a.lock = append(a.lock, 0)
	a.idem = append(a.idem, d.idem)
	a.ttl = append(a.ttl, m.idemTTL)
	a.cleanup = append(a.cleanup, 0)
	a.sync = append(a.sync, sync)
	a.cAlgs = append(a.cAlgs, m.algs...)
	a.cPrefixes = append(a.cPrefixes, m.prefixes...)
	a.cKeys = append(a.cKeys, d.keys...)
	a.cCosts = append(a.cCosts, d.costs...)
	a.cQuotas = append(a.cQuotas, m.quotas...)
	a.cWindows = append(a.cWindows, m.windows...)
	a.cTTLs = append(a.cTTLs, m.ttls...)
	a.cLocks = append(a.cLocks, d.locks...)
	a.cBounds = append(a.cBounds, d.bounds...)
}

// batchSQL returns the statement that calls the schema's batch function:
// its arguments are batchArgs' arrays, and its result is the decisions'
// results one after another in one array in text form.
func batchSQL(quoted string) string {
	return batchMarker + "SELECT " + quoted + ".batch($1::int[], $2::bigint[], $3::text[], $4::bytea[], $5::bigint[], " +
		"$6::bigint[], $7::bigint[], $8::bigint[], $9::bytea[], $10::bigint[], $11::bigint[], $12::boolean[], " +
		"$13::int[], $14::bigint[], $15::text[], $16::bytea[], $17::bigint[], $18::bigint[], $19::bigint[], " +
		"$20::bigint[], $21::bigint[], $22::bigint[])::text"
}
