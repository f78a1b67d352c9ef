package deniedcache

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestBound(t *testing.T) {
	for _, size := range []int{1, 5, 16, 17, 100} {
		c := New[int](size)
		for i := 0; i < 50*size; i++ {
			c.Put(strconv.Itoa(i), i, start, start.Add(time.Duration(i+1)*time.Second), 0, nil)
			if n := c.Len(); n > size {
				t.Fatalf("size %d: %d entries after %d puts", size, n, i+1)
			}
		}
	}
}

func TestExpiry(t *testing.T) {
	c := New[int](4)
	c.Put("k", 7, start, start.Add(time.Second), 0, nil)
	if v, exp, ok := c.Get("k", start.Add(time.Second-1)); !ok || v != 7 || !exp.Equal(start.Add(time.Second)) {
		t.Fatalf("Get before expiry = %d, %v, %v", v, exp, ok)
	}
	if _, _, ok := c.Get("k", start.Add(time.Second)); ok {
		t.Fatal("hit at the expiry time")
	}
	if c.Len() != 0 {
		t.Fatal("an expired entry was not removed")
	}
	c.Put("k", 1, start, start.Add(time.Second), 0, nil)
	c.Begin("k")
	c.Finish("k", true)
	if _, _, ok := c.Get("k", start); ok {
		t.Fatal("an entry still answers after a change of its key")
	}
}

func TestKeep(t *testing.T) {
	c := New[int](4)
	smaller := func(v int) func(int) bool { return func(old int) bool { return old < v } }
	c.Put("k", 2, start, start.Add(time.Minute), 0, smaller(2))
	c.Put("k", 4, start, start.Add(time.Minute), 0, smaller(4))
	if v, _, _ := c.Get("k", start); v != 2 {
		t.Fatalf("value %d, want 2 kept", v)
	}
	c.Put("k", 1, start, start.Add(time.Minute), 0, smaller(1))
	if v, _, _ := c.Get("k", start); v != 1 {
		t.Fatalf("value %d, want 1", v)
	}
	// An expired entry is replaced whatever keep says.
	c.Put("k", 9, start.Add(time.Minute), start.Add(2*time.Minute), 0, smaller(9))
	if v, _, _ := c.Get("k", start.Add(time.Minute)); v != 9 {
		t.Fatalf("value %d, want 9 over an expired entry", v)
	}
}

// TestEviction: a full cache removes expired entries first, then the one
// that expires soonest.
func TestEviction(t *testing.T) {
	c := New[int](1)
	c.Put("a", 0, start, start.Add(time.Second), 0, nil)
	c.Put("b", 0, start.Add(2*time.Second), start.Add(3*time.Second), 0, nil)
	if _, _, ok := c.Get("b", start.Add(2*time.Second)); !ok || c.Len() != 1 {
		t.Fatal("a new entry did not replace an expired one")
	}
	c = New[int](2) // two shards of one entry, or one of two
	for i := range 100 {
		c.Put(fmt.Sprint(i), i, start, start.Add(time.Duration(i+1)*time.Second), 0, nil)
	}
	if c.Len() > 2 {
		t.Fatalf("%d entries in a cache of 2", c.Len())
	}
}

func BenchmarkGet(b *testing.B) {
	c := New[int](4096) // room to spare: keys spread over the shards unevenly, so 1024 in 1024 would evict some
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprint("blocked-", i)
		c.Put(keys[i], i, start, start.Add(time.Hour), 0, nil)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if _, _, ok := c.Get(keys[i%len(keys)], start); !ok {
				b.Error("miss")
				return
			}
		}
	})
}

// A denial decided before a change (its ticket taken before the change
// finished) is not stored after it; one decided after is.
func TestPutAfterChange(t *testing.T) {
	start := time.Unix(1000, 0)
	c := New[int](4)
	stale := c.Begin("k")
	c.Begin("k")
	c.Finish("k", true) // a refund, say, that returned first
	c.Put("k", 1, start, start.Add(time.Minute), stale, nil)
	c.Finish("k", false)
	if _, _, ok := c.Get("k", start); ok {
		t.Fatal("a denial whose ticket predates a change was stored")
	}
	fresh := c.Begin("k")
	c.Put("k", 2, start, start.Add(time.Minute), fresh, nil)
	c.Finish("k", false)
	if v, _, ok := c.Get("k", start); !ok || v != 2 {
		t.Fatalf("Get = %d, %v; want the denial decided after the change", v, ok)
	}
	// Another key's change does not refuse k's denials.
	other := c.Begin("k")
	c.Begin("other")
	c.Finish("other", true)
	c.Put("k", 3, start, start.Add(time.Minute), other, nil)
	c.Finish("k", false)
	if v, _, _ := c.Get("k", start); v != 3 {
		t.Fatalf("Get = %d after another key's change, want 3", v)
	}
}

// While a decision about a key is in flight, Get misses: the store may
// already show its change to other callers.
func TestGetMissesWhileInFlight(t *testing.T) {
	start := time.Unix(1000, 0)
	c := New[int](4)
	c.Put("k", 1, start, start.Add(time.Minute), c.Begin("k"), nil)
	c.Finish("k", false)
	c.Begin("k")
	if _, _, ok := c.Get("k", start); ok {
		t.Fatal("Get answered while a decision about the key was in flight")
	}
	c.Finish("k", true)
	if _, _, ok := c.Get("k", start); ok {
		t.Fatal("Get answered after a change")
	}
	if n := len(c.shards[0].inFlight); n != 0 {
		t.Fatalf("%d keys still in flight after every Finish", n)
	}
}

// Past maxChanged changed keys a shard forgets them and refuses every
// ticket taken before, rather than grow.
//
// (A change with no other decision about its key in flight is not
// remembered at all: TestPutAfterChange covers what it must refuse.)
func TestChangesAreBounded(t *testing.T) {
	start := time.Unix(1000, 0)
	c := New[int](1)
	old := c.Begin("k")
	for i := range 3 * maxChanged {
		// A change is remembered while another decision about its key
		// is in flight.
		k := strconv.Itoa(i)
		c.Begin(k)
		c.Begin(k)
		c.Finish(k, true)
		c.Finish(k, false)
	}
	if n := len(c.shards[0].changed); n > maxChanged {
		t.Fatalf("%d keys remembered, want at most %d", n, maxChanged)
	}
	c.Put("k", 1, start, start.Add(time.Minute), old, nil)
	c.Finish("k", false)
	if _, _, ok := c.Get("k", start); ok {
		t.Fatal("a ticket taken before forgotten changes was accepted")
	}
}
