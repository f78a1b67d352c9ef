// Command clientcost measures what a Redis decision costs the client: CPU
// time (user and system, from getrusage, over every thread of the process),
// heap allocations and wall time per decision, for ratekit's Redis stores
// and for the Redis peers, one contender at a time, at 1 and 8 concurrent
// callers on one hot key, always admitted under the default quota of 10^9 a
// minute; with -quota 100 the warm-up spends the quota and the decisions
// measured are refusals.
//
// Usage:
//
//	cd benchmarks && go run ./clientcost [-n 40000] [-concurrency 1,8] [-rounds 3] [-only name] [-quota 1000000000]
//
// The CPU figure includes what Go's scheduler spends between decisions
// (spinning before a goroutine parks, waking it when its reply arrives),
// which is most of a lone caller's client cost and the same for every Go
// contender; the differences between contenders are what they add. To count
// system calls per decision, run one contender under strace:
//
//	go build -o /tmp/clientcost ./clientcost && strace -f -c -o /tmp/sys.txt /tmp/clientcost -only ulule -rounds 1
//
// and to see where one contender's CPU goes, profile it:
//
//	go run ./clientcost -only "ratekit redisstore" -concurrency 8 -cpuprofile /tmp/rk.prof && go tool pprof -top /tmp/rk.prof
//
// ratekit's contenders are configured as the README says (ServerlessOptions
// and a one-second deadline per decision); the peers get their default
// clients with PoolSize = MinIdleConns = concurrency, as in compare. The
// server comes from RATEKIT_REDIS_ADDR (default 127.0.0.1:6379); keys live
// under clientcost: and expire within a minute.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/benchmarks/internal/harness"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

type contender struct {
	name  string
	build func(conc int) (func(ctx context.Context) error, func(), error)
}

func main() {
	n := flag.Int("n", 40000, "decisions per contender and round")
	concFlag := flag.String("concurrency", "1,8", "comma-separated numbers of concurrent callers")
	rounds := flag.Int("rounds", 3, "rounds; the table shows medians")
	only := flag.String("only", "", "measure only the contender of this name")
	quota := flag.Int64("quota", 1_000_000_000, "each limiter's quota a minute (and burst); one below the warm-up's decisions makes the measured ones refusals")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the first measured run (not its warm-up) to this file")
	flag.Parse()
	concs, err := harness.ParseCounts(*concFlag)
	if err != nil {
		log.Fatalf("-concurrency: %v", err)
	}
	addr := os.Getenv("RATEKIT_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	if *quota < 1 {
		log.Fatalf("-quota %d: want at least 1", *quota)
	}
	cs := contenders(addr, *quota)
	if *only != "" {
		cs = slices.DeleteFunc(cs, func(c contender) bool { return c.name != *only })
		if len(cs) == 0 {
			log.Fatalf("-only %q: no such contender", *only)
		}
	}
	fmt.Printf("Redis %s, quota %d a minute, %d decisions per contender and round, medians of %d rounds\n\n", addr, *quota, *n, *rounds)
	fmt.Println("| callers | contender | client CPU µs/decision | allocations/decision | bytes/decision | wall µs/decision |")
	fmt.Println("|---:|---|---:|---:|---:|---:|")
	ctx := context.Background()
	var prof *os.File
	if *cpuprofile != "" {
		if prof, err = os.Create(*cpuprofile); err != nil {
			log.Fatalf("-cpuprofile: %v", err)
		}
		defer prof.Close()
	}
	for _, conc := range concs {
		type sample struct{ cpu, allocs, bytes, wall []float64 }
		got := make([]sample, len(cs))
		decide := make([]func(context.Context) error, len(cs))
		for i, c := range cs {
			f, closeFn, err := c.build(conc)
			if err != nil {
				log.Fatalf("%s: %v", c.name, err)
			}
			defer closeFn()
			decide[i] = f
		}
		for r := range *rounds {
			for k := range cs {
				i := k
				if r%2 == 1 {
					i = len(cs) - 1 - k
				}
				if _, err := run(ctx, decide[i], conc, *n/10, nil); err != nil { // warm-up
					log.Fatalf("%s: %v", cs[i].name, err)
				}
				m, err := run(ctx, decide[i], conc, *n, prof)
				if err != nil {
					log.Fatalf("%s: %v", cs[i].name, err)
				}
				prof = nil
				got[i].cpu = append(got[i].cpu, m.cpu)
				got[i].allocs = append(got[i].allocs, m.allocs)
				got[i].bytes = append(got[i].bytes, m.bytes)
				got[i].wall = append(got[i].wall, m.wall)
			}
		}
		for i, c := range cs {
			fmt.Printf("| %d | %s | %.1f | %.1f | %.0f | %.1f |\n", conc, c.name, median(got[i].cpu), median(got[i].allocs), median(got[i].bytes), median(got[i].wall))
		}
	}
}

type measured struct{ cpu, allocs, bytes, wall float64 }

// run makes n decisions from conc goroutines and returns the costs per
// decision. With prof non-nil, it writes a CPU profile of the decisions to
// prof.
func run(ctx context.Context, decide func(context.Context) error, conc, n int, prof *os.File) (measured, error) {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	if prof != nil {
		if err := pprof.StartCPUProfile(prof); err != nil {
			return measured{}, err
		}
		defer pprof.StopCPUProfile()
	}
	c0, t0 := cpuTime(), time.Now()
	per := n / conc
	errs := make([]error, conc)
	var wg sync.WaitGroup
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				if err := decide(ctx); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	wall, cpu := time.Since(t0), cpuTime()-c0
	runtime.ReadMemStats(&m1)
	for _, err := range errs {
		if err != nil {
			return measured{}, err
		}
	}
	d := float64(per * conc)
	return measured{
		cpu:    float64(cpu.Nanoseconds()) / 1000 / d,
		allocs: float64(m1.Mallocs-m0.Mallocs) / d,
		bytes:  float64(m1.TotalAlloc-m0.TotalAlloc) / d,
		wall:   float64(wall.Nanoseconds()) / 1000 / d,
	}, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func contenders(addr string, quota int64) []contender {
	tb := func(store kvstore.Store) (func(context.Context) error, error) {
		l, err := tokenbucket.New(tokenbucket.Config{Name: "clientcost", Burst: quota, RefillRate: tokenbucket.Rate{Tokens: quota, Per: time.Minute}, Mode: tokenbucket.Atomic, Store: store})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := l.Allow(ctx, ratekit.Request{Key: "hot", Cost: 1})
			return err
		}, nil
	}
	goRedis := func(conc int) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: addr, PoolSize: conc, MinIdleConns: conc})
	}
	return []contender{
		{"ratekit rueidisstore", func(int) (func(context.Context) error, func(), error) {
			c, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true}, time.Second))
			if err != nil {
				return nil, nil, err
			}
			s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: "clientcost:rr:"})
			if err != nil {
				return nil, nil, err
			}
			f, err := tb(s)
			return f, c.Close, err
		}},
		{"ratekit redisstore", func(conc int) (func(context.Context) error, func(), error) {
			c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}, PoolSize: conc, MinIdleConns: conc}, time.Second))
			s, err := redisstore.New(c, redisstore.Config{Prefix: "clientcost:rk:"})
			if err != nil {
				return nil, nil, err
			}
			f, err := tb(s)
			return f, func() { c.Close() }, err
		}},
		{"ulule", func(conc int) (func(context.Context) error, func(), error) {
			c := goRedis(conc)
			st, err := ulredis.NewStoreWithOptions(c, ulule.StoreOptions{Prefix: "clientcost:ul", MaxRetry: 3})
			if err != nil {
				return nil, nil, err
			}
			l := ulule.New(st, ulule.Rate{Period: time.Minute, Limit: quota})
			return func(ctx context.Context) error { _, err := l.Get(ctx, "hot"); return err }, func() { c.Close() }, nil
		}},
		{"redis_rate", func(conc int) (func(context.Context) error, func(), error) {
			c := goRedis(conc)
			l := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: int(quota), Burst: int(quota), Period: time.Minute}
			return func(ctx context.Context) error { _, err := l.Allow(ctx, "clientcost:rr-hot", lim); return err }, func() { c.Close() }, nil
		}},
		{"INCR (go-redis)", func(conc int) (func(context.Context) error, func(), error) {
			c := goRedis(conc)
			return func(ctx context.Context) error { return c.Incr(ctx, "clientcost:incr").Err() }, func() { c.Del(context.Background(), "clientcost:incr"); c.Close() }, nil
		}},
	}
}
