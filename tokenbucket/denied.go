package tokenbucket

import (
	"time"

	"github.com/ratekit/ratekit/internal/deniedcache"
	"github.com/ratekit/ratekit/kvstore"
)

// denial is what a denied decision taught: the bucket held at most level
// units at sent (the local time the request was sent, which is no later than
// the store's decision), so it holds at most level + refill since sent now.
// Its entry in the denied cache expires at the denied request's retry time.
type denial struct {
	level int64
	sent  time.Time
}

// deniedCache is the Limiter's cache of denied keys.
type deniedCache struct{ c *deniedcache.Cache[denial] }

func newDeniedCache(size int) *deniedCache {
	return &deniedCache{deniedcache.New[denial](size)}
}

// lookup reports whether a request of n units for key can be denied without
// asking the store, with the most units the bucket can hold at now. When it
// cannot, it registers the request's decision (see deniedcache.Cache.Lookup)
// and returns its ticket: the caller asks the store, then calls finish.
func (c *deniedCache) lookup(key string, n int64, now time.Time, r kvstore.Refill) (level int64, hit bool, ticket uint64) {
	d, hit, ticket := c.c.Lookup(key, now, func(d denial) bool { return d.levelAt(now, r) < n })
	if !hit {
		return 0, false, ticket
	}
	return d.levelAt(now, r), true, 0
}

// levelAt returns the most units the bucket can hold at now: the level the
// denial saw, refilled since it was sent (the elapsed time rounded up to
// the microsecond, so that the estimate never falls below the store's).
func (d denial) levelAt(now time.Time, r kvstore.Refill) int64 {
	elapsed := (now.Sub(d.sent) + time.Microsecond - 1) / time.Microsecond
	level, _ := r.Level(kvstore.Record{Value: d.level, Time: 0}, true, max(int64(elapsed), 0))
	return level
}

// add records a denial of key that the store decided after ticket was
// taken, unless key changed since.
func (c *deniedCache) add(key string, level int64, sent, expires time.Time, ticket uint64) {
	c.c.Put(key, denial{level: level, sent: sent}, sent, expires, ticket, nil)
}

// begin registers a decision about key that asks the store and returns its
// ticket; 0 on a nil cache. Every begin is followed by one finish.
func (c *deniedCache) begin(key string) uint64 {
	if c == nil {
		return 0
	}
	return c.c.Begin(key)
}

// finish ends the decision begin registered; changed reports that the
// store may have changed the bucket (a take, a refund, a reset, or one of
// them that failed). A nil cache does nothing.
func (c *deniedCache) finish(key string, changed bool) {
	if c != nil {
		c.c.Finish(key, changed)
	}
}

// size returns the number of entries, for tests.
func (c *deniedCache) size() int { return c.c.Len() }
