package memstore

import (
	"context"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ratekit/ratekit/kvstore"
)

func TestEvictRule(t *testing.T) {
	fill := func() (*Store, *shard) {
		s, err := New(Config{MaxKeys: 1})
		if err != nil {
			t.Fatal(err)
		}
		sh := &s.shards[0]
		sh.max = 5
		for i, k := range []string{"a", "b", "c", "d", "e"} {
			e := newEntry(k)
			e.hash, e.expires, e.pos, e.scope = maphash.String(s.seed, k), int64(10*(i+1)), int32(i), &s.Scope // a:10 … e:50
			sh.index(e)
			sh.entries = append(sh.entries, e)
		}
		return s, sh
	}
	keys := func(s *Store, sh *shard) map[string]bool {
		m := map[string]bool{}
		for i, e := range sh.entries {
			if int(e.pos) != i || e.dead || sh.find(&s.Scope, e.key(), e.hash) != e {
				t.Fatalf("entry %s at %d has pos %d, dead %v, indexed %v", e.key(), i, e.pos, e.dead, sh.find(&s.Scope, e.key(), e.hash) == e)
			}
			m[e.key()] = true
		}
		if n := indexed(t, sh); n != len(m) {
			t.Fatalf("index holds %d keys, the shard lists %d", n, len(m))
		}
		return m
	}
	// Nothing expired: the sampled entry that expires first goes. The
	// sample covers all five entries, so that is "a".
	for range 20 {
		s, sh := fill()
		a := sh.entries[0]
		sh.evict(5)
		if k := keys(s, sh); k["a"] || len(k) != 4 || !a.dead {
			t.Fatalf("evict at 5: left %v, a dead %v; want all but a, and a dead", k, a.dead)
		}
	}
	// "a" and "b" expired at 25: both go, nothing else.
	for range 20 {
		s, sh := fill()
		sh.evict(25)
		k := keys(s, sh)
		if len(k) != 3 || !k["c"] || !k["d"] || !k["e"] {
			t.Fatalf("evict at 25: left %v; want c, d, e", k)
		}
	}
	// An empty shard has nothing to evict.
	s, _ := fill()
	s.shards[0].entries = nil
	s.shards[0].evict(5)
}

// checkConsistent fails t unless the index and the shards' lists hold the
// same live entries, each at its recorded position, within the bound.
func checkConsistent(t *testing.T, s *Store, maxKeys int) {
	t.Helper()
	listed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		if len(sh.entries) > sh.max {
			t.Fatalf("shard %d holds %d entries, its share is %d", i, len(sh.entries), sh.max)
		}
		for j, e := range sh.entries {
			if int(e.pos) != j || e.dead || e.hash != maphash.String(s.seed, e.key()) || s.shard(e.hash) != sh {
				t.Fatalf("shard %d entry %d (%q): pos %d, dead %v", i, j, e.key(), e.pos, e.dead)
			}
			if sh.find(e.scope, e.key(), e.hash) != e {
				t.Fatalf("listed key %q is not indexed to its entry", e.key())
			}
			listed++
		}
		if n := indexed(t, sh); n != len(sh.entries) {
			t.Fatalf("shard %d indexes %d entries and lists %d", i, n, len(sh.entries))
		}
		if 4*len(sh.entries) > 3*len(sh.table) && len(sh.entries) > 0 {
			t.Fatalf("shard %d: %d entries in a table of %d slots", i, len(sh.entries), len(sh.table))
		}
	}
	if listed > maxKeys {
		t.Fatalf("%d keys listed, bound %d", listed, maxKeys)
	}
}

// indexed returns the number of entries in sh's table, after checking that
// each is live and found by a search for its key.
func indexed(t *testing.T, sh *shard) int {
	t.Helper()
	n := 0
	for _, sl := range sh.table {
		if sl.e == nil {
			continue
		}
		if sl.e.dead || sl.hash != sl.e.hash || sh.find(sl.e.scope, sl.e.key(), sl.hash) != sl.e {
			t.Fatalf("a table slot holds a dead or unreachable entry %q", sl.e.key())
		}
		n++
	}
	return n
}

// TestTableRuns adds and removes keys of a shard whose hashes share a few
// homes, near the table's end too, so that runs of slots collide, wrap
// around and are cut by removals: after every step each listed key is found
// and every removed one is not (a removal that broke a run would hide the
// keys after it; one that left a key behind would find it).
func TestTableRuns(t *testing.T) {
	s, err := New(Config{MaxKeys: 1})
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0]
	sh.max = 1 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[string]*entry{}
	var gone []*entry
	for i := range 3000 {
		if len(live) > 0 && rng.IntN(60) < min(len(live), 50) { // about 30 to 50 keys
			for _, e := range live { // a random key: map order
				sh.drop(e)
				delete(live, e.key())
				gone = append(gone, e)
				break
			}
		} else {
			k := strconv.Itoa(i)
			// Homes 0, 1 and the last slots of tables up to 64 slots:
			// the low bits choose the shard, the next ones the home.
			h := uint64([]int{0, 1, 7, 15, 31, 63}[rng.IntN(6)]) << maxShardBits
			e := newEntry(k)
			e.hash, e.scope, e.pos = h, &s.Scope, int32(len(sh.entries))
			sh.index(e)
			sh.entries = append(sh.entries, e)
			live[k] = e
		}
		for _, e := range live {
			if sh.find(&s.Scope, e.key(), e.hash) != e {
				t.Fatalf("step %d: key %q not found among %d", i, e.key(), len(live))
			}
		}
		for _, e := range gone[max(len(gone)-20, 0):] {
			if sh.find(&s.Scope, e.key(), e.hash) != nil {
				t.Fatalf("step %d: removed key %q found", i, e.key())
			}
		}
		if n := indexed(t, sh); n != len(live) {
			t.Fatalf("step %d: table holds %d, want %d", i, n, len(live))
		}
	}
}

// TestChurnKeepsIndexAndListsConsistent races inserts, evictions, expiry,
// deletes and updates on few and many keys, with bounds from one key up,
// and checks that no entry is lost from one structure but kept in the other
// and that the bound holds. Multi-key takes, which lock several shards and
// may evict their own keys, run among them; a cycle of shard locks would
// fail the test by deadlock (the test timeout).
func TestChurnKeepsIndexAndListsConsistent(t *testing.T) {
	for _, maxKeys := range []int{1, 2, 7, 64, 1000} {
		var now atomic.Int64
		s, err := New(Config{MaxKeys: maxKeys, Now: func() time.Time { return time.Unix(0, now.Load()) }})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		r := kvstore.Refill{Burst: 50, Rate: 1}
		// The keys go to the store itself and to two scopes, which share
		// its bound and eviction.
		spaces := []*Scope{&s.Scope, s.Prefixed("p:").(*Scope), s.Prefixed("q:").(*Scope)}
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := spaces[w%len(spaces)]
				for i := range 3000 {
					k := strconv.Itoa((w*31 + i*7) % (3*maxKeys + 5))
					switch i % 6 {
					case 0:
						s.Set(ctx, k, kvstore.Record{Value: int64(i)}, time.Duration(1+i%50)*time.Microsecond)
					case 1:
						s.Get(ctx, k)
					case 2, 3:
						s.Update(ctx, k, r, kvstore.OpTake, 1+int64(i%3))
					case 4:
						s.Update(ctx, k, r, kvstore.OpRefund, 2)
						k2 := strconv.Itoa((w*17 + i*3) % (3*maxKeys + 5))
						if k2 != k {
							u := []kvstore.Update{{Key: k, Refill: r, N: 1}, {Key: k2, Refill: r, N: 2}}
							s.UpdateMulti(ctx, "", kvstore.OpTake, u, make([]kvstore.OpResult, 2))
						}
					default:
						s.Delete(ctx, k)
					}
					if i%100 == 0 {
						now.Add(int64(10 * time.Microsecond))
					}
				}
			}()
		}
		wg.Wait()
		checkConsistent(t, s, maxKeys)
	}
}

// heldEntry keeps TestCacheLines' entries on the heap.
var heldEntry *entry

// allocated returns the bytes newEntry(key) allocates: the least of a
// few measurements, which a test running alongside can only raise.
func allocated(key string) uintptr {
	const n = 100
	least := ^uintptr(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			heldEntry = newEntry(key)
		}
		runtime.ReadMemStats(&after)
		least = min(least, uintptr(after.TotalAlloc-before.TotalAlloc)/n)
	}
	return least
}

// TestCacheLines keeps an entry and a key of up to 16 bytes on one cache
// line, a key of up to 80 bytes on the next one, in one allocation (a
// lookup of a short key that is not in the cache reads one line, of a
// longer one two adjacent lines), a longer key in an allocation of its own,
// and shards on cache lines of their own (two shards' locks never share
// one).
func TestCacheLines(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 64 {
		t.Fatalf("an entry takes %d bytes, want 64", n)
	}
	if n := unsafe.Sizeof(entryWide{}); n != 128 {
		t.Fatalf("an entry with a wide key takes %d bytes, want 128", n)
	}
	for _, tc := range []struct {
		len  int
		size uintptr // of the allocation that holds the key after the entry's fields; 0: elsewhere
	}{{0, 64}, {1, 64}, {16, 64}, {17, 128}, {80, 128}, {81, 0}, {512, 0}, {longKey + 1, 0}} {
		key := strings.Repeat("k", tc.len)
		e := newEntry(key)
		heldEntry = e // on the heap, as a store's entries are
		if e.key() != key {
			t.Fatalf("newEntry(%d bytes) holds %d bytes", tc.len, len(e.key()))
		}
		at := uintptr(unsafe.Pointer(e))
		data := uintptr(unsafe.Pointer(unsafe.StringData(e.key())))
		inline := tc.len == 0 || data == at+unsafe.Offsetof(e.kb)
		if inline != (tc.size > 0) || tc.size > 0 && (at%64 != 0 || allocated(key) != tc.size) {
			t.Fatalf("newEntry(%d bytes): entry at %#x, key at %#x, %d bytes allocated; want the key inline in %d", tc.len, at, data, allocated(key), tc.size)
		}
	}
	if n := unsafe.Sizeof(shard{}); n%64 != 0 {
		t.Fatalf("a shard takes %d bytes, not a whole number of cache lines", n)
	}
}

// TestExpiryMatchesTimeToFull checks expiry, and quo under it, against
// kvstore.Refill.TimeToFull at the ends of the range and at random.
func TestExpiryMatchesTimeToFull(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	refills := []kvstore.Refill{{Burst: 1, Rate: 1}, {Burst: 1 << 52, Rate: 1}, {Burst: 1 << 52, Rate: 1 << 52}, {Burst: 1 << 52, Rate: 3}, {Burst: 18_000_000_000, Rate: 5}}
	for range 300 {
		b := 1 + rng.Int64N(1<<52)
		refills = append(refills, kvstore.Refill{Burst: b, Rate: 1 + rng.Int64N(b)})
	}
	for _, r := range refills {
		values := []int64{-5, 0, 1, r.Burst - r.Rate, r.Burst - 1, r.Burst}
		for range 100 {
			values = append(values, rng.Int64N(r.Burst+1))
		}
		for _, v := range values {
			next := kvstore.Record{Value: v, Time: 1_700_000_000_000_000}
			want := addNanos(next.Time*1000, int64(r.TimeToFull(v)))
			if got := expiry(r, next); got != want {
				t.Fatalf("%+v: expiry of %d = %d, want %d", r, v, got, want)
			}
		}
	}
	for _, d := range []int64{1, 3, 1 << 52, 1 << 53} {
		for _, n := range []int64{0, d - 1, d, 1<<53 - 1, 1 << 53} {
			if got := quo(n, d); got != n/d {
				t.Fatalf("quo(%d, %d) = %d, want %d", n, d, got, n/d)
			}
		}
	}
}
