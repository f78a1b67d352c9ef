package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/internal/redistest"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/storetest"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func newStore(t *testing.T) (*redisstore.Store, *redis.Client) {
	t.Helper()
	return newStoreMaxInFlight(t, 0)
}

// newStoreMaxInFlight returns a store on the shared test Redis, under a
// prefix of the test's own, with Config.MaxInFlight set to n, and its client.
func newStoreMaxInFlight(t *testing.T, n int) (*redisstore.Store, *redis.Client) {
	t.Helper()
	p := redistest.Prefix(t)
	c := newClient(t, testenv.RedisAddr(t), p)
	s, err := redisstore.New(c, redisstore.Config{Prefix: p, MaxInFlight: n})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// TestConformance runs the kvstore suite with the default coalescing, with
// one round trip in flight (most commands queue and go in pipelines) and
// with coalescing off.
func TestConformance(t *testing.T) {
	for _, n := range []int{0, 1, -1} {
		t.Run("MaxInFlight="+strconv.Itoa(n), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) kvstore.Store {
				s, _ := newStoreMaxInFlight(t, n)
				return s
			})
		})
	}
}

// TestConformanceCluster runs the kvstore suite on a throwaway Redis
// Cluster of 3 masters through a go-redis ClusterClient, with the default
// coalescing and with one round trip in flight, where most commands go in
// pipelines that the client splits by master.
func TestConformanceCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { c.Close() })
	for _, n := range []int{0, 1} {
		t.Run("MaxInFlight="+strconv.Itoa(n), func(t *testing.T) {
			storetest.Run(t, redistest.NewStore(func(prefix string) (kvstore.Store, error) {
				return redisstore.New(c, redisstore.Config{Prefix: prefix, MaxInFlight: n})
			}))
		})
	}
}

func TestNewInvalid(t *testing.T) {
	if _, err := redisstore.New(nil, redisstore.Config{}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("New(nil): %v, want ratekit.ErrInvalidConfig", err)
	}
}

func TestKeyHasHashTag(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	s, _ := redisstore.New(c, redisstore.Config{})
	if got, want := s.Key("api:123"), "ratekit:{api:123}"; got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
}

func TestMalformedRecord(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	for _, v := range []string{"", "12", "a b", "1 2 3", "1 x", "x 1", " ", "1  2", "99999999999999999999 1", "+1 2", "01 2", "1 -0", "1 0x10"} {
		c.Set(ctx, s.Key("bad"), v, time.Minute)
		if _, _, err := s.Get(ctx, "bad"); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("Get of %q: %v, want kvstore.ErrMalformedRecord", v, err)
		}
	}
	// Update's records are a whole number with an expiry: anything else,
	// or a number that never expires, is not one.
	// A take decrements first, a peek reads first: both must refuse it, and
	// change nothing. Under the second refill a minute's expiry is within
	// the bucket's bound, so a huge value reads as a full bucket.
	r := kvstore.Refill{Burst: 10, Rate: 1}
	for _, rr := range []kvstore.Refill{r, {Burst: 1e12, Rate: 1}} {
		for _, v := range []string{"", "a b", "1 2", "x", " ", "0x", "-1", "9007199254740993", "-9223372036854775808"} {
			for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
				c.Set(ctx, s.Key("bad"), v, time.Minute)
				if _, err := s.Update(ctx, "bad", rr, op, 1); !errors.Is(err, kvstore.ErrMalformedRecord) {
					t.Errorf("Update (op %d, %+v) of %q: %v, want kvstore.ErrMalformedRecord", op, rr, v, err)
				}
				if got := c.Get(ctx, s.Key("bad")).Val(); got != v {
					t.Errorf("Update (op %d, %+v) of %q left %q", op, rr, v, got)
				}
			}
		}
	}
	for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
		c.Set(ctx, s.Key("bad"), "12", 0)
		if _, err := s.Update(ctx, "bad", r, op, 1); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("Update (op %d) of a key without expiry: %v, want kvstore.ErrMalformedRecord", op, err)
		}
		c.Del(ctx, s.Key("hash"))
		c.HSet(ctx, s.Key("hash"), "f", "v")
		c.Expire(ctx, s.Key("hash"), time.Minute)
		if _, err := s.Update(ctx, "hash", r, op, 1); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("Update (op %d) of a hash key: %v, want kvstore.ErrMalformedRecord", op, err)
		}
	}
}

// TestTakeRewritesAnExpiryItCannotKeep sets a record and takes from it in
// one transaction, in both orders of a take, where a take must rewrite the
// expiry rather than only change the value: an expiry one millisecond past
// an empty bucket's fill time (as a policy with a slower refill would have
// left it), and a full bucket whose expiry covers one unit less than the
// take. The record left must be within the bound and hold the take's debt
// with a value of at least 0. A millisecond that ends between the commands
// only makes the rewrite more needed, so the checks hold on every run.
func TestTakeRewritesAnExpiryItCannotKeep(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	r := kvstore.Refill{Burst: 100_000, Rate: 1} // 1,000 units a millisecond
	rate := redistest.RateArg(r)
	q := (r.Burst + rate - 1) / rate
	for _, tc := range []struct {
		name     string
		value, n int64
		ttl      time.Duration
	}{
		{"expiry past the bound", (q+1)*rate - 5000, 1, time.Duration(q+1) * time.Millisecond},
		{"expiry a unit short", 5 * rate, 2*rate + 1, 2 * time.Millisecond},
	} {
		for _, letter := range takeLetters {
			for range 5 {
				var (
					res  *redis.Cmd
					ttl  *redis.DurationCmd
					left *redis.StringCmd
				)
				_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
					p.Set(ctx, s.Key("k"), tc.value, tc.ttl)
					res = p.Eval(ctx, updateLua, []string{s.Key("k")}, r.Burst, rate, tc.n, letter)
					ttl = p.PTTL(ctx, s.Key("k"))
					left = p.Get(ctx, s.Key("k"))
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				k := ttl.Val().Milliseconds()
				w, _ := strconv.ParseInt(left.Val(), 10, 64)
				if v, _ := res.Int64(); v < 0 || k > q || w < 0 || k*rate-w < tc.n-2*rate || k*rate-w > tc.n+5000 {
					t.Fatalf("%s, take %s of %d: reply %v, record PTTL %d ms, value %d (debt %d); want an admission, PTTL at most %d, value at least 0",
						tc.name, letter, tc.n, res.Val(), k, w, k*rate-w, q)
				}
			}
		}
	}
}

func TestServerlessOptions(t *testing.T) {
	o := redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{"x:1"}}, 0)
	if !o.ContextTimeoutEnabled || o.MaxRetries != -1 || o.DialerRetries != 1 ||
		o.ReadTimeout != 250*time.Millisecond || o.WriteTimeout != 250*time.Millisecond ||
		o.DialTimeout != 250*time.Millisecond || o.PoolTimeout != 250*time.Millisecond ||
		o.ConnMaxIdleTime != redisstore.ServerlessMaxIdle || o.Dialer == nil {
		t.Fatalf("ServerlessOptions = %+v", o)
	}
	if o := redisstore.ServerlessOptions(&redis.UniversalOptions{}, time.Second); o.ReadTimeout != time.Second {
		t.Fatalf("ReadTimeout = %v, want 1s", o.ReadTimeout)
	}
}

// serverlessClient returns a client of addr built with ServerlessOptions,
// closed at cleanup.
func serverlessClient(t *testing.T, addr string) redis.UniversalClient {
	c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}}, 0))
	t.Cleanup(func() { c.Close() })
	return c
}

func TestDeadRedisFailsWithinDeadlineAndRecovers(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := redisstore.New(serverlessClient(t, srv.Addr), redisstore.Config{})
	late := testenv.MeasureLateness(t)
	peekPatiently(t, s, redistest.Take1) // dials and loads the script: not under test
	srv.Stop()
	for i := 0; i < 3; i++ {
		took, err := redistest.UpdateWithin(s, 200*time.Millisecond)
		if err == nil {
			t.Fatal("Update succeeded with Redis stopped")
		}
		if lateness := late.Max(); took > 200*time.Millisecond+redistest.Slack+lateness {
			t.Fatalf("Update with Redis stopped took %v, deadline 200ms (slack %v, scheduling lateness %v): %v", took, redistest.Slack, lateness, err)
		}
		t.Logf("Redis stopped: error after %v: %v", took, err)
	}
	srv.Restart()
	t.Logf("Redis restarted: %d failed attempts before the first success", redistest.Recovers(t, s))
}

func TestFlushedScriptCacheRecovers(t *testing.T) {
	srv := redistest.Start(t)
	c := serverlessClient(t, srv.Addr)
	s, _ := redisstore.New(c, redisstore.Config{})
	for i := 0; i < 3; i++ {
		if err := c.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		res, err := s.Update(context.Background(), "k", redistest.Take1, kvstore.OpTake, 1)
		if err != nil || !res.OK {
			t.Fatalf("Update after SCRIPT FLUSH = %+v, %v", res, err)
		}
	}
}

func TestOneRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	counter := &commandCounter{}
	c.AddHook(counter)
	s, _ := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	s.Update(ctx, "k", redistest.Take1, kvstore.OpTake, 1) // load the script (EVALSHA, then EVAL)
	counter.N.Store(0)
	for i := 0; i < 10; i++ {
		if _, err := s.Update(ctx, "k", redistest.Take1, kvstore.OpTake, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := counter.N.Load(); got != 10 {
		t.Fatalf("10 updates sent %d commands, want 10", got)
	}
}

// TestRefusedTakesWriteNothing floods an exhausted bucket with takes while
// a transaction WATCHes its key: after the first refusal, which decrements
// and puts the units back, the store reads such a key first, and refused
// takes must not touch it, so the transaction commits. A new store, which
// has seen no refusal, decrements first, and its first refusal must make
// the transaction fail: the check can fail.
func TestRefusedTakesWriteNothing(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	// 1,000 units a millisecond: a take of 10^8 waits 100 s once the bucket
	// is empty.
	r := kvstore.Refill{Burst: 1e9, Rate: 1}
	if res, err := s.Update(ctx, "k", r, kvstore.OpTake, r.Burst); err != nil || !res.OK {
		t.Fatalf("exhausting the bucket: %+v, %v", res, err)
	}
	refused := func(s *redisstore.Store, times int) {
		t.Helper()
		for range times {
			if res, err := s.Update(ctx, "k", r, kvstore.OpTake, 1e8); err != nil || res.OK {
				t.Fatalf("take from an exhausted bucket: %+v, %v", res, err)
			}
		}
	}
	refused(s, 1)
	watched := func(during func()) error {
		return c.Watch(ctx, func(tx *redis.Tx) error {
			during()
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Ping(ctx)
				return nil
			})
			return err
		}, s.Key("k"))
	}
	if err := watched(func() { refused(s, 20) }); err != nil {
		t.Fatalf("20 refused takes touched the key: %v", err)
	}
	fresh, err := redisstore.New(c, redisstore.Config{Prefix: strings.TrimSuffix(s.Key("k"), "{k}")})
	if err != nil {
		t.Fatal(err)
	}
	if err := watched(func() { refused(fresh, 1) }); !errors.Is(err, redis.TxFailedErr) {
		t.Fatalf("a decrement-first refusal: %v, want redis.TxFailedErr (the key was written)", err)
	}
}

// TestRefusalsRunNoScript: refusals after a refusal, and peeks, of one key
// and of several, are decided without the script (see redistest).
func TestRefusalsRunNoScript(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	s, _ := redisstore.New(c, redisstore.Config{})
	redistest.CheckRefusalsRunNoScript(t, srv, s)
}

// TestForeignValues: every read path reports a value no ratekit store
// writes as kvstore.ErrMalformedRecord and leaves the key as it was.
func TestForeignValues(t *testing.T) {
	s, _ := newStore(t)
	redistest.CheckForeignValues(t, testenv.RedisAddr(t), s)
}

// TestLostReplyCountsOnce loses the reply of a script that Redis ran: a
// client that resends a command after a network error (go-redis's
// default, MaxRetries 3) must not run the script a second time, and
// neither must a client built with ServerlessOptions nor a store with one
// round trip in flight, whose takes at once go to Redis in one pipeline.
func TestLostReplyCountsOnce(t *testing.T) {
	addr := testenv.RedisAddr(t)
	for _, tc := range []struct {
		name        string
		opts        *redis.UniversalOptions
		maxInFlight int
	}{
		{"default", &redis.UniversalOptions{}, 0},
		{"serverless", serverlessOptionsForTest(), 0},
		{"pipelined", &redis.UniversalOptions{}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			relay := redistest.StartCutRelay(t, addr)
			tc.opts.Addrs = []string{relay.Addr}
			c := redis.NewUniversalClient(tc.opts)
			defer c.Close()
			p := redistest.Prefix(t)
			s, err := redisstore.New(c, redisstore.Config{Prefix: p, MaxInFlight: tc.maxInFlight})
			if err != nil {
				t.Fatal(err)
			}
			direct, err := redisstore.New(newClient(t, addr, p), redisstore.Config{Prefix: p})
			if err != nil {
				t.Fatal(err)
			}
			redistest.CheckLostReplyCountsOnce(t, relay, s, direct)
			if tc.maxInFlight == 0 {
				redistest.CheckKilledConnectionsCountOnce(t, relay, s, direct)
			}
		})
	}
}

// serverlessOptionsForTest returns ServerlessOptions with a timeout that a
// busy machine meets.
func serverlessOptionsForTest() *redis.UniversalOptions {
	return redisstore.ServerlessOptions(&redis.UniversalOptions{}, 5*time.Second)
}
