package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

var two = []kvstore.Update{{Key: "a", Refill: redistest.Take1, N: 1}, {Key: "b", Refill: redistest.Take1, N: 1}}

func TestUpdateMultiOneRoundTripAndFlushedScript(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	counter := &commandCounter{}
	c.AddHook(counter)
	s, _ := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	res := make([]kvstore.OpResult, 2)
	for i := 0; i < 3; i++ {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateMulti(ctx, "", kvstore.OpRefund, two, res); err != nil {
			t.Fatalf("UpdateMulti after SCRIPT FLUSH: %v", err)
		}
	}
	counter.N.Store(0)
	for i := 0; i < 10; i++ {
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, two, res); err != nil || !res[0].OK || !res[1].OK {
			t.Fatalf("take %d: %+v, %v", i, res, err)
		}
	}
	if got := counter.N.Load(); got != 10 {
		t.Fatalf("10 multi-key updates sent %d commands, want 10", got)
	}
	if s.Partitioned() {
		t.Error("a *redis.Client store reports Partitioned")
	}
}

// TestUpdateMultiMalformedChangesNothing: a key that holds something else
// fails the whole call, and the keys before it in the call keep their
// level, whether they were absent or live (a take decrements a live key
// first and must put its units back).
func TestUpdateMultiMalformedChangesNothing(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	if err := c.Set(ctx, s.Key("b"), "not a record", 0).Err(); err != nil {
		t.Fatal(err)
	}
	res := make([]kvstore.OpResult, 2)
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, two, res); !errors.Is(err, kvstore.ErrMalformedRecord) {
		t.Fatalf("err = %v, want ErrMalformedRecord", err)
	}
	if n, _ := c.Exists(ctx, s.Key("a")).Result(); n != 0 {
		t.Fatal("a was written by a call that failed")
	}
	// A refill slow enough that a's key lives through the test.
	slow := kvstore.Refill{Burst: 1_000_000_000, Rate: 1}
	if _, err := s.Update(ctx, "a", slow, kvstore.OpTake, 1); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"not a record", "-5", "9223372036854775807"} {
		if err := c.Set(ctx, s.Key("b"), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		live := readState(t, c, s.Key("a"))
		if !live.present {
			t.Fatal("a's key is gone")
		}
		for _, letter := range takeLetters {
			_, err := multiWith(ctx, c, []string{s.Key("a"), s.Key("b")}, []kvstore.Refill{slow, slow}, []int64{1, 1}, letter, "")
			if err == nil || !strings.Contains(err.Error(), kvstore.ErrMalformedRecord.Error()) {
				t.Fatalf("b = %q, take %s: err = %v, want %q", v, letter, err, kvstore.ErrMalformedRecord.Error())
			}
			if got := readState(t, c, s.Key("a")); got != live {
				t.Fatalf("b = %q, take %s: a went from %+v to %+v", v, letter, live, got)
			}
		}
	}
}

// TestUpdateMultiCluster runs on a throwaway 3-master cluster: keys of the
// empty group in different slots are refused before anything is sent, and
// a group puts every key in one slot.
func TestUpdateMultiCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { c.Close() })
	counter := &commandCounter{}
	c.AddHook(counter)
	s, err := redisstore.New(c, redisstore.Config{Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	redistest.CheckCluster(t, s, counter.N.Load)
}

// TestUpdateMultiArgumentsFollowEachCall: the store caches a call's script
// arguments; calls with other policies and costs must not get them.
func TestUpdateMultiArgumentsFollowEachCall(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	s, _ := redisstore.New(c, redisstore.Config{})
	redistest.CheckMultiArguments(t, s, "args:")
}
