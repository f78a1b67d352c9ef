// Package durable is ratekit's exact strategy: counters in PostgreSQL, for
// quotas that are money ("1000 calls a day, exactly") and for anything where
// a race must never let an extra request through.
//
// A [Limiter] runs each decision as one call of a server-side function in
// [pgstore] (one network round trip, one implicit transaction, the database
// clock; decisions on a hot key, or beyond the store's MaxInFlight
// statements in flight, share one statement and one commit, each decided as
// if alone),
// so it is exact however many processes share the database:
//
//   - ratekit.FixedWindow never admits more than the quota in one window.
//   - ratekit.SlidingWindow (two-window weighted count) never admits more
//     than the quota in one aligned window, so any rolling window holds at
//     most twice the quota, and at most the quota when traffic is even.
//   - ratekit.TokenBucket holds Quota units and refills Quota per Window:
//     it admits at most Quota + t×Quota/Window units in any interval t.
//   - ratekit.SlidingLog never admits more than the quota in any rolling
//     window; it keeps one row per admitted request, for small quotas.
//
// Denied requests take nothing. [Limiter] implements [ratekit.Limiter],
// [ratekit.Peeker], [ratekit.Refunder] and [ratekit.Resetter], and honours
// [ratekit.Request.IdempotencyKey]: a retried Allow or Refund with the same
// idempotency key counts once within Policy.Window of the first attempt.
//
// A policy may count in calendar periods instead of windows
// ([ratekit.Period]: a day, week or month in a time zone, from a billing
// anchor), on the database clock. [Planned] decides each request against
// its key's plan ([ratekit.Plan]), resolved per request, and reports usage
// per key ([Planned.Usage]) and per period for billing
// ([Planned.PeriodUsage]).
//
// See package pgstore for the table layout, the durability choices, PgBouncer
// and RDS Proxy, and pool settings for serverless functions.
package durable

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore"
)

// Config configures a [Limiter].
type Config struct {
	// Store is the PostgreSQL store, one per pool ([pgstore.New]).
	// Required.
	Store *pgstore.Store

	// Policy is the quota, Policy.Quota units per Policy.Window counted by
	// Policy.Algorithm, advertised to clients under Policy.Name exactly as
	// given (see [ratekit.Policy]). For a TokenBucket, Quota is the burst
	// (the bucket holds Quota units) and Window the time an empty bucket
	// takes to fill: a bucket of burst 20 refilled at 5 per second is
	// Quota 20, Window 4s. Name must pass [ratekit.ValidatePolicyName];
	// Quota must be from 1 to [ratekit.MaxQuota] and Window at least 1 ms.
	// Algorithm is required. Each is exact, computed in the database on
	// its clock in integer microseconds:
	//
	//   - ratekit.FixedWindow: windows aligned to the Unix epoch; the units
	//     admitted in one window never exceed Quota, so a rolling interval
	//     of one Window that spans a boundary holds at most 2×Quota.
	//   - ratekit.SlidingWindow: the units admitted in one aligned window
	//     never exceed Quota, so any rolling Window holds at most 2×Quota,
	//     and at most Quota when the previous window's admissions were
	//     spread evenly.
	//   - ratekit.TokenBucket: the generic cell rate algorithm (GCRA,
	//     ITU-T I.371) on a theoretical arrival time; in any interval of
	//     length t it admits at most Quota + t/interval units, where
	//     interval is Window/Quota rounded up to a whole microsecond (the
	//     rounding only ever slows the refill). New refuses a policy that
	//     the rounding would slow by more than 1%, which needs at least
	//     100 µs of Window per unit of Quota to be sure.
	//   - ratekit.SlidingLog: one row per admitted request; a request is
	//     admitted only when the units of the preceding Window plus its
	//     cost are at most Quota, so every rolling Window is exact.
	//     Decisions for one key are serialised by a transaction-level
	//     advisory lock, so it suits small quotas ("5 sign-ups per hour")
	//     rather than hot keys.
	//
	// A Policy with a Period ([ratekit.Period]: a day, week or month in a
	// time zone, from an anchor) is a fixed window over those periods:
	// Algorithm FixedWindow and Window zero. The units admitted in one
	// period never exceed Quota, and a new period starts from zero at its
	// true start. This process computes the period around its clock and
	// its two neighbours; the database picks among them the one its clock
	// is in, so decisions use the database clock, and an error matching
	// [ratekit.ErrClockSkew] reports clocks more than a period apart. Decisions
	// report the current period's length in Policy.Window and its end in
	// ResetAfter (and RetryAfter when denied); an IdempotencyKey is
	// remembered 32 days. Such decisions are coalesced like others, and
	// ended periods' usage is kept for [Limiter.PeriodUsage].
	Policy ratekit.Policy

	// Prefix separates this limiter's keys from other limiters' in the
	// shared tables. Empty means Policy.Name. Two limiters with the same
	// prefix, algorithm and durability share their counts.
	Prefix string

	// Durability selects [Logged] tables (for billing: they survive a
	// crash) or [Unlogged] tables (for abuse counters: cheaper, emptied by
	// a crash). Required: the zero value is invalid, so that the choice
	// that matters most for money is written down.
	Durability Durability

	// SynchronousCommit, when false (the default), sets synchronous_commit
	// to off for each decision's transaction (inside the server-side
	// function, so it holds no session state and works through PgBouncer
	// in transaction mode). The decision then returns before its commit
	// record is flushed to disk: a crash of the database server (not of
	// the client) can lose the decisions of roughly the last
	// 3×wal_writer_delay (600 ms by default), which come back as unused
	// quota; it never corrupts data or admits more than the quota before
	// the crash. When true, the server's own synchronous_commit setting
	// (on by default) applies: every decision is durable (and replicated,
	// as configured) when it returns. It makes no difference for Unlogged
	// tables, which write no WAL.
	SynchronousCommit bool

	// CleanupProbability is the probability in [0, 1] that a decision also
	// deletes up to 500 rows of this prefix that expired more than one
	// Window ago, skipping rows that other decisions hold. Zero means 0.01;
	// a negative value disables inline cleanup (call [Limiter.Cleanup]
	// from a scheduled job instead).
	CleanupProbability float64

	// DeniedCacheSize, when positive, enables an in-process cache of up
	// to that many denied keys. While a key is in it, Allow and Peek
	// answer a request of at least the denied cost from memory, without a
	// round trip, until the denial's RetryAfter has passed (for the window
	// algorithms, the key's reset). Within one process the cache is
	// linearizable with Allow, Peek, Refund and Reset (a key is answered
	// only while no decision about it is in flight, and no denial outlives
	// an admission, refund or reset that returned after it); a refund or
	// reset in another process is seen when the cached RetryAfter ends.
	// The cache only ever repeats a denial, so it never admits more than
	// the database would. Requests with an
	// IdempotencyKey bypass it. When full it evicts, as tokenbucket's
	// does: among five sampled keys, the expired ones, or else the one
	// whose RetryAfter ends first. Zero disables the cache.
	DeniedCacheSize int

	// Now is the clock of the denied cache (nil means time.Now). Decisions
	// never use it: they use the database clock.
	Now func() time.Time
}

// Durability selects the tables a [Limiter] keeps its counts in. The zero
// Durability is invalid.
type Durability int

const (
	// Unlogged keeps counts in UNLOGGED tables: no write-ahead log, so
	// writes are cheaper, but PostgreSQL empties the tables after a crash
	// or an immediate shutdown (not after a clean shutdown) and does not
	// replicate them to standbys: after a crash or a failover every key
	// starts again with a full quota. For abuse and spam counters.
	Unlogged Durability = iota + 1

	// Logged keeps counts in ordinary tables, which survive crashes and
	// are replicated. A failover to a standby keeps every decision
	// admitted with [Config.SynchronousCommit] under synchronous
	// replication; otherwise it loses what the standby had not received,
	// which comes back as unused quota. For billing and paid quotas.
	Logged
)

// String returns the durability's name as written in Go, "Unlogged" or
// "Logged", or "Durability(n)" for an unknown value.
func (d Durability) String() string { return pgengine.Durability(d).String() }

// Limiter is a [ratekit.Limiter] backed by PostgreSQL. It is safe for
// concurrent use and starts no goroutine.
type Limiter struct {
	counter *pgengine.Counter
	policy  ratekit.Policy
	cache   *deniedCache
}

var (
	_ ratekit.Limiter  = (*Limiter)(nil)
	_ ratekit.Peeker   = (*Limiter)(nil)
	_ ratekit.Refunder = (*Limiter)(nil)
	_ ratekit.Resetter = (*Limiter)(nil)
)

// configErr returns an error matching [ratekit.ErrInvalidConfig] that reads
// "durable: invalid config: " and format's text: every configuration error
// of this package is made here. The text of a configuration error of
// ratekit or of the engine that it includes loses its "[ratekit: ]invalid
// config: ", so that the message names the package and the class once.
func configErr(format string, args ...any) error {
	msg := strings.NewReplacer("ratekit: invalid config: ", "", "invalid config: ", "").Replace(fmt.Sprintf(format, args...))
	return fmt.Errorf("durable: %w: %s", ratekit.ErrInvalidConfig, msg)
}

// New returns a Limiter for cfg. It returns an error matching
// [ratekit.ErrInvalidConfig] for an invalid configuration and does not
// contact the database.
func New(cfg Config) (*Limiter, error) {
	if cfg.Store == nil {
		return nil, configErr("nil Store")
	}
	store := (*pgengine.Store)(cfg.Store)
	if !store.Made() {
		return nil, configErr("Store not made by pgstore.New")
	}
	if cfg.Durability == 0 {
		return nil, configErr("Durability is not set; choose durable.Logged for quotas that are money or durable.Unlogged for abuse counters")
	}
	if cfg.Durability != Unlogged && cfg.Durability != Logged {
		return nil, configErr("unknown durability %d", int(cfg.Durability))
	}
	if err := ratekit.ValidatePolicyName(cfg.Policy.Name); err != nil {
		return nil, configErr("%v", err)
	}
	if cfg.Policy.Quota < 1 || cfg.Policy.Quota > ratekit.MaxQuota {
		return nil, configErr("policy quota must be from 1 to ratekit.MaxQuota, got %d", cfg.Policy.Quota)
	}
	if !cfg.Policy.Period.IsZero() {
		if err := cfg.Policy.ValidatePeriod(); err != nil {
			return nil, configErr("%v", err)
		}
	}
	if cfg.DeniedCacheSize < 0 {
		return nil, configErr("negative denied cache size %d", cfg.DeniedCacheSize)
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = cfg.Policy.Name
	}
	counter, err := store.Counter(pgengine.CounterConfig{
		Prefix:             prefix,
		Algorithm:          cfg.Policy.Algorithm,
		Quota:              cfg.Policy.Quota,
		Window:             cfg.Policy.Window,
		Period:             cfg.Policy.Period,
		Durability:         pgengine.Durability(cfg.Durability),
		SynchronousCommit:  cfg.SynchronousCommit,
		CleanupProbability: cfg.CleanupProbability,
	})
	if err != nil {
		return nil, configErr("%v", err)
	}
	l := &Limiter{counter: counter, policy: cfg.Policy}
	if cfg.DeniedCacheSize > 0 {
		now := cfg.Now
		if now == nil {
			now = time.Now
		}
		l.cache = newDeniedCache(cfg.DeniedCacheSize, now)
	}
	return l, nil
}

// Policy returns the limiter's policy.
func (l *Limiter) Policy() ratekit.Policy { return l.policy }

// Allow takes req.Cost units from req.Key's quota when they are available,
// in one round trip. See [ratekit.Limiter] for the contract. With an
// IdempotencyKey, a request whose earlier attempt was admitted within
// Policy.Window is admitted again without taking anything. Errors: those of
// [ratekit.Request.Validate], [ratekit.ErrCostExceedsQuota], and store
// errors wrapping the pgx error (and ctx.Err()); after a store error the
// request may or may not have been counted.
func (l *Limiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if len(req.Parts) > 0 {
		return ratekit.Decision{}, ratekit.ErrUnexpectedParts
	}
	if d, ok := l.cached(req); ok {
		return d, nil
	}
	ticket := l.cache.begin(req.Key)
	r, err := l.counter.Take(ctx, req.Key, req.Cost, req.IdempotencyKey)
	if err != nil {
		l.cache.finish(req.Key, true)
		return ratekit.Decision{}, err
	}
	d := l.decision(r)
	l.remember(req, d, ticket)
	l.cache.finish(req.Key, d.Allowed)
	return d, nil
}

// Peek reports the Decision that Allow would return for req now without
// taking anything. It returns the same errors as Allow.
func (l *Limiter) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if len(req.Parts) > 0 {
		return ratekit.Decision{}, ratekit.ErrUnexpectedParts
	}
	if d, ok := l.cached(req); ok {
		return d, nil
	}
	r, err := l.counter.Peek(ctx, req.Key, req.Cost)
	if err != nil {
		return ratekit.Decision{}, err
	}
	return l.decision(r), nil
}

// Refund gives req.Cost units back to req.Key's quota, never above the
// limit, and removes the key from this
// process's denied cache. A non-empty IdempotencyKey makes a retried refund
// count once. It returns the same errors as Allow, except that a cost above
// the quota is accepted.
func (l *Limiter) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if len(req.Parts) > 0 {
		return ratekit.Decision{}, ratekit.ErrUnexpectedParts
	}
	l.cache.begin(req.Key)
	r, err := l.counter.Refund(ctx, req.Key, req.Cost, req.IdempotencyKey)
	l.cache.finish(req.Key, true)
	if err != nil {
		return ratekit.Decision{}, err
	}
	return l.decision(r), nil
}

// Reset forgets key in the database (counter, sliding-log entries,
// idempotency records) and in this process's denied cache. It waits for the
// key's decisions in flight and takes the key's locks in the order they
// do, so it is safe to call while other goroutines and processes use the
// key: it never deadlocks with them. It returns
// [ratekit.ErrEmptyKey] or [ratekit.ErrKeyTooLong] for an invalid key and a
// store error wrapping the pgx error otherwise.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	l.cache.begin(key)
	err := l.counter.Reset(ctx, key)
	l.cache.finish(key, true)
	return err
}

// Cleanup deletes all expired rows of this limiter's prefix and returns how
// many it deleted (counters, sliding-log entries and idempotency records, in
// statements of up to 500 rows per table). Rows are expired by the database
// clock, so Cleanup never changes a decision. Call it from a scheduled job
// when inline cleanup is disabled or a prefix is retired. Errors wrap the
// pgx error; the count is what was deleted before the error.
func (l *Limiter) Cleanup(ctx context.Context) (int64, error) {
	return l.counter.Cleanup(ctx)
}

func (l *Limiter) decision(r pgengine.Outcome) ratekit.Decision {
	return outcomeDecision(l.policy, r)
}

// outcomeDecision returns the Decision of policy p for r: for a policy with
// a Period, Policy.Window is the length of the period r counted in.
func outcomeDecision(p ratekit.Policy, r pgengine.Outcome) ratekit.Decision {
	if r.Period > 0 {
		p.Window = r.Period
	}
	return ratekit.Decision{
		Allowed:    r.Allowed,
		Quota:      p.Quota,
		Remaining:  r.Remaining,
		RetryAfter: r.RetryAfter,
		ResetAfter: r.ResetAfter,
		Policy:     p,
	}
}

// PeriodUsage calls fn, in order of key and period start, with the units
// each key used in each period of the limiter's Period that starts in
// [from, to), skipping periods in which nothing was used, as
// [Planned.PeriodUsage] does for a plan's policy. It returns an error
// matching [ratekit.ErrInvalidConfig] when the policy has no Period, fn's
// error as is, and store errors wrapping the pgx error.
func (l *Limiter) PeriodUsage(ctx context.Context, from, to time.Time, fn func(PeriodUsage) error) error {
	if l.policy.Period.IsZero() {
		return configErr("policy %q has no period", l.policy.Name)
	}
	return l.counter.PeriodUsage(ctx, from, to, func(u pgengine.PeriodUsage) error { return fn(PeriodUsage(u)) })
}

func (l *Limiter) cached(req ratekit.Request) (ratekit.Decision, bool) {
	if l.cache == nil || req.IdempotencyKey != "" {
		return ratekit.Decision{}, false
	}
	// The counter validates the request. An entry holds a valid key and a
	// cost of at least 1, so only a cost above the quota, which the counter
	// refuses, could find one.
	if req.Cost > l.counter.Quota() {
		return ratekit.Decision{}, false
	}
	return l.cache.get(req.Key, req.Cost)
}

func (l *Limiter) remember(req ratekit.Request, d ratekit.Decision, ticket uint64) {
	if l.cache == nil || d.Allowed || d.RetryAfter <= 0 {
		return
	}
	l.cache.put(req.Key, req.Cost, d, ticket)
}
