package durable

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore"
)

// PeriodUsage is what one key used in one period of a policy with a
// Period, as [Planned.PeriodUsage] and [Limiter.PeriodUsage] report it:
// [ratekit.PeriodUsage], the type every store's billing history shares.
type PeriodUsage = ratekit.PeriodUsage

// PlannedConfig configures a [Planned].
type PlannedConfig struct {
	// Store is the PostgreSQL store, one per pool ([pgstore.New]).
	// Required.
	Store *pgstore.Store

	// Prefix names this Planned's counts in the shared tables: each
	// policy counts under Prefix + ":" + its name, which must be at most
	// 64 bytes. Required; it must pass [ratekit.ValidatePolicyName].
	Prefix string

	// Durability selects [Logged] or [Unlogged] tables, as
	// [Config.Durability]. Required.
	Durability Durability

	// SynchronousCommit is [Config.SynchronousCommit].
	SynchronousCommit bool

	// CleanupProbability is [Config.CleanupProbability], for the counters
	// of every plan's policies.
	CleanupProbability float64

	// Plan returns the plan of key, called once per Allow, Peek, Refund,
	// Reset and Usage. It must be safe for concurrent use, and is best
	// served from memory (a decision waits for it). Its error is returned
	// wrapped, and nothing is decided.
	Plan func(ctx context.Context, key string) (ratekit.Plan, error)
}

// Planned is a [ratekit.Limiter] that decides each request against the
// policies of its key's plan, resolved per request by PlannedConfig.Plan,
// without a limiter per plan: all of the plan's policies at once, all or
// nothing, in one round trip, as a [Composite] does. Each policy keeps the
// guarantee of its algorithm as [Config.Policy] states it, periods
// included (a key's billing anchor is its plan's Period.Anchor).
//
// Counts are kept per key and policy name, not per plan, so a plan change
// takes effect on the key's next decision and keeps what was used under
// the policies both plans name: after an upgrade the larger quota leaves
// more remaining; after a downgrade Remaining is never below zero (the
// count stays, so the key waits for the period's end) and no period starts
// afresh. A policy the new plan drops stops being counted; one it adds
// starts from zero.
//
// Refunds give units back to the current window or period of each policy
// of the key's current plan, never above its quota. A policy the plan
// gained since the charge gets nothing when its count is zero. A refund
// whose IdempotencyKey is that of the charge it undoes (within 32 days)
// gives nothing back to a period that started after the charge, so a
// refund that crosses a period's end refunds nothing there; without an
// IdempotencyKey, the refund goes to the current period.
//
// Planned implements [ratekit.Peeker], [ratekit.Refunder] and
// [ratekit.Resetter], and honours [ratekit.Request.IdempotencyKey] (a
// retried Allow or Refund counts once within 32 days, whatever the plan).
// Request.Parts, when not nil, gives one part per policy of the key's plan.
// It is safe for concurrent use and starts no goroutine.
type Planned struct {
	store *pgengine.Store
	cfg   PlannedConfig
	idem  *pgengine.Counter // the idempotency records' prefix, for Cleanup

	mu    sync.Mutex
	plans map[string]*pgengine.Composite // by plan shape (see shape)
}

var (
	_ ratekit.Limiter  = (*Planned)(nil)
	_ ratekit.Peeker   = (*Planned)(nil)
	_ ratekit.Refunder = (*Planned)(nil)
	_ ratekit.Resetter = (*Planned)(nil)
)

// maxCachedPlans bounds the plan shapes a Planned keeps prepared; past it
// the cache starts again empty.
const maxCachedPlans = 256

// NewPlanned returns a Planned for cfg. It returns an error matching
// [ratekit.ErrInvalidConfig] for an invalid configuration and does not
// contact the database.
func NewPlanned(cfg PlannedConfig) (*Planned, error) {
	if cfg.Store == nil {
		return nil, configErr("nil Store")
	}
	store := (*pgengine.Store)(cfg.Store)
	if !store.Made() {
		return nil, configErr("Store not made by pgstore.New")
	}
	if cfg.Plan == nil {
		return nil, configErr("nil Plan func")
	}
	if err := ratekit.ValidatePolicyName(cfg.Prefix); err != nil {
		return nil, configErr("Prefix: %v", err)
	}
	if cfg.Durability != Unlogged && cfg.Durability != Logged {
		return nil, configErr("Durability must be durable.Logged or durable.Unlogged, got %d", int(cfg.Durability))
	}
	idem, err := store.Counter(pgengine.CounterConfig{
		Prefix: cfg.Prefix, Algorithm: ratekit.FixedWindow, Quota: 1, Window: time.Millisecond,
		Durability: pgengine.Durability(cfg.Durability), CleanupProbability: -1,
	})
	if err != nil {
		return nil, configErr("%v", err)
	}
	return &Planned{store: store, cfg: cfg, idem: idem, plans: make(map[string]*pgengine.Composite)}, nil
}

// plan resolves, validates and prepares the plan of key, which the caller
// has validated.
func (p *Planned) plan(ctx context.Context, key string) (ratekit.Plan, *pgengine.Composite, []ratekit.Period, error) {
	plan, err := p.cfg.Plan(ctx, key)
	if err != nil {
		return ratekit.Plan{}, nil, nil, fmt.Errorf("durable: plan of key: %w", err)
	}
	if err := plan.Validate(); err != nil {
		return ratekit.Plan{}, nil, nil, configErr("%v", err)
	}
	shape := shape(plan)
	p.mu.Lock()
	c := p.plans[shape]
	p.mu.Unlock()
	if c == nil {
		if c, err = p.prepare(plan); err != nil {
			return ratekit.Plan{}, nil, nil, err
		}
		p.mu.Lock()
		if len(p.plans) >= maxCachedPlans {
			clear(p.plans)
		}
		p.plans[shape] = c
		p.mu.Unlock()
	}
	periods := make([]ratekit.Period, len(plan.Policies))
	for i, pol := range plan.Policies {
		periods[i] = pol.Period
	}
	return plan, c, periods, nil
}

// shape returns what the prepared statement of plan depends on: each
// policy's name, algorithm, quota, window and whether it has a period (the
// period itself, anchor and zone, is an argument of every call).
func shape(plan ratekit.Plan) string {
	var b strings.Builder
	for _, pol := range plan.Policies {
		b.WriteString(pol.Name)
		b.WriteByte('|')
		b.WriteString(strconv.Itoa(int(pol.Algorithm)))
		b.WriteByte('|')
		b.WriteString(strconv.FormatInt(pol.Quota, 10))
		b.WriteByte('|')
		b.WriteString(strconv.FormatInt(int64(pol.Window), 10))
		b.WriteByte('|')
		b.WriteString(strconv.FormatBool(!pol.Period.IsZero()))
		b.WriteByte(';')
	}
	return b.String()
}

// prepare returns the composite that decides plan's policies.
func (p *Planned) prepare(plan ratekit.Plan) (*pgengine.Composite, error) {
	counters := make([]*pgengine.Counter, len(plan.Policies))
	for i, pol := range plan.Policies {
		prefix := p.cfg.Prefix + ":" + pol.Name
		if len(prefix) > ratekit.MaxPolicyNameLen {
			return nil, configErr("plan %q: prefix %q is over %d bytes", plan.Name, prefix, ratekit.MaxPolicyNameLen)
		}
		c, err := p.store.Counter(pgengine.CounterConfig{
			Prefix:             prefix,
			Algorithm:          pol.Algorithm,
			Quota:              pol.Quota,
			Window:             pol.Window,
			Period:             pol.Period,
			Durability:         pgengine.Durability(p.cfg.Durability),
			SynchronousCommit:  p.cfg.SynchronousCommit,
			CleanupProbability: p.cfg.CleanupProbability,
		})
		if err != nil {
			return nil, configErr("plan %q: policy %q: %v", plan.Name, pol.Name, err)
		}
		counters[i] = c
	}
	c, err := pgengine.NewCompositeWith(pgengine.CompositeOptions{
		Scope:             "planned/" + p.cfg.Prefix,
		IdempotencyPrefix: p.cfg.Prefix,
		IdempotencyTTL:    pgengine.PeriodIdempotencyTTL,
	}, counters...)
	if err != nil {
		return nil, configErr("plan %q: %v", plan.Name, err)
	}
	return c, nil
}

// decide validates req, once, and decides op on it under the key's plan.
func (p *Planned) decide(ctx context.Context, op pgengine.Op, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	plan, c, periods, err := p.plan(ctx, req.Key)
	if err != nil {
		return ratekit.Decision{}, err
	}
	r, err := c.Decide(ctx, op, req.Key, req.Cost, req.Parts, req.IdempotencyKey, periods)
	if err != nil {
		return ratekit.Decision{}, err
	}
	parts := make([]ratekit.Decision, len(r))
	for i := range r {
		parts[i] = outcomeDecision(plan.Policies[i], r[i])
	}
	return ratekit.Combine(parts), nil
}

// Allow takes req.Cost units (or each part's cost) from every policy of the
// key's plan when all have them available, and otherwise takes nothing, in
// one round trip after the plan lookup. See [ratekit.Limiter] for the
// contract. Errors: those of [ratekit.Request.Validate];
// [ratekit.ErrCostExceedsQuota] when a cost exceeds a policy's quota; an
// error matching [ratekit.ErrInvalidConfig] for an invalid plan (see
// [ratekit.Plan.Validate]); the Plan func's error, wrapped; [ratekit.ErrClockSkew];
// store errors wrapping the pgx error (and ctx.Err()), after which the
// request may have been counted by every policy or by none.
func (p *Planned) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return p.decide(ctx, pgengine.OpTake, req)
}

// Peek reports the Decision that Allow would return for req now without
// taking anything. It returns the same errors as Allow.
func (p *Planned) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return p.decide(ctx, pgengine.OpPeek, req)
}

// Refund gives req.Cost units (or each part's cost) back to every policy of
// the key's current plan, by the rules on [Planned], in one statement. A
// non-empty IdempotencyKey makes a retried refund count once. It returns
// the same errors as Allow, except that a cost above a quota is accepted.
func (p *Planned) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return p.decide(ctx, pgengine.OpRefund, req)
}

// Reset forgets key under every policy of its current plan and its
// idempotency records, in one statement that takes the key's locks in the
// order decisions do. Counts under policies of other plans, and the usage
// of ended periods, stay. It returns [ratekit.ErrEmptyKey] or
// [ratekit.ErrKeyTooLong] for an invalid key, the plan errors of Allow, and
// store errors wrapping the pgx error.
func (p *Planned) Reset(ctx context.Context, key string) error {
	if err := ratekit.ValidateKey(key); err != nil {
		return err
	}
	_, c, _, err := p.plan(ctx, key)
	if err != nil {
		return err
	}
	return c.Reset(ctx, key)
}

// Usage returns, for each policy of key's current plan in order, what key
// used of its current window or period, what remains and when it resets,
// read in one statement (one snapshot, on the database clock) that takes
// and locks nothing: the figures of a Peek. It returns the plan errors of
// Allow, [ratekit.ErrClockSkew] and store errors wrapping the pgx error.
func (p *Planned) Usage(ctx context.Context, key string) ([]ratekit.Usage, error) {
	if err := ratekit.ValidateKey(key); err != nil {
		return nil, err
	}
	plan, c, periods, err := p.plan(ctx, key)
	if err != nil {
		return nil, err
	}
	r, err := c.Decide(ctx, pgengine.OpPeek, key, 1, nil, "", periods)
	if err != nil {
		return nil, err
	}
	u := make([]ratekit.Usage, len(r))
	for i := range r {
		d := outcomeDecision(plan.Policies[i], r[i])
		u[i] = ratekit.Usage{Policy: d.Policy, Used: r[i].Used, Remaining: d.Remaining, ResetAfter: d.ResetAfter}
	}
	return u, nil
}

// PeriodUsage calls fn, in order of key and period start, with the units
// every key used in each period of the policy named policy (one with a
// Period, in any plan) that starts in [from, to), skipping periods in which
// nothing was used: what to bill. Keys with different billing anchors have
// different period starts; pass the range of starts a billing run covers.
// Each statement reads up to 1,000 rows in one snapshot, and a period's
// count is in exactly one place at any time (the key's counter row while
// the period is the key's latest, the period_usage table once a later
// period has started), so the figures of ended periods are exact: each is
// the units admitted less refunds. Periods in progress are read as they
// stand. The statement is documented in docs/postgres.md. Ended periods
// are kept in the period_usage table until deleted; a key's latest period
// stays in its counter row until 400 days after its end, or until [Planned.Reset].
// It returns an error matching [ratekit.ErrInvalidConfig] for an invalid
// policy name, fn's error as is, and store errors wrapping the pgx error.
func (p *Planned) PeriodUsage(ctx context.Context, policy string, from, to time.Time, fn func(PeriodUsage) error) error {
	if err := ratekit.ValidatePolicyName(policy); err != nil {
		return configErr("%v", err)
	}
	if prefix := p.cfg.Prefix + ":" + policy; len(prefix) > ratekit.MaxPolicyNameLen {
		return configErr("prefix %q is over %d bytes", prefix, ratekit.MaxPolicyNameLen)
	}
	return p.store.PeriodUsage(ctx, pgengine.Durability(p.cfg.Durability), p.cfg.Prefix+":"+policy, from, to,
		func(u pgengine.PeriodUsage) error { return fn(PeriodUsage(u)) })
}

// Cleanup deletes the expired idempotency records of this Planned and
// returns how many it deleted; expired counter rows are deleted by
// decisions, as [Config.CleanupProbability] says. Call it from a scheduled
// job when requests carry idempotency keys. Errors wrap the pgx error.
func (p *Planned) Cleanup(ctx context.Context) (int64, error) {
	return p.idem.Cleanup(ctx)
}
