package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
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

// The policies of every plan, by the names clients see in RateLimit-Policy
// and /usage. Counts are kept per policy name, not per plan, so a customer
// who changes plan keeps what it used this month.
const (
	burstPolicy   = "burst"
	monthlyPolicy = "monthly"
)

// defaultPrefix is the default counter prefix (-prefix).
const defaultPrefix = "paid-tier"

// apiKeyField is the request header field that carries the API key.
const apiKeyField = "X-Api-Key"

// tier is what a plan grants: Burst calls at once, refilled over the burst
// window (a second), and Quota calls per billing month.
type tier struct {
	Burst, Quota int64
}

// config is what newAPI needs.
type config struct {
	// store runs the quotas in PostgreSQL.
	store *pgstore.Store
	// prefix separates this deployment's counters (tests use their own).
	prefix string
	// free and pro are the plans' burst and monthly quota; enterprise
	// customers get enterpriseBurst and a monthly quota of their own.
	free, pro       tier
	enterpriseBurst int64
	// burstWindow is the time an empty burst takes to refill (zero means
	// one second).
	burstWindow time.Duration
	// customers resolves API keys to customers and their plans.
	customers customers
	// adminToken, when not empty, enables POST /admin/plan for callers
	// that send it as a bearer token.
	adminToken string
	// quote is the downstream work a call pays for.
	quote  func(ctx context.Context, symbol string) (float64, error)
	logger *slog.Logger
	// cleanupEvery is the least time between two runs of the idempotency
	// records' cleanup in one instance (zero means defaultCleanupEvery; a
	// negative value turns the cleanup off).
	cleanupEvery time.Duration
}

// api is the paid API: GET /v1/quote?symbol=ACME, limited per API key by
// the customer's plan; GET /usage, what the key used this month; and
// POST /admin/plan, a plan change.
type api struct {
	cfg       config
	limiter   *durable.Planned
	customers customers
	quote     func(ctx context.Context, symbol string) (float64, error)
	log       *slog.Logger
	outage    *outage.Reporter      // the store's failures, metered or not
	metered   lambda.HTTPAPIHandler // /v1/quote behind the limiter
	handler   lambda.HTTPAPIHandler
	cleanup   *cleaner
}

// newAPI builds the limiter, the Guard and the routes once, for every
// invocation the instance will serve.
func newAPI(cfg config) (*api, error) {
	if cfg.customers == nil {
		return nil, errors.New("no customers configured (PAIDAPI_KEYS)")
	}
	if cfg.burstWindow == 0 {
		cfg.burstWindow = time.Second
	}
	for _, t := range []tier{cfg.free, cfg.pro, {Burst: cfg.enterpriseBurst, Quota: 1}} {
		if t.Burst < 1 || t.Quota < 1 {
			return nil, fmt.Errorf("every plan needs a burst and a monthly quota of at least 1, got %+v", t)
		}
	}
	a := &api{cfg: cfg, customers: cfg.customers, quote: cfg.quote, log: cfg.logger}
	// One limiter for every plan: durable.Planned asks a.plan for the
	// key's plan on each request and decides all its policies (the burst
	// and the monthly quota) in one statement, all or nothing, so a call
	// the burst refuses never touches the month, which is money. Calls
	// are money: logged tables, and a decision is on disk when it returns.
	limiter, err := durable.NewPlanned(durable.PlannedConfig{
		Store:             cfg.store,
		Prefix:            cfg.prefix,
		Durability:        durable.Logged,
		SynchronousCommit: true,
		Plan:              a.plan,
	})
	if err != nil {
		return nil, err
	}
	a.limiter = limiter
	// The reporter tells the operator why calls get 503: the first
	// failure at once with its cause, then at most a line per
	// outage.DefaultInterval with a count, never a line per call, and a
	// line when PostgreSQL answers again.
	a.outage = outage.New(outage.Config{Logger: cfg.logger, Store: "PostgreSQL"})
	observer := a.outage.Observer()
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
	if a.quote == nil {
		a.quote = builtinQuote
	}
	a.metered = limit.HTTPAPI(a.serve)
	a.cleanup = &cleaner{every: cfg.cleanupEvery, run: limiter.Cleanup, log: cfg.logger}
	a.handler = a.routeAndClean
	return a, nil
}

// plan is the durable.PlannedConfig.Plan of the API: the plan of the
// customer whose API key hashes to key, with the customer's billing anchor
// in the monthly quota's Period. It runs on every request, from the
// customer table's memory.
func (a *api) plan(ctx context.Context, key string) (ratekit.Plan, error) {
	cu, err := a.customers.Customer(ctx, key)
	if err != nil {
		return ratekit.Plan{}, err
	}
	t := a.tier(cu)
	return ratekit.Plan{Name: cu.Plan, Policies: []ratekit.Policy{
		{Name: burstPolicy, Quota: t.Burst, Window: a.cfg.burstWindow, Algorithm: ratekit.TokenBucket},
		{Name: monthlyPolicy, Quota: t.Quota, Algorithm: ratekit.FixedWindow,
			Period: ratekit.Period{Unit: ratekit.Month, Location: time.UTC, Anchor: cu.BillingAnchor}},
	}}, nil
}

// tier returns what cu's plan grants.
func (a *api) tier(cu customer) tier {
	switch cu.Plan {
	case planPro:
		return a.cfg.pro
	case planEnterprise:
		return tier{Burst: a.cfg.enterpriseBurst, Quota: cu.Quota}
	}
	return a.cfg.free
}

// route sends each request to its handler: only /v1/quote is metered.
func (a *api) route(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	method, path := ev.RequestContext.HTTP.Method, ev.RawPath
	switch {
	case path == "/v1/quote" && (method == http.MethodGet || method == ""):
		return a.authenticate(a.metered)(ctx, ev)
	case path == "/usage" && method == http.MethodGet:
		return a.authenticate(a.usage)(ctx, ev)
	case path == "/admin/plan" && method == http.MethodPost:
		return a.admin(ctx, ev), nil
	}
	return problem(http.StatusNotFound, "Not Found", "routes: GET /v1/quote, GET /usage, POST /admin/plan"), nil
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
		if err == nil {
			_, err = a.customers.Customer(ctx, key)
		}
		switch {
		case errors.Is(err, httplimit.ErrNoKey), errors.Is(err, errUnknownCustomer):
			return problem(http.StatusUnauthorized, "Unauthorized", "send a valid API key in X-Api-Key"), nil
		case err != nil:
			a.log.ErrorContext(ctx, "customer lookup failed", "error", err)
			return unavailable(), nil
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
	left := d.Remaining
	for _, p := range d.Parts {
		if p.Policy.Name == monthlyPolicy {
			left = p.Remaining
		}
	}
	body, _ := json.Marshal(map[string]any{"symbol": symbol, "price": price, "calls_left_this_month": left})
	return events.APIGatewayV2HTTPResponse{
		StatusCode: http.StatusOK,
		Headers:    map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store"},
		Body:       string(body),
	}, nil
}

// usageReport is the body of GET /usage: what the key used of each policy
// of its plan, as the limiter counts it.
type usageReport struct {
	Plan     string        `json:"plan"`
	Policies []policyUsage `json:"policies"`
}

// policyUsage is one policy's line of a usageReport. Times are UTC.
type policyUsage struct {
	Name      string `json:"name"`
	Quota     int64  `json:"quota"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	// Reset is when the whole quota is available again: the end of the
	// billing month for the monthly quota, when the bucket is full again
	// for the burst.
	Reset time.Time `json:"reset"`
	// PeriodStart and PeriodEnd bound the current billing month; the
	// burst has none.
	PeriodStart *time.Time `json:"period_start,omitempty"`
	PeriodEnd   *time.Time `json:"period_end,omitempty"`
}

// usage answers GET /usage for an authenticated key, without charging it:
// one statement that reads every policy of the key's plan in one snapshot
// and locks nothing (durable.Planned.Usage).
func (a *api) usage(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	h, _ := lambda.EventHeader(&ev) // authenticate checked it
	key, _ := httplimit.APIKey(h.Get(apiKeyField))
	cu, err := a.customers.Customer(ctx, key)
	if err != nil {
		return problem(http.StatusUnauthorized, "Unauthorized", "send a valid API key in X-Api-Key"), nil
	}
	// Bounded like a metered call's decision: by decisionTimeout and the
	// invocation's deadline less the Guard's margin, so that the 503 leaves
	// before Lambda ends the invocation.
	uctx, cancel := context.WithDeadline(ctx, bound(ctx, time.Now(), decisionTimeout))
	defer cancel()
	us, err := a.limiter.Usage(uctx, key)
	if err != nil {
		// The reporter of the metered calls: one line for an outage, then
		// a count at most every outage.DefaultInterval, not a line per call.
		a.outage.Failure(ratekit.FailureEvent{Action: ratekit.FailedClosed, ErrorClass: ratekit.ClassifyError(err), Err: err})
		return unavailable(), nil
	}
	a.outage.Answered()
	now := time.Now()
	report := usageReport{Plan: cu.Plan, Policies: make([]policyUsage, len(us))}
	for i, u := range us {
		p := policyUsage{
			Name: u.Policy.Name, Quota: u.Policy.Quota, Used: u.Used, Remaining: u.Remaining,
			Reset: now.Add(u.ResetAfter).UTC().Truncate(time.Millisecond),
		}
		if !u.Policy.Period.IsZero() {
			start, end := u.Policy.Period.Bounds(now)
			start, end = start.UTC(), end.UTC()
			p.Reset, p.PeriodStart, p.PeriodEnd = end, &start, &end
		}
		report.Policies[i] = p
	}
	body, _ := json.Marshal(report)
	return events.APIGatewayV2HTTPResponse{
		StatusCode: http.StatusOK,
		Headers:    map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store"},
		Body:       string(body),
	}, nil
}

// planChange is the body of POST /admin/plan.
type planChange struct {
	APIKey string `json:"api_key"`
	Plan   string `json:"plan"`
	Quota  int64  `json:"quota,omitempty"` // enterprise only
}

// admin answers POST /admin/plan: it moves a customer to another plan,
// effective from the customer's next request. What the customer used this
// month stays counted (the limiter counts per policy name, not per plan):
// an upgrade leaves more remaining, a downgrade leaves none until the
// month ends, never less than none. The caller must send the admin token
// as a bearer token; without PAIDAPI_ADMIN_TOKEN the route does not exist.
func (a *api) admin(ctx context.Context, ev events.APIGatewayV2HTTPRequest) events.APIGatewayV2HTTPResponse {
	if a.cfg.adminToken == "" {
		return problem(http.StatusNotFound, "Not Found", "the admin endpoint is disabled (set PAIDAPI_ADMIN_TOKEN)")
	}
	h, err := lambda.EventHeader(&ev)
	if err != nil {
		return problem(http.StatusBadRequest, "Bad Request", err.Error())
	}
	// Compared as hashes in constant time: the timing says nothing about
	// the token or its length.
	got := sha256.Sum256([]byte(strings.TrimPrefix(h.Get("Authorization"), "Bearer ")))
	want := sha256.Sum256([]byte(a.cfg.adminToken))
	if !strings.HasPrefix(h.Get("Authorization"), "Bearer ") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		resp := problem(http.StatusUnauthorized, "Unauthorized", "send the admin token as Authorization: Bearer <token>")
		resp.Headers["WWW-Authenticate"] = "Bearer"
		return resp
	}
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return problem(http.StatusBadRequest, "Bad Request", "the body is not valid base64")
		}
	}
	var c planChange
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return problem(http.StatusBadRequest, "Bad Request", `want {"api_key": "…", "plan": "free"|"pro"|"enterprise", "quota": n}: `+err.Error())
	}
	key, err := httplimit.APIKey(c.APIKey)
	if err != nil {
		return problem(http.StatusBadRequest, "Bad Request", "api_key: "+err.Error())
	}
	cu, err := a.customers.SetPlan(ctx, key, c.Plan, c.Quota)
	switch {
	case errors.Is(err, errUnknownCustomer):
		return problem(http.StatusNotFound, "Not Found", err.Error())
	case err != nil:
		return problem(http.StatusBadRequest, "Bad Request", err.Error())
	}
	t := a.tier(cu)
	a.log.InfoContext(ctx, "plan changed", "plan", cu.Plan, "monthly_quota", t.Quota, "burst", t.Burst)
	out, _ := json.Marshal(map[string]any{"plan": cu.Plan, "monthly_quota": t.Quota, "burst": t.Burst})
	return events.APIGatewayV2HTTPResponse{
		StatusCode: http.StatusOK,
		Headers:    map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store"},
		Body:       string(out),
	}
}

// unavailable is the answer when PostgreSQL or the customer table fails
// outside a metered call (the Guard answers those).
func unavailable() events.APIGatewayV2HTTPResponse {
	resp := problem(http.StatusServiceUnavailable, "Service Unavailable", "try again shortly")
	resp.Headers["Retry-After"] = "1"
	return resp
}

// decisionTimeout bounds each decision (the Guard's Timeout) and the pool's
// ping of a connection that sat idle (see poolConfig).
const decisionTimeout = 2 * time.Second

// bound returns the time by which database work that starts at now must end:
// now+timeout, or earlier, the invocation's deadline (ctx's) less the
// margin a Guard keeps for answering (httplimit.DefaultDeadlineMargin, or a
// tenth of the time left when that is less), the bound the Guard puts on a
// metered call's decision.
func bound(ctx context.Context, now time.Time, timeout time.Duration) time.Time {
	end := now.Add(timeout)
	if dl, ok := ctx.Deadline(); ok {
		last := dl.Add(-max(min(httplimit.DefaultDeadlineMargin, dl.Sub(now)/10), 0))
		if last.Before(end) {
			end = last
		}
	}
	return end
}

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
