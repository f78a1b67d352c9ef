// Package redisstore is a [kvstore.Store] and [kvstore.Atomic] on Redis,
// through go-redis v9's [redis.UniversalClient]: a single server, Sentinel and
// Redis Cluster all work.
//
// Every key is written as Prefix + "{" + key + "}": the braces are a Redis
// Cluster hash tag, so everything one decision touches lives in one slot and a
// script never fails with CROSSSLOT.
//
// Store.Update is one round trip: a short Lua script run with EVALSHA. A
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
// milliseconds of Redis's clock (see Store.ClockStep), and no client
// clock enters the math. When the server answers NOSCRIPT, the update is
// sent again with EVAL, which also loads the script, so a flushed script
// cache or a failover to a fresh replica recovers on its own.
//
// Store.UpdateMulti updates several keys in one script, all or nothing.
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
// own: Store.Get reads only what Store.Set wrote (a limiter's Eventual
// mode), and reports an Update's record as kvstore.ErrMalformedRecord.
//
// The decision flow and the scripts are ratekit's Redis engine
// (kvstore/redisengine, in ratekit's main module); this package adapts
// go-redis to it. The two are released together: require this module and
// github.com/ratekit/ratekit at one release, or New fails with an error
// that names both versions.
//
// Timeouts: go-redis's defaults block for seconds when Redis is slow, whatever
// the context says. Build the client with [ServerlessOptions] (or set the
// same fields yourself) so that a slow or dead Redis returns an error within
// the caller's context deadline.
//
// Retries: a script runs at most once per decision, whatever the client's
// MaxRetries. The Store marks its scripts as commands go-redis must not
// resend once they may have been written (redis.Cmder's NoRetry), so a
// connection that ends after Redis ran a script and before its reply
// arrived gives the caller an error, and the script has run once: a take
// may be charged without being admitted, never twice. MaxRetries still
// applies to the Store's reads, to dials and to commands refused before
// anything was sent.
//
// # Replication and failover
//
// Store.Update is exact on one master: every update of a key runs in one
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
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisengine"
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

// Store is a Redis-backed store: a [redisengine.Engine] on a go-redis
// client. Its methods Get, Set and Delete ([kvstore.Store]), Update
// ([kvstore.Atomic]), UpdateMulti and Partitioned ([kvstore.MultiAtomic]),
// CountsPeriods ([kvstore.PeriodCounter]), ClockStep
// ([kvstore.ClockStepper]) and Key are the Engine's, documented there;
// here every command goes through the Store's coalescer (see
// [Config.MaxInFlight]), and a peek, or a take after a refusal, reads the
// key in a MULTI/EXEC only on a round trip of its own, leaving the decision
// to the script (in the next pipeline) when none is free. Partitioned
// reports true for any client but a *redis.Client (one server or a
// Sentinel failover group): a Redis Cluster (*redis.ClusterClient) or a
// *redis.Ring.
//
// It is safe for concurrent use; it holds no connection of its own and
// never closes the client. While commands are queued behind
// [Config.MaxInFlight] round trips, one goroutine per round trip sends
// them; it ends when the queue is empty.
type Store struct {
	*engine
	client redis.UniversalClient
	co     coalescer
	shas   sync.Map // *redisengine.Script to its SHA as a command's argument (see conn.shaArg)
}

// engine is the Redis engine a Store embeds.
type engine = redisengine.Engine

// engineProtocol is the version of the Redis engine protocol this package
// was written for (see redisengine.Config.Protocol): a literal of its own,
// so that this module built against a ratekit module of another protocol
// fails at New.
const engineProtocol = 1

var _ interface {
	kvstore.MultiAtomic
	kvstore.PeriodCounter
	kvstore.ClockStepper
} = (*Store)(nil)

// New returns a Store that uses client. It returns an error matching
// ratekit.ErrInvalidConfig for a nil client, a prefix with braces, or a
// ratekit module whose Redis engine speaks another protocol than this
// module (the error names both modules' versions: require them at one
// release).
func New(client redis.UniversalClient, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("redisstore: %w: nil client", ratekit.ErrInvalidConfig)
	}
	switch {
	case cfg.MaxInFlight == 0:
		cfg.MaxInFlight = DefaultMaxInFlight
	case cfg.MaxInFlight < 0:
		cfg.MaxInFlight = 0
	}
	s := &Store{client: client, co: coalescer{client: client, max: cfg.MaxInFlight}}
	var err error
	s.engine, err = redisengine.New((*conn)(s), redisengine.Config{Name: "redisstore", Module: "github.com/ratekit/ratekit/kvstore/redisstore", Protocol: engineProtocol, Prefix: cmp.Or(cfg.Prefix, DefaultPrefix)})
	if err != nil {
		return nil, err
	}
	return s, nil
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
//     sent, so no command is applied twice. A caller that waits alone for
//     its reply (no other connection of the client awaits one) polls its
//     socket for up to 100µs before it sleeps: on a virtual machine a
//     sleeping caller's wake-up can cost more than the command itself, and
//     a function instance is billed for the time it waits, not for the
//     processor it keeps busy meanwhile. Polls that keep finding no reply
//     (a server across a network) stop for a while.
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
