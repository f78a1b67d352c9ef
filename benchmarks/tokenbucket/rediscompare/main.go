// Command rediscompare measures ratekit's atomic Redis token bucket beside
// github.com/go-redis/redis_rate/v10 (GCRA in Lua) and a bare go-redis INCR
// round trip, the floor for any one-round-trip limiter, in the same run on
// the same client, and prints a markdown table.
//
// Scenarios: one hot key, 10,000 keys, and a denied key (a bucket of 1 that
// is already empty), each at concurrency 1, 8 and 64. ratekit also runs the
// denied key with its in-process denied-key cache. Each cell runs for
// -duration; the contenders take turns within a run, and the table gives
// the median over -runs runs of throughput and of each run's p50 and p99.
//
// It uses keys under a prefix of its own on the Redis at RATEKIT_REDIS_ADDR
// (default 127.0.0.1:6379) and deletes them when it finishes.
//
//	cd benchmarks && go run ./tokenbucket/rediscompare -runs 5
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

type contender struct {
	name string
	// op makes one decision for key i of the scenario and reports whether
	// it was admitted.
	op func(ctx context.Context, key string) (bool, error)
}

type scenario struct {
	name string
	key  func(worker, i int) string
	// contenders for this scenario
	contenders []contender
}

type result struct {
	throughput float64 // decisions per second
	p50, p99   time.Duration
	admitted   float64 // fraction admitted
}

func main() {
	duration := flag.Duration("duration", time.Second, "how long each cell runs")
	runs := flag.Int("runs", 5, "runs per cell; the table shows medians")
	concurrencyFlag := flag.String("concurrency", "1,8,64", "comma-separated numbers of concurrent workers")
	flag.Parse()
	var concurrency []int
	for _, f := range strings.Split(*concurrencyFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("-concurrency: %q is not a positive number", f)
		}
		concurrency = append(concurrency, n)
	}
	addr := os.Getenv("RATEKIT_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, MinIdleConns: 64})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		log.Fatalf("redis at %s: %v", addr, err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "ratekit-bench:" + hex.EncodeToString(b) + ":"
	defer cleanup(client, prefix)

	store, err := redisstore.New(client, redisstore.Config{Prefix: prefix + "rk:"})
	if err != nil {
		log.Fatal(err)
	}
	newLimiter := func(name string, burst int64, r tokenbucket.Rate, cache int) *tokenbucket.Limiter {
		l, err := tokenbucket.New(tokenbucket.Config{Name: name, Burst: burst, RefillRate: r, Mode: tokenbucket.Atomic, Store: store, DeniedCacheSize: cache})
		if err != nil {
			log.Fatal(err)
		}
		return l
	}
	rrl := redis_rate.NewLimiter(client)

	// Open buckets hold a billion tokens and refill a billion an hour: they
	// never deny, and their keys stay in Redis (a bucket that refills to
	// full between two requests has expired and costs less), so every
	// decision does the full work of an admitted request: read, refill,
	// take, write. The denied bucket holds 1 token, refilled hourly.
	openRK := newLimiter("open", 1_000_000_000, tokenbucket.PerHour(1_000_000_000), 0)
	openRR := redis_rate.Limit{Rate: 1_000_000_000, Burst: 1_000_000_000, Period: time.Hour}
	deniedRK := newLimiter("denied", 1, tokenbucket.PerHour(1), 0)
	deniedRKCache := newLimiter("denied-cached", 1, tokenbucket.PerHour(1), 10_000)
	deniedRR := redis_rate.Limit{Rate: 1, Burst: 1, Period: time.Hour}

	rk := func(l *tokenbucket.Limiter) func(context.Context, string) (bool, error) {
		return func(ctx context.Context, key string) (bool, error) {
			d, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
			return d.Allowed, err
		}
	}
	rr := func(limit redis_rate.Limit) func(context.Context, string) (bool, error) {
		return func(ctx context.Context, key string) (bool, error) {
			res, err := rrl.Allow(ctx, prefix+"rr:"+key, limit)
			if err != nil {
				return false, err
			}
			return res.Allowed > 0, nil
		}
	}
	incr := func(ctx context.Context, key string) (bool, error) {
		return true, client.Incr(ctx, prefix+"incr:"+key).Err()
	}

	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	scenarios := []scenario{
		{"hot key", func(_, _ int) string { return "hot" }, []contender{
			{"ratekit atomic", rk(openRK)}, {"redis_rate", rr(openRR)}, {"INCR floor", incr}}},
		{"10,000 keys", func(w, i int) string { return keys[(w*7919+i)%len(keys)] }, []contender{
			{"ratekit atomic", rk(openRK)}, {"redis_rate", rr(openRR)}, {"INCR floor", incr}}},
		{"denied key", func(_, _ int) string { return "blocked" }, []contender{
			{"ratekit atomic", rk(deniedRK)}, {"ratekit atomic + denied cache", rk(deniedRKCache)}, {"redis_rate", rr(deniedRR)}, {"INCR floor", incr}}},
	}
	// Empty the denied buckets before measuring.
	for _, c := range scenarios[2].contenders[:3] {
		c.op(ctx, "blocked")
		c.op(ctx, "blocked")
	}

	all := map[string][]result{}
	id := func(s scenario, c contender, n int) string { return s.name + "|" + c.name + "|" + strconv.Itoa(n) }
	for r := 0; r < *runs; r++ {
		for _, s := range scenarios {
			for _, n := range concurrency {
				for _, c := range s.contenders {
					res, err := measure(ctx, c, s.key, n, *duration)
					if err != nil {
						log.Fatalf("%s, %s, concurrency %d: %v", s.name, c.name, n, err)
					}
					all[id(s, c, n)] = append(all[id(s, c, n)], res)
				}
			}
		}
		fmt.Fprintf(os.Stderr, "run %d of %d done\n", r+1, *runs)
	}

	fmt.Printf("Redis %s, %d runs of %v per cell, medians; %s\n\n", addr, *runs, *duration, time.Now().UTC().Format(time.RFC3339))
	fmt.Println("| scenario | concurrency | contender | decisions/s | vs INCR | p50 | p99 | admitted |")
	fmt.Println("|---|---:|---|---:|---:|---:|---:|---:|")
	for _, s := range scenarios {
		for _, n := range concurrency {
			floor := median(all[id(s, s.contenders[len(s.contenders)-1], n)], func(r result) float64 { return r.throughput })
			for _, c := range s.contenders {
				rs := all[id(s, c, n)]
				tp := median(rs, func(r result) float64 { return r.throughput })
				p50 := time.Duration(median(rs, func(r result) float64 { return float64(r.p50) }))
				p99 := time.Duration(median(rs, func(r result) float64 { return float64(r.p99) }))
				adm := median(rs, func(r result) float64 { return r.admitted })
				fmt.Printf("| %s | %d | %s | %.0f | %.2f× | %s | %s | %.0f%% |\n", s.name, n, c.name, tp, tp/floor, round(p50), round(p99), 100*adm)
			}
		}
	}
}

// measure runs n workers calling c.op for d and returns the throughput and
// latency percentiles.
func measure(ctx context.Context, c contender, key func(worker, i int) string, n int, d time.Duration) (result, error) {
	var wg sync.WaitGroup
	lat := make([][]time.Duration, n)
	admitted := make([]int, n)
	errs := make([]error, n)
	start := time.Now()
	stop := start.Add(d)
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, 1<<14)
			for i := 0; ; i++ {
				t0 := time.Now()
				if !t0.Before(stop) {
					break
				}
				ok, err := c.op(ctx, key(w, i))
				if err != nil {
					errs[w] = err
					return
				}
				l = append(l, time.Since(t0))
				if ok {
					admitted[w]++
				}
			}
			lat[w] = l
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	total := 0
	for w := range lat {
		if errs[w] != nil {
			return result{}, errs[w]
		}
		all = append(all, lat[w]...)
		total += admitted[w]
	}
	slices.Sort(all)
	if len(all) == 0 {
		return result{}, fmt.Errorf("no decisions in %v", d)
	}
	return result{
		throughput: float64(len(all)) / elapsed.Seconds(),
		p50:        all[len(all)/2],
		p99:        all[len(all)*99/100],
		admitted:   float64(total) / float64(len(all)),
	}, nil
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond)
	}
	return d
}

func cleanup(c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			c.Del(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Del(ctx, batch...)
	}
}
