package ratekit

import (
	"strconv"
)

// Algorithm names a counting algorithm. Strategies that offer a choice
// (package durable) take one in their configuration, and the conformance
// suite (package limitertest) applies the boundary rules of the one a
// limiter runs. The zero Algorithm is invalid, so that the choice is always
// written down.
type Algorithm int

const (
	// FixedWindow grants Quota units per Window, in windows aligned to a
	// clock; the full Quota is back when a window ends.
	FixedWindow Algorithm = iota + 1

	// SlidingWindow is the two-window weighted count: the previous window's
	// count, weighted by the part of it still inside the rolling window,
	// plus the current window's. Its RetryAfter may exceed its ResetAfter.
	SlidingWindow

	// TokenBucket holds up to Burst units and refills continuously at its
	// RefillRate.
	TokenBucket

	// SlidingLog counts every unit admitted over the last Window.
	SlidingLog
)

// String returns the algorithm's name as written in Go, such as
// "FixedWindow", or "Algorithm(n)" for an unknown value.
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "FixedWindow"
	case SlidingWindow:
		return "SlidingWindow"
	case TokenBucket:
		return "TokenBucket"
	case SlidingLog:
		return "SlidingLog"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}
