// Package pglock takes PostgreSQL advisory locks: application-defined locks
// on a number, which PostgreSQL holds for a session ([Lock], [TryLock]) or
// for a transaction ([LockTx], [TryLockTx]), for "one worker per job" or
// "one writer per invoice" without a lock service beside the database.
//
// A lock is named by a [LockKey]: a 64-bit key ([Key] hashes a name with
// SHA-256, [KeyID] takes a number) or a pair of 32-bit integers, a namespace
// and an id ([NamespacedKey], [NamespacedKeyID]); PostgreSQL keeps the two
// forms apart. Every call takes several keys in one global order, so two
// callers locking overlapping sets never deadlock, and a blocking call waits
// only until shortly before its context's deadline (PostgreSQL's
// lock_timeout, so the server gives up first and the connection survives).
// "Not acquired" is [ErrLockNotAcquired].
//
// Session-level locks need a session: through PgBouncer in transaction mode
// (or RDS Proxy, which pins) the lock would stay on a server connection that
// other clients then use, and the unlock could run on another one. Take them
// through a direct connection or a session-mode pool, or use [LockTx] inside
// a transaction, which works through any pooler.
package pglock

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrLockNotAcquired is returned (wrapped) when an advisory lock could not be
// acquired: a try-once call found it held, or a blocking call's lock_timeout
// (derived from the context deadline) expired. It is an ordinary outcome of
// contention, not a failure of the database.
var ErrLockNotAcquired = errors.New("pglock: advisory lock not acquired")

// HashKey returns a 64-bit advisory lock key for name: the first 8 bytes of
// SHA-256(name), big-endian, as a signed integer. Unlike CRC32 or
// PostgreSQL's hashtext (32 bits, so collisions are likely after some tens of
// thousands of names), two names collide with probability 2⁻⁶⁴. The same
// value in SQL is
//
//	('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 16))::bit(64)::bigint
func HashKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// LockKey identifies one PostgreSQL advisory lock. PostgreSQL keeps two
// separate key spaces: one bigint ([Key], [KeyID]) and two int4 values
// ([NamespacedKey], [NamespacedKeyID]); a lock in one never conflicts with a
// lock in the other. The zero LockKey is the bigint lock 0.
type LockKey struct {
	pair bool
	a    int64 // the bigint key, or the namespace
	b    int32 // the object id in the pair form
}

// Key returns the bigint-form lock for name, hashed with [HashKey].
func Key(name string) LockKey { return LockKey{a: HashKey(name)} }

// KeyID returns the bigint-form lock id, as pg_advisory_lock(id).
func KeyID(id int64) LockKey { return LockKey{a: id} }

// NamespacedKey returns the two-integer lock (namespace, h) where h is the
// first 4 bytes of SHA-256(name): the namespace (one per use case, say one
// for "invoice" and one for "job") keeps unrelated names apart, and within a
// namespace two names share a lock with probability 2⁻³². Use [Key] when a
// shared lock between two names would be a problem.
func NamespacedKey(namespace int32, name string) LockKey {
	sum := sha256.Sum256([]byte(name))
	return LockKey{pair: true, a: int64(namespace), b: int32(binary.BigEndian.Uint32(sum[:4]))}
}

// NamespacedKeyID returns the two-integer lock (namespace, id), as
// pg_advisory_lock(namespace, id).
func NamespacedKeyID(namespace, id int32) LockKey {
	return LockKey{pair: true, a: int64(namespace), b: id}
}

// String returns the lock as PostgreSQL's pg_locks shows it: "id" or
// "namespace,id".
func (k LockKey) String() string {
	if k.pair {
		return strconv.FormatInt(k.a, 10) + "," + strconv.FormatInt(int64(k.b), 10)
	}
	return strconv.FormatInt(k.a, 10)
}

func (k LockKey) args(fn string) (string, []any) {
	if k.pair {
		return "SELECT " + fn + "($1::int4, $2::int4)", []any{int32(k.a), k.b}
	}
	return "SELECT " + fn + "($1::int8)", []any{k.a}
}

// sortKeys returns keys deduplicated in one global order (bigint form first,
// then by value), the order in which every caller acquires them, so that two
// callers can never wait for each other in a cycle.
func sortKeys(keys []LockKey) []LockKey {
	s := slices.Clone(keys)
	slices.SortFunc(s, func(x, y LockKey) int {
		if x.pair != y.pair {
			if x.pair {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(x.a, y.a), cmp.Compare(x.b, y.b))
	})
	return slices.Compact(s)
}

// lockTimeout returns the lock_timeout value for ctx: the time left until its
// deadline less a margin (a fifth of it, between 5 ms and 250 ms) in whole
// milliseconds, at least 1, or "0" (wait forever) when ctx has no deadline.
// The margin lets the server give up first: when the context's deadline
// fires mid-statement instead, pgx closes the connection, which would end the
// caller's transaction.
func lockTimeout(ctx context.Context) string {
	d, ok := ctx.Deadline()
	if !ok {
		return "0"
	}
	left := time.Until(d)
	margin := min(max(left/5, 5*time.Millisecond), 250*time.Millisecond)
	ms := (left - margin).Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10) + "ms"
}

// wrapErr wraps a pgx error with the operation and, when ctx has ended,
// ctx.Err(), so that errors.Is(err, context.DeadlineExceeded) holds whatever
// pgx reported.
func wrapErr(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("pglock: %s: %w (%w)", op, cerr, err)
	}
	return fmt.Errorf("pglock: %s: %w", op, err)
}

func isLockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// SessionLock is a set of session-level advisory locks held on a connection
// taken out of a pool for that purpose. The locks are held until Unlock, or
// until the connection ends (the process exits or the server closes it), so
// they suit "one worker per job" even when the holder crashes. A SessionLock
// is not safe for concurrent use.
//
// Session-level locks need a session: through PgBouncer in transaction mode
// (or RDS Proxy, which pins) the lock would belong to a server connection
// that other clients' transactions then use. Take session locks through a
// direct connection or a session-mode pool, or use [LockTx] inside a
// transaction, which works through any pooler.
type SessionLock struct {
	conn *pgx.Conn
	keys []LockKey
}

// Lock acquires the advisory locks keys on a connection hijacked from pool,
// in sorted order (so two callers locking overlapping sets never deadlock),
// waiting until shortly before ctx's deadline: the wait is bounded by
// PostgreSQL's lock_timeout, set from the deadline less a margin of a fifth of
// the time left (5 to 250 ms), so the server stops waiting before the caller
// does. When the deadline passes first, Lock releases what it took,
// closes the connection and returns an error matching [ErrLockNotAcquired]
// (and context.DeadlineExceeded when the context ended). Other errors wrap
// the pgx error. The connection does not count against the pool's MaxConns
// while the lock is held.
func Lock(ctx context.Context, pool *pgxpool.Pool, keys ...LockKey) (*SessionLock, error) {
	return sessionLock(ctx, pool, keys, true)
}

// TryLock is Lock without waiting: it returns an error matching
// [ErrLockNotAcquired], having released any lock it took, as soon as one of
// keys is held by another session.
func TryLock(ctx context.Context, pool *pgxpool.Pool, keys ...LockKey) (*SessionLock, error) {
	return sessionLock(ctx, pool, keys, false)
}

func sessionLock(ctx context.Context, pool *pgxpool.Pool, keys []LockKey, wait bool) (*SessionLock, error) {
	if len(keys) == 0 {
		return nil, errors.New("pglock: no keys")
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, wrapErr(ctx, "acquire connection", err)
	}
	conn := pc.Hijack()
	l := &SessionLock{conn: conn}
	fail := func(err error) (*SessionLock, error) {
		// Closing the session releases every session-level lock it holds.
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Close(closeCtx)
		return nil, err
	}
	if wait {
		if _, err := conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)", pgx.QueryExecModeExec, lockTimeout(ctx)); err != nil {
			return fail(wrapErr(ctx, "set lock_timeout", err))
		}
	}
	for _, k := range sortKeys(keys) {
		if wait {
			sql, args := k.args("pg_advisory_lock")
			_, err = conn.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
			if isLockNotAvailable(err) {
				return fail(fmt.Errorf("%w: %v: %w", ErrLockNotAcquired, k, err))
			}
		} else {
			var ok bool
			sql, args := k.args("pg_try_advisory_lock")
			err = conn.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(&ok)
			if err == nil && !ok {
				return fail(fmt.Errorf("%w: %v is held by another session", ErrLockNotAcquired, k))
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return fail(fmt.Errorf("%w: %v: %w", ErrLockNotAcquired, k, wrapErr(ctx, "lock", err)))
			}
			return fail(wrapErr(ctx, "lock "+k.String(), err))
		}
		l.keys = append(l.keys, k)
	}
	return l, nil
}

// Keys returns the locks held, in the order they were acquired.
func (l *SessionLock) Keys() []LockKey { return slices.Clone(l.keys) }

// Unlock releases the locks and closes their connection. Closing the
// connection alone would release them too, so Unlock releases them even when
// the unlock statements fail. Calling Unlock again does nothing.
func (l *SessionLock) Unlock(ctx context.Context) error {
	if l.conn == nil {
		return nil
	}
	conn := l.conn
	l.conn = nil
	_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()", pgx.QueryExecModeExec)
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if cerr := conn.Close(closeCtx); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return wrapErr(ctx, "unlock", err)
	}
	return nil
}

// LockTx acquires the transaction-level advisory locks keys inside tx, in
// sorted order, waiting until shortly before ctx's deadline (PostgreSQL's
// lock_timeout is set from it as for [Lock], for these statements only, and
// restored afterwards). The locks
// are released when tx commits or rolls back. Attempts run inside a
// savepoint, so "not acquired" leaves tx usable and holding none of keys.
// It returns an error matching [ErrLockNotAcquired] when the deadline passed
// first; other errors wrap the pgx error. Transaction-level locks work
// through PgBouncer in transaction mode and RDS Proxy.
func LockTx(ctx context.Context, tx pgx.Tx, keys ...LockKey) error {
	return txLock(ctx, tx, keys, true)
}

// TryLockTx is LockTx without waiting: it returns an error matching
// [ErrLockNotAcquired] as soon as one of keys is held by another session,
// holding none of keys and with tx still usable.
func TryLockTx(ctx context.Context, tx pgx.Tx, keys ...LockKey) error {
	return txLock(ctx, tx, keys, false)
}

func txLock(ctx context.Context, tx pgx.Tx, keys []LockKey, wait bool) error {
	if len(keys) == 0 {
		return errors.New("pglock: no keys")
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return wrapErr(ctx, "savepoint", err)
	}
	fail := func(err error) error {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := sp.Rollback(rbCtx); rerr != nil {
			return errors.Join(err, wrapErr(ctx, "rollback to savepoint", rerr))
		}
		return err
	}
	var saved string
	if wait {
		// SET LOCAL inside the savepoint; the transaction's own value is
		// restored below, again with SET LOCAL, so no session state changes.
		if err := sp.QueryRow(ctx, "SELECT current_setting('lock_timeout')", pgx.QueryExecModeExec).Scan(&saved); err != nil {
			return fail(wrapErr(ctx, "read lock_timeout", err))
		}
		if _, err := sp.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", pgx.QueryExecModeExec, lockTimeout(ctx)); err != nil {
			return fail(wrapErr(ctx, "set lock_timeout", err))
		}
	}
	for _, k := range sortKeys(keys) {
		if wait {
			sql, args := k.args("pg_advisory_xact_lock")
			_, err = sp.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
			if isLockNotAvailable(err) {
				return fail(fmt.Errorf("%w: %v: %w", ErrLockNotAcquired, k, err))
			}
		} else {
			var ok bool
			sql, args := k.args("pg_try_advisory_xact_lock")
			err = sp.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...).Scan(&ok)
			if err == nil && !ok {
				return fail(fmt.Errorf("%w: %v is held by another session", ErrLockNotAcquired, k))
			}
		}
		if err != nil {
			return fail(wrapErr(ctx, "lock "+k.String(), err))
		}
	}
	if wait {
		if _, err := sp.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", pgx.QueryExecModeExec, saved); err != nil {
			return fail(wrapErr(ctx, "restore lock_timeout", err))
		}
	}
	if err := sp.Commit(ctx); err != nil {
		return wrapErr(ctx, "release savepoint", err)
	}
	return nil
}
