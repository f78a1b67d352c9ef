package ratekit

import (
	"time"
)

// MaxPlanPolicies is the most policies a [Plan] holds.
const MaxPlanPolicies = 16

// Plan is what a key is sold: a named set of policies decided together, all
// or nothing ("Pro: 10 a second and 100,000 a month from the billing day").
// Strategies that resolve a plan per request (durable.Planned,
// tokenbucket.Planned) count each policy under its Name, not under the
// plan's, so a key that changes plan keeps what it used under the policies
// both plans name.
//
// A Plan is a value; it is safe for concurrent use when not modified.
type Plan struct {
	// Name identifies the plan ("free", "pro"). It is informational: it is
	// neither counted nor shown to clients.
	Name string

	// Policies are the plan's policies, 1 to MaxPlanPolicies of them, with
	// distinct names. A policy with a Period carries its key's billing
	// anchor in Period.Anchor.
	Policies []Policy
}

// Validate reports whether p is a plan that every strategy could decide:
// 1 to MaxPlanPolicies policies, each with a valid, distinct name
// ([ValidatePolicyName]), a Quota from 1 to [MaxQuota], a known Algorithm,
// and either a positive Window and no Period, or a valid Period with
// Algorithm FixedWindow and no Window. Strategies may check more. The error
// matches [ErrInvalidConfig].
func (p Plan) Validate() error {
	if len(p.Policies) == 0 || len(p.Policies) > MaxPlanPolicies {
		return configErr("plan %q has %d policies, want 1 to %d", p.Name, len(p.Policies), MaxPlanPolicies)
	}
	for i, pol := range p.Policies {
		if err := pol.validate(); err != nil {
			return configErr("plan %q: policy %d: %v", p.Name, i, err)
		}
		for _, q := range p.Policies[:i] {
			if q.Name == pol.Name {
				return configErr("plan %q names policy %q twice", p.Name, pol.Name)
			}
		}
	}
	return nil
}

// validate checks the rules Plan.Validate states for one policy.
func (p Policy) validate() error {
	if err := ValidatePolicyName(p.Name); err != nil {
		return err
	}
	if p.Quota < 1 || p.Quota > MaxQuota {
		return configErr("policy %q: quota must be from 1 to ratekit.MaxQuota, got %d", p.Name, p.Quota)
	}
	if p.Algorithm < FixedWindow || p.Algorithm > SlidingLog {
		return configErr("policy %q: unknown algorithm %v", p.Name, p.Algorithm)
	}
	return p.ValidatePeriod()
}

// ValidatePeriod reports whether the policy's Window and Period agree: no
// Period and a positive Window, or a valid Period (see [Period.Validate])
// with Algorithm FixedWindow and a zero Window. The error matches
// [ErrInvalidConfig].
func (p Policy) ValidatePeriod() error {
	if p.Period.IsZero() {
		if p.Window <= 0 {
			return configErr("policy %q: window must be positive, got %v", p.Name, p.Window)
		}
		return nil
	}
	if err := p.Period.Validate(); err != nil {
		return configErr("policy %q: %v", p.Name, err)
	}
	if p.Algorithm != FixedWindow {
		return configErr("policy %q: a period is a fixed window; its algorithm must be ratekit.FixedWindow, got %v", p.Name, p.Algorithm)
	}
	if p.Window != 0 {
		return configErr("policy %q: a policy with a period takes its windows from the period; its Window must be zero, got %v", p.Name, p.Window)
	}
	return nil
}

// Usage is what one key used of one policy in its current window or
// period, as a dashboard shows it.
type Usage struct {
	// Policy is the policy, as a Decision reports it: for a policy with a
	// Period, Window is the length of the current period.
	Policy Policy

	// Used is the units counted in the current window or period. It can
	// exceed Policy.Quota after the key moved to a plan with a smaller
	// quota. For a token bucket it is Quota − Remaining.
	Used int64

	// Remaining is the units still available, from 0 to Policy.Quota.
	Remaining int64

	// ResetAfter is how long until the full Quota is available again: for
	// a period, the time to its end.
	ResetAfter time.Duration
}

// PeriodUsage is what one key used in one period of a policy with a
// Period: a line of a billing run, as a store that keeps ended periods
// reports them (durable.Planned.PeriodUsage on PostgreSQL,
// tokenbucket.Planned.PeriodUsage on a store that keeps period history).
type PeriodUsage struct {
	// Key is the request key.
	Key string

	// Start and End bound the period, [Start, End).
	Start, End time.Time

	// Used is the units admitted in the period, less refunds.
	Used int64
}
