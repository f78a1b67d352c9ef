// Package deniedcache is the in-process cache of recently denied keys that
// tokenbucket and durable keep in front of their stores: a blocked client's
// further requests are answered from memory until the denial's retry time.
//
// A [Cache] is bounded, sharded by key and runs no goroutine. Entries expire
// when a Get finds them expired or a full shard needs room; a full shard
// evicts by one rule: among five sampled entries, the expired ones, or else
// the one that expires first.
//
// A cached denial must never be answered once a change of its key that it
// did not see could have been observed. So every decision that asks the
// store about a key is registered for the time of its round trip:
// [Cache.Begin] before the store call returns a ticket, [Cache.Finish]
// after it says whether the store may have changed the key (an admission,
// a refund, a reset, or a call that failed). While a decision about a key is
// in flight, [Cache.Get] misses for that key, so no answer from memory
// races a change that the store may already show other callers; Finish of a
// change forgets the key and refuses every [Cache.Put] whose ticket was
// taken before it, so a denial decided before the change is never stored
// after it.
package deniedcache

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"time"
)

// maxShards is the most lock shards a Cache uses.
const maxShards = 16

// sample is how many entries a full shard inspects to make room.
const sample = 5

// maxChanged is how many changed keys a shard remembers; past that it
// forgets them all and refuses every ticket taken before (a denial that is
// then not cached only costs its next request a round trip).
const maxChanged = 256

// Cache maps keys to values of type V until an expiry time. It is safe for
// concurrent use.
type Cache[V any] struct {
	seed   maphash.Seed
	mask   uint64
	shards []shard[V]
}

type shard[V any] struct {
	mu      sync.Mutex
	max     int
	entries map[string]entry[V]
	// inFlight counts the decisions registered for each key.
	inFlight map[string]int
	// gen counts the shard's changes; changed holds, for the keys changed
	// since floor, the gen their last change made.
	gen     uint64
	changed map[string]uint64
	floor   uint64
}

type entry[V any] struct {
	v       V
	expires time.Time
}

// New returns a Cache of at most size keys; size must be at least 1.
func New[V any](size int) *Cache[V] {
	n := 1 << (bits.Len(uint(min(size, maxShards))) - 1) // a power of two, at most size
	c := &Cache[V]{seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]shard[V], n)}
	for i := range c.shards {
		c.shards[i].max = size / n
		if i < size%n {
			c.shards[i].max++
		}
		c.shards[i].entries = make(map[string]entry[V])
		c.shards[i].changed = make(map[string]uint64)
		c.shards[i].inFlight = make(map[string]int)
	}
	return c
}

func (c *Cache[V]) shard(key string) *shard[V] {
	return &c.shards[maphash.String(c.seed, key)&c.mask]
}

// Get returns the value of key and its expiry when the entry has not expired
// at now and no decision about key is in flight. It removes an expired
// entry.
func (c *Cache[V]) Get(key string, now time.Time) (v V, expires time.Time, ok bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.inFlight[key] > 0 {
		return v, time.Time{}, false
	}
	e, ok := sh.entries[key]
	if !ok {
		return v, time.Time{}, false
	}
	if !now.Before(e.expires) {
		delete(sh.entries, key)
		return v, time.Time{}, false
	}
	return e.v, e.expires, true
}

// Lookup is Get and Begin under one lock: it returns key's entry when the
// entry has not expired at now, no decision about key is in flight and hit
// reports that it answers the caller (ok true, nothing registered), and
// otherwise registers the caller's decision and returns its ticket, for
// [Cache.Put] and [Cache.Finish].
func (c *Cache[V]) Lookup(key string, now time.Time, hit func(V) bool) (v V, ok bool, ticket uint64) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.inFlight[key] == 0 {
		if e, found := sh.entries[key]; found {
			if !now.Before(e.expires) {
				delete(sh.entries, key)
			} else if hit(e.v) {
				return e.v, true, 0
			}
		}
	}
	sh.inFlight[key]++
	return v, false, sh.gen
}

// Begin registers a decision about key that is about to ask the store and
// returns its ticket, for [Cache.Put] and [Cache.Finish]. Every Begin must
// be followed by one Finish.
func (c *Cache[V]) Begin(key string) (ticket uint64) {
	sh := c.shard(key)
	sh.mu.Lock()
	sh.inFlight[key]++
	ticket = sh.gen
	sh.mu.Unlock()
	return ticket
}

// Finish ends the decision about key that Begin registered. When changed
// (the store may have changed key), it forgets key's entry and refuses every
// later Put of key whose ticket was taken before this call.
func (c *Cache[V]) Finish(key string, changed bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	others := sh.inFlight[key] - 1 // other decisions about key in flight
	if others > 0 {
		sh.inFlight[key] = others
	} else {
		delete(sh.inFlight, key)
	}
	if changed {
		delete(sh.entries, key)
		sh.gen++
		// Only a decision still in flight can Put a denial that predates
		// this change (callers Put before they Finish, and the entry a
		// finished one stored is deleted above), so the change is
		// remembered only when there is one.
		if others > 0 {
			if len(sh.changed) >= maxChanged {
				clear(sh.changed)
				sh.floor = sh.gen
			} else {
				sh.changed[key] = sh.gen
			}
		}
	}
	sh.mu.Unlock()
}

// Put stores v under key until expires, unless key changed (see
// [Cache.Finish]) after ticket was taken, or keep is not nil and reports true for the value of an
// entry of key that has not expired at now. A full shard first makes room by
// the package's eviction rule.
func (c *Cache[V]) Put(key string, v V, now, expires time.Time, ticket uint64, keep func(old V) bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ticket < sh.floor || sh.changed[key] > ticket {
		return
	}
	old, exists := sh.entries[key]
	if exists && keep != nil && now.Before(old.expires) && keep(old.v) {
		return
	}
	if !exists && len(sh.entries) >= sh.max {
		sh.evict(now)
	}
	sh.entries[key] = entry[V]{v: v, expires: expires}
}

// Len returns the number of entries, expired ones included.
func (c *Cache[V]) Len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].entries)
		c.shards[i].mu.Unlock()
	}
	return n
}

// evict removes the expired entries among sample ones, or else the sampled
// entry that expires first. The caller holds sh.mu.
func (sh *shard[V]) evict(now time.Time) {
	var (
		victim    string
		victimExp time.Time
		found     bool
		removed   bool
		sampled   int
	)
	for k, e := range sh.entries {
		switch {
		case !now.Before(e.expires):
			delete(sh.entries, k)
			removed = true
		case !found || e.expires.Before(victimExp):
			victim, victimExp, found = k, e.expires, true
		}
		if sampled++; sampled == sample {
			break
		}
	}
	if !removed && found {
		delete(sh.entries, victim)
	}
}
