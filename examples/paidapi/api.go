package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/examples/internal/outage"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
)

// policyName is the name clients see in RateLimit-Policy for the daily
// quota, and burstPolicyName the name of the per-second burst.
const (
	policyName      = "paid-tier"
	burstPolicyName = "paid-tier-burst"
)

// apiKeyField is the request header field that carries the API key.
const apiKeyField = "X-Api-Key"

// config is what newAPI needs.
type config struct {
	// store runs the quota in PostgreSQL.
	store *pgstore.Store
	// prefix separates this deployment's counters (tests use their own).
	prefix string
	// quota is the number of calls per API key and UTC day.
	quota int64
	// burst is the number of calls per API key and burstWindow (zero
	// means one second), a token bucket in front of the daily quota.
	burst       int64
	burstWindow time.Duration
	// keys are the API keys that may call, as given to customers.
	keys []string
	// quote is the downstream work a call pays for.
	quote  func(ctx context.Context, symbol string) (float64, error)
	logger *slog.Logger
}

// api is the paid API: GET /v1/quote?symbol=ACME, limited per API key.
type api struct {
	limiter quotaLimiter
	keys    map[string]bool // by httplimit.APIKey
	quote   func(ctx context.Context, symbol string) (float64, error)
	log     *slog.Logger
	handler lambda.HTTPAPIHandler
}

// quotaLimiter is what the API needs of its limiter: decisions, refunds of
// failed calls, and (for tests and support) resets.
type quotaLimiter interface {
	ratekit.Limiter
	ratekit.Peeker
	ratekit.Refunder
	ratekit.Resetter
}

// newAPI builds the limiter, the Guard and the limited handler once, for
// every invocation the instance will serve.
func newAPI(cfg config) (*api, error) {
	if len(cfg.keys) == 0 {
		return nil, errors.New("no API keys configured (PAIDAPI_KEYS)")
	}
	if cfg.burstWindow == 0 {
		cfg.burstWindow = time.Second
	}
	// The burst: a token bucket of cfg.burst calls refilled over a second.
	// Its prefix is its own, so its counts never mix with the daily ones.
	// It lives in logged tables like the daily quota: a composite decides
	// in one transaction over tables of one durability, and that
	// transaction commits synchronously for the daily row anyway, so
	// logging the burst's row costs little more.
	burst, err := durable.New(durable.Config{
		Store:      cfg.store,
		Policy:     ratekit.Policy{Name: burstPolicyName, Quota: cfg.burst, Window: cfg.burstWindow, Algorithm: ratekit.TokenBucket},
		Prefix:     cfg.prefix + "-burst",
		Durability: durable.Logged,
	})
	if err != nil {
		return nil, err
	}
	daily, err := durable.New(durable.Config{
		Store: cfg.store,
		// A fixed window aligned to the epoch in the database clock: the
		// quota renews at midnight UTC, and no day ever admits more than its quota.
		Policy: ratekit.Policy{Name: policyName, Quota: cfg.quota, Window: 24 * time.Hour, Algorithm: ratekit.FixedWindow},
		Prefix: cfg.prefix,
		// Calls are money: logged tables, and a decision is on disk when
		// it returns.
		Durability:        durable.Logged,
		SynchronousCommit: true,
	})
	if err != nil {
		return nil, err
	}
	// Both policies decide each call together, in one statement (one round
	// trip, one transaction, row locks in a fixed order): a call counts
	// against both or against neither, so the daily quota, which is money,
	// is never taken and given back.
	limiter, err := durable.NewComposite(burst, daily)
	if err != nil {
		return nil, err
	}
	// The reporter tells the operator why calls get 503: the first
	// failure at once with its cause, then at most a line per
	// outage.DefaultInterval with a count, never a line per call, and a
	// line when PostgreSQL answers again.
	observer := outage.New(outage.Config{Logger: cfg.logger, Store: "PostgreSQL"}).Observer()
	guard, err := httplimit.NewGuard(httplimit.GuardConfig{
		Limiter:  ratekit.Observe(limiter, observer),
		Observer: observer,
		// An unmetered call costs money: no decision, no call.
		OnError: httplimit.FailClosed,
		// Bounds the quota check inside the invocation's deadline.
		Timeout: decisionTimeout,
		// The Guard would log the same failures (throttled on its own
		// clock): the reporter's lines are the only ones. The Guard's
		// other lines are about requests it answers 400, here only an
		// over-long Idempotency-Key (authenticate refuses bad API keys
		// first), which the 400's body explains to the client.
		Logger: slog.New(slog.DiscardHandler),
		// API clients keep no cookies; the server-side count needs no
		// client state anyway.
		NoStateCookie: true,
	})
	if err != nil {
		return nil, err
	}
	apiKey, err := lambda.APIKeyHeaderKey(apiKeyField)
	if err != nil {
		return nil, err
	}
	limit, err := lambda.New(lambda.Config{
		Guard:          guard,
		Key:            apiKey,
		IdempotencyKey: lambda.HeaderValue("Idempotency-Key"),
	})
	if err != nil {
		return nil, err
	}
	a := &api{limiter: limiter, keys: map[string]bool{}, quote: cfg.quote, log: cfg.logger}
	for _, k := range cfg.keys {
		key, err := httplimit.APIKey(k)
		if err != nil {
			return nil, fmt.Errorf("PAIDAPI_KEYS: %w", err)
		}
		a.keys[key] = true
	}
	if a.quote == nil {
		a.quote = builtinQuote
	}
	// Authentication runs first: an unknown key is refused before it can
	// cost a database round trip, so inventing keys gets nothing.
	a.handler = a.authenticate(limit.HTTPAPI(a.serve))
	return a, nil
}

// authenticate refuses requests whose X-Api-Key is not a customer's key
// with 401. It reads the field with lambda.EventHeader and keys it with
// httplimit.APIKey, the rule the adapter's key function uses, so the key it
// authenticates is the key that is charged; an event whose copies of the
// field conflict (x-api-key and X-Api-Key with different values) is refused
// with 400.
func (a *api) authenticate(next lambda.HTTPAPIHandler) lambda.HTTPAPIHandler {
	return func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		h, err := lambda.EventHeader(&ev)
		if err != nil {
			return problem(http.StatusBadRequest, "Bad Request", err.Error()), nil
		}
		// Keys are looked up by their hash, so the lookup's timing says
		// nothing useful about the keys.
		key, err := httplimit.APIKey(h.Get(apiKeyField))
		if err != nil || !a.keys[key] {
			return problem(http.StatusUnauthorized, "Unauthorized", "send a valid API key in X-Api-Key"), nil
		}
		return next(ctx, ev)
	}
}

// serve runs a call that the quota admitted. Any call that does not succeed
// is refunded, so customers pay for answers only.
func (a *api) serve(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	d, _ := httplimit.DecisionFromContext(ctx)
	symbol := strings.ToUpper(ev.QueryStringParameters["symbol"])
	if !validSymbol(symbol) {
		return a.refund(ctx, problem(http.StatusBadRequest, "Bad Request", "symbol must be 1 to 8 letters")), nil
	}
	price, err := a.quote(ctx, symbol)
	if err != nil {
		a.log.WarnContext(ctx, "downstream quote failed; refunding the call", "error", err)
		return a.refund(ctx, problem(http.StatusBadGateway, "Bad Gateway", "the quote service failed; this call was not charged")), nil
	}
	body, _ := json.Marshal(map[string]any{"symbol": symbol, "price": price, "calls_left_today": d.Remaining})
	return events.APIGatewayV2HTTPResponse{
		StatusCode: http.StatusOK,
		Headers:    map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store"},
		Body:       string(body),
	}, nil
}

// decisionTimeout bounds each decision (the Guard's Timeout) and the pool's
// ping of a connection that sat idle (see poolConfig).
const decisionTimeout = 2 * time.Second

// refundTimeout bounds a refund.
const refundTimeout = 2 * time.Second

// refund gives the call back, with the same key, cost and idempotency key
// that were charged (so a retried refund counts once), and returns resp
// with RateLimit fields that show the refunded count. It runs even when the
// handler's context was cancelled, but ends by the earlier of refundTimeout
// and the invocation deadline minus httplimit.DefaultDeadlineMargin, so that
// the answer leaves in time; a refund that does not finish leaves the call
// charged.
func (a *api) refund(ctx context.Context, resp events.APIGatewayV2HTTPResponse) events.APIGatewayV2HTTPResponse {
	req, ok := httplimit.RequestFromContext(ctx)
	if !ok {
		return resp // no decision was made: nothing was charged
	}
	end := time.Now().Add(refundTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-httplimit.DefaultDeadlineMargin).Before(end) {
		end = dl.Add(-httplimit.DefaultDeadlineMargin)
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
	defer cancel()
	d, err := a.limiter.Refund(ctx, req)
	if err != nil {
		a.log.ErrorContext(ctx, "refund failed; the call stays charged", "error", err)
		return resp
	}
	// The handler's fields win over the adapter's, so these replace the
	// fields of the charge.
	h := http.Header{}
	httplimit.SetHeaders(h, d, false)
	for name := range h {
		resp.Headers[name] = h.Get(name)
	}
	return resp
}

func validSymbol(s string) bool {
	if s == "" || len(s) > 8 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// builtinQuote stands in for the paid downstream service: a made-up price
// that depends on the symbol and the minute.
func builtinQuote(_ context.Context, symbol string) (float64, error) {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s %d", symbol, time.Now().Unix()/60)
	return float64(1000+h.Sum32()%99000) / 100, nil
}

func problem(status int, title, detail string) events.APIGatewayV2HTTPResponse {
	body, _ := json.Marshal(httplimit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
	return events.APIGatewayV2HTTPResponse{
		StatusCode: status,
		Headers:    map[string]string{"Content-Type": httplimit.ProblemContentType},
		Body:       string(body),
	}
}
