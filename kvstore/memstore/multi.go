package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

var (
	_ kvstore.MultiAtomic   = (*Store)(nil)
	_ kvstore.MultiAtomic   = (*Scope)(nil)
	_ kvstore.PeriodCounter = (*Store)(nil)
	_ kvstore.PeriodCounter = (*Scope)(nil)
)

// CountsPeriods implements [kvstore.PeriodCounter]: it returns true, since
// UpdateMulti keeps period counters on the store's clock (Config.Now).
func (c *Scope) CountsPeriods() bool { return true }

// Partitioned implements [kvstore.MultiAtomic]: it returns false, since one
// UpdateMulti can update any keys of a Store.
func (c *Scope) Partitioned() bool { return false }

// maxStackKeys is the most keys an UpdateMulti handles without allocating
// its bookkeeping.
const maxStackKeys = 8

// UpdateMulti implements [kvstore.MultiAtomic] on the store's clock: it
// locks the shards of its keys in ascending order, so that two calls over
// overlapping shards, and single-key operations, never wait for each other
// in a cycle, computes every key's result, and writes only when op is not a
// take or every key held its units. A key of a non-empty group is kept in
// the Scope under "\x00" + [kvstore.GroupKey](group, key): keep keys that
// begin with a NUL byte out of the Scope's ordinary keys.
//
// A key that the call writes and the store does not hold is inserted as by
// a single-key update, evicting when its shard is full; the eviction may
// take another key of the same call, written a moment before in that shard
// (only in a store whose shards hold fewer keys than a call has): that
// key's write is then lost and it reads as full afterwards, as any evicted
// key does.
//
// Period counters ([kvstore.Update].Period) follow
// [kvstore.PeriodBounds.Apply] on the clock the call reads once; a period
// record lives until the end of the period it was last written in, and is
// evicted like any record when the store is full (its count is then lost:
// memstore is one process's memory, not a billing record).
//
// It returns the errors of [kvstore.CheckMultiPeriods],
// [kvstore.ErrDuplicateKey] for a key given twice,
// [ratekit.ErrClockSkew] when the clock is outside a period counter's
// bounds (nothing changes), and ctx.Err() when ctx is done before it starts.
func (c *Scope) UpdateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) error {
	periods, err := kvstore.CheckMultiPeriods(op, updates, results)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	n := len(updates)
	var (
		keysBuf   [maxStackKeys]string
		shardsBuf [maxStackKeys]*shard
		lockedBuf [maxStackKeys]*shard
		heldBuf   [maxStackKeys]*entry
		hashesBuf [maxStackKeys]uint64
	)
	keys, shards, locked, held, hashes := keysBuf[:0], shardsBuf[:0], lockedBuf[:0], heldBuf[:0], hashesBuf[:]
	if n > maxStackKeys {
		keys, shards, locked, held, hashes = make([]string, 0, n), make([]*shard, 0, n), make([]*shard, 0, n), make([]*entry, n), make([]uint64, n)
	}
	for i := range updates {
		k := updates[i].Key
		if group != "" {
			k = "\x00" + kvstore.GroupKey(group, k)
		}
		keys = append(keys, k)
	}
	if err := checkDistinct(keys, updates); err != nil {
		return err
	}
	s := c.s
	nowNano := s.clock()
	if periods {
		now := micros(nowNano)
		for i := range updates {
			if p := updates[i].Period; p != nil && p.Pick(now) == 0 {
				return fmt.Errorf("memstore: %w: the clock %d µs is outside [%d, %d) of update %d", ratekit.ErrClockSkew, now, p.Bounds[0], p.Bounds[3], i)
			}
		}
	}
	for i, k := range keys {
		hashes[i] = maphash.String(s.seed, k)
		shards = append(shards, s.shard(hashes[i]))
	}
	locked = lockShards(shards, locked)
	held = held[:n]
	for i, k := range keys {
		held[i] = shards[i].find(c, k, hashes[i])
	}
	c.applyAll(op, updates, results, keys, hashes, shards, held, nowNano)
	for _, sh := range slices.Backward(locked) {
		sh.mu.Unlock()
	}
	return nil
}

// checkDistinct returns an error matching kvstore.ErrDuplicateKey when two
// of keys (the store keys of updates) are equal.
func checkDistinct(keys []string, updates []kvstore.Update) error {
	n := len(keys)
	if n == 2 {
		// The common composite ("per second and per day"): one
		// comparison.
		if keys[0] == keys[1] {
			return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[1].Key)
		}
		return nil
	}
	var orderBuf [maxStackKeys]int
	order := orderBuf[:0]
	if n > maxStackKeys {
		order = make([]int, 0, n)
	}
	for i := range n {
		order = append(order, i)
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	for j := 1; j < n; j++ {
		if keys[order[j]] == keys[order[j-1]] {
			return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[order[j]].Key)
		}
	}
	return nil
}

// lockShards locks each distinct shard of shards once, in ascending order,
// with no hot entry, and returns them in that order, appended to locked (empty, with room for
// every shard). It reorders no element of shards.
func lockShards(shards, locked []*shard) []*shard {
	locked = append(locked, shards...)
	slices.SortFunc(locked, func(a, b *shard) int { return a.id - b.id })
	locked = slices.Compact(locked)
	for _, sh := range locked {
		sh.mu.Lock()
		sh.flush()
	}
	return locked
}

// applyAll computes and writes the results of an UpdateMulti whose shards
// are all locked; held[i] is the entry of keys[i] (whose hash is
// hashes[i]) in shards[i], or nil.
func (c *Scope) applyAll(op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, keys []string, hashes []uint64, shards []*shard, held []*entry, nowNano int64) {
	var nextBuf [maxStackKeys]kvstore.Record
	next := nextBuf[:0]
	if len(updates) > maxStackKeys {
		next = make([]kvstore.Record, 0, len(updates))
	}
	next = next[:len(updates)]
	all := computeAll(op, updates, results, held, nowNano, next)
	write := all && op != kvstore.OpPeek
	for i := range updates {
		c.settle(&updates[i], keys[i], hashes[i], shards[i], held[i], next[i], results[i].Period, write, nowNano)
	}
	if op == kvstore.OpTake && !all {
		keepLevels(updates, results)
	}
}

// computeAll computes the result and the next record of every update on
// its entry (nil for an absent key), into results and next, and reports
// whether every take could be made (true for other ops).
func computeAll(op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, held []*entry, nowNano int64, next []kvstore.Record) bool {
	nowMicro := micros(nowNano)
	all := true
	for i := range updates {
		u, e := &updates[i], held[i]
		live := e != nil && nowNano < e.expires
		var rec kvstore.Record
		if live {
			rec = e.rec
		}
		// The updates and the clock were checked: Apply cannot fail.
		var write bool
		if u.Period == nil {
			results[i], next[i], write, _ = u.Refill.Apply(rec, live, nowMicro, op, u.N)
		} else {
			results[i], next[i], write, _ = u.Period.Apply(rec, live, nowMicro, op, u.N)
		}
		if op == kvstore.OpTake && !write {
			all = false
		}
	}
	return all
}

// settle writes next to the entry e of update u under key (whose hash is h)
// in sh (nil for an absent key, which it inserts) when write is set and the
// record must be kept, and otherwise removes e when it is not worth
// keeping; picked is the period its result picked (a period counter's).
func (c *Scope) settle(u *kvstore.Update, key string, h uint64, sh *shard, e *entry, next kvstore.Record, picked int, write bool, nowNano int64) {
	var (
		keep    bool  // next is kept
		expires int64 // next's expiry, when kept
	)
	switch {
	case u.Period != nil:
		// A period counter: a count of zero goes (an absent key counts
		// zero); any other lives at least until the end of the period
		// picked, and no shorter than it did.
		keep = write && next.Value > 0
		expires = u.Period.Bounds[picked] * 1000
		if keep && e != nil && !e.dead && nowNano < e.expires {
			expires = max(e.expires, expires)
		}
	default:
		// A full record goes: an absent key reads as full.
		keep = write && next.Value < u.Refill.Burst
		if keep {
			expires = expiry(u.Refill, next)
		}
	}
	switch {
	case e != nil && e.dead:
		// Evicted by an insert of this call: forgotten, as eviction
		// forgets.
	case keep && e == nil:
		c.insert(sh, key, h, next, expires, nowNano)
	case keep:
		e.rec, e.expires = next, expires
	case e != nil && (write || nowNano >= e.expires):
		// A record rewritten to nothing worth keeping, or an expired
		// one that is not written, goes.
		sh.drop(e)
	}
}

// keepLevels rewrites the results of a take that took nothing: a key that
// could give its units reports the level it keeps.
func keepLevels(updates []kvstore.Update, results []kvstore.OpResult) {
	for i := range results {
		switch p := updates[i].Period; {
		case !results[i].OK:
		case p == nil:
			results[i].Remaining += updates[i].N
		default:
			results[i].Used -= updates[i].N
			results[i].Remaining = max(p.Quota-results[i].Used, 0)
		}
	}
}

// micros returns the store time nano (nanoseconds since the Unix epoch) in
// whole microseconds, rounded down as time.Time.UnixMicro rounds.
func micros(nano int64) int64 {
	m := nano / 1000
	if nano < 0 && nano%1000 != 0 {
		m--
	}
	return m
}
