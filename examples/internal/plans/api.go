package plans

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
	"github.com/ratekit/ratekit/examples/internal/outage"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
)

// APIKeyField is the request header field that carries the API key.
const APIKeyField = "X-Api-Key"

// Limiter decides plans per key (durable.Planned, tokenbucket.Planned): a
// decision and a refund per call, and a key's usage for GET /usage.
type Limiter interface {
	ratekit.Limiter
	ratekit.Refunder
	Usage(ctx context.Context, key string) ([]ratekit.Usage, error)
}

// Config is what New needs. Limiter, Customers, Store, Timeout and Logger
// are required.
type Config struct {
	// Limiter decides every call by the plan of its key, resolved from
	// Customers (see PlanFunc).
	Limiter   Limiter
	Customers Customers
	Tiers     Tiers
	// Store names the store in the outage reports ("PostgreSQL").
	Store string
	// Timeout bounds each decision, refund, usage read and customer
	// lookup; the invocation's deadline may bound it sooner (see Bound).
	Timeout time.Duration
	// AdminToken, when not empty, enables POST /admin/plan for callers
	// that send it as a bearer token.
	AdminToken string
	// Quote is the downstream work a call pays for (nil: a made-up price).
	Quote  func(ctx context.Context, symbol string) (float64, error)
	Logger *slog.Logger
}

// API is the paid API: GET /v1/quote?symbol=ACME, limited per API key by
// the customer's plan; GET /usage, what the key used this month; and
// POST /admin/plan, a plan change.
type API struct {
	cfg     Config
	outage  *outage.Reporter      // the store's failures, metered or not
	metered lambda.HTTPAPIHandler // /v1/quote behind the limiter
}

// New builds the Guard and the routes once, for every invocation an
// instance will serve.
func New(cfg Config) (*API, error) {
	switch {
	case cfg.Limiter == nil || cfg.Customers == nil || cfg.Logger == nil:
		return nil, errors.New("plans: a Limiter, Customers and a Logger are required")
	case cfg.Timeout <= 0:
		return nil, fmt.Errorf("plans: Timeout must be positive, got %v", cfg.Timeout)
	}
	if err := cfg.Tiers.validate(); err != nil {
		return nil, err
	}
	if cfg.Quote == nil {
		cfg.Quote = builtinQuote
	}
	a := &API{cfg: cfg}
	// The reporter tells the operator why calls get 503: the first
	// failure at once with its cause, then at most a line per
	// outage.DefaultInterval with a count, never a line per call, and a
	// line when the store answers again.
	a.outage = outage.New(outage.Config{Logger: cfg.Logger, Store: cfg.Store})
	observer := a.outage.Observer()
	guard, err := httplimit.NewGuard(httplimit.GuardConfig{
		Limiter:  ratekit.Observe(cfg.Limiter, observer),
		Observer: observer,
		// An unmetered call costs money: no decision, no call.
		OnError: httplimit.FailClosed,
		// Bounds the quota check inside the invocation's deadline.
		Timeout: cfg.Timeout,
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
	apiKey, err := lambda.APIKeyHeaderKey(APIKeyField)
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
	a.metered = limit.HTTPAPI(a.serve)
	return a, nil
}

// Route sends each request to its handler: only /v1/quote is metered.
func (a *API) Route(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	method, path := ev.RequestContext.HTTP.Method, ev.RawPath
	switch {
	case path == "/v1/quote" && (method == http.MethodGet || method == ""):
		return a.authenticate(a.metered)(ctx, ev)
	case path == "/usage" && method == http.MethodGet:
		return a.authenticate(a.usage)(ctx, ev)
	case path == "/admin/plan" && method == http.MethodPost:
		return a.admin(ctx, ev), nil
	}
	return Problem(http.StatusNotFound, "Not Found", "routes: GET /v1/quote, GET /usage, POST /admin/plan"), nil
}

// customerKey is the context key under which authenticate passes the
// request's customer and key on.
type customerKey struct{}

// authenticated is what authenticate found.
type authenticated struct {
	key string
	cu  Customer
}

// authenticate refuses requests whose X-Api-Key is not a customer's key
// with 401. It reads the field with lambda.EventHeader and keys it with
// httplimit.APIKey, the rule the adapter's key function uses, so the key it
// authenticates is the key that is charged; an event whose copies of the
// field conflict (x-api-key and X-Api-Key with different values) is refused
// with 400. A customer table that fails or does not answer within the
// Timeout gets 503, reported as a store failure.
func (a *API) authenticate(next lambda.HTTPAPIHandler) lambda.HTTPAPIHandler {
	return func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		h, err := lambda.EventHeader(&ev)
		if err != nil {
			return Problem(http.StatusBadRequest, "Bad Request", err.Error()), nil
		}
		// Keys are looked up by their hash, so the lookup's timing says
		// nothing useful about the keys.
		key, err := httplimit.APIKey(h.Get(APIKeyField))
		var cu Customer
		if err == nil {
			lctx, cancel := context.WithDeadline(ctx, Bound(ctx, time.Now(), a.cfg.Timeout))
			cu, err = a.cfg.Customers.Customer(lctx, key)
			cancel()
		}
		switch {
		case errors.Is(err, httplimit.ErrNoKey), errors.Is(err, ErrUnknownCustomer):
			return Problem(http.StatusUnauthorized, "Unauthorized", "send a valid API key in X-Api-Key"), nil
		case err != nil:
			a.failed(err)
			return Unavailable(), nil
		}
		return next(context.WithValue(ctx, customerKey{}, authenticated{key, cu}), ev)
	}
}

// failed reports a failure of the store outside a metered call (the Guard
// reports those): one line for an outage, then a count at most every
// outage.DefaultInterval, not a line per call.
func (a *API) failed(err error) {
	a.outage.Failure(ratekit.FailureEvent{Action: ratekit.FailedClosed, ErrorClass: ratekit.ClassifyError(err), Err: err})
}

// serve runs a call that the quota admitted. Any call that does not succeed
// is refunded, so customers pay for answers only.
func (a *API) serve(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	d, _ := httplimit.DecisionFromContext(ctx)
	symbol := strings.ToUpper(ev.QueryStringParameters["symbol"])
	if !validSymbol(symbol) {
		return a.refund(ctx, Problem(http.StatusBadRequest, "Bad Request", "symbol must be 1 to 8 letters")), nil
	}
	price, err := a.cfg.Quote(ctx, symbol)
	if err != nil {
		a.cfg.Logger.WarnContext(ctx, "downstream quote failed; refunding the call", "error", err)
		return a.refund(ctx, Problem(http.StatusBadGateway, "Bad Gateway", "the quote service failed; this call was not charged")), nil
	}
	left := d.Remaining
	for _, p := range d.Parts {
		if p.Policy.Name == MonthlyPolicy {
			left = p.Remaining
		}
	}
	return jsonResponse(map[string]any{"symbol": symbol, "price": price, "calls_left_this_month": left}), nil
}

// UsageReport is the body of GET /usage: what the key used of each policy
// of its plan, as the limiter counts it.
type UsageReport struct {
	Plan     string        `json:"plan"`
	Policies []PolicyUsage `json:"policies"`
}

// PolicyUsage is one policy's line of a UsageReport. Times are UTC.
type PolicyUsage struct {
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
// one read of every policy of the key's plan (the limiter's Usage).
func (a *API) usage(ctx context.Context, _ events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	who := ctx.Value(customerKey{}).(authenticated)
	// Bounded like a metered call's decision: by the Timeout and the
	// invocation's deadline less the Guard's margin, so that the 503
	// leaves before Lambda ends the invocation.
	uctx, cancel := context.WithDeadline(ctx, Bound(ctx, time.Now(), a.cfg.Timeout))
	defer cancel()
	us, err := a.cfg.Limiter.Usage(uctx, who.key)
	if err != nil {
		a.failed(err)
		return Unavailable(), nil
	}
	a.outage.Answered()
	now := time.Now()
	report := UsageReport{Plan: who.cu.Plan, Policies: make([]PolicyUsage, len(us))}
	for i, u := range us {
		p := PolicyUsage{
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
	return jsonResponse(report), nil
}

// PlanChange is the body of POST /admin/plan.
type PlanChange struct {
	APIKey string `json:"api_key"`
	Plan   string `json:"plan"`
	Quota  int64  `json:"quota,omitempty"` // enterprise only
}

// admin answers POST /admin/plan: it moves a customer to another plan,
// effective from the customer's next request. What the customer used this
// month stays counted (the limiter counts per policy name, not per plan):
// an upgrade leaves more remaining, a downgrade leaves none until the
// month ends, never less than none. The caller must send the admin token
// as a bearer token; without an AdminToken the route does not exist.
func (a *API) admin(ctx context.Context, ev events.APIGatewayV2HTTPRequest) events.APIGatewayV2HTTPResponse {
	if a.cfg.AdminToken == "" {
		return Problem(http.StatusNotFound, "Not Found", "the admin endpoint is disabled (set PAIDAPI_ADMIN_TOKEN)")
	}
	h, err := lambda.EventHeader(&ev)
	if err != nil {
		return Problem(http.StatusBadRequest, "Bad Request", err.Error())
	}
	// Compared as hashes in constant time: the timing says nothing about
	// the token or its length.
	got := sha256.Sum256([]byte(strings.TrimPrefix(h.Get("Authorization"), "Bearer ")))
	want := sha256.Sum256([]byte(a.cfg.AdminToken))
	if !strings.HasPrefix(h.Get("Authorization"), "Bearer ") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		resp := Problem(http.StatusUnauthorized, "Unauthorized", "send the admin token as Authorization: Bearer <token>")
		resp.Headers["WWW-Authenticate"] = "Bearer"
		return resp
	}
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return Problem(http.StatusBadRequest, "Bad Request", "the body is not valid base64")
		}
	}
	var c PlanChange
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Problem(http.StatusBadRequest, "Bad Request", `want {"api_key": "…", "plan": "free"|"pro"|"enterprise", "quota": n}: `+err.Error())
	}
	key, err := httplimit.APIKey(c.APIKey)
	if err != nil {
		return Problem(http.StatusBadRequest, "Bad Request", "api_key: "+err.Error())
	}
	sctx, cancel := context.WithDeadline(ctx, Bound(ctx, time.Now(), a.cfg.Timeout))
	defer cancel()
	cu, err := a.cfg.Customers.SetPlan(sctx, key, c.Plan, c.Quota)
	switch {
	case errors.Is(err, ErrUnknownCustomer):
		return Problem(http.StatusNotFound, "Not Found", err.Error())
	case errors.Is(err, ErrInvalidPlan):
		return Problem(http.StatusBadRequest, "Bad Request", err.Error())
	case err != nil:
		a.failed(err)
		return Unavailable()
	}
	t := a.cfg.Tiers.Of(cu)
	a.cfg.Logger.InfoContext(ctx, "plan changed", "plan", cu.Plan, "monthly_quota", t.Quota, "burst", t.Burst)
	return jsonResponse(map[string]any{"plan": cu.Plan, "monthly_quota": t.Quota, "burst": t.Burst})
}

// jsonResponse is a 200 with v in JSON, never cached.
func jsonResponse(v any) events.APIGatewayV2HTTPResponse {
	body, _ := json.Marshal(v)
	return events.APIGatewayV2HTTPResponse{
		StatusCode: http.StatusOK,
		Headers:    map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store"},
		Body:       string(body),
	}
}

// Unavailable is the answer when the store or the customer table fails
// outside a metered call (the Guard answers those): 503 with Retry-After.
func Unavailable() events.APIGatewayV2HTTPResponse {
	resp := Problem(http.StatusServiceUnavailable, "Service Unavailable", "try again shortly")
	resp.Headers["Retry-After"] = "1"
	return resp
}

// Problem is an answer of status with an RFC 9457 problem body of type
// about:blank.
func Problem(status int, title, detail string) events.APIGatewayV2HTTPResponse {
	body, _ := json.Marshal(httplimit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
	return events.APIGatewayV2HTTPResponse{
		StatusCode: status,
		Headers:    map[string]string{"Content-Type": httplimit.ProblemContentType},
		Body:       string(body),
	}
}

// Bound returns the time by which store work that starts at now must end:
// now+timeout, or earlier, the invocation's deadline (ctx's) less the
// margin a Guard keeps for answering (httplimit.DefaultDeadlineMargin, or a
// tenth of the time left when that is less), the bound the Guard puts on a
// metered call's decision.
func Bound(ctx context.Context, now time.Time, timeout time.Duration) time.Time {
	end := now.Add(timeout)
	if dl, ok := ctx.Deadline(); ok {
		last := dl.Add(-max(min(httplimit.DefaultDeadlineMargin, dl.Sub(now)/10), 0))
		if last.Before(end) {
			end = last
		}
	}
	return end
}

// refund gives the call back, with the same key, cost and idempotency key
// that were charged (so a retried refund counts once), and returns resp
// with RateLimit fields that show the refunded count. It runs even when the
// handler's context was cancelled, but ends by the earlier of the Timeout
// and the invocation deadline minus httplimit.DefaultDeadlineMargin, so
// that the answer leaves in time; a refund that does not finish leaves the
// call charged.
func (a *API) refund(ctx context.Context, resp events.APIGatewayV2HTTPResponse) events.APIGatewayV2HTTPResponse {
	req, ok := httplimit.RequestFromContext(ctx)
	if !ok {
		return resp // no decision was made: nothing was charged
	}
	end := time.Now().Add(a.cfg.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-httplimit.DefaultDeadlineMargin).Before(end) {
		end = dl.Add(-httplimit.DefaultDeadlineMargin)
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
	defer cancel()
	d, err := a.cfg.Limiter.Refund(ctx, req)
	if err != nil {
		a.cfg.Logger.ErrorContext(ctx, "refund failed; the call stays charged", "error", err)
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
