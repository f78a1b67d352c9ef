package kvstore

import (
	"errors"
	"fmt"

	"github.com/ratekit/ratekit"
)

// MaxPeriodBound is the latest period boundary a [PeriodBounds] accepts,
// in microseconds since the Unix epoch: 2^53 − 1 (in the year 2255), so
// that the Redis stores' scripts compare the clock with the boundaries in
// exact integers.
const MaxPeriodBound = 1<<53 - 1

// PeriodBounds makes an [Update] a period
// counter instead of a token bucket: a count of at most Quota units in the
// period that contains the STORE's clock, chosen among three consecutive
// periods that the client computed with its own clock and calendar.
//
// Bounds are four boundaries b0 < b1 < b2 < b3, in microseconds since the
// Unix epoch (0 to [MaxPeriodBound]): the period before the one that
// contains the client's clock, that period, and the one after, [b0, b1),
// [b1, b2) and [b2, b3). The store reads its own clock once for the whole
// call and counts in the period that contains it; a store clock outside
// [b0, b3) fails the call with [ratekit.ErrClockSkew] and nothing changes.
// The store reads its clock after the client read its own, so the bounds
// tolerate a difference of at least one period between the clocks, the
// latency between the two readings included: a client sends bounds of
// periods far longer than that latency. So decisions follow one clock, the
// store's, and calendar arithmetic (months, time zones, daylight saving)
// stays with the client.
//
// The count of a key is the units taken in the current period, less
// refunds: a record of an earlier period counts as zero, and a record of a
// period that started later than the current one (the client's periods
// moved back, say a billing anchor changed) keeps its count, so a change
// of periods never grants a fresh one. Quota is an argument of each call,
// not part of the record: a call with a larger quota leaves more
// remaining, one with a smaller quota never makes the count smaller.
//
// [PeriodBounds.Apply] is the reference semantics. A PeriodBounds is a
// value; it is safe for concurrent use when not modified.
type PeriodBounds struct {
	// Bounds are b0 < b1 < b2 < b3, in microseconds since the Unix epoch.
	Bounds [4]int64

	// Quota is the most units counted in a period, from 1 to [MaxValue].
	Quota int64
}

// Errors of period counters.
var (
	// ErrInvalidPeriod is returned for a [PeriodBounds] whose bounds are
	// not increasing or out of range, whose Quota is out of range, or that
	// comes with a non-zero Refill.
	ErrInvalidPeriod = errors.New("kvstore: invalid period")
)

// PeriodCounter is implemented by [MultiAtomic] stores whose UpdateMulti
// also keeps period counters: updates whose Period is set ([PeriodBounds]),
// decided with the token buckets of the same call, all or nothing, on one
// reading of the store's clock. memstore, redisstore, rueidisstore and
// dynamostore do. A store that does not refuses such updates with
// [ErrInvalidPeriod] through [CheckMulti].
//
// Beyond MultiAtomic's errors, UpdateMulti returns an error matching
// [ErrInvalidPeriod] or [ErrInvalidOp] for an invalid counter (checked
// before anything is read) and [ratekit.ErrClockSkew] when its clock is outside a
// counter's bounds; nothing changes then.
//
// A period counter keeps one record under its key, a count and the start of
// its period, until some time after the period's end. A key is used either
// as a token bucket or as a period counter, never both: the Redis stores
// report the other kind's record as [ErrMalformedRecord], and memstore
// cannot tell them apart.
type PeriodCounter interface {
	MultiAtomic

	// CountsPeriods reports whether UpdateMulti keeps period counters. A
	// store that wraps another reports what the wrapped store does.
	CountsPeriods() bool
}

// Validate returns an error matching [ErrInvalidPeriod] when the bounds
// are not 0 ≤ b0 < b1 < b2 < b3 ≤ [MaxPeriodBound] or Quota is not from 1
// to [MaxValue].
func (p PeriodBounds) Validate() error {
	b := p.Bounds
	if b[0] < 0 || b[0] >= b[1] || b[1] >= b[2] || b[2] >= b[3] || b[3] > MaxPeriodBound {
		return fmt.Errorf("%w: bounds %v are not increasing from 0 to 2^53-1 microseconds", ErrInvalidPeriod, b)
	}
	if p.Quota < 1 || p.Quota > MaxValue {
		return fmt.Errorf("%w: quota %d is not from 1 to 2^52", ErrInvalidPeriod, p.Quota)
	}
	return nil
}

// CheckOp returns an error matching [ErrInvalidOp] for an unknown op or an
// n outside its range: 1 to Quota for OpTake and OpPeek, at least 1 for
// OpRefund.
func (p PeriodBounds) CheckOp(op Op, n int64) error {
	switch op {
	case OpTake, OpPeek:
		if n < 1 || n > p.Quota {
			return fmt.Errorf("%w: n %d is not from 1 to the quota %d", ErrInvalidOp, n, p.Quota)
		}
	case OpRefund:
		if n < 1 {
			return fmt.Errorf("%w: refund of %d units", ErrInvalidOp, n)
		}
	default:
		return fmt.Errorf("%w: unknown op %d", ErrInvalidOp, op)
	}
	return nil
}

// Pick returns which period contains now (microseconds since the Unix
// epoch): 1, 2 or 3 for [b0, b1), [b1, b2) or [b2, b3), and 0 when now is
// outside [b0, b3).
func (p PeriodBounds) Pick(now int64) int {
	for i := 1; i <= 3; i++ {
		if now >= p.Bounds[i-1] && now < p.Bounds[i] {
			return i
		}
	}
	return 0
}

// Apply is the reference semantics of a period counter in
// [MultiAtomic.UpdateMulti] of a [PeriodCounter]: it picks the period that contains now, reads
// the count of rec in it (ok false, no record, is a count of zero), applies
// op with n units and returns the result, the record to store and whether
// the store must be written. The record holds the count in Value and the
// start of its period in Time; a store keeps it at least until the end of
// the period picked, Bounds[res.Period].
//
//   - OpTake counts n when the count plus n is at most Quota; otherwise it
//     changes nothing (OK false).
//   - OpPeek reports whether n more units fit, and writes nothing.
//   - OpRefund lowers the count by n, never below zero, in the current
//     period only; a refund to a count of zero writes nothing (write
//     false), and one that brings the count to zero may delete the record
//     instead of writing it, since an absent record counts zero.
//
// Apply returns [ErrInvalidPeriod] for invalid bounds, [ErrInvalidOp] for an
// unknown op or an n outside its range, and [ratekit.ErrClockSkew] when now is
// outside [b0, b3). It is a pure function.
func (p PeriodBounds) Apply(rec Record, ok bool, now int64, op Op, n int64) (res OpResult, next Record, write bool, err error) {
	if err := p.Validate(); err != nil {
		return OpResult{}, Record{}, false, err
	}
	if err := p.CheckOp(op, n); err != nil {
		return OpResult{}, Record{}, false, err
	}
	idx := p.Pick(now)
	if idx == 0 {
		return OpResult{}, Record{}, false, fmt.Errorf("kvstore: %w: the store's clock %d µs is outside [%d, %d)", ratekit.ErrClockSkew, now, p.Bounds[0], p.Bounds[3])
	}
	used, start := int64(0), p.Bounds[idx-1]
	if ok && rec.Time >= start {
		used, start = max(rec.Value, 0), rec.Time
	}
	res = OpResult{OK: true, Now: now, Period: idx}
	switch op {
	case OpTake:
		if used+n <= p.Quota {
			used += n
			write = true
		} else {
			res.OK = false
		}
	case OpPeek:
		res.OK = used+n <= p.Quota
	case OpRefund:
		if used > 0 {
			used = max(used-n, 0)
			write = true
		}
	}
	res.Used, res.Remaining = used, max(p.Quota-used, 0)
	return res, Record{Value: used, Time: start}, write, nil
}
