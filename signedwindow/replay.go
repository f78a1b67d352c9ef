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
// (Lambda freezes those anyway).
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
	count   int64 // window tokens: the highest count issued for the window
	expires int64 // Unix milliseconds; the entry is ignored from then on
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
		c.shards[i].ring = make([]uint64, 0, s)
	}
	return c
}

// windowKey returns the cache key of a subject's window.
func (c *replayCache) windowKey(subject string, start int64) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(subject)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(start))
	h.Write(b[:])
	return h.Sum64()
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
		s.ring = append(s.ring, key)
	} else {
		delete(s.m, s.ring[s.next])
		s.ring[s.next] = key
		s.next = (s.next + 1) % s.size
	}
	s.m[key] = e
}

// spend counts cost units in the window with cache key key, for a token
// carrying tokenCount, atomically within this process: the count used is
// the larger of tokenCount and the highest count this process issued for
// the window. When the cost fits in limit it records the new count. It
// returns the count used before this request, whether the cost was admitted
// and whether the token was older than one already issued (a replay, or a
// second tab).
func (c *replayCache) spend(key uint64, tokenCount, cost, limit, expires, now int64) (count int64, allowed, replayed bool) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	count = tokenCount
	if e, ok := s.m[key]; ok && e.expires > now && e.count > tokenCount {
		replayed = true
		count = e.count
	}
	allowed = count <= limit-cost
	if allowed {
		s.insert(key, replayEntry{count: count + cost, expires: expires})
	}
	return count, allowed, replayed
}

// count returns the count to use for a window token without spending.
func (c *replayCache) count(key uint64, tokenCount, now int64) (int64, bool) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[key]; ok && e.expires > now && e.count > tokenCount {
		return e.count, true
	}
	return tokenCount, false
}

// refund gives cost units back in the window with cache key key, for a
// token carrying tokenCount, and records the lowered count as the latest
// issued. It returns the count after the refund and whether the token was
// older than one already issued.
func (c *replayCache) refund(key uint64, tokenCount, cost, expires, now int64) (int64, bool) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	count, replayed := tokenCount, false
	if e, ok := s.m[key]; ok && e.expires > now && e.count > tokenCount {
		count, replayed = e.count, true
	}
	count = max(count-cost, 0)
	s.insert(key, replayEntry{count: count, expires: expires})
	return count, replayed
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
