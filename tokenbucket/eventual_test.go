package tokenbucket_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// versioned is one shared bucket record with a history: every write gets a
// version and remembers the version its writer had read.
type versioned struct {
	mu     sync.Mutex
	rec    kvstore.Record
	ok     bool
	parent []int // parent[v-1] is the version write v was computed from
}

func (s *versioned) version() int { return len(s.parent) }

// survivors returns how many writes the final record descends from: the
// takes that count. Every other write was overwritten by a writer that had
// read an older version: a lost take.
func (s *versioned) survivors() int {
	n := 0
	for v := s.version(); v > 0; v = s.parent[v-1] {
		n++
	}
	return n
}

// view is one instance's connection to the shared record. It remembers the
// version of its last read, and waits delay between a read and what follows
// it, standing in for a network round trip. A view is used by one goroutine.
type view struct {
	shared *versioned
	read   int
	delay  time.Duration
}

func (v *view) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	v.shared.mu.Lock()
	rec, ok, ver := v.shared.rec, v.shared.ok, v.shared.version()
	v.shared.mu.Unlock()
	v.read = ver
	if v.delay > 0 {
		time.Sleep(v.delay)
	}
	return rec, ok, nil
}

func (v *view) Set(ctx context.Context, key string, rec kvstore.Record, ttl time.Duration) error {
	v.shared.mu.Lock()
	v.shared.rec, v.shared.ok = rec, true
	v.shared.parent = append(v.shared.parent, v.read)
	v.shared.mu.Unlock()
	return nil
}

func (v *view) Delete(ctx context.Context, key string) error {
	v.shared.mu.Lock()
	v.shared.ok = false
	v.shared.parent = append(v.shared.parent, v.read)
	v.shared.mu.Unlock()
	return nil
}

type overshoot struct {
	admitted, writes, survivors int
}

// raceInstances runs k Eventual limiters, each with its own view of one
// shared bucket of burst 100 with negligible refill, until each has been
// denied 20 times in a row, then drains what stale writes left behind with
// one more instance. Each instance pauses a random time between 0 and
// 2×think between its requests.
func raceInstances(t *testing.T, k int, delay, think time.Duration) overshoot {
	t.Helper()
	shared := &versioned{}
	newInstance := func() (*tokenbucket.Limiter, *view) {
		v := &view{shared: shared, delay: delay}
		return newLimiter(t, tokenbucket.Config{Name: "p", Burst: 100, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Eventual, Store: v}), v
	}
	ctx := context.Background()
	req := ratekit.Request{Key: "k", Cost: 1}
	counts := make([]int, k+1)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < k; i++ {
		l, _ := newInstance()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			<-start
			for denied := 0; denied < 20; {
				if think > 0 {
					time.Sleep(time.Duration(rng.Int64N(int64(2 * think))))
				}
				d, err := l.Allow(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					counts[i]++
					denied = 0
				} else {
					denied++
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	drain, v := newInstance()
	v.delay = 0
	for {
		d, err := drain.Allow(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		counts[k]++
	}
	var o overshoot
	for _, c := range counts {
		o.admitted += c
	}
	shared.mu.Lock()
	o.writes, o.survivors = shared.version(), shared.survivors()
	shared.mu.Unlock()
	return o
}

// TestEventualOvershoot measures how far Eventual mode overshoots when
// instances race, and checks the accounting that explains it: every
// admitted request wrote once (denied ones wrote nothing), exactly Burst
// writes survive, and the overshoot is the number of overwritten takes.
func TestEventualOvershoot(t *testing.T) {
	type scenario struct{ delay, think time.Duration }
	scenarios := []scenario{{0, 0}, {200 * time.Microsecond, 0}, {time.Millisecond, 0}, {200 * time.Microsecond, 2 * time.Millisecond}}
	ks := []int{1, 2, 4, 8, 16}
	if testing.Short() {
		scenarios, ks = scenarios[:2], []int{1, 4}
	}
	for _, sc := range scenarios {
		for _, k := range ks {
			delay := sc.delay
			o := raceInstances(t, k, delay, sc.think)
			t.Logf("overshoot: k=%d delay=%v think=%v admitted=%d", k, delay, sc.think, o.admitted)
			if o.writes != o.admitted {
				t.Errorf("k=%d delay=%v: %d admitted but %d writes; want one write per admitted request", k, delay, o.admitted, o.writes)
			}
			if o.survivors != 100 {
				t.Errorf("k=%d delay=%v: %d surviving takes, want exactly burst 100", k, delay, o.survivors)
			}
			if k == 1 && o.admitted != 100 {
				t.Errorf("one instance admitted %d, want exactly 100", o.admitted)
			}
			if o.admitted < 100 {
				t.Errorf("k=%d delay=%v: admitted %d, fewer than burst", k, delay, o.admitted)
			}
		}
	}
}

func ExampleMode() {
	fmt.Println(tokenbucket.Eventual, tokenbucket.Atomic)
	// Output: Eventual Atomic
}
