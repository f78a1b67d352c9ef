// Package redisengine is ratekit's Redis engine: the Lua scripts that run
// kvstore's token buckets and period counters on Redis, their record
// format, and the flow of a decision (which command to send, the
// MULTI/EXEC reads that decide a peek or a take after a refusal without a
// script, EVALSHA, the reply's decoding), written once for every Redis
// client library. A store adapts its client to [Conn] and embeds an
// [Engine], whose methods are the store's kvstore methods:
// kvstore/redisstore does so for go-redis, kvstore/rueidisstore for
// rueidis, and both write the same records under the same keys.
//
// A store and the engine speak a protocol whose version each states on its
// own ([Config.Protocol]): a store module built against a ratekit module of
// another protocol fails at [New], naming both modules' versions, instead
// of sending arguments the scripts would read otherwise.
//
// docs/redis.md describes the records and the scripts.
package redisengine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisengine/internal/redisscript"
)

// Config configures an [Engine].
type Config struct {
	// Name is the store's package name, which begins the Engine's error
	// texts ("redisstore: …"); empty means "redisengine".
	Name string

	// Module is the store's module path, which the error of a protocol
	// mismatch names with its version.
	Module string

	// Protocol is the version of the engine protocol the store was written
	// for. A store states it as a literal in its own package, never from a
	// constant of this package, so that a store built against a ratekit
	// module of another protocol fails at New.
	Protocol int

	// Prefix is prepended to every key. It must not contain '{' or '}',
	// which would change the keys' hash slot.
	Prefix string
}

// Engine runs ratekit's decisions on Redis through a [Conn]. It is a
// kvstore.Store, kvstore.Atomic, kvstore.MultiAtomic,
// kvstore.PeriodCounter and kvstore.ClockStepper, whose methods a store
// embeds or forwards. It is safe for concurrent use.
type Engine struct {
	conn   Conn
	name   string
	prefix string

	// refusals picks the order of each take's reads (see
	// redisscript.Refusals).
	refusals redisscript.Refusals
}

// New returns an Engine that sends its commands through conn. It returns
// an error matching ratekit.ErrInvalidConfig for a nil conn, a prefix with
// braces, or a cfg.Protocol other than the engine's; that error names the
// versions of cfg.Module and of the ratekit module that the program was
// built with.
func New(conn Conn, cfg Config) (*Engine, error) {
	if cfg.Name == "" {
		cfg.Name = "redisengine"
	}
	if cfg.Protocol != protocol {
		return nil, protocolError(cfg)
	}
	if conn == nil {
		return nil, configErr(cfg.Name, "nil client")
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, configErr(cfg.Name, "prefix %q contains a brace", cfg.Prefix)
	}
	return &Engine{conn: conn, name: cfg.Name, prefix: cfg.Prefix}, nil
}

// configErr returns a config error of the store called name:
// "<name>: invalid config: …", matching ratekit.ErrInvalidConfig.
func configErr(name, format string, args ...any) error {
	return fmt.Errorf("%s: %w: %s", name, ratekit.ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// ClockStep implements kvstore.ClockStepper: the scripts read Redis's
// clock in whole milliseconds, so refill arrives in millisecond steps.
func (e *Engine) ClockStep() time.Duration { return time.Millisecond }

// Partitioned implements kvstore.MultiAtomic: it reports whether the Conn
// spreads keys over several servers by hash slot ([Conn.Partitioned]).
func (e *Engine) Partitioned() bool { return e.conn.Partitioned() }

// Key returns the Redis key under which e stores key: the prefix, then key
// in braces (a Redis Cluster hash tag).
func (e *Engine) Key(key string) string {
	return e.prefix + "{" + key + "}"
}

// Get implements kvstore.Store's Get with GET. It returns
// kvstore.ErrMalformedRecord when the key holds something Set did not
// write.
func (e *Engine) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	v, ok, err := e.conn.Get(ctx, e.Key(key))
	if err != nil {
		return kvstore.Record{}, false, e.wrap(ctx, "GET", err)
	}
	if !ok {
		return kvstore.Record{}, false, nil
	}
	rec, ok := redisscript.ParseRecord(v)
	if !ok {
		return kvstore.Record{}, false, kvstore.ErrMalformedRecord
	}
	return rec, true, nil
}

// Set implements kvstore.Store's Set with SET … PX, ttl rounded down to
// whole milliseconds and at least one. It returns kvstore.ErrInvalidTTL
// for a ttl that is not positive.
func (e *Engine) Set(ctx context.Context, key string, rec kvstore.Record, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: got %v", kvstore.ErrInvalidTTL, ttl)
	}
	ttl = max(ttl, time.Millisecond).Truncate(time.Millisecond)
	if err := e.conn.Set(ctx, e.Key(key), redisscript.FormatRecord(rec), ttl); err != nil {
		return e.wrap(ctx, "SET", err)
	}
	return nil
}

// Delete implements kvstore.Store's Delete with DEL.
func (e *Engine) Delete(ctx context.Context, key string) error {
	if err := e.conn.Del(ctx, e.Key(key)); err != nil {
		return e.wrap(ctx, "DEL", err)
	}
	return nil
}

// Update implements kvstore.Atomic: one EVALSHA of the update script,
// which follows kvstore.Refill.Apply on Redis's clock in whole
// milliseconds, keeping the bucket in the key's expiry and value. A peek,
// and a take of a key whose last take was refused, read the key first with
// [Conn.Read], and the script runs only for a take that now fits (or when
// Read declined, or for a value only the script can judge). It returns
// kvstore.ErrInvalidRefill and kvstore.ErrInvalidOp before contacting
// Redis, and kvstore.ErrMalformedRecord when the key holds something no
// ratekit store wrote.
func (e *Engine) Update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	if err := r.Validate(); err != nil {
		return kvstore.OpResult{}, err
	}
	if err := r.CheckOp(op, n); err != nil {
		return kvstore.OpResult{}, err
	}
	opArg, hash := e.refusals.OpArg(op, key)
	c := getCall()
	keys := append(c.keyBuf(1), c.text.Key(e.prefix, key))
	if opArg == "t" || opArg == "p" {
		// A peek, or a take of a key whose last take was refused: two
		// reads decide it, unless the take now fits.
		var (
			u   = [1]kvstore.Update{{Refill: r, N: n}}
			res [1]kvstore.OpResult
		)
		levels, err := e.levels(ctx, c, keys, u[:])
		if err != nil {
			return kvstore.OpResult{}, err
		}
		if levels != nil && redisscript.Decided(op, levels, u[:], res[:]) {
			putCall(c)
			return res[0], nil
		}
	}
	args := redisscript.UpdateArgs(c.argBuf(4), &c.text, r, n, opArg)
	vals, err := e.eval(ctx, updateScript, keys, args, c.intBuf(1))
	if err != nil {
		return kvstore.OpResult{}, err
	}
	if len(vals) != 1 {
		return kvstore.OpResult{}, e.wrap(ctx, "EVALSHA", fmt.Errorf("unexpected reply %v", vals))
	}
	v := vals[0]
	putCall(c)
	e.refusals.Took(opArg, hash, v >= 0)
	return redisscript.DecodeLevel(v), nil
}

// eval runs script through the Conn and turns a script's error reply into
// the error it stands for.
func (e *Engine) eval(ctx context.Context, script *Script, keys, args []string, dst []int64) ([]int64, error) {
	vals, err := e.conn.Eval(ctx, script, keys, args, dst)
	if err == nil {
		return vals, nil
	}
	switch msg := err.Error(); {
	case strings.Contains(msg, redisscript.Malformed):
		return nil, kvstore.ErrMalformedRecord
	case strings.Contains(msg, redisscript.ClockSkew):
		return nil, fmt.Errorf("%s: %w (%s)", e.name, ratekit.ErrClockSkew, msg)
	}
	return nil, e.wrap(ctx, "EVALSHA", err)
}

// levels reads the buckets of updates under keys (their Redis keys) with
// Conn.Read and returns each one's level, as redisscript.Level reads it.
// It returns nil, leaving the decision to the script, when Read declined
// or a key holds something Level leaves to the script.
func (e *Engine) levels(ctx context.Context, c *call, keys []string, updates []kvstore.Update) ([]int64, error) {
	ttls, values, levels := c.readBufs(len(keys))
	ok, err := e.conn.Read(ctx, keys, ttls, values)
	if err != nil {
		return nil, e.wrap(ctx, "EXEC", err)
	}
	if !ok {
		return nil, nil
	}
	for i := range keys {
		r := updates[i].Refill
		if levels[i], ok = redisscript.Level(r.Burst, redisscript.RateArg(r), ttls[i], values[i]); !ok {
			return nil, nil
		}
	}
	return levels, nil
}

// wrap names the failed command and makes sure an error caused by ctx
// matches ctx.Err() with errors.Is. Clients turn the context's deadline
// into a socket deadline, which can fire a moment before ctx.Err() reports
// it, so a passed deadline counts as context.DeadlineExceeded.
func (e *Engine) wrap(ctx context.Context, cmd string, err error) error {
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%s: %s: %w: %w", e.name, cmd, cerr, err)
	}
	return fmt.Errorf("%s: %s: %w", e.name, cmd, err)
}

var _ interface {
	kvstore.Atomic
	kvstore.MultiAtomic
	kvstore.PeriodCounter
	kvstore.ClockStepper
} = (*Engine)(nil)

// callKeys is the number of keys a pooled call holds without allocating,
// and callArgs the number of script arguments (a period script's on
// callKeys counters).
const (
	callKeys = 8
	callArgs = 1 + 7*callKeys
)

// call holds the buffers one decision hands to the Conn, pooled: a Conn
// may refer to them until it returns without an error (see Conn), and a
// decision that ends with an error leaves its call to the garbage
// collector instead of the pool. The keys and arguments are written to
// text, into inline until it is full. A decision of more than callKeys
// keys allocates buffers of its own.
type call struct {
	keys   [callKeys]string
	args   [callArgs]string
	ints   [2*callKeys + 1]int64
	ttls   [callKeys]int64
	values [callKeys]string
	levels [callKeys]int64
	text   redisscript.Text
	inline [1024]byte
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// getCall returns a call from the pool, its text empty.
func getCall() *call {
	c := callPool.Get().(*call)
	c.text.Reset(c.inline[:])
	return c
}

// putCall clears the strings c holds and returns c to the pool. No Conn
// may refer to c's keys and arguments any more.
func putCall(c *call) {
	clear(c.keys[:])
	clear(c.args[:])
	clear(c.values[:])
	callPool.Put(c)
}

// keyBuf returns an empty slice of capacity n for a decision's keys.
func (c *call) keyBuf(n int) []string {
	if n <= callKeys {
		return c.keys[:0]
	}
	return make([]string, 0, n)
}

// argBuf returns an empty slice of capacity n for a script's arguments.
func (c *call) argBuf(n int) []string {
	if n <= callArgs {
		return c.args[:0]
	}
	return make([]string, 0, n)
}

// intBuf returns an empty slice of capacity n for a script's reply.
func (c *call) intBuf(n int) []int64 {
	if n <= len(c.ints) {
		return c.ints[:0]
	}
	return make([]int64, 0, n)
}

// readBufs returns slices of length n for Conn.Read's replies and the
// levels they give.
func (c *call) readBufs(n int) (ttls []int64, values []string, levels []int64) {
	if n <= callKeys {
		return c.ttls[:n], c.values[:n], c.levels[:n]
	}
	return make([]int64, n), make([]string, n), make([]int64, n)
}
