package durable

import (
	"context"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
)

// Composite is a [ratekit.Limiter] over several durable policies that
// decides for all of them at once: "10 requests a second and 1,000 a day"
// per API key, or "100 a minute per user and 5,000 a minute per
// organisation". Each decision is one call of a server-side function (one
// round trip, one transaction, the database clock): it locks every policy's key in a fixed order, so
// composites over the same keys never deadlock, and admits a request only
// when every policy admits it, then taking from every policy; a denial takes
// nothing from any. Each policy keeps the guarantee of its algorithm.
//
// A request's [ratekit.Request.Parts] gives each policy, in the order passed
// to [NewComposite], its own key and cost; nil Parts counts Key and Cost
// under every policy. The Decision's Parts holds one Decision per policy,
// summed up as [ratekit.Decision.Parts] documents.
//
// Composite implements [ratekit.Peeker], [ratekit.Refunder] and
// [ratekit.Resetter], and honours [ratekit.Request.IdempotencyKey]: a
// retried Allow or Refund with the same Key and idempotency key counts once
// within the longest of the policies' windows. It is safe for concurrent use
// and starts no goroutine.
type Composite struct {
	c        *pgengine.Composite
	limiters []*Limiter
}

var (
	_ ratekit.Limiter  = (*Composite)(nil)
	_ ratekit.Peeker   = (*Composite)(nil)
	_ ratekit.Refunder = (*Composite)(nil)
	_ ratekit.Resetter = (*Composite)(nil)
)

// NewComposite returns a Composite over the policies of limiters, in that
// order, each created with [New]. The limiters must share one Store and one
// Durability and have distinct prefixes, 1 to 16 of them; every algorithm
// may take part, the sliding log included. Their SynchronousCommit settings
// combine to the safer one. The limiters stay usable on their own and
// share their counts with the composite. Decisions of the composite never
// use the limiters' denied caches; its admissions, refunds and resets
// remove the keys they change from them. NewComposite returns an error matching [ratekit.ErrInvalidConfig]
// for an invalid combination and does not contact the database.
func NewComposite(limiters ...*Limiter) (*Composite, error) {
	counters := make([]*pgengine.Counter, len(limiters))
	for i, l := range limiters {
		if l == nil {
			return nil, configErr("composite limiter %d is nil", i)
		}
		counters[i] = l.counter
	}
	c, err := pgengine.NewComposite(counters...)
	if err != nil {
		return nil, configErr("%v", err)
	}
	return &Composite{c: c, limiters: append([]*Limiter(nil), limiters...)}, nil
}

// Policies returns the composite's policies, in order.
func (c *Composite) Policies() []ratekit.Policy {
	p := make([]ratekit.Policy, len(c.limiters))
	for i, l := range c.limiters {
		p[i] = l.policy
	}
	return p
}

// Allow takes each part's cost from its policy when every policy has it
// available, and otherwise takes nothing, in one round trip. See
// [ratekit.Limiter] for the contract. Errors: those of
// [ratekit.Request.Validate]; [ratekit.ErrInvalidRequest] when Parts is
// non-nil and its length is not the number of policies;
// [ratekit.ErrCostExceedsQuota] when a part's cost exceeds its policy's
// limit; store errors wrapping the pgx error (and ctx.Err()), after which
// the request may have been counted by every policy or by none.
func (c *Composite) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	c.begin(req)
	r, err := c.c.Take(ctx, req.Key, req.Cost, req.Parts, req.IdempotencyKey)
	if err != nil {
		c.finish(req, true)
		return ratekit.Decision{}, err
	}
	d := c.decision(r)
	c.finish(req, d.Allowed)
	return d, nil
}

// Peek reports the Decision that Allow would return for req now without
// taking anything. It returns the same errors as Allow.
func (c *Composite) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	r, err := c.c.Peek(ctx, req.Key, req.Cost, req.Parts)
	if err != nil {
		return ratekit.Decision{}, err
	}
	return c.decision(r), nil
}

// Refund gives every part's cost back to its policy (see [Limiter.Refund]),
// all in one statement, and removes the parts' keys from the limiters'
// denied caches. A non-empty IdempotencyKey makes a retried refund count
// once. It returns the same errors as Allow, except that a cost above a
// limit is accepted.
func (c *Composite) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	c.begin(req)
	r, err := c.c.Refund(ctx, req.Key, req.Cost, req.Parts, req.IdempotencyKey)
	c.finish(req, true)
	if err != nil {
		return ratekit.Decision{}, err
	}
	return c.decision(r), nil
}

// Reset forgets key under every policy of the composite (counters,
// sliding-log entries, idempotency records, the composite's own included)
// and removes it from the limiters' denied caches, in one statement that
// takes the key's locks in the order every decision does, so it never
// deadlocks with decisions in flight. A key
// that requests name only in their Parts (an organisation's) is forgotten
// only when it is passed to Reset itself. It returns [ratekit.ErrEmptyKey]
// or [ratekit.ErrKeyTooLong] for an invalid key and a store error wrapping
// the pgx error otherwise.
func (c *Composite) Reset(ctx context.Context, key string) error {
	for _, l := range c.limiters {
		l.cache.begin(key)
	}
	err := c.c.Reset(ctx, key)
	for _, l := range c.limiters {
		l.cache.finish(key, true)
	}
	return err
}

// partKey returns the key that req counts under policy i.
func (c *Composite) partKey(req ratekit.Request, i int) string {
	if len(req.Parts) == len(c.limiters) {
		return req.Parts[i].Key
	}
	return req.Key
}

// begin registers, in the limiters' denied caches, a decision about the
// keys req counts: while it is in flight, they answer none of those keys.
func (c *Composite) begin(req ratekit.Request) {
	for i, l := range c.limiters {
		l.cache.begin(c.partKey(req, i))
	}
}

// finish ends what begin registered; changed reports that the database
// may have changed the keys.
func (c *Composite) finish(req ratekit.Request, changed bool) {
	for i, l := range c.limiters {
		l.cache.finish(c.partKey(req, i), changed)
	}
}

func (c *Composite) decision(r []pgengine.Outcome) ratekit.Decision {
	parts := make([]ratekit.Decision, len(r))
	for i := range r {
		parts[i] = c.limiters[i].decision(r[i])
	}
	return ratekit.Combine(parts)
}
