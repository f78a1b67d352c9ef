package breaker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/internal/testenv"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

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
		return ratekit.Decision{}, ratekit.ErrCostExceedsQuota
	}
	if !s.up.Load() {
		return ratekit.Decision{}, errStore
	}
	return ratekit.Decision{Allowed: true, Quota: 10, Remaining: 9}, nil
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
		if _, err := b.Allow(ctx, ratekit.Request{Key: "k", Cost: 11}); !errors.Is(err, ratekit.ErrCostExceedsQuota) {
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
