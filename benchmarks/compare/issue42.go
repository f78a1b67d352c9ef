package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/benchmarks/internal/harness"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// issue42Rows names the rows of the issue-42 table, for the -rows flag.
const issue42Rows = "redis,logged,unlogged,memory,plans"

// row42 is one backend of the issue-42 table: its contenders measured in
// blocks, in turn, in every scenario at every concurrency.
type row42 struct {
	backend    string // the first column of the table of ratios
	short      string // the first column of the throughput table
	scenarios  []scenario
	contenders []turnContender
	// admin, when not nil, reads Redis's time in commands per decision.
	admin *redis.Client
	// bound is the least ratio the issue asks of the row, below which it
	// is bold; 0 means 1.
	bound float64
}

// issue42 holds what the rows of the issue-42 table share.
type issue42 struct {
	ctx    context.Context
	e      *env
	t      *turnEnv // Redis clients, rate-limiter-flexible on Redis, and every cell's clients to close
	pg     *pgEnv   // nil unless a PostgreSQL row runs
	rounds int
	d      time.Duration
	warm   time.Duration
	concs  []int
}

// issue42Scenarios returns the issue's cells: one hot key and 10,000 keys
// drawn uniformly, both of quota 10^9 a minute (always admitted), and one
// denied key (limit 1 per hour, exhausted before measuring).
func issue42Scenarios() (hot, tenK, denied scenario) {
	perMinute := limit{1_000_000_000, time.Minute}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	first := func(_, _ int) int { return 0 }
	hot = scenario{"hot key", "hot", perMinute, []string{"hot"}, first, false, false}
	tenK = scenario{"10,000 keys", "10k", perMinute, keys, func(w, i int) int {
		return int(mix64(uint64(w)<<32|uint64(i)) % uint64(len(keys)))
	}, false, true}
	denied = scenario{"denied", "denied", deniedLimit, []string{"blocked"}, first, true, false}
	return hot, tenK, denied
}

// mix64 is SplitMix64's finalizer: it maps distinct inputs to well-spread
// outputs, so that decision i of worker w draws a key uniformly without
// shared state between workers.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// runIssue42 measures the rows of the issue-42 table named in rows
// (issue42Rows), in the scenarios named in scenarios (hot, 10k, denied),
// and prints the throughput table and the table of ratios.
func runIssue42(ctx context.Context, e *env, rows, scenarios, rlfDir string, concs []int, rounds int, d, warm time.Duration) error {
	x := &issue42{ctx: ctx, e: e, rounds: rounds, d: d, warm: warm, concs: concs}
	want := func(r string) bool { return slices.Contains(strings.Split(rows, ","), r) }
	for _, r := range strings.Split(rows, ",") {
		if !slices.Contains(strings.Split(issue42Rows, ","), r) {
			return fmt.Errorf("-rows: unknown row %q (rows: %s)", r, issue42Rows)
		}
	}
	redisRLF := ""
	if want("redis") {
		redisRLF = rlfDir
	}
	t, err := openTurnEnv(redisAddr(), e.prefix+":i42", redisRLF, 0)
	if err != nil {
		return err
	}
	x.t = t
	defer t.close()
	if want("logged") || want("unlogged") || want("plans") {
		x.pg, err = openPGEnv(ctx, e.prefix, rlfDir)
		if err != nil {
			return err
		}
		defer x.pg.close()
	}
	admin := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer admin.Close()
	if want("redis") || want("plans") {
		if err := admin.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis at %s (RATEKIT_REDIS_ADDR): %w", redisAddr(), err)
		}
		defer deleteKeys(context.Background(), admin, t.prefix)
	}

	hot, tenK, denied := issue42Scenarios()
	var table []row42
	if want("redis") {
		cs := slices.DeleteFunc(turnContenders(ctx, t), func(c turnContender) bool { return c.extra })
		table = append(table, row42{"Redis (rueidisstore, redisstore) vs ulule, redis_rate, rate-limiter-flexible", "Redis", []scenario{hot, tenK, denied}, cs, admin, 1})
	}
	if want("logged") {
		table = append(table, row42{"PostgreSQL logged, synchronous commit, vs rate-limiter-flexible", "PostgreSQL logged", []scenario{hot, tenK}, x.pgContenders(durable.Logged), nil, 1})
	}
	if want("unlogged") {
		table = append(table, row42{"PostgreSQL unlogged vs rate-limiter-flexible", "PostgreSQL unlogged", []scenario{hot, tenK}, x.pgContenders(durable.Unlogged), nil, 1})
	}
	if want("memory") {
		table = append(table, row42{"in process (memstore) vs x/time/rate, go-limiter", "in process", []scenario{hot, tenK}, x.memoryContenders(), nil, 1})
	}
	if want("plans") {
		table = append(table, x.planRows(hot, admin)...)
	}
	for i := range table {
		table[i].scenarios = slices.DeleteFunc(table[i].scenarios, func(s scenario) bool { return !slices.Contains(strings.Split(scenarios, ","), s.short) })
	}
	return x.run(slices.DeleteFunc(table, func(r row42) bool { return len(r.scenarios) == 0 }))
}

// run measures every cell of table and prints the tables.
func (x *issue42) run(table []row42) error {
	cells, blocks := 0, 0
	for _, r := range table {
		cells += len(r.scenarios) * len(x.concs)
		blocks += len(r.scenarios) * len(x.concs) * len(r.contenders) * x.rounds
	}
	fmt.Fprintf(os.Stderr, "issue42: %d cells, %d blocks of %v + %v: about %v\n", cells, blocks, x.warm, x.d,
		(time.Duration(blocks) * (x.warm + x.d)).Round(time.Second))
	type cell struct{ r, s, n int }
	results := map[cell][][]harness.Result{}
	server := map[cell][][]float64{}
	start := time.Now()
	done := 0
	for ri, r := range table {
		for si, s := range r.scenarios {
			for ni, conc := range x.concs {
				runners, err := turnRunners(r.contenders, s, conc, r.backend)
				if err == nil {
					results[cell{ri, si, ni}], server[cell{ri, si, ni}], err = measureBlocks(x.ctx, r.contenders, runners, conc, x.rounds, x.d, x.warm, r.admin)
				}
				x.t.closeClients()
				if err != nil {
					return fmt.Errorf("%s, %s: %v", r.backend, s.name, err)
				}
				done++
				fmt.Fprintf(os.Stderr, "issue42: [%d/%d] %s, %s, %d %s done (%v)\n", done, cells, r.backend, s.name, conc, plural(conc, "caller"), time.Since(start).Round(time.Second))
			}
		}
	}

	host, _ := os.Hostname()
	fmt.Printf("## The table of issue #42\n\n%s, host %s, GOMAXPROCS %d, %s. Contenders in turn: per cell, %d rounds of one block per\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.GOMAXPROCS(0), runtime.Version(), x.rounds)
	fmt.Printf("contender (%v warm-up, %v measured), the order reversed every other round; medians of the rounds.\n", x.warm, x.d)
	fmt.Printf("Command: `go run ./compare %s`.\n\n", strings.Join(os.Args[1:], " "))
	fmt.Println("Allocations/decision: this process's heap allocations over the block's decisions (Go contenders; the whole process,")
	fmt.Println("idle clients' background work included). Redis µs/decision: Redis's time in commands (INFO commandstats) over them.")
	fmt.Println("Every Go contender that makes round trips gives each decision a context with a 1 s deadline, as a function does.")
	fmt.Println()
	fmt.Println("| backend | cell | callers | contender | decisions/s | p50 | p99 | admitted | × floor | allocations/decision | Redis µs/decision |")
	fmt.Println("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for ri, r := range table {
		for si, s := range r.scenarios {
			for ni, conc := range x.concs {
				rs, us := results[cell{ri, si, ni}], server[cell{ri, si, ni}]
				floorTP, _ := turnReferences(r.contenders, func(ci int) harness.Result { return harness.Median(rs[ci]) })
				for ci, c := range r.contenders {
					m := harness.Median(rs[ci])
					fmt.Printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.short, s.name, conc, c.name, count(m.Throughput),
						harness.Latency(m.P50), harness.Latency(m.P99), percent(m.Admitted), ratio(m.Throughput, floorTP), allocsCell(m.Allocs), usecCell(us[ci]))
				}
			}
		}
	}
	fmt.Println()
	fmt.Println("Ratio: the better ratekit contender's decisions/s over the best peer's in the same cell (for plans: a planned decision")
	fmt.Println("over a composite of the same policies, where the issue asks at least 1/1.2 = 0.83); below what the issue asks in bold.")
	fmt.Println()
	head, rule := "| backend | cell |", "|---|---|"
	for _, conc := range x.concs {
		head += fmt.Sprintf(" %d %s |", conc, plural(conc, "caller"))
		rule += "---:|"
	}
	fmt.Println(head)
	fmt.Println(rule)
	for ri, r := range table {
		for si, s := range r.scenarios {
			line := "| " + r.backend + " | " + s.name + " |"
			if si > 0 {
				line = "| | " + s.name + " |"
			}
			for ni := range x.concs {
				rs := results[cell{ri, si, ni}]
				line += " " + leadCell(r.contenders, r.bound, func(ci int) float64 { return harness.Median(rs[ci]).Throughput }) + " |"
			}
			fmt.Println(line)
		}
	}
	fmt.Println()
	return nil
}

// leadCell formats the ratio of the fastest contender of role ours over the
// fastest of role peer, tp(ci) being contender ci's median throughput, in
// bold below bound (0 means 1).
func leadCell(contenders []turnContender, bound float64, tp func(ci int) float64) string {
	if bound == 0 {
		bound = 1
	}
	var best, peerBest float64
	for ci, c := range contenders {
		switch c.role {
		case ours:
			best = max(best, tp(ci))
		case peer:
			peerBest = max(peerBest, tp(ci))
		}
	}
	if best == 0 || peerBest == 0 || math.IsNaN(best/peerBest) {
		return "—"
	}
	v := fmt.Sprintf("%.2f", best/peerBest)
	if best/peerBest < bound {
		return "**" + v + "**"
	}
	return v
}

// allocsCell formats allocations per decision, "—" when not measured.
func allocsCell(a float64) string {
	if a < 0 {
		return "—"
	}
	return strconv.FormatFloat(a, 'f', 1, 64)
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// memoryContenders returns the in-process contenders of the table: ratekit
// tokenbucket (Atomic) on memstore, x/time/rate and go-limiter, each built
// afresh per cell.
func (x *issue42) memoryContenders() []turnContender {
	var cs []turnContender
	for _, c := range memoryContenders(x.e) {
		if c.role == ours && !strings.HasSuffix(c.name, "Atomic") {
			continue
		}
		cs = append(cs, turnContender{c.name, c.role, func(s scenario, conc int) (harness.Runner, error) {
			op, err := c.build(s.lim, s.short)
			if err != nil {
				return nil, err
			}
			return opRunner(x.ctx, s, conc, op)
		}, false})
	}
	return cs
}

// pgEnv is the PostgreSQL side of the issue-42 table: a schema of its own
// with ratekit's tables, the floor's and rate-limiter-flexible's, and
// rate-limiter-flexible's Node process.
type pgEnv struct {
	url    string
	admin  *pgxpool.Pool
	schema string
	node   *nodeRunner // nil without -rlf
}

// postgresURL returns RATEKIT_POSTGRES_URL, by default the local test
// database.
func postgresURL() string {
	if url := os.Getenv("RATEKIT_POSTGRES_URL"); url != "" {
		return url
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// openPGEnv makes the schema of the issue-42 table, named after prefix,
// and starts rate-limiter-flexible's process when rlfDir is not empty.
func openPGEnv(ctx context.Context, prefix, rlfDir string) (*pgEnv, error) {
	p := &pgEnv{url: postgresURL(), schema: strings.ReplaceAll(prefix, "-", "_") + "_i42"}
	cfg, err := pgxpool.ParseConfig(p.url)
	if err != nil {
		return nil, fmt.Errorf("RATEKIT_POSTGRES_URL: %w", err)
	}
	cfg.MaxConns = 2
	if p.admin, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if err := p.admin.Ping(ctx); err != nil {
		p.admin.Close()
		return nil, fmt.Errorf("postgres (RATEKIT_POSTGRES_URL): %w", err)
	}
	store, err := pgstore.New(p.admin, pgstore.Config{Schema: p.schema})
	if err == nil {
		err = store.Migrate(ctx)
	}
	for _, kind := range []string{"logged", "unlogged"} {
		if err != nil {
			break
		}
		table := "TABLE"
		if kind == "unlogged" {
			table = "UNLOGGED TABLE"
		}
		_, err = p.admin.Exec(ctx, fmt.Sprintf(`CREATE %s "%s".floor_%s (prefix text, key bytea, count bigint NOT NULL, PRIMARY KEY (prefix, key));
CREATE %[1]s "%[2]s".rlf_%[3]s (key varchar(255) PRIMARY KEY, points integer NOT NULL DEFAULT 0, expire bigint)`, table, p.schema, kind),
			pgx.QueryExecModeSimpleProtocol)
	}
	if err == nil && rlfDir != "" {
		p.node, err = startNode(rlfDir, "postgres", p.url, p.schema, "rlf:")
	}
	if err != nil {
		p.close()
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "PostgreSQL schema %s\n", p.schema)
	return p, nil
}

func (p *pgEnv) close() {
	if p.node != nil {
		p.node.close()
		p.node = nil
	}
	if _, err := p.admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+p.schema+`" CASCADE`); err != nil {
		fmt.Fprintf(os.Stderr, "dropping schema %s: %v\n", p.schema, err)
	}
	p.admin.Close()
}

// pool returns a pool of conc connections, all open, closed with the
// cell's clients.
func (x *issue42) pool(conc int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(x.pg.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conc)
	cfg.MinConns = int32(conc)
	p, err := pgxpool.NewWithConfig(x.ctx, cfg)
	if err != nil {
		return nil, err
	}
	var conns []*pgxpool.Conn
	for range conc {
		c, err := p.Acquire(x.ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if len(conns) < conc {
		p.Close()
		return nil, fmt.Errorf("opening %d connections: %d opened", conc, len(conns))
	}
	x.t.closers = append(x.t.closers, p.Close)
	return p, nil
}

// pgMaxInFlight is the pgstore.Config.MaxInFlight of the issue-42 table's
// ratekit PostgreSQL contenders (the -pg-max-in-flight flag; 0 is the
// default).
var pgMaxInFlight int

// pgContenders returns the PostgreSQL contenders on tables of durability
// dur: ratekit durable (token bucket and fixed window; synchronous commit
// on Logged tables), rate-limiter-flexible's RateLimiterPostgres, and the
// floor, a bare upsert. Each has a pool of its own, of as many connections
// as callers.
func (x *issue42) pgContenders(dur durable.Durability) []turnContender {
	kind := strings.ToLower(dur.String())
	limiter := func(alg ratekit.Algorithm) func(scenario, int) (harness.Runner, error) {
		return func(s scenario, conc int) (harness.Runner, error) {
			p, err := x.pool(conc)
			if err != nil {
				return nil, err
			}
			store, err := pgstore.New(p, pgstore.Config{Schema: x.pg.schema, MaxInFlight: pgMaxInFlight})
			if err != nil {
				return nil, err
			}
			quota := s.lim.n
			if most := int64(s.lim.period / (100 * time.Microsecond)); alg == ratekit.TokenBucket && quota > most {
				// A durable bucket refills at most one unit per 100µs
				// of its window; this one still never runs dry in a cell.
				quota = most
			}
			l, err := durable.New(durable.Config{Store: store, Durability: dur, SynchronousCommit: dur == durable.Logged,
				Policy: ratekit.Policy{Name: "compare", Quota: quota, Window: s.lim.period, Algorithm: alg},
				Prefix: fmt.Sprintf("%s-%s-%s-%d", alg, kind, s.short, conc)})
			if err != nil {
				return nil, err
			}
			return roundTripRunner(x.ctx, s, conc, ratekitDecide(l))
		}
	}
	cs := []turnContender{
		{"ratekit durable token bucket", ours, limiter(ratekit.TokenBucket), false},
		{"ratekit durable fixed window", ours, limiter(ratekit.FixedWindow), false},
	}
	if node := x.pg.node; node != nil {
		cs = append(cs, turnContender{"rate-limiter-flexible 11.4 RateLimiterPostgres (Node 20, pg pool)", peer, func(s scenario, conc int) (harness.Runner, error) {
			r := node.runner(s, conc, "rlf_"+kind)
			x.t.closers = append(x.t.closers, func() {
				if err := node.release(s, conc); err != nil {
					fmt.Fprintf(os.Stderr, "rlf.js: %v\n", err)
				}
			})
			// The first run opens the pool; V8 compiles the loop.
			var discard harness.Sample
			return r, r(x.ctx, conc, time.Second, &discard)
		}, false})
	}
	q := fmt.Sprintf(`INSERT INTO "%s".floor_%s AS f (prefix, key, count) VALUES ($1, $2, 1)
ON CONFLICT (prefix, key) DO UPDATE SET count = f.count + 1 RETURNING count`, x.pg.schema, kind)
	return append(cs, turnContender{"floor: one INSERT … ON CONFLICT DO UPDATE … RETURNING (pgx, exec mode)", floor, func(s scenario, conc int) (harness.Runner, error) {
		p, err := x.pool(conc)
		if err != nil {
			return nil, err
		}
		prefix := fmt.Sprintf("%s-%d", s.short, conc)
		return roundTripRunner(x.ctx, s, conc, func(ctx context.Context, _ int, key string) (bool, error) {
			var n int64
			return true, p.QueryRow(ctx, q, pgx.QueryExecModeExec, prefix, []byte(key)).Scan(&n)
		})
	}, false})
}

// planBound is the least planned ÷ composite ratio the issue asks: a
// planned decision costs at most 1.2 times a composite's.
const planBound = 1 / 1.2

// planPolicies returns the policies of the plan rows: a burst and a
// monthly quota from a billing anchor, as one plan, and the month as a
// bucket of its quota filled in 30 days for tokenbucket.Composite, which
// counts no calendar periods. Neither denies in a cell: the burst holds
// 36M units (the most an hour's durable bucket holds, one unit per 100µs),
// beyond what a cell's rounds decide on its key.
func planPolicies() (ratekit.Plan, ratekit.Policy) {
	plan := ratekit.Plan{Name: "pro", Policies: []ratekit.Policy{
		{Name: "burst", Quota: 36_000_000, Window: time.Hour, Algorithm: ratekit.TokenBucket},
		{Name: "monthly", Quota: 1_000_000_000, Algorithm: ratekit.FixedWindow,
			Period: ratekit.Period{Unit: ratekit.Month, Anchor: time.Date(2026, 1, 14, 9, 0, 0, 0, time.UTC)}},
	}}
	return plan, ratekit.Policy{Name: "monthly", Quota: 1_000_000_000, Window: 30 * 24 * time.Hour, Algorithm: ratekit.TokenBucket}
}

// planRows returns the rows of plans, on one hot key (a paid API's hottest
// customer): a planned decision (role ours) against a composite of the same
// policies (role peer) on PostgreSQL (durable, logged tables, the default
// commit) and on Redis (tokenbucket on redisstore and on rueidisstore).
func (x *issue42) planRows(hot scenario, admin *redis.Client) []row42 {
	plan, monthBucket := planPolicies()
	planOf := func(context.Context, string) (ratekit.Plan, error) { return plan, nil }
	pg := func(planned bool) func(scenario, int) (harness.Runner, error) {
		return func(s scenario, conc int) (harness.Runner, error) {
			p, err := x.pool(conc)
			if err != nil {
				return nil, err
			}
			store, err := pgstore.New(p, pgstore.Config{Schema: x.pg.schema})
			if err != nil {
				return nil, err
			}
			prefix := fmt.Sprintf("plan-%s-%d", s.short, conc)
			var l ratekit.Limiter
			if planned {
				l, err = durable.NewPlanned(durable.PlannedConfig{Store: store, Prefix: prefix + "-p", Durability: durable.Logged, Plan: planOf})
			} else {
				var parts []*durable.Limiter
				for _, pol := range plan.Policies {
					var part *durable.Limiter
					part, err = durable.New(durable.Config{Store: store, Policy: pol, Prefix: prefix + "-c" + pol.Name, Durability: durable.Logged})
					if err != nil {
						break
					}
					parts = append(parts, part)
				}
				if err == nil {
					l, err = durable.NewComposite(parts...)
				}
			}
			if err != nil {
				return nil, err
			}
			return roundTripRunner(x.ctx, s, conc, ratekitDecide(l))
		}
	}
	onRedis := func(store func(conc int, prefix string) (kvstore.Store, error), planned bool) func(scenario, int) (harness.Runner, error) {
		return func(s scenario, conc int) (harness.Runner, error) {
			st, err := store(conc, fmt.Sprintf("%s:plan-%s-%d-%t:", x.t.prefix, s.short, conc, planned))
			if err != nil {
				return nil, err
			}
			var l ratekit.Limiter
			if planned {
				l, err = tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "plan", Store: st, Plan: planOf})
			} else {
				var buckets []tokenbucket.Bucket
				for _, p := range []ratekit.Policy{plan.Policies[0], monthBucket} {
					buckets = append(buckets, tokenbucket.Bucket{Name: p.Name, Burst: p.Quota, RefillRate: tokenbucket.Rate{Tokens: p.Quota, Per: p.Window}})
				}
				l, err = tokenbucket.NewComposite(tokenbucket.CompositeConfig{Buckets: buckets, Mode: tokenbucket.Atomic, Store: st})
			}
			if err != nil {
				return nil, err
			}
			return roundTripRunner(x.ctx, s, conc, ratekitDecide(l))
		}
	}
	goRedis := func(conc int, prefix string) (kvstore.Store, error) {
		return redisstore.New(x.t.serverless(conc), redisstore.Config{Prefix: prefix})
	}
	rueidisStore := func(_ int, prefix string) (kvstore.Store, error) {
		c, err := x.t.rueidisServerless(nil)
		if err != nil {
			return nil, err
		}
		return rueidisstore.New(c, rueidisstore.Config{Prefix: prefix})
	}
	scen := []scenario{hot}
	return []row42{
		{"plans on PostgreSQL (durable, logged), planned ÷ composite", "plans, PostgreSQL", scen, []turnContender{
			{"durable.Planned (burst + monthly quota)", ours, pg(true), false},
			{"durable.Composite of the same policies", peer, pg(false), false},
		}, nil, planBound},
		{"plans on Redis (redisstore), planned ÷ composite", "plans, redisstore", scen, []turnContender{
			{"tokenbucket.Planned on redisstore (burst + monthly quota)", ours, onRedis(goRedis, true), false},
			{"tokenbucket.Composite on redisstore of the same policies", peer, onRedis(goRedis, false), false},
		}, admin, planBound},
		{"plans on Redis (rueidisstore), planned ÷ composite", "plans, rueidisstore", scen, []turnContender{
			{"tokenbucket.Planned on rueidisstore (burst + monthly quota)", ours, onRedis(rueidisStore, true), false},
			{"tokenbucket.Composite on rueidisstore of the same policies", peer, onRedis(rueidisStore, false), false},
		}, admin, planBound},
	}
}

// rlfDefault returns dir when rate-limiter-flexible is installed there
// (benchmarks/rlf after npm ci), and "" otherwise.
func rlfDefault(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "rate-limiter-flexible")); err != nil {
		return ""
	}
	return dir
}
