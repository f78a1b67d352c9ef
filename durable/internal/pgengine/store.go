package pgengine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit"
)

// DB is the part of a pgx connection that a [Store] uses; pgstore.DB has the
// same methods.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a [Store]: pgstore.Config, field for field, converted
// by pgstore.New (its documentation is the one users read). The zero value
// is valid: schema "ratekit", created on first use, queries in the DB's
// default query exec mode (see [New]).
type Config struct {
	Schema             string // empty means DefaultSchema
	DisableAutoMigrate bool   // no schema creation on first use
	SimpleProtocol     bool   // pgx's simple protocol whatever the DB's mode
	MaxInFlight        int    // 0 means DefaultMaxInFlight, < 0 no coalescing
}

// Store runs ratekit's decisions in PostgreSQL: pgstore.Store's engine,
// whose documentation states what it guarantees (one round trip per
// decision, coalescing (see coalescer), what a failure may have
// applied). It is safe for concurrent use, holds no connection of its own and
// starts no goroutine.
type Store struct {
	db     DB
	schema string
	quoted string
	mode   pgx.QueryExecMode
	co     coalescer

	// unprepared is set when a pooler refused a prepared statement (see
	// preparedRefused): from then on s sends statements in exec mode.
	unprepared atomic.Bool
	batchSQL   string

	// clock is the client clock that period bounds are computed from and
	// shift is added to the bounds sent (see SetPeriodClock).
	clock func() time.Time
	shift time.Duration

	autoMigrate bool
	migrateMu   sync.Mutex
	migrated    atomic.Bool
	migrateSQL  string

	// takes holds the take statements rendered so far (see
	// Store.takeStatement), at most one per table and algorithm and
	// commit setting.
	takesMu sync.Mutex
	takes   map[takeKind]string
}

// takeKind names a take statement: the table, the algorithm (its name in
// sqlCodes) and whether it leaves synchronous_commit alone.
type takeKind struct {
	d    Durability
	alg  string
	sync bool
}

// takeStatement returns the take statement of k (see takeSQL), rendered
// once per Store, or "" when k's algorithm has none.
func (s *Store) takeStatement(k takeKind) (string, error) {
	s.takesMu.Lock()
	defer s.takesMu.Unlock()
	if q, ok := s.takes[k]; ok {
		return q, nil
	}
	q, err := takeSQL(s.quoted, k.d, k.alg, k.sync)
	if err != nil {
		return "", err
	}
	if s.takes == nil {
		s.takes = make(map[takeKind]string)
	}
	s.takes[k] = q
	return q, nil
}

// New returns a Store that runs its statements on db, in db's default query
// exec mode when db is a *pgxpool.Pool or a *pgx.Conn (pgx's default,
// QueryExecModeCacheStatement, prepares each statement once per
// connection), in exec mode for any other db, and in the simple protocol
// when cfg.SimpleProtocol is set. A Store whose prepared statement a
// pooler refuses (PgBouncer in transaction mode before 1.21) sends the
// statement again, and every later one, in exec mode. It returns an error
// matching [ratekit.ErrInvalidConfig] for a nil db or an invalid schema name.
// New does not contact the database: with automatic migration the schema is
// created by the first decision (or by [Store.Migrate]).
func New(db DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("pgstore: %w: nil DB", ratekit.ErrInvalidConfig)
	}
	schema := cfg.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	msql, err := migrateSQL(schema)
	if err != nil {
		return nil, err
	}
	s := &Store{
		db:          db,
		schema:      schema,
		quoted:      `"` + schema + `"`,
		mode:        defaultMode(db),
		autoMigrate: !cfg.DisableAutoMigrate,
		migrateSQL:  msql,
	}
	if cfg.SimpleProtocol {
		s.mode = pgx.QueryExecModeSimpleProtocol
	}
	s.batchSQL = batchSQL(s.quoted)
	s.clock = time.Now
	s.co = coalescer{store: s, max: cfg.MaxInFlight, seed: maphash.MakeSeed(), held: make(map[uint64]int32)}
	switch {
	case cfg.MaxInFlight == 0:
		s.co.max = DefaultMaxInFlight
	case cfg.MaxInFlight < 0:
		s.co.max = 0
	}
	// More decisions in flight than the pool has connections would wait
	// for a connection: they wait in the queue instead, and go together.
	if p, ok := db.(interface{ Config() *pgxpool.Config }); ok && s.co.max > 0 {
		if n := int(p.Config().MaxConns); n > 0 {
			s.co.max = min(s.co.max, n)
		}
	}
	s.co.streams = min(batchesInFlight, s.co.max)
	return s, nil
}

// defaultMode returns the default query exec mode of db's connections when
// db tells it (a pool or a connection), and exec mode otherwise (a
// transaction, or a DB of the caller's making).
func defaultMode(db DB) pgx.QueryExecMode {
	switch db := db.(type) {
	case interface{ Config() *pgxpool.Config }:
		return db.Config().ConnConfig.DefaultQueryExecMode
	case interface{ Config() *pgx.ConnConfig }:
		return db.Config().DefaultQueryExecMode
	}
	return pgx.QueryExecModeExec
}

// queryMode returns the query exec mode of s's next statement.
func (s *Store) queryMode() pgx.QueryExecMode {
	if s.mode == pgx.QueryExecModeCacheStatement && s.unprepared.Load() {
		return pgx.QueryExecModeExec
	}
	return s.mode
}

// preparedRefused reports whether err, from a statement sent in mode, says
// that a pooler in transaction mode refused its prepared statement: the
// connection behind it had none of that name (26000), or already had one
// (42P05). Either is an error of the Parse or Bind message, so the
// statement never ran and may be sent again. When it returns true, s sends
// its statements in exec mode from then on.
func (s *Store) preparedRefused(mode pgx.QueryExecMode, err error) bool {
	var pgErr *pgconn.PgError
	if mode != pgx.QueryExecModeCacheStatement || !errors.As(err, &pgErr) ||
		pgErr.Code != "26000" && pgErr.Code != "42P05" {
		return false
	}
	s.unprepared.Store(true)
	return true
}

// textResult asks PostgreSQL for results in text form in every query exec
// mode: query parses the decision functions' bigint arrays from it. It is
// an interface value, which a statement's arguments take without
// allocating.
var textResult any = pgx.QueryResultFormats{pgx.TextFormatCode}

// Made reports whether s was made by [New]: false for a zero Store (a
// pgstore.Store{} literal).
func (s *Store) Made() bool { return s.db != nil }

// SetPeriodClock sets the client clock that period bounds are computed from
// (nil means time.Now) and a shift added to every bound sent to the
// database, and so to every period start that PeriodUsage is given. Tests
// use it to decide, on the database's real clock, in periods of any date:
// a clock fixed at a date and a shift of the real now minus that date. It
// must be called before the Store is used.
func (s *Store) SetPeriodClock(now func() time.Time, shift time.Duration) {
	if now == nil {
		now = time.Now
	}
	s.clock, s.shift = now, shift
}

// Schema returns the name of the schema the Store uses.
func (s *Store) Schema() string { return s.schema }

// Migrate creates the schema's tables and functions unless they exist, in
// one statement that holds a transaction-level advisory lock while it works,
// so that any number of processes may call it at once. A Store with
// automatic migration calls it before its first decision; later calls cost
// one round trip that finds the version marker and does nothing. Errors wrap
// the database error (and ctx.Err() when ctx ended).
func (s *Store) Migrate(ctx context.Context) error {
	var err error
	// Even under the advisory lock, PostgreSQL can report a catalog
	// conflict (unique violation on pg_type or pg_namespace, "tuple
	// concurrently updated") when another migration that does not use the
	// lock runs at the same time. The DO block is idempotent, so retry.
	for attempt := 0; attempt < 5; attempt++ {
		_, err = s.db.Exec(ctx, s.migrateSQL, pgx.QueryExecModeSimpleProtocol)
		if err == nil || !isCatalogRace(err) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Duration(10*(attempt+1)) * time.Millisecond)
	}
	if err != nil {
		return wrapErr(ctx, "migrate schema "+s.schema, err)
	}
	return nil
}

func isCatalogRace(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "23505", "42P07", "42710", "XX000", "40P01":
		return true
	}
	return false
}

func (s *Store) ensureSchema(ctx context.Context) error {
	if !s.autoMigrate || s.migrated.Load() {
		return nil
	}
	s.migrateMu.Lock()
	defer s.migrateMu.Unlock()
	if s.migrated.Load() {
		return nil
	}
	if err := s.Migrate(ctx); err != nil {
		return err
	}
	s.migrated.Store(true)
	return nil
}

// Durability selects the table a [Counter] stores its rows in.
type Durability int

const (
	// Unlogged stores rows in UNLOGGED tables: no write-ahead log, so
	// writes are cheaper, but PostgreSQL truncates the tables after a crash
	// (not after a clean shutdown) and they are not replicated to standbys:
	// after a crash or a failover every key starts with a full quota. For
	// abuse and spam counters.
	Unlogged Durability = 1

	// Logged stores rows in ordinary tables that survive crashes and are
	// replicated. For billing and paid quotas.
	Logged Durability = 2
)

// String returns the durability's name as written in Go, "Unlogged" or
// "Logged", or "Durability(n)" for an unknown value.
func (d Durability) String() string {
	switch d {
	case Unlogged:
		return "Unlogged"
	case Logged:
		return "Logged"
	}
	return "Durability(" + strconv.Itoa(int(d)) + ")"
}

func (d Durability) table(name string) string {
	if d == Logged {
		return name
	}
	return name + "_unlogged"
}

// function returns the name of the single-key function of a with d.
func (d Durability) function(a ratekit.Algorithm) string { return d.table(algName(a)) }

// DefaultCleanupProbability is the probability with which a decision also
// deletes expired rows of its prefix when [CounterConfig.CleanupProbability]
// is zero.
const DefaultCleanupProbability = 0.01

// DefaultCleanupBatch is the most expired rows of each table that one inline
// cleanup or one round of [Counter.Cleanup] deletes.
const DefaultCleanupBatch = 500

// maxMicros bounds limits and the token bucket's burst × interval so that
// the functions' bigint arithmetic (counts, epoch microseconds) cannot
// overflow.
const maxMicros = 1 << 60

// CounterConfig configures a [Counter].
type CounterConfig struct {
	// Prefix separates this counter's keys from every other counter's in
	// the shared tables, so two limiters can limit the same key. It is
	// stored as data (a query parameter, never part of the SQL) and must
	// be a valid policy name ([ratekit.ValidatePolicyName]: 1 to 64 bytes
	// of letters, digits, '-', '_', '.', ':').
	Prefix string

	// Algorithm selects the counting algorithm. Required. Each is exact,
	// computed in the database on its clock in integer microseconds:
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
	//     interval is Window/Quota rounded up to a whole microsecond (the rounding only ever slows the refill).
	//   - ratekit.SlidingLog: one row per admitted request; a request is
	//     admitted only when the units of the preceding Window plus its
	//     cost are at most Quota, so every rolling Window is exact.
	//     Decisions for one key are serialised by a transaction-level
	//     advisory lock, so it suits small quotas ("5 sign-ups per hour")
	//     rather than hot keys.
	Algorithm ratekit.Algorithm

	// Quota is the number of units granted per Window, at least 1, and the
	// most the counter admits at once (its capacity). For a TokenBucket it
	// is the burst: the bucket holds Quota units and refills Quota per
	// Window, one unit every Window/Quota.
	Quota int64

	// Window is the window length, for a TokenBucket the time an empty
	// bucket takes to fill. At least 1 ms; stored in microseconds. Zero
	// with a Period.
	Window time.Duration

	// Period, when not zero, makes the counter a fixed window over
	// calendar periods (Algorithm FixedWindow, Window zero): decisions go
	// through a [Composite] of the one counter, which picks on the
	// database clock the period among the client's bounds (see
	// schema.sql, the period algorithm).
	Period ratekit.Period

	// Durability selects UNLOGGED (the zero value) or logged tables.
	Durability Durability

	// SynchronousCommit, when false (the default), sets synchronous_commit
	// to off for each decision's transaction (SET LOCAL inside the
	// server-side function, so it holds no session state and works through
	// PgBouncer in transaction mode). The decision then returns before its
	// commit record is flushed to disk: a crash of the database server
	// (not of the client) can lose the decisions of roughly the last
	// 3×wal_writer_delay (600 ms by default), which come back as unused
	// quota; it never corrupts data or admits more than the quota before
	// the crash. When true, the server's own synchronous_commit setting
	// (on by default) applies: every decision is durable (and replicated,
	// as configured) when it returns. The setting makes no difference for
	// Unlogged tables, which write no WAL.
	SynchronousCommit bool

	// CleanupProbability is the probability in [0, 1] that a decision also
	// deletes up to CleanupBatch rows of this prefix that expired more
	// than one Window ago, through the (prefix, expires_at_us) indexes and
	// skipping rows that other decisions hold. (The row of a key in use is
	// updated in place, not deleted and created again at every window.)
	// Zero means [DefaultCleanupProbability]; a negative value disables
	// inline cleanup (call [Counter.Cleanup] from a scheduled job
	// instead).
	CleanupProbability float64

	// CleanupBatch is the most rows per table that one inline cleanup
	// deletes. Zero means [DefaultCleanupBatch].
	CleanupBatch int
}

// Counter is one limiter's view of a [Store]: a prefix, an algorithm, a
// quota and a durability. It is safe for concurrent use. Every method makes
// one round trip (plus one the first time, when the Store creates its
// schema, and one where a connection first prepares the statement), which Take, Peek and Refund share with other decisions when the
// Store coalesces (see [Store]). A statement that may have been applied is
// never retried.
type Counter struct {
	store    *Store
	cfg      CounterConfig
	quota    int64
	windowUS int64 // window, or emission interval for TokenBucket
	ttlUS    int64 // idempotency record lifetime
	keepUS   int64 // how long after its expiry a row is cleaned up
	// single decides for a counter with a Period, through the composite
	// function.
	single   *Composite
	cleanupP float64
	// keepSyncCommit is the functions' p_sync: true leaves
	// synchronous_commit alone.
	keepSyncCommit bool
	batch          int64
	query          string
	// take is the counter's take statement (schema.sql's "take"), or ""
	// when its algorithm has none or it has a Period; takeFlushed is the
	// same statement leaving synchronous_commit alone, for a batch whose
	// commit waits for its flush (take itself when keepSyncCommit).
	take, takeFlushed string
	// many is the statement that calls the counter's set-based take, or
	// "" when it has none (see Store.sendMany).
	many string
	// args holds the counter's prefix, quota and windowUS as statement
	// arguments, boxed once rather than on every decision.
	args struct{ prefix, quota, window any }
	// refused is the share of the counter's recent takes by its take
	// statement that were refused, in 1/1024ths: an exponentially
	// weighted average, each take weighing 1/16. Updates may be lost
	// between concurrent takes; it is an estimate.
	refused atomic.Int64
}

// refusedShareBound is the share of refused takes, in 1/1024ths of
// Counter.refused, above which takes go to the function rather than the
// take statement. A refused take costs one statement more by the take
// statement (it refuses, then the function decides), an admitted one about
// a third less: above about 30% refusals, as in a flood, the function
// alone costs the server less.
const refusedShareBound = 300

// plainTake reports whether d is a take that its counter's take statement
// can decide: a single-key take without an idempotency key or cleanup, of
// a counter that has a take statement.
func (d *decision) plainTake() bool {
	return d.m == nil && d.c.take != "" && d.op == opTake && d.idem == nil && d.cleanup == 0
}

// byTake reports whether d goes as its counter's take statement: a plain
// take that no take statement refused already, of a counter few of whose
// recent takes were refused.
func (d *decision) byTake() bool {
	return d.plainTake() && !d.refused && d.c.refused.Load() <= refusedShareBound
}

// noteTake counts the outcome of a take by c's take statement in
// c.refused.
func (c *Counter) noteTake(admitted bool) {
	var x int64
	if !admitted {
		x = 1024
	}
	est := c.refused.Load()
	c.refused.Store(est + (x-est)/16)
}

// MaxRefillSlowdown bounds how much slower than advertised a token bucket
// may refill: its emission interval, Window/Quota rounded up to a whole
// microsecond, may fill the bucket later than Window by at most
// Window/MaxRefillSlowdown (1%).
const MaxRefillSlowdown = 100

// Counter returns a Counter for cfg. It returns an error matching
// [ratekit.ErrInvalidConfig] when cfg is invalid. It does not contact the
// database.
func (s *Store) Counter(cfg CounterConfig) (*Counter, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	periodic := !cfg.Period.IsZero()
	c := &Counter{store: s, cfg: cfg, quota: cfg.Quota, windowUS: cfg.Window.Microseconds()}
	if periodic {
		// The longest period (31 days and an hour) rounded up: how long
		// an idempotency record lives. Rows are kept PeriodKeep after
		// their period ended, for PeriodUsage.
		c.windowUS = PeriodIdempotencyTTL.Microseconds()
	}
	// Unlogged tables write no WAL, so there is no commit to make
	// asynchronous: skip the set_config call.
	c.keepSyncCommit = cfg.SynchronousCommit || cfg.Durability == Unlogged
	c.ttlUS = c.windowUS
	c.keepUS = c.ttlUS
	if periodic {
		c.keepUS = PeriodKeep.Microseconds()
	}
	if cfg.Algorithm == ratekit.TokenBucket {
		interval, err := emissionInterval(cfg.Quota, cfg.Window)
		if err != nil {
			return nil, err
		}
		c.windowUS = interval
	}
	switch {
	case cfg.CleanupProbability == 0:
		c.cleanupP = DefaultCleanupProbability
	case cfg.CleanupProbability > 0:
		c.cleanupP = cfg.CleanupProbability
	}
	c.batch = int64(cfg.CleanupBatch)
	if c.batch == 0 {
		c.batch = DefaultCleanupBatch
	}
	c.args.prefix, c.args.quota, c.args.window = cfg.Prefix, c.quota, c.windowUS
	c.query = "SELECT " + s.quoted + "." + cfg.Durability.function(cfg.Algorithm) + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
	if !periodic {
		var err error
		if c.take, err = s.takeStatement(takeKind{cfg.Durability, algName(cfg.Algorithm), c.keepSyncCommit}); err != nil {
			return nil, err
		}
		if c.takeFlushed, err = s.takeStatement(takeKind{cfg.Durability, algName(cfg.Algorithm), true}); err != nil {
			return nil, err
		}
		if c.many, err = manySQL(s.quoted, cfg.Durability, algName(cfg.Algorithm)); err != nil {
			return nil, err
		}
	}
	if periodic {
		single, err := NewComposite(c)
		if err != nil {
			return nil, err
		}
		c.single = single
	}
	return c, nil
}

// emissionInterval returns the token bucket's emission interval for quota
// units per window, in whole microseconds, rounded up so that the refill is
// never faster than configured, or an error matching
// [ratekit.ErrInvalidConfig] when the bucket is too large or the rounding
// would slow the refill by more than window/MaxRefillSlowdown.
func emissionInterval(quota int64, window time.Duration) (int64, error) {
	w := window.Microseconds()
	interval := (w + quota - 1) / quota
	if quota > maxMicros/interval {
		return 0, fmt.Errorf("%w: quota %d × interval %dµs is too large", ratekit.ErrInvalidConfig, quota, interval)
	}
	if slow := interval*quota - w; slow > w/MaxRefillSlowdown {
		return 0, fmt.Errorf("%w: a token bucket of %d per %v refills one unit every %dµs (whole microseconds), so it fills in %v instead: more than 1%% slower than it advertises; use at least 100µs of window per unit of quota",
			ratekit.ErrInvalidConfig, quota, window, interval, formatMicros(interval*quota))
	}
	return interval, nil
}

// formatMicros formats us microseconds (at least 0) as time.Duration
// does, also beyond the longest Duration (about 2,562,047 hours).
func formatMicros(us int64) string {
	if us <= math.MaxInt64/int64(time.Microsecond) {
		return (time.Duration(us) * time.Microsecond).String()
	}
	const hour = int64(time.Hour / time.Microsecond)
	rest := time.Duration(us%hour) * time.Microsecond
	return fmt.Sprintf("%dh%dm%gs", us/hour, rest/time.Minute, (rest % time.Minute).Seconds())
}

// validate returns an error matching [ratekit.ErrInvalidConfig] when cfg is
// invalid.
func (cfg *CounterConfig) validate() error {
	if err := ratekit.ValidatePolicyName(cfg.Prefix); err != nil {
		return fmt.Errorf("%w (prefix)", err)
	}
	if cfg.Algorithm < ratekit.FixedWindow || cfg.Algorithm > ratekit.SlidingLog {
		return fmt.Errorf("%w: unknown algorithm %d", ratekit.ErrInvalidConfig, int(cfg.Algorithm))
	}
	if cfg.Durability != Unlogged && cfg.Durability != Logged {
		return fmt.Errorf("%w: unknown durability %d", ratekit.ErrInvalidConfig, int(cfg.Durability))
	}
	if cfg.Quota < 1 {
		return fmt.Errorf("%w: quota must be at least 1, got %d", ratekit.ErrInvalidConfig, cfg.Quota)
	}
	if cfg.Quota > maxMicros {
		return fmt.Errorf("%w: quota %d is above 2^60", ratekit.ErrInvalidConfig, cfg.Quota)
	}
	periodic := !cfg.Period.IsZero()
	if periodic {
		p := ratekit.Policy{Name: cfg.Prefix, Algorithm: cfg.Algorithm, Window: cfg.Window, Period: cfg.Period}
		if err := p.ValidatePeriod(); err != nil {
			return err
		}
	} else if cfg.Window < time.Millisecond {
		return fmt.Errorf("%w: window must be at least 1ms, got %v", ratekit.ErrInvalidConfig, cfg.Window)
	}
	if cfg.CleanupProbability > 1 || math.IsNaN(cfg.CleanupProbability) {
		return fmt.Errorf("%w: cleanup probability %v is above 1", ratekit.ErrInvalidConfig, cfg.CleanupProbability)
	}
	if cfg.CleanupBatch < 0 {
		return fmt.Errorf("%w: negative cleanup batch %d", ratekit.ErrInvalidConfig, cfg.CleanupBatch)
	}
	return nil
}

// PeriodIdempotencyTTL is how long an idempotency key is remembered by a
// counter with a Period: 32 days, longer than any period.
const PeriodIdempotencyTTL = 32 * 24 * time.Hour

// PeriodKeep is how long after its period ended the counter row of a
// counter with a Period is kept (inline cleanup and [Counter.Cleanup] skip
// it until then), so that PeriodUsage finds the last period of a key that
// has made no request since: 400 days.
const PeriodKeep = 400 * 24 * time.Hour

// Config returns the configuration c was created with.
func (c *Counter) Config() CounterConfig { return c.cfg }

// Quota returns the most units the counter admits at once.
func (c *Counter) Quota() int64 { return c.quota }

// Outcome is what one [Counter] operation decided, computed in the database
// from the database clock.
type Outcome struct {
	// Allowed reports whether the cost was admitted (Take), would be
	// admitted (Peek), or was given back (Refund, always true).
	Allowed bool

	// Remaining is the number of units available after the operation,
	// between 0 and the capacity. For SlidingWindow it is the quota minus
	// the weighted estimate, rounded down.
	Remaining int64

	// RetryAfter is how long until a request of the same cost can be
	// admitted: zero when Allowed, positive otherwise. Like ResetAfter, it
	// saturates at the longest time.Duration (about 292 years).
	RetryAfter time.Duration

	// ResetAfter is how long until the full capacity is available again.
	ResetAfter time.Duration

	// Period is the length of the period the decision counted in, for a
	// counter with a Period; zero otherwise.
	Period time.Duration

	// Used is the units counted in the current window or period (for
	// SlidingWindow and TokenBucket, capacity − Remaining). Only
	// decisions of a [Composite] report it.
	Used int64

	// Duplicate reports that the idempotency key was seen within its
	// lifetime: nothing was taken or given back this time, and Allowed is
	// true because the first attempt succeeded.
	Duplicate bool
}

// Take takes cost units from key's quota when they are available. A denial
// (Allowed false) takes nothing. When idempotencyKey is not empty and a Take
// with the same key and idempotency key was admitted within the last Window,
// Take takes nothing and returns Allowed and Duplicate true. The idempotency
// record is written in the same transaction as the counter, so a decision
// that fails takes nothing and records nothing.
//
// Take returns errors matching [ratekit.ErrInvalidRequest] for bad input
// (see [ratekit.Request.Validate], [ratekit.ErrCostExceedsQuota]) before
// contacting the database; other errors wrap the pgx error and, when ctx
// ended, ctx.Err(). After an error that is not bad input, the decision may
// or may not have been applied: a retry with the same idempotency key
// counts once.
func (c *Counter) Take(ctx context.Context, key string, cost int64, idempotencyKey string) (Outcome, error) {
	return c.do(ctx, opTake, key, cost, idempotencyKey)
}

// Peek reports what Take would decide for cost units now, without taking
// anything or writing anything. It returns the same errors as Take.
func (c *Counter) Peek(ctx context.Context, key string, cost int64) (Outcome, error) {
	return c.do(ctx, opPeek, key, cost, "")
}

// Refund gives cost units back to key's quota, never raising it above the
// capacity: for the window algorithms it lowers the current window's count
// (for SlidingWindow then the previous one's), for TokenBucket it moves the
// theoretical arrival time back (not before now), for SlidingLog it removes
// the most recent admissions. A non-empty idempotencyKey makes a retried
// refund count once within Window (refunds and takes have separate
// idempotency records). It returns the same errors as Take, except that a
// cost above the capacity is allowed.
func (c *Counter) Refund(ctx context.Context, key string, cost int64, idempotencyKey string) (Outcome, error) {
	return c.do(ctx, opRefund, key, cost, idempotencyKey)
}

// refundCost returns the cost a refund of cost units sends to SQL: at
// most maxMicros+1 units, and for a token bucket at most
// maxMicros/interval+1, so that the functions' bigint arithmetic (a count
// plus the cost, the cost times the emission interval) cannot overflow. It
// gives back the same as cost: a count and a bucket's debt never exceed
// maxMicros (units, or microseconds of a bucket's burst offset), and a
// refund empties them at most.
func (c *Counter) refundCost(cost int64) int64 {
	most := int64(maxMicros)
	if c.cfg.Algorithm == ratekit.TokenBucket {
		most /= c.windowUS
	}
	return min(cost, most+1)
}

func (c *Counter) do(ctx context.Context, op int64, key string, cost int64, idem string) (Outcome, error) {
	if c.single != nil {
		r, err := c.single.do(ctx, op, key, cost, nil, idem, nil)
		if err != nil {
			return Outcome{}, err
		}
		return r[0], nil
	}
	req := ratekit.Request{Key: key, Cost: cost, IdempotencyKey: idem}
	if err := req.Validate(); err != nil {
		return Outcome{}, err
	}
	if op != opRefund && cost > c.quota {
		return Outcome{}, fmt.Errorf("%w: cost %d, quota %d", ratekit.ErrCostExceedsQuota, cost, c.quota)
	}
	if op == opRefund {
		cost = c.refundCost(cost)
	}
	if err := c.store.ensureSchema(ctx); err != nil {
		return Outcome{}, err
	}
	var idemArg []byte
	if idem != "" && op != opPeek {
		idemArg = idempotencyRecord(op, tagTake, tagRefund, nil, idem)
	}
	var cleanup int64
	if op != opPeek && c.cleanupP > 0 && rand.Float64() < c.cleanupP {
		cleanup = c.batch
	}
	var lock int64
	if c.cfg.Algorithm == ratekit.SlidingLog {
		lock = logLockID(c.cfg.Durability, c.cfg.Prefix, key)
	}
	res, err := c.store.co.do(ctx, &decision{c: c, op: op, key: key, cost: cost, idem: idemArg, lock: lock, cleanup: cleanup})
	if err != nil {
		return Outcome{}, err
	}
	out := res.one
	r := Outcome{Allowed: out[0] == 1, Remaining: out[1], Duplicate: out[4] == 1}
	retryUS, resetUS := out[2], out[3]
	r.RetryAfter = microseconds(retryUS)
	r.ResetAfter = microseconds(resetUS)
	return r, nil
}

// sendOne decides d alone, in one statement.
func (s *Store) sendOne(ctx context.Context, d *decision) (result, error) {
	if d.m != nil {
		return d.m.sendOne(ctx, d)
	}
	out, err := s.sendSingle(ctx, d)
	return result{one: out}, err
}

// sendSingle decides the single-key decision d alone: with its counter's
// take statement when d.byTake, and otherwise, or when that statement
// refused the take (writing nothing), with its function.
func (s *Store) sendSingle(ctx context.Context, d *decision) ([5]int64, error) {
	c := d.c
	var out [5]int64
	// A plain take's outcome is counted once: by the take statement, or
	// else by the function.
	counted := !d.plainTake() || d.refused
	if d.byTake() {
		err := s.queryTake(ctx, d, &out)
		switch {
		case err == nil:
			c.noteTake(true)
			return out, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return out, wrapErr(ctx, c.cfg.Algorithm.String(), err)
		}
		// Refused, and nothing written: the function decides afresh.
		c.noteTake(false)
		counted = true
	}
	raw, err := s.query(ctx, c.query, textResult, s.queryMode(),
		d.op, c.args.prefix, []byte(d.key), d.cost, c.args.quota, c.args.window,
		d.lock, d.idem, c.ttlUS, d.cleanup, c.keepSyncCommit)
	if err == nil && !parseResult(raw, &out) {
		err = fmt.Errorf("function returned %q, want a bigint[5] in text form (schema version mismatch?)", raw)
	}
	if err != nil {
		return out, wrapErr(ctx, c.cfg.Algorithm.String(), err)
	}
	if !counted {
		c.noteTake(out[0] == 1)
	}
	return out, nil
}

// queryTake runs d's take statement and, when it admitted the take, reads
// its result into out. It sends the statement once more when it never ran
// (see neverRan). It returns pgx.ErrNoRows when the statement refused
// the take.
func (s *Store) queryTake(ctx context.Context, d *decision, out *[5]int64) error {
	c := d.c
	take := func(mode pgx.QueryExecMode) error {
		return c.scanTake(s.db.QueryRow(ctx, c.take, mode, c.args.prefix, []byte(d.key), d.cost, c.args.quota, c.args.window), out)
	}
	mode := s.queryMode()
	err := take(mode)
	if err != nil && s.neverRan(ctx, mode, err) {
		err = take(s.queryMode()) // exec mode once a pooler refused a prepared statement
	}
	return err
}

// scanTake reads the result of c's take statement (schema.sql's
// "<alg>.result") from row into out, in the decision functions' layout:
// a fixed window's remaining and reset after, or a token bucket's reset
// after, whose remaining follows as token_bucket.remaining derives it
// (reset after is the bucket's tat less the clock).
func (c *Counter) scanTake(row pgx.Row, out *[5]int64) error {
	var remaining, reset int64
	var err error
	if c.cfg.Algorithm == ratekit.TokenBucket {
		err = row.Scan(&reset)
		remaining = max((c.quota*c.windowUS-reset)/c.windowUS, 0)
	} else {
		err = row.Scan(&remaining, &reset)
	}
	if err == nil {
		*out = [5]int64{1, remaining, 0, reset, 0}
	}
	return err
}

// query runs sql with args, a statement that returns one bigint array, and
// returns the array's text form, which is parsed here rather than by pgx's
// generic array codec, which costs most of a decision's allocations. args
// start with textResult and s.queryMode(). It sends the statement once more
// when it never ran (see neverRan).
func (s *Store) query(ctx context.Context, sql string, args ...any) ([]byte, error) {
	var raw []byte
	err := s.db.QueryRow(ctx, sql, args...).Scan(&raw)
	if mode, _ := args[1].(pgx.QueryExecMode); err == nil || !s.neverRan(ctx, mode, err) {
		return raw, err
	}
	args[1] = s.queryMode() // exec mode once a pooler refused a prepared statement
	err = s.db.QueryRow(ctx, sql, args...).Scan(&raw)
	return raw, err
}

// neverRan reports whether err, from statements sent in mode by a caller
// still waiting (ctx not done), says that none of them ran, so that they
// may be sent again: they never reached the server (a dead pooled
// connection found while sending), or a pooler refused their prepared
// statement (see preparedRefused, after which s.queryMode is exec mode).
// Anything else may have been applied, and sending it again could count a
// request twice.
func (s *Store) neverRan(ctx context.Context, mode pgx.QueryExecMode, err error) bool {
	return ctx.Err() == nil && (s.preparedRefused(mode, err) || pgconn.SafeToRetry(err))
}

// exec runs f, which sends one statement in the query exec mode it is
// given, in s's mode, and once more in exec mode when a pooler refused its
// prepared statement.
func (s *Store) exec(f func(mode pgx.QueryExecMode) error) error {
	mode := s.queryMode()
	err := f(mode)
	if err != nil && s.preparedRefused(mode, err) {
		err = f(pgx.QueryExecModeExec)
	}
	return err
}

// microseconds converts us to a Duration, saturating at the longest one: a
// sliding window's reset can lie two windows ahead, beyond what a Duration
// holds when the window is over 146 years.
func microseconds(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// Reset forgets key: its counter, its sliding-log entries and its
// idempotency records, in one statement that first takes the key's lock as
// a take does, so that it never deadlocks with takes and refunds of the key
// in flight. Resetting a key that has no rows is
// not an error. It returns [ratekit.ErrEmptyKey] or [ratekit.ErrKeyTooLong]
// for an invalid key and otherwise errors that wrap the pgx error.
func (c *Counter) Reset(ctx context.Context, key string) error {
	return resetKey(ctx, []*Counter{c}, nil, key, "reset")
}

// resetKey forgets key under every counter of cs, which share a Store and
// a durability, and under the prefixes extra (whose rows are locked as a
// counter's), with one call of the schema's reset function; op names the
// operation in errors.
func resetKey(ctx context.Context, cs []*Counter, extra []string, key, op string) error {
	if err := ratekit.ValidateKey(key); err != nil {
		return err
	}
	s := cs[0].store
	if err := s.ensureSchema(ctx); err != nil {
		return err
	}
	prefixes := make([]string, len(cs))
	algs := make([]int64, len(cs))
	locks := make([]int64, len(cs))
	for i, c := range cs {
		prefixes[i], algs[i] = c.cfg.Prefix, algCode(c.cfg.Algorithm)
		if c.cfg.Algorithm == ratekit.SlidingLog {
			locks[i] = logLockID(c.cfg.Durability, c.cfg.Prefix, key)
		}
	}
	for _, p := range extra {
		prefixes = append(prefixes, p)
		algs = append(algs, algFixedWindow)
		locks = append(locks, 0)
	}
	q := "SELECT " + s.quoted + "." + cs[0].cfg.Durability.table("reset") + "($1, $2, $3, $4)"
	err := s.exec(func(mode pgx.QueryExecMode) error {
		_, err := s.db.Exec(ctx, q, mode, prefixes, []byte(key), algs, locks)
		return err
	})
	if err != nil {
		return wrapErr(ctx, op, err)
	}
	return nil
}

// Cleanup deletes every expired row of this counter's prefix (counters,
// sliding-log entries, idempotency records), in statements of up to
// CleanupBatch rows per table, and returns how many it deleted. Use it from
// a scheduled job when inline cleanup is disabled or a prefix is retired.
// Rows are "expired" by the database clock; Cleanup never changes a
// decision. Errors wrap the pgx error; the count is what was deleted before
// the error.
func (c *Counter) Cleanup(ctx context.Context) (int64, error) {
	if err := c.store.ensureSchema(ctx); err != nil {
		return 0, err
	}
	// Rows that expired at or before now: before now + 1 µs; for a
	// counter with a Period, PeriodKeep before that.
	keep := int64(-1)
	if c.single != nil {
		keep = c.keepUS
	}
	q := "SELECT r[1], r[2], r[3] FROM " + c.store.quoted + "." + c.cfg.Durability.table("cleanup") +
		"($1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - " + strconv.FormatInt(keep, 10) + ", $2) AS r"
	var total int64
	for {
		var a, b, cc int64
		err := c.store.exec(func(mode pgx.QueryExecMode) error {
			return c.store.db.QueryRow(ctx, q, mode, c.cfg.Prefix, c.batch).Scan(&a, &b, &cc)
		})
		if err != nil {
			return total, wrapErr(ctx, "cleanup", err)
		}
		total += a + b + cc
		if a < c.batch && b < c.batch && cc < c.batch {
			return total, nil
		}
	}
}

// idempotencyRecord returns the idempotency key that a take or refund
// records: the tag of its operation (takeTag or refundTag), so that takes
// and refunds keep separate records, then scope, then the caller's key.
func idempotencyRecord(op int64, takeTag, refundTag byte, scope []byte, idem string) []byte {
	tag := takeTag
	if op == opRefund {
		tag = refundTag
	}
	b := make([]byte, 0, 1+len(scope)+len(idem))
	b = append(b, tag)
	b = append(b, scope...)
	return append(b, idem...)
}

// logLockID is the advisory lock that serialises the sliding-log decisions of
// one (durability, prefix, key): a hash of a length-prefixed encoding, so no
// two distinct triples share an input.
func logLockID(d Durability, prefix, key string) int64 {
	b := make([]byte, 0, 32+len(prefix)+len(key))
	b = append(b, "ratekit/sliding_log/"...)
	b = append(b, d.String()...)
	b = appendLenPrefixed(b, prefix)
	b = appendLenPrefixed(b, key)
	return hashBytes(b)
}

// hashBytes returns the first 8 bytes of SHA-256(b), big-endian, as a signed
// integer: the 64-bit advisory lock key of b, as pglock.HashKey computes it
// for a name.
func hashBytes(b []byte) int64 {
	sum := sha256.Sum256(b)
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

func appendLenPrefixed(b []byte, s string) []byte {
	n := len(s)
	b = append(b, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(b, s...)
}

// clockSkewCode is the SQLSTATE the composite function raises when the
// database clock lies outside the period bounds a client sent.
const clockSkewCode = "RK001"

// wrapErr wraps a pgx error with the operation and, when ctx has ended,
// ctx.Err(), so that errors.Is(err, context.DeadlineExceeded) holds whatever
// pgx reported.
func wrapErr(ctx context.Context, op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == clockSkewCode {
		return fmt.Errorf("pgstore: %s: %w: %w", op, ratekit.ErrClockSkew, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("pgstore: %s: %w (%w)", op, cerr, err)
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}

// parseResult parses the text form of the decision functions' result, five
// bigints such as "{1,4,0,123,0}", into out, and reports whether raw was
// exactly that.
func parseResult(raw []byte, out *[5]int64) bool {
	return parseInts(raw, out[:])
}
