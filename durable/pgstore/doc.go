// Package pgstore keeps ratekit's exact counters in PostgreSQL through
// github.com/jackc/pgx/v5. Create one [Store] per pool with [New] and pass
// it to the limiters of package durable, which decide on it; this package
// creates the schema ([Store.Migrate], [SchemaSQL]) and sets up pools for
// serverless functions ([ServerlessPoolConfig]). Package pglock, beside it,
// takes PostgreSQL advisory locks.
//
// # One round trip per decision
//
// Each algorithm is a PL/pgSQL function created by the schema SQL. A
// decision is one SELECT of that function: one network round trip, one
// implicit transaction, no BEGIN/COMMIT from the client. Single-row
// algorithms (fixed window, sliding window, token bucket) first lock the
// key's row and read its state (SELECT … FOR UPDATE; a take creates a
// missing row), which serialises concurrent decisions on a key, then read
// the clock and decide on the state read under the lock, writing the row
// (UPDATE by its ctid) only when they admit: a denial writes nothing and
// reads nothing more. The sliding log touches many rows, so its function
// first takes a transaction-level advisory lock on a 64-bit hash of
// (prefix, key), then reads the clock and counts. Time is the database's
// clock_timestamp(), read once per decision and only after the key's lock
// is held (a peek, which locks nothing, reads it after the state). So the
// decisions on a key see non-decreasing times in the order they commit, and
// a decision's Remaining is exact: the takes of a concurrent burst on a
// fresh key report the distinct values Quota-1 … 0 when no unit frees up
// during the burst.
//
// # Several policies, one decision
//
// A durable composite ("10 a second and 1,000 a day") is one more function
// call:
// it locks every policy's key (row lock, or advisory lock for a sliding log)
// in one fixed order, by prefix in byte order then key, so that composites
// naming the same keys in any order never deadlock, then reads the clock
// once, and takes from every policy or, when any denies, from none. Its
// idempotency record covers the whole decision and is written in the same
// transaction. Its counters are the single limiters' rows: a limiter with
// the same prefix sees and keeps the same counts.
//
// # Coalescing under concurrency
//
// A [Store] keeps at most [Config.MaxInFlight] decisions in flight
// ([DefaultMaxInFlight], 2). Below that, a decision goes alone at once on
// its caller's goroutine, so a lone caller waits for nothing. Beyond it,
// decisions wait in a queue, and when a decision in flight ends, the
// goroutine of one waiting caller sends the whole queue as one statement:
// it passes the decisions as array arguments to one server-side function,
// which calls each decision's function in turn, in (durability, prefix,
// key, idempotency key) order, in one implicit transaction. That is one
// round trip, one parse and one commit for all of them. Each decision is decided exactly as if alone: the same function,
// its own clock reading, and it sees every decision before it, including
// earlier ones on the same key in the same batch. Because every batch takes
// its keys' locks in the same order, two batches cannot deadlock; a batch
// carries at most one decision per key with an idempotency key (sorted
// first among that key's decisions), so it locks records in the order a
// lone decision does. Inline cleanup of a batch runs after its decisions
// and skips locked rows, so it never waits while the batch holds locks.
//
// One commit serves the batch: it is asynchronous (synchronous_commit off)
// unless a decision in it is on logged tables with a synchronous commit
// (durable.Config.SynchronousCommit), in which case every decision of the
// batch waits for the flush. A statement the server refuses (an error
// response) rolled back whole, so none of its decisions was applied; each
// caller then sends its own decision alone, and only a decision that fails
// alone fails its caller. Any other failure (a connection lost mid-flight,
// a deadline) goes to every caller of the batch, whose decisions may or may
// not have been applied. A caller returns at its own context's end; a
// decision whose caller left before its batch was sent is never sent. The
// batch's round trip ends at the latest deadline of its callers (the
// sender's), or when all of them have left. The statement holds no session
// state and prepares nothing, so it works through PgBouncer in transaction
// mode and in exec or simple-protocol mode alike.
//
// # Tables and keys
//
// All limiters share three tables per durability, keyed by (prefix, key):
// counters, log (sliding-log entries) and idempotency. Keys are stored as
// bytea, so every Go string is stored exactly as given, including NUL bytes
// and invalid UTF-8; keys longer than ratekit.MaxKeyLen are refused before
// the database is contacted. Prefixes must be valid ratekit policy names and
// travel as query parameters; the schema name, an identifier, is restricted
// to [a-z_][a-z0-9_]* and double-quoted. Every expiring row has an
// expires_at_us column indexed together with its prefix, through which
// inline cleanup (a decision deletes up to CleanupBatch rows of its own
// prefix that expired more than one window ago, with probability
// CleanupProbability, skipping rows other decisions hold) and durable's
// Limiter.Cleanup (every expired row) find their rows. The functions run with
// enable_seqscan off, so that every look-up goes through an index whatever
// the statistics say: plans kept from when a table was tiny, or expiry
// estimates from statistics older than the clock, would otherwise scan a
// whole table while a decision holds its key's lock. No goroutine runs in
// the background.
//
// # Durability
//
//   - UNLOGGED tables (durable.Unlogged) write no WAL. PostgreSQL empties them
//     after a crash or an immediate shutdown and does not replicate them, so
//     every key starts again with a full quota after a crash or failover.
//     For abuse and spam counters.
//   - Logged tables (durable.Logged) survive crashes and replicate. For billing.
//   - synchronous_commit is off per decision by default: the function calls
//     set_config('synchronous_commit', 'off', true), which lasts until the
//     end of the decision's own transaction and leaves no session state
//     behind (a function-level SET clause would not do: it is undone before
//     the commit). A server crash can then lose the last few hundred
//     milliseconds of committed decisions (up to 3×wal_writer_delay), which
//     reappear as unused quota. With durable.Config.SynchronousCommit the
//     server's own setting (on by default) applies and a decision is durable
//     when it returns.
//
// # PgBouncer and RDS Proxy
//
// A Store keeps no session state and creates no server-side prepared
// statements: it sends each statement with pgx.QueryExecModeExec (the
// unnamed statement of the extended protocol, one round trip), or simple
// protocol with [Config.SimpleProtocol], whatever the pool's default mode
// is. It therefore works unchanged through PgBouncer in transaction pooling
// mode and through RDS Proxy, which multiplexes the extended protocol's
// unnamed statements since 2023 (AWS Database Blog, "Amazon RDS Proxy
// multiplexing support for PostgreSQL Extended Query Protocol"). The
// synchronous_commit change happens inside the function, so a proxy sees no
// SET or set_config statement to pin on. For your own queries on the
// same pool, pgx's default mode (cache_statement) fails through PgBouncer in
// transaction mode with "prepared statement … already exists"; add
// default_query_exec_mode=exec to the connection string.
//
// Session-level advisory locks (pglock.Lock, pglock.TryLock) need a session
// and do not work through a pooler in transaction mode: the lock would stay
// on a server connection that other clients then use, and Unlock could run
// on another one. Point those at PostgreSQL directly (or a session-mode
// pool), or use pglock.LockTx inside a transaction, which works through any
// pooler.
//
// # Pool settings for serverless functions
//
// One function instance serves one request at a time (on Lambda), so a
// small pool is enough and keeps the database's connection count in check.
// Build it with [ServerlessPoolConfig], passing the Guard's Timeout:
//
//	cfg, err := pgxpool.ParseConfig("postgres://user@host/db?sslmode=require&default_query_exec_mode=exec&pool_max_conns=2")
//	…
//	pool, err := pgxpool.NewWithConfig(ctx, pgstore.ServerlessPoolConfig(cfg, timeout))
//
// A frozen instance keeps its TCP connections, but a NAT gateway or load
// balancer may drop them while it sleeps without a FIN or RST (AWS's NAT
// gateway after 350 s idle): after the thaw they look open and answer
// nothing. ServerlessPoolConfig pings a connection idle for more than a
// second within timeout/4 before using it, closes the other connections
// that sat through the same silence without pinging them, frees the pool
// slot of a broken connection at once (pgx would otherwise drain it for up
// to 15 s first), retires connections idle for a minute, and dials with TCP
// keepalive and, on Linux, TCP_USER_TIMEOUT. After a thaw in which every
// pooled connection went silent, decisions then succeed on new connections
// at once or after at most one failure; give every decision a context
// deadline. Without it, set at least pool_ping_timeout below the decision
// deadline and pool_max_conn_idle_time below the NAT's idle limit, and
// expect a pool of two to fail for about 15 s after such a thaw.
//
// A Store retries a statement only when pgx reports that nothing was sent
// (pgconn.SafeToRetry) or, for a batch, when the server refused it as a
// whole (nothing applied); any other failure is returned, because a retry
// could count the request twice. After such an error the request may or may not
// have been counted: retry with the same [ratekit.Request.IdempotencyKey]
// to make it count once.
//
// # When to move on
//
// Each decision is a short write transaction on the primary. Watch
// pg_stat_activity (rate-limit statements among the active ones, waits on
// Lock/transactionid for hot keys) and the decisions' p99 latency; when they
// take a noticeable share of the database or p99 passes your budget, move
// abuse limits to tokenbucket over Redis and keep this store for the quotas
// that are money.
package pgstore
