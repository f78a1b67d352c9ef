package kvstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// MultiAtomic is implemented by [Atomic] stores that can update several keys
// as one all-or-nothing step, with one reading of their own clock and in one
// round trip: the token buckets of a composite limit ("10 a second and 1,000
// a day"), each of which must take its units or none may.
//
// UpdateMulti brings the record of every updates[i].Key up to date at the
// store's current time (read once for the whole call) with
// updates[i].Refill, and applies op with updates[i].N units, as
// [Atomic.Update] does for one key, with one difference: for OpTake, units
// are taken from every key or from none. When every key holds its N units,
// each key gives them and every result has OK true; when any key does not,
// nothing is written, and results[i].OK reports whether key i alone held its
// N units (so the caller can tell which keys refused). OpPeek writes nothing
// and reports each key as Update would; OpRefund refunds every key. No other
// caller, single-key Update included, sees some keys of the call updated and
// others not.
//
// results must have the length of updates; UpdateMulti writes results[i]
// for updates[i], in input order, and nothing else. Keys must be distinct
// within a call: a key given twice is refused with [ErrDuplicateKey] (two
// policies counting one record would make "all or nothing" ambiguous).
//
// group chooses the key space: the empty group is the store's ordinary keys,
// those of [Store] and [Atomic.Update]; under a non-empty group, key k is a
// record apart from key k under no group or any other group, and a store
// that partitions its keys (a Redis Cluster's hash slots) keeps every key of
// one group in one partition, so that one call can update them all. A store
// that partitions its keys reports so with Partitioned; one call in the
// empty group whose keys fall in different partitions fails with
// [ErrCrossPartition] before contacting the server.
//
// Errors: [ErrInvalidRefill] or [ErrInvalidOp] for any invalid update
// (checked before anything is read; nothing changes), [ErrDuplicateKey],
// [ErrCrossPartition], an error matching [ErrInvalidOp] when len(results)
// differs from len(updates) or updates is empty, and otherwise the errors of
// the [Store] methods. When UpdateMulti returns an error, either nothing
// changed or (a store failure, or a ctx that ended after the request was
// sent) the caller cannot know whether the step was applied; it was then
// applied to every key or to none.
//
// A [PeriodCounter] store also takes period counters in the same call
// ([Update].Period), decided with the buckets, all or nothing.
//
// Implementations are safe for concurrent use.
type MultiAtomic interface {
	Atomic
	UpdateMulti(ctx context.Context, group string, op Op, updates []Update, results []OpResult) error

	// Partitioned reports whether the store spreads its keys over
	// partitions that one UpdateMulti cannot span, so that keys of the
	// empty group must be given a non-empty group to be updated together.
	Partitioned() bool
}

// Update is one key's share of a [MultiAtomic.UpdateMulti] call: the key, its
// refill rule and the units of the call's operation.
type Update struct {
	Key    string
	Refill Refill
	N      int64

	// Period, when not nil, makes the update a period counter of a
	// [PeriodCounter] store instead of a token bucket; Refill must then be
	// zero. Nil is a token bucket. Stores that do not count periods refuse
	// it ([CheckMulti]).
	Period *PeriodBounds
}

// Errors of [MultiAtomic].
var (
	// ErrDuplicateKey is returned by UpdateMulti for a call that names
	// one key twice.
	ErrDuplicateKey = errors.New("kvstore: key given twice in one update")

	// ErrCrossPartition is returned by UpdateMulti for a call in the
	// empty group whose keys a partitioned store keeps in different
	// partitions.
	ErrCrossPartition = errors.New("kvstore: keys in different partitions of the store")
)

// CheckMulti validates the arguments of [MultiAtomic.UpdateMulti] other than
// key uniqueness and partitions: a non-empty updates, results of the same
// length, and a valid Refill and n for op in every update. It refuses an
// update with a Period with [ErrInvalidPeriod]: a store that counts
// periods calls [CheckMultiPeriods] instead. Stores call it before
// contacting a server.
func CheckMulti(op Op, updates []Update, results []OpResult) error {
	return checkMulti(op, updates, results, false)
}

// CheckMultiPeriods is [CheckMulti] for a [PeriodCounter] store: an update
// with a Period must also have a zero Refill, valid bounds
// ([PeriodBounds.Validate]) and an n in range for op
// ([PeriodBounds.CheckOp]). It reports whether any update has a Period.
func CheckMultiPeriods(op Op, updates []Update, results []OpResult) (periods bool, err error) {
	if err := checkMulti(op, updates, results, true); err != nil {
		return false, err
	}
	for i := range updates {
		if updates[i].Period != nil {
			return true, nil
		}
	}
	return false, nil
}

func checkMulti(op Op, updates []Update, results []OpResult, periods bool) error {
	if len(updates) == 0 {
		return fmt.Errorf("%w: no keys to update", ErrInvalidOp)
	}
	if len(results) != len(updates) {
		return fmt.Errorf("%w: %d results for %d updates", ErrInvalidOp, len(results), len(updates))
	}
	for i := range updates {
		u := &updates[i]
		if p := u.Period; p != nil {
			switch {
			case !periods:
				return fmt.Errorf("%w: update %d: the store does not count periods (kvstore.PeriodCounter)", ErrInvalidPeriod, i)
			case u.Refill != (Refill{}):
				return fmt.Errorf("%w: update %d: a period counter has no Refill", ErrInvalidPeriod, i)
			}
			if err := p.Validate(); err != nil {
				return fmt.Errorf("%w (update %d)", err, i)
			}
			if err := p.CheckOp(op, u.N); err != nil {
				return fmt.Errorf("%w (update %d)", err, i)
			}
			continue
		}
		if err := u.Refill.Validate(); err != nil {
			return fmt.Errorf("%w (update %d)", err, i)
		}
		if err := u.Refill.CheckOp(op, u.N); err != nil {
			return fmt.Errorf("%w (update %d)", err, i)
		}
	}
	return nil
}

// GroupKey returns the key under which a store that keeps one flat key space
// holds key of a non-empty group: "{" + the length of group in decimal + ":"
// + group + "}" + key. The encoding is unambiguous (the length says where
// the group ends), and a Redis Cluster hash tag taken from it depends on the
// group alone.
func GroupKey(group, key string) string {
	b := make([]byte, 0, len(group)+len(key)+8)
	b = append(b, '{')
	b = strconv.AppendInt(b, int64(len(group)), 10)
	b = append(b, ':')
	b = append(b, group...)
	b = append(b, '}')
	b = append(b, key...)
	return string(b)
}
