package rueidisstore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/kvstore/storetest"
)

var take1 = kvstore.Refill{Burst: 10, Rate: 1}

// slow refills one unit per microsecond of a bucket of 10^15, and big is a
// take from it: a test's milliseconds refill a negligible share of one take.
var slow = kvstore.Refill{Burst: 1e15, Rate: 1}

const big = 1e12

// near reports whether level is at want or above it by less than 1000 s of refill.
func near(level, want int64) bool { return level >= want && level < want+1e9 }

// newClient returns a rueidis client of the Redis at addrs, closed at
// cleanup.
func newClient(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// cleanKeys deletes every key under p from the shared test Redis at
// cleanup, through c.
func cleanKeys(t testing.TB, c rueidis.Client, p string) {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		var cursor uint64
		for {
			e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(p+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				return
			}
			if len(e.Elements) > 0 {
				c.Do(ctx, c.B().Del().Key(e.Elements...).Build())
			}
			if cursor = e.Cursor; cursor == 0 {
				return
			}
		}
	})
}

// newStore returns a store on the shared test Redis under a prefix of the
// test's own, and its client, which removes the prefix's keys at cleanup.
func newStore(t *testing.T) (*rueidisstore.Store, rueidis.Client) {
	t.Helper()
	p := redistest.Prefix(t)
	c := newClient(t, testenv.RedisAddr(t))
	cleanKeys(t, c, p)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) kvstore.Store {
		s, _ := newStore(t)
		return s
	})
}

// TestConformanceCluster runs the suite on a throwaway 3-master Redis
// Cluster, where rueidis sends each key's command to its slot's master.
func TestConformanceCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	c := newClient(t, cluster.Addrs()...)
	storetest.Run(t, redistest.NewStore(func(prefix string) (kvstore.Store, error) {
		return rueidisstore.New(c, rueidisstore.Config{Prefix: prefix})
	}))
}

func TestNewInvalid(t *testing.T) {
	if _, err := rueidisstore.New(nil, rueidisstore.Config{}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("nil client: %v, want ratekit.ErrInvalidConfig", err)
	}
	// The engine's own tests check the prefix; the Store passes it on.
	c := newClient(t, testenv.RedisAddr(t))
	if _, err := rueidisstore.New(c, rueidisstore.Config{Prefix: "{x}"}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("a braced prefix: %v, want ratekit.ErrInvalidConfig", err)
	}
	s, err := rueidisstore.New(c, rueidisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Key("api:123"), "ratekit:{api:123}"; got != want {
		t.Errorf("Key = %q, want %q", got, want)
	}
}

func TestMalformedRecord(t *testing.T) {
	s, gc := newStore(t)
	ctx := context.Background()
	for _, v := range []string{"", "12", "a b", "1 2 3", "1 x", "x 1", " "} {
		gc.Do(ctx, gc.B().Set().Key(s.Key("bad")).Value(v).ExSeconds(60).Build())
		if _, _, err := s.Get(ctx, "bad"); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("Get of %q: %v, want kvstore.ErrMalformedRecord", v, err)
		}
		// Update's records are a whole number with an expiry.
		if _, err := s.Update(ctx, "bad", take1, kvstore.OpTake, 1); v != "12" && !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("Update of %q: %v, want kvstore.ErrMalformedRecord", v, err)
		}
	}
	gc.Do(ctx, gc.B().Set().Key(s.Key("bad")).Value("12").Build())
	if _, err := s.Update(ctx, "bad", take1, kvstore.OpTake, 1); !errors.Is(err, kvstore.ErrMalformedRecord) {
		t.Errorf("Update of a key without expiry: %v, want kvstore.ErrMalformedRecord", err)
	}
	gc.Do(ctx, gc.B().Hset().Key(s.Key("hash")).FieldValue().FieldValue("f", "v").Build())
	if _, err := s.Update(ctx, "hash", take1, kvstore.OpTake, 1); err == nil {
		t.Error("Update of a hash key succeeded")
	}
	// Peeks, and takes after a refusal, read the key before any script.
	if _, err := s.Update(ctx, "hash", take1, kvstore.OpPeek, 1); err == nil {
		t.Error("a peek of a hash key succeeded")
	}
	for _, v := range []string{"", "a b", "-1", "9007199254740992"} {
		gc.Do(ctx, gc.B().Set().Key(s.Key("bad")).Value(v).ExSeconds(60).Build())
		if _, err := s.Update(ctx, "bad", take1, kvstore.OpPeek, 1); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("a peek of %q: %v, want kvstore.ErrMalformedRecord", v, err)
		}
	}
}

// TestForeignValues: every read path reports a value no ratekit store
// writes as kvstore.ErrMalformedRecord and leaves the key as it was.
func TestForeignValues(t *testing.T) {
	s, _ := newStore(t)
	redistest.CheckForeignValues(t, testenv.RedisAddr(t), s)
}

// TestRefusalsRunNoScript: refusals after a refusal, and peeks, of one key
// and of several, are decided without the script (see redistest).
func TestRefusalsRunNoScript(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := rueidisstore.New(newClient(t, srv.Addr), rueidisstore.Config{})
	redistest.CheckRefusalsRunNoScript(t, srv, s)
}

// TestFlushedScriptCacheRecovers flushes the script cache of a throwaway
// server before each update, alone and with 16 updates at once (which
// rueidis pipelines): every update must fall back to EVAL and succeed.
func TestFlushedScriptCacheRecovers(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	s, _ := rueidisstore.New(c, rueidisstore.Config{})
	ctx := context.Background()
	flush := func() {
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range int64(3) {
		flush()
		if res, err := s.Update(ctx, "k", slow, kvstore.OpTake, big); err != nil || !res.OK || !near(res.Remaining, slow.Burst-(i+1)*big) {
			t.Fatalf("Update after SCRIPT FLUSH = %+v, %v", res, err)
		}
	}
	flush()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			if _, err := s.Update(ctx, "many", slow, kvstore.OpTake, big); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if res, err := s.Update(ctx, "many", slow, kvstore.OpPeek, 1); err != nil || !near(res.Remaining, slow.Burst-16*big) {
		t.Errorf("after 16 takes of %d the level is %+v, %v; want about %d", int64(big), res, err, slow.Burst-16*big)
	}
}

// TestDeadlineOnPausedRedis pauses a throwaway server: an update must
// return within its context's deadline with an error that matches
// context.DeadlineExceeded, and succeed again once the server resumes.
func TestDeadlineOnPausedRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	s, _ := rueidisstore.New(c, rueidisstore.Config{})
	if _, err := s.Update(context.Background(), "k", take1, kvstore.OpTake, 1); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	start := time.Now()
	_, err := s.Update(ctx, "k", take1, kvstore.OpTake, 1)
	cancel()
	elapsed := time.Since(start)
	srv.Resume()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("update on a paused server: %v, want context.DeadlineExceeded", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("update on a paused server returned after %v, deadline 200ms", elapsed)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := s.Update(ctx, "k", take1, kvstore.OpTake, 1)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no update succeeded within 10s of resuming: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServerlessOptions(t *testing.T) {
	o := rueidisstore.ServerlessOptions(&rueidis.ClientOption{InitAddress: []string{"x:1"}}, 0)
	if o.ConnWriteTimeout != 250*time.Millisecond || o.Dialer.KeepAlive != 250*time.Millisecond ||
		o.Dialer.Timeout != 250*time.Millisecond || !o.DisableRetry || o.InitAddress[0] != "x:1" || o.PipelineMultiplex != -1 {
		t.Fatalf("ServerlessOptions(0) = %+v", o)
	}
	o = rueidisstore.ServerlessOptions(&rueidis.ClientOption{Dialer: net.Dialer{Timeout: time.Second}, PipelineMultiplex: 1}, 100*time.Millisecond)
	if o.ConnWriteTimeout != 100*time.Millisecond || o.Dialer.KeepAlive != 100*time.Millisecond || o.Dialer.Timeout != time.Second || o.PipelineMultiplex != 1 {
		t.Fatalf("ServerlessOptions(100ms) over a dial timeout of 1s and two connections = %+v", o)
	}
}

// TestLostReplyCountsOnce loses the reply of a script that Redis ran:
// rueidis resends only read-only commands after a network error (and
// nothing with DisableRetry, which ServerlessOptions sets), so no script
// runs twice, on a default client or a serverless one, and on a store
// that has served a burst, whose lone commands go on a dedicated
// connection.
func TestLostReplyCountsOnce(t *testing.T) {
	addr := testenv.RedisAddr(t)
	for name, o := range map[string]*rueidis.ClientOption{
		"default":             {DisableCache: true},
		"serverless":          rueidisstore.ServerlessOptions(&rueidis.ClientOption{DisableCache: true}, 5*time.Second),
		"default after burst": {DisableCache: true},
	} {
		t.Run(name, func(t *testing.T) {
			relay := redistest.StartCutRelay(t, addr)
			o.InitAddress = []string{relay.Addr}
			c, err := rueidis.NewClient(*o)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			p := redistest.Prefix(t)
			dc := newClient(t, addr)
			cleanKeys(t, dc, p)
			direct, err := rueidisstore.New(dc, rueidisstore.Config{Prefix: p})
			if err != nil {
				t.Fatal(err)
			}
			s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(name, "after burst") {
				burst(t, s)
			}
			redistest.CheckLostReplyCountsOnce(t, relay, s, direct)
			redistest.CheckKilledConnectionsCountOnce(t, relay, s, direct)
		})
	}
}
