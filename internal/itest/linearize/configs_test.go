package linearize_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

// cacheSize is the denied-key cache's size when it is on.
const cacheSize = 1000

// slow is a refill too slow to matter during a run: quota units per 100
// days, so that no whole unit comes back in a run's seconds.
var slow = tokenbucket.Rate{Tokens: quota, Per: 2400 * time.Hour}

// farWindow is the durable policies' window, long enough that no run
// crosses a boundary (the fixed windows are aligned to the Unix epoch).
const farWindow = 100000 * time.Hour

func bucket(t *testing.T, store kvstore.Store, mode tokenbucket.Mode, cache bool) limiter {
	t.Helper()
	cfg := tokenbucket.Config{Name: "lin", Burst: quota, RefillRate: slow, Mode: mode, Store: store}
	if cache {
		cfg.DeniedCacheSize = cacheSize
	}
	l, err := tokenbucket.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func composite(t *testing.T, store kvstore.Store) limiter {
	t.Helper()
	c, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{
		Buckets: []tokenbucket.Bucket{{Name: "burst", Burst: quota, RefillRate: slow}, {Name: "daily", Burst: quota, RefillRate: slow}},
		Mode:    tokenbucket.Atomic,
		Store:   store,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// planned returns a tokenbucket.Planned whose every key has one plan: a
// bucket of quota refilled slowly and a monthly quota, both of quota
// units. group is PlannedConfig.Group, which a partitioned store
// (DynamoDB) requires.
func planned(t *testing.T, store kvstore.Store, group bool) limiter {
	t.Helper()
	plan := ratekit.Plan{Name: "lin", Policies: []ratekit.Policy{
		{Name: "burst", Quota: quota, Window: slow.Per, Algorithm: ratekit.TokenBucket},
		{Name: "monthly", Quota: quota, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}},
	}}
	p, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "lin", Store: store, Group: group,
		Plan: func(context.Context, string) (ratekit.Plan, error) { return plan, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func memory(t *testing.T) kvstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{MaxKeys: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func goRedis(t *testing.T) kvstore.Store {
	t.Helper()
	p := redistest.Prefix(t)
	s, err := redisstore.New(redisclient.Client(t, testenv.RedisAddr(t), p), redisstore.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func rueidisStore(t *testing.T) kvstore.Store {
	t.Helper()
	addr := testenv.RedisAddr(t)
	redisclient.Client(t, addr, redistest.Prefix(t)) // deletes the run's keys at its end
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var dynamoTable sync.Once

func dynamo(t *testing.T) kvstore.Store {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true // dynalite closes idle connections under a request (see dynamostore's tests)
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(testenv.DynamoDBEndpoint(t)),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
		HTTPClient: &http.Client{Transport: tr},
	})
	table := "ratekit_linearize"
	if v := os.Getenv("RATEKIT_DYNAMODB_TABLE"); v != "" {
		table = v
	}
	var err error
	dynamoTable.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err = dynamostore.CreateTable(ctx, client, table); err != nil && os.Getenv("RATEKIT_DYNAMODB_TABLE") == "" {
			err = nil // dynalite has no TTL; the Store checks expiry itself
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// A fixed clock: DynamoDB has none, and with each request's own clock
	// two concurrent requests report levels apart by the refill between
	// their clock readings (docs/dynamodb.md). The concurrency of the
	// conditional writes is what this checks.
	now := time.Now()
	s, err := dynamostore.New(client, dynamostore.Config{Table: table, Prefix: redistest.Prefix(t), MaxAttempts: 1000,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// postgres returns a store on a pool of its own for t's run.
func postgres(t *testing.T) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 16, ""), pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func durableLimiter(t *testing.T, store *pgstore.Store, alg ratekit.Algorithm, name string, cache bool) *durable.Limiter {
	t.Helper()
	cfg := durable.Config{
		Store: store, Prefix: pgstoretest.Prefix(t) + name,
		Policy: ratekit.Policy{Name: name, Quota: quota, Window: farWindow, Algorithm: alg}, Durability: durable.Unlogged,
	}
	if cache {
		cfg.DeniedCacheSize = cacheSize
	}
	l, err := durable.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// configs are the configurations that promise linearizable decisions.
func configs() []config {
	cs := []config{
		{name: "tokenbucket/memstore", parts: 1, runs: 40, new: func(t *testing.T, cache bool) limiter { return bucket(t, memory(t), tokenbucket.Atomic, cache) }},
		{name: "tokenbucket/redisstore", parts: 1, new: func(t *testing.T, cache bool) limiter { return bucket(t, goRedis(t), tokenbucket.Atomic, cache) }},
		{name: "tokenbucket/rueidisstore", parts: 1, new: func(t *testing.T, cache bool) limiter { return bucket(t, rueidisStore(t), tokenbucket.Atomic, cache) }},
		{name: "tokenbucket/dynamostore", parts: 1, new: func(t *testing.T, cache bool) limiter { return bucket(t, dynamo(t), tokenbucket.Atomic, cache) }},
		{name: "tokenbucket-composite/memstore", parts: 2, runs: 40, noCache: true, new: func(t *testing.T, _ bool) limiter { return composite(t, memory(t)) }},
		{name: "tokenbucket-composite/redisstore", parts: 2, noCache: true, new: func(t *testing.T, _ bool) limiter { return composite(t, goRedis(t)) }},
		{name: "tokenbucket-composite/rueidisstore", parts: 2, noCache: true, new: func(t *testing.T, _ bool) limiter { return composite(t, rueidisStore(t)) }},
		{name: "tokenbucket-planned/memstore", parts: 2, runs: 40, noCache: true, new: func(t *testing.T, _ bool) limiter { return planned(t, memory(t), false) }},
		{name: "tokenbucket-planned/redisstore", parts: 2, noCache: true, new: func(t *testing.T, _ bool) limiter { return planned(t, goRedis(t), false) }},
		{name: "tokenbucket-planned/dynamostore", parts: 2, noCache: true, new: func(t *testing.T, _ bool) limiter { return planned(t, dynamo(t), true) }},
		{name: "durable-composite", parts: 4, new: func(t *testing.T, cache bool) limiter {
			s := postgres(t)
			c, err := durable.NewComposite(
				durableLimiter(t, s, ratekit.TokenBucket, "bucket", cache),
				durableLimiter(t, s, ratekit.FixedWindow, "fixed", cache),
				durableLimiter(t, s, ratekit.SlidingWindow, "sliding", cache),
				durableLimiter(t, s, ratekit.SlidingLog, "log", cache))
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
	}
	for _, alg := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog} {
		cs = append(cs, config{name: "durable/" + alg.String(), parts: 1, new: func(t *testing.T, cache bool) limiter {
			return durableLimiter(t, postgres(t), alg, "lin", cache)
		}})
	}
	return cs
}

// TestLinearizable checks every configuration.
func TestLinearizable(t *testing.T) {
	for _, c := range configs() {
		t.Run(c.name, func(t *testing.T) { checkConfig(t, c) })
	}
}

// TestCatchesAnInexactLimiter: the check finds Eventual mode's lost updates
// (a get and a set, with no atomic step between) on Redis, which the
// package documents as inexact. A check that passed it could not fail.
func TestCatchesAnInexactLimiter(t *testing.T) {
	caught := 0
	const tries = 10
	for run := range tries {
		l := bucket(t, goRedis(t), tokenbucket.Eventual, false)
		if check(t, 1, record(t, l, 1, 8, 400, []string{"a", "b"}, uint64(run)+1)) != "" {
			caught++
		}
	}
	t.Logf("%d of %d histories of Eventual mode on Redis are not linearizable", caught, tries)
	if caught == 0 {
		t.Fatalf("the check passed all %d histories of Eventual mode, an inexact limiter", tries)
	}
}

// TestRefundRacesFirstTake races a refund with the first take of a new key
// on PostgreSQL, where neither finds a row: on every algorithm and on a
// composite of all four, the two decisions must be linearizable (a refund
// that found no row used to report a row committed after it looked).
func TestRefundRacesFirstTake(t *testing.T) {
	s := postgres(t)
	for _, c := range []struct {
		name  string
		parts int
		new   func() limiter
	}{
		{"FixedWindow", 1, func() limiter { return durableLimiter(t, s, ratekit.FixedWindow, "race", false) }},
		{"SlidingWindow", 1, func() limiter { return durableLimiter(t, s, ratekit.SlidingWindow, "race", false) }},
		{"TokenBucket", 1, func() limiter { return durableLimiter(t, s, ratekit.TokenBucket, "race", false) }},
		{"SlidingLog", 1, func() limiter { return durableLimiter(t, s, ratekit.SlidingLog, "race", false) }},
		{"composite", 4, func() limiter {
			c, err := durable.NewComposite(
				durableLimiter(t, s, ratekit.TokenBucket, "b", false),
				durableLimiter(t, s, ratekit.FixedWindow, "f", false),
				durableLimiter(t, s, ratekit.SlidingWindow, "s", false),
				durableLimiter(t, s, ratekit.SlidingLog, "l", false))
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.new()
			const trials = 500
			for i := range trials {
				key := fmt.Sprintf("new-%d", i)
				h := race(t, l, c.parts, key)
				if v := check(t, c.parts, h); v != "" {
					t.Fatalf("trial %d: a refund racing the first take of a new key is not linearizable\n%s", i, v)
				}
			}
			t.Logf("%d trials, all linearizable", trials)
		})
	}
}

// race runs Allow(3) and Refund(2) on key at once and returns the history.
func race(t *testing.T, l limiter, parts int, key string) []porcupine.Operation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	ops := make([]porcupine.Operation, 2)
	var wg sync.WaitGroup
	ready := make(chan struct{})
	for i, in := range []input{{kind: allow, key: key, cost: 3}, {kind: refund, key: key, cost: 2}} {
		wg.Go(func() {
			<-ready
			req := ratekit.Request{Key: key, Cost: in.cost}
			call := time.Since(start).Nanoseconds()
			var d ratekit.Decision
			var err error
			if in.kind == allow {
				d, err = l.Allow(ctx, req)
			} else {
				d, err = l.Refund(ctx, req)
			}
			ret := time.Since(start).Nanoseconds()
			if err != nil {
				t.Error(err)
			}
			ops[i] = porcupine.Operation{ClientId: i, Input: in, Call: call, Output: outputOf(d, parts), Return: ret}
		})
	}
	close(ready)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return ops
}
