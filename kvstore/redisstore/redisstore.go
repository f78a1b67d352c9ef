// Package redisstore is a [kvstore.Store] and [kvstore.Atomic] on Redis,
// through go-redis v9's [redis.UniversalClient]: a single server, Sentinel and
// Redis Cluster all work.
//
// Every key is written as Prefix + "{" + key + "}": the braces are a Redis
// Cluster hash tag, so everything one decision touches lives in one slot and a
// script never fails with CROSSSLOT.
//
// [Store.Update] is one round trip: a short Lua script run with EVALSHA that
// reads the time with TIME inside the script, so no client clock enters the
// math. When the server answers NOSCRIPT, the update is sent again with EVAL,
// which also loads the script, so a flushed script cache or a failover to a
// fresh replica recovers on its own.
//
// Coalescing: the Store keeps at most [Config.MaxInFlight] round trips in
// flight (DefaultMaxInFlight, 8). Below that a command goes at once on its
// caller's goroutine; beyond it, commands wait and go together in one
// pipeline when a round trip ends, so that under heavy concurrency Redis and
// the client pay one write and one read for many decisions instead of one
// each. Every command still runs alone and atomically in Redis, and every
// caller still returns at its own deadline. The idea is group commit in
// databases and auto-pipelining in Redis clients (rueidis), applied to the
// Store's own commands.
//
// It needs Redis 5 or later (or a compatible server: Valkey, KeyDB), where a
// script that reads TIME may write, and uses only the Lua string library.
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
// length T it takes at most Max + Rate × T units (the [kvstore.Refill]'s
// fields, Rate in units per microsecond and T in microseconds). The new
// master's history continues a prefix of the old one's, and that shared
// prefix is counted once. So over an interval that contains one failover a
// key takes at most 2 × (Max + Rate × T) units, twice what one store takes,
// less the units of the shared prefix; with n failovers in the interval, at
// most (n+1) × (Max + Rate × T). Keys not updated between the last
// replicated update and the switch stay exact. The new master's clock
// (TIME) takes over too: one that runs s ahead of the old master's refills
// s × Rate early, which adds to the bound; one behind refills nothing until
// it catches up.
//
// While the master is unreachable, updates fail (an error; what follows is
// the caller's choice) until the client reaches the new master. With
// go-redis's failover client that is Sentinel's down-after-milliseconds,
// the promotion and Sentinel's one-second polling: at most
// 2 × down-after-milliseconds + failover-timeout + 2s, plus one command's
// deadline (tested in package tokenbucket on a live Sentinel). On Redis
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

// ServerlessOptions sets o's timeouts for a function that must answer within
// its own deadline, and returns o:
//
//   - ContextTimeoutEnabled: true, so the context's deadline bounds every
//     command (go-redis ignores it otherwise);
//   - DialTimeout, ReadTimeout, WriteTimeout and PoolTimeout: timeout;
//   - MaxRetries: -1 (no retries: a retry would spend the caller's budget
//     on a server that just failed) and DialerRetries: 1 (one dial attempt).
//
// timeout is the longest one command may take when the context allows more;
// 0 means 250ms. Use it as
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
	return o
}

// Key returns the Redis key under which s stores key.
func (s *Store) Key(key string) string {
	return s.prefix + "{" + key + "}"
}

// Get implements [kvstore.Store] with GET. It returns
// kvstore.ErrMalformedRecord when the key holds something this package did
// not write.
func (s *Store) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	cmd := redis.NewStringCmd(ctx, "get", s.Key(key))
	err := s.co.do(ctx, cmd)
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
	if err := s.co.do(ctx, cmd); err != nil {
		return wrap(ctx, "SET", err)
	}
	return nil
}

// Delete implements [kvstore.Store] with DEL.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.co.do(ctx, redis.NewIntCmd(ctx, "del", s.Key(key))); err != nil {
		return wrap(ctx, "DEL", err)
	}
	return nil
}

// Update implements [kvstore.Atomic] with one EVALSHA of a Lua script that
// follows [kvstore.Refill.Apply] on Redis's clock (TIME). It returns
// kvstore.ErrInvalidRefill and kvstore.ErrInvalidOp before contacting Redis,
// and kvstore.ErrMalformedRecord when the key holds something this package
// did not write.
func (s *Store) Update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.Result, error) {
	a := s.args.Load()
	if a == nil || a.r != r {
		if err := r.Validate(); err != nil {
			return kvstore.Result{}, err
		}
		a = &refillArgs{r: r, max: strconv.FormatInt(r.Max, 10), rate: strconv.FormatInt(r.Rate, 10)}
		s.args.Store(a)
	}
	if err := r.CheckOp(op, n); err != nil {
		return kvstore.Result{}, err
	}
	var opArg any
	switch op {
	case kvstore.OpTake:
		opArg = "t"
	case kvstore.OpPeek:
		opArg = "p"
	default:
		opArg = "r"
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
	args := []any{"evalsha", updateSHA(), 1, s.Key(key), a.max, a.rate, bn.arg, opArg}
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	err := s.co.do(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", updateSource
		cmd = redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		err = s.co.do(ctx, cmd)
	}
	if err != nil {
		if strings.Contains(err.Error(), malformedMsg) {
			return kvstore.Result{}, kvstore.ErrMalformedRecord
		}
		return kvstore.Result{}, wrap(ctx, "EVALSHA", err)
	}
	v, err := cmd.Int64()
	if err != nil {
		return kvstore.Result{}, wrap(ctx, "EVALSHA", err)
	}
	if v < 0 {
		return kvstore.Result{OK: false, Value: -v - 1}, nil
	}
	return kvstore.Result{OK: true, Value: v}, nil
}

const malformedMsg = "kvstore: malformed record"

// updateSource is kvstore.Refill.Apply in Lua. KEYS[1] is the record's key;
// ARGV is max, rate (units per microsecond), n and the op: t (take), p (peek)
// or r (refund). The record is the string "<value> <time>" (time in
// microseconds since the Unix epoch). The reply is one integer: the level
// after the op when n units were available (or refunded), and -(level+1)
// when they were not, so the reply needs no array or string parsing.
//
// Every number stays below 2^53 (kvstore.MaxValue and the time in
// microseconds), where Lua's doubles are exact integers, except the refill
// v + elapsed*rate of a long-idle key, which is only compared with max (and
// replaced by it): a double that large is far above any max. The script
// avoids what costs most in Redis's Lua: no pattern matching, no math.*
// calls, one string built per write; it only uses the string library every
// Redis-compatible server ships.
const updateSource = `
local max, rate, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local clock = t[1] * 1000000 + t[2]
local now, v = clock, max
local s = redis.call('GET', KEYS[1])
if s then
  local i, b = string.find(s, ' ', 1, true)
  if i then v, b = tonumber(string.sub(s, 1, i - 1)), tonumber(string.sub(s, i + 1)) end
  if not (i and v and b) then return redis.error_reply('` + malformedMsg + `') end
  if v > max then v = max elseif v < 0 then v = 0 end
  if now <= b then
    now = b
  else
    v = v + (now - b) * rate
    if v > max then v = max end
  end
end
local op = ARGV[4]
if op == 'r' then
  v = v + n
  if v > max then v = max end
elseif v < n then
  return -v - 1
elseif op == 't' then
  v = v - n
else
  return v
end
if v >= max then
  redis.call('DEL', KEYS[1])
else
  local ttl = (now - clock + (max - v) / rate) / 1000
  redis.call('SET', KEYS[1], string.format('%d %d', v, now), 'PX', ttl - ttl % 1 + 1)
end
return v
`

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

func formatRecord(rec kvstore.Record) string {
	b := make([]byte, 0, 40)
	b = strconv.AppendInt(b, rec.Value, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, rec.Time, 10)
	return string(b)
}

func parseRecord(s string) (kvstore.Record, bool) {
	a, b, ok := strings.Cut(s, " ")
	if !ok {
		return kvstore.Record{}, false
	}
	v, err1 := strconv.ParseInt(a, 10, 64)
	t, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil {
		return kvstore.Record{}, false
	}
	return kvstore.Record{Value: v, Time: t}, true
}

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
