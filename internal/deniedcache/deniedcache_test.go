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
			c.Put(strconv.Itoa(i), i, start, start.Add(time.Duration(i+1)*time.Second), nil)
			if n := c.Len(); n > size {
				t.Fatalf("size %d: %d entries after %d puts", size, n, i+1)
			}
		}
	}
}

func TestExpiry(t *testing.T) {
	c := New[int](4)
	c.Put("k", 7, start, start.Add(time.Second), nil)
	if v, exp, ok := c.Get("k", start.Add(time.Second-1)); !ok || v != 7 || !exp.Equal(start.Add(time.Second)) {
		t.Fatalf("Get before expiry = %d, %v, %v", v, exp, ok)
	}
	if _, _, ok := c.Get("k", start.Add(time.Second)); ok {
		t.Fatal("hit at the expiry time")
	}
	if c.Len() != 0 {
		t.Fatal("an expired entry was not removed")
	}
	c.Put("k", 1, start, start.Add(time.Second), nil)
	c.Remove("k")
	if _, _, ok := c.Get("k", start); ok {
		t.Fatal("a removed entry still answers")
	}
}

func TestKeep(t *testing.T) {
	c := New[int](4)
	smaller := func(v int) func(int) bool { return func(old int) bool { return old < v } }
	c.Put("k", 2, start, start.Add(time.Minute), smaller(2))
	c.Put("k", 4, start, start.Add(time.Minute), smaller(4))
	if v, _, _ := c.Get("k", start); v != 2 {
		t.Fatalf("value %d, want 2 kept", v)
	}
	c.Put("k", 1, start, start.Add(time.Minute), smaller(1))
	if v, _, _ := c.Get("k", start); v != 1 {
		t.Fatalf("value %d, want 1", v)
	}
	// An expired entry is replaced whatever keep says.
	c.Put("k", 9, start.Add(time.Minute), start.Add(2*time.Minute), smaller(9))
	if v, _, _ := c.Get("k", start.Add(time.Minute)); v != 9 {
		t.Fatalf("value %d, want 9 over an expired entry", v)
	}
}

// TestEviction: a full cache removes expired entries first, then the one
// that expires soonest.
func TestEviction(t *testing.T) {
	c := New[int](1)
	c.Put("a", 0, start, start.Add(time.Second), nil)
	c.Put("b", 0, start.Add(2*time.Second), start.Add(3*time.Second), nil)
	if _, _, ok := c.Get("b", start.Add(2*time.Second)); !ok || c.Len() != 1 {
		t.Fatal("a new entry did not replace an expired one")
	}
	c = New[int](2) // two shards of one entry, or one of two
	for i := range 100 {
		c.Put(fmt.Sprint(i), i, start, start.Add(time.Duration(i+1)*time.Second), nil)
	}
	if c.Len() > 2 {
		t.Fatalf("%d entries in a cache of 2", c.Len())
	}
}

func BenchmarkGet(b *testing.B) {
	c := New[int](1024)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprint("blocked-", i)
		c.Put(keys[i], i, start, start.Add(time.Hour), nil)
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
