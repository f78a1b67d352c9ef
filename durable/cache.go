package durable

import (
	"sync"
	"time"

	"github.com/ratekit/ratekit"
)

// deniedCache remembers denied keys until their RetryAfter has passed, so
// that a blocked client's further requests are answered from memory. It is
// bounded: when full, it drops expired entries and, failing that, an
// arbitrary one. Safe for concurrent use.
type deniedCache struct {
	mu      sync.Mutex
	max     int
	now     func() time.Time
	entries map[string]deniedEntry
}

type deniedEntry struct {
	until   time.Time // when a request of cost may be admitted again
	resetAt time.Time
	cost    int64 // the smallest cost denied
	d       ratekit.Decision
}

// evictScan is how many entries a full cache inspects for expired ones
// before it drops an arbitrary entry.
const evictScan = 32

func newDeniedCache(max int, now func() time.Time) *deniedCache {
	return &deniedCache{max: max, now: now, entries: make(map[string]deniedEntry)}
}

// get returns the cached denial of key for a request of cost, with
// RetryAfter and ResetAfter counted down to now.
func (c *deniedCache) get(key string, cost int64) (ratekit.Decision, bool) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && !now.Before(e.until) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	if !ok || cost < e.cost {
		return ratekit.Decision{}, false
	}
	d := e.d
	d.RetryAfter = e.until.Sub(now)
	d.ResetAfter = max(e.resetAt.Sub(now), d.RetryAfter)
	return d, true
}

// put records that a request of cost for key was denied with d.
func (c *deniedCache) put(key string, cost int64, d ratekit.Decision) {
	now := c.now()
	e := deniedEntry{until: now.Add(d.RetryAfter), resetAt: now.Add(d.ResetAfter), cost: cost, d: d}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[key]; ok && now.Before(old.until) && old.cost < cost {
		// Keep the entry for the smaller cost: it answers more requests.
		return
	}
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		c.evictLocked(now)
	}
	c.entries[key] = e
}

func (c *deniedCache) evictLocked(now time.Time) {
	var victim string
	n := 0
	for k, e := range c.entries {
		if !now.Before(e.until) {
			delete(c.entries, k)
			return
		}
		if n == 0 {
			victim = k
		}
		if n++; n >= evictScan {
			break
		}
	}
	delete(c.entries, victim)
}

func (c *deniedCache) remove(key string) {
	c.mu.Lock()
	delete(c.entries, key)
	c.mu.Unlock()
}

func (c *deniedCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
