package ratekit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// rollbackTimeout bounds the refunds by which [All] undoes what earlier
// policies took when a later one denies or fails. They run even when the
// caller's context has ended, so that a caller who gave up does not leave
// units taken.
const rollbackTimeout = 10 * time.Second

// All returns a composite Limiter that admits a request only when every one
// of limiters admits it: "10 a second and 1,000 a day", "100 a minute per
// user and 5,000 a minute per organisation". The limiters may be of
// different strategies and stores. Its Decision holds one part per limiter,
// in their order, summed up as [Decision.Parts] documents.
//
// Allow asks the limiters one after the other, in order. When one denies or
// returns an error, All refunds what the limiters before it took and
// returns the denial or the error. The denial holds a part for every
// limiter: those that were not asked are Peeked when every limiter is a
// [Peeker], and are otherwise an admitting Decision with nothing known (a
// zero Policy, which the HTTP layer leaves out of the RateLimit fields). So every limiter but the last
// must be a [Refunder]; All returns an error matching [ErrInvalidConfig]
// otherwise, for no limiters, and for a nil one.
//
// All is not atomic: a concurrent request may see what an earlier limiter
// took for a request that a later one then denies, and be denied for it. It
// is exact in the end state: once every call has returned, each limiter has
// taken exactly the costs of the admitted requests, when its refunds give
// back exactly what its Allow took (every ratekit strategy's do, on the same
// key and window). The refunds run under a context that is not canceled with
// ctx, for at most ten seconds; when a refund fails, Allow returns an error
// that wraps both the cause and the refund's error, and the earlier
// limiter keeps the units it took. Where one store holds every policy,
// prefer that backend's own composite (tokenbucket.NewComposite,
// durable.NewComposite): one round trip, atomic, no refunds.
//
// Request.Parts, when not nil, must have one part per limiter (otherwise
// [ErrInvalidRequest]); limiter i gets a Request of Parts[i].Key and
// Parts[i].Cost, and without Parts every limiter gets Key and Cost. Every
// limiter gets the request's IdempotencyKey: a retry of an attempt that
// every limiter admitted counts once where the limiters honour idempotency
// keys. A retry of an attempt that a later limiter denied may be admitted
// by the earlier ones without taking again (they remember admitting, and
// not that All refunded them), so for exact idempotent retries use a
// backend's own composite, whose idempotency key covers the whole decision.
//
// Client-carried state: every limiter gets Request.State and the Decision
// carries the State and StateError of the limiter that returned a State, so
// one limiter of a client-state strategy (a signedwindow.Limiter) may take
// part. When more than one limiter returns a State, Allow undoes what it
// took and returns an error matching [ErrInvalidConfig]: two tokens do not
// fit in one; use signedwindow's own composite for several windows on one
// subject.
//
// The returned Limiter implements [Peeker], [Refunder] and [Resetter] when
// every limiter does: Peek asks every limiter and sums up; Refund gives
// every limiter its part back (it stops at the first error); Reset resets
// key in every limiter (it stops at the first error). It is safe for
// concurrent use when the limiters are.
func All(limiters ...Limiter) (Limiter, error) {
	if len(limiters) == 0 {
		return nil, configErr("All of no limiters")
	}
	peek, refund, reset := true, true, true
	for i, l := range limiters {
		if l == nil {
			return nil, configErr("All: limiter %d is nil", i)
		}
		_, ok := l.(Refunder)
		if !ok && i < len(limiters)-1 {
			return nil, configErr("All: limiter %d (%T) is not a ratekit.Refunder; every limiter but the last must be, to give back what it took when a later one denies", i, l)
		}
		refund = refund && ok
		_, ok = l.(Peeker)
		peek = peek && ok
		_, ok = l.(Resetter)
		reset = reset && ok
	}
	a := &all{parts: append([]Limiter(nil), limiters...), peekable: peek}
	return a.withMethods(refund, reset), nil
}

// withMethods returns a as a Limiter that also implements Peeker when its
// parts all do (a.peekable), Refunder when refund is set, and Resetter when
// reset is set.
func (a *all) withMethods(refund, reset bool) Limiter {
	peek := a.peekable
	switch {
	case peek && refund && reset:
		return allPRS{a, allPeek{a}, allRefund{a}, allReset{a}}
	case peek && refund:
		return allPR{a, allPeek{a}, allRefund{a}}
	case peek && reset:
		return allPS{a, allPeek{a}, allReset{a}}
	case refund && reset:
		return allRS{a, allRefund{a}, allReset{a}}
	case peek:
		return allP{a, allPeek{a}}
	case refund:
		return allR{a, allRefund{a}}
	case reset:
		return allS{a, allReset{a}}
	}
	return a
}

// all is the composite of All; the types below add the optional methods
// that every part supports.
type all struct {
	parts    []Limiter
	peekable bool
}

type allPeek struct{ a *all }
type allRefund struct{ a *all }
type allReset struct{ a *all }

func (p allPeek) Peek(ctx context.Context, req Request) (Decision, error) { return p.a.peek(ctx, req) }
func (r allRefund) Refund(ctx context.Context, req Request) (Decision, error) {
	return r.a.refund(ctx, req)
}
func (s allReset) Reset(ctx context.Context, key string) error { return s.a.reset(ctx, key) }

type (
	allP struct {
		*all
		allPeek
	}
	allR struct {
		*all
		allRefund
	}
	allS struct {
		*all
		allReset
	}
	allPR struct {
		*all
		allPeek
		allRefund
	}
	allPS struct {
		*all
		allPeek
		allReset
	}
	allRS struct {
		*all
		allRefund
		allReset
	}
	allPRS struct {
		*all
		allPeek
		allRefund
		allReset
	}
)

// part returns the request limiter i gets for req.
func (a *all) part(req Request, i int) Request {
	r := Request{Key: req.Key, Cost: req.Cost, State: req.State, IdempotencyKey: req.IdempotencyKey}
	if req.Parts != nil {
		r.Key, r.Cost = req.Parts[i].Key, req.Parts[i].Cost
	}
	return r
}

func (a *all) validate(req Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if req.Parts != nil && len(req.Parts) != len(a.parts) {
		return fmt.Errorf("%w: %d parts for a composite of %d policies", ErrInvalidRequest, len(req.Parts), len(a.parts))
	}
	return nil
}

// errTwoStates is returned when more than one part keeps client state.
var errTwoStates error = &invalidConfigError{"ratekit: invalid config: All: more than one limiter returned client state (Decision.State); one token cannot carry two"}

// withState sets d's State and StateError from the one part that returned
// a State, and reports false when more than one did.
func withState(d *Decision, parts []Decision) bool {
	n := 0
	for i := range parts {
		if parts[i].State != "" {
			d.State, d.StateError = parts[i].State, parts[i].StateError
			parts[i].State, parts[i].StateError = "", nil
			n++
		}
	}
	return n <= 1
}

func (a *all) Allow(ctx context.Context, req Request) (Decision, error) {
	if err := a.validate(req); err != nil {
		return Decision{}, err
	}
	parts := make([]Decision, len(a.parts))
	for i, l := range a.parts {
		d, err := l.Allow(ctx, a.part(req, i))
		if err != nil {
			err = fmt.Errorf("ratekit: All: limiter %d: %w", i, err)
			if rerr := a.rollback(ctx, req, parts, i); rerr != nil {
				return Decision{}, errors.Join(err, rerr)
			}
			return Decision{}, err
		}
		parts[i] = d
		if !d.Allowed {
			if err := a.rollback(ctx, req, parts, i); err != nil {
				return Decision{}, err
			}
			a.fill(ctx, req, parts, i)
			return a.sum(parts)
		}
	}
	s := Combine(parts)
	if !withState(&s, parts) {
		if err := a.rollback(ctx, req, parts, len(parts)); err != nil {
			return Decision{}, errors.Join(errTwoStates, err)
		}
		return Decision{}, errTwoStates
	}
	return s, nil
}

// rollback refunds what parts[:n] took, replacing each part's Decision with
// its refund's (for client state) while keeping it marked as admitted.
func (a *all) rollback(ctx context.Context, req Request, parts []Decision, n int) error {
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	for i := 0; i < n; i++ {
		r := a.part(req, i)
		if parts[i].State != "" {
			r.State = parts[i].State
		}
		d, err := a.parts[i].(Refunder).Refund(ctx, r)
		if err != nil {
			return fmt.Errorf("ratekit: All: refunding limiter %d after a later one denied or failed (it keeps %d units it took): %w", i, r.Cost, err)
		}
		// What remains is the state before this request: the decision as
		// admitted, with the remaining count and state of the refund.
		parts[i].Remaining, parts[i].ResetAfter = d.Remaining, d.ResetAfter
		if d.State != "" {
			parts[i].State = d.State
		}
	}
	return nil
}

// fill completes a denied decision whose parts after i were not asked: a
// Peek of each when they can, otherwise the policy-less denial of part i.
func (a *all) fill(ctx context.Context, req Request, parts []Decision, i int) {
	for j := i + 1; j < len(parts); j++ {
		if a.peekable {
			if d, err := a.parts[j].(Peeker).Peek(ctx, a.part(req, j)); err == nil {
				d.State, d.StateError = "", nil
				parts[j] = d
				continue
			}
		}
		parts[j] = Decision{Allowed: true}
	}
}

func (a *all) sum(parts []Decision) (Decision, error) {
	s := Combine(parts)
	if !withState(&s, parts) {
		return Decision{}, errTwoStates
	}
	return s, nil
}

func (a *all) peek(ctx context.Context, req Request) (Decision, error) {
	if err := a.validate(req); err != nil {
		return Decision{}, err
	}
	parts := make([]Decision, len(a.parts))
	for i, l := range a.parts {
		d, err := l.(Peeker).Peek(ctx, a.part(req, i))
		if err != nil {
			return Decision{}, fmt.Errorf("ratekit: All: limiter %d: %w", i, err)
		}
		parts[i] = d
	}
	return a.sum(parts)
}

func (a *all) refund(ctx context.Context, req Request) (Decision, error) {
	if err := a.validate(req); err != nil {
		return Decision{}, err
	}
	parts := make([]Decision, len(a.parts))
	for i, l := range a.parts {
		d, err := l.(Refunder).Refund(ctx, a.part(req, i))
		if err != nil {
			return Decision{}, fmt.Errorf("ratekit: All: limiter %d (limiters before it were refunded): %w", i, err)
		}
		parts[i] = d
	}
	return a.sum(parts)
}

func (a *all) reset(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	for i, l := range a.parts {
		if err := l.(Resetter).Reset(ctx, key); err != nil {
			return fmt.Errorf("ratekit: All: limiter %d: %w", i, err)
		}
	}
	return nil
}
