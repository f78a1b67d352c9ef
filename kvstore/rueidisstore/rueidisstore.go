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
// pipelined, and a lone command would cost two goroutine hand-offs more.
// So once the Store has seen two of its commands in flight at once, a
// command that finds no other in flight goes on a dedicated connection of
// the client's pool (rueidis.Client.Dedicated), written and read on its
// caller's goroutine: an instance that once served a burst still makes a
// lone decision with one write and one read. A lone command whose context
// can end without a deadline stays on the pipelined connections, as does
// every command on a Redis Cluster. Use the Store when an instance makes
// several decisions at once; kvstore/redisstore, which coalesces only
// beyond a bound of round trips in flight, suits a program that already
// has a go-redis client.
//
// The decision flow and the scripts are ratekit's Redis engine
// (kvstore/redisengine, in ratekit's main module); this package adapts
// rueidis to it. The two are released together: require this module and
// github.com/ratekit/ratekit at one release, or New fails with an error
// that names both versions.
//
// Timeouts: rueidis stops waiting for a command when its context ends. Give
// every call a context with a deadline, and build the client with
// [ServerlessOptions], which bounds how long a connection that went silent
// (an instance thawing behind a NAT gateway) stays in use.
//
// Retries: a script runs at most once per decision. rueidis resends a
// command after a network error only when it is read-only, which EVALSHA
// and EVAL are not (and nothing with DisableRetry, which ServerlessOptions
// sets), so a connection that ends after Redis ran a script and before its
// reply arrived gives the caller an error, and the script has run once.
package rueidisstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisengine"
	"github.com/ratekit/ratekit/kvstore/rueidisstore/internal/busypoll"
)

// Store is a Redis-backed store: a [redisengine.Engine] on a rueidis
// client. Its methods Get, Set and Delete ([kvstore.Store]), Update
// ([kvstore.Atomic]), UpdateMulti and Partitioned ([kvstore.MultiAtomic]),
// CountsPeriods ([kvstore.PeriodCounter]), ClockStep
// ([kvstore.ClockStepper]) and Key are the Engine's, documented there;
// here rueidis pipelines the commands (a lone one, once the Store has seen
// a burst, on a dedicated connection: see the package doc), and
// Partitioned reports whether the client is a Redis Cluster client
// (rueidis.ClientModeCluster), whose keys live in hash slots that one
// script cannot span (a single server and a Sentinel group are not
// partitioned).
//
// It is safe for concurrent use; it holds no connection of its own (a
// dedicated connection goes back to the client's pool after each
// command) and never closes the client.
type Store struct {
	client rueidis.Client
	*engine

	// calls counts the Store's commands in flight, and pipelined is set
	// once the client may have pipelined its connections (see conn.do).
	calls     atomic.Int64
	pipelined atomic.Bool
	// direct is the command of the one call that goes on a dedicated
	// connection, when a caller is alone (see conn.do).
	direct dedicated
	// standalone is true for a client of one server or of a Sentinel
	// group, whose dedicated connections take commands of any key.
	standalone bool
}

// engine is the Redis engine a Store embeds.
type engine = redisengine.Engine

// engineProtocol is the version of the Redis engine protocol this package
// was written for (see redisengine.Config.Protocol): a literal of its own,
// so that this module built against a ratekit module of another protocol
// fails at New.
const engineProtocol = 1

// New returns a Store that uses client. It returns an error matching
// ratekit.ErrInvalidConfig for a nil client, a prefix with braces, or a
// ratekit module whose Redis engine speaks another protocol than this
// module (the error names both modules' versions: require them at one
// release).
func New(client rueidis.Client, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("rueidisstore: %w: nil client", ratekit.ErrInvalidConfig)
	}
	s := &Store{client: client, standalone: client.Mode() != rueidis.ClientModeCluster}
	s.direct.send = s.direct.do
	e, err := redisengine.New((*conn)(s), redisengine.Config{Name: "rueidisstore", Module: "github.com/ratekit/ratekit/kvstore/rueidisstore", Protocol: engineProtocol, Prefix: cmp.Or(cfg.Prefix, DefaultPrefix)})
	if err != nil {
		return nil, err
	}
	s.engine = e
	return s, nil
}

var _ interface {
	kvstore.MultiAtomic
	kvstore.PeriodCounter
	kvstore.ClockStepper
} = (*Store)(nil)

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
//     finds one pipelined connection to replace, not two (beside the
//     dedicated one of a store that has served a burst);
//   - DialCtxFn: o.DialCtxFn, or o.DialFn, or rueidis's own dial (TCP, in
//     TLS when o.TLSConfig is set), with each socket's reads polled while
//     a caller waits alone: a caller whose connection is the client's only
//     one awaiting a reply polls its socket for up to 100µs before it
//     sleeps. On a virtual machine a sleeping caller's wake-up can cost
//     more than the command itself, and a function instance is billed for
//     the time it waits, not for the processor it keeps busy meanwhile.
//     Polls that keep finding no reply (a server across a network) stop
//     for a while.
//
// rueidis's defaults (ten seconds and one second) leave a connection that
// went silent, as a NAT gateway or load balancer leaves the flows it
// dropped while an instance was frozen, in use for seconds, and every
// decision sent on it meanwhile fails at its deadline. With these options,
// after such a thaw at most one decision fails per connection that went
// silent, after timeout (on a connection that has run pipelined, up to
// twice timeout: the PING's wait and its answer's), and the next ones go on
// new connections. timeout is the longest one command may take; 0 means
// 250ms. Keep twice timeout below the decisions' deadlines, with a margin
// for scheduling (say 100ms), so that rueidis gives up on a silent
// connection before the caller does: a decision that meets its own deadline
// first leaves the connection in use, and the next decision fails on it
// too. Use it as
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
	o.DialCtxFn = polledDial(o.DialCtxFn, o.DialFn)
	return o
}

// polledDial returns a DialCtxFn for ServerlessOptions: dialCtx, or dial,
// or else rueidis's own dial (TCP, in TLS when the options' TLSConfig is
// set), with every socket's reads by a lone caller polled (busypoll).
func polledDial(dialCtx func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error), dial func(string, *net.Dialer, *tls.Config) (net.Conn, error)) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	poll := new(busypoll.Group)
	return func(ctx context.Context, dst string, d *net.Dialer, config *tls.Config) (net.Conn, error) {
		var (
			conn net.Conn
			err  error
		)
		switch {
		case dialCtx != nil:
			conn, err = dialCtx(ctx, dst, d, config)
		case dial != nil:
			conn, err = dial(dst, d, config)
		case config != nil:
			return poll.DialTLS(ctx, d, "tcp", dst, config)
		default:
			conn, err = d.DialContext(ctx, "tcp", dst)
		}
		if err != nil {
			return nil, err
		}
		return poll.Wrap(conn), nil
	}
}

// conn is a Store seen as the Redis engine's connection: the commands the
// engine sends, on the Store's rueidis client, which pipelines them.
type conn Store

// Eval implements [redisengine.Conn]: EVALSHA, and EVAL when the server
// lost the script (a flushed cache, a failover) and answers NOSCRIPT.
func (c *conn) Eval(ctx context.Context, script *redisengine.Script, keys, args []string, dst []int64) ([]int64, error) {
	b, n := c.client.B(), int64(len(keys))
	res := c.do(ctx, b.Evalsha().Sha1(script.SHA()).Numkeys(n).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = c.do(ctx, b.Eval().Script(script.Source()).Numkeys(n).Key(keys...).Arg(args...).Build())
	}
	msg, err := res.ToMessage()
	if err != nil {
		return dst, err
	}
	if msg.IsInt64() {
		v, err := msg.AsInt64()
		return append(dst, v), err
	}
	vals, err := msg.ToArray()
	if err != nil {
		return dst, err
	}
	for i := range vals {
		v, err := vals[i].AsInt64()
		if err != nil {
			return dst, fmt.Errorf("unexpected reply: %w", err)
		}
		dst = append(dst, v)
	}
	return dst, nil
}

// Read implements [redisengine.Conn] with one MULTI/EXEC.
func (c *conn) Read(ctx context.Context, keys []string, ttls []int64, values []string) (bool, error) {
	b := c.client.B()
	cmds := make(rueidis.Commands, 0, 2+2*len(keys))
	cmds = append(cmds, b.Multi().Build())
	for _, k := range keys {
		cmds = append(cmds, b.Pttl().Key(k).Build(), b.Get().Key(k).Build())
	}
	cmds = append(cmds, b.Exec().Build())
	res := c.doMulti(ctx, cmds)
	replies, err := res[len(res)-1].ToArray()
	if err != nil {
		if _, refused := rueidis.IsRedisErr(err); refused {
			return false, nil
		}
		return false, err
	}
	if len(replies) != 2*len(keys) {
		return false, nil
	}
	for i := range keys {
		if ttls[i], err = replies[2*i].AsInt64(); err != nil {
			return false, nil
		}
		if values[i], err = replies[2*i+1].ToString(); err != nil && !rueidis.IsRedisNil(err) {
			return false, nil
		}
	}
	return true, nil
}

// Get implements [redisengine.Conn] with GET.
func (c *conn) Get(ctx context.Context, key string) (string, bool, error) {
	v, err := c.client.Do(ctx, c.client.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false, nil
	}
	return v, err == nil, err
}

// Set implements [redisengine.Conn] with SET … PX.
func (c *conn) Set(ctx context.Context, key, value string, ttl time.Duration) error {
	return c.client.Do(ctx, c.client.B().Set().Key(key).Value(value).PxMilliseconds(ttl.Milliseconds()).Build()).Error()
}

// Del implements [redisengine.Conn] with DEL.
func (c *conn) Del(ctx context.Context, key string) error {
	return c.client.Do(ctx, c.client.B().Del().Key(key).Build()).Error()
}

// Partitioned implements [redisengine.Conn]: it reports whether the client
// is a Redis Cluster client.
func (c *conn) Partitioned() bool { return c.client.Mode() == rueidis.ClientModeCluster }
