package ratekit

import (
	"context"
	"fmt"
	"net/http"
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

	// Denied, when set, answers denied requests instead of the default
	// problem+json body. The RateLimit fields, Retry-After and client state
	// are already in the response header, the decision is in the request's
	// context ([DecisionFromContext]), and Denied must write the status
	// (normally 429).
	Denied http.Handler
}

// Middleware returns net/http middleware that limits every request through
// cfg.Limiter. Allowed requests reach the next handler with the RateLimit
// fields (and client state) already set and the [Decision] in their context;
// denied requests get 429 with Retry-After and a problem+json body (or
// cfg.Denied); limiter failures follow cfg.OnError; requests without a usable
// key get 400.
//
// This is what a Cloud Run service or any net/http server uses. It returns an
// error matching [ErrInvalidConfig] for an invalid cfg. The returned
// middleware is safe for concurrent use and never panics on client input.
func Middleware(cfg MiddlewareConfig) (func(http.Handler) http.Handler, error) {
	if cfg.Key == nil {
		return nil, fmt.Errorf("%w: MiddlewareConfig.Key is nil", ErrInvalidConfig)
	}
	g, err := NewGuard(cfg.GuardConfig)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			res := guardHTTP(g, cfg.Key, cfg.Cost, w.Header(), r)
			if res.Proceed() {
				if res.Decided {
					r = r.WithContext(NewContext(r.Context(), res.Decision))
				}
				next.ServeHTTP(w, r)
				return
			}
			if res.Status == http.StatusTooManyRequests && cfg.Denied != nil {
				w.Header().Del("Content-Type")
				cfg.Denied.ServeHTTP(w, r.WithContext(NewContext(r.Context(), res.Decision)))
				return
			}
			w.WriteHeader(res.Status)
			w.Write(res.Body)
		})
	}, nil
}

func guardHTTP(g *Guard, key KeyFunc, cost func(*http.Request) int64, dst http.Header, r *http.Request) Result {
	k, err := key(r)
	if err != nil {
		return g.BadRequest(err, dst)
	}
	req := Request{Key: k, Cost: 1, State: g.State(r.Header)}
	if cost != nil {
		req.Cost = cost(r)
	}
	return g.Check(r.Context(), req, dst)
}

type decisionKey struct{}

// NewContext returns a copy of ctx that carries d, for handlers behind a
// limiter that want to show the remaining quota.
func NewContext(ctx context.Context, d Decision) context.Context {
	return context.WithValue(ctx, decisionKey{}, d)
}

// DecisionFromContext returns the [Decision] that [Middleware] (or an adapter)
// stored in ctx, and whether there was one. There is none when the limiter
// failed and the failure policy let the request through.
func DecisionFromContext(ctx context.Context) (Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(Decision)
	return d, ok
}
