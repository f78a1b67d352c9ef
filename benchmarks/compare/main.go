// Command compare measures ratekit beside its peers and beside the physical
// floors of each backend, in one run on one machine, and prints markdown
// tables.
//
// Contenders, by backend:
//
//	in process      ratekit tokenbucket on memstore (Atomic, Eventual);
//	                golang.org/x/time/rate (one *rate.Limiter per key in a sync.Map);
//	                github.com/sethvargo/go-limiter memorystore
//	client token    ratekit signedwindow (plain, and with ReplayCacheSize);
//	                floor: one HMAC-SHA256 of a 48-byte message with a reused hash
//	Redis           ratekit tokenbucket on redisstore (Atomic, Atomic with
//	                coalescing off, Eventual, and Atomic with the denied-key
//	                cache, each a row of its own);
//	                ratekit on rueidisstore (rueidis);
//	                github.com/go-redis/redis_rate/v10; github.com/ulule/limiter/v3
//	                with its Redis store; floor: one INCR round trip
//	PostgreSQL      ratekit durable FixedWindow, SlidingWindow, TokenBucket,
//	                SlidingLog (UNLOGGED tables, synchronous_commit off: the
//	                defaults); floor: one INSERT … ON CONFLICT DO UPDATE …
//	                RETURNING counter on an UNLOGGED table, same pool
//
// Scenarios: one hot key that is always admitted (limit 10^9 per hour, burst
// 10^9), one denied key (limit 1 per hour, exhausted before measuring) and
// 10,000 keys visited round robin (the hot key's limit), each at every
// concurrency of -concurrency. Every cell runs for -duration; within a run the
// contenders of a cell take turns (the order rotates from run to run), and
// the tables give medians over -runs runs. Then a 64-way burst of 640
// requests on a fresh key of limit 100 (refill 100 per hour) counts what each
// contender admits: exact is 100.
//
// It starts no server: Redis is at RATEKIT_REDIS_ADDR (default
// 127.0.0.1:6379) and PostgreSQL at RATEKIT_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable). It works under a
// Redis key prefix and in a PostgreSQL schema of its own, both random, and
// removes them at the end.
//
// With -paired (the default), each scenario then measures the Redis and the
// PostgreSQL contenders side by side at concurrency 1: one goroutine makes one
// decision with each contender of the backend in turn, so that the machine's
// drift hits all of them alike (harness.MeasureInterleaved).
//
// Then, with -inturn (default 1,8), the Redis contenders are measured in
// turn at each of those concurrencies (harness.MeasureInTurn): slices of
// -slice (50ms), one contender after the other, until each has had
// -duration, so that all of them run in the same seconds. There every
// contender has clients of its own as an application would (go-redis:
// PoolSize = MinIdleConns = concurrency; rueidis: one client), ratekit runs
// on redisstore (go-redis) and on rueidisstore (rueidis, auto-pipelined),
// and with -rlf DIR the Node rate-limiter-flexible joins them: DIR holds
// rlf.js with its packages installed (cd benchmarks/rlf && npm install), and
// the program drives it over stdin and stdout, one slice at a time.
//
// With -table issue42, it measures only the table of issue #42, as the
// outside harness of that issue did: for every row (-rows: Redis; PostgreSQL
// logged with synchronous commit; PostgreSQL unlogged; in process; plans)
// and every cell at every concurrency of -concurrency, each contender with
// clients of its own whose pools hold as many connections as callers
// (rueidis and ioredis: one pipelined connection), -runs rounds of one block
// per contender (a -blocks warm-up, 500ms by default, then -duration
// measured, 2s by default), contenders one after the other, the order
// reversed every other round. Admitted cells have a quota of 10^9 a minute
// on one hot key or on 10,000 keys drawn uniformly; the denied key has a
// limit of 1 per hour, exhausted first. It prints the throughput table and
// the ratio of ratekit's better contender to the best peer per cell (for
// plans: a planned decision to a composite of the same policies).
// rate-limiter-flexible (Redis and PostgreSQL) runs when rlf/node_modules
// is installed or -rlf names it.
//
//	cd benchmarks && go run ./compare -table issue42 [-runs 3] [-rows redis,logged,unlogged,memory,plans]
//	    [-scenarios hot,10k,denied] [-concurrency 1,8,64]
//
//	cd benchmarks && go run ./compare [-duration 1s] [-runs 3] [-concurrency 1,8,64]
//	    [-backends memory,token,redis,postgres] [-scenarios hot,denied,10k] [-contenders regexp]
//	    [-paired=true] [-exactness=true] [-inturn 1,8] [-slice 50ms] [-rlf rlf] [-sequential=true]
package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash"
	"log"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/benchmarks/internal/harness"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

// limit is the quota every contender of a scenario enforces: n per period,
// with a burst (capacity) of n.
type limit struct {
	n      int64
	period time.Duration
}

var (
	openLimit   = limit{1_000_000_000, time.Hour}
	deniedLimit = limit{1, time.Hour}
	exactLimit  = limit{100, time.Hour}
)

// decide makes one decision for key on behalf of worker w.
type decide func(ctx context.Context, w int, key string) (bool, error)

type role int

const (
	ours role = iota
	peer
	floor
)

type contender struct {
	name    string
	backend string
	role    role
	// build returns a fresh limiter with limit lim whose keys are
	// separated from every other build's by tag.
	build func(lim limit, tag string) (decide, error)
}

type scenario struct {
	name  string
	short string
	lim   limit
	keys  []string
	// pick returns the index in keys of decision i of worker w.
	pick func(w, i int) int
	// primed scenarios exhaust their key before measuring.
	primed bool
	// uniform says that pick draws keys uniformly at random (rather than
	// round robin), so that rate-limiter-flexible draws them so too.
	uniform bool
}

type env struct {
	prefix     string // Redis key prefix and tag root
	redis      *redis.Client
	rueidis    rueidis.Client // made by the first rueidisstore contender
	pg         *pgxpool.Pool
	schema     string
	pgStore    *pgstore.Store
	maxWorkers int
	closers    []func()
}

const (
	memoryBackend = "in process"
	tokenBackend  = "client token"
	redisBackend  = "Redis"
	pgBackend     = "PostgreSQL"
)

func main() {
	duration := flag.Duration("duration", time.Second, "measuring time per cell")
	runs := flag.Int("runs", 3, "runs per cell; the tables show medians")
	concFlag := flag.String("concurrency", "1,8,64", "comma-separated numbers of concurrent workers")
	backendsFlag := flag.String("backends", "memory,token,redis,postgres", "backends to measure")
	scenariosFlag := flag.String("scenarios", "hot,denied,10k", "scenarios to measure")
	contendersFlag := flag.String("contenders", "", "regular expression: only contenders whose name matches (floors always run)")
	exactness := flag.Bool("exactness", true, "run the 64-way burst")
	paired := flag.Bool("paired", true, "also measure the Redis and PostgreSQL contenders side by side at concurrency 1")
	maxConns := flag.Int("pg-max-conns", 16, "PostgreSQL pool size")
	inTurnFlag := flag.String("inturn", "1,8", "concurrencies of the Redis in-turn table (empty: none)")
	slice := flag.Duration("slice", 50*time.Millisecond, "length of one contender's turn in the in-turn table")
	blocks := flag.Duration("blocks", 0, "when not 0, the in-turn table measures each contender in one block of -duration after a warm-up of this length, contenders one after the other, order reversed every other round (-runs rounds)")
	flag.IntVar(&rueidisMultiplex, "rueidis-multiplex", 0, "when not 0, adds to the in-turn table a rueidisstore contender whose client has this PipelineMultiplex (-1: one connection, as ServerlessOptions sets; 1: two)")
	flag.DurationVar(&rueidisFlushDelay, "rueidis-flush-delay", 0, "when not 0, adds to the in-turn table a rueidisstore contender whose client has this MaxFlushDelay")
	redisMaxInFlight := flag.Int("redis-max-in-flight", 0, "when not 0, adds to the in-turn table a redisstore contender with this Config.MaxInFlight")
	rlfDir := flag.String("rlf", "", "directory of rlf.js with rate-limiter-flexible installed (npm install): adds it to the in-turn table")
	sequential := flag.Bool("sequential", true, "measure the tables of every backend and concurrency (false: only the in-turn table)")
	table := flag.String("table", "", "issue42: measure only the table of issue #42 (its -rows at each -concurrency, contenders in turn: -runs rounds of a -blocks warm-up and -duration measured per contender, by default 500ms and 2s) and print its ratios")
	rows := flag.String("rows", issue42Rows, "with -table issue42, the rows to measure")
	flag.IntVar(&pgMaxInFlight, "pg-max-in-flight", 0, "with -table issue42, the pgstore.Config.MaxInFlight of ratekit's PostgreSQL contenders (0: the default)")
	flag.Parse()
	concs, err := harness.ParseCounts(*concFlag)
	if err != nil {
		log.Fatalf("-concurrency: %v", err)
	}
	only, err := regexp.Compile(*contendersFlag)
	if err != nil {
		log.Fatalf("-contenders: %v", err)
	}
	want := func(list, item string) bool { return slices.Contains(strings.Split(list, ","), item) }

	ctx := context.Background()
	e := &env{prefix: "ratekit-compare-" + randHex(6), maxWorkers: max(slices.Max(concs), 64)}
	defer e.cleanup()
	if *table != "" {
		if *table != "issue42" {
			log.Fatalf("-table %q: the only table is issue42", *table)
		}
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["duration"] {
			*duration = 2 * time.Second
		}
		if *blocks == 0 {
			*blocks = 500 * time.Millisecond
		}
		if !set["rlf"] {
			*rlfDir = rlfDefault("rlf")
		}
		if *rlfDir == "" {
			fmt.Fprintln(os.Stderr, "issue42: rate-limiter-flexible is left out (cd rlf && npm ci, or -rlf DIR)")
		}
		if err := runIssue42(ctx, e, *rows, *scenariosFlag, *rlfDir, concs, *runs, *duration, *blocks); err != nil {
			e.cleanup()
			log.Fatal(err)
		}
		return
	}
	var contenders []contender
	if want(*backendsFlag, "memory") {
		contenders = append(contenders, memoryContenders(e)...)
	}
	if want(*backendsFlag, "token") {
		contenders = append(contenders, tokenContenders(e)...)
	}
	if want(*backendsFlag, "redis") {
		if err := e.openRedis(ctx); err != nil {
			e.cleanup()
			log.Fatal(err)
		}
		contenders = append(contenders, redisContenders(e)...)
	}
	if want(*backendsFlag, "postgres") {
		if err := e.openPostgres(ctx, *maxConns); err != nil {
			e.cleanup()
			log.Fatal(err)
		}
		contenders = append(contenders, pgContenders(e)...)
	}
	contenders = slices.DeleteFunc(contenders, func(c contender) bool { return c.role != floor && !only.MatchString(c.name) })

	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	var scenarios []scenario
	for _, s := range []scenario{
		{"one hot key, always admitted (limit 10^9 per hour)", "hot", openLimit, []string{"hot"}, func(_, _ int) int { return 0 }, false, false},
		{"one denied key (limit 1 per hour, exhausted)", "denied", deniedLimit, []string{"blocked"}, func(_, _ int) int { return 0 }, true, false},
		{"10,000 keys round robin (limit 10^9 per hour each)", "10k", openLimit, keys, func(w, i int) int { return (w*7919 + i) % len(keys) }, false, false},
	} {
		if want(*scenariosFlag, s.short) {
			scenarios = append(scenarios, s)
		}
	}

	if *sequential {
		err = run(ctx, e, contenders, scenarios, concs, *runs, *duration, *exactness, *paired)
		if err != nil {
			e.cleanup()
			log.Fatal(err)
		}
	}
	if *inTurnFlag != "" && e.redis != nil {
		turnConcs, err := harness.ParseCounts(*inTurnFlag)
		if err == nil {
			if *blocks > 0 {
				if *contendersFlag != "" {
					turnOnly = only
				}
				err = runBlocks(ctx, redisAddr(), e.prefix, *rlfDir, *redisMaxInFlight, scenarios, turnConcs, *runs, *duration, *blocks)
			} else {
				err = runInTurn(ctx, redisAddr(), e.prefix, *rlfDir, *redisMaxInFlight, scenarios, turnConcs, *runs, *duration, *slice)
			}
		}
		if err != nil {
			e.cleanup()
			log.Fatal(err)
		}
	}
}

// redisAddr returns RATEKIT_REDIS_ADDR, by default 127.0.0.1:6379.
func redisAddr() string {
	if addr := os.Getenv("RATEKIT_REDIS_ADDR"); addr != "" {
		return addr
	}
	return "127.0.0.1:6379"
}

func run(ctx context.Context, e *env, contenders []contender, scenarios []scenario, concs []int, runs int, d time.Duration, exactness, paired bool) error {
	host, _ := os.Hostname()
	fmt.Printf("ratekit comparison, %s, host %s, %s/%s, GOMAXPROCS %d, %s; %d run(s) of %v per cell, medians\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.Version(), runs, d)

	type cellID struct {
		s, c, n int
	}
	results := map[cellID][]harness.Result{}
	// pairedResults are the side-by-side measurements at concurrency 1,
	// under n = 0.
	pairedResults := map[cellID][]harness.Result{}
	pairedBackends := []string{redisBackend, pgBackend}
	for si, s := range scenarios {
		// One limiter per contender and scenario, kept over the runs.
		ops := make([]decide, len(contenders))
		for ci, c := range contenders {
			op, err := c.build(s.lim, s.short)
			if err != nil {
				return fmt.Errorf("%s: %v", c.name, err)
			}
			ops[ci] = op
			if err := prepare(ctx, e, c, s, op); err != nil {
				return fmt.Errorf("%s, %s: preparing: %v", s.short, c.name, err)
			}
		}
		for r := range runs {
			for _, n := range concs {
				for k := range contenders {
					ci := (k + r) % len(contenders)
					op := ops[ci]
					res, err := harness.Measure(ctx, n, d, func(ctx context.Context, w, i int) (bool, error) {
						return op(ctx, w, s.keys[s.pick(w, i)])
					})
					if err != nil {
						return fmt.Errorf("%s, %s, concurrency %d: %v", s.short, contenders[ci].name, n, err)
					}
					id := cellID{si, ci, n}
					results[id] = append(results[id], res)
				}
			}
			fmt.Fprintf(os.Stderr, "%s: run %d of %d done\n", s.short, r+1, runs)
		}
		if !paired {
			continue
		}
		for _, backend := range pairedBackends {
			var idx []int
			var side []harness.Op
			for ci, c := range contenders {
				if c.backend == backend {
					op := ops[ci]
					idx = append(idx, ci)
					side = append(side, func(ctx context.Context, w, i int) (bool, error) {
						return op(ctx, w, s.keys[s.pick(w, i)])
					})
				}
			}
			if len(side) == 0 {
				continue
			}
			for range runs {
				rs, err := harness.MeasureInterleaved(ctx, time.Duration(len(side))*d, side)
				if err != nil {
					return fmt.Errorf("%s, %s side by side: %v", s.short, backend, err)
				}
				for k, ci := range idx {
					id := cellID{si, ci, 0}
					pairedResults[id] = append(pairedResults[id], rs[k])
				}
			}
		}
		fmt.Fprintf(os.Stderr, "%s: side by side done\n", s.short)
	}

	for si, s := range scenarios {
		fmt.Printf("### %s\n\n", s.name)
		fmt.Println("| backend | contender | concurrency | decisions/s | p50 | p99 | × floor | × best peer | admitted |")
		fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, backend := range []string{memoryBackend, tokenBackend, redisBackend, pgBackend} {
			for _, n := range concs {
				floorTP, bestPeer := references(contenders, backend, func(ci int) []harness.Result { return results[cellID{si, ci, n}] })
				for ci, c := range contenders {
					if c.backend != backend {
						continue
					}
					m := harness.Median(results[cellID{si, ci, n}])
					fmt.Printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", backend, c.name, n, count(m.Throughput),
						harness.Latency(m.P50), harness.Latency(m.P99), ratio(m.Throughput, floorTP), ratio(m.Throughput, bestPeer), percent(m.Admitted))
				}
			}
		}
		fmt.Println()
	}

	if paired {
		fmt.Printf("### Concurrency 1, side by side: one goroutine makes one decision with each contender of a backend in turn\n\n")
		fmt.Println("Decisions/s is one over the mean latency. Interleaving pairs the samples in time, so the machine's drift from")
		fmt.Println("second to second, larger than the differences between one-round-trip limiters, hits every contender alike.")
		fmt.Println()
		fmt.Println("| scenario | backend | contender | decisions/s | p50 | p99 | × floor | × best peer |")
		fmt.Println("|---|---|---|---:|---:|---:|---:|---:|")
		for si, s := range scenarios {
			for _, backend := range pairedBackends {
				floorTP, bestPeer := references(contenders, backend, func(ci int) []harness.Result { return pairedResults[cellID{si, ci, 0}] })
				for ci, c := range contenders {
					if c.backend != backend {
						continue
					}
					m := harness.Median(pairedResults[cellID{si, ci, 0}])
					fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", s.short, backend, c.name, count(m.Throughput),
						harness.Latency(m.P50), harness.Latency(m.P99), ratio(m.Throughput, floorTP), ratio(m.Throughput, bestPeer))
				}
			}
		}
		fmt.Println()
	}

	if exactness {
		fmt.Printf("### Exactness: 64 workers send 640 requests at once on a fresh key of limit 100 (refill 100 per hour); exact is 100\n\n")
		fmt.Println("| backend | contender | admitted (median) | min–max over runs |")
		fmt.Println("|---|---|---:|---:|")
		for _, c := range contenders {
			if c.role == floor {
				continue
			}
			var got []int
			for r := range runs {
				op, err := c.build(exactLimit, "exact"+strconv.Itoa(r))
				if err != nil {
					return fmt.Errorf("%s: %v", c.name, err)
				}
				n, err := burst(ctx, op, 64, 10, c.backend == tokenBackend)
				if err != nil {
					return fmt.Errorf("exactness, %s: %v", c.name, err)
				}
				got = append(got, n)
			}
			slices.Sort(got)
			fmt.Printf("| %s | %s | %d | %d–%d |\n", c.backend, c.name, got[len(got)/2], got[0], got[len(got)-1])
		}
		fmt.Println()
	}
	printNotes()
	return nil
}

// prepare exhausts the key of a primed scenario for every worker, and visits
// every key of a PostgreSQL contender once (then ANALYZE), so that measuring
// starts from rows that exist and tables with statistics.
func prepare(ctx context.Context, e *env, c contender, s scenario, op decide) error {
	if s.primed {
		for w := range e.maxWorkers {
			for range 2 {
				if _, err := op(ctx, w, s.keys[0]); err != nil {
					return err
				}
			}
		}
	}
	if c.backend != pgBackend || len(s.keys) == 1 {
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(s.keys); i += 8 {
				if _, err := op(ctx, w, s.keys[i]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	for _, t := range []string{"counters_unlogged", "log_unlogged", "floor"} {
		if _, err := e.pg.Exec(ctx, `ANALYZE "`+e.schema+`".`+t); err != nil {
			return err
		}
	}
	return nil
}

// burst runs perWorker decisions from each of workers goroutines on one
// fresh key, all released at once, and returns how many were admitted. For
// a client-token contender all workers are one client: each request carries
// the latest token that client holds (worker 0's slot).
func burst(ctx context.Context, op decide, workers, perWorker int, oneClient bool) (int, error) {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			client := w
			if oneClient {
				client = 0
			}
			for range perWorker {
				ok, err := op(ctx, client, "fresh")
				if err != nil {
					errs <- err
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return int(admitted.Load()), nil
}

func memoryContenders(e *env) []contender {
	tb := func(mode tokenbucket.Mode) func(limit, string) (decide, error) {
		return func(lim limit, tag string) (decide, error) {
			store, err := memstore.New(memstore.Config{})
			if err != nil {
				return nil, err
			}
			l, err := tokenbucket.New(tokenbucket.Config{Name: tag, Burst: lim.n, RefillRate: tokenbucket.Rate{Tokens: lim.n, Per: lim.period}, Mode: mode, Store: store})
			if err != nil {
				return nil, err
			}
			return ratekitDecide(l), nil
		}
	}
	return []contender{
		{"ratekit tokenbucket memstore Atomic", memoryBackend, ours, tb(tokenbucket.Atomic)},
		{"ratekit tokenbucket memstore Eventual", memoryBackend, ours, tb(tokenbucket.Eventual)},
		{"x/time/rate (sync.Map of *rate.Limiter)", memoryBackend, peer, func(lim limit, _ string) (decide, error) {
			var m sync.Map
			r := rate.Limit(float64(lim.n) / lim.period.Seconds())
			return func(_ context.Context, _ int, key string) (bool, error) {
				v, ok := m.Load(key)
				if !ok {
					v, _ = m.LoadOrStore(key, rate.NewLimiter(r, int(lim.n)))
				}
				return v.(*rate.Limiter).Allow(), nil
			}, nil
		}},
		{"sethvargo/go-limiter memorystore", memoryBackend, peer, func(lim limit, _ string) (decide, error) {
			store, err := memorystore.New(&memorystore.Config{Tokens: uint64(lim.n), Interval: lim.period})
			if err != nil {
				return nil, err
			}
			e.closers = append(e.closers, func() { store.Close(context.Background()) })
			return sethvargoDecide(store), nil
		}},
	}
}

func sethvargoDecide(store golimiter.Store) decide {
	return func(ctx context.Context, _ int, key string) (bool, error) {
		_, _, _, ok, err := store.Take(ctx, key)
		return ok, err
	}
}

func ratekitDecide(l ratekit.Limiter) decide {
	return func(ctx context.Context, _ int, key string) (bool, error) {
		d, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
		return d.Allowed, err
	}
}

// tokenClient is one client of a signed-window limiter: it keeps the
// latest token it was given for each key and sends it back.
type tokenClient struct {
	mu     sync.Mutex
	tokens map[string]string
	_      [48]byte // one cache line each: workers share nothing while measuring
}

func tokenContenders(e *env) []contender {
	secret := make([]byte, 32)
	rand.Read(secret)
	sw := func(replay int) func(limit, string) (decide, error) {
		return func(lim limit, tag string) (decide, error) {
			l, err := signedwindow.New(signedwindow.Config{Name: tag, Quota: lim.n, Window: lim.period,
				Keys: []signedwindow.Key{{ID: 1, Secret: secret}}, ReplayCacheSize: replay})
			if err != nil {
				return nil, err
			}
			clients := make([]tokenClient, e.maxWorkers)
			for i := range clients {
				clients[i].tokens = map[string]string{}
			}
			return func(ctx context.Context, w int, key string) (bool, error) {
				c := &clients[w]
				c.mu.Lock()
				tok := c.tokens[key]
				c.mu.Unlock()
				d, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1, State: tok})
				if err != nil {
					return false, err
				}
				c.mu.Lock()
				c.tokens[key] = d.State
				c.mu.Unlock()
				return d.Allowed, nil
			}, nil
		}
	}
	return []contender{
		{"ratekit signedwindow", tokenBackend, ours, sw(0)},
		{"ratekit signedwindow + replay cache", tokenBackend, ours, sw(100_000)},
		{"floor: one HMAC-SHA256 (48-byte message, reused hash)", tokenBackend, floor, func(limit, string) (decide, error) {
			macs := make([]hash.Hash, e.maxWorkers)
			for i := range macs {
				macs[i] = hmac.New(sha256.New, make([]byte, 32))
			}
			msg := make([]byte, 48)
			// One cache line per worker's output, so that workers share
			// nothing while measuring.
			bufs := make([][64]byte, e.maxWorkers)
			return func(_ context.Context, w int, key string) (bool, error) {
				m := macs[w]
				m.Reset()
				m.Write(msg)
				m.Sum(bufs[w][:0])
				return true, nil
			}, nil
		}},
	}
}

func (e *env) openRedis(ctx context.Context) error {
	addr := redisAddr()
	e.redis = redis.NewClient(&redis.Options{Addr: addr, PoolSize: e.maxWorkers, MinIdleConns: e.maxWorkers})
	if err := e.redis.Ping(ctx).Err(); err != nil {
		e.redis.Close()
		e.redis = nil
		return fmt.Errorf("redis at %s (RATEKIT_REDIS_ADDR): %w", addr, err)
	}
	fmt.Fprintf(os.Stderr, "Redis %s, key prefix %s:\n", addr, e.prefix)
	return nil
}

func redisContenders(e *env) []contender {
	tb := func(mode tokenbucket.Mode, cache, maxInFlight int) func(limit, string) (decide, error) {
		return func(lim limit, tag string) (decide, error) {
			prefix := fmt.Sprintf("%s:rk-%v-%d-%d:", e.prefix, mode, cache, maxInFlight)
			store, err := redisstore.New(e.redis, redisstore.Config{Prefix: prefix, MaxInFlight: maxInFlight})
			if err != nil {
				return nil, err
			}
			l, err := tokenbucket.New(tokenbucket.Config{Name: tag, Burst: lim.n, RefillRate: tokenbucket.Rate{Tokens: lim.n, Per: lim.period},
				Mode: mode, Store: store, DeniedCacheSize: cache})
			if err != nil {
				return nil, err
			}
			return ratekitDecide(l), nil
		}
	}
	rrl := redis_rate.NewLimiter(e.redis)
	rueidisStore := func(lim limit, tag string) (decide, error) {
		if e.rueidis == nil {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redisAddr()}, DisableCache: true})
			if err != nil {
				return nil, err
			}
			e.rueidis = c
		}
		store, err := rueidisstore.New(e.rueidis, rueidisstore.Config{Prefix: e.prefix + ":rueidis:"})
		if err != nil {
			return nil, err
		}
		l, err := tokenbucket.New(tokenbucket.Config{Name: tag, Burst: lim.n, RefillRate: tokenbucket.Rate{Tokens: lim.n, Per: lim.period},
			Mode: tokenbucket.Atomic, Store: store})
		if err != nil {
			return nil, err
		}
		return ratekitDecide(l), nil
	}
	return []contender{
		{"ratekit tokenbucket rueidisstore Atomic (rueidis, auto-pipelined)", redisBackend, ours, rueidisStore},
		{"ratekit tokenbucket Redis Atomic", redisBackend, ours, tb(tokenbucket.Atomic, 0, 0)},
		{"ratekit tokenbucket Redis Atomic, coalescing off", redisBackend, ours, tb(tokenbucket.Atomic, 0, -1)},
		{"ratekit tokenbucket Redis Eventual", redisBackend, ours, tb(tokenbucket.Eventual, 0, 0)},
		{"ratekit tokenbucket Redis Atomic + denied-key cache (in process)", redisBackend, ours, tb(tokenbucket.Atomic, 10_000, 0)},
		{"go-redis/redis_rate v10", redisBackend, peer, func(lim limit, tag string) (decide, error) {
			l := redis_rate.Limit{Rate: int(lim.n), Burst: int(lim.n), Period: lim.period}
			prefix := e.prefix + ":rr-" + tag + ":"
			return func(ctx context.Context, _ int, key string) (bool, error) {
				res, err := rrl.Allow(ctx, prefix+key, l)
				if err != nil {
					return false, err
				}
				return res.Allowed > 0, nil
			}, nil
		}},
		{"ulule/limiter v3 (Redis store)", redisBackend, peer, func(lim limit, tag string) (decide, error) {
			store, err := ulredis.NewStoreWithOptions(e.redis, ulule.StoreOptions{Prefix: e.prefix + ":ul-" + tag, MaxRetry: 3})
			if err != nil {
				return nil, err
			}
			l := ulule.New(store, ulule.Rate{Period: lim.period, Limit: lim.n})
			return func(ctx context.Context, _ int, key string) (bool, error) {
				c, err := l.Get(ctx, key)
				if err != nil {
					return false, err
				}
				return !c.Reached, nil
			}, nil
		}},
		{"floor: one INCR round trip", redisBackend, floor, func(_ limit, tag string) (decide, error) {
			prefix := e.prefix + ":incr-" + tag + ":"
			return func(ctx context.Context, _ int, key string) (bool, error) {
				return true, e.redis.Incr(ctx, prefix+key).Err()
			}, nil
		}},
	}
}

func (e *env) openPostgres(ctx context.Context, maxConns int) error {
	url := os.Getenv("RATEKIT_POSTGRES_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("RATEKIT_POSTGRES_URL: %w", err)
	}
	cfg.MaxConns = int32(maxConns)
	cfg.MinConns = int32(maxConns)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	// The limiters set synchronous_commit off per decision themselves;
	// the floor's bare statement gets it from the session.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	e.pg, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	if err := e.pg.Ping(ctx); err != nil {
		e.pg.Close()
		e.pg = nil
		return fmt.Errorf("postgres (RATEKIT_POSTGRES_URL): %w", err)
	}
	e.schema = strings.ReplaceAll(e.prefix, "-", "_")
	e.pgStore, err = pgstore.New(e.pg, pgstore.Config{Schema: e.schema})
	if err == nil {
		err = e.pgStore.Migrate(ctx)
	}
	if err == nil {
		_, err = e.pg.Exec(ctx, `CREATE UNLOGGED TABLE "`+e.schema+`".floor (prefix text, key bytea, count bigint NOT NULL, PRIMARY KEY (prefix, key))`)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "PostgreSQL schema %s, pool of %d connections in exec mode\n", e.schema, maxConns)
	return nil
}

func pgContenders(e *env) []contender {
	alg := func(a ratekit.Algorithm) func(limit, string) (decide, error) {
		return func(lim limit, tag string) (decide, error) {
			quota := lim.n
			if most := int64(lim.period / (100 * time.Microsecond)); a == ratekit.TokenBucket && quota > most {
				// A durable bucket refills at most one unit per 100µs
				// of its window; this one still never runs dry in a run.
				quota = most
			}
			l, err := durable.New(durable.Config{Store: e.pgStore,
				Policy: ratekit.Policy{Name: "compare", Quota: quota, Window: lim.period, Algorithm: a},
				Prefix: a.String() + "-" + tag, Durability: durable.Unlogged})
			if err != nil {
				return nil, err
			}
			return ratekitDecide(l), nil
		}
	}
	var cs []contender
	for _, a := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog} {
		cs = append(cs, contender{"ratekit durable " + a.String(), pgBackend, ours, alg(a)})
	}
	q := `INSERT INTO "` + e.schema + `".floor AS f (prefix, key, count) VALUES ($1, $2, 1)
ON CONFLICT (prefix, key) DO UPDATE SET count = f.count + 1 RETURNING count`
	return append(cs, contender{"floor: one INSERT … ON CONFLICT DO UPDATE … RETURNING", pgBackend, floor, func(_ limit, tag string) (decide, error) {
		return func(ctx context.Context, _ int, key string) (bool, error) {
			var n int64
			return true, e.pg.QueryRow(ctx, q, tag, []byte(key)).Scan(&n)
		}, nil
	}})
}

func (e *env) cleanup() {
	ctx := context.Background()
	for _, c := range e.closers {
		c()
	}
	e.closers = nil
	if e.redis != nil {
		deleteKeys(ctx, e.redis, e.prefix)
		e.redis.Close()
		e.redis = nil
	}
	if e.rueidis != nil {
		e.rueidis.Close()
		e.rueidis = nil
	}
	if e.pg != nil {
		if _, err := e.pg.Exec(ctx, `DROP SCHEMA "`+e.schema+`" CASCADE`); err != nil {
			log.Printf("dropping schema %s: %v", e.schema, err)
		}
		e.pg.Close()
		e.pg = nil
	}
}

// deleteKeys removes the Redis keys that start with prefix, logging what
// fails.
func deleteKeys(ctx context.Context, c *redis.Client, prefix string) {
	var errs []error
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			errs = append(errs, c.Del(ctx, batch...).Err())
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		errs = append(errs, c.Del(ctx, batch...).Err())
	}
	if err := errors.Join(append(errs, iter.Err())...); err != nil {
		log.Printf("removing Redis keys %s*: %v", prefix, err)
	}
}

func printNotes() {
	fmt.Print(`Notes:
- "× floor" is decisions/s over the floor's on the same backend and concurrency (Redis: one INCR round trip on the
  same client; PostgreSQL: one INSERT … ON CONFLICT DO UPDATE … RETURNING on an UNLOGGED table through the same pool,
  exec mode, synchronous_commit off; client token: one HMAC-SHA256 of a 48-byte message with a reused hash.Hash).
  In process has no floor. "× best peer" is decisions/s over the fastest peer's on the same backend and concurrency.
- x/time/rate is keyed the way its users key it: a sync.Map from key to *rate.Limiter, Load then LoadOrStore on a
  miss. sethvargo/go-limiter's memorystore keys internally (one RWMutex-guarded map, a mutex per bucket).
- signedwindow: each worker is one client that keeps the token of each key and sends it back (a mutex-guarded map per
  client). In the burst, the 64 workers are one client sending 64 requests at once with the latest token it holds: the
  plain limiter cannot see concurrent uses of one token (best-effort friction, by design); the replay cache counts
  them within the instance.
- Limits: ulule/limiter is a fixed window counter (it increments even when over the limit); sethvargo's memorystore
  refills its whole quota at each interval; redis_rate is GCRA; ratekit tokenbucket is a token bucket with exact integer
  refill. Hot and 10,000-key scenarios never deny for any of them; the admitted column shows it.
- Latencies come from a log-linear histogram (within 1.6%) and include one clock read (~20–40 ns) per decision.
`)
}

func count(v float64) string {
	if math.IsNaN(v) || v == 0 {
		return "—"
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ratio(v, ref float64) string {
	if ref == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v/ref)
}

func percent(f float64) string {
	return fmt.Sprintf("%.1f%%", 100*f)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// references returns the median throughput of backend's floor and of its
// fastest peer, where results gives the runs of contender ci.
func references(contenders []contender, backend string, results func(ci int) []harness.Result) (floorTP, bestPeer float64) {
	return pickReferences(len(contenders), func(ci int) (role, bool) { return contenders[ci].role, contenders[ci].backend == backend },
		func(ci int) float64 { return harness.Median(results(ci)).Throughput })
}

// pickReferences returns the throughput of the floor and of the fastest
// peer among n contenders, of which roleOf gives contender ci's role (and
// false to leave it out) and tp its median throughput.
func pickReferences(n int, roleOf func(ci int) (role, bool), tp func(ci int) float64) (floorTP, bestPeer float64) {
	for ci := range n {
		r, ok := roleOf(ci)
		if !ok {
			continue
		}
		switch r {
		case floor:
			floorTP = tp(ci)
		case peer:
			bestPeer = max(bestPeer, tp(ci))
		}
	}
	return floorTP, bestPeer
}
