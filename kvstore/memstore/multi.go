package memstore

import (
	"context"
	"fmt"
	"runtime"
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
// locks the entries of every key in ascending key order (bytewise), so that
// two calls over overlapping keys, and single-key Updates, never wait for
// each other in a cycle, computes every key's result, and writes only when
// op is not a take or every key held its units. A key of a non-empty group
// is kept in the Scope under "\x00" + [kvstore.GroupKey](group, key): keep
// keys that begin with a NUL byte out of the Scope's ordinary keys.
//
// An absent key gets a locked placeholder entry for the duration of the
// call, which counts towards [Config.MaxKeys]; when its shard is full and
// every entry that eviction could take is in use, the call lets go of every
// entry it holds and starts again. An entry of the call that eviction takes
// while the call holds it is forgotten as any evicted record is: the call's
// write to it is lost and the key reads as full afterwards.
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
		keysBuf  [maxStackKeys]string
		orderBuf [maxStackKeys]int
		heldBuf  [maxStackKeys]*entry
	)
	keys, order, held := keysBuf[:0], orderBuf[:0], heldBuf[:0]
	if n > maxStackKeys {
		keys, order, held = make([]string, 0, n), make([]int, 0, n), make([]*entry, 0, n)
	}
	for i := range updates {
		k := updates[i].Key
		if group != "" {
			k = "\x00" + kvstore.GroupKey(group, k)
		}
		keys = append(keys, k)
		order = append(order, i)
	}
	if n == 2 {
		// The common composite ("per second and per day"): one
		// comparison orders the keys and finds a duplicate.
		switch strings.Compare(keys[0], keys[1]) {
		case 0:
			return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[1].Key)
		case 1:
			order[0], order[1] = 1, 0
		}
	} else {
		slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
		for j := 1; j < n; j++ {
			if keys[order[j]] == keys[order[j-1]] {
				return fmt.Errorf("%w: %q", kvstore.ErrDuplicateKey, updates[order[j]].Key)
			}
		}
	}
	held = held[:n]
	s := c.s
	for {
		nowNano := s.clock()
		if periods {
			now := micros(nowNano)
			for i := range updates {
				if p := updates[i].Period; p != nil && p.Pick(now) == 0 {
					return fmt.Errorf("memstore: %w: the clock %d µs is outside [%d, %d) of update %d", ratekit.ErrClockSkew, now, p.Bounds[0], p.Bounds[3], i)
				}
			}
		}
		if c.lockAll(keys, order, held, nowNano) {
			c.applyAll(op, updates, results, held, nowNano)
			return nil
		}
		runtime.Gosched()
	}
}

// lockAll locks the entry of every key in order, inserting a placeholder
// entry (expired, so that it reads as absent) for an absent key; held[i]
// receives the entry of keys[i]. It returns false, holding nothing, when a
// placeholder found no room.
func (c *Scope) lockAll(keys []string, order []int, held []*entry, now int64) bool {
	for j, i := range order {
		for {
			if e := c.lock(keys[i]); e != nil {
				held[i] = e
				break
			}
			e, ok := c.insertHeld(keys[i], now, held)
			if e != nil {
				held[i] = e
				break
			}
			if !ok {
				// No room: let go of everything and start again.
				for _, k := range order[:j] {
					c.release(held[k], now)
					held[k] = nil
				}
				return false
			}
			// Another goroutine added the key first: lock its entry.
		}
	}
	return true
}

// release unlocks e, held by an UpdateMulti that writes nothing to it,
// removing it when it is an expired record or a placeholder.
func (c *Scope) release(e *entry, now int64) {
	if !e.dead && now >= e.expires {
		c.s.remove(e)
	}
	e.mu.Unlock()
}

// applyAll computes and writes the results of an UpdateMulti whose entries
// are all held, then unlocks them.
func (c *Scope) applyAll(op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, held []*entry, nowNano int64) {
	var nextBuf [maxStackKeys]kvstore.Record
	next := nextBuf[:0]
	if len(updates) > maxStackKeys {
		next = make([]kvstore.Record, 0, len(updates))
	}
	next = next[:len(updates)]
	all := computeAll(op, updates, results, held, nowNano, next)
	write := all && op != kvstore.OpPeek
	for i := range updates {
		c.settle(&updates[i], held[i], next[i], results[i].Period, write, nowNano)
		held[i].mu.Unlock()
	}
	if op == kvstore.OpTake && !all {
		keepLevels(updates, results)
	}
}

// computeAll computes the result and the next record of every update on
// its held entry, into results and next, and reports whether every take
// could be made (true for other ops).
func computeAll(op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult, held []*entry, nowNano int64, next []kvstore.Record) bool {
	nowMicro := micros(nowNano)
	all := true
	for i := range updates {
		u, e := &updates[i], held[i]
		live := nowNano < e.expires
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

// settle writes next to the held entry e of update u when write is set and
// the record must be kept, and otherwise removes e when it is not worth
// keeping; picked is the period its result picked (a period counter's).
func (c *Scope) settle(u *kvstore.Update, e *entry, next kvstore.Record, picked int, write bool, nowNano int64) {
	switch {
	case e.dead:
		// Evicted while held: forgotten, as eviction forgets.
	case u.Period != nil:
		// A period counter: a count of zero goes (an absent key counts
		// zero); any other lives at least until the end of the period
		// picked, and no shorter than it did.
		switch {
		case write && next.Value > 0:
			end := u.Period.Bounds[picked] * 1000
			if nowNano >= e.expires {
				e.expires = end
			}
			e.rec, e.expires = next, max(e.expires, end)
		case write || nowNano >= e.expires:
			c.s.remove(e)
		}
	case write && next.Value < u.Refill.Burst:
		e.rec, e.expires = next, expiry(u.Refill, next)
	case write || nowNano >= e.expires:
		// A full record, an expired one or a placeholder that is not
		// written goes: an absent key reads as full.
		c.s.remove(e)
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

// insertHeld adds key as a placeholder entry (expired: it reads as absent)
// and returns it locked and published, for an UpdateMulti that holds the
// entries held. It returns nil and true when another goroutine added key
// first, and nil and false when the key's shard is full and no entry can be
// evicted but ones that other goroutines hold.
func (c *Scope) insertHeld(key string, now int64, held []*entry) (*entry, bool) {
	s := c.s
	e := &entry{key: strings.Clone(key), scope: c}
	e.mu.Lock()
	sh := s.shard(key)
	sh.mu.Lock()
	for len(sh.entries) >= sh.max {
		if sh.evict(s, now) {
			continue
		}
		// Every sampled entry is in use. One held by this call can go
		// (the call's write to it is then lost, as eviction loses
		// records); otherwise give up, so that whoever holds them can
		// finish.
		victim := false
		for _, h := range held {
			if h != nil && !h.dead && s.shard(h.key) == sh {
				sh.drop(s, h)
				victim = true
				break
			}
		}
		if !victim {
			sh.mu.Unlock()
			e.mu.Unlock()
			return nil, false
		}
	}
	e.pos = len(sh.entries)
	sh.entries = append(sh.entries, e)
	sh.mu.Unlock()
	if _, loaded := c.index.LoadOrStore(e.key, e); loaded {
		s.remove(e)
		e.mu.Unlock()
		return nil, true
	}
	return e, true
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
