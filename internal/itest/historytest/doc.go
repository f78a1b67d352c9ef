// Package historytest records concurrent decisions of ratekit's server-side
// strategies through a fault proxy (latency with jitter, and connection
// resets) and checks the histories with limitertest's history checker. It
// has tests only.
package historytest
