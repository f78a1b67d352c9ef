package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratekit"
)

// FailurePolicy says what a [Guard] does when its limiter returns an error
// other than an invalid request while the caller still waits: the limiter
// could not decide, typically because its store is slow or down, or it ran
// past the Guard's own bound ([GuardConfig.Timeout],
// [GuardConfig.DeadlineMargin]). A caller that gave up (its context ended)
// is not a limiter failure, and no policy applies to it: see [Guard.Check].
// There is no default; the zero value is invalid, so that every deployment
// makes this choice explicitly.
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

// DefaultUnavailableRetryAfter is the [GuardConfig.UnavailableRetryAfter]
// of a configuration that sets none.
const DefaultUnavailableRetryAfter = time.Second

// DefaultDeadlineMargin is the [GuardConfig.DeadlineMargin] of a
// configuration that sets none: enough to build and return an answer in a
// Lambda function or a net/http handler.
const DefaultDeadlineMargin = 100 * time.Millisecond

// GuardConfig configures a [Guard]. Limiter and OnError are required.
type GuardConfig struct {
	// Limiter decides each request.
	Limiter ratekit.Limiter

	// OnError is the failure policy applied when Limiter returns an error
	// that is not an [ratekit.ErrInvalidRequest]. Required.
	OnError FailurePolicy

	// Fallback decides when Limiter fails and OnError is UseFallback.
	// Required then, and must be nil otherwise.
	Fallback ratekit.Limiter

	// Timeout, when positive, bounds each limiter call (and each fallback
	// call), so a slow store costs at most Timeout per request. Zero adds no
	// bound of its own. Either way a call also ends before the caller's
	// deadline, by the margin that DeadlineMargin describes.
	Timeout time.Duration

	// DeadlineMargin is the time a Guard keeps for answering before the
	// deadline of the caller's context (in Lambda, the invocation deadline;
	// behind net/http, a deadline a server or earlier middleware set). Each
	// limiter call is bounded by the earlier of Timeout and the caller's
	// deadline minus the margin, so a store that does not answer ends in the
	// failure policy's answer (503 under FailClosed) while the caller still
	// listens, rather than in the caller's own timeout. The margin is
	// DeadlineMargin, or a tenth of the time left before the deadline when
	// Check starts if that is less, so that a short deadline is not spent on
	// the margin. With UseFallback the limiter gets at most half of the time
	// left before that bound and the fallback the rest, so the fallback gets
	// time too. A context without a deadline is bounded by Timeout alone.
	//
	// Zero means DefaultDeadlineMargin; a negative margin is invalid. Set it
	// above the time the handler needs to answer after a refusal.
	DeadlineMargin time.Duration

	// Logger receives, at level Warn, the limiter's failures (with the
	// failure policy's action and the cause) and the requests answered
	// 400: the first of each kind at once, then at most one line per
	// [LogInterval] with a count of the others. Nil means slog.Default().
	// Keys are never logged: they are IP addresses and API keys.
	Logger *slog.Logger

	// LegacyHeaders also writes X-RateLimit-Limit, -Remaining and -Reset.
	LegacyHeaders bool

	// RetrySpread, when positive, adds a random delay of 0 to RetrySpread
	// (whole seconds, each equally likely) to the Retry-After of every 429
	// and 503, and to the t of the policies that denied a 429, so that
	// clients refused at the same moment do not all come back at the same
	// moment (draft-ietf-httpapi-ratelimit-headers-10, section 7.5,
	// suggests such jitter). It only ever lengthens the wait: Retry-After
	// is never earlier than the request could be admitted. Zero adds none;
	// negative is invalid.
	RetrySpread time.Duration

	// UnavailableRetryAfter is the Retry-After of a 503 answered because
	// the limiter failed (FailClosed, or UseFallback with a failed
	// fallback), in whole seconds rounded up (RFC 9110, section 10.2.3).
	// Zero means DefaultUnavailableRetryAfter; negative is invalid.
	UnavailableRetryAfter time.Duration

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
	// failure policy acts (see [ratekit.FailureEvent]). Nil observes nothing and
	// costs nothing. The Guard does not report decisions: wrap Limiter and
	// Fallback with [ratekit.Observe] for those.
	Observer *ratekit.Observer
}

// Guard turns a [ratekit.Limiter]'s decisions into HTTP answers: the RateLimit header
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
	// badRequests and failures bound the Guard's log lines about 400s and
	// about limiter failures.
	badRequests, failures throttle
}

// throttle lets one log line through per LogInterval and counts the others.
type throttle struct {
	last    atomic.Int64 // UnixNano of the last line let through
	skipped atomic.Int64 // lines held back since
}

// allow reports whether a line may be written now and, if so, how many
// were held back since the last one.
func (t *throttle) allow() (ok bool, skipped int64) {
	now := time.Now().UnixNano()
	last := t.last.Load()
	if (last != 0 && now-last < int64(LogInterval)) || !t.last.CompareAndSwap(last, now) {
		t.skipped.Add(1)
		return false, 0
	}
	return true, t.skipped.Swap(0)
}

// warn writes msg at level Warn through t.
func (g *Guard) warn(ctx context.Context, t *throttle, msg string, args ...any) {
	ok, skipped := t.allow()
	if !ok {
		return
	}
	if skipped > 0 {
		args = append(args, "more_since_last_line", skipped)
	}
	g.log.WarnContext(ctx, msg, args...)
}

// NewGuard validates cfg and returns a Guard. It returns an error matching
// [ratekit.ErrInvalidConfig] when Limiter is nil, OnError is not one of the defined
// policies, Fallback does not match OnError, Timeout or DeadlineMargin is
// negative, or a state
// header or cookie name is not a valid token.
func NewGuard(cfg GuardConfig) (*Guard, error) {
	switch {
	case cfg.Limiter == nil:
		return nil, configErr("GuardConfig.Limiter is nil")
	case cfg.OnError < FailClosed || cfg.OnError > UseFallback:
		return nil, configErr("GuardConfig.OnError must be FailClosed, FailOpen or UseFallback, got %v", cfg.OnError)
	case cfg.OnError == UseFallback && cfg.Fallback == nil:
		return nil, configErr("GuardConfig.OnError is UseFallback but Fallback is nil")
	case cfg.OnError != UseFallback && cfg.Fallback != nil:
		return nil, configErr("GuardConfig.Fallback is set but OnError is %v", cfg.OnError)
	case cfg.Timeout < 0:
		return nil, configErr("GuardConfig.Timeout is negative")
	case cfg.DeadlineMargin < 0:
		return nil, configErr("GuardConfig.DeadlineMargin is negative")
	case cfg.RetrySpread < 0:
		return nil, configErr("GuardConfig.RetrySpread is negative")
	case cfg.UnavailableRetryAfter < 0:
		return nil, configErr("GuardConfig.UnavailableRetryAfter is negative")
	}
	if cfg.DeadlineMargin == 0 {
		cfg.DeadlineMargin = DefaultDeadlineMargin
	}
	if cfg.UnavailableRetryAfter == 0 {
		cfg.UnavailableRetryAfter = DefaultUnavailableRetryAfter
	}
	if cfg.StateHeader == "" {
		cfg.StateHeader = DefaultStateHeader
	}
	if cfg.StateCookie == "" {
		cfg.StateCookie = DefaultStateCookie
	}
	if !isToken(cfg.StateHeader) {
		return nil, configErr("StateHeader %q is not a valid header field name", cfg.StateHeader)
	}
	if !isToken(cfg.StateCookie) {
		return nil, configErr("StateCookie %q is not a valid cookie name", cfg.StateCookie)
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

// Verdict is a [Guard]'s answer to one request: go on to the handler
// ([Verdict.Proceed]), or the status and problem body to answer with.
type Verdict struct {
	// Decision is the limiter's (or fallback's) decision, valid when
	// Decided is true.
	Decision ratekit.Decision

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
func (v Verdict) Proceed() bool { return v.Status == 0 }

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
// oversized key. Each limiter call is bounded as [GuardConfig.Timeout] and
// [GuardConfig.DeadlineMargin] say.
//
// A caller that gave up is not a limiter failure: when ctx has ended
// (the client disconnected, the caller's deadline passed) before or during
// the limiter call, Check applies no failure policy, asks no fallback and
// returns a Verdict that does not proceed (503, with Err matching ctx.Err()
// with errors.Is), so that the handler does not run unmetered. Only the
// limiter's own failures (its store failed, or the Guard's bound expired
// while ctx was still live) go to OnError.
func (g *Guard) Check(ctx context.Context, req ratekit.Request, dst http.Header) Verdict {
	if err := req.Validate(); err != nil {
		return g.BadRequest(err, dst)
	}
	if ctx.Err() != nil {
		return g.callerGone(ctx, nil, dst)
	}
	last, hasLast := g.limit(ctx, time.Now())
	d, err := g.allow(ctx, g.cfg.Limiter, req, last, hasLast, g.cfg.OnError == UseFallback)
	if err != nil {
		if errors.Is(err, ratekit.ErrInvalidRequest) {
			return g.BadRequest(err, dst)
		}
		if ctx.Err() != nil {
			return g.callerGone(ctx, err, dst)
		}
		switch g.cfg.OnError {
		case FailOpen:
			g.warn(ctx, &g.failures, "ratekit: limiter failed; letting the request through (FailOpen)", "error", err)
			g.observeFailure(ctx, ratekit.FailedOpen, err, nil)
			return Verdict{Err: err}
		case UseFallback:
			fd, ferr := g.allow(ctx, g.cfg.Fallback, req, last, hasLast, false)
			if ferr == nil {
				g.warn(ctx, &g.failures, "ratekit: limiter failed; decided by the fallback", "error", err)
				g.observeFailure(ctx, ratekit.FellBack, err, nil)
				res := g.decided(fd, dst)
				res.Err = err
				return res
			}
			if ctx.Err() != nil {
				return g.callerGone(ctx, errors.Join(err, ferr), dst)
			}
			g.warn(ctx, &g.failures, "ratekit: limiter and fallback failed; failing closed", "error", err, "fallback_error", ferr)
			g.observeFailure(ctx, ratekit.FailedClosed, err, ferr)
			err = errors.Join(err, ferr)
		default:
			g.warn(ctx, &g.failures, "ratekit: limiter failed; failing closed", "error", err)
			g.observeFailure(ctx, ratekit.FailedClosed, err, nil)
		}
		dst.Set("Content-Type", ProblemContentType)
		dst.Set(HeaderRetryAfter, strconv.FormatInt(ceilSeconds(g.cfg.UnavailableRetryAfter+g.spread()), 10))
		return Verdict{Status: http.StatusServiceUnavailable, Body: g.unavailable, Err: err}
	}
	return g.decided(d, dst)
}

// spread returns the random delay that RetrySpread adds to one answer: 0
// to RetrySpread rounded up, in whole seconds.
func (g *Guard) spread() time.Duration {
	if g.cfg.RetrySpread <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(ceilSeconds(g.cfg.RetrySpread)+1)) * time.Second
}

// spreadDenial returns d, a denial, with the random delay of spread added
// to its RetryAfter and to that of each part that denied.
func (g *Guard) spreadDenial(d ratekit.Decision) ratekit.Decision {
	extra := g.spread()
	if extra == 0 {
		return d
	}
	d.RetryAfter += extra
	if d.Parts != nil {
		parts := make([]ratekit.Decision, len(d.Parts))
		for i, p := range d.Parts {
			if !p.Allowed {
				p.RetryAfter += extra
			}
			parts[i] = p
		}
		d.Parts = parts
	}
	return d
}

// callerGone is the Verdict for a caller whose context ended: no decision,
// no failure policy, and no handler. limiterErr, when not nil, is what the
// limiter returned meanwhile.
func (g *Guard) callerGone(ctx context.Context, limiterErr error, dst http.Header) Verdict {
	err := fmt.Errorf("ratekit: the caller gave up before the limiter decided: %w", ctx.Err())
	if limiterErr != nil {
		err = errors.Join(err, limiterErr)
	}
	dst.Set("Content-Type", ProblemContentType)
	return Verdict{Status: http.StatusServiceUnavailable, Body: g.unavailable, Err: err}
}

// BadRequest returns the 400 answer for a request whose key could not be
// derived (a [KeyFunc] error) or that failed validation, writing
// Content-Type into dst. The body says what is wrong in words for the
// client; err, which may say what the operator should fix (a key function
// that does not suit the transport, say), goes to the Guard's Logger as
// [LogInterval] says, and is the Verdict's Err.
func (g *Guard) BadRequest(err error, dst http.Header) Verdict {
	dst.Set("Content-Type", ProblemContentType)
	g.warn(context.Background(), &g.badRequests, "ratekit: request answered 400 (no usable key or an invalid request)", "error", err)
	return Verdict{
		Status: http.StatusBadRequest,
		Body: mustJSON(Problem{
			Type:   "about:blank",
			Title:  "Bad Request",
			Status: http.StatusBadRequest,
			Detail: clientDetail(err),
		}),
		Err: err,
	}
}

// LogInterval is the least time between two log lines of one Guard about
// the same kind of event (requests it answered 400, limiter failures): the
// first is logged at once with its cause, later ones at most once per
// interval with a count of those held back, never a line per request.
const LogInterval = 10 * time.Second

// clientDetail says what is wrong with a request, for its client.
func clientDetail(err error) string {
	switch {
	case errors.Is(err, ErrNoKey):
		return "The request does not say who sends it (no client address or API key), so it cannot be counted."
	case errors.Is(err, ratekit.ErrEmptyKey):
		return "The request's client identity (address or API key) is empty."
	case errors.Is(err, ratekit.ErrKeyTooLong):
		return "The request's client identity (address, API key or idempotency key) is too long."
	case errors.Is(err, ratekit.ErrInvalidCost):
		return "The request's cost is not a positive number."
	case errors.Is(err, ratekit.ErrCostExceedsQuota):
		return "The request costs more than the whole quota, so it can never be admitted."
	}
	return "The request cannot be counted as sent."
}

// limit returns the time by which every limiter call of a Check that
// starts now must end to leave the margin before ctx's deadline, and false
// when ctx has no deadline.
func (g *Guard) limit(ctx context.Context, now time.Time) (time.Time, bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return time.Time{}, false
	}
	margin := min(g.cfg.DeadlineMargin, dl.Sub(now)/10)
	return dl.Add(-max(margin, 0)), true
}

// allow calls l under the bound of [GuardConfig.Timeout] and last, the
// result of limit (when hasLast). shared says that a fallback call may
// follow, which gets the second half of the time left before last.
func (g *Guard) allow(ctx context.Context, l ratekit.Limiter, req ratekit.Request, last time.Time, hasLast, shared bool) (ratekit.Decision, error) {
	var end time.Time
	now := time.Now()
	if g.cfg.Timeout > 0 {
		end = now.Add(g.cfg.Timeout)
	}
	if hasLast {
		if shared && last.After(now) {
			last = now.Add(last.Sub(now) / 2)
		}
		if end.IsZero() || last.Before(end) {
			end = last
		}
	}
	if !end.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, end)
		defer cancel()
	}
	return l.Allow(ctx, req)
}

func (g *Guard) decided(d ratekit.Decision, dst http.Header) Verdict {
	if !d.Allowed {
		d = g.spreadDenial(d)
	}
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
		return Verdict{Decision: d, Decided: true}
	}
	dst.Set("Content-Type", ProblemContentType)
	return Verdict{Decision: d, Decided: true, Status: http.StatusTooManyRequests, Body: DeniedProblem(d)}
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

// observeFailure reports a failure-policy event to g's observer, if any.
func (g *Guard) observeFailure(ctx context.Context, action ratekit.FailureAction, err, fallbackErr error) {
	if g.cfg.Observer == nil || g.cfg.Observer.FailurePolicy == nil {
		return
	}
	g.cfg.Observer.FailurePolicy(ctx, ratekit.FailureEvent{
		Policy:      policyName(g.cfg.Limiter),
		Action:      action,
		ErrorClass:  ratekit.ClassifyError(err),
		Err:         err,
		FallbackErr: fallbackErr,
	})
}

// policyName returns the name of l's policy, or "" when l has no Policy
// method.
func policyName(l ratekit.Limiter) string {
	if p, ok := l.(interface{ Policy() ratekit.Policy }); ok {
		return p.Policy().Name
	}
	return ""
}

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "httplimit: invalid config: " and format's text: every configuration error of
// this package is made here.
func configErr(format string, args ...any) error {
	return fmt.Errorf("httplimit: %w: %s", ratekit.ErrInvalidConfig, fmt.Sprintf(format, args...))
}
