// Package ratekit is a rate-limiting toolkit for serverless and edge
// functions: AWS Lambda handlers, Cloud Run services and anything else that
// may run on a fresh instance for every request.
//
// Every strategy implements one interface, [Limiter], so a function picks how
// strict it must be without changing the code around it:
//
//   - signedwindow stores nothing. The client carries an HMAC-signed token
//     with its window and count. It is a friction layer against accidental
//     floods and casual scripts, not a security boundary: a client that drops
//     its token starts a fresh count.
//   - tokenbucket keeps two numbers per key in a key-value store (in memory,
//     Redis or DynamoDB). It is approximate with a stated bound on eventually consistent
//     stores and exact where the store updates atomically.
//   - durable keeps exact counters in PostgreSQL, for quotas that are money.
//
// # Vocabulary
//
// One word means one thing in every package:
//
//   - Quota: the capacity of a policy, the units it grants per Window
//     ([Policy.Quota], [Decision.Quota], the Quota of signedwindow's and
//     limitertest's Config, of durable's Policy).
//   - Window: the period a Quota applies to; for a token bucket, the time
//     it takes to fill from empty.
//   - Burst: the capacity of a token bucket, the most units a client can
//     use at once (tokenbucket.Config.Burst; kvstore.Refill.Burst in a
//     store's units), as golang.org/x/time/rate uses the word. A bucket
//     advertises its Burst as its Quota.
//   - RefillRate: how fast a token bucket refills (tokenbucket.Config).
//   - Remaining: the units still available after a decision
//     ([Decision.Remaining]; kvstore.OpResult.Remaining in a store's
//     units), from 0 to the Quota.
//   - RetryAfter and ResetAfter: how long until a denied request could
//     pass, and until the full Quota is back ([Decision]).
//   - Period: a calendar day, week or month that a Quota applies to
//     instead of a Window ([Period], [Policy.Period]), in a time zone and
//     optionally from a billing anchor.
//   - Plan: the policies a key is sold, decided together ([Plan]).
//   - Cost: the units one request takes ([Request.Cost]).
//   - [Algorithm]: FixedWindow, SlidingWindow, TokenBucket or SlidingLog.
//   - Key: the subject a request is counted under ([Request.Key]). Two
//     names use the word in its other standard senses: signedwindow.Key
//     is a signing key (an ID and a secret), pglock.LockKey an advisory
//     lock's key.
//   - Allow is the act, Allowed (or, in limitertest, Admitted) its
//     outcome; Peek, Refund and Reset are the other acts.
//   - A refill rate is tokens per period (tokenbucket.Rate); kvstore.Refill
//     states the same rate to a store in whole units per microsecond.
//
// This package is the contract: [Limiter], [Request], [Decision] and
// [Policy], the optional [Peeker], [Refunder] and [Resetter] capabilities,
// the errors, [All] (a composite of several limiters, "10 a second and 1,000
// a day", whose Decision holds one part per policy) and [Observe]. Package
// httplimit turns decisions into HTTP answers (the RateLimit header fields,
// Retry-After, problem+json bodies, middleware and key functions), and
// package lambda does the same for Lambda events. It imports the standard
// library only.
package ratekit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// MaxKeyLen is the longest [Request.Key] (and [Request.IdempotencyKey]), in
// bytes, that any ratekit strategy accepts. Longer keys are refused with
// [ErrKeyTooLong] before any store is contacted, so a client cannot make the
// limiter store or hash arbitrarily large values.
const MaxKeyLen = 512

// Limiter decides whether a request may proceed.
//
// Allow takes req.Cost units from the quota of req.Key when they are
// available and reports the outcome as a [Decision]. A denial is a Decision
// with Allowed false, not an error: an error means the limiter could not
// decide (the store failed, the context ended, the request was invalid), and
// what happens next is the caller's choice (httplimit's FailurePolicy is
// one way to make it).
//
// Allow validates req with [Request.Validate] and returns its error (an
// [ErrInvalidRequest]) for bad input. A cost larger than the policy's Quota
// can never be admitted and is reported as [ErrCostExceedsQuota]. Errors
// caused by ctx wrap ctx.Err().
//
// Implementations are safe for concurrent use by multiple goroutines.
type Limiter interface {
	Allow(ctx context.Context, req Request) (Decision, error)
}

// Peeker is implemented by limiters that can report the state of a key
// without consuming from it.
//
// Peek returns the Decision that Allow would return for req at this moment
// (Allowed reports whether req.Cost units are available, Remaining how many
// the key holds), but takes nothing.
// It returns the same errors as [Limiter.Allow].
type Peeker interface {
	Peek(ctx context.Context, req Request) (Decision, error)
}

// Refunder is implemented by limiters that can give units back, for example
// when a paid call's downstream work failed.
//
// Refund returns req.Cost units to the quota of req.Key, never raising it
// above the policy's Quota, and returns the resulting Decision (Allowed is
// true; for client-carried strategies Decision.State holds the updated
// state). It returns the same errors as [Limiter.Allow].
type Refunder interface {
	Refund(ctx context.Context, req Request) (Decision, error)
}

// Resetter is implemented by limiters that can forget a key, restoring its
// full quota.
//
// Reset returns [ErrEmptyKey] or [ErrKeyTooLong] for an invalid key, and an
// error wrapping the store's error when the store fails. Resetting a key the
// limiter has never seen is not an error.
type Resetter interface {
	Reset(ctx context.Context, key string) error
}

// Request is one request to a [Limiter].
type Request struct {
	// Key identifies what is being limited: an API key, a user ID, a client
	// IP. It must be non-empty and at most MaxKeyLen bytes. Keys are opaque
	// bytes; strategies that cannot store some bytes (PostgreSQL text cannot
	// hold NUL) encode or refuse them as their documentation says.
	Key string

	// Cost is the number of units to take, at least 1. There is no default:
	// a zero Cost is refused with [ErrInvalidCost] so that a forgotten field
	// is not silently treated as free or as 1.
	Cost int64

	// State is the client-carried state for strategies that keep none
	// (the signed-window token the client sent back). Server-side strategies
	// ignore it. Empty means the client sent none.
	State string

	// IdempotencyKey, when non-empty, makes a retried request (a Lambda
	// retry, a client retry) count once within its window. Strategies that
	// honour it say so in their documentation; the others ignore it. At most
	// MaxKeyLen bytes.
	IdempotencyKey string

	// Parts gives each policy of a composite limiter its own key and cost,
	// in the order of the composite's policies ("100 a minute per user and
	// 5,000 a minute per organisation": the user's key, then the
	// organisation's). Nil means every policy counts Key and Cost. Key and
	// Cost are required either way: Key names the request's subject (it
	// scopes idempotency and client state). Limiters of a single policy
	// refuse a non-nil Parts with [ErrInvalidRequest] unless they document
	// otherwise.
	Parts []Part
}

// Part is one policy's share of a composite request: the key it is counted
// under and the units it costs. Key follows the rules of [Request.Key] and
// Cost those of [Request.Cost].
type Part struct {
	Key  string
	Cost int64
}

// Validate reports whether r is well formed: a non-empty Key and
// IdempotencyKey of at most MaxKeyLen bytes and a Cost of at least 1. The
// error it returns matches [ErrInvalidRequest] and the specific sentinel
// ([ErrEmptyKey], [ErrKeyTooLong], [ErrInvalidCost]) with errors.Is.
func (r Request) Validate() error {
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if r.Cost < 1 {
		return fmt.Errorf("%w (got %d)", ErrInvalidCost, r.Cost)
	}
	if len(r.IdempotencyKey) > MaxKeyLen {
		return fmt.Errorf("%w: idempotency key is %d bytes", ErrKeyTooLong, len(r.IdempotencyKey))
	}
	for i, p := range r.Parts {
		if err := ValidateKey(p.Key); err != nil {
			return fmt.Errorf("part %d: %w", i, err)
		}
		if p.Cost < 1 {
			return fmt.Errorf("part %d: %w (got %d)", i, ErrInvalidCost, p.Cost)
		}
	}
	return nil
}

// ValidateKey returns [ErrEmptyKey] for an empty key and [ErrKeyTooLong] for
// a key longer than MaxKeyLen bytes, and nil otherwise.
func ValidateKey(key string) error {
	if key == "" {
		return ErrEmptyKey
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes", ErrKeyTooLong, len(key))
	}
	return nil
}

// Decision is the outcome of one [Limiter] call.
//
// The zero Decision denies with no policy; limiters always fill in Quota and
// Policy.
type Decision struct {
	// Allowed reports whether the request's cost was admitted (and taken).
	Allowed bool

	// Quota is the capacity: the most units the policy admits at once,
	// the quota of a window strategy, the burst of a token bucket. It
	// equals Policy.Quota.
	Quota int64

	// Remaining is the number of units still available after this decision,
	// between 0 and Quota.
	Remaining int64

	// RetryAfter is how long the client should wait before a request of the
	// same cost can be admitted. It is 0 when Allowed is true and positive
	// when Allowed is false; it is never negative.
	RetryAfter time.Duration

	// ResetAfter is how long until the full Quota is available again (the
	// end of the current window, or the time a token bucket needs to fill).
	// It is never negative.
	ResetAfter time.Duration

	// Policy describes the quota policy that produced this decision; the HTTP
	// layer advertises it in the RateLimit-Policy header field.
	Policy Policy

	// State is the client-carried state to hand back to the client (the new
	// signed-window token). It is empty for server-side strategies.
	State string

	// StateError says why Request.State was not used, for strategies that
	// read client state: missing, tampered, expired, signed by an unknown
	// key, issued to another subject, or from a past window. It is nil when
	// the state was accepted and for strategies that keep none. A rejected
	// state is not an error of the limiter: the count starts afresh.
	StateError error

	// Parts holds one Decision per policy of a composite limiter, in the
	// order of its policies, each with its own Allowed, Quota, Remaining,
	// RetryAfter, ResetAfter and Policy (and no State). It is nil for a
	// limiter of a single policy. The Decision that holds Parts sums them
	// up: Allowed when every part admitted (and then every part took its
	// cost; otherwise none did); RetryAfter the longest among the parts that
	// denied; Quota, Remaining, ResetAfter and Policy those of the most
	// restrictive part, the one with the smallest Remaining (ties: the
	// longest ResetAfter), among the denying parts when it denied.
	Parts []Decision
}

// Policy describes a quota policy: Quota units per Window, under a name that
// clients see in the RateLimit-Policy header field.
//
// Every strategy advertises its policy by one rule, grounded in
// draft-ietf-httpapi-ratelimit-headers-10: q is the quota the policy
// allocates, in quota units, and w the time window it applies to (section
// 3.1); r is the quota units that remain of it (section 4.1), so r never
// exceeds q.
//
//   - A window (fixed, sliding, sliding log) advertises Quota = the units it
//     grants per Window, and Window = its window.
//   - A token bucket advertises Quota = its burst, the most units a client
//     can use at once, and Window = the time an empty bucket takes to fill
//     (burst ÷ refill rate, rounded up). A bucket of burst 20 refilled at 5
//     per second is `q=20;w=4`, like a window of 20 per 4 seconds.
//
// So one logical policy renders the same RateLimit-Policy field through
// every strategy, Decision.Quota equals Policy.Quota, and Decision.Remaining is at
// most Quota. limitertest's AdvertisedPolicy check holds every strategy to it.
type Policy struct {
	// Name identifies the policy to clients, for example "contact-form".
	// Strategies validate it with [ValidatePolicyName] at construction.
	Name string

	// Quota is the number of units the policy grants per Window, the
	// burst of a token bucket (the draft's q parameter).
	Quota int64

	// Window is the time window the Quota applies to, the time a token
	// bucket takes to fill from empty (the draft's w parameter,
	// advertised in whole seconds, rounded up).
	Window time.Duration

	// Algorithm is the counting algorithm that enforces the policy. Every
	// strategy sets it in the policies of its decisions; the HTTP layer
	// reads it to say when more quota comes (the RateLimit t parameter:
	// the next unit of a token bucket, the window's end otherwise).
	Algorithm Algorithm

	// Period, when not zero, makes the policy a fixed window whose windows
	// are calendar periods ("100,000 a month from the billing day", see
	// [Period]) instead of multiples of Window since the Unix epoch: the
	// Algorithm must be FixedWindow and Window zero in a configuration.
	// Package durable and tokenbucket.Planned support periods (and say
	// so); the other limiters do not read this field.
	//
	// In a Decision, Window is then the length of the period the decision
	// counted in (28 to 31 days for a month, 23 to 25 hours for a day of a
	// daylight-saving change), so that the RateLimit-Policy field's w is
	// the current period's length, and ResetAfter its true end. Draft-10
	// defines w as the time window the quota applies to (section 3.1) and
	// has no parameter for a calendar: a period whose length varies
	// advertises the length of the current one, and the reset (the
	// RateLimit field's t, and Retry-After) is exact.
	Period Period
}

// MaxQuota is the largest quota (for a token bucket, the largest burst)
// that a strategy accepts: 999,999,999,999,999, the largest Integer of an
// HTTP Structured Field (RFC 9651, section 3.3.1), so that every RateLimit
// header field carries the policy's q and r. A larger quota is refused at
// construction with an error matching [ErrInvalidConfig].
const MaxQuota = 999_999_999_999_999

// MaxPolicyNameLen is the longest policy name, in bytes, that
// [ValidatePolicyName] accepts.
const MaxPolicyNameLen = 64

// ValidatePolicyName reports whether name can be used as a policy name:
// 1 to MaxPolicyNameLen bytes of ASCII letters, digits and the characters
// '-', '_', '.' and ':'. Such a name is also a valid Structured Fields string
// (RFC 9651) that needs no escaping and is safe as a storage prefix. The error
// matches [ErrInvalidConfig].
func ValidatePolicyName(name string) error {
	if name == "" || len(name) > MaxPolicyNameLen {
		return configErr("policy name must be 1 to %d bytes, got %d", MaxPolicyNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '_', c == '.', c == ':':
		default:
			return configErr("policy name %q has byte %q; use letters, digits, '-', '_', '.', ':'", name, c)
		}
	}
	return nil
}

// Errors returned by ratekit and its strategies. Strategies wrap them with
// detail, so compare with errors.Is.
var (
	// ErrInvalidRequest is matched by every error that [Request.Validate]
	// returns: the request itself is malformed, whatever the limiter's state.
	ErrInvalidRequest = errors.New("invalid request")

	// ErrEmptyKey is returned for a request or reset with an empty key.
	ErrEmptyKey error = &invalidRequestError{"invalid request: empty key"}

	// ErrKeyTooLong is returned for a key or idempotency key longer than
	// MaxKeyLen bytes.
	ErrKeyTooLong error = &invalidRequestError{"invalid request: key longer than 512 bytes"} // MaxKeyLen

	// ErrInvalidCost is returned for a request whose Cost is below 1.
	ErrInvalidCost error = &invalidRequestError{"invalid request: cost must be at least 1"}

	// ErrCostExceedsQuota is returned when a request's Cost is larger than
	// the policy's Quota, so that no amount of waiting could admit it. It
	// also matches ErrInvalidRequest.
	ErrCostExceedsQuota error = &invalidRequestError{"invalid request: cost exceeds the quota"}

	// ErrUnexpectedParts is returned by a limiter of a single policy for a
	// request with [Request.Parts]: its parts would otherwise go uncounted.
	// It also matches ErrInvalidRequest.
	ErrUnexpectedParts error = &invalidRequestError{"invalid request: parts given to a limiter of a single policy"}

	// ErrInvalidConfig is matched by every error a constructor returns for
	// an invalid configuration, and by a decision's error when a
	// configuration given at decision time (a plan) is invalid. Such an
	// error reads "<package>: invalid config: " and what is wrong, the
	// package being the one called.
	ErrInvalidConfig = errors.New("invalid config")

	// ErrClockSkew is matched by the error of a decision on a policy counted
	// over calendar periods ([Policy.Period], or a fixed window of
	// tokenbucket.Planned) when two clocks disagree by more than a period.
	// The client (this process) computes, from its own clock and calendar,
	// the period around its clock and the two beside it; the store counts
	// in the one that contains the store's clock, read once per call, so
	// that decisions follow one clock. A store clock outside all three
	// fails the call. The store's clock is the server's for Redis
	// (kvstore/redisstore, kvstore/rueidisstore: in milliseconds) and PostgreSQL
	// (durable: the database clock); for kvstore/memstore it is its
	// Config.Now, which is this process's clock unless a test injects
	// another. Nothing was decided: no count changed, nothing was recorded.
	ErrClockSkew = errors.New("clock skew")
)

// invalidRequestError is an error that matches [ErrInvalidRequest]. Unlike
// fmt.Errorf with %w, a pointer to it in a package-level variable is laid
// out by the linker, so the sentinel errors cost nothing at package
// initialisation.
type invalidRequestError struct{ msg string }

func (e *invalidRequestError) Error() string { return e.msg }

func (e *invalidRequestError) Unwrap() error { return ErrInvalidRequest }

// invalidConfigError is an error that matches [ErrInvalidConfig], laid out
// by the linker as invalidRequestError is.
type invalidConfigError struct{ msg string }

func (e *invalidConfigError) Error() string { return e.msg }

func (e *invalidConfigError) Unwrap() error { return ErrInvalidConfig }

// configErr returns an error matching [ErrInvalidConfig] that reads
// "ratekit: invalid config: " and format's text: every configuration error
// of this package is made here. Another of its errors that the text
// includes loses its "ratekit: invalid config: ", so that a message adding
// context to it names the package and the class once.
func configErr(format string, args ...any) error {
	msg := strings.ReplaceAll(fmt.Sprintf(format, args...), "ratekit: invalid config: ", "")
	return &invalidConfigError{"ratekit: invalid config: " + msg}
}
