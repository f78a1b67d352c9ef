package tokenbucket

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// maxDeniedShards is the most lock shards a deniedCache uses.
const maxDeniedShards = 16

// deniedCache remembers recently denied keys until their retry time. It is
// safe for concurrent use, bounded, and runs no goroutine: entries expire
// when a lookup finds them expired or a full shard needs room.
type deniedCache struct {
	seed   maphash.Seed
	mask   uint64
	shards []deniedShard
}

type deniedShard struct {
	mu      sync.Mutex
	max     int
	entries map[string]denial
}

// denial is what a denied decision taught: the bucket held at most level
// units at sent (the local time the request was sent, which is no later than
// the store's decision), so it holds at most level + refill since sent now.
type denial struct {
	level   int64
	sent    time.Time
	expires time.Time // the retry time of the denied request
}

// newDeniedCache returns a cache of at most size keys (size >= 1).
func newDeniedCache(size int) *deniedCache {
	n := 1 << (bits.Len(uint(min(size, maxDeniedShards))) - 1) // a power of two, at most size
	c := &deniedCache{seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]deniedShard, n)}
	for i := range c.shards {
		c.shards[i].max = size / n
		if i < size%n {
			c.shards[i].max++
		}
		c.shards[i].entries = make(map[string]denial)
	}
	return c
}

func (c *deniedCache) shard(key string) *deniedShard {
	return &c.shards[maphash.String(c.seed, key)&c.mask]
}

// lookup reports whether a request of n units for key can be denied without
// asking the store, and the most units the bucket can hold at now. When it
// cannot, it removes the entry: the request goes to the store, and the
// store's answer is what the cache learns next.
func (c *deniedCache) lookup(key string, n int64, now time.Time, r kvstore.Refill) (level int64, hit bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	d, ok := sh.entries[key]
	if !ok {
		return 0, false
	}
	if !now.Before(d.expires) {
		delete(sh.entries, key)
		return 0, false
	}
	// Round the elapsed time up to the microsecond: the estimate must never
	// fall below what the store could hold.
	elapsed := (now.Sub(d.sent) + time.Microsecond - 1) / time.Microsecond
	level, _ = r.Level(kvstore.Record{Value: d.level, Time: 0}, true, max(int64(elapsed), 0))
	if level >= n {
		// The request goes to the store, which may admit it; its answer
		// replaces what this entry knows.
		delete(sh.entries, key)
		return level, false
	}
	return level, true
}

func (c *deniedCache) add(key string, level int64, sent, expires time.Time) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, exists := sh.entries[key]; !exists && len(sh.entries) >= sh.max {
		sh.evict(sent)
	}
	sh.entries[key] = denial{level: level, sent: sent, expires: expires}
}

func (c *deniedCache) remove(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.entries, key)
	sh.mu.Unlock()
}

// evict removes the expired entries among five sampled ones, or else the
// sampled entry that expires first. The caller holds sh.mu.
func (sh *deniedShard) evict(now time.Time) {
	var (
		victim    string
		victimExp time.Time
		found     bool
		removed   bool
		sampled   int
	)
	for k, d := range sh.entries {
		switch {
		case !now.Before(d.expires):
			delete(sh.entries, k)
			removed = true
		case !found || d.expires.Before(victimExp):
			victim, victimExp, found = k, d.expires, true
		}
		if sampled++; sampled == 5 {
			break
		}
	}
	if !removed && found {
		delete(sh.entries, victim)
	}
}

// size returns the number of entries, for tests.
func (c *deniedCache) size() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].entries)
		c.shards[i].mu.Unlock()
	}
	return n
}
