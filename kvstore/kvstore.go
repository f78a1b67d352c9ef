// Package kvstore is the storage contract of ratekit's token bucket: a small
// key-value interface that an eventually consistent store can honestly
// implement, and an optional atomic capability for stores that can update a
// key in one step.
//
// A [Store] keeps one [Record] per key, two integers and a time to live: the
// value (a bucket's level) and the time it was current. That is all the lazy
// refill of a token bucket needs, and all that an edge key-value store, a
// cache or a database can be asked for without transactions.
//
// A store that can read, refill and write a key as one atomic step with its
// own clock implements [Atomic] as well. The refill rule it must follow is
// [Refill.Apply]; this package holds the reference implementation in Go, which
// the in-memory store runs under a lock and the Redis stores follow in Lua
// (as GCRA on the key's expiry, in whole milliseconds of Redis's clock).
//
// A store that can also update several keys as one all-or-nothing step, for
// limits that decide together ("10 a second and 1,000 a day"), implements
// [MultiAtomic]; memstore, redisstore, rueidisstore and dynamostore (within
// one group) do. One that can also keep, in the same step, fixed-window
// counts in calendar periods picked by its clock ("100,000 a month from the
// billing day", [PeriodBounds]) implements [PeriodCounter]; the same four do.
//
// Implementations live in sub-packages: memstore (in process), and, each a
// module of its own, redisstore (Redis through go-redis v9), rueidisstore
// (Redis through rueidis) and dynamostore (Amazon DynamoDB, whose clock is
// each instance's). Package storetest is the conformance suite they all run; run it
// against a store of your own to check it.
package kvstore

import (
	"context"
	"errors"
	"time"
)

// Store is a key-value store of [Record] values with a time to live.
//
// Implementations need not be linearizable: a Get may return a value that is
// older than the latest Set (an edge replica, a cache). A limiter built on a
// Store alone reads, computes and writes, and says how much it can overshoot
// when callers race.
//
// Errors: a failure of the store is returned as an error that keeps the
// underlying error visible to errors.Is; an error caused by ctx wraps
// ctx.Err(). Implementations are safe for concurrent use.
type Store interface {
	// Get returns the record stored under key. ok is false when the key has
	// none: never set, deleted or past its time to live.
	Get(ctx context.Context, key string) (rec Record, ok bool, err error)

	// Set stores rec under key for ttl, replacing any record there. A ttl
	// below one millisecond is rounded up to one millisecond; ttl must be
	// positive ([ErrInvalidTTL] otherwise).
	Set(ctx context.Context, key string, rec Record, ttl time.Duration) error

	// Delete removes key. Deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
}

// Record is what a [Store] keeps under a key: a value and the time at which
// the value was current.
//
// For a token bucket, Value is the level (tokens in the bucket, in integer
// units) and Time is when that level was computed. Stores treat both as
// opaque integers: Get returns exactly what Set stored.
type Record struct {
	// Value is the stored value. Atomic stores keep it between 0 and the
	// [Refill] maximum.
	Value int64

	// Time is when Value was current, in microseconds since the Unix epoch,
	// on the clock of whoever wrote the record: the limiter's clock for a
	// Set, the store's own clock for an [Atomic] update.
	Time int64
}

// Atomic is implemented by stores that can refill, apply an operation to and
// write one key as a single atomic step, reading the time from their own
// clock, so that concurrent callers never overwrite each other's work.
//
// Update brings the value under key up to date with [Refill.Level] at the
// store's current time, applies op with n units exactly as [Refill.Apply]
// does, and keeps the result (when Apply writes) at least until the value
// would be full again; a value that reaches the maximum need leave no key
// behind, since an absent key reads as full (a store may keep a key past
// that instant, reading as full, until at most the time an empty value
// takes to fill after its last write). One call is one round trip to the store.
//
// An Atomic store may keep Update's records in a form of its own (the Redis
// stores keep a bucket's debt in the key's expiry), which Get need not read
// and Set cannot write: a key is used either through Update or through Get
// and Set, never both, as a limiter's mode does.
//
// Update returns [ErrInvalidRefill] for an invalid r, [ErrInvalidOp] for an
// unknown op or an n outside the op's range (see [Op]),
// [ErrMalformedRecord] when the key holds something Update did not write,
// and otherwise the same errors as the [Store] methods.
type Atomic interface {
	Store
	Update(ctx context.Context, key string, r Refill, op Op, n int64) (OpResult, error)
}

// ClockStepper is implemented by [Atomic] stores whose clock, the one
// Update reads, advances in steps longer than a microsecond, so that the
// refill arrives in those steps: the level at any instant is [Refill.Level]
// at the start of its step. ClockStep returns the step; the Redis stores
// read Redis's clock in whole milliseconds (a key's expiry). A limiter rounds the waits it
// reports (retry after, reset) up to whole steps, so that a client that
// waits that long finds the units there.
type ClockStepper interface {
	ClockStep() time.Duration
}

// Prefixer is implemented by stores that can give a key prefix a key space of
// its own, cheaper than building prefix+key on every operation.
//
// Prefixed returns a Store whose key k stands for this store's key
// prefix+k. The returned Store has the same semantics and errors as this
// one, and implements [Atomic] when this store does. Every user of one
// prefix must go through Prefixed: whether the returned Store's keys are
// visible to this store's own methods under prefix+k is up to the
// implementation. Calls with the same prefix return Stores that share their
// keys; the empty prefix returns this store's own key space. Prefixed is
// meant to be called once per user of a prefix (a limiter calls it at
// construction) and is safe for concurrent use.
type Prefixer interface {
	Store
	Prefixed(prefix string) Store
}

// Op is an operation of [Atomic.Update] and [Refill.Apply].
type Op uint8

// The operations. n is the number of units the operation concerns; it must be
// between 1 and the Refill's Burst for OpTake and OpPeek, and at least 1 for
// OpRefund.
const (
	// OpTake subtracts n when the level is at least n. When it is not,
	// nothing changes: a denied take consumes nothing.
	OpTake Op = iota + 1

	// OpPeek reports whether n units are available and writes nothing.
	OpPeek

	// OpRefund adds n, never raising the level above the maximum.
	OpRefund
)

// OpResult is the outcome of an [Op] applied by [Atomic.Update] or
// [Refill.Apply].
type OpResult struct {
	// OK reports whether n units were available: true when OpTake took them
	// or OpPeek found them. OpRefund always reports true.
	OK bool

	// Remaining is the units available after the operation, in the
	// store's units: for a token bucket its level, from 0 to the Refill's
	// Burst (for a take that was refused, the refilled level that was too
	// low); for a period counter ([Update].Period) what remains of its
	// quota, Quota − Used clamped to [0, Quota].
	Remaining int64

	// Used is, for a period counter, the units counted in the current
	// period after the operation (before it, for a take that was refused).
	// It can exceed the quota when an earlier call counted under a larger
	// one. Zero for a token bucket.
	Used int64

	// Now is, for a period counter, the store's clock when it decided, in
	// microseconds since the Unix epoch, read once for the whole call: the
	// current period ends [PeriodBounds].Bounds[Period] − Now microseconds
	// later. Zero for a token bucket.
	Now int64

	// Period is, for a period counter, which of the three periods of its
	// [PeriodBounds] contains Now: 1 for [b0, b1), 2 for [b1, b2), 3 for
	// [b2, b3). Zero for a token bucket.
	Period int
}

// MaxValue is the largest [Refill.Burst] accepted: 2^52, so that the Redis
// stores' scripts, which compute in Lua's doubles with numbers up to twice a
// Burst, stay exact integers (below 2^53) and agree with the Go implementation
// of [Refill.Apply] to the unit.
const MaxValue = 1 << 52

// Errors returned by this package and the stores.
var (
	// ErrInvalidRefill is returned for a Refill whose Burst or Rate is out of
	// range.
	ErrInvalidRefill = errors.New("kvstore: invalid refill")

	// ErrInvalidOp is returned for an unknown Op or an n outside its range.
	ErrInvalidOp = errors.New("kvstore: invalid operation")

	// ErrInvalidTTL is returned by Set for a ttl that is not positive.
	ErrInvalidTTL = errors.New("kvstore: ttl must be positive")

	// ErrMalformedRecord is returned when the bytes under a key are not a
	// record this package wrote (another program uses the key).
	ErrMalformedRecord = errors.New("kvstore: malformed record")
)
