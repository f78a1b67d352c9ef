// Package deniedcache is the in-process cache of recently denied keys that
// tokenbucket and durable keep in front of their stores: a blocked client's
// further requests are answered from memory until the denial's retry time.
//
// A [Cache] is bounded, sharded by key and runs no goroutine. Entries expire
// when a Get finds them expired or a full shard needs room; a full shard
// evicts by one rule: among five sampled entries, the expired ones, or else
// the one that expires first.
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
	}
	return c
}

func (c *Cache[V]) shard(key string) *shard[V] {
	return &c.shards[maphash.String(c.seed, key)&c.mask]
}

// Get returns the value of key and its expiry when the entry has not expired
// at now. It removes an expired entry.
func (c *Cache[V]) Get(key string, now time.Time) (v V, expires time.Time, ok bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
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

// Put stores v under key until expires, unless keep is not nil and reports
// true for the value of an entry of key that has not expired at now. A full
// shard first makes room by the package's eviction rule.
func (c *Cache[V]) Put(key string, v V, now, expires time.Time, keep func(old V) bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	old, exists := sh.entries[key]
	if exists && keep != nil && now.Before(old.expires) && keep(old.v) {
		return
	}
	if !exists && len(sh.entries) >= sh.max {
		sh.evict(now)
	}
	sh.entries[key] = entry[V]{v: v, expires: expires}
}

// Remove forgets key.
func (c *Cache[V]) Remove(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.entries, key)
	sh.mu.Unlock()
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
