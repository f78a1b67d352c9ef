package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
)

// The plans the API sells. Every plan is a burst (a token bucket of Burst
// calls refilled over a second) and a monthly quota counted from the
// customer's billing day; enterprise customers have a quota of their own.
const (
	planFree       = "free"
	planPro        = "pro"
	planEnterprise = "enterprise"
)

// customer is what the API knows of the owner of an API key.
type customer struct {
	// Plan is planFree, planPro or planEnterprise.
	Plan string
	// Quota is an enterprise customer's monthly quota (0 on other plans,
	// whose quota is the plan's).
	Quota int64
	// BillingAnchor is when the customer's billing months start: a month
	// runs from the anchor's day and time to the same day and time of the
	// next month (the last day of shorter months for an anchor on the 29th
	// to the 31st). The zero Time means calendar months from the 1st at
	// 00:00 UTC.
	BillingAnchor time.Time
}

// errUnknownCustomer is returned for an API key that belongs to no customer.
var errUnknownCustomer = errors.New("no customer has this API key")

// customers is the seam where a real program reads its customers table:
// the plan, custom quota and billing anchor of the customer an API key
// belongs to, keyed by httplimit.APIKey (the hash the limiter counts under,
// never the key itself). The API calls Customer on every request (to
// authenticate it and to resolve the plan the limiter decides against), so
// a real implementation serves it from memory, refreshed from the database
// (say, a cache of a few seconds over `SELECT plan, quota, billing_anchor
// FROM customers WHERE api_key_hash = $1`).
type customers interface {
	// Customer returns the customer whose API key hashes to key, or
	// errUnknownCustomer.
	Customer(ctx context.Context, key string) (customer, error)
	// SetPlan moves the customer whose API key hashes to key to plan (with
	// quota for planEnterprise) and returns the changed customer. The
	// billing anchor stays.
	SetPlan(ctx context.Context, key, plan string, quota int64) (customer, error)
}

// memoryCustomers is the example's customer table: in this process's
// memory, filled from PAIDAPI_KEYS. On Lambda every instance holds its own
// copy, so a plan change through the admin endpoint reaches only the
// instance that served it; a deployment keeps customers in a database.
type memoryCustomers struct {
	mu sync.RWMutex
	m  map[string]customer
}

// Customer implements customers.
func (c *memoryCustomers) Customer(_ context.Context, key string) (customer, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	cu, ok := c.m[key]
	if !ok {
		return customer{}, errUnknownCustomer
	}
	return cu, nil
}

// SetPlan implements customers.
func (c *memoryCustomers) SetPlan(_ context.Context, key, plan string, quota int64) (customer, error) {
	if err := validPlan(plan, quota); err != nil {
		return customer{}, err
	}
	if plan != planEnterprise {
		quota = 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cu, ok := c.m[key]
	if !ok {
		return customer{}, errUnknownCustomer
	}
	cu.Plan, cu.Quota = plan, quota
	c.m[key] = cu
	return cu, nil
}

// validPlan reports whether plan names a plan the API sells, with a quota
// from 1 to ratekit.MaxQuota for planEnterprise.
func validPlan(plan string, quota int64) error {
	switch plan {
	case planFree, planPro:
		return nil
	case planEnterprise:
		if quota < 1 || quota > ratekit.MaxQuota {
			return fmt.Errorf("an enterprise plan needs a monthly quota from 1 to %d, got %d", ratekit.MaxQuota, quota)
		}
		return nil
	}
	return fmt.Errorf("unknown plan %q: want free, pro or enterprise", plan)
}

// parseCustomers reads PAIDAPI_KEYS: comma-separated entries
// key[=plan][@anchor], where plan is free (the default), pro or
// enterprise:<monthly quota> and anchor is the billing anchor in RFC 3339
// (default: calendar months). For example
//
//	demo-key,acme-key=pro@2026-01-31T09:00:00Z,bigco-key=enterprise:5000000@2026-03-14T00:00:00Z
func parseCustomers(s string) (*memoryCustomers, error) {
	c := &memoryCustomers{m: map[string]customer{}}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		var cu customer
		rest := entry
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			t, err := time.Parse(time.RFC3339, rest[i+1:])
			if err != nil {
				return nil, fmt.Errorf("PAIDAPI_KEYS: billing anchor of %q: %w", redact(entry), err)
			}
			cu.BillingAnchor, rest = t, rest[:i]
		}
		cu.Plan = planFree
		if i := strings.IndexByte(rest, '='); i >= 0 {
			cu.Plan, rest = rest[i+1:], rest[:i]
			if q, ok := strings.CutPrefix(cu.Plan, planEnterprise+":"); ok {
				n, err := strconv.ParseInt(q, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("PAIDAPI_KEYS: quota of %q: not a whole number", redact(entry))
				}
				cu.Plan, cu.Quota = planEnterprise, n
			}
		}
		if err := validPlan(cu.Plan, cu.Quota); err != nil {
			return nil, fmt.Errorf("PAIDAPI_KEYS: %q: %w", redact(entry), err)
		}
		key, err := httplimit.APIKey(rest)
		if err != nil {
			return nil, fmt.Errorf("PAIDAPI_KEYS: %w", err)
		}
		c.m[key] = cu
	}
	if len(c.m) == 0 {
		return nil, errors.New("no API keys configured (PAIDAPI_KEYS)")
	}
	return c, nil
}

// redact returns an entry of PAIDAPI_KEYS without its API key, for error
// messages that end up in logs.
func redact(entry string) string {
	if i := strings.IndexAny(entry, "=@"); i >= 0 {
		return "…" + entry[i:]
	}
	return "…"
}
