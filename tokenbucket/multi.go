package tokenbucket

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// multi is the one step that [Composite] and [Planned] decide with: the
// policies of a decision (a composite's, fixed at construction, or the
// plan of the request's key) counted together, all or nothing, in one
// UpdateMulti of the store. The two differ only in where their policies
// come from and how their records are named.
type multi struct {
	store kvstore.MultiAtomic
	idem  kvstore.IdempotentMulti // store, when it implements it; else nil
	group bool                    // records in the group of Request.Key
	step  time.Duration           // the store's clock step (see clockStep)
}

// multiPolicy is one policy of a multi-policy decision, as the store
// counts it.
type multiPolicy struct {
	policy ratekit.Policy
	refill kvstore.Refill // a bucket's; zero for a counter
	unit   int64          // a bucket's units per token; 0 for a counter
}

// multiScratch is a decision's bookkeeping, pooled: the store's arguments
// escape through the kvstore.MultiAtomic interface, and would otherwise
// cost allocations per decision. Records are added with add after their
// name's prefix is appended to keys, then sealed into one string by
// apply.
type multiScratch struct {
	pols    [ratekit.MaxPlanPolicies]multiPolicy // a resolved plan
	periods [ratekit.MaxPlanPolicies]kvstore.PeriodBounds
	upd     []kvstore.Update
	res     []kvstore.OpResult
	ends    []int  // where each record's key ends in keys
	keys    []byte // every record's key, one after another
}

var multiPool = sync.Pool{New: func() any { return new(multiScratch) }}

// getScratch returns an empty scratch from the pool.
func getScratch() *multiScratch {
	sc := multiPool.Get().(*multiScratch)
	sc.upd, sc.res, sc.ends, sc.keys = sc.upd[:0], sc.res[:0], sc.ends[:0], sc.keys[:0]
	return sc
}

// add completes the record whose name's prefix keys ends with: it appends
// key, and u (its Key set by apply).
func (sc *multiScratch) add(key string, u kvstore.Update) {
	sc.keys = append(sc.keys, key...)
	sc.ends = append(sc.ends, len(sc.keys))
	sc.upd = append(sc.upd, u)
	sc.res = append(sc.res, kvstore.OpResult{})
}

// part returns the key and cost that policy i of a multi-policy decision
// counts: Parts[i]'s, or the request's when Parts is nil.
func part(req *ratekit.Request, i int) (string, int64) {
	if req.Parts != nil {
		return req.Parts[i].Key, req.Parts[i].Cost
	}
	return req.Key, req.Cost
}

// checkParts returns an error matching ratekit.ErrInvalidRequest when req
// has Parts and not one per policy of what (of n policies).
func checkParts(req *ratekit.Request, n int, what string) error {
	if req.Parts != nil && len(req.Parts) != n {
		return fmt.Errorf("%w: %d parts for a %s of %d policies", ratekit.ErrInvalidRequest, len(req.Parts), what, n)
	}
	return nil
}

// apply applies op to the records added to sc, policy pols[i] counting
// record i, in one step of the store, and returns the decision of each
// policy. A refund reports every part as allowed. A non-empty id makes the
// step count once per id (kvstore.IdempotentMulti, which m.idem must
// then be); a step the store replays reports the outcome of the first (see
// replayed). It returns the store's error unwrapped.
func (m *multi) apply(ctx context.Context, key, id string, op kvstore.Op, pols []multiPolicy, sc *multiScratch) ([]ratekit.Decision, error) {
	// Every store key in one string, one allocation: the store may keep
	// a key it is given.
	all, at := string(sc.keys), 0
	for i, end := range sc.ends {
		sc.upd[i].Key, at = all[at:end], end
	}
	group := ""
	if m.group {
		group = key
	}
	var (
		replay bool
		err    error
	)
	if id != "" {
		replay, err = m.idem.UpdateMultiOnce(ctx, group, id, kvstore.MaxIdempotencyTTL, op, sc.upd, sc.res)
	} else {
		err = m.store.UpdateMulti(ctx, group, op, sc.upd, sc.res)
	}
	defer func() {
		for i := range sc.upd {
			sc.upd[i] = kvstore.Update{} // the pooled scratch keeps no key alive
		}
	}()
	if err != nil {
		return nil, err
	}
	if replay {
		replayed(pols, sc)
	}
	parts := make([]ratekit.Decision, len(pols))
	for i := range pols {
		m.decide(&parts[i], &pols[i], &sc.upd[i], sc.res[i], op)
	}
	return parts, nil
}

// replayed makes the period counters' results of a replayed step readable
// by decide: the store reports the first step's results, whose Now and
// Period refer to the bounds that step sent, which may not be this step's
// (its clock has moved on, perhaps into a later period). Each counter's
// bounds become those of the period that contains the first step's Now,
// so that the decision carries that step's period and time to its end.
func replayed(pols []multiPolicy, sc *multiScratch) {
	for i := range sc.upd {
		if p := sc.upd[i].Period; p != nil && sc.res[i].Now > 0 {
			p.Bounds = bounds(pols[i].policy, time.UnixMicro(sc.res[i].Now))
			sc.res[i].Period = 2
		}
	}
}

// decide fills in the zero Decision *d of policy pp after op with u.
func (m *multi) decide(d *ratekit.Decision, pp *multiPolicy, u *kvstore.Update, r kvstore.OpResult, op kvstore.Op) {
	d.Allowed = r.OK || op == kvstore.OpRefund
	d.Quota = pp.policy.Quota
	d.Policy = pp.policy
	if pp.unit > 0 {
		d.Remaining = r.Remaining / pp.unit
		d.ResetAfter = stepWait(pp.refill, m.step, r.Remaining, pp.refill.Burst)
		if !d.Allowed {
			d.RetryAfter = stepWait(pp.refill, m.step, r.Remaining, u.N)
		}
		return
	}
	b := &u.Period.Bounds
	d.Remaining = r.Remaining
	d.ResetAfter = time.Duration(b[r.Period]-r.Now) * time.Microsecond
	d.Policy.Window = time.Duration(b[r.Period]-b[r.Period-1]) * time.Microsecond
	if !d.Allowed {
		d.RetryAfter = d.ResetAfter
	}
}

// validate checks req as its decision needs: its Key alone for a reset,
// all of it (ratekit.Request.Validate) otherwise.
func validate(req *ratekit.Request, reset bool) error {
	if reset {
		return ratekit.ValidateKey(req.Key)
	}
	return req.Validate()
}
