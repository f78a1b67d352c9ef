package httplimit

import (
	"context"
	"net/http"

	"github.com/ratekit/ratekit"
)

// MiddlewareConfig configures [Middleware]: a [GuardConfig] plus how to
// derive the key and the cost from an *http.Request.
type MiddlewareConfig struct {
	GuardConfig

	// Key derives the rate-limit key from a request. Required. Use one of
	// the key functions of this package ([RemoteAddrKey], [ForwardedForKey],
	// [HeaderIPKey], [APIKeyHeaderKey]) or your own.
	Key KeyFunc

	// Cost returns the units a request takes. Nil means 1 for every
	// request. A result below 1 is answered with 400, since it is a bug in
	// the function rather than the client.
	Cost func(*http.Request) int64

	// IdempotencyKey, when set, returns the request's idempotency key (for
	// example the Idempotency-Key header field), so that strategies that
	// honour [ratekit.Request.IdempotencyKey] count a retried request once. Nil
	// means none.
	IdempotencyKey func(*http.Request) string

	// Parts, when set, returns the request's parts for a composite limiter
	// ([ratekit.Request.Parts]: one key and cost per policy, for example the
	// user's key and the organisation's). Nil means none: every policy
	// counts Key and Cost. Parts that fail validation are answered with
	// 400, like a bad Cost.
	Parts func(*http.Request) []ratekit.Part

	// Denied, when set, answers denied requests instead of the default
	// problem+json body. The RateLimit fields, Retry-After and client state
	// are already in the response header, the decision is in the request's
	// context ([DecisionFromContext]), and Denied must write the status
	// (normally 429).
	Denied http.Handler
}

// Middleware returns net/http middleware that limits every request through
// cfg.Limiter. Allowed requests reach the next handler with the RateLimit
// fields (and client state) already set and the [ratekit.Decision] and [ratekit.Request] in
// their context ([DecisionFromContext], [RequestFromContext]);
// denied requests get 429 with Retry-After and a problem+json body (or
// cfg.Denied); limiter failures follow cfg.OnError; requests without a usable
// key get 400. A request whose context ended before the limiter decided (the
// client disconnected) never reaches next, whatever cfg.OnError says, and
// each limiter call ends DeadlineMargin before the request context's
// deadline, if it has one (see [Guard.Check]).
//
// This is what a Cloud Run service or any net/http server uses. It returns an
// error matching [ratekit.ErrInvalidConfig] for an invalid cfg. The returned
// middleware is safe for concurrent use and never panics on client input.
func Middleware(cfg MiddlewareConfig) (func(http.Handler) http.Handler, error) {
	if cfg.Key == nil {
		return nil, configErr("MiddlewareConfig.Key is nil")
	}
	g, err := NewGuard(cfg.GuardConfig)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, res := guardHTTP(g, &cfg, w.Header(), r)
			if res.Proceed() {
				if res.Decided {
					r = r.WithContext(NewContext(r.Context(), req, res.Decision))
				}
				next.ServeHTTP(w, r)
				return
			}
			if res.Status == http.StatusTooManyRequests && cfg.Denied != nil {
				w.Header().Del("Content-Type")
				cfg.Denied.ServeHTTP(w, r.WithContext(NewContext(r.Context(), req, res.Decision)))
				return
			}
			w.WriteHeader(res.Status)
			w.Write(res.Body)
		})
	}, nil
}

func guardHTTP(g *Guard, cfg *MiddlewareConfig, dst http.Header, r *http.Request) (ratekit.Request, Verdict) {
	k, err := cfg.Key(r)
	if err != nil {
		return ratekit.Request{}, g.BadRequest(err, dst)
	}
	req := ratekit.Request{Key: k, Cost: 1, State: g.State(r.Header)}
	if cfg.Cost != nil {
		req.Cost = cfg.Cost(r)
	}
	if cfg.IdempotencyKey != nil {
		req.IdempotencyKey = cfg.IdempotencyKey(r)
	}
	if cfg.Parts != nil {
		req.Parts = cfg.Parts(r)
	}
	return req, g.Check(r.Context(), req, dst)
}

type contextKey struct{}

type decided struct {
	req ratekit.Request
	d   ratekit.Decision
}

// NewContext returns a copy of ctx that carries a request a limiter decided
// and its decision, for the handler behind the limiter: to show the
// remaining quota ([DecisionFromContext]) or to refund exactly what was
// charged ([RequestFromContext]). The request is kept as charged: when
// d.State is not empty, it replaces req.State, so that the request holds the
// client state that includes this charge. [Middleware] and the lambda
// adapters call it; other adapters may too.
func NewContext(ctx context.Context, req ratekit.Request, d ratekit.Decision) context.Context {
	if d.State != "" {
		req.State = d.State
	}
	return context.WithValue(ctx, contextKey{}, decided{req, d})
}

// DecisionFromContext returns the [ratekit.Decision] stored in ctx by [NewContext],
// and whether there was one. There is none when the limiter failed and the
// failure policy let the request through.
func DecisionFromContext(ctx context.Context) (ratekit.Decision, bool) {
	v, ok := ctx.Value(contextKey{}).(decided)
	return v.d, ok
}

// RequestFromContext returns the [ratekit.Request] stored in ctx by [NewContext] as
// it was charged, and whether there was one: the key, cost and idempotency
// key the limiter was asked with, and as State the client state the
// decision handed back (Decision.State), which already counts this charge,
// or the request's own State for strategies that return none.
//
// To refund a call whose work failed, pass it unchanged to the limiter's
// Refund ([ratekit.Refunder]) and, for strategies that carry state in the client,
// send the refund's Decision.State to the client in place of the charge's
// (the [GuardConfig.StateHeader] field and cookie). The refund then gives
// back this charge and nothing else, with every strategy: after two charges
// and the refund of the second, exactly one charge is counted (limitertest's
// RefundRecipe check). There is no request when the failure policy let the
// request through. With [UseFallback] the fallback limiter may have made the
// charge rather than the primary one, so quotas that are refunded should
// fail closed.
func RequestFromContext(ctx context.Context) (ratekit.Request, bool) {
	v, ok := ctx.Value(contextKey{}).(decided)
	return v.req, ok
}
