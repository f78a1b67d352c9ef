package durable

import (
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/deniedcache"
)

// deniedCache remembers denied keys until their RetryAfter has passed, so
// that a blocked client's further requests are answered from memory. It is
// bounded and evicts by the rule of package internal/deniedcache, shared
// with tokenbucket. Safe for concurrent use.
type deniedCache struct {
	now func() time.Time
	c   *deniedcache.Cache[deniedEntry]
}

// deniedEntry expires when a request of cost may be admitted again.
type deniedEntry struct {
	resetAt time.Time
	cost    int64 // the smallest cost denied
	d       ratekit.Decision
}

func newDeniedCache(max int, now func() time.Time) *deniedCache {
	return &deniedCache{now: now, c: deniedcache.New[deniedEntry](max)}
}

// get returns the cached denial of key for a request of cost, with
// RetryAfter and ResetAfter counted down to now.
func (c *deniedCache) get(key string, cost int64) (ratekit.Decision, bool) {
	now := c.now()
	e, until, ok := c.c.Get(key, now)
	if !ok || cost < e.cost {
		return ratekit.Decision{}, false
	}
	d := e.d
	d.RetryAfter = until.Sub(now)
	d.ResetAfter = max(e.resetAt.Sub(now), d.RetryAfter)
	return d, true
}

// put records that a request of cost for key was denied with d, unless
// key changed after ticket (taken before the request's round trip).
// An entry for a smaller cost that has not expired stays: it answers more
// requests.
func (c *deniedCache) put(key string, cost int64, d ratekit.Decision, ticket uint64) {
	now := c.now()
	e := deniedEntry{resetAt: now.Add(d.ResetAfter), cost: cost, d: d}
	c.c.Put(key, e, now, now.Add(d.RetryAfter), ticket, func(old deniedEntry) bool { return old.cost < cost })
}

func (c *deniedCache) len() int { return c.c.Len() }

// begin registers a decision about key that asks the database and returns
// its ticket; 0 on a nil cache. Every begin is followed by one finish.
func (c *deniedCache) begin(key string) uint64 {
	if c == nil {
		return 0
	}
	return c.c.Begin(key)
}

// finish ends the decision begin registered; changed reports that the
// database may have changed the key (an admission, a refund, a reset, or
// one of them that failed). A nil cache does nothing.
func (c *deniedCache) finish(key string, changed bool) {
	if c != nil {
		c.c.Finish(key, changed)
	}
}
