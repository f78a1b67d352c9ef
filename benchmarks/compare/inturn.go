package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/ratekit/ratekit/benchmarks/internal/harness"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// reference is a row shown for information, in no ratio.
const reference role = 100

// turnContender is a Redis contender of the in-turn tables: it builds, for
// one scenario and concurrency, a runner with clients of its own, as an
// application would have them (go-redis: PoolSize = MinIdleConns =
// concurrency).
type turnContender struct {
	name  string
	role  role
	build func(s scenario, conc int) (harness.Runner, error)
	// extra marks a variant measured for study, left out of the issue-42
	// table (-table issue42).
	extra bool
}

// turnEnv holds what the in-turn contenders share: the address, the key
// prefix, the Node process and the clients to close.
type turnEnv struct {
	addr   string
	prefix string
	// maxInFlight, when not 0, adds a redisstore contender with that
	// Config.MaxInFlight beside the default one.
	maxInFlight int
	node        *nodeRunner
	closers     []func()
}

// openTurnEnv returns the environment of the in-turn contenders under
// prefix, with rate-limiter-flexible's Node process started when rlfDir is
// not empty; close ends them all.
func openTurnEnv(addr, prefix, rlfDir string, maxInFlight int) (*turnEnv, error) {
	t := &turnEnv{addr: addr, prefix: prefix, maxInFlight: maxInFlight}
	if rlfDir != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		node, err := startNode(rlfDir, "redis", host, port, t.prefix+":rlf:")
		if err != nil {
			return nil, err
		}
		t.node = node
	}
	return t, nil
}

func (t *turnEnv) close() {
	t.closeClients()
	if t.node != nil {
		t.node.close()
		t.node = nil
	}
}

// closeClients closes the clients made so far.
func (t *turnEnv) closeClients() {
	for _, c := range t.closers {
		c()
	}
	t.closers = nil
}

func (t *turnEnv) goRedis(conc int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: t.addr, PoolSize: conc, MinIdleConns: conc})
	t.closers = append(t.closers, func() { c.Close() })
	return c
}

// serverless returns a go-redis client configured as the README says for
// ratekit (redisstore.ServerlessOptions), with the pool of goRedis.
func (t *turnEnv) serverless(conc int) *redis.Client {
	o := redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{t.addr}, PoolSize: conc, MinIdleConns: conc}, time.Second)
	c := redis.NewUniversalClient(o).(*redis.Client)
	t.closers = append(t.closers, func() { c.Close() })
	return c
}

// rueidisFlushDelay, when not 0, adds a rueidisstore contender whose client
// has this ClientOption.MaxFlushDelay (the -rueidis-flush-delay flag).
var rueidisFlushDelay time.Duration

// rueidisMultiplex, when not 0, adds a rueidisstore contender whose client
// has this ClientOption.PipelineMultiplex (-1: one connection, as
// rueidisstore.ServerlessOptions sets when it is 0; 1: two).
var rueidisMultiplex int

// rueidisServerless returns a rueidis client configured as the README says
// for ratekit (rueidisstore.ServerlessOptions), with the options set
// changes first (nil: none).
func (t *turnEnv) rueidisServerless(set func(*rueidis.ClientOption)) (rueidis.Client, error) {
	o := rueidis.ClientOption{InitAddress: []string{t.addr}, DisableCache: true}
	if set != nil {
		set(&o)
	}
	c, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&o, time.Second))
	if err != nil {
		return nil, err
	}
	t.closers = append(t.closers, c.Close)
	return c, nil
}

func (t *turnEnv) rueidis() (rueidis.Client, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{t.addr}, DisableCache: true})
	if err != nil {
		return nil, err
	}
	t.closers = append(t.closers, c.Close)
	return c, nil
}

// opRunner runs op over the scenario's keys, after exhausting the key of a
// primed scenario.
func opRunner(ctx context.Context, s scenario, conc int, op decide) (harness.Runner, error) {
	if s.primed {
		for w := range conc {
			for range 2 {
				if _, err := op(ctx, w, s.keys[0]); err != nil {
					return nil, err
				}
			}
		}
	}
	return harness.OpRunner(func(ctx context.Context, w, i int) (bool, error) {
		return op(ctx, w, s.keys[s.pick(w, i)])
	}), nil
}

// roundTripRunner is opRunner for a contender whose decisions make round
// trips: each decision gets a context with a one-second deadline, as a
// function gives its decisions (the invocation's deadline, or a Guard's
// Timeout). Every such contender gets one, peers and floors as well as
// ratekit's, so that what the deadline costs (a timer set and stopped per
// decision) weighs on all alike; in-process contenders get none.
func roundTripRunner(ctx context.Context, s scenario, conc int, op decide) (harness.Runner, error) {
	return opRunner(ctx, s, conc, func(ctx context.Context, w int, key string) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return op(ctx, w, key)
	})
}

func turnContenders(ctx context.Context, t *turnEnv) []turnContender {
	tb := func(s scenario, conc int, store kvstore.Store) (harness.Runner, error) {
		l, err := tokenbucket.New(tokenbucket.Config{Name: s.short, Burst: s.lim.n, RefillRate: tokenbucket.Rate{Tokens: s.lim.n, Per: s.lim.period},
			Mode: tokenbucket.Atomic, Store: store})
		if err != nil {
			return nil, err
		}
		return roundTripRunner(ctx, s, conc, ratekitDecide(l))
	}
	cs := []turnContender{
		{"ratekit tokenbucket Atomic, redisstore (go-redis)", ours, func(s scenario, conc int) (harness.Runner, error) {
			store, err := redisstore.New(t.serverless(conc), redisstore.Config{Prefix: fmt.Sprintf("%s:rk-%d:", t.prefix, conc)})
			if err != nil {
				return nil, err
			}
			return tb(s, conc, store)
		}, false},
	}
	if t.maxInFlight != 0 {
		cs = append(cs, turnContender{fmt.Sprintf("ratekit tokenbucket Atomic, redisstore (go-redis), MaxInFlight %d", t.maxInFlight), ours, func(s scenario, conc int) (harness.Runner, error) {
			store, err := redisstore.New(t.serverless(conc), redisstore.Config{Prefix: fmt.Sprintf("%s:rm-%d:", t.prefix, conc), MaxInFlight: t.maxInFlight})
			if err != nil {
				return nil, err
			}
			return tb(s, conc, store)
		}, true})
	}
	// onRueidis runs the token bucket on rueidisstore under the key prefix
	// tag, on a client whose options set changes from the README's (nil:
	// none) and, with burst, whose connection a burst has left pipelined.
	onRueidis := func(tag string, set func(*rueidis.ClientOption), burst bool) func(scenario, int) (harness.Runner, error) {
		return func(s scenario, conc int) (harness.Runner, error) {
			c, err := t.rueidisServerless(set)
			if err != nil {
				return nil, err
			}
			store, err := rueidisstore.New(c, rueidisstore.Config{Prefix: fmt.Sprintf("%s:%s-%d:", t.prefix, tag, conc)})
			if err != nil {
				return nil, err
			}
			// rueidis pipelines a connection from the first time it sees
			// two commands at once, and keeps it so: an instance that
			// once served a burst serves its lone callers that way.
			if burst {
				if err := burstOnce(ctx, store); err != nil {
					return nil, err
				}
			}
			return tb(s, conc, store)
		}
	}
	cs = append(cs,
		turnContender{"ratekit tokenbucket Atomic, rueidisstore (rueidis)", ours, onRueidis("rr", nil, false), false},
		turnContender{"ratekit tokenbucket Atomic, rueidisstore after a burst (connection pipelined)", ours, onRueidis("rb", nil, true), true})
	if rueidisMultiplex != 0 {
		cs = append(cs, turnContender{fmt.Sprintf("ratekit tokenbucket Atomic, rueidisstore (rueidis), PipelineMultiplex %d", rueidisMultiplex), ours,
			onRueidis("rx", func(o *rueidis.ClientOption) { o.PipelineMultiplex = rueidisMultiplex }, false), true})
	}
	if rueidisFlushDelay > 0 {
		cs = append(cs, turnContender{fmt.Sprintf("ratekit tokenbucket Atomic, rueidisstore (rueidis), MaxFlushDelay %v", rueidisFlushDelay), ours,
			onRueidis("rf", func(o *rueidis.ClientOption) { o.MaxFlushDelay = rueidisFlushDelay }, false), true})
	}
	cs = append(cs, []turnContender{
		{"go-redis/redis_rate v10", peer, func(s scenario, conc int) (harness.Runner, error) {
			rrl := redis_rate.NewLimiter(t.goRedis(conc))
			l := redis_rate.Limit{Rate: int(s.lim.n), Burst: int(s.lim.n), Period: s.lim.period}
			prefix := fmt.Sprintf("%s:redis_rate-%s-%d:", t.prefix, s.short, conc)
			return roundTripRunner(ctx, s, conc, func(ctx context.Context, _ int, key string) (bool, error) {
				res, err := rrl.Allow(ctx, prefix+key, l)
				if err != nil {
					return false, err
				}
				return res.Allowed > 0, nil
			})
		}, false},
		{"ulule/limiter v3 (Redis store)", peer, func(s scenario, conc int) (harness.Runner, error) {
			store, err := ulredis.NewStoreWithOptions(t.goRedis(conc), ulule.StoreOptions{Prefix: fmt.Sprintf("%s:ulule-%s-%d", t.prefix, s.short, conc), MaxRetry: 3})
			if err != nil {
				return nil, err
			}
			l := ulule.New(store, ulule.Rate{Period: s.lim.period, Limit: s.lim.n})
			return roundTripRunner(ctx, s, conc, func(ctx context.Context, _ int, key string) (bool, error) {
				c, err := l.Get(ctx, key)
				if err != nil {
					return false, err
				}
				return !c.Reached, nil
			})
		}, false},
	}...)
	if t.node != nil {
		cs = append(cs, turnContender{"rate-limiter-flexible 11.4 (Node 20, ioredis: one pipelined connection)", peer, func(s scenario, conc int) (harness.Runner, error) {
			r := t.node.runner(s, conc, "")
			// V8 compiles the hot loop after thousands of calls: on a
			// loaded machine that takes seconds, which the other
			// contenders' warm-up does not need.
			var discard harness.Sample
			return r, r(ctx, conc, 3*time.Second, &discard)
		}, false})
	}
	return append(cs,
		turnContender{"floor: one INCR round trip (go-redis)", floor, func(s scenario, conc int) (harness.Runner, error) {
			c := t.goRedis(conc)
			prefix := fmt.Sprintf("%s:incr-%s-%d:", t.prefix, s.short, conc)
			return roundTripRunner(ctx, s, conc, func(ctx context.Context, _ int, key string) (bool, error) {
				return true, c.Incr(ctx, prefix+key).Err()
			})
		}, false},
		turnContender{"INCR through rueidis (for reference)", reference, func(s scenario, conc int) (harness.Runner, error) {
			c, err := t.rueidis()
			if err != nil {
				return nil, err
			}
			prefix := fmt.Sprintf("%s:rincr-%s-%d:", t.prefix, s.short, conc)
			return roundTripRunner(ctx, s, conc, func(ctx context.Context, _ int, key string) (bool, error) {
				return true, c.Do(ctx, c.B().Incr().Key(prefix+key).Build()).Error()
			})
		}, false},
	)
}

// nodeRunner drives benchmarks/rlf/rlf.js, which measures
// rate-limiter-flexible in its own process and reports counts and a
// latency histogram per slice.
type nodeRunner struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startNode starts rlf.js in dir with args (its store, then the store's
// address and the key prefix: see rlf.js).
func startNode(dir string, args ...string) (*nodeRunner, error) {
	for _, pkg := range []string{"rate-limiter-flexible", "ioredis", "pg"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg)); err != nil {
			return nil, fmt.Errorf("-rlf %s: run npm ci there first: %w", dir, err)
		}
	}
	cmd := exec.Command("node", append([]string{filepath.Join(dir, "rlf.js")}, args...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	return &nodeRunner{cmd: cmd, in: in, out: sc}, nil
}

type nodeReply struct {
	N         int64      `json:"n"`
	Admitted  int64      `json:"admitted"`
	ElapsedNS int64      `json:"elapsed_ns"`
	Buckets   [][2]int64 `json:"buckets"`
	Error     string     `json:"error"`
}

func (n *nodeRunner) call(req map[string]any) (nodeReply, error) {
	b, _ := json.Marshal(req)
	if _, err := n.in.Write(append(b, '\n')); err != nil {
		return nodeReply{}, err
	}
	if !n.out.Scan() {
		return nodeReply{}, fmt.Errorf("rlf.js ended: %v", n.out.Err())
	}
	var r nodeReply
	if err := json.Unmarshal(n.out.Bytes(), &r); err != nil {
		return nodeReply{}, err
	}
	if r.Error != "" {
		return nodeReply{}, errors.New("rlf.js: " + r.Error)
	}
	return r, nil
}

// runner returns the Runner of rate-limiter-flexible for scenario s at
// conc callers; on PostgreSQL, table names its table.
func (n *nodeRunner) runner(s scenario, conc int, table string) harness.Runner {
	return func(_ context.Context, workers int, d time.Duration, sample *harness.Sample) error {
		r, err := n.call(map[string]any{"op": "run", "scenario": s.short, "name": n.name(s, conc), "points": s.lim.n,
			"duration": int64(s.lim.period / time.Second), "keys": len(s.keys), "uniform": s.uniform, "conc": workers, "ms": d.Milliseconds(),
			"prime": s.primed, "table": table})
		if err != nil {
			return err
		}
		for _, b := range r.Buckets {
			if err := sample.AddBucket(int(b[0]), uint64(b[1])); err != nil {
				return err
			}
		}
		sample.AddCounts(r.Admitted, time.Duration(r.ElapsedNS))
		return nil
	}
}

// name returns the name of the limiter of scenario s at conc callers.
func (n *nodeRunner) name(s scenario, conc int) string {
	return fmt.Sprintf("%s-%d", s.short, conc)
}

// release ends the limiter of scenario s at conc callers and its pool.
func (n *nodeRunner) release(s scenario, conc int) error {
	_, err := n.call(map[string]any{"op": "release", "name": n.name(s, conc)})
	return err
}

func (n *nodeRunner) close() {
	n.call(map[string]any{"op": "close"})
	n.in.Close()
	n.cmd.Wait()
}

// runInTurn measures the Redis contenders at each concurrency of concs in
// turn (harness.MeasureInTurn), runs times, and prints one table.
func runInTurn(ctx context.Context, addr, prefix, rlfDir string, maxInFlight int, scenarios []scenario, concs []int, runs int, d, slice time.Duration) error {
	t, err := openTurnEnv(addr, prefix+":turn", rlfDir, maxInFlight)
	if err != nil {
		return err
	}
	defer t.close()
	contenders := turnContenders(ctx, t)
	type cell struct{ s, c, n int }
	results := map[cell][]harness.Result{}
	for si, s := range scenarios {
		for _, conc := range concs {
			runners, err := turnRunners(contenders, s, conc, "in turn")
			if err != nil {
				return err
			}
			// Warm up: connections, scripts loaded, Node's JIT.
			if _, err := harness.MeasureInTurn(ctx, conc, 2*slice, slice, runners); err != nil {
				return fmt.Errorf("in turn, %s, concurrency %d: %v", s.short, conc, err)
			}
			for range runs {
				rs, err := harness.MeasureInTurn(ctx, conc, d, slice, runners)
				if err != nil {
					return fmt.Errorf("in turn, %s, concurrency %d: %v", s.short, conc, err)
				}
				for ci := range contenders {
					id := cell{si, ci, conc}
					results[id] = append(results[id], rs[ci])
				}
			}
			fmt.Fprintf(os.Stderr, "in turn: %s at %d done\n", s.short, conc)
		}
	}
	fmt.Printf("### Redis in turn: each contender with clients of its own, in slices of %v one after the other\n\n", slice)
	fmt.Println("Go contenders have one go-redis client each (PoolSize = MinIdleConns = concurrency) or one rueidis client;")
	fmt.Println("decisions/s is decisions over the contender's own slices. × floor: over the go-redis INCR; × best peer: over")
	fmt.Println("the fastest of redis_rate, ulule and rate-limiter-flexible (when measured) in the same cell.")
	fmt.Println()
	fmt.Println("| scenario | concurrency | contender | decisions/s | p50 | p99 | × floor | × best peer | admitted |")
	fmt.Println("|---|---:|---|---:|---:|---:|---:|---:|---:|")
	for si, s := range scenarios {
		for _, conc := range concs {
			floorTP, bestPeer := turnReferences(contenders, func(ci int) harness.Result { return harness.Median(results[cell{si, ci, conc}]) })
			for ci, c := range contenders {
				m := harness.Median(results[cell{si, ci, conc}])
				fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", s.short, conc, c.name, count(m.Throughput),
					harness.Latency(m.P50), harness.Latency(m.P99), ratio(m.Throughput, floorTP), ratio(m.Throughput, bestPeer), percent(m.Admitted))
			}
		}
	}
	fmt.Println()
	return nil
}

// burstOnce sends 16 concurrent peeks through store, so that its
// connection has seen commands at once.
func burstOnce(ctx context.Context, store kvstore.Atomic) error {
	errs := make(chan error, 16)
	for range 16 {
		go func() {
			_, err := store.Update(ctx, "burst", kvstore.Refill{Burst: 1, Rate: 1}, kvstore.OpPeek, 1)
			errs <- err
		}()
	}
	var first error
	for range 16 {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// turnReferences returns the throughput of the floor and of the fastest peer
// among contenders, median(ci) being contender ci's median in the cell.
func turnReferences(contenders []turnContender, median func(ci int) harness.Result) (floorTP, bestPeer float64) {
	return pickReferences(len(contenders), func(ci int) (role, bool) { return contenders[ci].role, true },
		func(ci int) float64 { return median(ci).Throughput })
}

// turnRunners builds every contender's runner for scenario s at conc
// callers; table names the table in errors.
func turnRunners(contenders []turnContender, s scenario, conc int, table string) ([]harness.Runner, error) {
	runners := make([]harness.Runner, len(contenders))
	for ci, c := range contenders {
		r, err := c.build(s, conc)
		if err != nil {
			return nil, fmt.Errorf("%s, %s, %s, concurrency %d: %v", table, s.short, c.name, conc, err)
		}
		runners[ci] = r
	}
	return runners, nil
}
