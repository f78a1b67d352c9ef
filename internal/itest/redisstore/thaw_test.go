package redisstore_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/itest/faultproxy"
	"github.com/ratekit/ratekit/internal/itest/thawtest"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// opaqueConn hides the socket under a connection, as crypto/tls.Conn does:
// go-redis's health check cannot peek at it.
type opaqueConn struct{ net.Conn }

// TestThawWithSilentConnections is a Lambda instance thawing after a NAT
// gateway dropped every pooled connection without a FIN or RST: the client
// (ServerlessOptions) has filled its pool, sat idle (frozen), and now every
// pooled connection swallows what it is sent and never answers, while new
// connections work. Decisions made one after another, each with a
// Guard-like deadline, must see at most one failure (none when the freeze
// outlasted ConnMaxIdleTime), and the first success must come within one
// deadline of it. The store must not apply any take twice: Redis counts the
// successful takes, and at most the failed ones besides. Peeks, which the
// store sends as a MULTI/EXEC instead of the script, must recover as takes
// do.
func TestThawWithSilentConnections(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opaque  bool          // connections hide their socket (as TLS does)
		maxIdle time.Duration // ConnMaxIdleTime; 0 keeps ServerlessOptions'
		guard   bool          // decide through a tokenbucket behind a Guard
		peek    bool          // decide with peeks, not takes
		maxFail int
	}{
		{name: "silent within ConnMaxIdleTime", maxFail: 1},
		{name: "silent within ConnMaxIdleTime, through a Guard", guard: true, maxFail: 1},
		{name: "silent within ConnMaxIdleTime, opaque connections", opaque: true, maxFail: 1},
		{name: "frozen beyond ConnMaxIdleTime", maxIdle: time.Second, maxFail: 0},
		{name: "silent within ConnMaxIdleTime, peeks", peek: true, maxFail: 1},
		{name: "silent within ConnMaxIdleTime, opaque connections, peeks", opaque: true, peek: true, maxFail: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testThaw(t, tc.opaque, tc.maxIdle, tc.guard, tc.peek, tc.maxFail)
		})
	}
}

func testThaw(t *testing.T, opaque bool, maxIdle time.Duration, guard, peek bool, maxFail int) {
	const timeout = 500 * time.Millisecond // Guard.Timeout and ServerlessOptions' timeout
	srv := redistest.Start(t)
	relay := faultproxy.StartRelay(t, srv.Addr)
	o := &redis.UniversalOptions{Addrs: []string{relay.Addr}}
	if opaque {
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return opaqueConn{c}, nil
		}
	}
	redisstore.ServerlessOptions(o, timeout)
	if maxIdle > 0 {
		o.ConnMaxIdleTime = maxIdle
	}
	c := redis.NewUniversalClient(o)
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	take := thawtest.Take(s)

	// Fill the pool: concurrent takes open several connections. The
	// client's timeout can cut a take short on a loaded machine: such a
	// take may or may not have counted, and the filling goes on.
	var wg sync.WaitGroup
	var mu sync.Mutex
	filled, fillFailed := 0, 0
	for range 16 {
		wg.Go(func() {
			for range 10 {
				err := take(5 * time.Second)
				mu.Lock()
				if err == nil {
					filled++
				} else {
					fillFailed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if filled < 100 {
		t.Fatalf("%d of 160 takes failed while filling the pool", fillFailed)
	}
	if n := relay.Accepted(); n < 2 {
		t.Fatalf("filling the pool opened %d connections, want at least 2", n)
	}
	// The freeze: longer than the idle time after which a connection is in
	// doubt (a NAT drops a flow after minutes; what matters is that the
	// connections were idle when they died).
	time.Sleep(1500 * time.Millisecond)
	decide := func() error { return take(timeout) }
	if peek {
		peek := thawtest.Peek(s)
		decide = func() error { return peek(timeout) }
	}
	if guard {
		l, err := tokenbucket.New(tokenbucket.Config{Name: "thaw", Burst: 1_000_000, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: s})
		if err != nil {
			t.Fatal(err)
		}
		g, err := httplimit.NewGuard(httplimit.GuardConfig{Limiter: l, OnError: httplimit.FailClosed, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		decide = func() error {
			return g.Check(context.Background(), ratekit.Request{Key: "k", Cost: 1}, http.Header{}).Err
		}
	}
	silenced := relay.Silence()

	log := thawtest.Decide(decide, thawtest.Count(20))
	failed, recovery := thawtest.Read(t, silenced, log)
	if failed > maxFail {
		t.Errorf("%d decisions failed after the thaw, want at most %d", failed, maxFail)
	}
	// One failed decision lasts one timeout; the next must succeed within
	// one more.
	if limit := time.Duration(maxFail+1)*timeout + redistest.Slack; recovery > limit {
		t.Errorf("first success %v after the thaw, want within %v", recovery, limit)
	}

	if guard {
		return
	}
	// Exactly the successful takes reached Redis.
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer direct.Close()
	ds, _ := redisstore.New(direct, redisstore.Config{})
	rec, err := ds.Update(context.Background(), "k", thawtest.Refill, kvstore.OpPeek, 1)
	if err != nil {
		t.Fatalf("Peek = %+v, %v", rec, err)
	}
	applied := thawtest.Applied(rec.Remaining)
	// A take that failed on a new connection (a loaded machine) may have
	// run in Redis; none may count twice.
	ok, unsure := int64(filled+len(log)-failed), int64(failed+fillFailed)
	if peek {
		ok, unsure = int64(filled), int64(fillFailed)
	}
	if applied < ok || applied > ok+unsure {
		t.Errorf("Redis counted %d takes; %d succeeded and %d failed", applied, ok, unsure)
	}
}
