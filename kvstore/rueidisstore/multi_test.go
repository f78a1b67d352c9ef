package rueidisstore_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

var two = []kvstore.Update{{Key: "a", Refill: take1, N: 1}, {Key: "b", Refill: take1, N: 1}}

// scriptCalls returns how many times the server of c ran a script with
// EVALSHA and EVAL, from INFO commandstats.
func scriptCalls(t *testing.T, c rueidis.Client) (evalsha, eval int64) {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	calls := func(cmd string) int64 {
		m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(info)
		if m == nil {
			return 0
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		return n
	}
	return calls("evalsha"), calls("eval")
}

// TestUpdateMultiOneRoundTripAndFlushedScript: after SCRIPT FLUSH a
// multi-key update falls back to EVAL and succeeds; otherwise each is one
// EVALSHA, whatever the number of keys.
func TestUpdateMultiOneRoundTripAndFlushedScript(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Addr)
	admin := newClient(t, srv.Addr)
	s, _ := rueidisstore.New(c, rueidisstore.Config{})
	if s.Partitioned() {
		t.Error("a store on one server reports Partitioned")
	}
	ctx := context.Background()
	res := make([]kvstore.OpResult, 2)
	for i := 0; i < 3; i++ {
		if err := admin.Do(ctx, admin.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateMulti(ctx, "", kvstore.OpRefund, two, res); err != nil {
			t.Fatalf("UpdateMulti after SCRIPT FLUSH: %v", err)
		}
	}
	sha0, eval0 := scriptCalls(t, admin)
	for i := 0; i < 10; i++ {
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, two, res); err != nil {
			t.Fatal(err)
		}
	}
	if sha, eval := scriptCalls(t, admin); sha-sha0 != 10 || eval != eval0 {
		t.Fatalf("10 multi-key updates ran %d EVALSHA and %d EVAL, want 10 and 0", sha-sha0, eval-eval0)
	}
}

// TestUpdateMultiMalformedChangesNothing: a key that holds something else
// fails the whole call, and the keys before it in the call are not written.
func TestUpdateMultiMalformedChangesNothing(t *testing.T) {
	s, gc := newStore(t)
	ctx := context.Background()
	if err := gc.Do(ctx, gc.B().Set().Key(s.Key("b")).Value("not a record").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	res := make([]kvstore.OpResult, 2)
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, two, res); !errors.Is(err, kvstore.ErrMalformedRecord) {
		t.Fatalf("err = %v, want ErrMalformedRecord", err)
	}
	if n, _ := gc.Do(ctx, gc.B().Exists().Key(s.Key("a")).Build()).AsInt64(); n != 0 {
		t.Fatal("a was written by a call that failed")
	}
}

// TestUpdateMultiCluster runs on a throwaway 3-master cluster: keys of the
// empty group in different slots are refused before anything is sent (the
// rueidis command builder would panic), and a group puts every key in one
// slot.
func TestUpdateMultiCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	c := newClient(t, cluster.Addrs()...)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	redistest.CheckCluster(t, s, nil)
}

// keyedByLastPart is a grouped tokenbucket.Composite used as its
// documentation says: Request.Key names the subject whose group every
// bucket shares, so "per user and per organisation" makes Key the
// organisation, the last part's key.
type keyedByLastPart struct{ c *tokenbucket.Composite }

func (k keyedByLastPart) rekey(req ratekit.Request) ratekit.Request {
	if n := len(req.Parts); n > 0 && req.Parts[n-1].Key != "" {
		req.Key = req.Parts[n-1].Key
	}
	return req
}

func (k keyedByLastPart) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return k.c.Allow(ctx, k.rekey(req))
}

func (k keyedByLastPart) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return k.c.Peek(ctx, k.rekey(req))
}

func (k keyedByLastPart) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return k.c.Refund(ctx, k.rekey(req))
}

func (k keyedByLastPart) Reset(ctx context.Context, key string) error { return k.c.Reset(ctx, key) }

// compositeHarness is limitertest's composite check on tokenbucket
// composites over rueidisstore: New on client under a prefix of its own,
// NewClients with a rueidis client of its own per composite (from
// newClient) over one shared prefix.
func compositeHarness(client rueidis.Client, newClient func(t testing.TB) rueidis.Client, group bool) limitertest.CompositeHarness {
	composite := func(t testing.TB, c rueidis.Client, p string, policies []limitertest.Config) ratekit.Limiter {
		s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
		if err != nil {
			t.Fatal(err)
		}
		buckets := make([]tokenbucket.Bucket, len(policies))
		for i, pol := range policies {
			buckets[i] = tokenbucket.Bucket{Name: pol.Name, Burst: pol.Quota, RefillRate: tokenbucket.Rate{Tokens: pol.Quota, Per: pol.Window}}
		}
		l, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{Buckets: buckets, Mode: tokenbucket.Atomic, Store: s, Group: group})
		if err != nil {
			t.Fatal(err)
		}
		if group {
			return keyedByLastPart{l}
		}
		return l
	}
	prefix := func(t testing.TB) string {
		p := redistest.Prefix(t)
		if client.Mode() != rueidis.ClientModeCluster {
			cleanKeys(t, client, p)
		}
		return p
	}
	return limitertest.CompositeHarness{
		New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
			return composite(t, client, prefix(t), policies)
		},
		NewClients: func(t testing.TB, policies []limitertest.Config, n int) []ratekit.Limiter {
			p := prefix(t)
			out := make([]ratekit.Limiter, n)
			for i := range out {
				out[i] = composite(t, newClient(t), p, policies)
			}
			return out
		},
		Algorithm: ratekit.TokenBucket,
	}
}

// TestComposite runs limitertest's composite check on tokenbucket
// composites over rueidisstore on one server, with the buckets in the
// ordinary key space and grouped by the request's key: one script per
// decision, four rueidis clients in the concurrency check.
func TestComposite(t *testing.T) {
	addr := testenv.RedisAddr(t)
	mk := func(t testing.TB) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	client := mk(t)
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprintf("group=%v", group), func(t *testing.T) {
			limitertest.RunComposite(t, compositeHarness(client, mk, group))
		})
	}
}

// TestCompositeCluster runs the composite check on a throwaway 3-master
// Redis Cluster, where a composite needs Group (refused without).
func TestCompositeCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	mk := func(t testing.TB) rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cluster.Addrs(), DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	client := mk(t)
	s, err := rueidisstore.New(client, rueidisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	buckets := []tokenbucket.Bucket{{Name: "a", Burst: 1, RefillRate: tokenbucket.PerSecond(1)}, {Name: "b", Burst: 2, RefillRate: tokenbucket.PerSecond(1)}}
	if _, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{Buckets: buckets, Mode: tokenbucket.Atomic, Store: s}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("a composite on a cluster without Group: %v, want ErrInvalidConfig", err)
	}
	limitertest.RunComposite(t, compositeHarness(client, mk, true))
}

// TestUpdateMultiArgumentsFollowEachCall: the store caches a call's script
// arguments; calls with other policies and costs must not get them.
func TestUpdateMultiArgumentsFollowEachCall(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := rueidisstore.New(newClient(t, srv.Addr), rueidisstore.Config{})
	redistest.CheckMultiArguments(t, s, "args:")
}
