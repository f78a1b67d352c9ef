// Package rueidisstore is a [kvstore.Store], [kvstore.Atomic] and
// [kvstore.MultiAtomic] on Redis through rueidis (github.com/redis/rueidis),
// in a module of its own so that ratekit's main module does not depend on
// it. A single server, Sentinel and Redis Cluster all work, as
// rueidis.NewClient connects to them.
//
// It runs the same update scripts as kvstore/redisstore (the multi-key one
// of token-bucket composites included) and writes the same records under
// the same keys (Prefix + "{" + key + "}", a Redis Cluster hash tag), so the
// two stores can share a database and read each other's keys; everything
// redisstore's documentation says about atomicity, replication and failover
// holds here too.
//
// What rueidis adds is auto-pipelining: concurrent commands on one
// connection are written together and their replies read together, by a
// writer and a reader goroutine per connection, and the client keeps
// writing while earlier replies are on their way. Decisions from many
// goroutines therefore share system calls and wake-ups on both sides
// without waiting for one another's round trips. Until a connection has
// seen two commands at once (or a command whose context can be canceled but
// has no deadline, such as an HTTP request's), rueidis writes and reads a
// lone command on its caller's goroutine; after that the connection stays
// pipelined, and a lone command costs two goroutine hand-offs more. Use it
// when an instance makes several decisions at once; kvstore/redisstore,
// which coalesces only beyond a bound of round trips in flight, suits a
// program that already has a go-redis client.
//
// Timeouts: rueidis stops waiting for a command when its context ends. Give
// every call a context with a deadline, and build the client with
// [ServerlessOptions], which bounds how long a connection that went silent
// (an instance thawing behind a NAT gateway) stays in use.
package rueidisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/redisscript"
	"github.com/ratekit/ratekit/kvstore"
)

// DefaultPrefix is the key prefix used when [Config.Prefix] is empty, the
// same as kvstore/redisstore's.
const DefaultPrefix = "ratekit:"

// Config configures a [Store]. The zero Config is valid.
type Config struct {
	// Prefix is prepended to every key, so that ratekit's keys can share a
	// database with others. Empty means DefaultPrefix. It must not contain
	// '{' or '}', which would change the keys' hash slot.
	Prefix string
}

// Store is a Redis-backed store on a rueidis client. It is safe for
// concurrent use; it holds no connection of its own and never closes the
// client.
type Store struct {
	client rueidis.Client
	prefix string
	sha    string
	args   atomic.Pointer[refillArgs]

	// refusals picks the order of each take's reads (see
	// redisscript.Refusals).
	refusals redisscript.Refusals

	multiArgs atomic.Pointer[multiArgs]
}

// refillArgs caches a Refill's script arguments, formatted once.
type refillArgs struct {
	r         kvstore.Refill
	max, rate string
}

var (
	_ kvstore.Store  = (*Store)(nil)
	_ kvstore.Atomic = (*Store)(nil)
)

// New returns a Store that uses client. It returns an error matching
// ratekit.ErrInvalidConfig for a nil client or a prefix with braces.
func New(client rueidis.Client, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("rueidisstore: %w: nil client", ratekit.ErrInvalidConfig)
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("rueidisstore: %w: prefix %q contains a brace", ratekit.ErrInvalidConfig, cfg.Prefix)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	sum := sha1.Sum([]byte(redisscript.Update))
	return &Store{client: client, prefix: cfg.Prefix, sha: hex.EncodeToString(sum[:])}, nil
}

// ServerlessOptions sets o for a function that must answer within its own
// deadline and may be frozen between requests, and returns o:
//
//   - ConnWriteTimeout: timeout. rueidis closes a connection on which a
//     reply is that late;
//   - Dialer.KeepAlive: timeout. rueidis sends a PING on a connection that
//     has received nothing for that long, and closes it when the PING is not
//     answered within ConnWriteTimeout (the kernel's TCP keepalive uses the
//     same period);
//   - Dialer.Timeout: timeout, when not set;
//   - DisableRetry: true (a retry would spend the caller's budget on a
//     server that just failed);
//   - PipelineMultiplex: -1, one pipelined connection per server, when not
//     set (rueidis's default opens two on a machine of two or three CPUs).
//     A function instance's concurrent decisions then share fewer, larger
//     writes and reads, which costs Redis less per decision, and a thaw
//     finds one connection to replace, not two.
//
// rueidis's defaults (ten seconds and one second) leave a connection that
// went silent, as a NAT gateway or load balancer leaves the flows it
// dropped while an instance was frozen, in use for seconds, and every
// decision sent on it meanwhile fails at its deadline. With these options,
// after such a thaw at most one decision fails per connection that went
// silent, after timeout (on a connection that has run pipelined, up to
// twice timeout: the PING's wait and its answer's), and the next ones go on
// new connections. timeout is the longest one command may take; 0 means
// 250ms. Keep it below half the decisions' deadlines, so that rueidis gives
// up on a silent connection before the caller does. Use it as
//
//	client, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&rueidis.ClientOption{
//		InitAddress: []string{addr},
//	}, 0))
func ServerlessOptions(o *rueidis.ClientOption, timeout time.Duration) *rueidis.ClientOption {
	if timeout <= 0 {
		timeout = 250 * time.Millisecond
	}
	o.ConnWriteTimeout = timeout
	if o.Dialer.Timeout == 0 {
		o.Dialer.Timeout = timeout
	}
	o.Dialer.KeepAlive = timeout
	o.DisableRetry = true
	if o.PipelineMultiplex == 0 {
		o.PipelineMultiplex = -1
	}
	return o
}

// ClockStep implements [kvstore.ClockStepper]: the update scripts read
// Redis's clock in whole milliseconds, so refill arrives in millisecond
// steps.
func (s *Store) ClockStep() time.Duration { return time.Millisecond }

// Key returns the Redis key under which s stores key.
func (s *Store) Key(key string) string {
	return s.prefix + "{" + key + "}"
}

// Get implements [kvstore.Store] with GET. It returns
// kvstore.ErrMalformedRecord when the key holds something no ratekit store
// wrote.
func (s *Store) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	v, err := s.client.Do(ctx, s.client.B().Get().Key(s.Key(key)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return kvstore.Record{}, false, nil
	}
	if err != nil {
		return kvstore.Record{}, false, wrap(ctx, "GET", err)
	}
	rec, ok := redisscript.ParseRecord(v)
	if !ok {
		return kvstore.Record{}, false, kvstore.ErrMalformedRecord
	}
	return rec, true, nil
}

// Set implements [kvstore.Store] with SET … PX. It returns
// kvstore.ErrInvalidTTL for a ttl that is not positive.
func (s *Store) Set(ctx context.Context, key string, rec kvstore.Record, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: got %v", kvstore.ErrInvalidTTL, ttl)
	}
	ttl = max(ttl, time.Millisecond)
	cmd := s.client.B().Set().Key(s.Key(key)).Value(redisscript.FormatRecord(rec)).PxMilliseconds(ttl.Milliseconds()).Build()
	if err := s.client.Do(ctx, cmd).Error(); err != nil {
		return wrap(ctx, "SET", err)
	}
	return nil
}

// Delete implements [kvstore.Store] with DEL.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.client.Do(ctx, s.client.B().Del().Key(s.Key(key)).Build()).Error(); err != nil {
		return wrap(ctx, "DEL", err)
	}
	return nil
}

// Update implements [kvstore.Atomic] with one EVALSHA of the update script,
// which follows [kvstore.Refill.Apply] on Redis's clock in whole
// milliseconds, keeping the bucket in the key's expiry and value (see
// kvstore/redisstore; it needs Redis 7.0 or later). A peek, and a take of
// a key whose last take was refused, read the key first in a MULTI/EXEC of
// PTTL and GET, and the script runs only for a take that now fits (or for a
// value only the script can judge), so that a flood of refusals costs
// Redis two reads a decision. A server
// that lost the script (a flushed cache, a failover) answers NOSCRIPT, and
// the update is sent again with EVAL, which also loads it. Update returns
// kvstore.ErrInvalidRefill and kvstore.ErrInvalidOp before contacting
// Redis, and kvstore.ErrMalformedRecord when the key holds something no
// ratekit store wrote.
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
	k := s.Key(key)
	if opArg == "t" || opArg == "p" {
		// A peek, or a take of a key whose last take was refused: two
		// reads decide it, unless the take now fits.
		var (
			u     = [1]kvstore.Update{{Refill: r, N: n}}
			level [1]int64
			res   [1]kvstore.OpResult
		)
		ok, err := s.levels(ctx, []string{k}, u[:], level[:])
		if err != nil {
			return kvstore.OpResult{}, err
		}
		if ok && redisscript.Decided(op, level[:], u[:], res[:]) {
			return res[0], nil
		}
	}
	nArg := strconv.FormatInt(n, 10)
	res := s.client.Do(ctx, s.client.B().Evalsha().Sha1(s.sha).Numkeys(1).Key(k).Arg(a.max, a.rate, nArg, opArg).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = s.client.Do(ctx, s.client.B().Eval().Script(redisscript.Update).Numkeys(1).Key(k).Arg(a.max, a.rate, nArg, opArg).Build())
	}
	v, err := res.AsInt64()
	if err != nil {
		if strings.Contains(err.Error(), redisscript.Malformed) {
			return kvstore.OpResult{}, kvstore.ErrMalformedRecord
		}
		return kvstore.OpResult{}, wrap(ctx, "EVALSHA", err)
	}
	s.refusals.Took(opArg, hash, v >= 0)
	if v < 0 {
		return kvstore.OpResult{OK: false, Remaining: -v - 1}, nil
	}
	return kvstore.OpResult{OK: true, Remaining: v}, nil
}

// levels reads the buckets of updates under keys (their Redis keys) in one
// MULTI/EXEC of a PTTL and a GET each, and writes each one's level, as
// redisscript.Level reads it, into levels. It reports false, leaving the
// decision to the update script, when a key holds something Level leaves
// to it or the server refused a command (a key of another type).
func (s *Store) levels(ctx context.Context, keys []string, updates []kvstore.Update, levels []int64) (bool, error) {
	b := s.client.B()
	cmds := make(rueidis.Commands, 0, 2+2*len(keys))
	cmds = append(cmds, b.Multi().Build())
	for _, k := range keys {
		cmds = append(cmds, b.Pttl().Key(k).Build(), b.Get().Key(k).Build())
	}
	cmds = append(cmds, b.Exec().Build())
	res := s.client.DoMulti(ctx, cmds...)
	replies, err := res[len(res)-1].ToArray()
	if err != nil {
		if _, refused := rueidis.IsRedisErr(err); refused {
			return false, nil
		}
		return false, wrap(ctx, "EXEC", err)
	}
	if len(replies) != 2*len(keys) {
		return false, nil
	}
	for i := range keys {
		ttl, err := replies[2*i].AsInt64()
		if err != nil {
			return false, nil
		}
		w, err := replies[2*i+1].ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			return false, nil
		}
		r := updates[i].Refill
		var ok bool
		if levels[i], ok = redisscript.Level(r.Burst, redisscript.RateArg(r), ttl, w); !ok {
			return false, nil
		}
	}
	return true, nil
}

// wrap names the failed command and makes sure an error caused by ctx
// matches ctx.Err() with errors.Is: a deadline that has passed counts as
// context.DeadlineExceeded even when the socket's deadline fired a moment
// before the context reported it.
func wrap(ctx context.Context, cmd string, err error) error {
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("rueidisstore: %s: %w: %w", cmd, cerr, err)
	}
	return fmt.Errorf("rueidisstore: %s: %w", cmd, err)
}
