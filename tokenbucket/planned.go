package tokenbucket

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// PlannedConfig configures a [Planned]. Prefix, Store and Plan are
// required.
type PlannedConfig struct {
	// Prefix names this Planned's records in the store: policy P of a plan
	// counts key K under Prefix + ":" + P + "/" + a kind + ":" + K (see
	// [Planned]). It must pass ratekit.ValidatePolicyName. Two Planned
	// limiters on one store share counts when they share a Prefix.
	Prefix string

	// Store keeps the buckets and period counters. It must implement
	// kvstore.PeriodCounter and count periods (memstore, redisstore,
	// rueidisstore and dynamostore do). A store that also implements
	// kvstore.IdempotentMulti makes Request.IdempotencyKey count (see
	// [Planned]), and one that implements kvstore.PeriodHistory serves
	// [Planned.PeriodUsage] (dynamostore implements both).
	Store kvstore.Store

	// Group, when true, keeps every record of a decision in the group of
	// Request.Key, as [CompositeConfig].Group does: one hash slot on a
	// Redis Cluster, one item on DynamoDB, where it is required.
	Group bool

	// Plan returns the plan of key, called once per Allow, Peek, Refund,
	// Reset and Usage. It must be safe for concurrent use, and is best
	// served from memory (a decision waits for it). Its error is returned
	// wrapped, and nothing is decided.
	Plan func(ctx context.Context, key string) (ratekit.Plan, error)

	// Now is the clock that period bounds are computed from: the period
	// that contains Now and its two neighbours are sent, and the store
	// counts in the one that contains ITS clock (see
	// kvstore.PeriodBounds). Nil means time.Now. A clock more than a
	// period away from the store's, latency included, fails decisions
	// with ratekit.ErrClockSkew (see [MinFixedWindow]).
	Now func() time.Time
}

// Planned is a [ratekit.Limiter] that decides each request against the
// policies of its key's plan, resolved per request by PlannedConfig.Plan,
// without a limiter per plan: every policy of the plan at once, all or
// nothing, in one step of a kvstore.PeriodCounter store (one Lua script
// and one round trip on Redis, one conditional write of one item on
// DynamoDB, shard locks in memory), on the store's clock (on DynamoDB,
// which has none, the clock of the instance that decides:
// dynamostore.Config.Now). It is the Atomic-KV counterpart of
// durable.Planned.
//
// Policies become, by Algorithm:
//
//   - TokenBucket: a bucket of Quota tokens (the burst) that fills from
//     empty in Window (a refill of Quota per Window, which must be a whole
//     number of microseconds, and at least one step of the store's clock,
//     kvstore.ClockStepper: a millisecond on Redis), with [Limiter]'s
//     exact arithmetic.
//   - FixedWindow with a Period: a period counter, at most Quota units in
//     each calendar period ([ratekit.Period]: a day, week or month in a
//     time zone, from the key's billing anchor), picked by the store's
//     clock; the decision's ResetAfter (and RetryAfter when it denies) is
//     the true end of the period, and its Policy.Window the period's
//     length (28 to 31 days for a month).
//   - FixedWindow without a Period: a period counter over windows of
//     Window aligned to the Unix epoch (Window a whole number of
//     microseconds, at least [MinFixedWindow]). Its bounds come from this
//     process's clock too, so a clock more than one Window from the
//     store's, latency included, fails with ratekit.ErrClockSkew: prefer a
//     TokenBucket for windows of seconds.
//   - SlidingWindow and SlidingLog are refused (ratekit.ErrInvalidConfig).
//
// Counts are kept per key and policy name, not per plan. A period
// counter's record is Prefix:name/p:key whatever the quota, so a plan
// change takes effect on the key's next decision and keeps what was used:
// after an upgrade the larger quota leaves more remaining; after a
// downgrade Remaining is never below zero (the count stays, so the key
// waits for the period's end) and no period starts afresh. A bucket's
// record is Prefix:name/b<quota>.<window µs>:key: a bucket whose burst or
// refill changes with the plan is a new bucket and starts full (a bucket
// holds seconds of traffic, the period count is the money), so a plan
// change grants at most one burst of the new plan at once. A policy the
// new plan drops stops being counted; one it adds starts from zero (full).
//
// Refund gives units back to each policy of the key's CURRENT plan: to its
// bucket of the current shape (never above its burst) and to its counter
// in the current period (never below zero). So a refund that spans a plan
// change lowers the count the period keeps (an upgrade or downgrade leaves
// what was refunded available under the new quota) and refills the new
// plan's bucket; a policy added since the charge gets nothing (its count
// is zero), a dropped one is not refunded. Without idempotency keys a
// refund made after its charge's period ended lowers the new period's
// count instead, never below zero.
//
// Idempotency keys count on a store that implements
// kvstore.IdempotentMulti (dynamostore); the others ignore
// Request.IdempotencyKey. There, an Allow or Refund with an
// IdempotencyKey is applied at most once per Request.Key and
// IdempotencyKey within 32 days (kvstore.MaxIdempotencyTTL), in the same
// step as its counts: a retry (a Lambda retry, a client's) counts nothing
// more and returns the first call's outcome, Allowed and Remaining as
// they were then, and the time left in the period the first call counted
// in. dynamostore records admitted calls only: the retry of a refused
// Allow is decided afresh, as on PostgreSQL. A Refund whose IdempotencyKey is that of the charge it undoes gives
// nothing back to a period that started after the charge, as
// durable.Planned does. Peek, Usage and Reset ignore it.
//
// Planned implements ratekit.Peeker, ratekit.Refunder and ratekit.Resetter,
// and Usage and PeriodUsage. Request.Parts, when not nil, gives one part
// per policy of the key's plan, in its order; with Group, a request must
// name the same Key every time it counts a record. It ignores
// Request.State, has no denied-key cache, is safe for concurrent use and
// starts no goroutine.
type Planned struct {
	multi
	prefix string // Prefix + ":"
	plan   func(ctx context.Context, key string) (ratekit.Plan, error)
	now    func() time.Time

	// bounds remembers recently computed period bounds, so that the
	// decisions of one period compute its calendar once (see bounds).
	bounds [boundsSlots]atomic.Pointer[boundsEntry]
}

// MinFixedWindow is the shortest Window of a FixedWindow policy without a
// Period that [Planned] counts; a plan with a shorter one is refused
// (ratekit.ErrInvalidConfig). Such a window's bounds are the window that
// contains this process's clock and its two neighbours, and the store
// reads its own clock a round trip later: they tolerate a difference of
// one Window between the two clocks, latency included, and a shorter
// window would fail decisions with ratekit.ErrClockSkew under ordinary
// latency and load, with no skew at all.
const MinFixedWindow = time.Second

// boundsSlots is the number of period bounds a Planned remembers,
// direct-mapped by the policy's period and window.
const boundsSlots = 64

// boundsEntry is the bounds of the period of policy window and period
// that contains the instants from b[1] to b[2].
type boundsEntry struct {
	period ratekit.Period
	window time.Duration
	b      [4]int64
}

var (
	_ ratekit.Limiter  = (*Planned)(nil)
	_ ratekit.Peeker   = (*Planned)(nil)
	_ ratekit.Refunder = (*Planned)(nil)
	_ ratekit.Resetter = (*Planned)(nil)
)

// NewPlanned returns a Planned for cfg. It returns an error matching
// ratekit.ErrInvalidConfig for an invalid Prefix, a nil Plan, a Store that
// does not count periods (kvstore.PeriodCounter), or a partitioned store
// (a Redis Cluster, DynamoDB) without Group. It does not contact the store.
func NewPlanned(cfg PlannedConfig) (*Planned, error) {
	invalid := func(format string, args ...any) error {
		return configErr("planned: "+format, args...)
	}
	if err := ratekit.ValidatePolicyName(cfg.Prefix); err != nil {
		return nil, invalid("Prefix: %v", err)
	}
	if cfg.Plan == nil {
		return nil, invalid("nil Plan func")
	}
	if cfg.Store == nil {
		return nil, invalid("nil Store")
	}
	pc, ok := cfg.Store.(kvstore.PeriodCounter)
	if !ok || !pc.CountsPeriods() {
		return nil, invalid("Store %T does not count periods (kvstore.PeriodCounter)", cfg.Store)
	}
	if pc.Partitioned() && !cfg.Group {
		return nil, invalid("Store %T spreads keys over partitions (a Redis Cluster's hash slots, DynamoDB's items) that one step cannot span; set Group to keep each decision's records in the group (one hash slot, one item) of Request.Key", cfg.Store)
	}
	p := &Planned{multi: multi{store: pc, group: cfg.Group, step: clockStep(cfg.Store)}, prefix: cfg.Prefix + ":", plan: cfg.Plan, now: cfg.Now}
	p.idem, _ = cfg.Store.(kvstore.IdempotentMulti)
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// resolve looks up and checks the plan of key and fills sc.pols.
func (p *Planned) resolve(ctx context.Context, key string, sc *multiScratch) ([]multiPolicy, error) {
	plan, err := p.plan(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("tokenbucket: plan of key: %w", err)
	}
	if err := plan.Validate(); err != nil {
		return nil, configErr("%v", err)
	}
	pols := sc.pols[:len(plan.Policies)]
	for i, pol := range plan.Policies {
		invalid := func(format string, args ...any) error {
			return configErr("plan %q: policy %q: %s", plan.Name, pol.Name, fmt.Sprintf(format, args...))
		}
		pols[i] = multiPolicy{policy: pol}
		switch pol.Algorithm {
		case ratekit.TokenBucket:
			// A burst of Quota filled from empty in Window: Quota per
			// Window, as durable reads a token bucket's policy.
			r, unit, problem := bucketRefill(pol.Quota, Rate{Tokens: pol.Quota, Per: pol.Window})
			if problem != "" {
				return nil, invalid("%s", problem)
			}
			if problem := stepProblem(pol.Window, p.step); problem != "" {
				return nil, invalid("a token bucket of %d per %v %s", pol.Quota, pol.Window, problem)
			}
			pols[i].refill, pols[i].unit = r, unit
		case ratekit.FixedWindow:
			if pol.Period.IsZero() && pol.Window%time.Microsecond != 0 {
				return nil, invalid("a fixed window's Window %v is not a whole number of microseconds", pol.Window)
			}
			if pol.Period.IsZero() && pol.Window < MinFixedWindow {
				return nil, invalid("a fixed window's Window %v is shorter than tokenbucket.MinFixedWindow (%v): its bounds, from this process's clock, would not cover the store's clock a round trip later; use a TokenBucket", pol.Window, MinFixedWindow)
			}
			if pol.Quota > kvstore.MaxValue {
				return nil, invalid("quota %d is above 2^52", pol.Quota)
			}
		default:
			return nil, invalid("algorithm %v is not supported by tokenbucket.Planned; use ratekit.TokenBucket, or ratekit.FixedWindow with or without a Period", pol.Algorithm)
		}
	}
	return pols, nil
}

// periodBounds returns the period bounds of a counter pol at now, from
// the slots when they hold the period that contains now.
func (p *Planned) periodBounds(pol *ratekit.Policy, now time.Time) [4]int64 {
	us := now.UnixMicro()
	h := uint64(pol.Period.Anchor.UnixNano()) ^ uint64(pol.Window) ^ uint64(pol.Period.Unit)<<59
	h ^= h >> 29
	slot := &p.bounds[h*0x9E3779B97F4A7C15>>58]
	if e := slot.Load(); e != nil && e.period == pol.Period && e.window == pol.Window && us >= e.b[1] && us < e.b[2] {
		return e.b
	}
	b := bounds(*pol, now)
	slot.Store(&boundsEntry{period: pol.Period, window: pol.Window, b: b})
	return b
}

// bounds returns the period bounds of a counter pol at now.
func bounds(pol ratekit.Policy, now time.Time) [4]int64 {
	if pol.Period.IsZero() {
		w := int64(pol.Window / time.Microsecond)
		s := now.UnixMicro()
		s -= s % w
		return [4]int64{s - w, s, s + w, s + 2*w}
	}
	start, end := pol.Period.Bounds(now)
	before, _ := pol.Period.Bounds(start.Add(-time.Nanosecond))
	_, after := pol.Period.Bounds(end)
	return [4]int64{before.UnixMicro(), start.UnixMicro(), end.UnixMicro(), after.UnixMicro()}
}

// run resolves the plan of req.Key and applies op to every policy of it in
// one step. For a reset (reset true) every part is refunded in full. When
// used is not nil, it receives each period counter's count.
func (p *Planned) run(ctx context.Context, req ratekit.Request, op kvstore.Op, reset bool, used *[]int64) ([]ratekit.Decision, error) {
	if err := validate(&req, reset); err != nil {
		return nil, err
	}
	sc := getScratch()
	defer multiPool.Put(sc)
	pols, err := p.resolve(ctx, req.Key, sc)
	if err != nil {
		return nil, err
	}
	if err := checkParts(&req, len(pols), "plan"); err != nil {
		return nil, err
	}
	var now time.Time
	for i := range pols {
		pp := &pols[i]
		key, cost := part(&req, i)
		if op != kvstore.OpRefund && cost > pp.policy.Quota {
			return nil, fmt.Errorf("%w: part %d (%s): cost %d, quota %d", ratekit.ErrCostExceedsQuota, i, pp.policy.Name, cost, pp.policy.Quota)
		}
		sc.keys = p.appendRecord(sc.keys, pp)
		if pp.unit > 0 {
			sc.add(key, bucketUpdate(pp, cost, reset))
			continue
		}
		if now.IsZero() {
			now = p.now()
		}
		sc.periods[i] = kvstore.PeriodBounds{Bounds: p.periodBounds(&pp.policy, now), Quota: pp.policy.Quota}
		u := kvstore.Update{Period: &sc.periods[i], N: cost}
		if reset {
			u.N = kvstore.MaxValue
		}
		sc.add(key, u)
	}
	id := ""
	if p.idem != nil && req.IdempotencyKey != "" && op != kvstore.OpPeek && !reset {
		id = p.idempotencyID(req.Key, req.IdempotencyKey)
	}
	parts, err := p.apply(ctx, req.Key, id, op, pols, sc)
	if err != nil {
		return nil, fmt.Errorf("tokenbucket: %w", err)
	}
	if used != nil {
		*used = make([]int64, len(parts))
		for i := range parts {
			(*used)[i] = sc.res[i].Used
		}
	}
	return parts, nil
}

// idempotencyID returns the id under which the store records a step of
// key with idempotency key idem: Prefix, ":", and the first 128 bits of
// the SHA-256 of key and idem in unpadded URL-safe base64 (22 bytes), so
// that Planned limiters of different prefixes, and different keys, never
// share a record, and the id stays short (the store keeps it in the key's
// item, whose size a write costs) whatever the lengths of key and idem. A
// charge and the refund that undoes it, given the same key and idem,
// share it.
func (p *Planned) idempotencyID(key, idem string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(key)))])
	h.Write([]byte(key))
	h.Write([]byte(idem))
	var sum [sha256.Size]byte
	return p.prefix + base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0])[:16])
}

// appendRecord appends to buf the name of pp's record up to the key that
// it counts: Prefix:name/b<quota>.<window µs>: for a bucket, and
// Prefix:name/p: for a period counter.
func (p *Planned) appendRecord(buf []byte, pp *multiPolicy) []byte {
	buf = append(buf, p.prefix...)
	buf = append(buf, pp.policy.Name...)
	if pp.unit == 0 {
		return append(buf, "/p:"...)
	}
	buf = append(buf, "/b"...)
	buf = strconv.AppendInt(buf, pp.policy.Quota, 10)
	buf = append(buf, '.')
	buf = strconv.AppendInt(buf, int64(pp.policy.Window/time.Microsecond), 10)
	return append(buf, ':')
}

// bucketUpdate returns the update of bucket pp for cost, or for a reset.
func bucketUpdate(pp *multiPolicy, cost int64, reset bool) kvstore.Update {
	if reset {
		return kvstore.Update{Refill: pp.refill, N: pp.refill.Burst}
	}
	// A refund never fills above the burst: a larger one is the burst,
	// which also keeps cost × unit from overflowing.
	return kvstore.Update{Refill: pp.refill, N: min(cost, pp.policy.Quota) * pp.unit}
}

// Allow takes req.Cost units (or each part's cost) from every policy of
// the key's plan when all have them available, and otherwise takes
// nothing, in one step of the store after the plan lookup. Errors: those
// of ratekit.Request.Validate; an error matching ratekit.ErrInvalidRequest
// when Parts is non-nil and its length is not the number of the plan's
// policies; ratekit.ErrCostExceedsQuota when a cost exceeds a policy's
// quota; an error matching ratekit.ErrInvalidConfig for a plan that
// ratekit.Plan.Validate refuses or that Planned cannot count (see
// [Planned]); the Plan func's error, wrapped; ratekit.ErrClockSkew; and
// the store's error (wrapped; one caused by ctx wraps ctx.Err()), after
// which the request was counted by every policy or by none (repeating it
// with the same IdempotencyKey, on a store that honours it, counts it at
// most once in all).
func (p *Planned) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	parts, err := p.run(ctx, req, kvstore.OpTake, false, nil)
	if err != nil {
		return ratekit.Decision{}, err
	}
	return ratekit.Combine(parts), nil
}

// Peek reports the Decision that Allow would return for req now, taking
// nothing. It returns the same errors as Allow.
func (p *Planned) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	parts, err := p.run(ctx, req, kvstore.OpPeek, false, nil)
	if err != nil {
		return ratekit.Decision{}, err
	}
	return ratekit.Combine(parts), nil
}

// Refund gives req.Cost units (or each part's cost) back to every policy
// of the key's current plan, by the rules on [Planned], in one step, and
// reports the resulting Decision (Allowed true). It returns the same
// errors as Allow, except that a cost above a quota is accepted.
func (p *Planned) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	parts, err := p.run(ctx, req, kvstore.OpRefund, false, nil)
	if err != nil {
		return ratekit.Decision{}, err
	}
	return ratekit.Combine(parts), nil
}

// Reset forgets key under every policy of its current plan, in one step:
// its buckets are full again and its period counts zero. Records kept
// under other plans' policies, or under a bucket's earlier shape, are not
// touched. It returns ratekit.ErrEmptyKey or ratekit.ErrKeyTooLong for an
// invalid key, the plan errors of Allow, ratekit.ErrClockSkew, and the
// store's error (wrapped).
func (p *Planned) Reset(ctx context.Context, key string) error {
	_, err := p.run(ctx, ratekit.Request{Key: key, Cost: 1}, kvstore.OpRefund, true, nil)
	return err
}

// Usage returns, for each policy of key's current plan in order, what key
// used of its bucket or current period, what remains and when it resets,
// read in one step (a peek: it takes nothing) on the store's clock, with
// the figures a Decision would carry: for a period, Used is the units
// counted in it (it can exceed the quota after a downgrade) and
// ResetAfter the time to its end; for a bucket, Used is Quota − Remaining.
// It returns ratekit.ErrEmptyKey or ratekit.ErrKeyTooLong for an invalid
// key and the other errors of Allow.
func (p *Planned) Usage(ctx context.Context, key string) ([]ratekit.Usage, error) {
	if err := ratekit.ValidateKey(key); err != nil {
		return nil, err
	}
	var used []int64
	parts, err := p.run(ctx, ratekit.Request{Key: key, Cost: 1}, kvstore.OpPeek, false, &used)
	if err != nil {
		return nil, err
	}
	u := make([]ratekit.Usage, len(parts))
	for i, d := range parts {
		u[i] = ratekit.Usage{Policy: d.Policy, Used: d.Quota - d.Remaining, Remaining: d.Remaining, ResetAfter: d.ResetAfter}
		if d.Policy.Algorithm == ratekit.FixedWindow {
			u[i].Used = used[i]
		}
	}
	return u, nil
}

// PeriodUsage calls fn with the units every key used in each period of
// the policy named policy (a FixedWindow policy with a Period, in any
// plan) that starts in [from, to), skipping periods in which nothing was
// used: what to bill. It reads the store's period history
// (kvstore.PeriodHistory; dynamostore keeps one), in the order the store
// documents. Keys with different billing anchors have different period
// starts: pass the range of starts a billing run covers. The step that
// starts a key's next period keeps the count of the one it ends, so each
// period is reported once, the figure of an ended period is exact (the
// units admitted less refunds), and a period in progress is read as it
// stands. A period's Key is the key its policy counted: Request.Key, or
// the policy's part key when the request had Parts. Ended periods are
// reported as long as the store keeps them (dynamostore:
// Config.HistoryTTL).
//
// It returns an error matching ratekit.ErrInvalidConfig for an invalid
// policy name, one matching errors.ErrUnsupported when the store keeps no
// period history (memstore and the Redis stores) or the Planned has no
// Group (a history holds the counters of groups), fn's error as is, and
// the store's error, wrapped (one caused by ctx wraps ctx.Err()).
func (p *Planned) PeriodUsage(ctx context.Context, policy string, from, to time.Time, fn func(ratekit.PeriodUsage) error) error {
	if err := ratekit.ValidatePolicyName(policy); err != nil {
		return configErr("planned: PeriodUsage: %v", err)
	}
	h, ok := p.store.(kvstore.PeriodHistory)
	if !ok {
		return fmt.Errorf("tokenbucket: PeriodUsage: store %T keeps no period history (kvstore.PeriodHistory): %w", p.store, errors.ErrUnsupported)
	}
	if !p.group {
		return fmt.Errorf("tokenbucket: PeriodUsage: a store's period history holds the counters of groups, and this Planned has no Group: %w", errors.ErrUnsupported)
	}
	prefix := p.prefix + policy + "/p:"
	var fnErr error
	err := h.PeriodUsage(ctx, prefix, from.UnixMicro(), to.UnixMicro(), func(u kvstore.PeriodUsage) error {
		key, ok := strings.CutPrefix(u.Key, prefix)
		if !ok || key == "" {
			return fmt.Errorf("the store reported record %q, which is not a period of %q", u.Key, prefix)
		}
		fnErr = fn(ratekit.PeriodUsage{Key: key, Start: time.UnixMicro(u.Start).UTC(), End: time.UnixMicro(u.End).UTC(), Used: u.Used})
		return fnErr
	})
	if err == nil || (fnErr != nil && err == fnErr) {
		return err
	}
	return fmt.Errorf("tokenbucket: PeriodUsage: %w", err)
}
