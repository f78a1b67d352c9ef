// Package redisstore is a [kvstore.Store] and [kvstore.Atomic] on Redis,
// through go-redis v9's [redis.UniversalClient]: a single server, Sentinel and
// Redis Cluster all work.
//
// Every key is written as Prefix + "{" + key + "}": the braces are a Redis
// Cluster hash tag, so everything one decision touches lives in one slot and a
// script never fails with CROSSSLOT.
//
// [Store.Update] is one round trip: a short Lua script run with EVALSHA. A
// bucket is kept as GCRA on the key itself: the key's expiry bounds the
// instant the bucket is full again and its value keeps the debt exact to
// the unit, so the script reads Redis's clock through the key's PTTL,
// parses no record, and admits with one DECRBY while the expiry covers the
// take (docs/redis.md, "The record"). A take decrements first, except for
// a key whose last take through the Store was refused: that one, like a
// peek, is decided by PTTL and GET in one MULTI/EXEC, without the script,
// and the script runs only when the take now fits. A flood of refused
// takes therefore costs Redis two reads a decision and writes nothing. The
// order changes what a decision costs Redis, never the decision: both read
// the same two numbers in one atomic step. The refill arrives in whole
// milliseconds of Redis's clock (see [Store.ClockStep]), and no client
// clock enters the math. When the server answers NOSCRIPT, the update is
// sent again with EVAL, which also loads the script, so a flushed script
// cache or a failover to a fresh replica recovers on its own.
//
// [Store.UpdateMulti] updates several keys in one script, all or nothing.
// On a Redis Cluster the keys of one call must share a hash slot: the call
// names a group, and every key of the group goes to the group's slot; keys
// of different slots without a group are refused before anything is sent.
//
// Coalescing: the Store keeps at most [Config.MaxInFlight] round trips in
// flight (DefaultMaxInFlight, 8). Below that a command goes at once on its
// caller's goroutine; beyond it, commands wait and go together in one
// pipeline when a round trip ends, so that under heavy concurrency Redis and
// the client pay one write and one read for many decisions instead of one
// each. Every command still runs alone and atomically in Redis, and every
// caller still returns at its own deadline. The idea is group commit in
// databases and auto-pipelining in Redis clients (rueidis), applied to the
// Store's own commands. Below the bound each decision is a round trip on a
// connection of its own; kvstore/rueidisstore, the same store on rueidis
// (a module of its own), pipelines as soon as two decisions are in flight
// at once (benchmarks/README.md compares the two).
//
// It needs Redis 7.0 or later (PEXPIRETIME), or a compatible server (Valkey,
// KeyDB), and uses only the Lua string library. Update's records are its
// own: [Store.Get] reads only what [Store.Set] wrote (a limiter's Eventual
// mode), and reports an Update's record as kvstore.ErrMalformedRecord.
//
// Timeouts: go-redis's defaults block for seconds when Redis is slow, whatever
// the context says. Build the client with [ServerlessOptions] (or set the
// same fields yourself) so that a slow or dead Redis returns an error within
// the caller's context deadline.
//
// # Replication and failover
//
// [Store.Update] is exact on one master: every update of a key runs in one
// script, one after the other. Redis replicates asynchronously and the Store
// does not wait for replicas (no WAIT): an update is final when the master
// has run it, before any replica has it. When Sentinel or Redis Cluster
// promotes a replica, two things can happen to a key in use at the switch:
//
//   - the new master holds the key as of the last update it received;
//     updates the old master acknowledged after that (the replication lag,
//     on a crash) are lost, and their units are available again;
//   - an old master cut off from Sentinel but not from every client keeps
//     applying updates until it is demoted, and those are discarded when
//     it resynchronises from the new master.
//
// Each master's history of a key is exact on its own: over any interval of
// length T it takes at most Burst + Rate × T units (the [kvstore.Refill]'s
// fields, Rate in units per microsecond and T in microseconds). The new
// master's history continues a prefix of the old one's, and that shared
// prefix is counted once. So over an interval that contains one failover a
// key takes at most 2 × (Burst + Rate × T) units, twice what one store takes,
// less the units of the shared prefix; with n failovers in the interval, at
// most (n+1) × (Burst + Rate × T). Keys not updated between the last
// replicated update and the switch stay exact. The new master's clock takes
// over too (a replica holds each key's expiry as an absolute time): one that runs s ahead of the old master's refills
// s × Rate early, which adds to the bound; one behind refills nothing until
// it catches up.
//
// While the master is unreachable, updates fail (an error; what follows is
// the caller's choice) until the client reaches the new master. With
// go-redis's failover client that is Sentinel's down-after-milliseconds,
// the promotion and Sentinel's one-second polling: at most
// 2 × down-after-milliseconds + failover-timeout + 2s, plus two commands'
// deadlines (tested on a live Sentinel). On Redis
// Cluster, cluster-node-timeout plays the part of down-after-milliseconds.
// An update whose caller gave up may still be applied by the old master: it
// takes units and admits nothing.
//
// Narrowing the window is the server's job: min-replicas-to-write 1 with
// min-replicas-max-lag N makes an isolated master refuse writes after N
// seconds, so decisions fail instead of being counted on both sides for
// longer; only WAIT (one more round trip per decision, and no help against a
// partition) would close the replication-lag window, and the Store does not
// use it.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/redisscript"
	"github.com/ratekit/ratekit/kvstore"
)

// DefaultPrefix is the key prefix used when [Config.Prefix] is empty.
const DefaultPrefix = "ratekit:"

// Config configures a [Store]. The zero Config is valid.
type Config struct {
	// Prefix is prepended to every key, so that ratekit's keys can share a
	// database with others. Empty means DefaultPrefix. It must not contain
	// '{' or '}', which would change the keys' hash slot.
	Prefix string

	// MaxInFlight bounds the round trips the Store has in flight at once.
	// A command that finds fewer in flight is sent at once on its caller's
	// goroutine, so a lone decision waits for nothing. Commands that find
	// MaxInFlight in flight wait, and when a round trip ends they go to
	// Redis together as one pipeline (coalescing): one write and one read
	// for all of them on each side, which under concurrency is most of what
	// a decision costs Redis and the client. Each command still runs on
	// its own and atomically in Redis, and each caller still stops waiting
	// at its own context's deadline.
	//
	// Zero means DefaultMaxInFlight; a negative value turns coalescing
	// off, so that every command is a round trip of its own on a pooled
	// connection (the client's PoolSize then bounds the round trips).
	// Round trips use the client's pool, so a PoolSize below MaxInFlight
	// makes commands wait for a connection rather than coalesce.
	MaxInFlight int
}

// Store is a Redis-backed store. It is safe for concurrent use; it holds no
// connection of its own and never closes the client. While commands are
// queued behind [Config.MaxInFlight] round trips, one goroutine per round
// trip sends them; it ends when the queue is empty.
type Store struct {
	client redis.UniversalClient
	prefix string
	co     coalescer
	args   atomic.Pointer[refillArgs]
	lastN  atomic.Pointer[boxedN]

	// refusals picks the order of each take's reads (see
	// redisscript.Refusals).
	refusals redisscript.Refusals

	multiArgs atomic.Pointer[multiArgs]
}

// boxedN caches the last n argument boxed, since a limiter usually sends
// the same cost over and over.
type boxedN struct {
	n   int64
	arg any
}

// refillArgs caches a Refill's script arguments, boxed once, so that the
// hot path formats and allocates nothing for them.
type refillArgs struct {
	r         kvstore.Refill
	max, rate any
}

var (
	_ kvstore.Store  = (*Store)(nil)
	_ kvstore.Atomic = (*Store)(nil)
)

// New returns a Store that uses client. It returns an error matching
// ratekit.ErrInvalidConfig for a nil client or a prefix with braces.
func New(client redis.UniversalClient, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("redisstore: %w: nil client", ratekit.ErrInvalidConfig)
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: %w: prefix %q contains a brace", ratekit.ErrInvalidConfig, cfg.Prefix)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	switch {
	case cfg.MaxInFlight == 0:
		cfg.MaxInFlight = DefaultMaxInFlight
	case cfg.MaxInFlight < 0:
		cfg.MaxInFlight = 0
	}
	return &Store{client: client, prefix: cfg.Prefix, co: coalescer{client: client, max: cfg.MaxInFlight}}, nil
}

// ServerlessOptions sets o's timeouts and connection handling for a
// function that must answer within its own deadline, and returns o:
//
//   - ContextTimeoutEnabled: true, so the context's deadline bounds every
//     command (go-redis ignores it otherwise);
//   - DialTimeout, ReadTimeout, WriteTimeout and PoolTimeout: timeout;
//   - MaxRetries: -1 (no retries: a retry would spend the caller's budget
//     on a server that just failed) and DialerRetries: 1 (one dial attempt);
//   - ConnMaxIdleTime: [ServerlessMaxIdle], below the idle limits after
//     which NAT gateways and load balancers drop a flow without a word
//     (AWS NAT gateway 350 s, Azure load balancer 4 min), so that a pooled
//     connection idle that long, as on an instance thawing after a freeze,
//     is closed when taken from the pool instead of being used;
//   - Dialer: o.Dialer (or, when nil, a TCP dial with keepalive probes every
//     30 s of idleness and, on Linux, TCP_USER_TIMEOUT of 15 s; in TLS when
//     o.TLSConfig is set), with every connection watched for silence: when
//     a command on a connection idle for a second or more gets no reply
//     before its deadline, the connections that have received nothing
//     since are in doubt (they sat through the same outage) and the pool
//     replaces them instead of using them. A [Store] sends a command again
//     only when it was refused on such a connection before any byte was
//     sent, so no command is applied twice.
//
// After a thaw in which every pooled connection went silent within
// ConnMaxIdleTime, at most one command fails (at its deadline: nothing can
// tell a silent connection from a slow server sooner) and the next ones go
// on new connections. Keepalive and TCP_USER_TIMEOUT act only while the
// process runs; they keep a busy instance's flows alive and close the ones
// that died under it.
//
// timeout is the longest one command may take when the context allows more;
// 0 means 250ms. Set o.Dialer and o.TLSConfig, if at all, before calling
// ServerlessOptions, and call it once per options value. Use it as
//
//	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{
//		Addrs: []string{addr},
//	}, 0))
func ServerlessOptions(o *redis.UniversalOptions, timeout time.Duration) *redis.UniversalOptions {
	if timeout <= 0 {
		timeout = 250 * time.Millisecond
	}
	o.ContextTimeoutEnabled = true
	o.DialTimeout = timeout
	o.ReadTimeout = timeout
	o.WriteTimeout = timeout
	o.PoolTimeout = timeout
	o.MaxRetries = -1
	o.DialerRetries = 1
	o.ConnMaxIdleTime = ServerlessMaxIdle
	o.Dialer = watchedDialer(o.Dialer, o.TLSConfig, timeout)
	return o
}

// ServerlessMaxIdle is the ConnMaxIdleTime that [ServerlessOptions] sets:
// one minute.
const ServerlessMaxIdle = time.Minute

// do sends cmd through the coalescer, and sends it again while it was
// refused on a connection in doubt before anything was sent (errNotSent),
// at most maxNotSent times.
func (s *Store) do(ctx context.Context, cmd redis.Cmder) error {
	for range maxNotSent {
		err := s.co.do(ctx, cmd)
		if !errors.Is(err, errNotSent) || ctx.Err() != nil {
			return err
		}
		cmd.SetErr(nil)
	}
	return s.co.do(ctx, cmd)
}

// maxNotSent bounds the sends of one command refused on connections in
// doubt; each refusal removes one such connection from the pool.
const maxNotSent = 64

// ClockStep implements [kvstore.ClockStepper]: the update scripts read
// Redis's clock in whole milliseconds, so refill arrives in millisecond
// steps.
func (s *Store) ClockStep() time.Duration { return time.Millisecond }

// Key returns the Redis key under which s stores key.
func (s *Store) Key(key string) string {
	return s.prefix + "{" + key + "}"
}

// Get implements [kvstore.Store] with GET. It returns
// kvstore.ErrMalformedRecord when the key holds something this package did
// not write.
func (s *Store) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	cmd := redis.NewStringCmd(ctx, "get", s.Key(key))
	err := s.do(ctx, cmd)
	if errors.Is(err, redis.Nil) {
		return kvstore.Record{}, false, nil
	}
	if err != nil {
		return kvstore.Record{}, false, wrap(ctx, "GET", err)
	}
	rec, ok := parseRecord(cmd.Val())
	if !ok {
		return kvstore.Record{}, false, kvstore.ErrMalformedRecord
	}
	return rec, true, nil
}

// Set implements [kvstore.Store] with SET … PX.
func (s *Store) Set(ctx context.Context, key string, rec kvstore.Record, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: got %v", kvstore.ErrInvalidTTL, ttl)
	}
	ttl = max(ttl, time.Millisecond)
	cmd := redis.NewStatusCmd(ctx, "set", s.Key(key), formatRecord(rec), "px", ttl.Milliseconds())
	if err := s.do(ctx, cmd); err != nil {
		return wrap(ctx, "SET", err)
	}
	return nil
}

// Delete implements [kvstore.Store] with DEL.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.do(ctx, redis.NewIntCmd(ctx, "del", s.Key(key))); err != nil {
		return wrap(ctx, "DEL", err)
	}
	return nil
}

// Update implements [kvstore.Atomic] with one EVALSHA of a Lua script that
// follows [kvstore.Refill.Apply] on Redis's clock in whole milliseconds,
// keeping the bucket in the key's expiry and value. A peek, and a take of a
// key whose last take was refused, read the key first in a MULTI/EXEC of
// PTTL and GET, on a round trip of its own when one of the MaxInFlight is
// free, and the script runs only for a take that now fits (or when no
// round trip is free, or for a value only the script can judge). It returns
// kvstore.ErrInvalidRefill and kvstore.ErrInvalidOp before contacting Redis,
// and kvstore.ErrMalformedRecord when the key holds something this package
// did not write.
func (s *Store) Update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	a := s.args.Load()
	if a == nil || a.r != r {
		if err := r.Validate(); err != nil {
			return kvstore.OpResult{}, err
		}
		a = &refillArgs{r: r, max: strconv.FormatInt(r.Burst, 10), rate: strconv.FormatInt(redisscript.RateArg(r), 10)}
		s.args.Store(a)
	}
	if err := r.CheckOp(op, n); err != nil {
		return kvstore.OpResult{}, err
	}
	opArg, hash := s.refusals.OpArg(op, key)
	if opArg == "t" || opArg == "p" {
		// A peek, or a take of a key whose last take was refused: two
		// reads decide it, unless the take now fits.
		var (
			u     = [1]kvstore.Update{{Refill: r, N: n}}
			level [1]int64
			res   [1]kvstore.OpResult
		)
		ok, err := s.levels(ctx, []string{s.Key(key)}, u[:], level[:])
		if err != nil {
			return kvstore.OpResult{}, err
		}
		if ok && redisscript.Decided(op, level[:], u[:], res[:]) {
			return res[0], nil
		}
	}
	bn := s.lastN.Load()
	if bn == nil || bn.n != n {
		bn = &boxedN{n: n, arg: n}
		s.lastN.Store(bn)
	}
	// One command built here rather than through redis.Script.Run, which
	// copies the keys and arguments into new slices: 3 allocations fewer
	// per decision. A server that lost the script (a flushed cache, a
	// failover) answers NOSCRIPT, and the update is sent again with EVAL.
	args := []any{"evalsha", updateSHA(), 1, s.Key(key), a.max, a.rate, bn.arg, boxedOp(opArg)}
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	err := s.do(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", updateSource
		cmd = redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		err = s.do(ctx, cmd)
	}
	if err != nil {
		if strings.Contains(err.Error(), malformedMsg) {
			return kvstore.OpResult{}, kvstore.ErrMalformedRecord
		}
		return kvstore.OpResult{}, wrap(ctx, "EVALSHA", err)
	}
	v, err := cmd.Int64()
	if err != nil {
		return kvstore.OpResult{}, wrap(ctx, "EVALSHA", err)
	}
	s.refusals.Took(opArg, hash, v >= 0)
	if v < 0 {
		return kvstore.OpResult{OK: false, Remaining: -v - 1}, nil
	}
	return kvstore.OpResult{OK: true, Remaining: v}, nil
}

// levels reads the buckets of updates under keys (their Redis keys) in one
// MULTI/EXEC of a PTTL and a GET each, when a round trip of its own is free
// (see coalescer.direct), and writes each one's level, as
// redisscript.Level reads it, into levels. It reports false, leaving the
// decision to the update script (which joins the next pipeline), when no
// round trip is free, when a key holds something Level leaves to the
// script, or when the server refused a command (a key of another type). A
// transaction refused on a connection in doubt before anything was sent
// goes again, as do's commands do.
func (s *Store) levels(ctx context.Context, keys []string, updates []kvstore.Update, levels []int64) (bool, error) {
	cmds := make([]redis.Cmder, 0, 2*len(keys))
	for _, k := range keys {
		cmds = append(cmds, redis.NewIntCmd(ctx, "pttl", k), redis.NewStringCmd(ctx, "get", k))
	}
	var err error
	send := func() {
		_, err = s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range cmds {
				p.Process(ctx, cmd)
			}
			return nil
		})
	}
	for i := 0; ; i++ {
		if !s.co.direct(send) {
			return false, nil
		}
		if !errors.Is(err, errNotSent) || ctx.Err() != nil || i == maxNotSent {
			break
		}
		for _, cmd := range cmds {
			cmd.SetErr(nil)
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		if _, refused := errors.AsType[redis.Error](err); refused {
			return false, nil
		}
		return false, wrap(ctx, "EXEC", err)
	}
	for i := range keys {
		r := updates[i].Refill
		ttl, w := cmds[2*i].(*redis.IntCmd).Val(), cmds[2*i+1].(*redis.StringCmd).Val()
		var ok bool
		if levels[i], ok = redisscript.Level(r.Burst, redisscript.RateArg(r), ttl, w); !ok {
			return false, nil
		}
	}
	return true, nil
}

// boxedOp returns the update script's op argument op as an interface value
// that boxes nothing: each case converts a constant.
func boxedOp(op string) any {
	switch op {
	case "T":
		return "T"
	case "t":
		return "t"
	case "p":
		return "p"
	}
	return "r"
}

// updateSource is the update script (redisscript.Update) and malformedMsg
// the error it returns for a record this package did not write.
const (
	updateSource = redisscript.Update
	malformedMsg = redisscript.Malformed
)

var (
	updateSHAOnce sync.Once
	updateSHAHex  string
)

// updateSHA returns the SHA-1 of updateSource in hex, its name in EVALSHA,
// computing it on first use so that importing the package hashes nothing.
func updateSHA() string {
	updateSHAOnce.Do(func() { updateSHAHex = redis.NewScript(updateSource).Hash() })
	return updateSHAHex
}

func formatRecord(rec kvstore.Record) string { return redisscript.FormatRecord(rec) }

func parseRecord(s string) (kvstore.Record, bool) { return redisscript.ParseRecord(s) }

// wrap names the failed command and makes sure an error caused by ctx
// matches ctx.Err() with errors.Is. go-redis turns the context's deadline
// into a socket deadline, which can fire a moment before ctx.Err() reports
// it, so a passed deadline counts as context.DeadlineExceeded.
func wrap(ctx context.Context, cmd string, err error) error {
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("redisstore: %s: %w: %w", cmd, cerr, err)
	}
	return fmt.Errorf("redisstore: %s: %w", cmd, err)
}
