// Command durable measures ratekit's PostgreSQL limiters next to the
// physical floor of the same database: a bare single-statement
// INSERT … ON CONFLICT DO UPDATE … RETURNING counter sent through the same
// pool. For every algorithm, UNLOGGED and logged tables, synchronous_commit
// off and on, and each concurrency, it prints throughput and p50/p99
// latency, and the throughput as a fraction of the floor measured in the
// same run with the same table kind and commit mode.
//
// Usage:
//
//	cd benchmarks && go run ./durable [-duration 2s] [-runs 3] [-concurrency 1,8,64] [-keys 10000]
//	    [-window 1m] [-cleanup 0] [-tables unlogged,logged] [-sync off,on] [-max-in-flight 0] [-baseline]
//
// The server comes from RATEKIT_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable). The program
// works in a schema of its own (ratekit_bench_<random>), fills the tables,
// runs ANALYZE before measuring, and drops the schema at the end. With
// -runs above 1 every figure is the median of the runs.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	mrand "math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/benchmarks/internal/harness"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
)

func main() {
	duration := flag.Duration("duration", 2*time.Second, "measuring time per cell")
	runs := flag.Int("runs", 1, "runs per cell; figures are medians")
	concList := flag.String("concurrency", "1,8,64", "comma-separated numbers of concurrent callers")
	keys := flag.Int("keys", 10000, "distinct keys, picked at random by each call")
	maxConns := flag.Int("max-conns", 16, "pool size cap (the pool has min(concurrency, this) connections)")
	window := flag.Duration("window", time.Minute, "limiter window (quota 1000 per window and key, so almost every call is admitted)")
	cleanup := flag.Float64("cleanup", 0, "limiters' CleanupProbability (0 = library default, negative = no inline cleanup)")
	maxInFlight := flag.Int("max-in-flight", 0, "stores' MaxInFlight (0 = library default, negative = no coalescing)")
	baseline := flag.Bool("baseline", false, "also measure every algorithm with coalescing off (MaxInFlight -1), interleaved with the rest")
	tables := flag.String("tables", "unlogged,logged", "table kinds to measure")
	syncs := flag.String("sync", "off,on", "synchronous_commit settings to measure")
	flag.Parse()
	url := os.Getenv("RATEKIT_POSTGRES_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	concs, err := harness.ParseCounts(*concList)
	if err != nil {
		log.Fatalf("-concurrency: %v", err)
	}
	b := &bench{url: url, duration: *duration, keys: makeKeys(*keys), maxConns: *maxConns, filled: map[string]bool{},
		window: *window, cleanup: *cleanup, maxInFlight: *maxInFlight, baseline: *baseline}
	for _, t := range strings.Split(*tables, ",") {
		switch strings.TrimSpace(t) {
		case "unlogged":
			b.durs = append(b.durs, durable.Unlogged)
		case "logged":
			b.durs = append(b.durs, durable.Logged)
		default:
			log.Fatalf("bad -tables %q", *tables)
		}
	}
	for _, v := range strings.Split(*syncs, ",") {
		switch strings.TrimSpace(v) {
		case "off":
			b.syncs = append(b.syncs, false)
		case "on":
			b.syncs = append(b.syncs, true)
		default:
			log.Fatalf("bad -sync %q", *syncs)
		}
	}
	b.schema = "ratekit_bench_" + randHex(4)
	ctx := context.Background()
	err = b.setup(ctx)
	if err == nil {
		err = b.report(ctx, concs, *runs, *keys)
	}
	b.drop(ctx)
	if err != nil {
		log.Fatal(err)
	}
}

func (b *bench) report(ctx context.Context, concs []int, runs, keys int) error {

	algs := []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog}
	fmt.Printf("PostgreSQL limiter throughput vs the floor (bare upsert): %d keys, quota 1000 per %v, cleanup probability %v, MaxInFlight %d, pool min(concurrency, %d), %v per cell, median of %d run(s)\n\n",
		keys, b.window, b.cleanup, b.maxInFlight, b.maxConns, b.duration, runs)
	fmt.Println("| table | synchronous_commit | concurrency | subject | ops/s | p50 | p99 | % of floor |")
	fmt.Println("|---|---|---|---|---:|---:|---:|---:|")
	for _, dur := range b.durs {
		for _, sync := range b.syncs {
			for _, conc := range concs {
				// The runs of a group interleave the subjects, so that the
				// load of a shared machine drifts over all of them alike.
				// Subjects: the floor, every algorithm, and with -baseline
				// every algorithm again with coalescing off.
				subjects := len(algs)
				if b.baseline {
					subjects *= 2
				}
				results := make([][]harness.Result, 1+subjects)
				for range runs {
					for i := range results {
						var r harness.Result
						var err error
						if i == 0 {
							r, err = b.runFloor(ctx, dur, sync, conc)
						} else {
							mif := b.maxInFlight
							if i > len(algs) {
								mif = -1
							}
							r, err = b.runLimiter(ctx, algs[(i-1)%len(algs)], dur, sync, conc, mif)
						}
						if err != nil {
							return err
						}
						results[i] = append(results[i], r)
					}
				}
				floor := harness.Median(results[0])
				row(dur, sync, conc, "floor (bare upsert)", floor, floor)
				for i, alg := range algs {
					row(dur, sync, conc, alg.String(), harness.Median(results[i+1]), floor)
				}
				if b.baseline {
					for i, alg := range algs {
						row(dur, sync, conc, alg.String()+" (coalescing off)", harness.Median(results[len(algs)+i+1]), floor)
					}
				}
			}
		}
	}
	return nil
}

func row(d durable.Durability, sync bool, conc int, subject string, r, floor harness.Result) {
	sc := "off"
	if sync {
		sc = "on"
	}
	fmt.Printf("| %s | %s | %d | %s | %.0f | %s | %s | %.0f%% |\n", d, sc, conc, subject, r.Throughput,
		fmtDur(r.P50), fmtDur(r.P99), 100*r.Throughput/floor.Throughput)
}

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

type bench struct {
	url         string
	schema      string
	duration    time.Duration
	keys        []string
	maxConns    int
	window      time.Duration
	cleanup     float64
	maxInFlight int
	baseline    bool
	durs        []durable.Durability
	syncs       []bool
	admin       *pgxpool.Pool
	filled      map[string]bool
}

func makeKeys(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("customer-%06d", i)
	}
	return k
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (b *bench) setup(ctx context.Context) error {
	var err error
	b.admin, err = pgxpool.New(ctx, b.url)
	if err != nil {
		return err
	}
	store, err := pgstore.New(b.admin, pgstore.Config{Schema: b.schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	q := `CREATE UNLOGGED TABLE "%[1]s".floor_unlogged (prefix text, key bytea, count bigint NOT NULL, PRIMARY KEY (prefix, key));
CREATE TABLE "%[1]s".floor (prefix text, key bytea, count bigint NOT NULL, PRIMARY KEY (prefix, key));`
	_, err = b.admin.Exec(ctx, fmt.Sprintf(q, b.schema), pgx.QueryExecModeSimpleProtocol)
	return err
}

func (b *bench) drop(ctx context.Context) {
	if _, err := b.admin.Exec(ctx, `DROP SCHEMA "`+b.schema+`" CASCADE`); err != nil {
		log.Print(err)
	}
	b.admin.Close()
}

// pool returns a pool for one cell. Synchronous commit off for the floor is
// a session parameter (the floor is a bare statement); the limiters set it
// per transaction themselves.
func (b *bench) pool(ctx context.Context, conc int, floorSyncOff bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(min(conc, b.maxConns))
	cfg.MinConns = cfg.MaxConns
	if floorSyncOff {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// Open every connection before measuring.
	var conns []*pgxpool.Conn
	for range cfg.MaxConns {
		c, err := p.Acquire(ctx)
		if err != nil {
			// Close waits for acquired connections: release them first.
			for _, c := range conns {
				c.Release()
			}
			p.Close()
			return nil, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return p, nil
}

func (b *bench) runFloor(ctx context.Context, d durable.Durability, sync bool, conc int) (harness.Result, error) {
	p, err := b.pool(ctx, conc, !sync)
	if err != nil {
		return harness.Result{}, err
	}
	defer p.Close()
	table := `"` + b.schema + `".floor`
	if d == durable.Unlogged {
		table += "_unlogged"
	}
	q := "INSERT INTO " + table + " AS f (prefix, key, count) VALUES ($1, $2, 1) " +
		"ON CONFLICT (prefix, key) DO UPDATE SET count = f.count + 1 RETURNING count"
	prefix := "floor"
	op := func(ctx context.Context, key string) error {
		var n int64
		return p.QueryRow(ctx, q, pgx.QueryExecModeExec, prefix, []byte(key)).Scan(&n)
	}
	if err := b.fill(ctx, table, op, table); err != nil {
		return harness.Result{}, err
	}
	return b.measure(ctx, conc, op)
}

func (b *bench) runLimiter(ctx context.Context, alg ratekit.Algorithm, d durable.Durability, sync bool, conc, maxInFlight int) (harness.Result, error) {
	p, err := b.pool(ctx, conc, false)
	if err != nil {
		return harness.Result{}, err
	}
	defer p.Close()
	store, err := pgstore.New(p, pgstore.Config{Schema: b.schema, MaxInFlight: maxInFlight})
	if err != nil {
		return harness.Result{}, err
	}
	// Quotas large enough that almost every call is admitted (the
	// expensive path).
	prefix := "bench-" + alg.String() + "-" + d.String()
	l, err := durable.New(durable.Config{
		Store: store, Durability: d, SynchronousCommit: sync,
		Policy:             ratekit.Policy{Name: "bench-" + alg.String(), Quota: 1000, Window: b.window, Algorithm: alg},
		Prefix:             prefix,
		CleanupProbability: b.cleanup,
	})
	if err != nil {
		return harness.Result{}, err
	}
	op := func(ctx context.Context, key string) error {
		_, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
		return err
	}
	tables := []string{`"` + b.schema + `".counters`, `"` + b.schema + `".log`}
	if d == durable.Unlogged {
		tables = []string{`"` + b.schema + `".counters_unlogged`, `"` + b.schema + `".log_unlogged`}
	}
	if err := b.fill(ctx, prefix, op, tables...); err != nil {
		return harness.Result{}, err
	}
	return b.measure(ctx, conc, op)
}

// fill touches every key once (the first time for each name), then runs
// ANALYZE on the tables so that the planner has statistics (after a fresh
// fill it may otherwise pick the expiry index for key lookups).
func (b *bench) fill(ctx context.Context, name string, op func(context.Context, string) error, tables ...string) error {
	if b.filled[name] {
		return nil
	}
	b.filled[name] = true
	for _, k := range b.keys {
		if err := op(ctx, k); err != nil {
			return err
		}
	}
	for _, t := range tables {
		if _, err := b.admin.Exec(ctx, "ANALYZE "+t); err != nil {
			return err
		}
	}
	return nil
}

// measure runs op from conc workers for the cell's duration, each on keys
// picked at random by its own generator.
func (b *bench) measure(ctx context.Context, conc int, op func(context.Context, string) error) (harness.Result, error) {
	seed := uint64(time.Now().UnixNano())
	rngs := make([]*mrand.Rand, conc)
	for w := range rngs {
		rngs[w] = mrand.New(mrand.NewPCG(uint64(w), seed))
	}
	return harness.Measure(ctx, conc, b.duration, func(ctx context.Context, w, _ int) (bool, error) {
		return true, op(ctx, b.keys[rngs[w].IntN(len(b.keys))])
	})
}
