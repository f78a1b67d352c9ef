// Package tokenbucket is a token-bucket [ratekit.Limiter] over a
// [kvstore.Store]: in memory (package kvstore/memstore), in Redis (packages
// kvstore/redisstore and kvstore/rueidisstore) or in Amazon DynamoDB
// (package kvstore/dynamostore).
//
// A bucket holds up to Burst tokens and refills at RefillRate. A request of
// cost n takes n tokens when the bucket holds at least n; otherwise it is
// denied and takes nothing. Refill is lazy and nothing is written on a
// timer, so nothing needs to run inside a frozen serverless instance.
// Levels are integers in units of 1/D token, where D is chosen so that
// refill is a whole number of units per microsecond: refill never drifts,
// and RetryAfter and ResetAfter are exact to the microsecond, rounded up (to
// the millisecond on a store whose clock moves in milliseconds, see
// kvstore.ClockStepper).
// [New] refuses a configuration whose Burst × D exceeds 2^52.
//
// The mode is chosen explicitly ([Config.Mode] has no default):
//
//   - [Atomic] refills, checks and writes in one step in a [kvstore.Atomic]
//     store, on the store's clock. It is exact on one store. Over an
//     interval that contains a Redis failover, a bucket can admit up to
//     twice what one master admits.
//   - [Eventual] reads and writes back over any store, on each instance's
//     clock. Racing instances overwrite each other's takes: k instances in
//     lock step on one key admit about k × Burst, and no bound holds
//     whatever the timing. Refund is best effort: a race can lose it. Use
//     Eventual where that is acceptable.
//
// With [Config.DeniedCacheSize] set, a Limiter denies repeated requests for
// a key it has just denied without a round trip, until their retry time.
// Within one process the cache is linearizable with Allow, Peek, Refund
// and Reset.
//
// A [Composite] ([NewComposite]) takes each request's cost from several
// buckets or from none, in one atomic step of a [kvstore.MultiAtomic]
// store. It runs in Atomic mode only.
//
// A [Planned] ([NewPlanned]) decides each request against its key's plan
// (ratekit.Plan, resolved per request): token buckets and quotas per
// calendar period (a day, week or month in a time zone, from a billing
// anchor), all or nothing in one step of a kvstore.PeriodCounter store, on
// the store's clock, with counts per key and policy name that survive plan
// changes, and Usage for a dashboard.
//
// Decisions advertise Policy{Name, Quota: Burst, Window: the time to refill
// an empty bucket}: a bucket of Burst 20 refilled at 5 per second
// advertises q=20;w=4.
//
// See docs/tokenbucket.md in the repository for the arithmetic, the
// overshoot of Eventual mode, clocks and the denied-key cache, and
// docs/redis.md for the bounds across a Redis failover.
package tokenbucket

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"strings"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// Mode selects how a Limiter updates the store. The zero Mode is invalid, so
// that the choice is always written down.
type Mode int

const (
	// Eventual reads, computes and writes over any kvstore.Store. It can
	// admit more than Burst when instances race (see the package doc).
	Eventual Mode = iota + 1

	// Atomic updates the key in one step in a kvstore.Atomic store, with the
	// store's clock. It is exact.
	Atomic
)

// String returns the mode's name as written in Go, "Eventual" or "Atomic",
// or "Mode(n)" for an unknown value.
func (m Mode) String() string {
	switch m {
	case Eventual:
		return "Eventual"
	case Atomic:
		return "Atomic"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Rate is a refill rate: Tokens tokens every Per.
type Rate struct {
	// Tokens is the number of tokens added every Per, at least 1.
	Tokens int64

	// Per is the refill period, a positive whole number of microseconds.
	Per time.Duration
}

// PerSecond returns a Rate of n tokens per second.
func PerSecond(n int64) Rate { return Rate{Tokens: n, Per: time.Second} }

// PerMinute returns a Rate of n tokens per minute.
func PerMinute(n int64) Rate { return Rate{Tokens: n, Per: time.Minute} }

// PerHour returns a Rate of n tokens per hour.
func PerHour(n int64) Rate { return Rate{Tokens: n, Per: time.Hour} }

// Config configures a [Limiter]. Name, Burst, RefillRate, Mode and Store are
// required.
type Config struct {
	// Name is the policy name, advertised to clients and used as the key
	// prefix in the store; see ratekit.ValidatePolicyName.
	Name string

	// Burst is the bucket's capacity: the most tokens it holds, and so the
	// largest cost a request may have. At least 1.
	Burst int64

	// RefillRate is how fast an empty bucket refills. It must not add more
	// than Burst tokens per microsecond.
	RefillRate Rate

	// Mode is Eventual or Atomic; there is no default.
	Mode Mode

	// Store keeps the buckets. Atomic mode needs a kvstore.Atomic, and a
	// bucket that fills from empty (Burst at RefillRate) in at least one
	// step of its clock (kvstore.ClockStepper): a millisecond on Redis.
	Store kvstore.Store

	// Now is the clock for what the Limiter computes in process: the
	// Eventual mode's refill and the denied-key cache. Atomic mode's refill
	// uses the store's clock. Nil means time.Now.
	Now func() time.Time

	// DeniedCacheSize, when positive, enables the in-process cache of denied
	// keys and bounds its number of keys. When full it evicts, as durable's
	// does: among five sampled keys, the expired ones, or else the one whose
	// retry time comes first. Zero disables the cache; negative is invalid.
	DeniedCacheSize int
}

// Limiter is a token-bucket limiter. It implements ratekit.Limiter,
// ratekit.Peeker, ratekit.Refunder and ratekit.Resetter in both modes (see
// the package doc for what each guarantees in Eventual mode). It keeps its
// buckets in the store under the key Name + ":" + Request.Key (in a store
// that implements kvstore.Prefixer, such as memstore's, under Request.Key in
// the store's key space of the prefix Name + ":"), and ignores Request.State and
// Request.IdempotencyKey. It is safe for concurrent use.
type Limiter struct {
	mode   Mode
	store  kvstore.Store
	atomic kvstore.Atomic
	taker  taker // atomic, when it is one
	now    func() time.Time
	refill kvstore.Refill
	unit   int64 // units per token
	burst  int64
	// perUnit and perRate divide by unit and by refill.Rate in decide.
	perUnit, perRate divisor
	prefix           string
	policy           ratekit.Policy
	denied           *deniedCache
	step             time.Duration // the Atomic store's clock step (kvstore.ClockStepper), 0 for a microsecond
	// perMicro reports the usual refill, one unit a microsecond (Rate 1),
	// on a clock that counts microseconds (step 0): a gap of k units
	// refills in k microseconds, with no division and no rounding.
	perMicro bool
}

var (
	_ ratekit.Limiter  = (*Limiter)(nil)
	_ ratekit.Peeker   = (*Limiter)(nil)
	_ ratekit.Refunder = (*Limiter)(nil)
	_ ratekit.Resetter = (*Limiter)(nil)
)

// A taker is a kvstore.Atomic whose Take is its Update with kvstore.OpTake,
// with the result's OK and Remaining returned as two values (memstore's
// Scope): Allow's Atomic path calls it, and receives them in registers
// rather than through an OpResult in memory.
type taker interface {
	Take(ctx context.Context, key string, r kvstore.Refill, n int64) (ok bool, remaining int64, err error)
}

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "tokenbucket: invalid config: " and format's text: every configuration
// error of this package is made here. A configuration error of ratekit's
// validators, or of this package, that the text includes loses its
// "<package>: invalid config: ": the message names both once.
func configErr(format string, args ...any) error {
	msg := strings.NewReplacer("ratekit: invalid config: ", "", "tokenbucket: invalid config: ", "").Replace(fmt.Sprintf(format, args...))
	return fmt.Errorf("tokenbucket: %w: %s", ratekit.ErrInvalidConfig, msg)
}

// New returns a Limiter for cfg. It returns an error matching
// ratekit.ErrInvalidConfig for an invalid policy name, a Burst below 1, a
// RefillRate that is not positive, not whole microseconds or faster than
// Burst tokens per microsecond, a Burst × D above 2^52 (see the package doc),
// a missing or unknown Mode, a nil Store, an Atomic mode over a store that is
// not a kvstore.Atomic or whose clock step (kvstore.ClockStepper: a
// millisecond on Redis) is longer than the time the bucket takes to fill
// from empty, or a negative DeniedCacheSize.
func New(cfg Config) (*Limiter, error) {
	if err := ratekit.ValidatePolicyName(cfg.Name); err != nil {
		return nil, configErr("%v", err)
	}
	invalid := func(format string, args ...any) error {
		return configErr("policy %q: %s", cfg.Name, fmt.Sprintf(format, args...))
	}
	if cfg.Burst < 1 || cfg.Burst > ratekit.MaxQuota {
		return nil, invalid("Burst %d is not from 1 to ratekit.MaxQuota", cfg.Burst)
	}
	r := cfg.RefillRate
	if r.Tokens < 1 || r.Per <= 0 {
		return nil, invalid("RefillRate %d per %v is not positive", r.Tokens, r.Per)
	}
	refill, unit, problem := bucketRefill(cfg.Burst, r)
	if problem != "" {
		return nil, invalid("%s", problem)
	}
	if cfg.Store == nil {
		return nil, invalid("nil Store")
	}
	l := &Limiter{
		mode:    cfg.Mode,
		store:   cfg.Store,
		now:     cfg.Now,
		refill:  refill,
		unit:    unit,
		burst:   cfg.Burst,
		perUnit: newDivisor(unit),
		perRate: newDivisor(refill.Rate),
		prefix:  cfg.Name + ":",
	}
	if p, ok := cfg.Store.(kvstore.Prefixer); ok {
		// The prefix's own key space: no decision builds prefix+key.
		l.store, l.prefix = p.Prefixed(l.prefix), ""
	}
	switch cfg.Mode {
	case Eventual:
	case Atomic:
		a, ok := l.store.(kvstore.Atomic)
		if !ok {
			return nil, invalid("Atomic mode needs a kvstore.Atomic store; %T is not one", cfg.Store)
		}
		l.atomic = a
		l.taker, _ = a.(taker)
		l.step = clockStep(cfg.Store)
		if problem := stepProblem(window(cfg.Burst, r), l.step); problem != "" {
			return nil, invalid("Burst %d refilled at %d per %v %s", cfg.Burst, r.Tokens, r.Per, problem)
		}
	case 0:
		return nil, invalid("Mode is not set; choose tokenbucket.Eventual or tokenbucket.Atomic")
	default:
		return nil, invalid("unknown %v", cfg.Mode)
	}
	if l.now == nil {
		l.now = time.Now
	}
	l.perMicro = refill.Rate == 1 && l.step == 0
	if cfg.DeniedCacheSize < 0 {
		return nil, invalid("DeniedCacheSize %d is negative", cfg.DeniedCacheSize)
	}
	if cfg.DeniedCacheSize > 0 {
		l.denied = newDeniedCache(cfg.DeniedCacheSize)
	}
	l.policy = ratekit.Policy{Name: cfg.Name, Quota: cfg.Burst, Window: window(cfg.Burst, r), Algorithm: ratekit.TokenBucket}
	return l, nil
}

// window returns burst × per / tokens, rounded up to the nanosecond, or the
// longest Duration when that overflows.
func window(burst int64, r Rate) time.Duration {
	w := new(big.Int).Mul(big.NewInt(burst), big.NewInt(int64(r.Per)))
	w.Add(w, big.NewInt(r.Tokens-1))
	w.Quo(w, big.NewInt(r.Tokens))
	if !w.IsInt64() {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(w.Int64())
}

// bucketRefill returns the kvstore.Refill of a bucket of burst tokens (at
// least 1) refilled at r (positive), and its units per token D: the refill
// period in microseconds over its greatest common divisor with r.Tokens.
// problem says why there is none: a period that is not whole microseconds,
// Burst × D above kvstore.MaxValue, or a refill faster than the burst per
// microsecond.
func bucketRefill(burst int64, r Rate) (refill kvstore.Refill, unit int64, problem string) {
	if r.Per%time.Microsecond != 0 {
		return kvstore.Refill{}, 0, fmt.Sprintf("RefillRate period %v is not a whole number of microseconds", r.Per)
	}
	perMicro := int64(r.Per / time.Microsecond)
	g := gcd(r.Tokens, perMicro)
	unit, rate := perMicro/g, r.Tokens/g
	if unit > kvstore.MaxValue/burst {
		return kvstore.Refill{}, 0, fmt.Sprintf("Burst %d with a refill of %d per %v needs %d×%d units, more than 2^52; use a shorter period", burst, r.Tokens, r.Per, burst, unit)
	}
	refill = kvstore.Refill{Burst: burst * unit, Rate: rate}
	if refill.Validate() != nil {
		return kvstore.Refill{}, 0, fmt.Sprintf("RefillRate %d per %v refills more than Burst %d per microsecond", r.Tokens, r.Per, burst)
	}
	return refill, unit, ""
}

// stepProblem says why a bucket that fills from empty in fill cannot be
// kept on a store whose clock advances in steps of step (0 for a
// microsecond), or returns "": one that fills in less than a step is full
// again at every step, so it would admit at most its burst per step, less
// than the rate it advertises.
func stepProblem(fill, step time.Duration) string {
	if step == 0 || fill >= step {
		return ""
	}
	return fmt.Sprintf("fills from empty in %v, less than one step of the store's clock (%v; Redis reads its clock in whole milliseconds), so it would admit at most its burst per step, less than its rate; make it fill in at least %v", fill, step, step)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Policy returns the policy the Limiter's decisions carry.
func (l *Limiter) Policy() ratekit.Policy { return l.policy }

// Mode returns the Limiter's consistency mode.
func (l *Limiter) Mode() Mode { return l.mode }

// check validates req and returns its cost in units. The common request,
// valid with no parts, passes on comparisons alone (plain); any other goes
// through checkSlow, which gives the error.
func (l *Limiter) check(req *ratekit.Request) (int64, error) {
	if l.plain(req) {
		return req.Cost * l.unit, nil
	}
	return l.checkSlow(req)
}

// plain reports whether req is valid, has no parts and costs at most Burst.
func (l *Limiter) plain(req *ratekit.Request) bool {
	k := len(req.Key)
	return k > 0 && k <= ratekit.MaxKeyLen && req.Cost >= 1 && req.Cost <= l.burst &&
		len(req.IdempotencyKey) <= ratekit.MaxKeyLen && len(req.Parts) == 0
}

// checkSlow validates req as check does, with the errors of
// ratekit.Request.Validate, ratekit.ErrUnexpectedParts and
// ratekit.ErrCostExceedsQuota.
func (l *Limiter) checkSlow(req *ratekit.Request) (int64, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	if len(req.Parts) > 0 {
		return 0, ratekit.ErrUnexpectedParts
	}
	if req.Cost > l.burst {
		return 0, fmt.Errorf("%w: cost %d, burst %d", ratekit.ErrCostExceedsQuota, req.Cost, l.burst)
	}
	return req.Cost * l.unit, nil
}

// Allow takes req.Cost tokens from the bucket of req.Key when it holds that
// many, and reports the decision. A denied request takes nothing. It returns
// the errors of ratekit.Request.Validate, ratekit.ErrCostExceedsQuota for a
// cost above Burst, and the store's error (wrapped; an error caused by ctx
// wraps ctx.Err()) when the store fails.
func (l *Limiter) Allow(ctx context.Context, req ratekit.Request) (d ratekit.Decision, err error) {
	n := req.Cost * l.unit
	if !l.plain(&req) {
		if n, err = l.checkSlow(&req); err != nil {
			return ratekit.Decision{}, err
		}
	}
	if l.denied != nil {
		return l.allowCached(ctx, req.Key, n)
	}
	if l.atomic == nil {
		return l.allowEventual(ctx, req.Key, n)
	}
	// apply's Atomic path, one call less.
	if l.taker != nil {
		ok, level, err := l.taker.Take(ctx, l.storeKey(req.Key), l.refill, n)
		if err != nil {
			return ratekit.Decision{}, storeErr(err)
		}
		l.decide(&d, ok, level, n)
		return d, nil
	}
	res, err := l.atomic.Update(ctx, l.storeKey(req.Key), l.refill, kvstore.OpTake, n)
	if err != nil {
		return ratekit.Decision{}, storeErr(err)
	}
	l.decide(&d, res.OK, res.Remaining, n)
	return d, nil
}

// allowEventual is Allow of n units for key in Eventual mode without the
// denied-key cache.
func (l *Limiter) allowEventual(ctx context.Context, key string, n int64) (d ratekit.Decision, err error) {
	res, err := l.apply(ctx, key, kvstore.OpTake, n)
	if err != nil {
		return ratekit.Decision{}, err
	}
	l.decide(&d, res.OK, res.Remaining, n)
	return d, nil
}

// allowCached is Allow of n units for key with the denied-key cache: a key
// the cache holds is denied without asking the store, and a denial the
// store decides goes into the cache.
func (l *Limiter) allowCached(ctx context.Context, key string, n int64) (d ratekit.Decision, err error) {
	sent := l.now()
	level, hit, ticket := l.denied.lookup(key, n, sent, l.refill)
	if hit {
		l.decide(&d, false, level, n)
		return d, nil
	}
	res, err := l.apply(ctx, key, kvstore.OpTake, n)
	if err == nil && !res.OK {
		l.denied.add(key, res.Remaining, sent, sent.Add(l.wait(res.Remaining, n)), ticket)
	}
	l.denied.finish(key, err != nil || res.OK)
	if err != nil {
		return ratekit.Decision{}, err
	}
	l.decide(&d, res.OK, res.Remaining, n)
	return d, nil
}

// Peek reports the decision Allow would make for req now, taking nothing.
// It returns the same errors as Allow.
func (l *Limiter) Peek(ctx context.Context, req ratekit.Request) (d ratekit.Decision, err error) {
	n, err := l.check(&req)
	if err != nil {
		return ratekit.Decision{}, err
	}
	res, err := l.apply(ctx, req.Key, kvstore.OpPeek, n)
	if err != nil {
		return ratekit.Decision{}, err
	}
	l.decide(&d, res.OK, res.Remaining, n)
	return d, nil
}

// Refund returns req.Cost tokens to the bucket of req.Key, never filling it
// above Burst, and reports the resulting decision (Allowed true). In
// Eventual mode it is a read-compute-write that races like Allow: a
// concurrent write can lose it. It returns the same errors as Allow.
func (l *Limiter) Refund(ctx context.Context, req ratekit.Request) (d ratekit.Decision, err error) {
	n, err := l.check(&req)
	if err != nil {
		return ratekit.Decision{}, err
	}
	l.denied.begin(req.Key)
	res, err := l.apply(ctx, req.Key, kvstore.OpRefund, n)
	l.denied.finish(req.Key, true)
	if err != nil {
		return ratekit.Decision{}, err
	}
	l.decide(&d, true, res.Remaining, n)
	return d, nil
}

// Reset forgets the bucket of key, so that it is full again. It returns
// ratekit.ErrEmptyKey or ratekit.ErrKeyTooLong for an invalid key and the
// store's error (wrapped) when the store fails.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := ratekit.ValidateKey(key); err != nil {
		return err
	}
	l.denied.begin(key)
	err := l.store.Delete(ctx, l.storeKey(key))
	l.denied.finish(key, true)
	if err != nil {
		return fmt.Errorf("tokenbucket: reset: %w", err)
	}
	return nil
}

// storeKey returns the store's key for the bucket of key: key itself in a
// kvstore.Prefixer's key space, which is the prefix's own key space, prefix+key otherwise.
func (l *Limiter) storeKey(key string) string {
	if l.prefix == "" {
		return key
	}
	return l.prefix + key
}

// apply runs op on the bucket of key in the Limiter's mode. It is small
// enough to be inlined into its callers: an Atomic update is one call to
// the store.
func (l *Limiter) apply(ctx context.Context, key string, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	var (
		res kvstore.OpResult
		err error
	)
	if l.atomic != nil {
		res, err = l.atomic.Update(ctx, l.storeKey(key), l.refill, op, n)
	} else {
		res, err = l.eventual(ctx, l.storeKey(key), op, n)
	}
	if err != nil {
		return kvstore.OpResult{}, storeErr(err)
	}
	return res, nil
}

// storeErr wraps an error of the store.
func storeErr(err error) error { return fmt.Errorf("tokenbucket: %w", err) }

// eventual runs op on the record under key (the store key) by a Get, the
// computation on the Limiter's clock and, when the op writes, a Set or
// Delete.
func (l *Limiter) eventual(ctx context.Context, key string, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	rec, ok, err := l.store.Get(ctx, key)
	if err != nil {
		return kvstore.OpResult{}, err
	}
	now := l.now().UnixMicro()
	res, next, write, err := l.refill.Apply(rec, ok, now, op, n)
	if err != nil || !write {
		return res, err
	}
	if next.Value >= l.refill.Burst {
		err = l.store.Delete(ctx, key)
	} else {
		// The record is current at next.Time, later than now when the clock
		// stepped back; it must live until the bucket is full after that.
		ttl := l.refill.TimeToFull(next.Value) + time.Duration(next.Time-now)*time.Microsecond
		err = l.store.Set(ctx, key, next, ttl)
	}
	return res, err
}

// decide fills in the zero Decision *d for a bucket at level (units) after a
// request of n units. It writes into the caller's result rather than
// returning a Decision, so the struct is not copied twice on the hot path.
func (l *Limiter) decide(d *ratekit.Decision, allowed bool, level, n int64) {
	d.Allowed = allowed
	d.Quota = l.burst
	d.Remaining = l.perUnit.quo(level)
	d.Policy = l.policy
	d.ResetAfter = l.wait(level, l.refill.Burst)
	if !allowed {
		d.RetryAfter = l.wait(level, n)
	}
}

// clockStep returns the clock step of store when it is a
// kvstore.ClockStepper with a step longer than a microsecond, and 0
// otherwise.
func clockStep(store kvstore.Store) time.Duration {
	if cs, ok := store.(kvstore.ClockStepper); ok && cs.ClockStep() > time.Microsecond {
		return cs.ClockStep()
	}
	return 0
}

// wait returns how long the bucket at level takes to hold target units (at
// most Burst): Refill.TimeUntil, rounded up to whole steps of the store's
// clock, as stepWait computes it, with perRate's division. It is small
// enough to inline, so that the usual refill, one unit a microsecond,
// costs no call.
func (l *Limiter) wait(level, target int64) time.Duration {
	if l.perMicro && level < target {
		return time.Duration(target-max(level, 0)) * time.Microsecond
	}
	return l.stepped(level, target)
}

// stepped is wait for any refill and clock step.
func (l *Limiter) stepped(level, target int64) time.Duration {
	if level >= target {
		return 0
	}
	// The gap and Rate are at most Burst, 2^52: the quotient is at most
	// 2^52 microseconds, which a Duration holds in nanoseconds.
	gap := target - max(level, 0)
	d := time.Duration(l.perRate.quo(gap+l.refill.Rate-1)) * time.Microsecond
	if l.step > 0 {
		if rem := d % l.step; rem != 0 && d <= math.MaxInt64-l.step {
			d += l.step - rem
		}
	}
	return d
}

// A divisor divides by a fixed d, from 1 to 2^52, exactly and without the
// processor's 64-bit division, which takes tens of cycles: a floating-point
// multiplication by 1/d gives the quotient within 2 (n and d are exact
// doubles, 1/d and the product are each rounded by half an ulp at most),
// and integer steps correct it.
type divisor struct {
	d   int64
	inv float64
}

func newDivisor(d int64) divisor { return divisor{d: d, inv: 1 / float64(d)} }

// quo returns n / d rounded down, for n from 0 to 2^53.
func (v divisor) quo(n int64) int64 {
	q := int64(float64(n) * v.inv)
	r := n - q*v.d
	for r < 0 {
		q--
		r += v.d
	}
	for r >= v.d {
		q++
		r -= v.d
	}
	return q
}

// stepWait returns r.TimeUntil(level, target) rounded up to whole steps of
// step (none when step is 0), saturating.
func stepWait(r kvstore.Refill, step time.Duration, level, target int64) time.Duration {
	d := r.TimeUntil(level, target)
	if step > 0 {
		if rem := d % step; rem != 0 && d <= math.MaxInt64-step {
			d += step - rem
		}
	}
	return d
}
