package plans_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// The parent test and its worker processes talk in JSON lines: commands on
// the worker's standard input, replies on its standard output, matched by
// ID (a worker runs the commands it reads concurrently).

// Environment of a worker process.
const (
	workerEnv = "RATEKIT_PLANS_WORKER" // the backend's name; set only in workers
	dsnEnv    = "RATEKIT_PLANS_DSN"    // PostgreSQL connection string
	schemaEnv = "RATEKIT_PLANS_SCHEMA" // the parent's test schema
	prefixEnv = "RATEKIT_PLANS_PREFIX" // PlannedConfig.Prefix
	redisEnv  = "RATEKIT_PLANS_REDIS"  // Redis host:port
	dynamoEnv = "RATEKIT_PLANS_DYNAMO" // DynamoDB endpoint URL
	tableEnv  = "RATEKIT_PLANS_TABLE"  // DynamoDB table
)

// dynamoAttempts is the MaxAttempts of the DynamoDB backend's store: every
// decision of a run writes one item (the run's key is its group), from
// eight requests in flight at once.
const dynamoAttempts = 64

// redisKeys begins the redisstore prefix of the Redis backend's keys: a
// run's store prefix is redisKeys + its PlannedConfig.Prefix + ":" (the
// store puts a record's name in braces after its prefix), and its keys are
// deleted when it ends.
const redisKeys = "ratekit-test:plans:"

// The plan's policies: a burst that no phase reaches, and the periodic
// quota under test.
const (
	burstName  = "burst"
	burstQuota = 1_000_000
	quotaName  = "quota"
)

// Command ops.
const (
	opAllow   = "allow"
	opRefund  = "refund"
	opUsage   = "usage"
	opPeriods = "periods"
)

// Limits of a worker.
const (
	workerConn = 4                // connections per worker
	workerPar  = 2                // requests in flight per worker and command
	opTimeout  = 30 * time.Second // bound of one command
	quitGrace  = 10 * time.Second // how long a worker may take to exit
	scanBuffer = 64 << 10         // initial line buffer
	maxLine    = 1 << 20          // the longest line
)

// planSpec is a key's plan as the parent sends it: a burst no test
// reaches and a quota per period.
type planSpec struct {
	Quota    int64
	Unit     ratekit.PeriodUnit
	Zone     zoneSpec
	AnchorUS int64 // the anchor instant in microseconds since the epoch
}

// plan builds the ratekit.Plan of s.
func (s planSpec) plan() (ratekit.Plan, error) {
	loc, err := s.Zone.location()
	if err != nil {
		return ratekit.Plan{}, err
	}
	return ratekit.Plan{Name: "q" + strconv.FormatInt(s.Quota, 10), Policies: []ratekit.Policy{
		{Name: burstName, Quota: burstQuota, Window: time.Second, Algorithm: ratekit.TokenBucket},
		{Name: quotaName, Quota: s.Quota, Algorithm: ratekit.FixedWindow,
			Period: ratekit.Period{Unit: s.Unit, Location: loc, Anchor: time.UnixMicro(s.AnchorUS).In(loc)}},
	}}, nil
}

// command is one instruction to a worker. Before running it, the worker
// sets Key's plan to Plan.
type command struct {
	ID   int
	Op   string
	Key  string
	Plan planSpec
	// N requests of Cost each, for opAllow and opRefund; request i
	// carries the idempotency key Idem+"-"+i when Idem is not empty.
	N    int
	Cost int64
	Idem string
	// FromUS and ToUS bound the period starts of opPeriods.
	FromUS, ToUS int64
}

// outcome is what one request of an opAllow got: admitted or not, and the
// end of the period it was counted in, as this process's clock puts it
// (now + the quota part's ResetAfter, which the database computed from its
// own clock).
type outcome struct {
	Admitted bool
	EndUS    int64
}

// usageLine is the quota policy's line of Planned.Usage.
type usageLine struct {
	Quota, Used, Remaining int64
}

// periodLine is one row of PeriodUsage for the command's key.
type periodLine struct {
	StartUS, EndUS, Used int64
}

// reply answers a command.
type reply struct {
	ID       int
	Err      string
	Outcomes []outcome
	Usage    usageLine
	Periods  []periodLine
}

// backend is a store that the check runs against. setup runs in the
// parent, once per run of the check: it locates the server (skipping
// outside CI when it is missing, failing in CI), prepares it, and returns
// the environment of the backend's workers, with a key prefix of the run's
// own. open runs in a worker process and returns the planned limiter under
// test. The scenarios use nothing else, except where the backends'
// documented semantics differ (untiedRefunds).
type backend struct {
	name  string
	setup func(t *testing.T) []string
	open  func(ctx context.Context, plan func(ctx context.Context, key string) (ratekit.Plan, error)) (planned, func(), error)
	// untiedRefunds is set when refunds are not tied to their charges:
	// Request.IdempotencyKey is ignored and a refund made after its
	// charge's period ended lowers the current period's count (never
	// below zero), as tokenbucket.Planned does. durable.Planned keeps
	// idempotency records and refunds nothing there.
	untiedRefunds bool
}

// planned is what the check needs of a planned limiter.
type planned interface {
	ratekit.Limiter
	ratekit.Refunder
	Usage(ctx context.Context, key string) ([]ratekit.Usage, error)
	PeriodUsage(ctx context.Context, policy string, from, to time.Time, fn func(ratekit.PeriodUsage) error) error
}

// errNoPeriods is returned by a backend that keeps no billing records.
var errNoPeriods = errors.New("this backend lists no periods")

// periods lists key's usage of the quota policy in the periods that start
// in [from, to), by start (dynamodb reports them in the order of its Scan),
// or returns errNoPeriods for a backend that keeps no billing records
// (PeriodUsage's errors.ErrUnsupported).
func periods(ctx context.Context, l planned, key string, from, to time.Time) ([]periodLine, error) {
	var out []periodLine
	err := l.PeriodUsage(ctx, quotaName, from, to, func(u ratekit.PeriodUsage) error {
		if u.Key == key {
			out = append(out, periodLine{u.Start.UnixMicro(), u.End.UnixMicro(), u.Used})
		}
		return nil
	})
	if errors.Is(err, errors.ErrUnsupported) {
		return nil, errNoPeriods
	}
	slices.SortFunc(out, func(a, b periodLine) int { return cmp.Compare(a.StartUS, b.StartUS) })
	return out, err
}

var backends = []backend{
	{name: "postgres", setup: setupPostgres, open: openPostgres},
	{name: "redis", setup: setupRedis, open: openRedis, untiedRefunds: true},
	{name: "dynamodb", setup: setupDynamo, open: openDynamo},
}

// setupPostgres migrates the parent's schema (before the workers start)
// and passes it, the server and a fresh prefix to the workers.
func setupPostgres(t *testing.T) []string {
	dsn := pgstoretest.PostgresURL(t)
	schema := pgstoretest.Schema()
	store, err := pgstore.New(pgstoretest.Pool(t, dsn, 2, ""), pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return []string{dsnEnv + "=" + dsn, schemaEnv + "=" + schema, prefixEnv + "=" + pgstoretest.Prefix(t)}
}

// setupRedis passes the server and a fresh prefix to the workers, and
// deletes the run's keys when it ends (after the workers have exited).
func setupRedis(t *testing.T) []string {
	addr := testenv.RedisAddr(t)
	prefix := pgstoretest.Prefix(t) // a valid PlannedConfig.Prefix no other test uses
	redisclient.Client(t, addr, redisKeys+prefix+":")
	return []string{redisEnv + "=" + addr, prefixEnv + "=" + prefix}
}

// setupDynamo creates a table of the run's own (deleted when it ends, after
// the workers have exited) and passes the endpoint, the table and a fresh
// prefix to the workers.
func setupDynamo(t *testing.T) []string {
	endpoint := testenv.DynamoDBEndpoint(t)
	client := dynamoClient(endpoint)
	prefix := pgstoretest.Prefix(t) // a valid PlannedConfig.Prefix no other test uses
	table := "ratekit-plans-" + strings.ReplaceAll(prefix, ":", "-")
	// dynalite has no Time to Live; the store checks expiry itself.
	if err := dynamostore.CreateTable(context.Background(), client, table); err != nil && !errors.Is(err, dynamostore.ErrNoTTL) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	return []string{dynamoEnv + "=" + endpoint, tableEnv + "=" + table, prefixEnv + "=" + prefix}
}

// dynamoClient returns a DynamoDB client of endpoint with test credentials.
func dynamoClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ratekit plans test"}, nil
		}),
	})
}

// openDynamo is the DynamoDB backend: tokenbucket.Planned over dynamostore
// with Group (each key's records in one item), on this process's clock.
// The store keeps idempotency records and period history, so its refunds
// are tied to their charges and Periods lists billing records.
func openDynamo(_ context.Context, plan func(ctx context.Context, key string) (ratekit.Plan, error)) (planned, func(), error) {
	client := dynamoClient(os.Getenv(dynamoEnv))
	store, err := dynamostore.New(client, dynamostore.Config{Table: os.Getenv(tableEnv), MaxAttempts: dynamoAttempts})
	if err != nil {
		return nil, nil, err
	}
	p, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Store: store, Prefix: os.Getenv(prefixEnv), Group: true, Plan: plan})
	if err != nil {
		return nil, nil, err
	}
	return p, func() {}, nil
}

// openPostgres is the PostgreSQL backend: durable.Planned on the parent's
// schema and prefix.
func openPostgres(ctx context.Context, plan func(ctx context.Context, key string) (ratekit.Plan, error)) (planned, func(), error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv(dsnEnv))
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = workerConn
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	store, err := pgstore.New(pool, pgstore.Config{Schema: os.Getenv(schemaEnv)})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	p, err := durable.NewPlanned(durable.PlannedConfig{
		Store: store, Prefix: os.Getenv(prefixEnv), Durability: durable.Logged, Plan: plan,
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return p, pool.Close, nil
}

// openRedis is the Redis backend: tokenbucket.Planned over redisstore on
// the parent's server and prefix. The plans' burst has one shape (its
// quota and window do not change with the plan), so it stays one bucket.
func openRedis(_ context.Context, plan func(ctx context.Context, key string) (ratekit.Plan, error)) (planned, func(), error) {
	client := redis.NewClient(&redis.Options{Addr: os.Getenv(redisEnv), PoolSize: workerConn})
	store, err := redisstore.New(client, redisstore.Config{Prefix: redisKeys + os.Getenv(prefixEnv) + ":"})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	p, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Store: store, Prefix: os.Getenv(prefixEnv), Plan: plan})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return p, func() { client.Close() }, nil
}

// runWorker is a worker process's main: it decides the commands it reads
// until its input ends.
func runWorker() int {
	var b *backend
	for i := range backends {
		if backends[i].name == os.Getenv(workerEnv) {
			b = &backends[i]
		}
	}
	if b == nil {
		fmt.Fprintf(os.Stderr, "worker: unknown backend %q\n", os.Getenv(workerEnv))
		return 2
	}
	var mu sync.Mutex
	plans := map[string]planSpec{}
	plan := func(_ context.Context, key string) (ratekit.Plan, error) {
		mu.Lock()
		s, ok := plans[key]
		mu.Unlock()
		if !ok {
			return ratekit.Plan{}, fmt.Errorf("no plan for key %q", key)
		}
		return s.plan()
	}
	ctx := context.Background()
	l, closeFn, err := b.open(ctx, plan)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer closeFn()
	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, scanBuffer), maxLine)
	for in.Scan() {
		var c command
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 1
		}
		mu.Lock()
		plans[c.Key] = c.Plan
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := execute(ctx, l, c)
			outMu.Lock()
			defer outMu.Unlock()
			out.Encode(r)
		}()
	}
	wg.Wait()
	return 0
}

// execute runs one command in a worker.
func execute(ctx context.Context, l planned, c command) reply {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r := reply{ID: c.ID}
	var err error
	switch c.Op {
	case opAllow, opRefund:
		r.Outcomes = make([]outcome, c.N)
		next := make(chan int, c.N)
		for i := 0; i < c.N; i++ {
			next <- i
		}
		close(next)
		var wg sync.WaitGroup
		var errMu sync.Mutex
		for w := 0; w < workerPar; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					req := ratekit.Request{Key: c.Key, Cost: c.Cost}
					if c.Idem != "" {
						req.IdempotencyKey = c.Idem + "-" + strconv.Itoa(i)
					}
					var d ratekit.Decision
					var e error
					if c.Op == opAllow {
						d, e = l.Allow(ctx, req)
					} else {
						d, e = l.Refund(ctx, req)
					}
					if e == nil && len(d.Parts) != 2 {
						e = fmt.Errorf("decision of %d parts, want 2", len(d.Parts))
					}
					if e != nil {
						errMu.Lock()
						err = e
						errMu.Unlock()
						continue
					}
					r.Outcomes[i] = outcome{Admitted: d.Allowed, EndUS: time.Now().Add(d.Parts[1].ResetAfter).UnixMicro()}
				}
			}()
		}
		wg.Wait()
	case opUsage:
		var us []ratekit.Usage
		if us, err = l.Usage(ctx, c.Key); err == nil {
			if len(us) != 2 || us[1].Policy.Name != quotaName {
				err = fmt.Errorf("usage %+v, want the burst and the quota", us)
			} else {
				r.Usage = usageLine{us[1].Policy.Quota, us[1].Used, us[1].Remaining}
			}
		}
	case opPeriods:
		r.Periods, err = periods(ctx, l, c.Key, time.UnixMicro(c.FromUS), time.UnixMicro(c.ToUS))
	default:
		err = fmt.Errorf("unknown op %q", c.Op)
	}
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

// worker is the parent's handle on a worker process.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	mu     sync.Mutex
	enc    *json.Encoder
	nextID int
	wait   map[int]chan reply
	done   chan struct{} // closed when the reply reader ends
}

// startWorker starts a worker process for backend b: this test binary,
// re-executed with workerEnv set (TestMain then runs runWorker).
func startWorker(t *testing.T, b backend, env []string) *worker {
	t.Helper()
	w := &worker{wait: map[int]chan reply{}, done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run=^$")
	w.cmd.Env = append(append(os.Environ(), workerEnv+"="+b.name), env...)
	w.cmd.Stderr = &w.stderr
	var err error
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.enc = json.NewEncoder(w.stdin)
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, scanBuffer), maxLine)
		for sc.Scan() {
			var r reply
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				continue
			}
			w.mu.Lock()
			ch := w.wait[r.ID]
			delete(w.wait, r.ID)
			w.mu.Unlock()
			if ch != nil {
				ch <- r
			}
		}
	}()
	t.Cleanup(func() {
		w.stdin.Close()
		exited := make(chan error, 1)
		go func() { exited <- w.cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("worker %d: %v\n%s", w.cmd.Process.Pid, err, w.stderr.String())
			}
		case <-time.After(quitGrace):
			w.cmd.Process.Kill()
			<-exited
			t.Errorf("worker %d did not exit\n%s", w.cmd.Process.Pid, w.stderr.String())
		}
	})
	return w
}

// do sends c and waits for its reply.
func (w *worker) do(c command) (reply, error) {
	ch := make(chan reply, 1)
	w.mu.Lock()
	w.nextID++
	c.ID = w.nextID
	w.wait[c.ID] = ch
	err := w.enc.Encode(c)
	w.mu.Unlock()
	if err != nil {
		return reply{}, err
	}
	select {
	case r := <-ch:
		if r.Err == errNoPeriods.Error() {
			return r, errNoPeriods // across the process boundary
		}
		if r.Err != "" {
			return r, errors.New(r.Err)
		}
		return r, nil
	case <-w.done:
		return reply{}, fmt.Errorf("worker %d ended: %s", w.cmd.Process.Pid, w.stderr.String())
	case <-time.After(opTimeout + 5*time.Second):
		return reply{}, fmt.Errorf("worker %d: no reply in %v", w.cmd.Process.Pid, opTimeout)
	}
}
