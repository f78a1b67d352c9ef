package signedwindow

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
)

// replayCache remembers, within one process, the highest count issued for
// each (subject, window start) of window tokens, and the spent nonces and
// solved challenges, until they expire. Keys are 64-bit: a keyed hash
// (hash/maphash, random per process) of subject and window start for window
// tokens, the first 8 bytes of the MAC for nonces and challenges. It is split
// into shards, each a map plus a ring of its keys in insertion order; a full
// shard evicts its oldest entry (FIFO), expired or not, so memory stays
// bounded whatever clients send and no background goroutine is needed
// (Lambda freezes those anyway). Memory grows with the entries held, not
// with the configured size.
type replayCache struct {
	seed   maphash.Seed
	mask   uint64
	shards []replayShard
}

type replayShard struct {
	mu   sync.Mutex
	m    map[uint64]replayEntry
	ring []uint64 // keys in insertion order, used as a circular buffer
	next int      // index of the oldest key once the ring is full
	size int
}

type replayEntry struct {
	start   int64 // window tokens: the window's start, in Unix seconds
	count   int64 // window tokens: the highest count issued for the window
	expires int64 // Unix milliseconds; the entry is ignored from then on
}

// window is the window a request is counted in, as the cache resolves it.
type window struct {
	start, count int64
	expires      int64 // Unix milliseconds; recorded with a new count
	replayed     bool  // the token was older than one already issued
}

func newReplayCache(size int) *replayCache {
	n := 1
	for n < 16 && n*2 <= size {
		n *= 2
	}
	c := &replayCache{seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]replayShard, n)}
	for i := range c.shards {
		s := size / n
		if i < size%n {
			s++
		}
		c.shards[i].size = s
		c.shards[i].m = make(map[uint64]replayEntry)
	}
	return c
}

// windowKey returns the cache key of a subject's window entry. One entry
// per subject holds its latest window, so that requests without a valid
// token join the window this process is already counting.
func (c *replayCache) windowKey(subject string) uint64 {
	return maphash.String(c.seed, subject)
}

// macKey returns the cache key of a nonce or challenge.
func macKey(mac [macLen]byte) uint64 { return binary.LittleEndian.Uint64(mac[:8]) }

func (c *replayCache) shard(key uint64) *replayShard {
	return &c.shards[key&c.mask]
}

// insert stores e under key; the caller holds s.mu.
func (s *replayShard) insert(key uint64, e replayEntry) {
	if _, ok := s.m[key]; ok {
		s.m[key] = e
		return
	}
	if len(s.ring) < s.size {
		// The ring grows with use, never past size, so a large size
		// reserves nothing up front.
		if len(s.ring) == cap(s.ring) {
			ring := make([]uint64, len(s.ring), min(max(2*cap(s.ring), 16), s.size))
			copy(ring, s.ring)
			s.ring = ring
		}
		s.ring = append(s.ring, key)
	} else {
		delete(s.m, s.ring[s.next])
		s.ring[s.next] = key
		s.next = (s.next + 1) % s.size
	}
	s.m[key] = e
}

// resolve returns the window to count a request in, given the window w
// its token carries (valid reports whether the token was accepted; when it
// was not, w is a fresh window starting now with count 0). The caller holds
// s.mu. A live entry for the subject wins over a fresh window (a request
// without a valid token joins the window being counted), and over a token
// of the same or an earlier window whose count is lower (a replayed token,
// or one shared by two tabs); a token of a later window replaces the entry.
func (s *replayShard) resolve(key uint64, valid bool, w window, now int64) window {
	e, ok := s.m[key]
	if !ok || e.expires <= now {
		return w
	}
	switch {
	case !valid, e.start > w.start:
		return window{start: e.start, count: e.count, expires: e.expires, replayed: valid}
	case e.start == w.start && e.count > w.count:
		return window{start: e.start, count: e.count, expires: e.expires, replayed: true}
	}
	return w
}

// spend counts cost units for a subject with cache key key, atomically
// within this process, in the window resolve picks. When the cost fits in
// limit it records the new count. It returns the window with the count used
// before this request, and whether the cost was admitted.
func (c *replayCache) spend(key uint64, valid bool, w window, cost, limit, now int64) (window, bool) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	w = s.resolve(key, valid, w, now)
	allowed := w.count <= limit-cost
	if allowed {
		s.insert(key, replayEntry{start: w.start, count: w.count + cost, expires: w.expires})
	}
	return w, allowed
}

// peek returns the window spend would use, without spending.
func (c *replayCache) peek(key uint64, valid bool, w window, now int64) window {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resolve(key, valid, w, now)
}

// refund gives cost units back in the window resolve picks for an accepted
// token (the one Allow would have charged) and returns that window with the
// count after the refund. It records the lowered count as the latest issued,
// unless the cache remembers an earlier live window for the subject: a
// refund never moves the window the subject is counted in, so the token's
// later window (issued by another instance) is left for Allow to adopt.
func (c *replayCache) refund(key uint64, w window, cost, now int64) window {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	w = s.resolve(key, true, w, now)
	w.count = max(w.count-cost, 0)
	if e, ok := s.m[key]; ok && e.expires > now && e.start != w.start {
		return w
	}
	s.insert(key, replayEntry{start: w.start, count: w.count, expires: w.expires})
	return w
}

// claim marks a single-use value (a nonce, a solved challenge) as used and
// reports whether it had been used already.
func (c *replayCache) claim(key uint64, expires, now int64) bool {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[key]; ok && e.expires > now {
		return true
	}
	s.insert(key, replayEntry{expires: expires})
	return false
}
