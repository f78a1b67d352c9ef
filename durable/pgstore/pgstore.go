package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratekit/ratekit/durable/internal/pgengine"
)

// DB is the part of a pgx connection that a [Store] uses. *pgxpool.Pool
// satisfies it, and so do *pgx.Conn and pgx.Tx (a Store over a transaction
// makes every decision part of that transaction).
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a [Store]. The zero value is valid: schema "ratekit",
// created on first use, queries in the pool's query exec mode (see [New]).
type Config struct {
	// Schema is the PostgreSQL schema that holds the tables and functions
	// (see [ValidateSchemaName]). Empty means [DefaultSchema].
	Schema string

	// DisableAutoMigrate turns off the creation of the schema on first use.
	// Create it beforehand with [SchemaSQL] (or the ratekit-schema command)
	// and give the role that the pool connects as USAGE on the schema,
	// SELECT, INSERT, UPDATE and DELETE on its tables and EXECUTE on its
	// functions.
	DisableAutoMigrate bool

	// SimpleProtocol makes the Store send its statements with pgx's simple
	// protocol (client-side parameter interpolation by pgx) whatever the
	// pool's query exec mode: for poolers that refuse the extended
	// protocol.
	SimpleProtocol bool

	// MaxInFlight bounds the statements the Store has in flight at once,
	// and so when decisions coalesce. A decision is sent alone, at once,
	// on its caller's goroutine, when fewer than MaxInFlight statements
	// are in flight, none of them is a batch or holds one of its keys, and
	// no decision waits: decisions on distinct keys run side by side, one
	// connection each, until the Store is under load. Otherwise (a hot
	// key, every place taken, a batch in flight or a queue already) it
	// waits, and when a statement in flight ends, the goroutine of one
	// waiting caller sends a share of those that wait in one round trip
	// (coalescing), with at most two such batches in flight: one round
	// trip and one commit for all of them, each decided as if alone, in
	// a fixed key order (see [Store]). Zero means [DefaultMaxInFlight];
	// a negative value turns coalescing off. When the DB is a
	// *pgxpool.Pool, MaxInFlight is at most its MaxConns: a decision
	// that finds every connection taken waits in the queue, to go with
	// others, rather than for a connection. A higher MaxInFlight lets more
	// decisions on distinct keys overlap, which pays only where the
	// server's processors are idle while they wait for their commits.
	// docs/postgres.md states the rule and why.
	MaxInFlight int
}

// DefaultMaxInFlight is the bound on a Store's statements in flight used
// when [Config.MaxInFlight] is zero: two callers on distinct keys go side
// by side, each with its own statement; beyond, decisions queue and go to
// PostgreSQL together, where one statement and one commit for many
// decisions cost the server less than one each.
const DefaultMaxInFlight = pgengine.DefaultMaxInFlight

// Store runs ratekit's decisions in PostgreSQL for the limiters of package
// durable that share it. Create one per pool with [New] and pass it to
// every durable.Config; a Store is safe for concurrent use. It holds no
// connection of its own and starts no goroutine: every statement is sent by
// the goroutine of a caller waiting for it. The zero Store is not usable.
//
// Decisions that wait (see [Config.MaxInFlight]), single-key and composite
// alike, go to PostgreSQL together in one round trip and one implicit
// transaction, in lock order (durability, key, prefix, idempotency key).
// Plain takes (no idempotency key) of one fixed-window or token-bucket
// limiter go as one call of a set-based take, which locks their keys,
// reads the clock once and takes each key's total at once; plain takes of
// several such limiters, up to 16, on a *pgxpool.Pool or *pgx.Conn that
// prepares its statements, as a pipeline of their upserts; any other batch
// as one statement that calls each one's decision function in turn. Each
// decision sees every decision before it, in its batch or not; several
// decisions on one key in a batch count one after the other, and each
// reports the state its own take left. A take refused there (a key's first
// take, or a quota's last units) has written nothing; the batch's refused
// takes are then decided by the function, together. The commit is
// asynchronous only when no decision in the batch asks for a synchronous
// commit on logged tables. When the server refuses the
// batch, its transaction rolled back and none of its decisions was
// applied: each caller then sends its own decision alone, so that one
// decision's failure is not another's. A caller whose context ends while
// its decision waits returns at once, and its decision is never sent; one
// whose decision was already sent returns at once too, and the decision may
// be applied.
type Store pgengine.Store

// New returns a Store that runs its statements on db in the query exec mode
// of db's connections when db is a *pgxpool.Pool or a *pgx.Conn, and in
// pgx.QueryExecModeExec for any other DB (a pgx.Tx). In pgx's default mode,
// QueryExecModeCacheStatement, each connection prepares a statement the
// first time it sends it (one more round trip), and PostgreSQL then neither
// parses nor plans it again. Prepared statements tie a session to its
// server connection: behind PgBouncer in transaction mode or RDS Proxy, add
// default_query_exec_mode=exec to the connection string. A Store whose
// prepared statement PgBouncer refuses (no statement of that name on the
// server connection, or one already) sends it again in exec mode, which is
// safe because it never ran, and sends every later statement in exec mode.
//
// New returns an error matching [ratekit.ErrInvalidConfig] for a nil db or
// an invalid schema name. It does not contact the database: with automatic
// migration the schema is created by the first decision (or by
// [Store.Migrate]).
func New(db DB, cfg Config) (*Store, error) {
	s, err := pgengine.New(db, pgengine.Config(cfg))
	if err != nil {
		return nil, err
	}
	return (*Store)(s), nil
}

// Schema returns the name of the schema the Store uses.
func (s *Store) Schema() string { return (*pgengine.Store)(s).Schema() }

// Migrate creates the schema's tables and functions unless they exist, in
// one statement that holds a transaction-level advisory lock while it works,
// so that any number of processes may call it at once. A Store with
// automatic migration calls it before its first decision; later calls cost
// one round trip that finds the version marker and does nothing. Errors wrap
// the database error (and ctx.Err() when ctx ended).
func (s *Store) Migrate(ctx context.Context) error { return (*pgengine.Store)(s).Migrate(ctx) }

// DefaultSchema is the PostgreSQL schema that holds ratekit's tables and
// functions when [Config.Schema] is empty.
const DefaultSchema = pgengine.DefaultSchema

// SchemaVersion is the version of the tables and functions that this package
// creates and calls. The schema SQL creates a marker function named
// ratekit_schema_v<SchemaVersion> last, and automatic migration skips all
// work when it exists.
const SchemaVersion = pgengine.SchemaVersion

// ValidateSchemaName reports whether name can be used as [Config.Schema]:
// 1 to 63 bytes of lower-case ASCII letters, digits and '_', starting with a
// letter or '_'. Schema names are identifiers, which cannot be query
// parameters, so this package only accepts names that need no escaping and
// still double-quotes them. The error matches [ratekit.ErrInvalidConfig].
func ValidateSchemaName(name string) error { return pgengine.ValidateSchemaName(name) }

// SchemaSQL returns the statements that create ratekit's tables, indexes and
// functions in schema. Every statement is idempotent (CREATE … IF NOT EXISTS,
// CREATE OR REPLACE FUNCTION), so running it again is harmless, but
// concurrent runs can fail on PostgreSQL's catalog constraints: run it from
// one migration job, or let [Store] migrate (it serialises concurrent
// migrations with an advisory lock). It returns an error matching
// [ratekit.ErrInvalidConfig] for an invalid schema name (see
// [ValidateSchemaName]).
func SchemaSQL(schema string) (string, error) { return pgengine.SchemaSQL(schema) }

// DefaultSchemaSQL returns [SchemaSQL] for [DefaultSchema]: the statements
// that create every table, index and function this package uses, for users
// who run migrations themselves (set [Config.DisableAutoMigrate]). The SQL
// is rendered on each call from the schema template embedded in the package
// (nothing is built when the package is imported). It is safe for
// concurrent use and cannot fail: the default schema name is valid and the
// embedded template is checked by the package's tests; should it ever be
// broken, DefaultSchemaSQL panics with the template's error.
func DefaultSchemaSQL() string {
	s, err := SchemaSQL(DefaultSchema)
	if err != nil {
		panic(err)
	}
	return s
}
