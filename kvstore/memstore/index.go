package memstore

import (
	"hash/maphash"
	"sync"
)

// indexShards is the number of maps a keyIndex spreads its keys over.
const indexShards = 64

// keyIndex maps a scope's keys to their entries: 64 maps, each guarded by
// its own read-write mutex, the key's hash choosing one. A lookup takes one
// shard's read lock; adding and removing a key, its write lock. It is safe
// for concurrent use.
type keyIndex struct {
	seed   maphash.Seed
	shards [indexShards]struct {
		mu sync.RWMutex
		m  map[string]*entry
		_  [32]byte // a shard per 64-byte cache line
	}
}

func newKeyIndex() *keyIndex {
	x := &keyIndex{seed: maphash.MakeSeed()}
	for i := range x.shards {
		x.shards[i].m = make(map[string]*entry)
	}
	return x
}

func (x *keyIndex) shard(key string) int { return int(maphash.String(x.seed, key) % indexShards) }

// Load returns the entry of key, if any.
func (x *keyIndex) Load(key string) (*entry, bool) {
	sh := &x.shards[x.shard(key)]
	sh.mu.RLock()
	e, ok := sh.m[key]
	sh.mu.RUnlock()
	return e, ok
}

// LoadOrStore returns the entry of key if there is one (loaded is true), or
// else stores e as key's entry and returns it.
func (x *keyIndex) LoadOrStore(key string, e *entry) (actual *entry, loaded bool) {
	sh := &x.shards[x.shard(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old, ok := sh.m[key]; ok {
		return old, true
	}
	sh.m[key] = e
	return e, false
}

// Store makes e the entry of key.
func (x *keyIndex) Store(key string, e *entry) {
	sh := &x.shards[x.shard(key)]
	sh.mu.Lock()
	sh.m[key] = e
	sh.mu.Unlock()
}

// CompareAndDelete removes key if its entry is e.
func (x *keyIndex) CompareAndDelete(key string, e *entry) {
	sh := &x.shards[x.shard(key)]
	sh.mu.Lock()
	if sh.m[key] == e {
		delete(sh.m, key)
	}
	sh.mu.Unlock()
}

// Range calls f for every key and its entry until f returns false. It sees
// each shard as it was when Range reached it, and holds no lock while f runs.
func (x *keyIndex) Range(f func(key string, e *entry) bool) {
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		keys := make([]string, 0, len(sh.m))
		entries := make([]*entry, 0, len(sh.m))
		for k, e := range sh.m {
			keys = append(keys, k)
			entries = append(entries, e)
		}
		sh.mu.RUnlock()
		for j, k := range keys {
			if !f(k, entries[j]) {
				return
			}
		}
	}
}
