package memstore

import "sync"

// keyIndex maps a scope's keys to their entries. It is a sync.Map, whose
// lookups take no lock and write no shared memory (a read lock would: two
// cores looking up different keys would still pass the lock's cache line
// back and forth); adding and removing keys is rarer than looking them up
// in a rate limiter's store. It is safe for concurrent use.
type keyIndex struct {
	m sync.Map // string → *entry
}

func newKeyIndex() *keyIndex { return &keyIndex{} }

// Load returns the entry of key, if any.
func (x *keyIndex) Load(key string) (*entry, bool) {
	v, ok := x.m.Load(key)
	if !ok {
		return nil, false
	}
	return v.(*entry), true
}

// LoadOrStore returns the entry of key if there is one (loaded is true), or
// else stores e as key's entry and returns it.
func (x *keyIndex) LoadOrStore(key string, e *entry) (actual *entry, loaded bool) {
	v, loaded := x.m.LoadOrStore(key, e)
	return v.(*entry), loaded
}

// Store makes e the entry of key.
func (x *keyIndex) Store(key string, e *entry) { x.m.Store(key, e) }

// CompareAndDelete removes key if its entry is e.
func (x *keyIndex) CompareAndDelete(key string, e *entry) { x.m.CompareAndDelete(key, e) }

// Range calls f for every key and its entry until f returns false, as
// sync.Map.Range does.
func (x *keyIndex) Range(f func(key string, e *entry) bool) {
	x.m.Range(func(k, v any) bool { return f(k.(string), v.(*entry)) })
}
