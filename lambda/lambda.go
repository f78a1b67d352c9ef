package lambda

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
)

// Handler types of the four HTTP-shaped events, in the form lambda.Start
// accepts. A plain func literal of the same signature is assignable to them.
type (
	// RESTHandler handles an API Gateway REST API proxy event.
	RESTHandler func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error)

	// HTTPAPIHandler handles an API Gateway HTTP API event (payload
	// format 2.0).
	HTTPAPIHandler func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)

	// FunctionURLHandler handles a Lambda function URL event.
	FunctionURLHandler func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error)

	// ALBHandler handles an Application Load Balancer target group event.
	ALBHandler func(context.Context, events.ALBTargetGroupRequest) (events.ALBTargetGroupResponse, error)
)

// Request is what a [KeyFunc] and the other Config functions see of one
// invocation, in the same form for every event type.
type Request struct {
	// Header holds the event's header fields under canonical names
	// (http.CanonicalHeaderKey), whatever case the event used: HTTP APIs,
	// function URLs and ALBs send lower-case names. Multi-value headers are
	// used when the event has them. The cookies that HTTP API and function
	// URL events carry in their own list are added as a Cookie field, so
	// [httplimit.Guard.State] finds the state cookie in every event type.
	// Copies of one field under names that differ in case only are one field
	// when their values agree; an event whose copies differ is answered with
	// 400 before any Config function runs ([EventHeader],
	// [ErrConflictingHeader]).
	Header http.Header

	// SourceIP is the client address that API Gateway or the function URL
	// saw (requestContext.identity.sourceIp for REST APIs,
	// requestContext.http.sourceIp for HTTP APIs and function URLs). It is
	// empty for ALB events, which carry none: use X-Forwarded-For
	// ([ForwardedForKey]).
	SourceIP string

	// Method and Path are the request's HTTP method and path.
	Method, Path string

	// Event points to the event itself: an *events.APIGatewayProxyRequest,
	// *events.APIGatewayV2HTTPRequest, *events.LambdaFunctionURLRequest or
	// *events.ALBTargetGroupRequest. Functions must not modify it.
	Event any
}

// KeyFunc derives the rate-limit key of an invocation. It returns an error
// (matching [httplimit.ErrNoKey] for this package's key functions) when the
// event carries no usable key; the wrappers answer such requests with 400
// rather than letting them through unlimited, as [httplimit.Middleware] does.
// ctx is the invocation's context.
type KeyFunc func(ctx context.Context, r *Request) (string, error)

// Config configures an [Adapter].
type Config struct {
	// Guard turns the limiter's decisions into HTTP answers. Required.
	// Build it once, at init, with [httplimit.NewGuard]; it may be shared with
	// a [httplimit.Middleware] configured alike or with other adapters.
	Guard *httplimit.Guard

	// Key derives the rate-limit key. Required. See [SourceIPKey],
	// [ForwardedForKey], [APIKeyHeaderKey], [GatewayAPIKey], [ClaimKey],
	// [HTTPKey] and [EventKey].
	Key KeyFunc

	// Cost returns the units an invocation takes. Nil means 1. A result
	// below 1 is answered with 400, since it is a bug in the function
	// rather than the client.
	Cost func(*Request) int64

	// IdempotencyKey returns the [ratekit.Request.IdempotencyKey] of an
	// invocation, for strategies that honour it (durable): a retried
	// request with the same value counts once. Nil or "" means none. Values
	// longer than [ratekit.MaxKeyLen] are answered with 400. Use
	// [HeaderValue] to read a header field such as Idempotency-Key.
	IdempotencyKey func(*Request) string

	// Parts returns the [ratekit.Request.Parts] of an invocation for a
	// composite limiter: one key and cost per policy, in the composite's
	// order (the user's key, then the organisation's). Nil means none:
	// every policy counts Key and Cost. Parts that fail validation (the
	// wrong number among them) are answered with 400.
	Parts func(*Request) []ratekit.Part

	// Denied, when set, makes the body of 429 answers instead of the
	// default problem+json one, as [httplimit.MiddlewareConfig.Denied] does:
	// an HTML page for browsers, say. h already holds the RateLimit fields,
	// Retry-After and the client state; Denied sets Content-Type and any
	// other field in h and returns the status (normally 429) and the body.
	Denied func(ctx context.Context, r *Request, d ratekit.Decision, h http.Header) (status int, body string)
}

// Adapter wraps Lambda handlers with a [httplimit.Guard]. It is safe for
// concurrent use, holds no goroutine and no timer, and should be built once
// per instance (at init) and reused by every invocation.
//
// Its wrapper methods panic when next is nil, as http.Handle does, so that
// the mistake shows at init rather than on the first request.
type Adapter struct {
	cfg Config
}

// New validates cfg and returns an Adapter. It returns an error matching
// [ratekit.ErrInvalidConfig] when Guard or Key is nil.
func New(cfg Config) (*Adapter, error) {
	switch {
	case cfg.Guard == nil:
		return nil, configErr("Config.Guard is nil")
	case cfg.Key == nil:
		return nil, configErr("Config.Key is nil")
	}
	return &Adapter{cfg: cfg}, nil
}

// check runs the Guard for r. dst receives the response header fields; the
// returned context carries the decision and the request for the handler.
func (a *Adapter) check(ctx context.Context, r *Request) (context.Context, http.Header, httplimit.Verdict) {
	dst := make(http.Header, 4)
	key, err := a.cfg.Key(ctx, r)
	if err != nil {
		return ctx, dst, a.cfg.Guard.BadRequest(err, dst)
	}
	req := ratekit.Request{Key: key, Cost: 1, State: a.cfg.Guard.State(r.Header)}
	if a.cfg.Cost != nil {
		req.Cost = a.cfg.Cost(r)
	}
	if a.cfg.IdempotencyKey != nil {
		req.IdempotencyKey = a.cfg.IdempotencyKey(r)
	}
	if a.cfg.Parts != nil {
		req.Parts = a.cfg.Parts(r)
	}
	res := a.cfg.Guard.Check(ctx, req, dst)
	if res.Proceed() && res.Decided {
		ctx = httplimit.NewContext(ctx, req, res.Decision)
	}
	return ctx, dst, res
}

// refuse returns the status and body of an answer that does not reach the
// handler: the Guard's, or Config.Denied's for a denial.
func (a *Adapter) refuse(ctx context.Context, r *Request, dst http.Header, res httplimit.Verdict) (int, string) {
	if res.Status == http.StatusTooManyRequests && a.cfg.Denied != nil {
		dst.Del("Content-Type")
		return a.cfg.Denied(ctx, r, res.Decision, dst)
	}
	return res.Status, string(res.Body)
}

// REST returns next behind the limiter, for API Gateway REST API proxy
// events. Header fields go into the response's Headers map and Set-Cookie
// into MultiValueHeaders (API Gateway merges the two); a Set-Cookie that
// next put into Headers is moved there too, so that no cookie is lost.
func (a *Adapter) REST(next RESTHandler) RESTHandler {
	mustHandler(next == nil)
	return func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		header, herr := EventHeader(&ev)
		r := &Request{
			Header:   header,
			SourceIP: ev.RequestContext.Identity.SourceIP,
			Method:   ev.HTTPMethod,
			Path:     ev.Path,
			Event:    &ev,
		}
		return serve(ctx, a, ev, r, herr, next, func(status int, body string) events.APIGatewayProxyResponse {
			return events.APIGatewayProxyResponse{StatusCode: status, Body: body}
		}, mergeREST)
	}
}

// HTTPAPI returns next behind the limiter, for API Gateway HTTP API events
// (payload format 2.0). Header fields go into the response's Headers map
// and Set-Cookie into its Cookies list.
func (a *Adapter) HTTPAPI(next HTTPAPIHandler) HTTPAPIHandler {
	mustHandler(next == nil)
	return func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		header, herr := EventHeader(&ev)
		r := &Request{
			Header:   header,
			SourceIP: ev.RequestContext.HTTP.SourceIP,
			Method:   ev.RequestContext.HTTP.Method,
			Path:     ev.RawPath,
			Event:    &ev,
		}
		return serve(ctx, a, ev, r, herr, next, func(status int, body string) events.APIGatewayV2HTTPResponse {
			return events.APIGatewayV2HTTPResponse{StatusCode: status, Body: body}
		}, func(resp *events.APIGatewayV2HTTPResponse, dst http.Header) {
			resp.Headers, resp.Cookies = mergeCookieForm(resp.Headers, resp.Cookies, dst)
		})
	}
}

// FunctionURL returns next behind the limiter, for Lambda function URL
// events. Header fields go into the response's Headers map and Set-Cookie
// into its Cookies list.
func (a *Adapter) FunctionURL(next FunctionURLHandler) FunctionURLHandler {
	mustHandler(next == nil)
	return func(ctx context.Context, ev events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		header, herr := EventHeader(&ev)
		r := &Request{
			Header:   header,
			SourceIP: ev.RequestContext.HTTP.SourceIP,
			Method:   ev.RequestContext.HTTP.Method,
			Path:     ev.RawPath,
			Event:    &ev,
		}
		return serve(ctx, a, ev, r, herr, next, func(status int, body string) events.LambdaFunctionURLResponse {
			return events.LambdaFunctionURLResponse{StatusCode: status, Body: body}
		}, func(resp *events.LambdaFunctionURLResponse, dst http.Header) {
			resp.Headers, resp.Cookies = mergeCookieForm(resp.Headers, resp.Cookies, dst)
		})
	}
}

// ALB returns next behind the limiter, for Application Load Balancer target
// group events. A target group sends either Headers or MultiValueHeaders,
// as its multi-value headers setting says, and reads the same form back, so
// the wrapper answers in the form the request used and next must too.
//
// With single-value headers a response carries one Set-Cookie at most: when
// next sets a cookie itself, the state cookie is left out, and the client
// state still travels in the [httplimit.GuardConfig.StateHeader] field.
func (a *Adapter) ALB(next ALBHandler) ALBHandler {
	mustHandler(next == nil)
	return func(ctx context.Context, ev events.ALBTargetGroupRequest) (events.ALBTargetGroupResponse, error) {
		multi := ev.MultiValueHeaders != nil
		header, herr := EventHeader(&ev)
		r := &Request{
			Header: header,
			Method: ev.HTTPMethod,
			Path:   ev.Path,
			Event:  &ev,
		}
		return serve(ctx, a, ev, r, herr, next, func(status int, body string) events.ALBTargetGroupResponse {
			return events.ALBTargetGroupResponse{
				StatusCode:        status,
				StatusDescription: strconv.Itoa(status) + " " + http.StatusText(status),
				Body:              body,
			}
		}, func(resp *events.ALBTargetGroupResponse, dst http.Header) { mergeALB(resp, dst, multi) })
	}
}

// serve is the flow every wrapper shares: refuse an event whose header
// fields conflict (herr) with 400; check the request; when it may not
// proceed, answer with the response refused builds; otherwise run next. The
// decision's header fields are merged into the response either way (not into
// an error's).
func serve[E, R any](ctx context.Context, a *Adapter, ev E, r *Request, herr error, next func(context.Context, E) (R, error),
	refused func(status int, body string) R, merge func(*R, http.Header)) (R, error) {
	var (
		dst http.Header
		res httplimit.Verdict
	)
	if herr != nil {
		dst = make(http.Header, 1)
		res = a.cfg.Guard.BadRequest(herr, dst)
	} else {
		ctx, dst, res = a.check(ctx, r)
	}
	if !res.Proceed() {
		status, body := a.refuse(ctx, r, dst, res)
		resp := refused(status, body)
		merge(&resp, dst)
		return resp, nil
	}
	resp, err := next(ctx, ev)
	if err == nil {
		merge(&resp, dst)
	}
	return resp, err
}

func mustHandler(isNil bool) {
	if isNil {
		panic("ratekit/lambda: nil handler")
	}
}

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "lambda: invalid config: " and format's text: every configuration error of
// this package is made here. An httplimit configuration error in the text
// loses its "httplimit: invalid config: ", so the class is said once.
func configErr(format string, args ...any) error {
	msg := strings.ReplaceAll(fmt.Sprintf(format, args...), "httplimit: invalid config: ", "")
	return fmt.Errorf("lambda: %w: %s", ratekit.ErrInvalidConfig, msg)
}
