package signedwindow

import (
	"context"
	"errors"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

func TestReplayWithoutCache(t *testing.T) {
	// Documents the limitation: without a cache, replaying a spent token
	// is counted from the token's own count every time.
	l := mustNew(t, testConfig(newClock(t0)))
	first := allow(t, l, alice, "").State
	for i := range 5 {
		if d := allow(t, l, alice, first); !d.Allowed || d.StateError != nil {
			t.Fatalf("replay %d: %+v", i, d)
		}
	}
}

func TestReplayCache(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.ReplayCacheSize = 64
	l := mustNew(t, cfg)

	t0tok := allow(t, l, alice, "").State // count 1
	t1 := allow(t, l, alice, t0tok)       // spends t0tok: count 2
	if t1.StateError != nil || t1.Remaining != 1 {
		t.Fatalf("first use: %+v", t1)
	}
	// Following the chain is not a replay.
	if d, err := l.Peek(context.Background(), ratekit.Request{Key: alice, Cost: 1, State: t1.State}); err != nil || d.StateError != nil || d.Remaining != 1 {
		t.Fatalf("Peek of the latest token: %+v, %v", d, err)
	}
	// A second tab sends the same token: it is counted from the highest
	// count issued for the window (2), not from its own (1).
	t2 := allow(t, l, alice, t0tok)
	if !t2.Allowed || t2.Remaining != 0 || !errors.Is(t2.StateError, ErrTokenReplayed) {
		t.Fatalf("replay: %+v", t2)
	}
	// Replaying again is denied, and the denial hands back a token carrying
	// the remembered count, not the stale one.
	t3 := allow(t, l, alice, t0tok)
	if t3.Allowed || !errors.Is(t3.StateError, ErrTokenReplayed) || t3.State == t0tok {
		t.Fatalf("second replay: %+v", t3)
	}
	if tok, err := l.VerifyToken(t3.State, alice); err != nil || tok.Count != 3 {
		t.Fatalf("denial token %+v, %v; want count 3", tok, err)
	}
	// The other tab's own token is older than the last one issued too.
	if d := allow(t, l, alice, t1.State); d.Allowed || !errors.Is(d.StateError, ErrTokenReplayed) {
		t.Fatalf("t1 chain: %+v", d)
	}
	// Peek and Refund see the remembered count too.
	d, err := l.Peek(context.Background(), ratekit.Request{Key: alice, Cost: 1, State: t0tok})
	if err != nil || d.Allowed || !errors.Is(d.StateError, ErrTokenReplayed) {
		t.Fatalf("Peek of replayed token: %+v, %v", d, err)
	}
	d, err = l.Refund(context.Background(), ratekit.Request{Key: alice, Cost: 1, State: t3.State})
	if err != nil || d.Remaining != 1 || d.StateError != nil {
		t.Fatalf("Refund: %+v, %v", d, err)
	}
	// The refunded token is now the latest: no replay, and the refund holds.
	if d := allow(t, l, alice, d.State); !d.Allowed || d.StateError != nil || d.Remaining != 0 {
		t.Fatalf("after refund: %+v", d)
	}
	// A replay of an old token after the refund gains nothing.
	if d := allow(t, l, alice, t0tok); d.Allowed {
		t.Fatalf("replay after refund: %+v", d)
	}

	// Entries stop mattering when the window ends.
	clock.Add(time.Minute)
	if d := allow(t, l, alice, t0tok); !errors.Is(d.StateError, ErrTokenStaleWindow) {
		t.Fatalf("after the window: %v", d.StateError)
	}
}

func TestReplayCacheEviction(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.ReplayCacheSize = 1
	l := mustNew(t, cfg)

	a := tokenAt(l, t0.Unix(), 0, alice)
	b := tokenAt(l, t0.Unix(), 0, bob)
	allow(t, l, alice, a) // the cache holds alice's window at count 1
	if d := allow(t, l, alice, a); !errors.Is(d.StateError, ErrTokenReplayed) {
		t.Fatalf("replay of a: %v", d.StateError)
	}
	allow(t, l, bob, b) // evicts a, the oldest entry
	if d := allow(t, l, alice, a); d.StateError != nil {
		t.Fatalf("a after eviction: %v, want nil (forgotten)", d.StateError)
	}
	if n := len(l.replay.shards[0].m); n != 1 || len(l.replay.shards) != 1 {
		t.Fatalf("cache holds %d entries in %d shards, want 1 in 1", n, len(l.replay.shards))
	}
}

func TestReplayCacheBound(t *testing.T) {
	for _, size := range []int{1, 15, 16, 17, 100, 1000} {
		c := newReplayCache(size)
		total := 0
		for i := range c.shards {
			total += c.shards[i].size
		}
		if total != size {
			t.Fatalf("size %d: shards hold %d", size, total)
		}
		for i := range 5 * size {
			c.claim(uint64(i)*0x9E3779B97F4A7C15, 1<<40, 0)
		}
		n := 0
		for i := range c.shards {
			n += len(c.shards[i].m)
			if len(c.shards[i].m) > c.shards[i].size || len(c.shards[i].ring) > c.shards[i].size {
				t.Fatalf("size %d: shard %d over its bound", size, i)
			}
		}
		if n > size {
			t.Fatalf("size %d: %d entries", size, n)
		}
	}
}

// TestConcurrentReplayExact replays one token from many goroutines: with a
// replay cache the instance admits exactly Limit requests in total.
func TestConcurrentReplayExact(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.Quota = 25
	cfg.ReplayCacheSize = 128
	l := mustNew(t, cfg)
	tok := tokenAt(l, t0.Unix(), 0, alice)

	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				d, err := l.Allow(context.Background(), ratekit.Request{Key: alice, Cost: 1, State: tok})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 25 {
		t.Fatalf("admitted %d, want exactly 25", got)
	}
}

// TestConcurrentChains runs many clients at once, each carrying its own
// token as it should: each is admitted exactly Limit times.
func TestConcurrentChains(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.Quota = 7
	cfg.Keys = []Key{{ID: 2, Secret: secret(2)}, {ID: 1, Secret: secret(1)}}
	l := mustNew(t, cfg)
	old := mustNew(t, testConfig(clock)) // key 1 only: rotation in flight

	var wg sync.WaitGroup
	for c := range 16 {
		wg.Go(func() {
			subject := string(rune('a'+c)) + "-client"
			state := ""
			if c%2 == 0 {
				d, err := old.Allow(context.Background(), ratekit.Request{Key: subject, Cost: 1})
				if err != nil {
					t.Error(err)
					return
				}
				state = d.State
			}
			n := int64(c%2 ^ 1) // the old instance admitted one already
			for range 10 {
				d, err := l.Allow(context.Background(), ratekit.Request{Key: subject, Cost: 1, State: state})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					n++
				}
				state = d.State
			}
			if n != 7 {
				t.Errorf("client %d admitted %d, want 7", c, n)
			}
		})
	}
	wg.Wait()
}

// TestReplayCacheJoinsWindow: with a replay cache, a request without a
// token (a client that dropped it, or a second client of the same subject)
// is counted in the subject's current window instead of a fresh one, and a
// token of an earlier window cannot reopen it.
func TestReplayCacheJoinsWindow(t *testing.T) {
	clock := newClock(t0)
	cfg := testConfig(clock)
	cfg.ReplayCacheSize = 64
	l := mustNew(t, cfg)
	first := allow(t, l, alice, "") // count 1, window starting at t0
	clock.Add(1500 * time.Millisecond)
	d := allow(t, l, alice, "") // dropped token: joins, count 2
	if !d.Allowed || d.Remaining != cfg.Quota-2 || !errors.Is(d.StateError, ErrTokenMissing) {
		t.Fatalf("tokenless request: %+v", d)
	}
	tok, err := l.VerifyToken(d.State, alice)
	if err != nil || tok.WindowStart.Unix() != t0.Unix() || tok.Count != 2 {
		t.Fatalf("its token: %+v, %v; want the window of %v with count 2", tok, err, t0)
	}
	// The first token is from the same window with a lower count: a replay.
	if d := allow(t, l, alice, first.State); !errors.Is(d.StateError, ErrTokenReplayed) || d.Remaining != cfg.Quota-3 {
		t.Fatalf("first token after the join: %+v", d)
	}
	// Another subject is unaffected.
	if d := allow(t, l, "198.51.100.1", ""); d.Remaining != cfg.Quota-1 {
		t.Fatalf("other subject: %+v", d)
	}
	// After the window ends, a tokenless request starts a new one.
	clock.Add(cfg.Window)
	if d := allow(t, l, alice, ""); d.Remaining != cfg.Quota-1 {
		t.Fatalf("after the window: %+v", d)
	}
}

// TestConcurrentTokenlessExact: 64 clients of one subject, each threading
// its own token chain from none, across second boundaries: with a replay
// cache the instance admits exactly Limit in the window. (Without the
// cache each chain would get the full Limit.)
func TestConcurrentTokenlessExact(t *testing.T) {
	clock := newClock(t0.Add(900 * time.Millisecond))
	cfg := testConfig(clock)
	cfg.Quota = 100
	cfg.Window = time.Hour
	cfg.ReplayCacheSize = 128
	l := mustNew(t, cfg)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			state := ""
			for i := range 10 {
				if w == 0 && i == 5 {
					clock.Add(300 * time.Millisecond) // cross a second boundary mid-burst
				}
				d, err := l.Allow(context.Background(), ratekit.Request{Key: alice, Cost: 1, State: state})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
				state = d.State
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 100 {
		t.Fatalf("admitted %d, want exactly 100", got)
	}
}

// TestReplayCacheBytesPerEntry measures the heap that a full replay cache
// holds per entry (runtime.MemStats.HeapAlloc after a collection) and checks
// it against the range that Config.ReplayCacheSize's doc comment states,
// within a quarter of its ends (the figure moves as the shards' maps grow,
// and with the Go release). Run with -v for the figures.
func TestReplayCacheBytesPerEntry(t *testing.T) {
	src, err := os.ReadFile("config.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`Each entry takes (?:about )?(\d+)(?: to (\d+))? bytes`).FindSubmatch(src)
	if m == nil {
		t.Fatal("Config.ReplayCacheSize states no size per entry (want \"Each entry takes N to M bytes\")")
	}
	lo, _ := strconv.ParseFloat(string(m[1]), 64)
	hi := lo
	if m[2] != nil {
		hi, _ = strconv.ParseFloat(string(m[2]), 64)
	}
	for _, size := range []int{10_000, 100_000, 300_000} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := newReplayCache(size)
		for i := range size {
			c.claim(uint64(i+1)*0x9E3779B97F4A7C15, 1<<40, 0)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(c)
		per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(size)
		t.Logf("%d entries: %.1f bytes an entry", size, per)
		if per < 0.75*lo || per > 1.25*hi {
			t.Errorf("%d entries: %.1f bytes an entry; Config.ReplayCacheSize says %s", size, per, m[0])
		}
	}
}
