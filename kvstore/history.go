package kvstore

import (
	"context"
	"errors"
	"time"
)

// PeriodUsage is the count of one period counter ([PeriodBounds]) in one
// period, as a [PeriodHistory] store reports it.
type PeriodUsage struct {
	// Group and Key name the counter: the group and key of the
	// [MultiAtomic.UpdateMulti] calls that counted it.
	Group, Key string

	// Start and End bound the period, [Start, End), in microseconds since
	// the Unix epoch: the bounds of the call that started counting it.
	Start, End int64

	// Used is the units counted in the period, less refunds.
	Used int64
}

// PeriodHistory is implemented by [PeriodCounter] stores that keep the count
// of every period a counter ends, for billing: the call of UpdateMulti that
// moves a counter into a later period also writes, in the same atomic step,
// the count of the period it ends, which the store then keeps for a time its
// configuration sets.
//
// PeriodUsage calls fn, one period at a time, with the count of every period,
// ended or current, of every counter of the non-empty group space whose key
// starts with keyPrefix and whose period starts in [from, to) (microseconds
// since the Unix epoch), skipping periods in which nothing was counted. A
// period's count belongs to one place at any time (the counter while the
// period is its latest, the history once a later period started; a store
// that writes the history in a step of its own may hold it in both for a
// moment, and tells them apart), so each period is reported once, counters
// that move to a later period during the call included, and an ended
// period's count is exact; a current period is reported as it stands when
// read. The order is the store's own
// and is documented by it. fn's error stops the call and is returned as is;
// a ctx that ends stops it with an error wrapping ctx.Err().
//
// Implementations are safe for concurrent use.
type PeriodHistory interface {
	PeriodCounter
	PeriodUsage(ctx context.Context, keyPrefix string, from, to int64, fn func(PeriodUsage) error) error
}

// IdempotentMulti is implemented by [MultiAtomic] stores that can make an
// UpdateMulti call count once per idempotency key: a client or a platform
// (a Lambda retry) that repeats a call after an error or a lost reply
// cannot make it count twice.
//
// UpdateMultiOnce is [MultiAtomic.UpdateMulti] made at most once per group,
// op and id within ttl. The first call that applies op, as UpdateMulti does,
// keeps in the same atomic step a record of id, op and its results (a take
// that was refused changed nothing and is not recorded: its retry is decided
// afresh); a later
// call with the same group, op and id, within ttl of the first, applies
// nothing, writes the recorded results into results (those of the first
// call, whatever its updates) and reports replayed true. A refunding call
// (OpRefund) whose id is that of a recorded take of the same group gives
// nothing back to a counter whose current period started after that take
// (its result reports the counter as it stands), so a refund that crosses a
// period's end takes nothing from the new period. OpPeek is never recorded:
// it is UpdateMulti.
//
// id must be from 1 to [ratekit.MaxKeyLen] bytes and ttl from a second to
// [MaxIdempotencyTTL] ([ErrInvalidIdempotency] otherwise, before anything is
// sent). Its other errors are UpdateMulti's; after an error that leaves the
// caller unable to know whether the call was applied, repeating it with the
// same id applies it at most once in all.
//
// Implementations are safe for concurrent use.
type IdempotentMulti interface {
	MultiAtomic
	UpdateMultiOnce(ctx context.Context, group, id string, ttl time.Duration, op Op, updates []Update, results []OpResult) (replayed bool, err error)
}

// MaxIdempotencyTTL is the longest an [IdempotentMulti] store is asked to
// keep a record of an idempotency key: 32 days, so that a charge can be
// refunded exactly within a monthly billing period.
const MaxIdempotencyTTL = 32 * 24 * time.Hour

// ErrInvalidIdempotency is returned by [IdempotentMulti.UpdateMultiOnce] for
// an id or ttl out of range.
var ErrInvalidIdempotency = errors.New("kvstore: invalid idempotency key or time to live")
