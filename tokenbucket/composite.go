package tokenbucket

import (
	"context"
	"fmt"
	"strings"
	"sync"

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
	// (memstore, redisstore and rueidisstore do).
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
	store   kvstore.MultiAtomic
	group   bool
	buckets []*Limiter // each bucket's arithmetic and policy; never used to decide
	prefix  []string   // Name + ":"
}

var (
	_ ratekit.Limiter  = (*Composite)(nil)
	_ ratekit.Peeker   = (*Composite)(nil)
	_ ratekit.Refunder = (*Composite)(nil)
	_ ratekit.Resetter = (*Composite)(nil)
)

// NewComposite returns a Composite for cfg. It returns an error matching
// ratekit.ErrInvalidConfig for no buckets, any bucket that [New] would
// refuse, duplicate or overlapping names (see CompositeConfig.Buckets), a
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
	c := &Composite{store: m, group: cfg.Group}
	for i, b := range cfg.Buckets {
		l, err := New(Config{Name: b.Name, Burst: b.Burst, RefillRate: b.RefillRate, Mode: Eventual, Store: cfg.Store})
		if err != nil {
			return nil, invalid("bucket %d: %v", i, err)
		}
		l.step = clockStep(cfg.Store)
		for j, p := range c.prefix {
			if q := b.Name + ":"; strings.HasPrefix(p, q) || strings.HasPrefix(q, p) {
				return nil, invalid("bucket names %q and %q are equal or overlap (one is the other followed by ':')", cfg.Buckets[j].Name, b.Name)
			}
		}
		c.buckets = append(c.buckets, l)
		c.prefix = append(c.prefix, b.Name+":")
	}
	return c, nil
}

// Policies returns the policies of the composite's buckets, in order.
func (c *Composite) Policies() []ratekit.Policy {
	p := make([]ratekit.Policy, len(c.buckets))
	for i, b := range c.buckets {
		p[i] = b.policy
	}
	return p
}

// scratch is a decision's bookkeeping, pooled: the store's arguments escape
// through the kvstore.MultiAtomic interface, and would otherwise cost two
// allocations per decision.
type scratch struct {
	upd  []kvstore.Update
	res  []kvstore.OpResult
	keys []byte
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// run validates req and applies op to every bucket it counts, in one step,
// and returns the decision. A refund reports every part as allowed.
func (c *Composite) run(ctx context.Context, req ratekit.Request, op kvstore.Op) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	n := len(c.buckets)
	if req.Parts != nil && len(req.Parts) != n {
		return ratekit.Decision{}, fmt.Errorf("%w: %d parts for a composite of %d policies", ratekit.ErrInvalidRequest, len(req.Parts), n)
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	upd, res, buf := sc.upd[:0], sc.res[:0], sc.keys[:0]
	for i, b := range c.buckets {
		key, cost := req.Key, req.Cost
		if req.Parts != nil {
			key, cost = req.Parts[i].Key, req.Parts[i].Cost
		}
		if cost > b.burst {
			return ratekit.Decision{}, fmt.Errorf("%w: part %d (%s): cost %d, burst %d", ratekit.ErrCostExceedsQuota, i, b.policy.Name, cost, b.burst)
		}
		buf = append(buf, c.prefix[i]...)
		buf = append(buf, key...)
		upd = append(upd, kvstore.Update{Refill: b.refill, N: cost * b.unit})
		res = append(res, kvstore.OpResult{})
	}
	// Every store key in one string, one allocation: the store may keep
	// a key it is given.
	all, at := string(buf), 0
	for i := range upd {
		end := at + len(c.prefix[i])
		if req.Parts != nil {
			end += len(req.Parts[i].Key)
		} else {
			end += len(req.Key)
		}
		upd[i].Key, at = all[at:end], end
	}
	sc.upd, sc.res, sc.keys = upd, res, buf
	group := ""
	if c.group {
		group = req.Key
	}
	err := c.store.UpdateMulti(ctx, group, op, upd, res)
	for i := range upd {
		upd[i].Key = "" // the pooled scratch keeps no key alive
	}
	if err != nil {
		return ratekit.Decision{}, fmt.Errorf("tokenbucket: %w", err)
	}
	parts := make([]ratekit.Decision, n)
	for i, b := range c.buckets {
		b.decide(&parts[i], res[i].OK || op == kvstore.OpRefund, res[i].Remaining, upd[i].N)
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
	return c.run(ctx, req, kvstore.OpTake)
}

// Peek reports the decision Allow would make for req now, taking nothing.
// It returns the same errors as Allow.
func (c *Composite) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.run(ctx, req, kvstore.OpPeek)
}

// Refund returns each part's cost to its policy's bucket, never filling one
// above its Burst, in one atomic step, and reports the resulting decision
// (Allowed true). It returns the same errors as Allow.
func (c *Composite) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return c.run(ctx, req, kvstore.OpRefund)
}

// Reset fills, in one atomic step, the buckets that a request with Key key
// and nil Parts counts: every policy's bucket of key (in the group of key
// when CompositeConfig.Group is set). Buckets counted under other part keys
// are not touched; refund them instead. It returns ratekit.ErrEmptyKey or
// ratekit.ErrKeyTooLong for an invalid key and the store's error (wrapped)
// when the store fails.
func (c *Composite) Reset(ctx context.Context, key string) error {
	if err := ratekit.ValidateKey(key); err != nil {
		return err
	}
	upd := make([]kvstore.Update, len(c.buckets))
	for i, b := range c.buckets {
		upd[i] = kvstore.Update{Key: c.prefix[i] + key, Refill: b.refill, N: b.refill.Burst}
	}
	group := ""
	if c.group {
		group = key
	}
	if err := c.store.UpdateMulti(ctx, group, kvstore.OpRefund, upd, make([]kvstore.OpResult, len(upd))); err != nil {
		return fmt.Errorf("tokenbucket: reset: %w", err)
	}
	return nil
}
