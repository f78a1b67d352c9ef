package memstore

import "testing"

func TestEvictRule(t *testing.T) {
	fill := func() *shard {
		sh := &shard{max: 5, entries: map[string]*entry{}}
		for i, k := range []string{"a", "b", "c", "d", "e"} {
			sh.entries[k] = &entry{expires: int64(10 * (i + 1))} // a:10 … e:50
		}
		return sh
	}
	// Nothing expired: the sampled entry that expires first goes. The
	// sample covers all five entries, so that is "a".
	for i := 0; i < 20; i++ {
		sh := fill()
		sh.evict(5)
		if _, ok := sh.entries["a"]; ok || len(sh.entries) != 4 {
			t.Fatalf("evict at 5: left %v; want all but a", sh.entries)
		}
	}
	// "a" and "b" expired at 25: both go, nothing else.
	for i := 0; i < 20; i++ {
		sh := fill()
		sh.evict(25)
		if len(sh.entries) != 3 {
			t.Fatalf("evict at 25: left %v; want c, d, e", sh.entries)
		}
		for _, k := range []string{"c", "d", "e"} {
			if _, ok := sh.entries[k]; !ok {
				t.Fatalf("evict at 25 removed live %s", k)
			}
		}
	}
	// store on a full shard evicts before inserting a new key, never for an
	// existing one.
	sh := fill()
	sh.store("c", sh.entries["c"], entry{expires: 99}, 5)
	if len(sh.entries) != 5 {
		t.Fatalf("overwrite evicted: %v", sh.entries)
	}
	sh.store("f", nil, entry{expires: 60}, 5)
	if _, ok := sh.entries["a"]; ok || len(sh.entries) != 5 {
		t.Fatalf("insert into a full shard: %v; want a evicted, f added", sh.entries)
	}
}
