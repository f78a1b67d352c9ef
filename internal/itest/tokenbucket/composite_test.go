package tokenbucket_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

func newComposite(t testing.TB, cfg tokenbucket.CompositeConfig) *tokenbucket.Composite {
	t.Helper()
	c, err := tokenbucket.NewComposite(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// twoBuckets is "10 a second and 30 a minute".
var twoBuckets = []tokenbucket.Bucket{
	{Name: "second", Burst: 10, RefillRate: tokenbucket.PerSecond(10)},
	{Name: "minute", Burst: 30, RefillRate: tokenbucket.PerMinute(30)},
}

func TestNewCompositeRefusesInvalidConfig(t *testing.T) {
	store := memStore(t, nil)
	good := tokenbucket.CompositeConfig{Buckets: twoBuckets, Mode: tokenbucket.Atomic, Store: store}
	if _, err := tokenbucket.NewComposite(good); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { cluster.Close() })
	onCluster, err := redisstore.New(cluster, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*tokenbucket.CompositeConfig){
		"no buckets": func(c *tokenbucket.CompositeConfig) { c.Buckets = nil },
		"invalid bucket": func(c *tokenbucket.CompositeConfig) {
			c.Buckets = []tokenbucket.Bucket{{Name: "a", Burst: 0, RefillRate: tokenbucket.PerSecond(1)}}
		},
		"invalid name": func(c *tokenbucket.CompositeConfig) {
			c.Buckets = []tokenbucket.Bucket{{Name: "a b", Burst: 1, RefillRate: tokenbucket.PerSecond(1)}}
		},
		"duplicate names": func(c *tokenbucket.CompositeConfig) { c.Buckets = []tokenbucket.Bucket{twoBuckets[0], twoBuckets[0]} },
		"overlapping names": func(c *tokenbucket.CompositeConfig) {
			c.Buckets = []tokenbucket.Bucket{twoBuckets[0], {Name: "second:x", Burst: 1, RefillRate: tokenbucket.PerSecond(1)}}
		},
		"eventual":          func(c *tokenbucket.CompositeConfig) { c.Mode = tokenbucket.Eventual },
		"no mode":           func(c *tokenbucket.CompositeConfig) { c.Mode = 0 },
		"unknown mode":      func(c *tokenbucket.CompositeConfig) { c.Mode = 7 },
		"nil store":         func(c *tokenbucket.CompositeConfig) { c.Store = nil },
		"not multi":         func(c *tokenbucket.CompositeConfig) { c.Store = eventualOnly{store} },
		"cluster, no group": func(c *tokenbucket.CompositeConfig) { c.Store = onCluster },
	} {
		cfg := good
		mutate(&cfg)
		if _, err := tokenbucket.NewComposite(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
	cfg := good
	cfg.Store, cfg.Group = onCluster, true
	if _, err := tokenbucket.NewComposite(cfg); err != nil {
		t.Errorf("cluster with Group: %v", err)
	}
}

// TestCompositeDecisions walks a composite through a deterministic scenario
// on a fake clock: each bucket's part, the sum, all-or-nothing denials,
// Parts, Peek, Refund and Reset.
func TestCompositeDecisions(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	c := newComposite(t, tokenbucket.CompositeConfig{Buckets: twoBuckets, Mode: tokenbucket.Atomic, Store: memStore(t, clock.Now)})
	ctx := context.Background()
	pol := c.Policies()
	if pol[0] != (ratekit.Policy{Name: "second", Quota: 10, Window: time.Second, Algorithm: ratekit.TokenBucket}) || pol[1] != (ratekit.Policy{Name: "minute", Quota: 30, Window: time.Minute, Algorithm: ratekit.TokenBucket}) {
		t.Fatalf("Policies() = %+v", pol)
	}
	parts := func(d ratekit.Decision) string {
		var b strings.Builder
		for _, p := range d.Parts {
			fmt.Fprintf(&b, "%s:%v/%d ", p.Policy.Name, p.Allowed, p.Remaining)
		}
		return b.String()
	}
	type step struct {
		advance time.Duration
		call    string
		req     ratekit.Request
		allowed bool
		parts   string // each part's name:allowed/remaining
		top     string // the summed decision's policy name
		retry   time.Duration
	}
	user := ratekit.Request{Key: "u", Cost: 1}
	for i, s := range []step{
		{call: "allow", req: ratekit.Request{Key: "u", Cost: 4}, allowed: true, parts: "second:true/6 minute:true/26 ", top: "second"},
		{call: "allow", req: ratekit.Request{Key: "u", Cost: 6}, allowed: true, parts: "second:true/0 minute:true/20 ", top: "second"},
		// The second bucket is empty: denied, and the minute bucket,
		// which held enough, keeps its 20.
		{call: "allow", req: user, allowed: false, parts: "second:false/0 minute:true/20 ", top: "second", retry: 100 * time.Millisecond},
		{call: "peek", req: user, allowed: false, parts: "second:false/0 minute:true/20 ", top: "second", retry: 100 * time.Millisecond},
		{advance: time.Second, call: "allow", req: ratekit.Request{Key: "u", Cost: 10}, allowed: true, parts: "second:true/0 minute:true/10 ", top: "second"},
		// The minute bucket refills one token every 2s: 20.5 - 10 + 0.5.
		{advance: time.Second, call: "allow", req: ratekit.Request{Key: "u", Cost: 10}, allowed: true, parts: "second:true/0 minute:true/1 ", top: "second"},
		// 1.5 tokens for a cost of 2: the minute bucket denies, the
		// second bucket keeps its 10, and RetryAfter is the minute's 1s.
		{advance: time.Second, call: "allow", req: ratekit.Request{Key: "u", Cost: 2}, allowed: false, parts: "second:true/10 minute:false/1 ", top: "minute", retry: time.Second},
		{call: "refund", req: ratekit.Request{Key: "u", Cost: 5}, allowed: true, parts: "second:true/10 minute:true/6 ", top: "minute"},
		// Parts count other keys: a fresh "org" minute bucket.
		{call: "allow", req: ratekit.Request{Key: "u", Cost: 1, Parts: []ratekit.Part{{Key: "u", Cost: 2}, {Key: "org", Cost: 30}}}, allowed: true, parts: "second:true/8 minute:true/0 ", top: "minute"},
		{call: "allow", req: ratekit.Request{Key: "u", Cost: 1, Parts: []ratekit.Part{{Key: "u", Cost: 1}, {Key: "org", Cost: 1}}}, allowed: false, parts: "second:true/8 minute:false/0 ", top: "minute", retry: 2 * time.Second},
		{call: "reset", req: user},
		{call: "peek", req: ratekit.Request{Key: "u", Cost: 10}, allowed: true, parts: "second:true/10 minute:true/30 ", top: "second"},
		// Reset touched u's buckets only: org's is still empty.
		{call: "peek", req: ratekit.Request{Key: "u", Cost: 1, Parts: []ratekit.Part{{Key: "u", Cost: 1}, {Key: "org", Cost: 1}}}, allowed: false, parts: "second:true/10 minute:false/0 ", top: "minute", retry: 2 * time.Second},
	} {
		clock.Add(s.advance)
		var (
			d   ratekit.Decision
			err error
		)
		switch s.call {
		case "allow":
			d, err = c.Allow(ctx, s.req)
		case "peek":
			d, err = c.Peek(ctx, s.req)
		case "refund":
			d, err = c.Refund(ctx, s.req)
		case "reset":
			if err := c.Reset(ctx, s.req.Key); err != nil {
				t.Fatalf("step %d: Reset: %v", i, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %s: %v", i, s.call, err)
		}
		if d.Allowed != s.allowed || parts(d) != s.parts || d.Policy.Name != s.top || d.RetryAfter != s.retry {
			t.Errorf("step %d: %s(%+v) = allowed %v, parts %q, policy %q, retry %v; want %v, %q, %q, %v",
				i, s.call, s.req, d.Allowed, parts(d), d.Policy.Name, d.RetryAfter, s.allowed, s.parts, s.top, s.retry)
		}
	}
}

func TestCompositeRequestValidation(t *testing.T) {
	c := newComposite(t, tokenbucket.CompositeConfig{Buckets: twoBuckets, Mode: tokenbucket.Atomic, Store: memStore(t, nil)})
	ctx := context.Background()
	for _, tc := range []struct {
		req  ratekit.Request
		want error
	}{
		{ratekit.Request{Key: "", Cost: 1}, ratekit.ErrEmptyKey},
		{ratekit.Request{Key: "k", Cost: 0}, ratekit.ErrInvalidCost},
		{ratekit.Request{Key: "k", Cost: 11}, ratekit.ErrCostExceedsQuota},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 1}}}, ratekit.ErrInvalidRequest},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 1}, {Key: "k", Cost: 1}, {Key: "k", Cost: 1}}}, ratekit.ErrInvalidRequest},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 1}, {Key: "", Cost: 1}}}, ratekit.ErrEmptyKey},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 1}, {Key: "k", Cost: 31}}}, ratekit.ErrCostExceedsQuota},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{}}, ratekit.ErrInvalidRequest},
	} {
		for name, call := range map[string]func(context.Context, ratekit.Request) (ratekit.Decision, error){
			"Allow": c.Allow, "Peek": c.Peek, "Refund": c.Refund,
		} {
			if _, err := call(ctx, tc.req); !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
				t.Errorf("%s(%+v) = %v, want %v", name, tc.req, err, tc.want)
			}
		}
	}
	if err := c.Reset(ctx, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Errorf("Reset(\"\") = %v", err)
	}
}

// compositeBackend builds the clients of one store for
// TestCompositeExactUnderConcurrency: 4 composites, each on its own client
// of the same store.
type compositeBackend struct {
	name  string
	group bool
	store func(t *testing.T) []kvstore.Store
}

func compositeBackends() []compositeBackend {
	return []compositeBackend{
		{name: "memory", store: func(t *testing.T) []kvstore.Store {
			s := memStore(t, nil)
			return []kvstore.Store{s, s, s, s}
		}},
		{name: "redis", store: func(t *testing.T) []kvstore.Store {
			addr := testenv.RedisAddr(t)
			return redisClients(t, func() redis.UniversalClient {
				return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 16})
			})
		}},
		{name: "redis-cluster", group: true, store: func(t *testing.T) []kvstore.Store {
			cluster := redistest.StartCluster(t, 3)
			return redisClients(t, func() redis.UniversalClient {
				return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), PoolSize: 16})
			})
		}},
	}
}

// redisClients returns 4 stores, each on a client of its own from newClient,
// under one key prefix of the test's own, and deletes the keys at cleanup.
func redisClients(t *testing.T, newClient func() redis.UniversalClient) []kvstore.Store {
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "ratekit-test:composite:" + hex.EncodeToString(b) + ":"
	var stores []kvstore.Store
	for i := 0; i < 4; i++ {
		c := newClient()
		if i == 0 {
			t.Cleanup(func() {
				ctx := context.Background()
				del := func(ctx context.Context, node *redis.Client) error {
					iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
					for iter.Next(ctx) {
						node.Del(ctx, iter.Val())
					}
					return nil
				}
				if cc, ok := c.(*redis.ClusterClient); ok {
					cc.ForEachMaster(ctx, del)
				} else {
					del(ctx, c.(*redis.Client))
				}
			})
		}
		t.Cleanup(func() { c.Close() })
		s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	return stores
}

// TestCompositeExactUnderConcurrency runs 4 clients × 64 goroutines against
// two policies of different quotas (100 and 300 tokens, refilling one an
// hour) on one key. Each request costs c tokens of the first and 3c of the
// second, c 1 or 2 at random, so both buckets empty together only when no
// decision ever takes from one without the other: each policy must admit
// exactly its quota, the stored levels must be 0 on both, and the history
// of each policy must stay within its token-bucket bound.
func TestCompositeExactUnderConcurrency(t *testing.T) {
	for _, be := range compositeBackends() {
		t.Run(be.name, func(t *testing.T) {
			stores := be.store(t)
			buckets := []tokenbucket.Bucket{
				{Name: "small", Burst: 100, RefillRate: tokenbucket.PerHour(1)},
				{Name: "large", Burst: 300, RefillRate: tokenbucket.PerHour(1)},
			}
			var limiters []*tokenbucket.Composite
			for _, s := range stores {
				limiters = append(limiters, newComposite(t, tokenbucket.CompositeConfig{Buckets: buckets, Mode: tokenbucket.Atomic, Store: s, Group: be.group}))
			}
			const clients, goroutines, perG = 4, 64, 12
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var (
				mu       sync.Mutex
				hist     [2][]limitertest.Op
				admitted [2]int64
				failures []error
				wg       sync.WaitGroup
			)
			for cl := 0; cl < clients; cl++ {
				for g := 0; g < goroutines; g++ {
					wg.Add(1)
					go func(l *tokenbucket.Composite) {
						defer wg.Done()
						for i := 0; i < perG; i++ {
							c := int64(1 + mrand.IntN(2))
							req := ratekit.Request{Key: "hot", Cost: 1, Parts: []ratekit.Part{{Key: "hot", Cost: c}, {Key: "hot", Cost: 3 * c}}}
							start := time.Now()
							d, err := l.Allow(ctx, req)
							end := time.Now()
							mu.Lock()
							if err != nil {
								failures = append(failures, err)
								mu.Unlock()
								return
							}
							for p := range 2 {
								op := limitertest.Op{Key: "hot", Cost: req.Parts[p].Cost, Start: start, End: end, Outcome: limitertest.Denied}
								if d.Allowed {
									op.Outcome = limitertest.Admitted
									admitted[p] += req.Parts[p].Cost
								}
								hist[p] = append(hist[p], op)
							}
							if d.Allowed != (d.Parts[0].Allowed && d.Parts[1].Allowed) {
								failures = append(failures, fmt.Errorf("decision %+v does not sum its parts", d))
							}
							mu.Unlock()
						}
					}(limiters[cl])
				}
			}
			wg.Wait()
			if len(failures) > 0 {
				t.Fatalf("%d errors, first: %v", len(failures), failures[0])
			}
			if admitted[0] != 100 || admitted[1] != 300 {
				t.Errorf("admitted %d and %d tokens, want exactly 100 and 300", admitted[0], admitted[1])
			}
			d, err := limiters[0].Peek(ctx, ratekit.Request{Key: "hot", Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if d.Parts[0].Remaining != 0 || d.Parts[1].Remaining != 0 {
				t.Errorf("stored levels %d and %d, want 0 and 0", d.Parts[0].Remaining, d.Parts[1].Remaining)
			}
			for p, b := range buckets {
				if err := limitertest.CheckOps(hist[p], limitertest.TokenBucketBound(b.Burst, 1, time.Hour, 50*time.Millisecond)); err != nil {
					t.Errorf("policy %s: %v", b.Name, err)
				}
			}
		})
	}
}
