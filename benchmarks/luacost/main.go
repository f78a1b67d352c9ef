// Command luacost measures how much of Redis's own time ratekit's update
// scripts take per decision, beside the two script shapes of counter-based
// peers (a fixed window counted with INCRBY and read back with PTTL, and the
// same with a SET … NX that creates the key first) and beside bare commands.
//
// A script's cost per call is hard to read from INFO commandstats under a
// benchmark client: on a shared machine the client's preemption of Redis
// moves the figure by half from one pass to the next. So luacost wraps each
// script body in a Lua function and calls it n times within one EVALSHA; the
// command's usec in INFO commandstats, divided by n, is the body's cost with
// warm caches and no network. What it leaves out, the same for every script,
// is the fixed cost of one EVALSHA (parsing, argument strings, the reply),
// which it reports as the cost of an empty script called by itself.
//
// Usage:
//
//	cd benchmarks && go run ./luacost [-n 10000] [-passes 5] [-candidate file.lua] [-roundtrips 30000] [-refusals 200000 [-callers 8,64]]
//
// -candidate measures a script of the same arguments as the update script
// (a change under study) beside it, in the same passes.
//
// -roundtrips n times whole round trips instead, from Redis's own C client
// (redis-benchmark, which must be on PATH) on one connection: n requests per
// run of INCR, of an empty script, of a counter script (INCRBY, then PTTL:
// ulule's shape) and of the update script taking one token of a bucket of
// 10^9 a minute, on one hot key and on 10,000 keys drawn at random, the
// commands in turn within each pass. It shows what a script costs a lone
// caller beside a bare command, with no Go client in the way.
//
// -refusals n compares, on one refused key and one pipelined rueidis
// connection, Redis's whole CPU time per decision (INFO cpu, system calls
// and parsing included) of the update script's read-first take against the
// MULTI/EXEC of PTTL and GET with which the stores decide a refusal after a
// refusal: n decisions per pass and way, at each number of -callers.
//
// The server comes from RATEKIT_REDIS_ADDR (default 127.0.0.1:6379). The
// program resets the server's command statistics (CONFIG RESETSTAT), uses
// keys under ratekit-luacost: (two, or with -roundtrips up to 30,000) and
// deletes them at the end. Figures are the median of the passes, in
// nanoseconds per call (with -roundtrips, requests per second).
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/benchmarks/internal/harness"
	"github.com/ratekit/ratekit/internal/redistest"
)

// A body is a script measured in a loop: its source, the key's content
// before each pass (empty: no key, deleted again before each call), its
// arguments and, when not empty, a statement run before each call.
type body struct {
	name   string
	src    string
	keys   int
	init   string
	args   []any
	before string
}

func main() {
	n := flag.Int("n", 10000, "calls of the script body within one EVALSHA")
	passes := flag.Int("passes", 5, "passes per body; the table shows medians")
	candidate := flag.String("candidate", "", "file of a candidate for the update script, measured beside it with the same arguments")
	trips := flag.Int("roundtrips", 0, "when not 0, time round trips from redis-benchmark at one connection instead, this many requests per run")
	refused := flag.Int("refusals", 0, "when not 0, compare Redis's CPU per refusal of the script and of a MULTI/EXEC instead, this many decisions per pass")
	callersFlag := flag.String("callers", "8,64", "with -refusals, comma-separated numbers of concurrent callers")
	flag.Parse()
	addr := os.Getenv("RATEKIT_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		log.Fatalf("redis at %s (RATEKIT_REDIS_ADDR): %v", addr, err)
	}
	const prefix = "ratekit-luacost:"
	if *refused > 0 {
		callers, err := harness.ParseCounts(*callersFlag)
		if err != nil {
			log.Fatalf("-callers: %v", err)
		}
		if err := refusals(ctx, addr, prefix, *refused, *passes, callers); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *trips > 0 {
		if err := roundTrips(ctx, c, addr, prefix, *trips, *passes); err != nil {
			log.Fatal(err)
		}
		return
	}
	defer c.Del(ctx, key(prefix, 0), key(prefix, 1))
	// A live bucket: the key expires in an hour and its value is 0, a debt
	// of 3.6e9 units at 1,000 units per millisecond (one per microsecond),
	// far below a maximum of 10^15, so every take of 10^6 is admitted. The
	// denied bucket has the same record under a maximum of 10^9. A full
	// bucket's value is above its expiry's 3.6e9 units: it owes nothing, and
	// a SET before each call keeps it so.
	const live, full = "0", "9000000000000"
	refill := "redis.call('SET', KEYS[1], '" + full + "', 'KEEPTTL')"
	const max, rate, small = "1000000000000000", "1000", "1000000000"
	pxat := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	bodies := []body{
		{"ratekit Update, take on a live record (T: decrement first)", updateLua, 1, live, []any{max, rate, "1000000", "T"}, ""},
		{"ratekit Update, take on a live record (t: read first)", updateLua, 1, live, []any{max, rate, "1000000", "t"}, ""},
		{"ratekit Update, take on a bucket that refilled to full, with a SET … KEEPTTL before each call", updateLua, 1, full, []any{max, rate, "1000000", "T"}, refill},
		{"SET … KEEPTTL alone", refill, 1, full, nil, ""},
		{"ratekit Update, take on a new key (a DEL before each call)", updateLua, 1, "", []any{max, rate, "1000000", "T"}, ""},
		{"ratekit Update, denied (t: read first, as after a refusal)", updateLua, 1, live, []any{small, rate, "1000000", "t"}, ""},
		{"ratekit Update, denied (T: decrement first, then undone)", updateLua, 1, live, []any{small, rate, "1000000", "T"}, ""},
		{"ratekit Update, peek", updateLua, 1, live, []any{max, rate, "1", "p"}, ""},
		{"ratekit Multi, take on two live records (T: decrement first)", multiLua, 2, live, []any{"T", max, rate, "1000000", max, rate, "1000000"}, ""},
		{"ratekit Multi, take on two live records (t: read first)", multiLua, 2, live, []any{"t", max, rate, "1000000", max, rate, "1000000"}, ""},
		{"ratekit Multi, denied (t: read first, as after a refusal)", multiLua, 2, live, []any{"t", max, rate, "1000000", small, rate, "1000000"}, ""},
		{"ratekit Multi, denied (T: decrement first, then undone)", multiLua, 2, live, []any{"T", max, rate, "1000000", small, rate, "1000000"}, ""},
		{"counter: INCRBY, then PTTL", "local v = redis.call('INCRBY', KEYS[1], ARGV[1])\nreturn {v, redis.call('PTTL', KEYS[1])}", 1, "1", []any{"1"}, ""},
		{"counter: SET NX (the key exists), INCRBY, PTTL", "redis.call('SET', KEYS[1], 0, 'EX', ARGV[2], 'NX')\nlocal v = redis.call('INCRBY', KEYS[1], ARGV[1])\nreturn {v, redis.call('PTTL', KEYS[1])}", 1, "1", []any{"1", "3600"}, ""},
		{"SET alone (no expiry)", "return redis.call('SET', KEYS[1], ARGV[1])", 1, "1", []any{"x"}, ""},
		{"TIME alone", "return redis.call('TIME')", 0, "", nil, ""},
		{"PTTL alone", "return redis.call('PTTL', KEYS[1])", 1, live, nil, ""},
		{"PEXPIRETIME alone", "return redis.call('PEXPIRETIME', KEYS[1])", 1, live, nil, ""},
		{"GET alone", "return redis.call('GET', KEYS[1])", 1, live, nil, ""},
		{"SET … PX alone", "return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])", 1, live, []any{"12", "60000"}, ""},
		{"SET … PXAT alone", "return redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])", 1, live, []any{"12", pxat}, ""},
	}
	if *candidate != "" {
		src, err := os.ReadFile(*candidate)
		if err != nil {
			log.Fatal(err)
		}
		for _, b := range bodies {
			if b.src != updateLua {
				continue
			}
			b.name = strings.Replace(b.name, "ratekit Update", "candidate", 1)
			b.src = string(src)
			bodies = append(bodies, b)
		}
	}
	fmt.Printf("Redis %s, %d calls per EVALSHA, median of %d passes\n\n", addr, *n, *passes)
	// The passes go round every body in turn, so that a slower phase of a
	// shared machine falls on all of them.
	got := make([][]int64, len(bodies))
	for range *passes {
		for i, b := range bodies {
			ns, err := measure(ctx, c, prefix, b, *n)
			if err != nil {
				log.Fatalf("%s: %v", b.name, err)
			}
			got[i] = append(got[i], ns)
		}
	}
	fmt.Println("| script body | ns per call |")
	fmt.Println("|---|---:|")
	for i, b := range bodies {
		fmt.Printf("| %s | %d |\n", b.name, median(got[i]))
	}
	ns, err := single(ctx, c, *passes)
	if err != nil {
		log.Fatalf("empty script: %v", err)
	}
	fmt.Printf("\nOne EVALSHA of an empty script, called by itself: %d ns\n", ns)
}

// key returns the i-th key of a body (at most two): one hash slot for all.
func key(prefix string, i int) string { return prefix + "{k}" + strconv.Itoa(i) }

// measure returns b's cost per call in ns, over n calls in one EVALSHA.
func measure(ctx context.Context, c *redis.Client, prefix string, b body, n int) (int64, error) {
	keys := make([]string, b.keys)
	for i := range keys {
		keys[i] = key(prefix, i)
	}
	// Before each call: the body's own statement, and a DEL of its keys
	// for a body that must find no key.
	prep := b.before + " "
	if b.init == "" {
		for i := range keys {
			prep += "redis.call('DEL', KEYS[" + strconv.Itoa(i+1) + "]) "
		}
	}
	src := "local function body()\n" + b.src + "\nend\nfor _ = 1, " + strconv.Itoa(n) + " do " + prep + "body() end\nreturn 1"
	sha, err := c.ScriptLoad(ctx, src).Result()
	if err != nil {
		return 0, err
	}
	for _, k := range keys {
		if b.init == "" {
			c.Del(ctx, k)
		} else {
			c.Set(ctx, k, b.init, time.Hour)
		}
	}
	usec, err := timed(ctx, c, func() error { return c.EvalSha(ctx, sha, keys, b.args...).Err() })
	if err != nil {
		return 0, err
	}
	return usec * 1000 / int64(n), nil
}

// single returns the median cost of one EVALSHA of an empty script, in ns,
// averaged over 10,000 calls per pass.
func single(ctx context.Context, c *redis.Client, passes int) (int64, error) {
	sha, err := c.ScriptLoad(ctx, "return 1").Result()
	if err != nil {
		return 0, err
	}
	const calls = 10000
	var got []int64
	for range passes {
		usec, err := timed(ctx, c, func() error {
			for range calls {
				if err := c.EvalSha(ctx, sha, nil).Err(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		got = append(got, usec*1000/calls)
	}
	return median(got), nil
}

// timed resets the server's command statistics, runs f and returns the
// microseconds INFO commandstats counts for EVALSHA.
func timed(ctx context.Context, c *redis.Client, f func() error) (int64, error) {
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[len("cmdstat_evalsha:"):]), ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no cmdstat_evalsha in INFO commandstats")
}

// roundTrips prints the requests per second redis-benchmark reaches on one
// connection for bare commands and scripts, medians of passes runs of n
// requests each, the commands in turn within each pass.
func roundTrips(ctx context.Context, c *redis.Client, addr, prefix string, n, passes int) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	load := func(src string) (string, error) { return c.ScriptLoad(ctx, src).Result() }
	empty, err := load("return 1")
	if err != nil {
		return err
	}
	counter, err := load("local v = redis.call('INCRBY', KEYS[1], ARGV[1])\nif v == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\nreturn {v, redis.call('PTTL', KEYS[1])}")
	if err != nil {
		return err
	}
	update, err := load(updateLua)
	if err != nil {
		return err
	}
	defer deleteKeys(ctx, c, prefix)
	type trip struct {
		name  string
		args  []string
		floor bool // the bare INCR the trips after it are compared with
	}
	// The bucket is tokenbucket's for a burst of 10^9 and 10^9 a minute: 3
	// units a token, 50 units a microsecond (50,000 a millisecond), so a take
	// is 3. Each key of the 10,000 is back to full at each visit, as in
	// compare.
	var trips []trip
	for _, sc := range []struct{ name, key string }{{"hot key", "hot"}, {"10,000 keys", "__rand_int__"}} {
		k := prefix + "{" + sc.key + "}"
		trips = append(trips,
			trip{sc.name + ": INCR", []string{"INCR", k + ":incr"}, true},
			trip{sc.name + ": empty script", []string{"EVALSHA", empty, "0"}, false},
			trip{sc.name + ": counter script (INCRBY, then PTTL)", []string{"EVALSHA", counter, "1", k + ":counter", "1", "60000"}, false},
			trip{sc.name + ": ratekit Update, take", []string{"EVALSHA", update, "1", k + ":bucket", "3000000000", "50000", "3", "T"}, false},
		)
	}
	got := make([][]float64, len(trips))
	for range passes {
		for i, t := range trips {
			args := append([]string{"-h", host, "-p", port, "-c", "1", "-n", strconv.Itoa(n), "-r", "10000", "-q"}, t.args...)
			out, err := exec.CommandContext(ctx, "redis-benchmark", args...).Output()
			if err != nil {
				return fmt.Errorf("redis-benchmark %s: %v", t.name, err)
			}
			rps, err := lastRate(string(out))
			if err != nil {
				return fmt.Errorf("redis-benchmark %s: %v", t.name, err)
			}
			got[i] = append(got[i], rps)
		}
	}
	fmt.Printf("Redis %s, redis-benchmark on one connection, %d requests per run, median of %d passes\n\n", addr, n, passes)
	fmt.Println("| round trip | requests/s | × INCR |")
	fmt.Println("|---|---:|---:|")
	var incr float64
	for i, t := range trips {
		m := median(got[i])
		if t.floor {
			incr = m
		}
		fmt.Printf("| %s | %.0f | %.2f× |\n", t.name, m, m/incr)
	}
	return nil
}

// deleteKeys deletes the keys under prefix, as many as the round trips made.
func deleteKeys(ctx context.Context, c *redis.Client, prefix string) {
	var keys []string
	for cur := uint64(0); ; {
		ks, next, err := c.Scan(ctx, cur, prefix+"*", 20000).Result()
		if err != nil {
			log.Printf("deleting the keys under %s: %v", prefix, err)
			return
		}
		keys = append(keys, ks...)
		if cur = next; cur == 0 {
			break
		}
	}
	for len(keys) > 0 {
		m := min(len(keys), 1000)
		c.Unlink(ctx, keys[:m]...)
		keys = keys[m:]
	}
}

// lastRate returns the requests per second of redis-benchmark -q's output,
// whose last line is "<command>: <n> requests per second, …".
func lastRate(out string) (float64, error) {
	out = strings.TrimSpace(out)
	if i := strings.LastIndexAny(out, "\r\n"); i >= 0 {
		out = out[i+1:]
	}
	_, rest, ok := strings.Cut(out, ": ")
	if !ok {
		return 0, fmt.Errorf("unexpected output %q", out)
	}
	f, _, _ := strings.Cut(rest, " ")
	return strconv.ParseFloat(f, 64)
}

func median[T cmp.Ordered](v []T) T {
	slices.Sort(v)
	return v[len(v)/2]
}

// updateLua and multiLua are the text of ratekit's update and multi-key
// scripts, as its Redis engine sends them.
var updateLua, multiLua = redistest.Scripts()
