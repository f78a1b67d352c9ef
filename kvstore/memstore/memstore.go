// Package memstore is an in-process [kvstore.Store] and [kvstore.Atomic]: the
// embedded default store of ratekit's token bucket.
//
// It runs no background goroutine, so nothing needs to tick inside a frozen
// serverless instance: records expire lazily, when a read finds them past
// their time to live or when a full shard needs room. The number of keys is
// bounded ([Config.MaxKeys]); see [Store] for the eviction rule.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// DefaultMaxKeys is the key bound used when [Config.MaxKeys] is zero.
const DefaultMaxKeys = 100_000

// maxShards is the most lock shards a Store uses.
const maxShards = 64

// evictionSamples is how many entries a full shard looks at to pick the one
// to evict.
const evictionSamples = 5

// Config configures a [Store]. The zero Config is valid.
type Config struct {
	// MaxKeys bounds the number of keys the store holds. Zero means
	// DefaultMaxKeys; a negative value is an invalid config.
	MaxKeys int

	// Now is the store's clock: it stamps [kvstore.Atomic] updates and
	// decides expiry. Nil means the system clock as the store reads it:
	// the wall clock (time.Now) read once by New, advanced by Go's
	// monotonic clock (time.Since). A monotonic reading is cheaper than a
	// wall-clock reading, and the store's clock never steps back; it does not follow steps or slewing
	// of the wall clock after New, which nothing in the store needs, since
	// every time the store compares was read from its own clock. Tests
	// inject a fake clock here.
	Now func() time.Time
}

// Store is an in-memory key-value store. It is safe for concurrent use.
//
// The keys are spread over up to 64 shards by a seeded hash. A shard is a
// mutex, on a cache line of its own, that guards the shard's keys: their
// index (a hash table with linear probing, which reuses the hash that chose
// the shard) and their records. An operation on one key runs under its
// shard's mutex, from the lookup to the write: it is atomic, it takes one
// lock and hashes the key once, and operations on keys of different shards
// do not wait for each other (those of one shard wait for a few table and
// arithmetic steps, never for another lock). [Store.Len] takes the shards in turn;
// [Scope.UpdateMulti] takes its keys' shards in ascending order. A key that
// Update writes twice in a row in its shard keeps its record on the
// mutex's cache line until an operation on another key of the shard:
// callers of one hot key on several processors then pass one cache line
// between them rather than two (go-limiter's buckets, each holding its own
// mutex, are the model).
//
// Bound and eviction: the store never holds more than MaxKeys keys (each
// shard holds at most its share). When a new key arrives at a full shard,
// the shard samples five of its entries (consecutive from a random position
// in the shard's list of entries, which is in no order) and removes every
// sampled entry past its time to live; if none was, it removes the sampled
// entry that expires first. For a token bucket that entry is the bucket
// nearest to full, the one whose loss changes the fewest decisions, since an
// absent bucket reads as full. This is the sampled eviction Redis uses for
// maxmemory, with time to live as the score.
//
// Records expire lazily: a Get or Update that finds a record past its time to
// live treats the key as absent. Get leaves the expired entry in place for
// the write that usually follows it (the read-compute-write of tokenbucket's
// Eventual mode) to reuse without allocating; an Update that does not
// rewrite the record removes it; eviction takes expired entries first.
type Store struct {
	Scope // the store's own keys: the scope of the empty prefix

	now    func() time.Time // Config.Now; nil for the system clock
	start  time.Time        // the system clock's anchor, with a monotonic reading
	base   int64            // start in nanoseconds since the Unix epoch
	seed   maphash.Seed
	mask   uint64
	shards []shard

	scopesMu sync.Mutex
	scopes   map[string]*Scope // by prefix; guarded by scopesMu
}

// Scope is a key space of a [Store]: a [kvstore.Store] and [kvstore.Atomic]
// whose key k stands for the store's key prefix+k, with keys of its own in
// the shards' indexes, so that an operation finds the key without building
// prefix+k. A Scope shares
// its Store's clock, shards, key bound ([Config.MaxKeys]) and eviction; its
// methods have the Store's semantics and errors. It is safe for concurrent
// use.
//
// A key written through a Scope is held in that Scope only: the Store's own
// methods (the scope of the empty prefix) do not see it under prefix+k, and
// the same holds between scopes whose prefixes overlap. Every user of one
// prefix must therefore go through [Store.Prefixed] (tokenbucket does, through
// [kvstore.Prefixer]).
type Scope struct {
	s *Store
}

// A shard guards its keys' index and records, and keeps the bound for them:
// it lists their entries, so that eviction can sample them.
//
// A key that Update finds twice in a row in its shard is hot: its record
// moves to the shard's first cache line, beside the mutex (hotRec and
// hotExp stand for hot.rec and hot.expires), so that callers of a hot key
// on several processors pass one cache line between them, the mutex's,
// where they would pass two, the mutex's and the entry's. Every other
// operation that holds the lock writes the record back first (flush).
type shard struct {
	// The first cache line: what every Update writes or reads.
	mu     sync.Mutex
	hot    *entry         // the hot entry, or nil
	hotRec kvstore.Record // hot's record, while hot is not nil
	hotExp int64          // hot's expiry, while hot is not nil
	last   *entry         // the entry Update last wrote, or nil
	id     int            // the shard's position in Store.shards
	max    int            // the most entries the shard holds

	// The second: written only when a key comes or goes.
	table   []slot   // the index of entries; see find
	entries []*entry // in no order; entries[e.pos] == e
	_       [16]byte // shards on separate cache lines
}

// lookup returns the entry of key, whose hash is h, in sh (nil when the
// scope c does not hold key), whether it is the hot entry, and its record
// and expiry (the smallest time for no entry). Missing the hot entry, it
// writes the hot record back first. The caller holds sh.mu.
func (sh *shard) lookup(c *Scope, key string, h uint64) (e *entry, hot bool, rec kvstore.Record, expires int64) {
	if e = sh.hot; e != nil && e.hash == h && e.scope == c && e.key() == key {
		return e, true, sh.hotRec, sh.hotExp
	}
	sh.flush()
	if e = sh.find(c, key, h); e == nil {
		return nil, false, kvstore.Record{}, math.MinInt64
	}
	return e, false, e.rec, e.expires
}

// rewrite gives e, an entry of sh that lookup returned (hot when it is the
// hot entry), the record rec expiring at expires. An entry written twice in
// a row becomes (or stays) the hot entry. The caller holds sh.mu.
func (sh *shard) rewrite(e *entry, hot bool, rec kvstore.Record, expires int64) {
	if hot || e == sh.last {
		sh.hot, sh.hotRec, sh.hotExp = e, rec, expires
		return
	}
	e.rec, e.expires = rec, expires
	sh.last = e
}

// flush writes the hot entry's record back into it, and leaves the shard
// with no hot entry. The caller holds sh.mu.
func (sh *shard) flush() {
	if e := sh.hot; e != nil {
		e.rec, e.expires = sh.hotRec, sh.hotExp
		sh.hot = nil
	}
}

// A slot of a shard's table holds an entry and its key's hash, or nothing.
type slot struct {
	hash uint64
	e    *entry
}

// An entry holds one key's record; its shard's mutex guards it. An entry
// that is removed is marked dead and never written again. Its fields and
// the first 16 bytes of its key fill one cache line, so that looking up a
// short key (an IPv4 address, a user ID) that is not in the processor's
// cache reads one line: the key's bytes follow the fields in the same
// allocation (see newEntry).
type entry struct {
	rec     kvstore.Record
	expires int64  // store clock, nanoseconds since the Unix epoch
	hash    uint64 // immutable: the hash of the key
	scope   *Scope // immutable: the scope that holds the entry
	pos     int32  // index in the shard's entries (at most maxShardKeys)
	dead    bool
	// klen is the key's length, its bytes starting at kb and running on
	// into the allocation (an entryWide) past shortKey; or longKey for a
	// key held by an entryLong.
	klen uint16
	kb   [shortKey]byte
}

// entryWide is an entry whose key runs past kb into the next cache line:
// a key of up to wideKey bytes, in one 128-byte allocation.
type entryWide struct {
	entry
	_ [wideKey - shortKey]byte
}

// entryLong is an entry whose key, longer than wideKey bytes, has an
// allocation of its own.
type entryLong struct {
	entry
	long string
}

const (
	shortKey = 16                  // the most key bytes an entry holds in its own cache line
	wideKey  = 128 - 64 + shortKey // the most an entryWide holds
	longKey  = math.MaxUint16      // the klen of an entryLong
)

// key returns e's key, owned by the store.
func (e *entry) key() string {
	if e.klen != longKey {
		return unsafe.String(&e.kb[0], e.klen)
	}
	return (*entryLong)(unsafe.Pointer(e)).long
}

// newEntry returns an entry whose key is a copy of key: an entry, an
// entryWide or an entryLong (the entry first in each, so that e points to
// the allocation), by the key's length.
func newEntry(key string) *entry {
	var e *entry
	switch {
	case len(key) <= shortKey:
		e = new(entry)
	case len(key) <= wideKey:
		e = &new(entryWide).entry
	default:
		l := &entryLong{long: strings.Clone(key)}
		l.klen = longKey
		return &l.entry
	}
	copy(unsafe.Slice(&e.kb[0], len(key)), key)
	e.klen = uint16(len(key))
	return e
}

// maxShardKeys is the most entries a shard holds, whatever MaxKeys is: the
// largest entry position, far beyond what a process's memory holds.
const maxShardKeys = math.MaxInt32

var (
	_ kvstore.Store  = (*Store)(nil)
	_ kvstore.Atomic = (*Store)(nil)
	_ kvstore.Store  = (*Scope)(nil)
	_ kvstore.Atomic = (*Scope)(nil)

	_ kvstore.Prefixer = (*Store)(nil)
)

// New returns an empty Store. It returns an error matching
// ratekit.ErrInvalidConfig when cfg.MaxKeys is negative.
func New(cfg Config) (*Store, error) {
	if cfg.MaxKeys < 0 {
		return nil, configErr("MaxKeys %d is negative", cfg.MaxKeys)
	}
	maxKeys := cfg.MaxKeys
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeys
	}
	n := 1 << (bits.Len(uint(min(maxKeys, maxShards))) - 1) // a power of two, at most maxKeys
	s := &Store{
		now:    cfg.Now,
		seed:   maphash.MakeSeed(),
		mask:   uint64(n - 1),
		shards: make([]shard, n),
	}
	s.Scope = Scope{s: s}
	if s.now == nil {
		s.start = time.Now()
		s.base = s.start.UnixNano()
	}
	for i := range s.shards {
		s.shards[i].id = i
		s.shards[i].max = maxKeys / n
		if i < maxKeys%n {
			s.shards[i].max++
		}
		s.shards[i].max = min(s.shards[i].max, maxShardKeys)
	}
	return s, nil
}

// clock returns the store's time in nanoseconds since the Unix epoch.
// Update reads it in its own body, a call less on every decision.
func (s *Store) clock() int64 {
	if s.now != nil {
		return s.injected()
	}
	return s.base + int64(time.Since(s.start))
}

// injected returns the time of Config.Now in nanoseconds since the Unix
// epoch.
func (s *Store) injected() int64 { return s.now().UnixNano() }

// Prefixed returns the key space of prefix, a *[Scope] (which implements
// [kvstore.Atomic]), implementing [kvstore.Prefixer]. Every call with the
// same prefix returns the same Scope; the empty prefix gives the Store's own
// keys. A Scope lives as long as its Store: it is meant to be taken once
// per user of a prefix, such as a limiter at construction.
func (s *Store) Prefixed(prefix string) kvstore.Store { return s.scope(prefix) }

func (s *Store) scope(prefix string) *Scope {
	if prefix == "" {
		return &s.Scope
	}
	s.scopesMu.Lock()
	defer s.scopesMu.Unlock()
	sc, ok := s.scopes[prefix]
	if !ok {
		if s.scopes == nil {
			s.scopes = make(map[string]*Scope)
		}
		sc = &Scope{s: s}
		s.scopes[prefix] = sc
	}
	return sc
}

// shard returns the shard of the key whose hash is h.
func (s *Store) shard(h uint64) *shard { return &s.shards[h&s.mask] }

// lockShard returns the hash of key and its shard, locked, with no hot
// entry.
func (s *Store) lockShard(key string) (uint64, *shard) {
	h := maphash.String(s.seed, key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	sh.flush()
	return h, sh
}

// home returns the slot where a table of len(t) slots, a power of two, starts
// looking for the hash h. It skips the low bits, which chose the shard.
func home(t []slot, h uint64) int { return int(h>>maxShardBits) & (len(t) - 1) }

// maxShardBits is the number of a hash's low bits that choose its shard.
const maxShardBits = 6

// find returns the entry of key, whose hash is h, in sh, or nil when the
// scope does not hold key. The caller holds sh.mu.
//
// The table is open addressing with linear probing: an entry sits in the
// first free slot from its hash's home, no run of occupied slots is broken
// by a removal (see unindex), and a table is never more than three quarters
// full, so a search ends at a free slot.
func (sh *shard) find(c *Scope, key string, h uint64) *entry {
	t := sh.table
	if len(t) == 0 {
		return nil
	}
	for i := home(t, h); ; i = (i + 1) & (len(t) - 1) {
		sl := &t[i]
		if sl.e == nil {
			return nil
		}
		if sl.hash == h && sl.e.scope == c && sl.e.key() == key {
			return sl.e
		}
	}
}

// index adds e to sh's table, growing it to keep it at most three quarters
// full. The caller holds sh.mu and adds e to sh.entries after.
func (sh *shard) index(e *entry) {
	if 4*(len(sh.entries)+1) > 3*len(sh.table) {
		t := make([]slot, max(8, 2*len(sh.table)))
		for _, o := range sh.entries {
			place(t, o)
		}
		sh.table = t
	}
	place(sh.table, e)
}

// place puts e into the first free slot of t from its home.
func place(t []slot, e *entry) {
	i := home(t, e.hash)
	for t[i].e != nil {
		i = (i + 1) & (len(t) - 1)
	}
	t[i] = slot{hash: e.hash, e: e}
}

// unindex removes e from sh's table, then moves back each entry of the run
// after it that its search would no longer reach (the backward shift of
// Knuth's Algorithm R), so that no removal leaves a marker behind. The
// caller holds sh.mu.
func (sh *shard) unindex(e *entry) {
	t := sh.table
	m := len(t) - 1
	i := home(t, e.hash)
	for t[i].e != e {
		i = (i + 1) & m
	}
	for j := (i + 1) & m; t[j].e != nil; j = (j + 1) & m {
		// The entry at j stays unless its home is cyclically outside
		// (i, j]: a search for it from there passes the free slot i.
		k := home(t, t[j].hash)
		if i <= j && (k <= i || k > j) || i > j && k <= i && k > j {
			t[i] = t[j]
			i = j
		}
	}
	t[i] = slot{}
}

// Get implements [kvstore.Store]. It returns ctx.Err() when ctx is done.
func (c *Scope) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return kvstore.Record{}, false, err
	}
	now := c.s.clock()
	h, sh := c.s.lockShard(key)
	defer sh.mu.Unlock()
	e := sh.find(c, key, h)
	if e == nil || now >= e.expires {
		return kvstore.Record{}, false, nil
	}
	return e.rec, true, nil
}

// Set implements [kvstore.Store]. It returns kvstore.ErrInvalidTTL for a ttl
// that is not positive and ctx.Err() when ctx is done.
func (c *Scope) Set(ctx context.Context, key string, rec kvstore.Record, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: got %v", kvstore.ErrInvalidTTL, ttl)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ttl = max(ttl, time.Millisecond)
	now := c.s.clock()
	h, sh := c.s.lockShard(key)
	defer sh.mu.Unlock()
	if e := sh.find(c, key, h); e != nil {
		e.rec, e.expires = rec, addNanos(now, int64(ttl))
		return nil
	}
	c.insert(sh, key, h, rec, addNanos(now, int64(ttl)), now)
	return nil
}

// Delete implements [kvstore.Store]. It returns ctx.Err() when ctx is done.
func (c *Scope) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h, sh := c.s.lockShard(key)
	defer sh.mu.Unlock()
	if e := sh.find(c, key, h); e != nil {
		sh.drop(e)
	}
	return nil
}

// Update implements [kvstore.Atomic] under the key's shard lock, on the
// store's clock (Config.Now). It returns the errors of [kvstore.Refill.Apply]
// and ctx.Err() when ctx is done.
func (c *Scope) Update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	ok, remaining, err := c.update(ctx, key, r, op, n)
	return kvstore.OpResult{OK: ok, Remaining: remaining}, err
}

// Take is [Scope.Update] with [kvstore.OpTake]: it takes n units from the
// bucket of key when it holds that many, and returns the OK and Remaining
// of Update's result (the only fields a bucket's update sets) as two
// values. A caller receives them in registers, where a [kvstore.OpResult],
// five words, goes through memory: tokenbucket's Limiter calls Take on its
// hot path when its store has it. It returns Update's errors.
func (c *Scope) Take(ctx context.Context, key string, r kvstore.Refill, n int64) (ok bool, remaining int64, err error) {
	return c.update(ctx, key, r, kvstore.OpTake, n)
}

// update is Update, with the result's two fields that a bucket sets (OK
// and Remaining) returned in registers.
func (c *Scope) update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (ok bool, remaining int64, err error) {
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	s := c.s
	var nowNano int64 // s.clock()
	if s.now != nil {
		nowNano = s.injected()
	} else {
		nowNano = s.base + int64(time.Since(s.start))
	}
	h := maphash.String(s.seed, key) // s.lockShard(key), inline
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	e, hot, rec, expires := sh.lookup(c, key, h)
	live := nowNano < expires
	if !live {
		rec = kvstore.Record{}
	}
	var (
		next  kvstore.Record
		write bool
	)
	if op == kvstore.OpTake && r.Rate >= 1 && r.Rate <= r.Burst && r.Burst <= kvstore.MaxValue && n >= 1 && n <= r.Burst {
		// The common update, a valid take, as Refill.Apply takes.
		level, at := r.Level(rec, live, micros(nowNano))
		if level >= n {
			ok, remaining, next, write = true, level-n, kvstore.Record{Value: level - n, Time: at}, true
		} else {
			remaining = level
		}
	} else {
		var res kvstore.OpResult
		res, next, write, err = r.Apply(rec, live, micros(nowNano), op, n)
		ok, remaining = res.OK, res.Remaining
	}
	switch {
	case err == nil && write && next.Value < r.Burst:
		if e == nil {
			// Only a write below full is stored: the absent key's
			// value is full.
			c.insert(sh, key, h, next, expiry(r, next), nowNano)
		} else {
			// The record goes into the key's entry even when that
			// entry had expired: the same keys as removing it and
			// inserting the key afresh, without the allocations (a
			// bucket that refills within microseconds expires between
			// most visits).
			sh.rewrite(e, hot, next, expiry(r, next))
		}
	case e != nil && (!live || err == nil && write):
		// An expired record that is not rewritten goes, and so does
		// a full one: an absent key reads as full.
		sh.drop(e)
	}
	sh.mu.Unlock()
	return ok, remaining, err
}

// expiry returns when the record next, written by an update with r, is full
// again, on the store clock in nanoseconds: it is current at next.Time (at
// most a stepped-back clock's distance from now) and full TimeToFull after.
// A bucket that fills later than the clock can count (the year 2262) never
// expires.
func expiry(r kvstore.Refill, next kvstore.Record) int64 {
	if next.Value >= r.Burst {
		return next.Time * 1000
	}
	// r.TimeToFull(next.Value): the gap and Rate are at most Burst, 2^52,
	// so quo's n is below 2^53 and the time at most 2^52 microseconds. A
	// Rate of 1 unit per microsecond (tokenbucket's whenever the refill
	// period in microseconds is a multiple of the tokens per period) needs
	// no division.
	gap := r.Burst - max(next.Value, 0)
	fill := gap // microseconds to refill gap at the usual Rate of 1
	if r.Rate > 1 {
		fill = quo(gap+r.Rate-1, r.Rate)
	}
	return addNanos(next.Time*1000, fill*1000)
}

// quo returns n / d rounded down, for n from 0 to 2^53−1 and d from 1 to
// 2^53, exactly and without the processor's 64-bit division, which takes
// tens of cycles. n and d are exact doubles, and rounding their quotient
// x = n/d is monotonic and keeps integers, so the rounded quotient lies
// between floor(x) and k = floor(x)+1. It is k only if x is within half an
// ulp of k; but k − x = δ/d with a whole δ ≥ 1, while half an ulp of x is
// at most x·2^-53 < k·2^-53 = (n+δ)/d·2^-53 ≤ δ/d for n < 2^53. The
// conversion, which truncates, therefore gives floor(x).
func quo(n, d int64) int64 { return int64(float64(n) / float64(d)) }

// addNanos returns at + d (nanoseconds, d ≥ 0), or the largest time when
// that overflows.
func addNanos(at, d int64) int64 {
	if d > math.MaxInt64-at {
		return math.MaxInt64
	}
	return at + d
}

// Len returns the number of keys held, expired ones not yet removed
// included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// insert adds key, whose hash is h and which the scope does not hold, with
// rec expiring at expires to sh, the key's shard, whose mutex the caller
// holds, evicting first when sh is full. The key is copied, so that no
// method keeps its caller's key string: a caller may build its key in a
// reused or stack buffer, and only an insert allocates for it.
func (c *Scope) insert(sh *shard, key string, h uint64, rec kvstore.Record, expires, now int64) {
	for len(sh.entries) >= sh.max {
		sh.evict(now)
	}
	e := newEntry(key)
	e.rec, e.expires, e.hash, e.scope, e.pos = rec, expires, h, c, int32(len(sh.entries))
	sh.index(e)
	sh.entries = append(sh.entries, e)
}

// drop marks e, an entry of sh, dead and takes it out of sh's index and
// list (and out of the shard's hot and last entries). The caller holds
// sh.mu.
func (sh *shard) drop(e *entry) {
	sh.unindex(e)
	e.dead = true
	if sh.hot == e {
		sh.hot = nil
	}
	if sh.last == e {
		sh.last = nil
	}
	last := len(sh.entries) - 1
	moved := sh.entries[last]
	sh.entries[e.pos], moved.pos = moved, e.pos
	sh.entries[last] = nil
	sh.entries = sh.entries[:last]
}

// evict samples up to five entries of sh, consecutive from a random
// position, and removes those past their time to live, or else the one that
// expires first: it removes at least one entry of a shard that holds any.
// The caller holds sh.mu.
func (sh *shard) evict(now int64) {
	n := len(sh.entries)
	if n == 0 {
		return
	}
	var (
		sample  [evictionSamples]*entry
		removed bool
	)
	start := rand.IntN(n)
	k := min(n, evictionSamples)
	for i := range k {
		sample[i] = sh.entries[(start+i)%n]
	}
	victim := -1
	for i, e := range sample[:k] {
		switch {
		case now >= e.expires:
			sh.drop(e)
			removed = true
		case victim < 0 || e.expires < sample[victim].expires:
			victim = i
		}
	}
	if !removed {
		sh.drop(sample[victim])
	}
}

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "memstore: invalid config: " and format's text: every configuration error of
// this package is made here.
func configErr(format string, args ...any) error {
	return fmt.Errorf("memstore: %w: %s", ratekit.ErrInvalidConfig, fmt.Sprintf(format, args...))
}
