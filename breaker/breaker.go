// Package breaker puts a circuit breaker in front of a [ratekit.Limiter],
// so that a dead store is not dialled on every request during an outage.
//
// It wraps github.com/sony/gobreaker/v2 (the pattern as described in
// Microsoft's cloud design patterns, "Circuit Breaker"), a well-kept
// library, rather than a breaker of ratekit's own. The states:
//
//   - Closed: every request goes to the wrapped limiter. A decision that
//     fails (the store's error, or the context's deadline passing while the
//     store is asked) counts as a failure; a decision (admitted or denied)
//     resets the count. [Config.Failures] consecutive failures open the
//     circuit.
//   - Open: for [Config.OpenFor], every Allow returns an error matching
//     [ErrOpen] at once, without asking the wrapped limiter, so the store is
//     neither dialled nor waited for. A httplimit.Guard then applies its
//     failure policy (fail closed, fail open or fall back) as for any store
//     error.
//   - Half-open: after OpenFor, up to [Config.Probes] requests go to the
//     wrapped limiter; others get [ErrOpen]. If that many succeed in a row
//     the circuit closes; the first failure opens it again for OpenFor.
//
// Invalid requests (errors matching ratekit.ErrInvalidRequest) are refused
// before the breaker and never count, and neither does a context the caller
// cancelled (context.Canceled): neither says anything about the store.
//
// The breaker is per process: each serverless instance has its own, learns
// of an outage from its own failures, and keeps its state while frozen (a
// thawed instance whose circuit opened before the freeze probes the store
// on its first request once OpenFor has passed).
package breaker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/ratekit/ratekit"
)

// ErrOpen is matched (errors.Is) by the error Allow returns without asking
// the wrapped limiter: the circuit is open, or half-open with all its
// probes under way.
var ErrOpen = errors.New("breaker: circuit open, the limiter's store was not asked")

// Defaults of [Config].
const (
	DefaultFailures = 5
	DefaultOpenFor  = 5 * time.Second
	DefaultProbes   = 1
)

// State is the state of a circuit.
type State int

const (
	// Closed: requests go to the wrapped limiter.
	Closed State = iota + 1
	// HalfOpen: up to Config.Probes requests go to the wrapped limiter.
	HalfOpen
	// Open: requests fail with ErrOpen without reaching the limiter.
	Open
)

// String returns the state's name as written in Go: "Closed", "HalfOpen" or
// "Open", or "State(n)" for an unknown value.
func (s State) String() string {
	switch s {
	case Closed:
		return "Closed"
	case HalfOpen:
		return "HalfOpen"
	case Open:
		return "Open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

func state(s gobreaker.State) State {
	switch s {
	case gobreaker.StateHalfOpen:
		return HalfOpen
	case gobreaker.StateOpen:
		return Open
	}
	return Closed
}

// Config configures a breaker. The zero Config is valid and uses the
// defaults.
type Config struct {
	// Failures is the number of consecutive failed decisions that opens
	// the circuit. Zero means DefaultFailures.
	Failures int

	// OpenFor is how long the circuit stays open before it lets probes
	// through. Zero means DefaultOpenFor; negative is invalid.
	OpenFor time.Duration

	// Probes is how many requests the half-open circuit lets through, and
	// how many of them must succeed in a row to close it. Zero means
	// DefaultProbes.
	Probes int

	// OnStateChange, when not nil, is called on every change of state, for
	// logs and metrics. It is called synchronously, from the request that
	// caused the change (or that first saw OpenFor pass); it must be quick
	// and must not call the Limiter.
	OnStateChange func(from, to State)
}

// Limiter is a [ratekit.Limiter] that asks the limiter it wraps through a
// circuit breaker. It is safe for concurrent use.
//
// It implements Allow only: refunds and resets are rare, and ones an open
// circuit dropped would be lost, so call them on the wrapped limiter
// ([Limiter.Unwrap]) directly.
type Limiter struct {
	l  ratekit.Limiter
	cb *gobreaker.CircuitBreaker[ratekit.Decision]
}

// New returns l behind a circuit breaker configured by cfg. It returns an
// error matching ratekit.ErrInvalidConfig when l is nil or a field of cfg
// is negative.
func New(l ratekit.Limiter, cfg Config) (*Limiter, error) {
	switch {
	case l == nil:
		return nil, configErr("the limiter is nil")
	case cfg.Failures < 0 || cfg.Probes < 0 || cfg.OpenFor < 0:
		return nil, configErr("Failures, Probes and OpenFor must not be negative")
	case cfg.Failures > 1<<31 || cfg.Probes > 1<<31:
		return nil, configErr("Failures and Probes must fit in 32 bits")
	}
	failures := uint32(DefaultFailures)
	if cfg.Failures > 0 {
		failures = uint32(cfg.Failures)
	}
	probes := uint32(DefaultProbes)
	if cfg.Probes > 0 {
		probes = uint32(cfg.Probes)
	}
	openFor := DefaultOpenFor
	if cfg.OpenFor > 0 {
		openFor = cfg.OpenFor
	}
	st := gobreaker.Settings{
		Name:        "ratekit",
		MaxRequests: probes,
		Timeout:     openFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		IsExcluded:  func(err error) bool { return errors.Is(err, context.Canceled) },
	}
	if cfg.OnStateChange != nil {
		st.OnStateChange = func(_ string, from, to gobreaker.State) { cfg.OnStateChange(state(from), state(to)) }
	}
	return &Limiter{l: l, cb: gobreaker.NewCircuitBreaker[ratekit.Decision](st)}, nil
}

// Allow validates req, then asks the wrapped limiter unless the circuit is
// open. It returns the wrapped limiter's decision and error, or an error
// matching [ErrOpen] (and gobreaker.ErrOpenState or
// gobreaker.ErrTooManyRequests) without asking it.
func (b *Limiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	var invalid error
	d, err := b.cb.Execute(func() (ratekit.Decision, error) {
		d, err := b.l.Allow(ctx, req)
		if errors.Is(err, ratekit.ErrInvalidRequest) {
			// A cost above the quota: the request's fault, not the store's.
			invalid = err
			return d, nil
		}
		return d, err
	})
	switch {
	case invalid != nil:
		return ratekit.Decision{}, invalid
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
		return ratekit.Decision{}, fmt.Errorf("%w: %w", ErrOpen, err)
	}
	return d, err
}

// State returns the circuit's state now.
func (b *Limiter) State() State { return state(b.cb.State()) }

// Unwrap returns the wrapped limiter.
func (b *Limiter) Unwrap() ratekit.Limiter { return b.l }

// configErr returns an error matching ratekit.ErrInvalidConfig that reads
// "breaker: invalid config: " and format's text: every configuration error of
// this package is made here.
func configErr(format string, args ...any) error {
	return fmt.Errorf("breaker: %w: %s", ratekit.ErrInvalidConfig, fmt.Sprintf(format, args...))
}
