// Package plans is the paid API that examples/paidapi (on PostgreSQL) and
// examples/paidapi-dynamodb (on DynamoDB) sell: three plans, each a burst
// and a quota per billing month from the customer's billing anchor, the
// routes GET /v1/quote, GET /usage and POST /admin/plan, and their answers.
// Each command gives it a limiter that decides plans on its store and a
// customer table; the rest is the same code.
package plans

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
	Free       = "free"
	Pro        = "pro"
	Enterprise = "enterprise"
)

// The policies of every plan, by the names clients see in RateLimit-Policy
// and /usage. Counts are kept per policy name, not per plan, so a customer
// who changes plan keeps what it used this month.
const (
	BurstPolicy   = "burst"
	MonthlyPolicy = "monthly"
)

// DefaultPrefix is the default counter prefix of both commands (-prefix).
const DefaultPrefix = "paid-tier"

// MaxPrefixLen leaves room for the longest policy's counter prefix,
// <prefix>:monthly, within ratekit.MaxPolicyNameLen.
const MaxPrefixLen = ratekit.MaxPolicyNameLen - len(":"+MonthlyPolicy)

// Tier is what a plan grants: Burst calls at once, refilled over the burst
// window, and Quota calls per billing month.
type Tier struct {
	Burst, Quota int64
}

// Tiers is the price list: the free and pro plans' tiers, the enterprise
// plan's burst (its monthly quota is per customer), and the burst window.
type Tiers struct {
	Free, Pro       Tier
	EnterpriseBurst int64
	// BurstWindow is the time an empty burst takes to refill (zero means
	// one second).
	BurstWindow time.Duration
}

// validate reports a tier without a burst or a quota.
func (t Tiers) validate() error {
	for _, tr := range []Tier{t.Free, t.Pro, {Burst: t.EnterpriseBurst, Quota: 1}} {
		if tr.Burst < 1 || tr.Quota < 1 {
			return fmt.Errorf("every plan needs a burst and a monthly quota of at least 1, got %+v", tr)
		}
	}
	return nil
}

// Of returns what cu's plan grants.
func (t Tiers) Of(cu Customer) Tier {
	switch cu.Plan {
	case Pro:
		return t.Pro
	case Enterprise:
		return Tier{Burst: t.EnterpriseBurst, Quota: cu.Quota}
	}
	return t.Free
}

// Plan returns cu's ratekit.Plan: the burst, a token bucket, and the
// monthly quota, a fixed window over the months from cu's billing anchor.
func (t Tiers) Plan(cu Customer) ratekit.Plan {
	tr := t.Of(cu)
	window := t.BurstWindow
	if window == 0 {
		window = time.Second
	}
	return ratekit.Plan{Name: cu.Plan, Policies: []ratekit.Policy{
		{Name: BurstPolicy, Quota: tr.Burst, Window: window, Algorithm: ratekit.TokenBucket},
		{Name: MonthlyPolicy, Quota: tr.Quota, Algorithm: ratekit.FixedWindow,
			Period: ratekit.Period{Unit: ratekit.Month, Location: time.UTC, Anchor: cu.BillingAnchor}},
	}}
}

// PlanFunc returns the Plan func of a planned limiter (durable.Planned,
// tokenbucket.Planned): the plan of the customer whose API key hashes to
// key, from c, by t.
func PlanFunc(c Customers, t Tiers) func(ctx context.Context, key string) (ratekit.Plan, error) {
	return func(ctx context.Context, key string) (ratekit.Plan, error) {
		cu, err := c.Customer(ctx, key)
		if err != nil {
			return ratekit.Plan{}, err
		}
		return t.Plan(cu), nil
	}
}

// Customer is what the API knows of the owner of an API key.
type Customer struct {
	// Plan is Free, Pro or Enterprise.
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

var (
	// ErrUnknownCustomer is returned for an API key that belongs to no
	// customer.
	ErrUnknownCustomer = errors.New("no customer has this API key")
	// ErrInvalidPlan is matched by the errors of ValidPlan.
	ErrInvalidPlan = errors.New("invalid plan")
)

// Customers is the customer table: the plan, custom quota and billing
// anchor of the customer an API key belongs to, keyed by httplimit.APIKey
// (the hash the limiter counts under, never the key itself). The API calls
// Customer on every request (to authenticate it and to resolve the plan
// the limiter decides against), so an implementation serves it from
// memory. Implementations are safe for concurrent use.
type Customers interface {
	// Customer returns the customer whose API key hashes to key, or an
	// error matching ErrUnknownCustomer.
	Customer(ctx context.Context, key string) (Customer, error)
	// SetPlan moves the customer whose API key hashes to key to plan (with
	// quota for Enterprise) and returns the changed customer; the billing
	// anchor stays. Errors: ErrUnknownCustomer, ErrInvalidPlan (see
	// ValidPlan), or the table's.
	SetPlan(ctx context.Context, key, plan string, quota int64) (Customer, error)
}

// Memory is a customer table in this process's memory. On Lambda every
// instance holds its own copy, so a plan change through the admin endpoint
// reaches only the instance that served it.
type Memory struct {
	mu sync.RWMutex
	m  map[string]Customer
}

// NewMemory returns a Memory holding m (keyed by httplimit.APIKey), which
// it owns from then on.
func NewMemory(m map[string]Customer) *Memory { return &Memory{m: m} }

// Customer implements Customers.
func (c *Memory) Customer(_ context.Context, key string) (Customer, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	cu, ok := c.m[key]
	if !ok {
		return Customer{}, ErrUnknownCustomer
	}
	return cu, nil
}

// SetPlan implements Customers.
func (c *Memory) SetPlan(_ context.Context, key, plan string, quota int64) (Customer, error) {
	if err := ValidPlan(plan, quota); err != nil {
		return Customer{}, err
	}
	if plan != Enterprise {
		quota = 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cu, ok := c.m[key]
	if !ok {
		return Customer{}, ErrUnknownCustomer
	}
	cu.Plan, cu.Quota = plan, quota
	c.m[key] = cu
	return cu, nil
}

// ValidPlan reports whether plan names a plan the API sells, with a quota
// from 1 to ratekit.MaxQuota for Enterprise; its errors match
// ErrInvalidPlan.
func ValidPlan(plan string, quota int64) error {
	switch plan {
	case Free, Pro:
		return nil
	case Enterprise:
		if quota < 1 || quota > ratekit.MaxQuota {
			return fmt.Errorf("%w: an enterprise plan needs a monthly quota from 1 to %d, got %d", ErrInvalidPlan, ratekit.MaxQuota, quota)
		}
		return nil
	}
	return fmt.Errorf("%w: unknown plan %q: want free, pro or enterprise", ErrInvalidPlan, plan)
}

// ParseKeys reads PAIDAPI_KEYS: comma-separated entries key[=plan][@anchor],
// where plan is free (the default), pro or enterprise:<monthly quota> and
// anchor is the billing anchor in RFC 3339 (default: calendar months). For
// example
//
//	demo-key,acme-key=pro@2026-01-31T09:00:00Z,bigco-key=enterprise:5000000@2026-03-14T00:00:00Z
//
// It returns the customers keyed by httplimit.APIKey, and an error that
// never shows a key.
func ParseKeys(s string) (map[string]Customer, error) {
	m := map[string]Customer{}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		key, cu, err := parseEntry(entry)
		if err != nil {
			return nil, fmt.Errorf("PAIDAPI_KEYS: %w", err)
		}
		m[key] = cu
	}
	if len(m) == 0 {
		return nil, errors.New("no API keys configured (PAIDAPI_KEYS)")
	}
	return m, nil
}

// parseEntry reads one entry of PAIDAPI_KEYS.
func parseEntry(entry string) (string, Customer, error) {
	cu := Customer{Plan: Free}
	rest := entry
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		t, err := time.Parse(time.RFC3339, rest[i+1:])
		if err != nil {
			return "", cu, fmt.Errorf("billing anchor of %q: %w", redact(entry), err)
		}
		cu.BillingAnchor, rest = t, rest[:i]
	}
	if i := strings.IndexByte(rest, '='); i >= 0 {
		cu.Plan, rest = rest[i+1:], rest[:i]
		if q, ok := strings.CutPrefix(cu.Plan, Enterprise+":"); ok {
			n, err := strconv.ParseInt(q, 10, 64)
			if err != nil {
				return "", cu, fmt.Errorf("quota of %q: not a whole number", redact(entry))
			}
			cu.Plan, cu.Quota = Enterprise, n
		}
	}
	if err := ValidPlan(cu.Plan, cu.Quota); err != nil {
		return "", cu, fmt.Errorf("%q: %w", redact(entry), err)
	}
	key, err := httplimit.APIKey(rest)
	return key, cu, err
}

// redact returns an entry of PAIDAPI_KEYS without its API key, for error
// messages that end up in logs.
func redact(entry string) string {
	if i := strings.IndexAny(entry, "=@"); i >= 0 {
		return "…" + entry[i:]
	}
	return "…"
}
