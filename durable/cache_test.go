package durable

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

func TestDeniedCacheUnit(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	denial := func(retry time.Duration) ratekit.Decision {
		return ratekit.Decision{Quota: 5, RetryAfter: retry, ResetAfter: 2 * retry}
	}
	c := newDeniedCache(3, clock)

	c.put("a", 2, denial(10*time.Second), 0)
	tests := []struct {
		name  string
		key   string
		cost  int64
		hit   bool
		retry time.Duration
	}{
		{"same cost", "a", 2, true, 10 * time.Second},
		{"larger cost", "a", 5, true, 10 * time.Second},
		{"smaller cost may fit", "a", 1, false, 0},
		{"unknown key", "b", 2, false, 0},
	}
	for _, tt := range tests {
		d, ok := c.get(tt.key, tt.cost)
		if ok != tt.hit || d.RetryAfter != tt.retry {
			t.Errorf("%s: get = %+v, %v; want hit %v RetryAfter %v", tt.name, d, ok, tt.hit, tt.retry)
		}
	}

	// A later denial of a larger cost does not replace the entry for the
	// smaller one; a denial of a smaller cost does.
	c.put("a", 4, denial(20*time.Second), 0)
	if d, ok := c.get("a", 2); !ok || d.RetryAfter != 10*time.Second {
		t.Errorf("entry for cost 2 replaced by cost 4: %+v, %v", d, ok)
	}
	c.put("a", 1, denial(5*time.Second), 0)
	if d, ok := c.get("a", 1); !ok || d.RetryAfter != 5*time.Second {
		t.Errorf("entry for cost 1: %+v, %v", d, ok)
	}

	// Counting down, and expiry exactly at RetryAfter.
	now = now.Add(4 * time.Second)
	if d, ok := c.get("a", 1); !ok || d.RetryAfter != time.Second || d.ResetAfter != 6*time.Second {
		t.Errorf("after 4 s: %+v, %v", d, ok)
	}
	now = now.Add(time.Second)
	if _, ok := c.get("a", 1); ok {
		t.Error("entry answered at its RetryAfter")
	}
	if c.len() != 0 {
		t.Errorf("expired entry kept: len %d", c.len())
	}

	// Bounded: never more than max entries; expired ones go first.
	c.put("x", 1, denial(time.Second), 0)
	now = now.Add(2 * time.Second)
	for i := 0; i < 10; i++ {
		c.put(fmt.Sprint("k", i), 1, denial(time.Minute), 0)
		if c.len() > 3 {
			t.Fatalf("len %d after %d puts, max 3", c.len(), i+1)
		}
	}
	c.begin("k9")
	c.finish("k9", true)
	if _, ok := c.get("k9", 1); ok {
		t.Error("an entry answers after a change of its key")
	}
}

func BenchmarkDeniedCacheGet(b *testing.B) {
	// The bound is per shard: 256 keys fit a cache of 1024 whatever their
	// hashes.
	c := newDeniedCache(1024, time.Now)
	keys := make([]string, 256)
	for i := range keys {
		keys[i] = fmt.Sprint("blocked-", i)
		c.put(keys[i], 1, ratekit.Decision{RetryAfter: time.Hour}, 0)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if _, ok := c.get(keys[i%len(keys)], 1); !ok {
				b.Error("miss")
				return
			}
		}
	})
}
