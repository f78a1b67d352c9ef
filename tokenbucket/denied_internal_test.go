package tokenbucket

import (
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

func TestDeniedCacheBound(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, size := range []int{1, 5, 16, 17, 100} {
		c := newDeniedCache(size)
		for i := 0; i < 50*size; i++ {
			c.add(strconv.Itoa(i), 0, start, start.Add(time.Duration(i+1)*time.Second), 0)
			if n := c.size(); n > size {
				t.Fatalf("size %d: %d entries after %d adds", size, n, i+1)
			}
		}
	}
}

func TestDeniedCacheExpiry(t *testing.T) {
	r := kvstore.Refill{Burst: 1000, Rate: 1}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newDeniedCache(4)
	c.add("k", 100, start, start.Add(400*time.Microsecond), 0) // 500 units at +400µs
	if level, hit, _ := c.lookup("k", 500, start.Add(399*time.Microsecond), r); !hit || level != 499 {
		t.Fatalf("lookup at +399µs = %d, %v; want 499, hit", level, hit)
	}
	// A partial microsecond rounds up: the estimate never undercounts.
	if level, hit, _ := c.lookup("k", 500, start.Add(398*time.Microsecond+time.Nanosecond), r); !hit || level != 499 {
		t.Fatalf("lookup at +398.001µs = %d, %v; want 499, hit", level, hit)
	}
	// A miss registers the request's decision, which its caller ends
	// with finish once the store has answered.
	if _, hit, _ := c.lookup("k", 200, start.Add(100*time.Microsecond), r); hit {
		t.Fatal("a request the bucket can hold was denied from the cache")
	}
	c.finish("k", false)
	if _, hit, _ := c.lookup("k", 500, start.Add(400*time.Microsecond), r); hit {
		t.Fatal("hit at the retry time")
	}
	c.finish("k", false)
	if c.size() != 0 {
		t.Fatal("an expired entry was not removed")
	}
	// The evictor removes expired entries first, then the soonest to expire.
	c = newDeniedCache(1)
	c.add("a", 0, start, start.Add(time.Second), 0)
	c.add("b", 0, start.Add(2*time.Second), start.Add(3*time.Second), 0)
	if _, hit, _ := c.lookup("b", 1, start.Add(2*time.Second), r); !hit || c.size() != 1 {
		t.Fatal("a new entry did not replace an expired one")
	}
}
