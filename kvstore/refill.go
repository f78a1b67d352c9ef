package kvstore

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Refill describes a value that refills linearly with time up to a maximum:
// the level of a token bucket, in integer units.
//
// Rate is in units per microsecond, the resolution of the stores' clocks
// (the Redis stores step it in whole milliseconds: see [ClockStepper]). Because
// both numbers are integers, refill is exact: no fraction of a unit is lost
// or invented however the requests fall, so the level never drifts and never
// goes negative. A limiter picks its unit so that its refill rate is a whole
// number of units per microsecond (tokenbucket uses 1/D of a token, where D is
// the refill period in microseconds divided by its greatest common divisor
// with the tokens per period).
type Refill struct {
	// Burst is the bucket's capacity, the most units it holds, from 1 to
	// [MaxValue]. An absent key reads as a full bucket, Burst units.
	Burst int64

	// Rate is the number of units added per microsecond, from 1 to Burst.
	Rate int64
}

// Validate returns an error matching [ErrInvalidRefill] when Burst or Rate is
// out of range.
func (r Refill) Validate() error {
	if r.Burst < 1 || r.Burst > MaxValue {
		return fmt.Errorf("%w: burst %d is not between 1 and 2^52", ErrInvalidRefill, r.Burst)
	}
	if r.Rate < 1 || r.Rate > r.Burst {
		return fmt.Errorf("%w: rate %d is not between 1 and burst %d", ErrInvalidRefill, r.Rate, r.Burst)
	}
	return nil
}

// Level returns the level of rec at time now (microseconds since the Unix
// epoch) and the time it is current at. ok false (no record) reads as a full
// value at now. A stored value outside [0, Burst] is clamped into it. When now
// is not after rec.Time (a clock that stepped back, or the same microsecond)
// nothing refills and the level stays current at rec.Time, so a clock that
// steps back never creates units.
func (r Refill) Level(rec Record, ok bool, now int64) (level, at int64) {
	if !ok {
		return r.Burst, now
	}
	v := min(max(rec.Value, 0), r.Burst)
	if now <= rec.Time {
		return v, rec.Time
	}
	// The refill elapsed*Rate, in 128 bits so that it cannot overflow:
	// the value is full when it covers the gap to Burst.
	hi, lo := bits.Mul64(uint64(now-rec.Time), uint64(r.Rate))
	if gap := uint64(r.Burst - v); hi != 0 || lo >= gap {
		return r.Burst, now
	}
	return v + int64(lo), now
}

// Apply is the reference semantics of [Atomic.Update]: it refills rec to now
// with [Refill.Level], applies op with n units and returns the result, the
// record to store and whether the store must be written. A refused take and
// a peek write nothing. When write is true and next.Value equals Burst the key
// may be deleted instead, since an absent key reads as full.
//
// Apply returns [ErrInvalidRefill] for an invalid r and [ErrInvalidOp] for an
// unknown op or an n outside its range. It is a pure function.
func (r Refill) Apply(rec Record, ok bool, now int64, op Op, n int64) (res OpResult, next Record, write bool, err error) {
	if err := r.Validate(); err != nil {
		return OpResult{}, Record{}, false, err
	}
	if err := r.checkOp(op, n); err != nil {
		return OpResult{}, Record{}, false, err
	}
	level, at := r.Level(rec, ok, now)
	switch op {
	case OpTake:
		if level < n {
			return OpResult{Remaining: level}, Record{}, false, nil
		}
		level -= n
		return OpResult{OK: true, Remaining: level}, Record{Value: level, Time: at}, true, nil
	case OpPeek:
		return OpResult{OK: level >= n, Remaining: level}, Record{}, false, nil
	default: // OpRefund
		if n >= r.Burst-level {
			level = r.Burst
		} else {
			level += n
		}
		return OpResult{OK: true, Remaining: level}, Record{Value: level, Time: at}, true, nil
	}
}

// CheckOp returns an error matching [ErrInvalidOp] for an unknown op or an n
// outside its range (see [Op]). Stores call it before contacting a server.
func (r Refill) CheckOp(op Op, n int64) error { return r.checkOp(op, n) }

func (r Refill) checkOp(op Op, n int64) error {
	switch op {
	case OpTake, OpPeek:
		if n < 1 || n > r.Burst {
			return fmt.Errorf("%w: n %d is not between 1 and burst %d", ErrInvalidOp, n, r.Burst)
		}
	case OpRefund:
		if n < 1 {
			return fmt.Errorf("%w: refund of %d units", ErrInvalidOp, n)
		}
	default:
		return fmt.Errorf("%w: op %d", ErrInvalidOp, op)
	}
	return nil
}

// TimeToFull returns how long a value at level takes to refill to Burst,
// rounded up to the microsecond: 0 for a full value.
func (r Refill) TimeToFull(level int64) time.Duration {
	return r.TimeUntil(level, r.Burst)
}

// TimeUntil returns how long a value at level takes to reach target units,
// rounded up to the microsecond: 0 when level is already at least target,
// and the longest time.Duration (about 292 years) when it takes longer.
// target must not exceed Burst.
func (r Refill) TimeUntil(level, target int64) time.Duration {
	if level >= target {
		return 0
	}
	gap := target - max(level, 0)
	us := (gap + r.Rate - 1) / r.Rate
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}
