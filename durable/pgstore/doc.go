// Package pgstore keeps ratekit's exact counters in PostgreSQL through
// github.com/jackc/pgx/v5. Create one [Store] per pool with [New] and pass
// it to the limiters of package durable, which decide on it. This package
// also creates the schema ([Store.Migrate], [SchemaSQL]) and sets up pools
// for serverless functions ([ServerlessPoolConfig]). Package pglock, beside
// it, takes PostgreSQL advisory locks.
//
// A decision is one statement, one round trip (one more where a
// connection first prepares it) and one implicit transaction, on the
// database's clock: for a take of a fixed window or token bucket that goes
// alone without an idempotency key, an upsert; otherwise a SELECT of the
// algorithm's PL/pgSQL function. A refused upsert writes nothing, and the
// function then decides the take: a second statement, which lone takes
// skip while most of a limiter's takes are refused. A key's row lock (an
// advisory lock for a sliding log) serialises the decisions on that key, so
// counts are exact however many processes share the database. A composite
// locks its keys in one fixed order, so composites never deadlock, and it
// takes from every policy or from none.
//
// A decision goes alone, at once, unless its key is hot (a statement in
// flight holds it), [Config.MaxInFlight] statements are in flight
// ([DefaultMaxInFlight], 2, at most the pool's size), a batch is in flight
// or decisions already wait; waiting decisions travel together in one
// statement and one commit, each decided exactly as if alone. No goroutine
// runs in the background.
//
// All limiters share three tables per durability (counters, log and
// idempotency), keyed by (prefix, key). Keys are stored byte for byte.
// UNLOGGED tables (durable.Unlogged) start every key afresh after a crash
// or failover; logged tables (durable.Logged) keep their counts. By default
// a server crash can lose up to 3×wal_writer_delay of committed decisions;
// with durable.Config.SynchronousCommit a decision is durable when it
// returns, and a failover to a synchronous standby keeps it. To follow a
// failover, give the pool every server in one connection string with
// target_session_attrs=read-write.
//
// A Store keeps no session state and sends its statements in the pool's
// query exec mode: pgx's default prepares each statement once per
// connection. Behind PgBouncer in transaction mode or RDS Proxy, add
// default_query_exec_mode=exec to the connection string (see [New]).
// Build pools for serverless functions with [ServerlessPoolConfig], and
// give every decision a context deadline.
//
// A Store retries a statement only when nothing was applied. After any
// other error the request may or may not have been counted: retry with the
// same ratekit.Request.IdempotencyKey to make it count once.
//
// See docs/postgres.md in the repository for the locking and batching
// rules, the tables, durability, PgBouncer and RDS Proxy, pool settings and
// thaw behaviour, and when to move to another store.
package pgstore
