package tokenbucket

import (
	"context"
	"fmt"
	"strings"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// Bucket is one policy of a [Composite]: a bucket of Burst tokens refilled at
// RefillRate, named Name. The fields mean what [Config]'s fields of the same
// names mean.
type Bucket struct {
	Name       string
	Burst      int64
	RefillRate Rate
}

// CompositeConfig configures a [Composite]. Buckets, Mode and Store are
// required.
type CompositeConfig struct {
	// Buckets are the composite's policies, at least one, in the order of
	// ratekit.Request.Parts and ratekit.Decision.Parts. Names must be
	// distinct, and no name may be another followed by ':' and more (the
	// store keys of "a" and "a:b" could meet).
	Buckets []Bucket

	// Mode must be Atomic: Eventual mode cannot take from several buckets
	// all or nothing, and NewComposite refuses it.
	Mode Mode

	// Store keeps the buckets; it must implement kvstore.MultiAtomic
	// (memstore, redisstore and rueidisstore do). Every bucket must fill
	// from empty in at least one step of its clock
	// (kvstore.ClockStepper): a millisecond on Redis.
	Store kvstore.Store

	// Group, when true, keeps every bucket of a decision in the group of
	// Request.Key (kvstore.MultiAtomic's groups: one hash slot on a Redis
	// Cluster). A bucket is then identified by Request.Key, its policy and
	// its part's key, so a request must name the same Key every time it
	// counts a bucket: for "per user and per organisation", make Key the
	// organisation and the parts the user and the organisation. Group is
	// required on a partitioned store (kvstore.MultiAtomic.Partitioned:
	// a Redis Cluster or Ring), whose keys one step cannot otherwise span.
	Group bool
}

// Composite is a token-bucket limiter of several policies that decide
// together ("10 a second and 1,000 a day"): a request takes its cost from
// every policy's bucket or from none, in one atomic step of the store
// (kvstore.MultiAtomic.UpdateMulti: one Lua script and one round trip on
// Redis, entry locks taken in key order in memory) with the store's clock.
//
// Policy i counts request.Parts[i].Key and .Cost, or Key and Cost when Parts
// is nil. Its bucket is stored under Buckets[i].Name + ":" + that key, in
// the group of Request.Key when CompositeConfig.Group is set, and in the
// store's ordinary keys otherwise: on Redis, a Limiter of the same name and
// key counts the same bucket; in a memstore.Store it does not, since a
// Limiter keeps its buckets in a scope of its own.
//
// Decisions carry one Decision per policy in Parts (Allowed there says
// whether that bucket alone held its cost), summed up into the top-level
// Decision by the rule ratekit.Decision documents. Composite implements
// ratekit.Limiter, ratekit.Peeker, ratekit.Refunder and ratekit.Resetter,
// ignores Request.State and Request.IdempotencyKey as Limiter does, and has
// no denied-key cache. It is safe for concurrent use.
type Composite struct {
	multi
	pols   []multiPolicy // each bucket's policy and arithmetic
	prefix []string      // Name + ":"
}

var (
	_ ratekit.Limiter  = (*Composite)(nil)
	_ ratekit.Peeker   = (*Composite)(nil)
	_ ratekit.Refunder = (*Composite)(nil)
	_ ratekit.Resetter = (*Composite)(nil)
)

// NewComposite returns a Composite for cfg. It returns an error matching
// ratekit.ErrInvalidConfig for no buckets, any bucket that [New] would
// refuse, one that fills faster than the store's clock step (see Store),
// duplicate or overlapping names (see CompositeConfig.Buckets), a
// Mode other than Atomic, a Store that is not a kvstore.MultiAtomic, or a
// partitioned store (a Redis Cluster) without Group.
func NewComposite(cfg CompositeConfig) (*Composite, error) {
	invalid := func(format string, args ...any) error {
		return configErr("composite: "+format, args...)
	}
	if len(cfg.Buckets) == 0 {
		return nil, invalid("no Buckets")
	}
	switch cfg.Mode {
	case Atomic:
	case Eventual:
		return nil, invalid("Eventual mode cannot take from several buckets all or nothing; use Atomic over a kvstore.MultiAtomic store")
	case 0:
		return nil, invalid("Mode is not set; a composite needs tokenbucket.Atomic")
	default:
		return nil, invalid("unknown %v", cfg.Mode)
	}
	if cfg.Store == nil {
		return nil, invalid("nil Store")
	}
	m, ok := cfg.Store.(kvstore.MultiAtomic)
	if !ok {
		return nil, invalid("Store %T does not implement kvstore.MultiAtomic", cfg.Store)
	}
	if m.Partitioned() && !cfg.Group {
		return nil, invalid("Store %T spreads keys over partitions (a Redis Cluster's hash slots) that one step cannot span; set Group to keep each decision's buckets in the group (hash slot) of Request.Key", cfg.Store)
	}
	c := &Composite{multi: multi{store: m, group: cfg.Group, step: clockStep(cfg.Store)}}
	for i, b := range cfg.Buckets {
		l, err := New(Config{Name: b.Name, Burst: b.Burst, RefillRate: b.RefillRate, Mode: Eventual, Store: cfg.Store})
		if err != nil {
			return nil, invalid("bucket %d: %v", i, err)
		}
		if problem := stepProblem(l.policy.Window, c.step); problem != "" {
			return nil, invalid("bucket %d (%s): %s", i, b.Name, problem)
		}
		for j, p := range c.prefix {
			if q := b.Name + ":"; strings.HasPrefix(p, q) || strings.HasPrefix(q, p) {
				return nil, invalid("bucket names %q and %q are equal or overlap (one is the other followed by ':')", cfg.Buckets[j].Name, b.Name)
			}
		}
		c.pols = append(c.pols, multiPolicy{policy: l.policy, refill: l.refill, unit: l.unit})
		c.prefix = append(c.prefix, b.Name+":")
	}
	return c, nil
}

// Policies returns the policies of the composite's buckets, in order.
func (c *Composite) Policies() []ratekit.Policy {
	p := make([]ratekit.Policy, len(c.pols))
	for i := range c.pols {
		p[i] = c.pols[i].policy
	}
	return p
}

// run validates req and applies op to every bucket it counts, in one step,
// and returns the decision. A refund reports every part as allowed. A reset
// (reset true) refunds every bucket of req.Key in full.
func (c *Composite) run(ctx context.Context, req ratekit.Request, op kvstore.Op, reset bool) (ratekit.Decision, error) {
	if err := validate(&req, reset); err != nil {
		return ratekit.Decision{}, err
	}
	if err := checkParts(&req, len(c.pols), "composite"); err != nil {
		return ratekit.Decision{}, err
	}
	sc := getScratch()
	defer multiPool.Put(sc)
	for i := range c.pols {
		b := &c.pols[i]
		key, cost := part(&req, i)
		if cost > b.policy.Quota {
			return ratekit.Decision{}, fmt.Errorf("%w: part %d (%s): cost %d, burst %d", ratekit.ErrCostExceedsQuota, i, b.policy.Name, cost, b.policy.Quota)
		}
		n := cost * b.unit
		if reset {
			n = b.refill.Burst
		}
		sc.keys = append(sc.keys, c.prefix[i]...)
		sc.add(key, kvstore.Update{Refill: b.refill, N: n})
	}
	parts, err := c.apply(ctx, req.Key, "", op, c.pols, sc)
	if err != nil {
		if reset {
			return ratekit.Decision{}, fmt.Errorf("tokenbucket: reset: %w", err)
		}
		return ratekit.Decision{}, fmt.Errorf("tokenbucket: %w", err)
	}
	return ratekit.Combine(parts), nil
}

// Allow takes each part's cost from its policy's bucket when every bucket
// holds its cost, and otherwise takes nothing. It returns the errors of
// ratekit.Request.Validate, an error matching ratekit.ErrInvalidRequest
// when Parts is non-nil and its length is not the number of buckets,
// ratekit.ErrCostExceedsQuota for a part's cost above its bucket's Burst, and
// the store's error (wrapped; an error caused by ctx wraps ctx.Err()) when
// the store fails. After a store error the step was applied to every bucket
// or to none.
func (c *Composite) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.run(ctx, req, kvstore.OpTake, false)
}

// Peek reports the decision Allow would make for req now, taking nothing.
// It returns the same errors as Allow.
func (c *Composite) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.run(ctx, req, kvstore.OpPeek, false)
}

// Refund returns each part's cost to its policy's bucket, never filling one
// above its Burst, in one atomic step, and reports the resulting decision
// (Allowed true). It returns the same errors as Allow.
func (c *Composite) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.run(ctx, req, kvstore.OpRefund, false)
}

// Reset fills, in one atomic step, the buckets that a request with Key key
// and nil Parts counts: every policy's bucket of key (in the group of key
// when CompositeConfig.Group is set). Buckets counted under other part keys
// are not touched; refund them instead. It returns ratekit.ErrEmptyKey or
// ratekit.ErrKeyTooLong for an invalid key and the store's error (wrapped)
// when the store fails.
func (c *Composite) Reset(ctx context.Context, key string) error {
	_, err := c.run(ctx, ratekit.Request{Key: key, Cost: 1}, kvstore.OpRefund, true)
	return err
}
