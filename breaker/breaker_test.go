package breaker_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errStore = errors.New("store down")

// switchable decides while up is set and fails with errStore otherwise,
// counting the calls that reach it.
type switchable struct {
	up    atomic.Bool
	calls atomic.Int64
}

func (s *switchable) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	s.calls.Add(1)
	if req.Cost > 10 {
		return ratekit.Decision{}, ratekit.ErrCostExceedsLimit
	}
	if !s.up.Load() {
		return ratekit.Decision{}, errStore
	}
	return ratekit.Decision{Allowed: true, Limit: 10, Remaining: 9}, nil
}

func req() ratekit.Request { return ratekit.Request{Key: "k", Cost: 1} }

func TestStates(t *testing.T) {
	inner := &switchable{}
	var mu sync.Mutex
	var changes []string
	// OpenFor is long enough that no stall of a busy machine lets it pass
	// while the open circuit is checked (which stops at half of it).
	const openFor = time.Second
	late := testenv.MeasureLateness(t)
	b, err := breaker.New(inner, breaker.Config{Failures: 3, OpenFor: openFor, Probes: 2,
		OnStateChange: func(from, to breaker.State) {
			mu.Lock()
			changes = append(changes, from.String()+">"+to.String())
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Invalid requests and cancelled contexts never count.
	for i := 0; i < 5; i++ {
		if _, err := b.Allow(ctx, ratekit.Request{Key: "", Cost: 1}); !errors.Is(err, ratekit.ErrEmptyKey) {
			t.Fatalf("empty key: %v", err)
		}
		if _, err := b.Allow(ctx, ratekit.Request{Key: "k", Cost: 11}); !errors.Is(err, ratekit.ErrCostExceedsLimit) {
			t.Fatalf("cost above the limit: %v", err)
		}
	}
	if b.State() != breaker.Closed {
		t.Fatalf("invalid requests opened the circuit: %v", b.State())
	}
	// Three consecutive failures open it.
	var opened time.Time // before the circuit opened
	for i := 0; i < 3; i++ {
		opened = time.Now()
		if _, err := b.Allow(ctx, req()); !errors.Is(err, errStore) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if b.State() != breaker.Open {
		t.Fatalf("after 3 failures: %v", b.State())
	}
	before := inner.calls.Load()
	refused := 0
	for ; refused < 20 && time.Since(opened) < openFor/2; refused++ {
		start := time.Now()
		if _, err := b.Allow(ctx, req()); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("open circuit: %v", err)
		}
		// At once: it does not wait for anything, and a busy machine
		// delays it no more than any goroutine, as measured meanwhile.
		if took := time.Since(start); took > 5*time.Millisecond {
			if lateness := late.Max(); took > 5*time.Millisecond+lateness {
				t.Fatalf("open circuit took %v to refuse (5ms + scheduling lateness %v)", took, lateness)
			}
		}
	}
	if refused == 0 {
		t.Fatalf("no request reached the open circuit within %v of its opening", openFor/2)
	}
	if n := inner.calls.Load() - before; n != 0 {
		t.Fatalf("the open circuit asked the limiter %d times", n)
	}
	// Half-open after OpenFor: a failing probe opens it again.
	time.Sleep(openFor + 20*time.Millisecond)
	if _, err := b.Allow(ctx, req()); !errors.Is(err, errStore) {
		t.Fatalf("probe: %v", err)
	}
	if b.State() != breaker.Open {
		t.Fatalf("after a failed probe: %v", b.State())
	}
	// The store heals: two successful probes close it.
	inner.up.Store(true)
	time.Sleep(openFor + 20*time.Millisecond)
	for i := 0; i < 2; i++ {
		if d, err := b.Allow(ctx, req()); err != nil || !d.Allowed {
			t.Fatalf("probe %d: %+v, %v", i, d, err)
		}
	}
	if b.State() != breaker.Closed {
		t.Fatalf("after 2 good probes: %v", b.State())
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"Closed>Open", "Open>HalfOpen", "HalfOpen>Open", "Open>HalfOpen", "HalfOpen>Closed"}
	if len(changes) != len(want) {
		t.Fatalf("state changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("state changes %v, want %v", changes, want)
		}
	}
}

func TestCancelledContextDoesNotCount(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b2, err := breaker.New(cancelled{}, breaker.Config{Failures: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := b2.Allow(ctx, req()); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled: %v", err)
		}
	}
	if b2.State() != breaker.Closed {
		t.Fatalf("a caller's cancellation opened the circuit")
	}
}

type cancelled struct{}

func (cancelled) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return ratekit.Decision{}, ctx.Err()
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		l   ratekit.Limiter
		cfg breaker.Config
	}{
		"nil limiter":       {nil, breaker.Config{}},
		"negative failures": {&switchable{}, breaker.Config{Failures: -1}},
		"negative probes":   {&switchable{}, breaker.Config{Probes: -1}},
		"negative open for": {&switchable{}, breaker.Config{OpenFor: -time.Second}},
	} {
		if _, err := breaker.New(tc.l, tc.cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// dialCounter counts the dials a go-redis client makes.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedisOutageDials stops a throwaway Redis under a token bucket: without
// the breaker every request dials the dead server; with it, only the
// requests before the circuit opens and the probes do; after the server
// returns, the circuit closes and decisions succeed again.
func TestRedisOutageDials(t *testing.T) {
	srv := redistest.Start(t)
	for _, withBreaker := range []bool{false, true} {
		dials := &dialCounter{}
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
			DialerRetries: 1})
		client.AddHook(dials)
		store, err := redisstore.New(client, redisstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var l ratekit.Limiter
		l, err = tokenbucket.New(tokenbucket.Config{Name: "p", Burst: 100, RefillRate: tokenbucket.PerHour(100), Mode: tokenbucket.Atomic, Store: store})
		if err != nil {
			t.Fatal(err)
		}
		var b *breaker.Limiter
		if withBreaker {
			b, err = breaker.New(l, breaker.Config{Failures: 3, OpenFor: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			l = b
		}
		ctx := context.Background()
		if _, err := l.Allow(ctx, req()); err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		before := dials.n.Load()
		for i := 0; i < 50; i++ {
			if _, err := l.Allow(ctx, req()); err == nil {
				t.Fatal("a decision succeeded with Redis stopped")
			}
		}
		n := dials.n.Load() - before
		t.Logf("breaker %v: 50 requests during the outage dialled %d times", withBreaker, n)
		// go-redis itself stops dialling for a while after PoolSize dial
		// errors in a row, so without the breaker a dial per request is
		// not guaranteed; many more than the breaker's are.
		if !withBreaker && n <= 10 {
			t.Fatalf("without the breaker, 50 requests dialled %d times; want more than 10", n)
		}
		if withBreaker {
			if n > 3 {
				t.Fatalf("with the breaker, 50 requests dialled %d times; want at most 3", n)
			}
			if b.State() != breaker.Open {
				t.Fatalf("state %v during the outage", b.State())
			}
		}
		srv.Restart()
		if withBreaker {
			time.Sleep(350 * time.Millisecond)
		}
		// After a run of dial errors go-redis answers with the last one
		// until a background redial succeeds (about a second).
		var d ratekit.Decision
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if d, err = l.Allow(ctx, req()); err == nil {
				break
			}
		}
		if err != nil || !d.Allowed {
			t.Fatalf("after Redis returned: %+v, %v", d, err)
		}
		if withBreaker && b.State() != breaker.Closed {
			t.Fatalf("state %v after a good probe", b.State())
		}
		client.Close()
	}
}
