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
	"runtime"
	"strings"
	"sync"
	"time"

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
// Every key has an entry with its own mutex, on the same cache line as the
// record it guards, and an index from key to entry (a [sync.Map], whose
// lookups take no lock). An operation on a key that the store holds,
// [Store.Update] included, finds the entry without a lock and runs under
// that entry's mutex: it is atomic, and operations on different keys do not
// wait for each other. Adding and removing keys also takes the lock of one
// of up to 64 shards, which keeps the bound.
//
// Bound and eviction: the store never holds more than MaxKeys keys (each
// shard holds at most its share). When a new key arrives at a full shard,
// the shard samples five of its entries (consecutive from a random position
// in the shard's list of entries, which is in no order) and removes every
// sampled entry past its time to live; if none was, it removes the sampled
// entry that expires first. For a token bucket that entry is the bucket
// nearest to full, the one whose loss changes the fewest decisions, since an
// absent bucket reads as full. This is the sampled eviction Redis uses for
// maxmemory, with time to live as the score. An entry that another goroutine
// is using at that moment is not a candidate.
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
// whose key k stands for the store's key prefix+k, with its own index, so
// that an operation finds the key without building prefix+k. A Scope shares
// its Store's clock, key bound ([Config.MaxKeys]) and eviction; its methods
// have the Store's semantics and errors. It is safe for concurrent use.
//
// A key written through a Scope is held in that Scope only: the Store's own
// methods (the scope of the empty prefix) do not see it under prefix+k, and
// the same holds between scopes whose prefixes overlap. Every user of one
// prefix must therefore go through [Store.Prefixed] (tokenbucket does, through
// [kvstore.Prefixer]).
type Scope struct {
	s     *Store
	index *keyIndex
}

// A shard keeps the bound for its keys: it lists their entries, so that
// eviction can sample them.
type shard struct {
	mu      sync.Mutex
	max     int
	entries []*entry // in no order; entries[e.pos] == e
	_       [24]byte // keep shards on separate cache lines
}

// An entry holds one key's record. An entry that is removed is marked dead
// under its mutex and never written again; an operation that locks a dead
// entry looks the key up again.
type entry struct {
	mu      sync.Mutex
	rec     kvstore.Record
	expires int64  // store clock, nanoseconds since the Unix epoch
	key     string // immutable, owned by the store
	scope   *Scope // immutable: the index that holds the entry
	pos     int    // index in the shard's entries; guarded by the shard's mu
	dead    bool   // guarded by mu
}

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
	s.Scope = Scope{s: s, index: newKeyIndex()}
	if s.now == nil {
		s.start = time.Now()
		s.base = s.start.UnixNano()
	}
	for i := range s.shards {
		s.shards[i].max = maxKeys / n
		if i < maxKeys%n {
			s.shards[i].max++
		}
	}
	return s, nil
}

// clock returns the store's time in nanoseconds since the Unix epoch.
func (s *Store) clock() int64 {
	if s.now == nil {
		return s.base + int64(time.Since(s.start))
	}
	return s.now().UnixNano()
}

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
		sc = &Scope{s: s, index: newKeyIndex()}
		s.scopes[prefix] = sc
	}
	return sc
}

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)&s.mask]
}

// lock returns the live entry of key locked, or nil when the scope does not
// hold key.
func (c *Scope) lock(key string) *entry {
	for {
		e, ok := c.index.Load(key)
		if !ok {
			return nil
		}
		e.mu.Lock()
		if !e.dead {
			return e
		}
		e.mu.Unlock()
	}
}

// Get implements [kvstore.Store]. It returns ctx.Err() when ctx is done.
func (c *Scope) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	if err := ctx.Err(); err != nil {
		return kvstore.Record{}, false, err
	}
	now := c.s.clock()
	e := c.lock(key)
	if e == nil {
		return kvstore.Record{}, false, nil
	}
	defer e.mu.Unlock()
	if now >= e.expires {
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
	for {
		if e := c.lock(key); e != nil {
			e.rec, e.expires = rec, addNanos(now, int64(ttl))
			e.mu.Unlock()
			return nil
		}
		if c.insert(key, rec, addNanos(now, int64(ttl)), now) {
			return nil
		}
	}
}

// Delete implements [kvstore.Store]. It returns ctx.Err() when ctx is done.
func (c *Scope) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if e := c.lock(key); e != nil {
		c.s.remove(e)
		e.mu.Unlock()
	}
	return nil
}

// Update implements [kvstore.Atomic] under the key's entry lock, on the
// store's clock (Config.Now). It returns the errors of [kvstore.Refill.Apply]
// and ctx.Err() when ctx is done.
func (c *Scope) Update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	if err := ctx.Err(); err != nil {
		return kvstore.OpResult{}, err
	}
	s := c.s
	nowNano := s.clock()
	nowMicro := nowNano / 1000
	if nowNano < 0 && nowNano%1000 != 0 {
		nowMicro-- // time.Time.UnixMicro rounds down
	}
	for {
		e := c.lock(key)
		if e == nil {
			// The key is absent: the value is full. Only a write
			// below full is stored; another goroutine may add the key
			// first, and then the update runs on its entry.
			res, next, write, err := r.Apply(kvstore.Record{}, false, nowMicro, op, n)
			if err != nil || !write || next.Value >= r.Burst {
				return res, err
			}
			if c.insert(key, next, expiry(r, next), nowNano) {
				return res, nil
			}
			continue
		}
		live := nowNano < e.expires
		var rec kvstore.Record
		if live {
			rec = e.rec
		}
		res, next, write, err := r.Apply(rec, live, nowMicro, op, n)
		switch {
		case err == nil && write && next.Value < r.Burst:
			// The record goes into the key's entry even when that
			// entry had expired: the same keys as removing it and
			// inserting the key afresh, without the allocations (a
			// bucket that refills within microseconds expires between
			// most visits).
			e.rec, e.expires = next, expiry(r, next)
		case !live || err == nil && write:
			// An expired record that is not rewritten goes, and so
			// does a full one: an absent key reads as full.
			s.remove(e)
		}
		e.mu.Unlock()
		return res, err
	}
}

// expiry returns when the record next, written by an update with r, is full
// again, on the store clock in nanoseconds: it is current at next.Time (at
// most a stepped-back clock's distance from now) and full TimeToFull after.
// A bucket that fills later than the clock can count (the year 2262) never
// expires.
func expiry(r kvstore.Refill, next kvstore.Record) int64 {
	return addNanos(next.Time*1000, int64(r.TimeToFull(next.Value)))
}

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

// insert adds key with rec, expiring at expires, evicting first when the
// key's shard is full. It returns false, adding nothing, when another
// goroutine added key first. The key is copied, so that no method keeps its
// caller's key string: a caller may build its key in a reused or stack
// buffer, and only an insert allocates for it.
func (c *Scope) insert(key string, rec kvstore.Record, expires, now int64) bool {
	s := c.s
	e := &entry{rec: rec, expires: expires, key: strings.Clone(key), scope: c}
	// e stays locked until it is in the index: an eviction that found it
	// in the shard's list before would otherwise remove it and let a dead
	// entry be published.
	e.mu.Lock()
	defer e.mu.Unlock()
	sh := s.shard(key)
	sh.mu.Lock()
	for len(sh.entries) >= sh.max && !sh.evict(s, now) {
		// Every entry that eviction could take is in use, and its
		// user may be waiting for sh.mu to remove it: let it run.
		sh.mu.Unlock()
		runtime.Gosched()
		sh.mu.Lock()
	}
	e.pos = len(sh.entries)
	sh.entries = append(sh.entries, e)
	sh.mu.Unlock()
	if _, loaded := c.index.LoadOrStore(e.key, e); loaded {
		s.remove(e)
		return false
	}
	return true
}

// remove marks e dead and takes it out of the index and of its shard. The
// caller holds e.mu, and not the shard's mu.
func (s *Store) remove(e *entry) {
	sh := s.shard(e.key)
	sh.mu.Lock()
	sh.drop(s, e)
	sh.mu.Unlock()
}

// drop marks e dead and takes it out of the index and of sh. The caller
// holds e.mu and sh.mu.
func (sh *shard) drop(s *Store, e *entry) {
	e.dead = true
	last := len(sh.entries) - 1
	moved := sh.entries[last]
	sh.entries[e.pos], moved.pos = moved, e.pos
	sh.entries[last] = nil
	sh.entries = sh.entries[:last]
	e.scope.index.CompareAndDelete(e.key, e)
}

// evict samples up to five entries of sh, consecutive from a random
// position, and removes those past their time to live, or else the one that
// expires first. Entries in use (locked) are skipped. It reports whether it
// removed an entry. The caller holds sh.mu.
func (sh *shard) evict(s *Store, now int64) bool {
	n := len(sh.entries)
	if n == 0 {
		return false
	}
	var (
		held    [evictionSamples]*entry
		locked  int
		removed bool
	)
	start := rand.IntN(n)
	for i := 0; i < min(n, evictionSamples); i++ {
		e := sh.entries[(start+i)%n]
		if !e.mu.TryLock() {
			continue
		}
		held[locked] = e
		locked++
	}
	victim := -1
	for i, e := range held[:locked] {
		switch {
		case now >= e.expires:
			sh.drop(s, e)
			removed = true
		case victim < 0 || e.expires < held[victim].expires:
			victim = i
		}
	}
	if !removed && victim >= 0 {
		sh.drop(s, held[victim])
		removed = true
	}
	for _, e := range held[:locked] {
		e.mu.Unlock()
	}
	return removed
}

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "memstore: invalid config: " and format's text: every configuration error of
// this package is made here.
func configErr(format string, args ...any) error {
	return fmt.Errorf("memstore: %w: %s", ratekit.ErrInvalidConfig, fmt.Sprintf(format, args...))
}
