package memstore

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
			e := &entry{key: k, expires: int64(10 * (i + 1)), pos: i, scope: &s.Scope} // a:10 … e:50
			sh.entries = append(sh.entries, e)
			s.index.Store(k, e)
		}
		return s, sh
	}
	keys := func(sh *shard) map[string]bool {
		m := map[string]bool{}
		for i, e := range sh.entries {
			if e.pos != i || e.dead {
				t.Fatalf("entry %s at %d has pos %d, dead %v", e.key, i, e.pos, e.dead)
			}
			m[e.key] = true
		}
		return m
	}
	// Nothing expired: the sampled entry that expires first goes. The
	// sample covers all five entries, so that is "a".
	for range 20 {
		s, sh := fill()
		if !sh.evict(s, 5) {
			t.Fatal("evict at 5 removed nothing")
		}
		if k := keys(sh); k["a"] || len(k) != 4 {
			t.Fatalf("evict at 5: left %v; want all but a", k)
		}
		if _, ok := s.index.Load("a"); ok {
			t.Fatal("evicted a is still in the index")
		}
	}
	// "a" and "b" expired at 25: both go, nothing else.
	for range 20 {
		s, sh := fill()
		sh.evict(s, 25)
		k := keys(sh)
		if len(k) != 3 || !k["c"] || !k["d"] || !k["e"] {
			t.Fatalf("evict at 25: left %v; want c, d, e", k)
		}
	}
	// An entry in use is no candidate: with "a" locked, "b" goes.
	s, sh := fill()
	sh.entries[0].mu.Lock()
	sh.evict(s, 5)
	if k := keys(sh); !k["a"] || k["b"] || len(k) != 4 {
		t.Fatalf("evict with a in use: left %v; want all but b", k)
	}
	// With every entry in use, nothing goes and evict says so.
	s, sh = fill()
	for _, e := range sh.entries {
		e.mu.Lock()
	}
	if sh.evict(s, 5) || len(sh.entries) != 5 {
		t.Fatalf("evict with every entry in use removed one: %v", keys(sh))
	}
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
			if e.pos != j || e.dead || s.shard(e.key) != sh {
				t.Fatalf("shard %d entry %d (%q): pos %d, dead %v", i, j, e.key, e.pos, e.dead)
			}
			if v, ok := e.scope.index.Load(e.key); !ok || v != e {
				t.Fatalf("listed key %q is not indexed to its entry", e.key)
			}
			listed++
		}
	}
	indexed := 0
	scopes := []*Scope{&s.Scope}
	for _, sc := range s.scopes {
		scopes = append(scopes, sc)
	}
	for _, sc := range scopes {
		sc.index.Range(func(k string, e *entry) bool {
			if e.dead || e.key != k || e.scope != sc {
				t.Fatalf("index holds %q → dead %v, key %q", k, e.dead, e.key)
			}
			indexed++
			return true
		})
	}
	if indexed != listed || listed > maxKeys {
		t.Fatalf("%d keys indexed, %d listed, bound %d", indexed, listed, maxKeys)
	}
}

// TestChurnKeepsIndexAndListsConsistent races inserts, evictions, expiry,
// deletes and updates on few and many keys, with bounds from one key up,
// and checks that no entry is lost from one structure but kept in the other
// and that the bound holds. It also fails by deadlock (the test timeout) if
// an insert into a shard whose entries are all in use waited for them while
// holding the shard.
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
