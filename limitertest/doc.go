// Package limitertest is the conformance suite of the [ratekit.Limiter]
// contract, and a history checker for limiters that keep shared state.
//
// [Run] checks one limiter, described by a [Harness], as a set of subtests:
// limit and remaining on a fresh key, cost n, a key exhausted by exactly its
// limit, denials that take nothing, RetryAfter and ResetAfter and the window
// or refill boundary they announce (on the harness's controlled clock where
// the strategy takes one, to the millisecond; otherwise with short real
// windows), Peek, Refund and Reset where the limiter offers them, key and
// prefix isolation (binary keys included), validation errors (matched with
// errors.Is), and the documented exactness when [Workers] goroutines hit
// one key at once. ratekit runs it against every strategy and store
// (internal/itest/conformance); run it against a Limiter of your own the same
// way. Each check is also available on its own through [Checks], as a
// function that returns an error, which is how the suite's own tests show
// that every check fails on a limiter built to break it.
//
// [RunComposite] checks a composite limiter (one Limiter over several
// policies, see [ratekit.Decision.Parts]), described by a
// [CompositeHarness]: each policy admits exactly its quota, a denial by any
// policy takes from none, the top-level Decision sums the parts up, and
// [CompositePools] × [Workers] goroutines count exactly.
package limitertest
