package main

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit/examples/internal/plans"
)

// defaultCleanupEvery is the least time between two cleanups of the
// idempotency records in one instance (config.cleanupEvery).
const defaultCleanupEvery = 10 * time.Minute

// cleanupTimeout bounds one cleanup; the invocation's deadline may bound it
// sooner (see plans.Bound).
const cleanupTimeout = time.Second

// cleaner deletes expired idempotency records from requests, since a Lambda
// instance runs nothing between invocations: at most once per every in an
// instance (its first answered request, then the first after every has
// passed), after the request's answer is ready and within the request's
// deadline. An Idempotency-Key's record expires 32 days after its call;
// without a cleanup the table keeps one row per such call forever. Its
// methods are safe for concurrent use.
type cleaner struct {
	every time.Duration // <0: never; 0: defaultCleanupEvery
	run   func(context.Context) (int64, error)
	log   *slog.Logger

	mu      sync.Mutex
	last    time.Time // when the last cleanup started; zero before the first
	running bool
}

// routeAndClean is the API's handler: route, then, when the answer is not a
// server error (a store that failed the request would fail the cleanup
// too), a cleanup if one is due.
func (a *api) routeAndClean(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	resp, err := a.Route(ctx, ev)
	if err == nil && resp.StatusCode < http.StatusInternalServerError {
		a.cleanup.maybe(ctx, time.Now())
	}
	return resp, err
}

// maybe runs a cleanup when one is due at now and none is running, bounded
// by cleanupTimeout and ctx's deadline (see plans.Bound). A cleanup cut short
// leaves the rest for the next one; a failed one is logged as a warning
// (at most one line per every).
func (c *cleaner) maybe(ctx context.Context, now time.Time) {
	every := c.every
	if every == 0 {
		every = defaultCleanupEvery
	}
	end := plans.Bound(ctx, now, cleanupTimeout)
	c.mu.Lock()
	if every < 0 || c.running || !end.After(now) || (!c.last.IsZero() && now.Sub(c.last) < every) {
		c.mu.Unlock()
		return
	}
	c.last, c.running = now, true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
	defer cancel()
	n, err := c.run(ctx)
	switch {
	case err != nil:
		c.log.WarnContext(ctx, "idempotency cleanup failed; the next request after the interval tries again",
			"deleted", n, "error", err, "interval", every.String())
	case n > 0:
		c.log.InfoContext(ctx, "expired idempotency records deleted", "deleted", n)
	}
}
