package ratekit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// FailurePolicy says what a [Guard] does when its limiter returns an error
// other than an invalid request: the limiter could not decide, typically
// because its store is slow or down. There is no default; the zero value is
// invalid, so that every deployment makes this choice explicitly.
type FailurePolicy int

const (
	// FailClosed answers 503 Service Unavailable with a
	// temporary-reduced-capacity problem body. Use it when an unmetered
	// request costs money (a paid API tier).
	FailClosed FailurePolicy = iota + 1

	// FailOpen lets the request through without RateLimit fields and logs
	// the error at level Warn. Use it when availability matters more than
	// the limit (a contact form).
	FailOpen

	// UseFallback asks GuardConfig.Fallback instead, for example an
	// in-memory or signed-window limiter in front of a PostgreSQL one. If
	// the fallback fails too, the guard fails closed.
	UseFallback
)

// String returns the policy's name as written in Go.
func (p FailurePolicy) String() string {
	switch p {
	case FailClosed:
		return "FailClosed"
	case FailOpen:
		return "FailOpen"
	case UseFallback:
		return "UseFallback"
	}
	return "FailurePolicy(" + strconv.Itoa(int(p)) + ")"
}

// Default names under which a [Guard] carries client state (the signed-window
// token) in requests and responses.
const (
	DefaultStateHeader = "Ratekit-Token"
	DefaultStateCookie = "ratekit_token"
)

// GuardConfig configures a [Guard]. Limiter and OnError are required.
type GuardConfig struct {
	// Limiter decides each request.
	Limiter Limiter

	// OnError is the failure policy applied when Limiter returns an error
	// that is not an [ErrInvalidRequest]. Required.
	OnError FailurePolicy

	// Fallback decides when Limiter fails and OnError is UseFallback.
	// Required then, and must be nil otherwise.
	Fallback Limiter

	// Timeout, when positive, bounds each limiter call (and each fallback
	// call) in addition to the caller's context, so a slow store costs at
	// most Timeout per request. Zero adds no bound: the caller's context
	// alone decides (in Lambda, the invocation deadline).
	//
	// With UseFallback, set Timeout below the callers' deadline: a limiter
	// call that runs until the caller's own deadline leaves no time for the
	// fallback, which then fails too, and the guard fails closed. (The
	// chaos tests in internal/chaostest use a 200 ms caller deadline and a
	// 100 ms Timeout.)
	Timeout time.Duration

	// Logger receives FailOpen and fallback events at level Warn. Nil means
	// slog.Default(). Keys are never logged: they are IP addresses and API
	// keys.
	Logger *slog.Logger

	// LegacyHeaders also writes X-RateLimit-Limit, -Remaining and -Reset.
	LegacyHeaders bool

	// StateHeader is the request and response header field that carries
	// client state. Empty means DefaultStateHeader.
	StateHeader string

	// StateCookie is the name of the cookie that carries client state.
	// Empty means DefaultStateCookie. The cookie is HttpOnly, SameSite=Lax,
	// Path=/, Secure unless InsecureCookie is set, and lives as long as the
	// policy's window.
	StateCookie string

	// NoStateCookie turns the cookie off: state travels in the header only
	// (API clients that do not keep cookies).
	NoStateCookie bool

	// InsecureCookie drops the Secure attribute, for plain-HTTP development
	// hosts other than localhost (browsers treat localhost as secure).
	InsecureCookie bool

	// Observer, when its FailurePolicy field is set, learns each time the
	// failure policy acts (see [FailureEvent]). Nil observes nothing and
	// costs nothing. The Guard does not report decisions: wrap Limiter and
	// Fallback with [Observe] for those.
	Observer *Observer
}

// Guard turns a [Limiter]'s decisions into HTTP answers: the RateLimit header
// fields, Retry-After, problem+json bodies, client-state transport and the
// failure policy. [Middleware] and the lambda package's adapters share it, so
// every transport answers alike.
//
// A Guard is safe for concurrent use and should be built once (at init in a
// serverless function) and reused.
type Guard struct {
	cfg         GuardConfig
	log         *slog.Logger
	unavailable []byte
}

// NewGuard validates cfg and returns a Guard. It returns an error matching
// [ErrInvalidConfig] when Limiter is nil, OnError is not one of the defined
// policies, Fallback does not match OnError, Timeout is negative, or a state
// header or cookie name is not a valid token.
func NewGuard(cfg GuardConfig) (*Guard, error) {
	switch {
	case cfg.Limiter == nil:
		return nil, fmt.Errorf("%w: GuardConfig.Limiter is nil", ErrInvalidConfig)
	case cfg.OnError < FailClosed || cfg.OnError > UseFallback:
		return nil, fmt.Errorf("%w: GuardConfig.OnError must be FailClosed, FailOpen or UseFallback, got %v", ErrInvalidConfig, cfg.OnError)
	case cfg.OnError == UseFallback && cfg.Fallback == nil:
		return nil, fmt.Errorf("%w: GuardConfig.OnError is UseFallback but Fallback is nil", ErrInvalidConfig)
	case cfg.OnError != UseFallback && cfg.Fallback != nil:
		return nil, fmt.Errorf("%w: GuardConfig.Fallback is set but OnError is %v", ErrInvalidConfig, cfg.OnError)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: GuardConfig.Timeout is negative", ErrInvalidConfig)
	}
	if cfg.StateHeader == "" {
		cfg.StateHeader = DefaultStateHeader
	}
	if cfg.StateCookie == "" {
		cfg.StateCookie = DefaultStateCookie
	}
	if !isToken(cfg.StateHeader) {
		return nil, fmt.Errorf("%w: StateHeader %q is not a valid header field name", ErrInvalidConfig, cfg.StateHeader)
	}
	if !isToken(cfg.StateCookie) {
		return nil, fmt.Errorf("%w: StateCookie %q is not a valid cookie name", ErrInvalidConfig, cfg.StateCookie)
	}
	cfg.StateHeader = http.CanonicalHeaderKey(cfg.StateHeader)
	g := &Guard{cfg: cfg, log: cfg.Logger}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.unavailable = mustJSON(Problem{
		Type:   ProblemTypeTemporaryReducedCapacity,
		Title:  "Service unavailable: the rate limiter could not decide",
		Status: http.StatusServiceUnavailable,
	})
	return g, nil
}

// Result is a [Guard]'s answer to one request.
type Result struct {
	// Decision is the limiter's (or fallback's) decision, valid when
	// Decided is true.
	Decision Decision

	// Decided reports whether a limiter decided: false for a bad request
	// and for a failure that failed open or closed.
	Decided bool

	// Status is 0 when the request may proceed to the handler. Otherwise it
	// is the status to answer with: 429 (denied), 503 (failed closed) or
	// 400 (no usable key or an invalid request), and Body holds the
	// problem+json body.
	Status int

	// Body is the response body when Status is not 0.
	Body []byte

	// Err is the error that made the limiter unable to decide (also when
	// the failure policy let the request through), or the key or request
	// error behind a 400. Nil on an ordinary decision.
	Err error
}

// Proceed reports whether the request may go on to the handler.
func (r Result) Proceed() bool { return r.Status == 0 }

// State returns the client state carried by a request: the StateHeader field
// when present, else the StateCookie cookie, else "". h is the request's
// header (an http.Request.Header, or one built from a serverless event).
func (g *Guard) State(h http.Header) string {
	if v := h.Get(g.cfg.StateHeader); v != "" {
		return v
	}
	if g.cfg.NoStateCookie {
		return ""
	}
	for _, line := range h["Cookie"] {
		cookies, err := http.ParseCookie(line)
		if err != nil {
			continue
		}
		for _, c := range cookies {
			if c.Name == g.cfg.StateCookie {
				return c.Value
			}
		}
	}
	return ""
}

// Check asks the limiter about req and writes the response header fields
// into dst: RateLimit-Policy, RateLimit, Retry-After on a denial, the
// client state (header field and Set-Cookie) and, when Status is not 0,
// Content-Type. The caller then either runs its handler (Proceed) or answers
// with Status and Body.
//
// An invalid request (errors.Is ErrInvalidRequest) gets 400 whatever the
// failure policy, so that a client cannot bypass the limit with an
// oversized key. Any other limiter error is handled by OnError.
func (g *Guard) Check(ctx context.Context, req Request, dst http.Header) Result {
	if err := req.Validate(); err != nil {
		return g.BadRequest(err, dst)
	}
	d, err := g.allow(ctx, g.cfg.Limiter, req)
	if err != nil {
		if errors.Is(err, ErrInvalidRequest) {
			return g.BadRequest(err, dst)
		}
		switch g.cfg.OnError {
		case FailOpen:
			g.log.WarnContext(ctx, "ratekit: limiter failed; letting the request through (FailOpen)", "error", err)
			g.observeFailure(ctx, FailedOpen, err, nil)
			return Result{Err: err}
		case UseFallback:
			fd, ferr := g.allow(ctx, g.cfg.Fallback, req)
			if ferr == nil {
				g.log.WarnContext(ctx, "ratekit: limiter failed; decided by the fallback", "error", err)
				g.observeFailure(ctx, FellBack, err, nil)
				res := g.decided(fd, dst)
				res.Err = err
				return res
			}
			g.log.WarnContext(ctx, "ratekit: limiter and fallback failed; failing closed", "error", err, "fallback_error", ferr)
			g.observeFailure(ctx, FailedClosed, err, ferr)
			err = errors.Join(err, ferr)
		default:
			g.observeFailure(ctx, FailedClosed, err, nil)
		}
		dst.Set("Content-Type", ProblemContentType)
		return Result{Status: http.StatusServiceUnavailable, Body: g.unavailable, Err: err}
	}
	return g.decided(d, dst)
}

// BadRequest returns the 400 answer for a request whose key could not be
// derived (a [KeyFunc] error) or that failed validation, writing
// Content-Type into dst.
func (g *Guard) BadRequest(err error, dst http.Header) Result {
	dst.Set("Content-Type", ProblemContentType)
	return Result{
		Status: http.StatusBadRequest,
		Body: mustJSON(Problem{
			Type:   "about:blank",
			Title:  "Bad Request",
			Status: http.StatusBadRequest,
			Detail: err.Error(),
		}),
		Err: err,
	}
}

func (g *Guard) allow(ctx context.Context, l Limiter, req Request) (Decision, error) {
	if g.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.Timeout)
		defer cancel()
	}
	return l.Allow(ctx, req)
}

func (g *Guard) decided(d Decision, dst http.Header) Result {
	SetHeaders(dst, d, g.cfg.LegacyHeaders)
	if d.State != "" {
		dst.Set(g.cfg.StateHeader, d.State)
		if !g.cfg.NoStateCookie {
			c := http.Cookie{
				Name:     g.cfg.StateCookie,
				Value:    d.State,
				Path:     "/",
				MaxAge:   int(max(ceilSeconds(d.Policy.Window), 1)),
				HttpOnly: true,
				Secure:   !g.cfg.InsecureCookie,
				SameSite: http.SameSiteLaxMode,
			}
			dst.Add("Set-Cookie", c.String())
		}
	}
	if d.Allowed {
		return Result{Decision: d, Decided: true}
	}
	dst.Set("Content-Type", ProblemContentType)
	return Result{Decision: d, Decided: true, Status: http.StatusTooManyRequests, Body: DeniedProblem(d)}
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!', c == '#', c == '$', c == '%', c == '&', c == '\'', c == '*',
			c == '+', c == '-', c == '.', c == '^', c == '_', c == '`', c == '|', c == '~':
		default:
			return false
		}
	}
	return true
}
