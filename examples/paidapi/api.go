package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/examples/internal/plans"
	"github.com/ratekit/ratekit/lambda"
)

// config is what newAPI needs.
type config struct {
	// store runs the quotas in PostgreSQL.
	store *pgstore.Store
	// prefix separates this deployment's counters (tests use their own).
	prefix string
	// tiers is the price list.
	tiers plans.Tiers
	// customers resolves API keys to customers and their plans.
	customers plans.Customers
	// adminToken, when not empty, enables POST /admin/plan for callers
	// that send it as a bearer token.
	adminToken string
	// quote is the downstream work a call pays for (nil: a made-up price).
	quote  func(ctx context.Context, symbol string) (float64, error)
	logger *slog.Logger
	// cleanupEvery is the least time between two runs of the idempotency
	// records' cleanup in one instance (zero means defaultCleanupEvery; a
	// negative value turns the cleanup off).
	cleanupEvery time.Duration
}

// api is the paid API of package plans on PostgreSQL, with the cleanup of
// expired idempotency records after each answer.
type api struct {
	cfg     config
	limiter *durable.Planned
	handler lambda.HTTPAPIHandler
	cleanup *cleaner
	*plans.API
}

// newAPI builds the limiter, the Guard and the routes once, for every
// invocation the instance will serve.
func newAPI(cfg config) (*api, error) {
	if cfg.customers == nil {
		return nil, errors.New("no customers configured (PAIDAPI_KEYS)")
	}
	// One limiter for every plan: durable.Planned asks the customer table
	// for the key's plan on each request and decides all its policies (the
	// burst and the monthly quota) in one statement, all or nothing, so a
	// call the burst refuses never touches the month, which is money.
	// Calls are money: logged tables, and a decision is on disk when it
	// returns.
	limiter, err := durable.NewPlanned(durable.PlannedConfig{
		Store:             cfg.store,
		Prefix:            cfg.prefix,
		Durability:        durable.Logged,
		SynchronousCommit: true,
		Plan:              plans.PlanFunc(cfg.customers, cfg.tiers),
	})
	if err != nil {
		return nil, err
	}
	p, err := plans.New(plans.Config{
		Limiter: limiter, Customers: cfg.customers, Tiers: cfg.tiers, Store: "PostgreSQL",
		Timeout: decisionTimeout, AdminToken: cfg.adminToken, Quote: cfg.quote, Logger: cfg.logger,
	})
	if err != nil {
		return nil, err
	}
	a := &api{cfg: cfg, limiter: limiter, API: p}
	a.cleanup = &cleaner{every: cfg.cleanupEvery, run: limiter.Cleanup, log: cfg.logger}
	a.handler = a.routeAndClean
	return a, nil
}

// decisionTimeout bounds each decision (the Guard's Timeout), refund and
// usage read, and the pool's ping of a connection that sat idle (see
// poolConfig).
const decisionTimeout = 2 * time.Second
